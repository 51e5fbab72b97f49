"""Plugin action packages: loaded from `actions/<name>/action.json` only when allowed, run in
child processes through execute, verify, repair and rollback, with their gates enforced by the pipeline: R3/R4
held for an approver whatever the policy says, scopes checked before anything runs, verification commands only
from the global allowlist. Driven through a real MCP client and a real gateway over a real configuration."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from bastion.assembly import open_gateway
from bastion.config import load_config
from bastion.ledger import Redactor, open_ledger
from bastion.models import CallContext, Invocation, ModeDecision, utcnow
from bastion.pipeline.gateway import Gateway
from bastion.policies import compose_mode
from bastion.server.mcp import HostServer
from bastion.sources.plugins import load_plugins
from bastion.sources.plugins.runner import run_step
from bastion.sources.plugins.sandbox import sandbox
from bastion.sources.registry import load_sources
from tests.processes import bastion_env, bastion_http, run_cli
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio

WAIT = 20
MARKERS = ".markers"
"""Where steps leave a marker of each run (in the workspace, the one place a step may write)."""

EXECUTE = """
import json, os, shutil, sys
call = json.load(sys.stdin)
with open(os.path.join(os.environ["MARKER_DIR"], call["correlationId"]), "w") as marker:
    json.dump(sorted(os.environ), marker)
path = call["input"]["path"]  # relative: the step runs in the workspace
if os.path.exists(path):
    shutil.copyfile(path, os.path.join(call["stateDir"], "backup"))
with open(path, "w") as f:
    f.write(call["input"]["text"])
print(json.dumps({"written": len(call["input"]["text"])}))
"""
VERIFY = """
import json, sys
call = json.load(sys.stdin)
with open(call["input"]["path"]) as f:
    sys.exit(1 if "BAD" in f.read() else 0)
"""
REPAIR = """
import json, sys
call = json.load(sys.stdin)
path = call["input"]["path"]
with open(path) as f:
    text = f.read()
with open(path, "w") as f:
    f.write(text.replace("BAD", "GOOD"))
"""
ROLLBACK = """
import json, os, shutil, sys
call = json.load(sys.stdin)
backup = os.path.join(call["stateDir"], "backup")
if os.path.exists(backup):
    shutil.copyfile(backup, call["input"]["path"])
else:
    os.remove(call["input"]["path"])
"""


@pytest.fixture(autouse=True)
def confinement(tmp_path: Path) -> None:
    """Plugins load only where their steps can be confined: say why when this machine cannot, never skip."""
    found = sandbox(tmp_path)
    assert not isinstance(found, str), f"the plugin tests need bubblewrap's sandbox: {found}"


def action_json(name: str, tier: str = "R2", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "riskTier": tier,
        "description": f"Write a file ({name}).",
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "text": {"type": "string"}},
            "required": ["path", "text"],
        },
        "outputSchema": {"type": "object", "properties": {"written": {"type": "integer"}}, "required": ["written"]},
        "permissions": {"commands": [], "filesystem": "workspace"},
        "verification": {"required": True, "commands": []},
        "rollback": {"required": True},
        "scope": {"allowedDirs": ["docs"], "forbiddenFiles": ["docs/secret.txt"], "pathArguments": ["path"]},
        **extra,
    }


def write_package(config: Path, name: str, declared: dict[str, Any], *, repair: bool = False) -> Path:
    package = config / "actions" / name
    package.mkdir(parents=True)
    (package / "action.json").write_text(json.dumps(declared, indent=2))
    scripts = {"execute": EXECUTE, "verify": VERIFY, "rollback": ROLLBACK} | ({"repair": REPAIR} if repair else {})
    for step, code in scripts.items():
        (package / f"{step}.py").write_text(textwrap.dedent(code))
    return package


def make_config(tmp_path: Path, *, modes: str = "", allow: bool = True, extra: str = "") -> Path:
    config = tmp_path / "config"
    (config / "policies").mkdir(parents=True)
    (config / "workspace" / "docs").mkdir(parents=True)
    (config / "workspace" / "docs" / "readme.txt").write_text("original\n")
    (config / "workspace" / "docs" / "secret.txt").write_text("secret\n")
    (config / "workspace" / MARKERS).mkdir()  # inside the workspace: steps see nothing else they may write
    (config / "bastion.toml").write_text(
        textwrap.dedent(f"""
        [plugins]
        allow_plugin_code = {"true" if allow else "false"}
        workspace = "workspace"
        timeout_seconds = 20
        env = {{ MARKER_DIR = "{config / "workspace" / MARKERS}" }}
        {extra}
        """)
    )
    (config / "policies" / "default.toml").write_text(f"[modes]\n{modes}\n")
    return config


def workspace_hash(workspace: Path) -> str:
    """What the workspace holds, the steps' markers aside."""
    digest = hashlib.sha256()
    for path in sorted(p for p in workspace.rglob("*") if MARKERS not in p.parts):
        digest.update(str(path.relative_to(workspace)).encode() + b"\0")
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@asynccontextmanager
async def plugin_bastion(config_dir: Path) -> AsyncIterator[tuple[Client, Gateway]]:
    config = load_config(config_dir)
    async with (
        open_gateway(config) as gateway,
        Client(HostServer(gateway).server, cache=None) as client,
    ):
        yield client, gateway


