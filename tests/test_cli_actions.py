"""`bastion actions` and `bastion doctor` on action files, with real Bastion processes, real connectors and a real
MCP client: enable/disable survives a restart, and one `doctor` run reports every broken file with its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mcp import Client

from tests.processes import bastion_env, bastion_http, run_cli, write_config
from tests.test_gateway import error_of
from tests.test_manifests import STAMPED_NOTE

pytestmark = pytest.mark.anyio

TOOL = "actions__stamped-note"


def _config(tmp_path: Path) -> Path:
    config = write_config(
        tmp_path / "config", notes_file=tmp_path / "notes.json", policy='[modes]\n"actions:stamped-note" = "allow"\n'
    )
    (config / "actions").mkdir()
    (config / "actions" / "stamped-note.md").write_text(STAMPED_NOTE)
    return config


async def _tools(url: str) -> set[str]:
    async with Client(url, cache=None) as client:
        return {tool.name for tool in (await client.list_tools()).tools}


async def test_a_disabled_action_stays_hidden_and_refused_across_restarts_until_enabled(tmp_path: Path) -> None:
    config = _config(tmp_path)
    env = bastion_env(tmp_path / "home")

    disabled = run_cli("actions", "disable", "stamped-note", "--config", str(config), "--json", env=env)
    assert disabled.returncode == 0, disabled.stderr
    state = Path(json.loads(disabled.stdout)["state_file"])
    assert state.parent == config / "state", "kept beside the ledger, outside the action file"
    for _ in range(2):  # and again after a restart
        async with bastion_http(["--config", str(config)], env=env) as bastion:
            assert "notes__write_note" in await _tools(bastion.mcp_url)
            assert TOOL not in await _tools(bastion.mcp_url)
            async with Client(bastion.mcp_url, cache=None) as client:
                refused = await client.call_tool(TOOL, {"name": "log", "text": "hi"})
            assert error_of(refused)["class"] == "not_found"

    (config / "actions" / "stamped-note.md").write_text(STAMPED_NOTE)  # a re-install keeps the choice
    listed = run_cli("actions", "list", "--config", str(config), "--json", env=env)
    assert [(a["name"], a["state"]) for a in json.loads(listed.stdout)] == [("stamped-note", "disabled")]

    assert run_cli("actions", "enable", "stamped-note", "--config", str(config), env=env).returncode == 0
    async with bastion_http(["--config", str(config)], env=env) as bastion:
        assert TOOL in await _tools(bastion.mcp_url)
        async with Client(bastion.mcp_url, cache=None) as client:
            result = await client.call_tool(TOOL, {"name": "log", "text": "hi"})
        assert not result.is_error, result.content
    assert json.loads((tmp_path / "notes.json").read_text())["log"].startswith("hi (")

    listed = json.loads(run_cli("invocations", "list", "--config", str(config), "--json", env=env).stdout)
    (parent,) = [i for i in listed if i["tool"] == TOOL and i["status"] == "completed"]
    assert sorted(i["policy_key"] for i in listed if i["parent_id"] == parent["id"]) == [
        "notes:write_note",
        "time:get_current_time",
    ]
    shown = run_cli("invocations", "show", parent["id"], "--config", str(config), "--json", env=env)
    steps = json.loads(shown.stdout)["steps"]
    assert [(s["policy_key"], s["status"]) for s in steps] == [
        ("time:get_current_time", "completed"),
        ("notes:write_note", "completed"),
    ]


async def test_actions_show_names_what_each_required_connector_runs_now_to_pin_it(tmp_path: Path) -> None:
    config = _config(tmp_path)
    env = bastion_env(tmp_path / "home")
    shown = run_cli("actions", "show", "stamped-note", "--config", str(config), "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    action = json.loads(shown.stdout)
    assert (action["state"], action["risk"], action["declared_risk"]) == ("enabled", "write", "read")
    assert (action["mode"], action["mode_source"]) == ("allow", "org")
    time = next(r for r in action["requires"] if r["id"] == "time")
    assert time["current_hash"].startswith("sha256:") and time["current_version"]

    pinned = STAMPED_NOTE.replace('id = "time"\n', f'id = "time"\nhash = "sha256:{"0" * 64}"\n')
    (config / "actions" / "stamped-note.md").write_text(pinned)
    shown = run_cli("actions", "show", "stamped-note", "--config", str(config), env=env)
    assert "state: unavailable" in shown.stdout and time["current_hash"] in shown.stdout

    missing = run_cli("actions", "disable", "nope", "--config", str(config), "--json", env=env)
    assert missing.returncode == 1
    assert json.loads(missing.stdout)["error"]["class"] == "not_found"


def test_one_doctor_run_reports_every_broken_action_file_with_its_class_file_and_line(tmp_path: Path) -> None:
    config = _config(tmp_path)
    actions = config / "actions"
    (actions / "unclosed.md").write_text('+++\nname = "x"\n')
    (actions / "syntax.md").write_text('+++\nname = "x"\nversion = 1.0.0\n+++\nBody.\n')
    (actions / "wide.md").write_text(
        STAMPED_NOTE.replace('"stamped-note"', '"wide"').replace('action = "write_note"', 'action = "delete_note"')
    )
    (actions / "mail.md").write_text(STAMPED_NOTE.replace('"stamped-note"', '"mail"').replace('"notes"', '"mail"'))
    (actions / "refs.md").write_text(
        STAMPED_NOTE.replace('"stamped-note"', '"refs"').replace("${now.datetime}", "${then.x}")
    )
    env = bastion_env(tmp_path / "home")

    doctor = run_cli("doctor", "--json", "--config", str(config), env=env)
    assert doctor.returncode == 2, doctor.stderr
    report = json.loads(doctor.stdout)
    found = [(Path(p["file"]).name, p["line"], p["class"], p["boundary"]) for p in report["problems"]]
    assert found == [
        ("mail.md", 27, "not_found", "connector"),
        ("refs.md", 41, "validation_error", "manifest"),
        ("syntax.md", 3, "parse_error", "manifest"),
        ("unclosed.md", 1, "parse_error", "manifest"),
        ("wide.md", 40, "capability_denied", "manifest"),
    ]
    assert report["counts"]["actions"] == 3, "loaded: the good file, the one refused on call, the unavailable one"

    text = run_cli("doctor", "--config", str(config), env=env)
    assert f"{actions / 'syntax.md'}:3: parse_error: TOML syntax error" in text.stdout
