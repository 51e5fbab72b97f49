"""The `bastion` command line as a user runs it: real processes, real files, exit statuses (see `bastion.cli.app`)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import typer
import typer.core
import typer.main
from mcp import Client
from typer.testing import CliRunner

from bastion import __version__
from bastion.cli import app, help_of
from tests.processes import bastion_command, bastion_env, bastion_http, run_cli, stop, write_config

INVOCATION_KEYS = {
    "id", "status", "policy_key", "tool", "source_id", "risk", "risk_source", "mode", "mode_source",
    "error_class", "created_at", "expires_at", "args", "result",
}  # fmt: skip


def test_init_writes_a_starter_that_doctor_accepts_and_never_overwrites(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    target = tmp_path / "my starter"
    first = run_cli("init", str(target), env=env)
    assert first.returncode == 0, first.stderr
    assert (target / "bastion.toml").exists()
    (hinted,) = re.findall(r"next: (\S*bastion doctor [^\n]+?)  then", first.stdout)
    doctor = run_cli(*shlex.split(hinted)[1:], env=env)  # the hint, copied: quoted, it names the directory
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    doctor = run_cli("doctor", "--config", str(target), env=env)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert doctor.stdout.startswith("ok:")
    again = run_cli("init", str(target), env=env)
    assert again.returncode == 2
    assert "bastion.toml" in again.stderr


@pytest.mark.parametrize("on_path", [False, True])
def test_a_printed_hint_runs_as_copied_whether_or_not_bastion_is_on_the_path(tmp_path: Path, on_path: bool) -> None:
    """After `make run` the `bastion` script is in .venv/bin, not on PATH: a hint then names it by its path."""
    script = Path(sys.executable).parent / "bastion"
    others = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and Path(d) != script.parent]
    path = os.pathsep.join([str(script.parent), *others] if on_path else others)
    env = bastion_env(tmp_path / "home", PATH=path)
    shown = run_cli("init", str(tmp_path / "starter"), env=env)
    assert shown.returncode == 0, shown.stderr
    (hinted,) = re.findall(r"next: (.+? doctor [^\n]+?)  then", shown.stdout)
    assert shlex.split(hinted)[0] == ("bastion" if on_path else str(script))
    doctor = subprocess.run(shlex.split(hinted), env=env, capture_output=True, text=True, timeout=60, check=False)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr


def test_usage_errors_exit_2_and_name_the_fix(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    profile = run_cli("serve", "--config", str(config), "--profile", "nope", env=env)
    assert profile.returncode == 2
    assert "nope" in profile.stderr
    # An ephemeral port: the refusal must not depend on the default port being free (a Bastion running beside).
    exposed = run_cli(
        "serve", "--config", str(config), "--transport", "http", "--host", "0.0.0.0", "--port", "0", env=env
    )
    assert exposed.returncode == 2
    assert "127.0.0.1" in exposed.stderr
    assert f"--config {config}" in exposed.stderr  # the fix it names reaches the same ledger
    status = run_cli("invocations", "list", "--status", "bogus", "--config", str(config), env=env)
    assert status.returncode == 2
    missing_dir = run_cli("doctor", "--config", str(tmp_path / "absent"), env=env)
    assert missing_dir.returncode == 2
    assert "bastion init" in missing_dir.stderr


def test_an_unset_ledger_variable_stops_every_command_with_one_line_naming_it(tmp_path: Path) -> None:
    """Commands used to warn and switch to the default ledger (`approvals list` answered "0 pending")."""
    env = bastion_env(tmp_path / "home")
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    (config / "bastion.toml").write_text('[server]\nledger = "${env:BASTION_TEST_LEDGER}"\n')
    for command in (["approvals", "list"], ["invocations", "list"], ["doctor"], ["serve"]):
        stopped = run_cli(*command, "--config", str(config), env=env)
        assert stopped.returncode == 2, command
        (line,) = stopped.stderr.strip().splitlines()
        assert "BASTION_TEST_LEDGER" in line and "bastion.toml:2" in line
        assert stopped.stdout == ""
    scripted = run_cli("invocations", "list", "--json", "--config", str(config), env=env)
    assert scripted.returncode == 2
    assert json.loads(scripted.stdout)["error"]["class"] == "config_error"  # --json: the error as JSON


def test_a_missing_invocation_is_a_refusal_exit_1(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    shown = run_cli("invocations", "show", "0123456789ab", "--config", str(config), env=env)
    assert shown.returncode == 1
    assert "0123456789ab" in shown.stderr
    listed = run_cli("invocations", "list", "--json", "--config", str(config), env=env)
    assert listed.returncode == 0
    assert json.loads(listed.stdout) == []


def test_connectors_list_and_check_report_each_source(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    broken = 'command = "/nonexistent/server"\n'
    config = write_config(
        tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False, extra_connectors={"gone": broken}
    )
    listed = run_cli("connectors", "list", "--json", "--config", str(config), env=env)
    assert listed.returncode == 0, listed.stderr
    states = {s["source_id"]: s for s in json.loads(listed.stdout)}
    assert states["notes"]["state"] == "ready"
    assert states["notes"]["tools"] == 4
    assert states["gone"]["state"] == "down"
    assert states["gone"]["last_error"]
    assert run_cli("connectors", "check", "notes", "--config", str(config), env=env).returncode == 0
    assert run_cli("connectors", "check", "gone", "--config", str(config), env=env).returncode == 1
    assert run_cli("connectors", "check", "nope", "--config", str(config), env=env).returncode == 1


def test_a_deeply_nested_file_is_reported_by_doctor_and_skipped_by_every_command(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    deep = "bad = " + "[" * 5000 + "]" * 5000 + "\n"
    config = write_config(
        tmp_path / "config",
        notes_file=tmp_path / "notes.json",
        time_server=False,
        policy='[modes]\n"notes:*" = "allow"\n',
        extra_connectors={"deep": 'command = "npx"\n' + deep},
    )
    (config / "policies" / "deep.toml").write_text("# nests too deep\n" + deep)

    doctor = run_cli("doctor", "--config", str(config), env=env)
    assert doctor.returncode == 2
    assert f"{config / 'connectors' / 'deep.toml'}:2:" in doctor.stdout
    assert f"{config / 'policies' / 'deep.toml'}:2:" in doctor.stdout
    listed = run_cli("connectors", "list", "--json", "--config", str(config), env=env)
    assert listed.returncode == 0, listed.stderr
    assert [s["source_id"] for s in json.loads(listed.stdout)] == ["notes"]
    assert "deep.toml:2:" in listed.stderr
    for result in (doctor, listed):
        assert "Traceback" not in result.stdout + result.stderr


def _commands(command: Any, path: tuple[str, ...], parent: typer.Context | None) -> Iterator[tuple[str, Any]]:
    """Every command under `command` (itself included) with its full path, as `bastion -h` walks them."""
    context = typer.Context(command, parent=parent, info_name=path[-1])
    yield " ".join(path), command
    if isinstance(command, typer.core.TyperGroup):
        for name in command.list_commands(context):
            yield from _commands(command.get_command(context, name), (*path, name), context)


def test_every_command_and_option_has_its_own_help() -> None:
    commands = dict(_commands(typer.main.get_command(app), ("bastion",), None))
    summaries: dict[str, list[str]] = {}
    helps: dict[str, set[str]] = {}
    for path, command in commands.items():
        assert command.help, f"{path} has no help"
        summaries.setdefault(command.help.split("\n")[0], []).append(path)
        for param in command.params:
            text = getattr(param, "help", None)
            assert text, f"{path} {param.name} has no help"
            # An option shared by many commands (--config, --json) says the same everywhere; an argument is
            # each command's own, so its help names what that command does with it.
            owner = "/".join(param.opts) if param.param_type_name == "option" else f"{path} {param.name}"
            helps.setdefault(text, set()).add(owner)
    assert {text: paths for text, paths in summaries.items() if len(paths) > 1} == {}
    assert {text: owners for text, owners in helps.items() if len(owners) > 1} == {}


def test_help_shows_a_configuration_section_by_its_bracketed_name() -> None:
    # Help is plain text: `[ledger]` is shown as written, never read as markup.
    shown = CliRunner().invoke(app, ["audit", "prune", "--help"], env={"COLUMNS": str(HELP_COLUMNS)})
    assert "[ledger] retention_days" in " ".join(shown.output.split())


def test_version_and_short_help_flags(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    for flag in ("--version", "-V"):
        shown = run_cli(flag, env=env)
        assert (shown.returncode, shown.stdout) == (0, f"{__version__}\n")
    short = run_cli("approvals", "deny", "-h", env=env)
    assert short.returncode == 0
    assert short.stdout == run_cli("approvals", "deny", "--help", env=env).stdout
    assert "--reason" in short.stdout


def test_help_answered_at_once_is_the_help_click_prints_when_it_parses_the_line() -> None:
    """`bastion WORDS --help` is answered by `help_of` without parsing the line; it must say what the parsed line
    says, for every command (both in the runner's isolation, where click's help is 80 columns wide)."""
    runner = CliRunner()
    for path, _ in _commands(typer.main.get_command(app), ("bastion",), None):
        words = path.split()[1:]
        parsed = runner.invoke(app, [*words, "--help"], prog_name="bastion")
        assert parsed.exit_code == 0, (path, parsed.output)
        with runner.isolation():
            answered = help_of(words)
        assert f"{answered}\n" == parsed.output, path
    # Words that are not a command path are left to the parser, which names what is wrong.
    assert help_of(["nope"]) is None and help_of(["--json"]) is None and help_of(["version", "extra"]) is None


def test_help_for_a_line_that_is_not_a_command_names_what_is_wrong(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    unknown = run_cli("approvals", "nope", "--help", env=env)
    assert unknown.returncode == 2 and "No such command 'nope'" in unknown.stderr
    with_option = run_cli("approvals", "deny", "--reason", "x", "--help", env=env)
    assert with_option.returncode == 0 and with_option.stdout == run_cli("approvals", "deny", "-h", env=env).stdout
    # A group run without its command shows its help where a person reads it (stdout), as a usage error (exit 2).
    for words in ([], ["approvals"]):
        bare = run_cli(*words, env=env)
        assert (bare.returncode, bare.stderr) == (2, ""), bare.stderr
        assert bare.stdout == run_cli(*words, "--help", env=env).stdout
    missing = run_cli("approvals", "approve", env=env)
    assert missing.returncode == 2 and "Missing argument" in missing.stderr


def test_shell_completion_scripts_complete_commands(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    script = run_cli("--show-completion", "bash", env=env)
    assert script.returncode == 0, script.stderr
    assert "_BASTION_COMPLETE" in script.stdout
    completing = bastion_env(
        tmp_path / "home", _BASTION_COMPLETE="complete_bash", COMP_WORDS="bastion appr", COMP_CWORD="1"
    )
    completed = run_cli(env=completing)
    assert completed.stdout.split() == ["approvals"]


def test_under_json_every_error_is_a_json_document_on_stdout_with_the_usual_status(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    cases = [
        (("approvals", "approve", "--json"), 2, "usage_error"),  # no id: typer's own usage error
        (("invocations", "list", "--status", "bogus", "--json", "--config", str(config)), 2, "usage_error"),
        (("doctor", "--config", str(tmp_path / "absent"), "--json"), 2, "config_error"),
        (("invocations", "show", "0123456789ab", "--json", "--config", str(config)), 1, "not_found"),
        (("connectors", "check", "nope", "--json", "--config", str(config)), 1, "not_found"),
        (("pins", "accept", "notes:write_note", "--json", "--config", str(config)), 1, "unauthenticated"),
    ]
    made = run_cli("tokens", "create", "alice", "--role", "admin", "--json", "--config", str(config), env=env)
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)["token"]
    cases += [
        (("pins", "accept", "notes:write_note", "--json", "--config", str(config), "--token", token), 1, "not_found"),
        (("tokens", "create", "alice", "--role", "admin", "--json", "--config", str(config), "--token", token), 1,
         "conflict"),
    ]  # fmt: skip
    for args, status, error_class in cases:
        result = run_cli(*args, env=env)
        assert result.returncode == status, (args, result.stdout, result.stderr)
        body = json.loads(result.stdout)
        assert set(body) == {"error"}, args
        assert body["error"]["class"] == error_class, args
        assert body["error"]["message"], args
        text = run_cli(*[a for a in args if a != "--json"], env=env)
        assert text.returncode == status, args
        assert text.stdout == ""
        assert text.stderr.strip()


def test_doctor_checks_each_stdio_command_and_reports_as_json_with_file_and_line(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "my-server").write_text("#!/bin/sh\n")
    (bin_dir / "my-server").chmod(0o755)
    (bin_dir / "not-executable").write_text("#!/bin/sh\n")
    config = write_config(
        tmp_path / "config",
        notes_file=tmp_path / "notes.json",
        time_server=False,
        policy='[sources]\ndisabled = ["off"]\n',
        extra_connectors={
            "missing": '# not installed\ncommand = "no-such-mcp-server"\n',
            "on_its_path": f'command = "my-server"\nenv = {{ PATH = "{bin_dir}" }}\n',
            "plain_file": f'command = "{bin_dir / "not-executable"}"\n',
            "off": 'command = "also-not-installed"\n',
            "remote": 'transport = "http"\nurl = "http://127.0.0.1:9/mcp"\n',
        },
    )
    doctor = run_cli("doctor", "--json", "--config", str(config), env=env)
    assert doctor.returncode == 2, doctor.stderr
    report = json.loads(doctor.stdout)
    assert report["ok"] is False
    assert report["config_dir"] == str(config.resolve())
    commands = {c["subject"]: c["ok"] for c in report["checks"] if c["check"] == "command"}
    assert commands == {"notes": True, "missing": False, "on_its_path": True, "plain_file": False}
    connectors = config.resolve() / "connectors"
    assert [(p["file"], p["line"]) for p in report["problems"]] == [
        (str(connectors / "missing.toml"), 2),
        (str(connectors / "plain_file.toml"), 1),
    ]
    assert "PATH" in report["problems"][0]["message"]

    text = run_cli("doctor", "--config", str(config), env=env)
    assert text.returncode == 2
    assert f"{connectors / 'missing.toml'}:2: connector missing:" in text.stdout
    assert "2 problem(s)" in text.stderr

    for name in ("missing.toml", "plain_file.toml"):
        (connectors / name).unlink()
    clean = run_cli("doctor", "--json", "--config", str(config), env=env)
    assert clean.returncode == 0, clean.stdout
    assert json.loads(clean.stdout)["problems"] == []


def test_doctor_declares_the_guarantee_of_the_configured_ledger_without_its_password(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home")
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    on_sqlite = run_cli("doctor", "--json", "--config", str(config), env=env)
    assert on_sqlite.returncode == 0, on_sqlite.stdout
    assert json.loads(on_sqlite.stdout)["guarantee"]["level"] == "G1"
    assert json.loads(on_sqlite.stdout)["guarantee"]["scope"].startswith("single machine")
    (config / "bastion.toml").write_text('[server]\nledger = "postgresql://bastion:hunter2@db.internal/bastion"\n')
    report = run_cli("doctor", "--json", "--config", str(config), env=env)
    assert report.returncode == 0, report.stdout
    assert json.loads(report.stdout)["guarantee"]["scope"].startswith("every instance on one PostgreSQL")
    assert json.loads(report.stdout)["ledger"] == "postgresql://bastion:***@db.internal/bastion"
    text = run_cli("doctor", "--config", str(config), env=env)
    assert "guarantee: G1" in text.stdout
    assert "hunter2" not in text.stdout + report.stdout


@pytest.mark.anyio
async def test_serve_counts_what_tools_list_answers_and_healthz_is_degraded_while_a_source_is_down(
    tmp_path: Path,
) -> None:
    env = bastion_env(tmp_path / "home")
    config = write_config(
        tmp_path / "config",
        notes_file=tmp_path / "notes.json",
        time_server=False,
        policy='[sources]\ndisabled = ["off"]\n',
        extra_connectors={"gone": 'command = "/nonexistent/server"\n', "off": 'command = "/nonexistent/too"\n'},
    )
    async with bastion_http(["--config", str(config)], env=env) as bastion:
        # The first listing waits for the connectors to start (the banner printed before they had).
        async with Client(bastion.mcp_url, cache=None) as client:
            tools = (await client.list_tools()).tools
        async with httpx2.AsyncClient() as http:
            health = await http.get(f"{bastion.base_url}/healthz")
        await bastion.stderr.wait_for(lambda line: f"serving {len(tools)} tools" in line)
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "degraded"
    assert {s["id"]: s["state"] for s in body["sources"]} == {"notes": "ready", "gone": "down", "off": "disabled"}
    assert body["tools"] == len(tools) == 5  # the demo's four and bastion__invocation


async def _with_stderr_on_a_terminal(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """Run a command with stderr on a pseudo-terminal (stdout a pipe): (status, stdout, what the terminal got)."""
    master, slave = os.openpty()
    try:
        process = await anyio.open_process(
            bastion_command(*args), stdin=subprocess.DEVNULL, stderr=slave, env=env, start_new_session=True
        )
    finally:
        os.close(slave)
    output = {"stdout": b"", "terminal": b""}

    async def read_stdout() -> None:
        assert process.stdout is not None
        output["stdout"] = b"".join([chunk async for chunk in process.stdout])

    async def read_terminal() -> None:
        while True:
            await anyio.wait_readable(master)
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the program closed its side
                return
            if not data:
                return
            output["terminal"] += data

    try:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(read_stdout)
                tg.start_soon(read_terminal)
            status = await process.wait()
    finally:
        await stop(process)
        os.close(master)
    return status, output["stdout"].decode(), output["terminal"].decode(errors="replace")


@pytest.mark.anyio
async def test_a_spinner_on_a_terminal_tells_how_connectors_start_and_never_in_json_or_a_pipe(tmp_path: Path) -> None:
    env = bastion_env(tmp_path / "home", TERM="xterm-256color")
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    for command in (("connectors", "check"), ("catalog",)):
        status, stdout, terminal = await _with_stderr_on_a_terminal(*command, "--config", str(config), env=env)
        assert status == 0, terminal
        assert "starting 1 connector(s)" in terminal
        assert "starting" not in stdout
        status, stdout, terminal = await _with_stderr_on_a_terminal(
            *command, "--json", "--config", str(config), env=env
        )
        assert status == 0, terminal
        assert "starting" not in terminal
        json.loads(stdout)
    piped = run_cli("connectors", "check", "--config", str(config), env=env)
    assert piped.returncode == 0
    assert "starting" not in piped.stderr


def test_flags_render_as_flags_in_help(tmp_path: Path) -> None:
    shown = run_cli("grants", "list", "--help", env=bastion_env(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert "--ended" in shown.stdout and "--limit" in shown.stdout and "<int>" in shown.stdout
    assert "<bool>" not in shown.stdout, "a flag takes no value"


HELP_COLUMNS = 80


def test_every_help_fits_80_columns_whole_and_shows_its_flags_as_flags() -> None:
    """Each command's `--help` on a terminal 80 columns wide (click's help is never wider): no line wider, no word
    cut short (an ellipsis, or an option's name split at its hyphen), no markup escape left in the text, and no flag
    shown as if it took a value."""
    runner = CliRunner()
    for path, command in _commands(typer.main.get_command(app), ("bastion",), None):
        shown = runner.invoke(app, [*path.split()[1:], "--help"], env={"COLUMNS": str(HELP_COLUMNS)})
        assert shown.exit_code == 0, (path, shown.output)
        lines = shown.output.splitlines()
        assert [line for line in lines if len(line) > HELP_COLUMNS] == [], path
        assert [line for line in lines if "\u2026" in line or re.search(r"\w-$", line)] == [], path
        assert "\\[" not in shown.output, f"{path}: a rich markup escape shown as text"
        flags = [opt for param in command.params if getattr(param, "is_flag", False) for opt in param.opts]
        for line in lines:
            for flag in flags:
                if line.lstrip().startswith(f"{flag} ") or f", {flag} " in line:
                    shown_for_flag = line.split(flag, 1)[1].lstrip().split("  ")[0]
                    assert not shown_for_flag.startswith("<"), f"{path}: a flag takes no value: {line}"


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_the_version_is_answered_without_importing_the_command_line(flag: str) -> None:
    """`bastion --version` imports neither the CLI nor what stands behind it (the server, the ledger, the sources)."""
    probe = (
        "import sys\n"
        f"sys.argv = ['bastion', '{flag}']\n"
        "from bastion.launcher import main\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert exit.code == 0\n"
        "parts = ('bastion.cli', 'bastion.server', 'bastion.ledger', 'bastion.sources', 'bastion.pipeline')\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('typer', 'mcp', 'anyio', 'pydantic')\n"
        "    or m.startswith(parts))\n"
        "print(heavy, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{__version__}\n"
    assert done.stderr.strip() == "[]", f"imported: {done.stderr}"