async def _pending(gateway: Gateway) -> Invocation:
    changes = gateway.ledger.changes
    with anyio.fail_after(WAIT):
        while not (found := await gateway.invocations.list(status="pending")):
            with anyio.move_on_after(0.1):
                await changes.next(changes.cursor)
    return found[0]


def _markers(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "config" / "workspace" / MARKERS).iterdir())


async def test_a_failed_verification_is_rolled_back_leaving_the_workspace_byte_identical(tmp_path: Path) -> None:
    config = make_config(tmp_path, modes='"plugins:*" = "allow"')
    write_package(config, "edit", action_json("edit"))
    before = workspace_hash(config / "workspace")
    async with plugin_bastion(config) as (client, gateway):
        result = await client.call_tool("plugins__edit", {"path": "docs/readme.txt", "text": "BAD content"})
        assert result.is_error
        envelope = result.structured_content
        assert envelope is not None
        assert envelope["status"] == "reverted"
        assert envelope["verification"]["ok"] is False
        assert envelope["repair"] == {"attempted": False, "ok": False}
        assert envelope["rollback"]["attempted"] is True
        assert envelope["rollback"]["ok"] is True
        assert workspace_hash(config / "workspace") == before
        [invocation] = await gateway.invocations.list()
        assert invocation.status == "failed"
        assert invocation.result is not None
        assert invocation.result["structuredContent"]["status"] == "reverted"


async def test_a_repair_that_works_succeeds_on_the_second_verification(tmp_path: Path) -> None:
    config = make_config(tmp_path, modes='"plugins:*" = "allow"')
    write_package(config, "edit", action_json("edit"), repair=True)
    async with plugin_bastion(config) as (client, gateway):
        result = await client.call_tool("plugins__edit", {"path": "docs/readme.txt", "text": "BAD content"})
        assert not result.is_error
        envelope = result.structured_content
        assert envelope is not None
        assert envelope["status"] == "succeeded"
        assert envelope["output"] == {"written": 11}
        assert envelope["repair"]["attempted"] is True
        assert envelope["repair"]["ok"] is True
        assert envelope["verification"]["ok"] is True
        assert envelope["rollback"]["attempted"] is False
        assert (config / "workspace" / "docs" / "readme.txt").read_text() == "GOOD content"
        [invocation] = await gateway.invocations.list()
        assert invocation.status == "completed"


async def test_each_step_runs_in_the_workspace_with_only_the_bound_credentials_in_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BASTION_TEST_SECRET", "not for plugins")
    config = make_config(tmp_path, modes='"plugins:*" = "allow"')
    write_package(config, "edit", action_json("edit"))
    async with plugin_bastion(config) as (client, _):
        result = await client.call_tool("plugins__edit", {"path": "docs/new.txt", "text": "fine"})
        assert not result.is_error
    [marker] = _markers(tmp_path)
    # Python itself may add LC_CTYPE (PEP 538 locale coercion), the sandbox PWD (the workspace); nothing of
    # Bastion's environment is passed.
    assert set(json.loads(marker.read_text())) - {"LC_CTYPE", "PWD"} == {"MARKER_DIR"}
    assert (config / "workspace" / "docs" / "new.txt").read_text() == "fine"


