"""Where composites meet the rest: a manifest action whose steps are the official TypeScript filesystem server's
tools (npm, 2025-11-25, stdio), behind a real `bastion serve`, a host of either protocol era in front, on either
ledger. A step policy holds makes the composite wait for an approver before any step runs; once approved, its
steps run on the TypeScript server, each recorded as a child (the held one covered by that approval)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import StdioServerParameters

from bastion.config import load_config
from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.ledger.anchors import trusted_keys
from bastion.ledger.verify import verify_signed
from bastion.models import Invocation, Principal, utcnow
from bastion.pipeline.authority import decide
from tests.postgres import PostgresServer
from tests.processes import bastion_command, bastion_env
from tests.test_e2e import host_client
from tests.test_result_shapes import _filesystem_connector
from tests.tools import ensure_tools

pytestmark = pytest.mark.anyio

WAIT = 60
APPROVER = Principal(name="alice", role="admin")

SHOW = """\
+++
name = "show"
version = "1.0.0"
risk = "read"

[[inputs]]
name = "path"
type = "string"
description = "The file to read."

[[requires.connectors]]
id = "fs"
capabilities = ["list_allowed_directories", "read_text_file"]

[[execute]]
id = "where"
source = "fs"
action = "list_allowed_directories"
inputs = {}

[[execute]]
id = "read"
source = "fs"
action = "read_text_file"
inputs = { path = "${args.path}" }
+++
List where files may be read, then read one.
"""


def config_dir(tmp_path: Path, ledger: str) -> Path:
    directory = tmp_path / "config"
    for folder in ("connectors", "policies", "actions"):
        (directory / folder).mkdir(parents=True)
    (tmp_path / "served").mkdir()
    (directory / "bastion.toml").write_text(
        textwrap.dedent(f"""\
        [server]
        ledger = {json.dumps(ledger)}
        startup_wait_seconds = 30
        [limits]
        list_timeout_seconds = 30
        """)
    )
    (directory / "connectors" / "fs.toml").write_text(_filesystem_connector(tmp_path / "served"))
    # Every step reads, so the composite's risk is `read` and its default mode `allow`; policy holds one step.
    (directory / "policies" / "default.toml").write_text(
        '[modes]\n"fs:*" = "allow"\n"fs:read_text_file" = "require_approval"\n'
    )
    (directory / "actions" / "show.md").write_text(SHOW)
    return directory


async def pending_show(ledger: OpenLedger) -> Invocation:
    """The composite's invocation once it is pending (another process records it: the feed is read, not run)."""
    while True:
        cursor = ledger.changes.cursor
        found = [i for i in await ledger.invocations.list(status="pending") if i.policy_key == "actions:show"]
        if found:
            return found[0]
        with anyio.move_on_after(0.2):
            await ledger.changes.next(cursor)


@pytest.mark.parametrize("mode", ["legacy", "auto"], ids=["host-2025-11-25", "host-2026-07-28"])
@pytest.mark.parametrize("ledger_kind", ["sqlite", "postgres"])
async def test_a_composite_over_a_typescript_server_waits_for_its_held_step_then_runs_it(
    tmp_path: Path, request: pytest.FixtureRequest, mode: str, ledger_kind: str
) -> None:
    ensure_tools()
    if ledger_kind == "postgres":
        postgres: PostgresServer = request.getfixturevalue("postgres")
        url = postgres.create_database()
    else:
        url = "sqlite:///state/ledger.db"
    directory = config_dir(tmp_path, url)
    config = load_config(directory)
    env = bastion_env(tmp_path / "home")
    argv = bastion_command("serve", "--config", str(directory))
    target = tmp_path / "served" / "kept.txt"
    target.write_text("read after approval")

    async with (
        await open_ledger(config.ledger_url, redactor=Redactor(), key_path=config.ledger_key) as ledger,
        host_client(StdioServerParameters(command=argv[0], args=argv[1:], env=env), mode) as (client, _),
    ):
        answered: list[types.CallToolResult] = []

        async def call() -> None:
            answered.append(await client.call_tool("actions__show", {"path": str(target)}))

        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                pending = await pending_show(ledger)
                assert (pending.mode, pending.mode_source) == ("require_approval", "step:fs:read_text_file")
                assert await ledger.invocations.list(parent_id=pending.id) == [], "no step ran before the approval"
                await decide(ledger, pending.id, approve=True, principal=APPROVER, note=None, now=utcnow())
        (result,) = answered
        assert not result.is_error, result.content
        steps = list(reversed(await ledger.invocations.list(parent_id=pending.id)))
        # What the gateway and the approver wrote, from two processes, verifies: every row, and the signed approval.
        audited = await verify_signed(ledger.audit, [], trusted_keys(ledger.key_path, []))
        kept = len(await ledger.pins.pins()) + len(await ledger.pins.tool_names())
    assert audited.broken is None, audited.broken
    assert (audited.records, audited.decisions) == (3 + kept, 1)  # the call, its two steps, the pins and names

    assert "read after approval" in json.dumps(result.model_dump(mode="json"))
    assert [(s.action_id, s.status, s.mode) for s in steps] == [
        ("list_allowed_directories", "completed", "allow"),
        ("read_text_file", "completed", "require_approval"),
    ]