async def test_an_r3_plugin_is_held_for_an_approver_even_under_an_allow_policy(tmp_path: Path) -> None:
    config = make_config(tmp_path, modes='"plugins:deploy" = "allow"')
    write_package(config, "deploy", action_json("deploy", "R3"))
    async with plugin_bastion(config) as (client, gateway):
        entry = gateway.catalog.get("plugins__deploy")
        assert entry is not None
        decision = gateway.mode_of(entry, CallContext(session_id="test"))
        assert decision.mode == "require_approval"
        async with anyio.create_task_group() as tg:
            results: list[types.CallToolResult] = []

            async def call() -> None:
                results.append(await client.call_tool("plugins__deploy", {"path": "docs/a.txt", "text": "x"}))

            tg.start_soon(call)
            pending = await _pending(gateway)
            assert pending.mode == "require_approval"
            assert _markers(tmp_path) == []  # nothing ran while it waited
            await gateway.invocations.decide(pending.id, approve=True, principal="alice", note=None, now=utcnow())
        [result] = results
        assert not result.is_error
        assert len(_markers(tmp_path)) == 1


async def test_a_path_out_of_scope_is_refused_before_execute_runs_also_through_a_symlink(tmp_path: Path) -> None:
    config = make_config(tmp_path, modes='"plugins:*" = "allow"')
    write_package(config, "edit", action_json("edit"))
    workspace = config / "workspace"
    (tmp_path / "outside.txt").write_text("outside\n")
    (workspace / "docs" / "escape").symlink_to(tmp_path / "outside.txt")
    (workspace / "docs" / "hidden").symlink_to(workspace / "docs" / "secret.txt")
    (workspace / "top.txt").write_text("top\n")
    before = workspace_hash(workspace)
    async with plugin_bastion(config) as (client, gateway):
        for path in ("docs/escape", "docs/hidden", "docs/secret.txt", "docs/../top.txt", "../outside.txt", "/etc/x"):
            result = await client.call_tool("plugins__edit", {"path": path, "text": "x"})
            assert error_of(result)["class"] == "policy_denied", path
        invocations = await gateway.invocations.list()
        assert {i.status for i in invocations} == {"denied"}
        assert len(invocations) == 6
    assert _markers(tmp_path) == []
    assert workspace_hash(workspace) == before
    assert (tmp_path / "outside.txt").read_text() == "outside\n"


async def test_a_verification_command_outside_the_allowlist_is_refused_at_load_with_file_and_line(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path, extra='allowed_commands = [["git", "diff", "--exit-code"]]')
    listed = {"commands": ["rm -rf docs", "git diff --exit-code"], "filesystem": "workspace"}
    verification = {"required": True, "commands": ["git diff --exit-code", "rm -rf docs"]}
    package = write_package(config, "edit", action_json("edit", permissions=listed, verification=verification))
    loaded = load_config(config)
    issues = load_sources(loaded).problems
    [issue] = issues
    assert issue.file == package / "action.json"
    lines = (package / "action.json").read_text().splitlines()
    assert "rm -rf docs" in lines[issue.line - 1]
    assert '"verification"' in "\n".join(lines[: issue.line])
    async with plugin_bastion(config) as (client, _):
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert "plugins__edit" not in names


async def test_verification_commands_in_the_allowlist_run_as_argument_vectors(tmp_path: Path) -> None:
    check = f"{sys.executable} -c 'import sys; sys.exit(0)'"
    config = make_config(tmp_path, modes='"plugins:*" = "allow"', extra=f'allowed_commands = [["{sys.executable}"]]')
    listed = {"commands": [check], "filesystem": "workspace"}
    write_package(config, "edit", action_json("edit", permissions=listed, verification={"commands": [check]}))
    async with plugin_bastion(config) as (client, _):
        result = await client.call_tool("plugins__edit", {"path": "docs/a.txt", "text": "fine"})
    envelope = result.structured_content
    assert envelope is not None
    assert envelope["status"] == "succeeded"
    checks = envelope["verification"]["checks"]
    assert [check["ok"] for check in checks] == [True, True]
    assert checks[1]["command"] == [sys.executable, "-c", "import sys; sys.exit(0)"]


def test_a_composite_with_a_step_that_needs_an_approver_is_held_even_when_policy_allows_it() -> None:
    allowed = ModeDecision(mode="allow", source="org")
    steps = [("plugins:deploy", ModeDecision(mode="require_approval", source="declared"), False)]
    held = compose_mode(allowed, approval_required=False, steps=steps, held_steps=["plugins:deploy"])
    assert held == ModeDecision(mode="require_approval", source="declared:plugins:deploy")
    assert compose_mode(allowed, approval_required=False, steps=steps) == allowed


async def test_a_step_that_runs_too_long_is_stopped(tmp_path: Path) -> None:
    code = "import threading; print('{}', flush=True); threading.Event().wait()"  # never ends by itself
    run = await run_step([sys.executable, "-c", code], {}, cwd=tmp_path, env={}, timeout=0.5, max_output=1024)
    assert not run.ok
    assert run.error is not None
    assert "longer than" in run.error


async def test_a_step_that_writes_past_the_output_cap_is_stopped(tmp_path: Path) -> None:
    code = "import sys\nwhile True: sys.stdout.write('x' * 65536)"
    run = await run_step([sys.executable, "-c", code], None, cwd=tmp_path, env={}, timeout=20, max_output=100_000)
    assert not run.ok
    assert run.error is not None
    assert "more than 100000 bytes" in run.error


async def test_a_step_whose_output_is_not_a_json_object_fails(tmp_path: Path) -> None:
    run = await run_step([sys.executable, "-c", "print('[1]')"], {}, cwd=tmp_path, env={}, timeout=20, max_output=1024)
    assert not run.ok
    assert run.exit_code == 0


def test_packages_are_not_loaded_without_allow_plugin_code(tmp_path: Path) -> None:
    config = make_config(tmp_path, allow=False)
    package = write_package(config, "edit", action_json("edit"))
    issues = load_sources(load_config(config)).problems
    [issue] = issues
    assert issue.file == package / "action.json"
    assert "allow_plugin_code" in issue.message


def test_an_r2_package_without_rollback_is_rejected_at_load_with_file_and_line(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    package = write_package(config, "edit", action_json("edit", rollback={"required": False}))
    (package / "rollback.py").unlink()
    issues = load_sources(load_config(config)).problems
    [issue] = issues
    lines = (package / "action.json").read_text().splitlines()
    assert '"rollback"' in lines[issue.line - 1]


def test_a_plugin_never_takes_a_manifest_action_name(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    package = write_package(config, "edit", action_json("edit"))
    packages, problems = load_plugins(config / "actions", allowed_commands=[], taken={"edit"})
    assert packages == []
    [problem] = problems
    assert problem.file == package / "action.json"


LEAKY = """
import json, os, sys
call = json.load(sys.stdin)
print("connecting with", os.environ["DEPLOY_TOKEN"], file=sys.stderr)
print(json.dumps({"written": 0, "echo": os.environ["DEPLOY_TOKEN"]}))
sys.exit(3)
"""


async def test_a_failing_steps_bound_credential_never_reaches_the_host_or_the_ledger(tmp_path: Path) -> None:
    """A step that prints its `[plugins] env` token on stderr and fails: the envelope the host gets, and the
    ledger's copy of it, carry [REDACTED] where the token was."""
    token = "dpl_0123456789abcdefSECRET"  # nothing about it looks like a credential to the ledger's redaction
    config = make_config(tmp_path, modes='"plugins:*" = "allow"', extra="")
    text = (config / "bastion.toml").read_text().replace("env = {", f'env = {{ DEPLOY_TOKEN = "{token}",', 1)
    (config / "bastion.toml").write_text(text)
    package = write_package(config, "leaky", action_json("leaky"))
    (package / "execute.py").write_text(textwrap.dedent(LEAKY))
    async with plugin_bastion(config) as (client, gateway):
        with anyio.fail_after(WAIT):
            result = await client.call_tool("plugins__leaky", {"path": "docs/readme.txt", "text": "x"})
        (invocation,) = await gateway.invocations.list()
    assert result.is_error
    said = json.dumps(result.model_dump(mode="json")) + json.dumps(invocation.model_dump(mode="json"))
    assert token not in said
    assert "connecting with [REDACTED]" in said


PROBE = """
import json, os, sys
call = json.load(sys.stdin)
workspace = call["workspace"]
config = os.path.dirname(workspace)  # the tests' workspace is the configuration directory's `workspace`


def attempt(action):
    try:
        action()
        return True
    except OSError:
        return False


def write():
    with open(os.path.join(workspace, "docs", "probe.txt"), "w") as f:
        f.write("probe")


def read():
    with open(os.path.join(workspace, "docs", "readme.txt")) as f:
        f.read()


def peek():
    with open(os.path.join(config, "bastion.toml")) as f:
        f.read()


seen = {"write": attempt(write), "read": attempt(read), "config": attempt(peek)}
print(json.dumps({"written": 0, "seen": seen}))
"""


@pytest.mark.parametrize(
    ("filesystem", "seen"),
    [
        ("workspace", {"write": True, "read": True, "config": False}),
        ("read", {"write": False, "read": True, "config": False}),
        ("none", {"write": False, "read": False, "config": False}),
    ],
)
async def test_a_steps_filesystem_permission_is_applied_and_bastions_own_files_are_hidden(
    tmp_path: Path, filesystem: str, seen: dict[str, bool]
) -> None:
    config = make_config(tmp_path, modes='"plugins:*" = "allow"')
    declared = action_json("probe", "R1", rollback={"required": False}, verification={"required": False})
    declared["permissions"]["filesystem"] = filesystem
    package = write_package(config, "probe", declared)
    (package / "execute.py").write_text(textwrap.dedent(PROBE))
    async with plugin_bastion(config) as (client, _):
        with anyio.fail_after(WAIT):
            result = await client.call_tool("plugins__probe", {"path": "docs/readme.txt", "text": "x"})
    assert result.structured_content is not None, result.content
    assert result.structured_content["output"]["seen"] == seen
    assert not (config / "workspace" / "docs" / "probe.txt").exists() or filesystem == "workspace"


def test_a_package_declaring_commands_no_one_can_confine_it_to_is_not_loaded(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    write_package(config, "runs", action_json("runs", permissions={"commands": ["curl"], "filesystem": "read"}))
    packages, problems = load_plugins(config / "actions", allowed_commands=[])
    assert packages == []
    (problem,) = problems
    assert '"curl" in permissions.commands is not a verification command' in problem.message


HOLDER = """
import json, os, shutil, subprocess, sys, threading
call = json.load(sys.stdin)
path = call["input"]["path"]
shutil.copyfile(path, os.path.join(call["stateDir"], "backup"))  # what rollback restores
with open(path, "w") as f:
    f.write(call["input"]["text"])
fifo = os.path.join(call["workspace"], "held")
writer = os.open(fifo, os.O_WRONLY)  # held by this step and, inherited, by the child it starts
subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"], pass_fds=(writer,))
os.write(writer, b"started\\n")
threading.Event().wait()  # until killed
"""


async def test_a_step_dies_with_a_sigkilled_bastion_and_an_approver_can_then_roll_it_back(tmp_path: Path) -> None:
    """The step and the process it started hold a FIFO open: once Bastion is SIGKILLed (its process alone, as an
    out-of-memory kill would), the FIFO's reader sees its end, so nothing of the call changes the workspace after
    its outcome is unknown. The restarted Bastion names the call and its rollback; the rollback, run by an
    approver, finds the state the call left, restores the file, and records the call failed."""
    config = make_config(tmp_path, modes='"plugins:*" = "allow"')
    package = write_package(config, "hold", action_json("hold"))
    (package / "execute.py").write_text(textwrap.dedent(HOLDER))
    readme = config / "workspace" / "docs" / "readme.txt"
    fifo = config / "workspace" / "held"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    env = bastion_env(tmp_path / "home")
    heard = b""
    try:
        async with (
            bastion_http(["--config", str(config)], env=env) as bastion,
            anyio.create_task_group() as tg,
        ):

            async def call() -> None:
                with contextlib.suppress(Exception):  # its Bastion is killed under it
                    async with Client(bastion.mcp_url, cache=None) as client:
                        await client.call_tool("plugins__hold", {"path": "docs/readme.txt", "text": "changed"})

            tg.start_soon(call)
            with anyio.fail_after(WAIT):
                while b"started" not in heard:
                    await anyio.wait_readable(reader)
                    heard += os.read(reader, 100)
            os.kill(bastion.pid, signal.SIGKILL)
            with anyio.fail_after(WAIT):  # every writer gone: the read end sees the end of the FIFO
                while True:
                    await anyio.wait_readable(reader)
                    if os.read(reader, 100) == b"":
                        break
            tg.cancel_scope.cancel()
    finally:
        os.close(reader)
    assert readme.read_text() == "changed"
    async with bastion_http(["--config", str(config)], env=env) as again:
        named = await again.stderr.wait_for(lambda line: "bastion invocations rollback" in line)
    invocation_id = named.split("bastion invocations rollback ")[1].split()[0]
    rolled = run_cli("invocations", "rollback", invocation_id, "--config", str(config), "--json", env=env)
    assert rolled.returncode == 0, rolled.stdout + rolled.stderr
    assert readme.read_text() == "original\n"
    async with await open_ledger(config / "state" / "ledger.db", redactor=Redactor()) as ledger:
        settled = await ledger.invocations.get(invocation_id)
        events = await ledger.invocations.events(invocation_id)
    assert settled is not None and settled.status == "failed"
    assert (events[-1].kind, events[-1].detail["how"], events[-1].detail["rollback"]["ok"]) == (
        "reconciled",
        "rollback",
        True,
    )
    again_refused = run_cli("invocations", "rollback", invocation_id, "--config", str(config), env=env)
    assert again_refused.returncode == 1  # settled: there is nothing left to roll back


async def test_a_package_edited_to_a_lower_risk_is_drift_and_keeps_its_pinned_mode(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    package = write_package(config, "deploy", action_json("deploy", "R3"))
    async with plugin_bastion(config) as (client, gateway):
        entry = gateway.catalog.get("plugins__deploy")
        assert entry is not None and gateway.mode_of(entry, CallContext(session_id="test")).mode == "deny"

    (package / "action.json").write_text(json.dumps(action_json("deploy", "R0"), indent=2))
    async with plugin_bastion(config) as (client, gateway):
        entry = gateway.catalog.get("plugins__deploy")
        assert entry is not None and entry.action.risk == "read"
        assert gateway.pins.drift("plugins", "deploy") is not None, "the declared risk is in the pinned definition"
        assert gateway.mode_of(entry, CallContext(session_id="test")).mode == "deny", "judged by the pinned risk"
        result = await client.call_tool("plugins__deploy", {"path": "docs/a.txt", "text": "x"})
        assert result.is_error
    assert _markers(tmp_path) == []


@pytest.mark.parametrize("shown", [True, False], ids=["shown-again", "hidden-by-tmp"])
def test_a_python_installed_under_tmp_still_runs_steps(tmp_path: Path, shown: bool) -> None:
    """A Bastion whose Python lives under /tmp (a virtualenv there) runs its steps with it, though each step gets a
    fresh /tmp of its own."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    assert venv.is_relative_to("/tmp"), "the test's own temporary directories are under /tmp"
    found = sandbox(tmp_path)
    assert not isinstance(found, str), found
    confined = dataclasses.replace(found, runtime=(venv,) if shown else ())
    for folder in ("state", "package", "workspace"):
        (tmp_path / folder).mkdir()
    confined = dataclasses.replace(confined, workspace=tmp_path / "workspace")
    python = [str(venv / "bin" / "python"), "-c", "print(6 * 7)"]
    argv = confined.argv(python, filesystem="read", package=tmp_path / "package", state=tmp_path / "state")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert (done.returncode == 0 and done.stdout.strip() == "42") is shown, done.stderr
