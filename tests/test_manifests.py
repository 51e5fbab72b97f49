"""Manifest actions through the whole pipeline: a real MCP client, Bastion's host server and gateway, a
real SQLite ledger, and real connectors (the demo notes server and mcp-server-time as subprocesses, or the
in-process fixture server)."""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp import Client
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bastion import tracing
from bastion.actions import ActionSpec
from bastion.config import Config, ConnectorConfig, PolicyConfig, Profile, Settings
from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.models import CallContext, Grant, Invocation, PolicyRule, Quorum, SourceStatus, utcnow
from bastion.pipeline.gateway import Gateway
from bastion.server.mcp import HostServer
from bastion.sources.manifests import ActionState, ManifestProblem, load_manifests
from bastion.sources.manifests.source import ManifestSource, connector_hash
from bastion.sources.mcp import McpConnector
from bastion.sources.seam import ActionSource
from tests.downstream import FixtureServer, default_tools
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio

WAIT = 30
SHIPPED = Path(__file__).resolve().parent.parent / "manifests" / "actions"


def manifest(
    name: str,
    steps: str,
    *,
    risk: str = "read",
    requires: str = '[[requires.connectors]]\nid = "fx"\ncapabilities = ["echo", "fail", "shapes", "sleep"]\n',
    inputs: str = '[[inputs]]\nname = "text"\ntype = "string"\ndescription = "What to echo."\n',
    extra: str = "",
) -> str:
    return (
        f'+++\nname = "{name}"\nversion = "1.0.0"\nrisk = "{risk}"\n{extra}\n{inputs}\n{requires}\n{steps}+++\n'
        f"The {name} action.\n\nMore about it.\n"
    )


ECHO_TWICE = """
[[execute]]
id = "first"
source = "fx"
action = "echo"
inputs = { text = "${args.text}" }

[[execute]]
id = "second"
source = "fx"
action = "echo"
inputs = { text = "again: ${first.echo.text}" }
"""


@dataclass
class Bastion:
    client: Client
    gateway: Gateway
    ledger: OpenLedger
    source: ManifestSource
    state: ActionState
    problems: list[ManifestProblem]

    async def steps_of(self, invocation_id: str) -> list[Invocation]:
        return list(reversed(await self.ledger.invocations.list(parent_id=invocation_id)))

    async def manifest_invocation(self) -> Invocation:
        (found,) = await self.ledger.invocations.list(source_id="actions")
        return found

    async def wait_listed(self, name: str, *, listed: bool = True) -> None:
        """Until the catalog lists `name` (or no longer does)."""
        await self.until(lambda: (name in self.gateway.catalog.entries) == listed)

    async def until(self, condition: Callable[[], bool]) -> None:
        """Until `condition` holds, looked at after every rebuild of the catalog (a bounded wait)."""
        rebuilt = anyio.Event()

        async def on_rebuild() -> None:
            rebuilt.set()

        self.gateway.on_catalog_changed(on_rebuild)
        with anyio.fail_after(WAIT):
            while not condition():
                await rebuilt.wait()
                rebuilt = anyio.Event()


@asynccontextmanager
async def manifest_bastion(
    tmp_path: Path,
    files: Mapping[str, str],
    *,
    modes: dict[str, str] | None = None,
    policy: PolicyConfig | None = None,
    settings: Settings | None = None,
    fixture: FixtureServer | None = None,
    real: bool = False,
    git: Path | None = None,
    poll_seconds: float = 0.05,
) -> AsyncIterator[Bastion]:
    """A Bastion over the fixture server (`fx`), or with `real` over the demo notes server and mcp-server-time (and
    mcp-server-git started in the repository `git`)."""
    folder = tmp_path / "actions"
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    sources: list[ActionSource]
    if real:
        notes = ConnectorConfig(
            id="notes",
            command=sys.executable,
            args=["-m", "bastion.demo.notes"],
            env={"BASTION_NOTES_FILE": str(tmp_path / "notes.json")},
        )
        time = ConnectorConfig(
            id="time", command=sys.executable, args=["-m", "mcp_server_time", "--local-timezone", "UTC"]
        )
        connectors = [notes, time]
        if git is not None:
            args = ["-m", "mcp_server_git", "--repository", str(git)]
            connectors.append(ConnectorConfig(id="git", command=sys.executable, args=args, cwd=str(git)))
        sources = [McpConnector(c, list_timeout=WAIT) for c in connectors]
    else:
        served = fixture or FixtureServer()
        connectors = [ConnectorConfig(id="fx", command="unused")]
        sources = [McpConnector(connectors[0], target=lambda: served.server)]
    manifests, problems = load_manifests(folder, sources={c.id for c in connectors})
    state = ActionState(tmp_path / "action-state.json")
    source = ManifestSource(manifests, state, poll_seconds=poll_seconds)
    config = Config(
        directory=None,
        settings=settings or Settings(),
        connectors=connectors,
        policy=policy or PolicyConfig(modes=modes or {}),
        ledger_url=f"sqlite:///{tmp_path}/ledger.db",
    )
    async with await open_ledger(tmp_path / "ledger.db", redactor=Redactor()) as ledger:
        gateway = Gateway(config, ledger, [*sources, source])
        async with gateway.running(), Client(HostServer(gateway).server, cache=None) as client:
            yield Bastion(client, gateway, ledger, source, state, problems)


async def _pending(ledger: OpenLedger) -> Invocation:
    with anyio.fail_after(WAIT):
        while not (found := await ledger.invocations.list(status="pending")):
            with anyio.move_on_after(0.1):
                await ledger.changes.next(ledger.changes.cursor)
    return found[0]


# -- end to end over real connectors ------------------------------------------------------------------------

STAMPED_NOTE = """+++
name = "stamped-note"
version = "1.0.0"
risk = "read"

[[inputs]]
name = "name"
type = "string"
description = "The note's name."

[[inputs]]
name = "text"
type = "string"
description = "What to write."

[[inputs]]
name = "timezone"
type = "string"
required = false
default = "Europe/Paris"
description = "The time zone of the stamp."

[[requires.connectors]]
id = "time"
capabilities = ["get_current_time"]

[[requires.connectors]]
id = "notes"
capabilities = ["write_note"]

[[execute]]
id = "now"
source = "time"
action = "get_current_time"
inputs = { timezone = "${args.timezone}" }

[[execute]]
id = "save"
source = "notes"
action = "write_note"
inputs = { name = "${args.name}", text = "${args.text} (${now.day_of_week} ${now.datetime}, ${now.timezone})" }
+++
Write a note stamped with the current time.
"""


async def test_a_manifest_chains_two_real_connectors_the_second_step_using_the_first_steps_output(
    tmp_path: Path,
) -> None:
    async with manifest_bastion(tmp_path, {"stamped.md": STAMPED_NOTE}, real=True) as b:
        await b.wait_listed("actions__stamped-note")
        (tool,) = [t for t in (await b.client.list_tools()).tools if t.name == "actions__stamped-note"]
        assert tool.description == "Write a note stamped with the current time."
        assert tool.input_schema["required"] == ["name", "text"]
        entry = b.gateway.catalog.entries["actions__stamped-note"]
        assert entry.action.risk == "write", "declared read, but its second step writes"

        async with anyio.create_task_group() as tg:
            results: list[types.CallToolResult] = []

            async def call() -> None:
                results.append(await b.client.call_tool("actions__stamped-note", {"name": "log", "text": "hello"}))

            tg.start_soon(call)
            pending = await _pending(b.ledger)
            assert (pending.policy_key, pending.mode, pending.mode_source) == (
                "actions:stamped-note",
                "require_approval",
                "inferred",
            )
            await b.ledger.invocations.decide(pending.id, approve=True, principal="alice", note=None, now=utcnow())

        (result,) = results
        assert not result.is_error, result.content
        assert result.structured_content is not None
        now = result.structured_content["steps"]["now"]["output"]
        assert now["timezone"] == "Europe/Paris"
        notes = json.loads((tmp_path / "notes.json").read_text())
        assert notes["log"] == f"hello ({now['day_of_week']} {now['datetime']}, Europe/Paris)"

        parent = await b.manifest_invocation()
        assert parent.status == "completed"
        steps = await b.steps_of(parent.id)
        assert [(s.policy_key, s.status, s.parent_id) for s in steps] == [
            ("time:get_current_time", "completed", parent.id),
            ("notes:write_note", "completed", parent.id),
        ]
        assert steps[1].mode == "require_approval", "the step needs approval on its own ..."
        assert await b.ledger.invocations.count("pending") == 0, "... but the manifest's approval covered it"
        assert steps[1].args == {"name": "log", "text": notes["log"]}
        assert [e.kind for e in await b.ledger.invocations.events(steps[1].id)] == [
            "planned",
            "approved",
            "executing",
            "completed",
        ]


async def test_the_shipped_repo_snapshot_action_chains_git_and_notes_end_to_end(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    identity = ["-c", "user.name=t", "-c", "user.email=t@e"]
    await anyio.run_process(["git", "init", "-q"], cwd=repo)
    await anyio.run_process(["git", *identity, "commit", "-q", "--allow-empty", "-m", "first commit"], cwd=repo)
    (repo / "untracked.txt").write_text("new\n")
    files = {name: (SHIPPED / name).read_text() for name in ("repo-snapshot.md", "stamped-note.md")}
    modes = {"actions:repo-snapshot": "allow"}
    async with manifest_bastion(tmp_path, files, real=True, git=repo, modes=modes) as b:
        assert b.problems == [], "the shipped examples load clean"
        await b.wait_listed("actions__repo-snapshot")
        result = await b.client.call_tool("actions__repo-snapshot", {"note": "snapshot", "commits": 1})
        assert not result.is_error, result.content

        note = json.loads((tmp_path / "notes.json").read_text())["snapshot"]
        assert "untracked.txt" in note and "first commit" in note
        steps = await b.steps_of((await b.manifest_invocation()).id)
        assert [(s.policy_key, s.status) for s in steps] == [
            ("git:git_status", "completed"),
            ("git:git_log", "completed"),
            ("notes:write_note", "completed"),
        ]
        assert steps[1].args == {"repo_path": ".", "max_count": 1}


# -- checks before any step runs ------------------------------------------------------------------------------


async def test_a_step_outside_the_manifests_capabilities_is_refused_before_any_step_runs(tmp_path: Path) -> None:
    fixture = FixtureServer()
    narrow = '[[requires.connectors]]\nid = "fx"\ncapabilities = ["echo"]\n'
    steps = ECHO_TWICE.replace(
        'id = "second"\nsource = "fx"\naction = "echo"', 'id = "second"\nsource = "fx"\naction = "shapes"'
    )
    files = {"x.md": manifest("sneaky", steps, requires=narrow)}
    async with manifest_bastion(tmp_path, files, fixture=fixture, modes={"actions:*": "allow"}) as b:
        assert [(p.error_class, p.line) for p in b.problems] == [("capability_denied", 25)]
        await b.wait_listed("actions__sneaky")
        result = await b.client.call_tool("actions__sneaky", {"text": "hi"})

        assert error_of(result)["class"] == "capability_denied"
        assert fixture.calls == [], "not even the allowed first step ran"
        parent = await b.manifest_invocation()
        assert (parent.status, parent.error_class) == ("failed", "capability_denied")
        assert await b.steps_of(parent.id) == []


async def test_a_manifest_never_looks_safer_than_its_steps(tmp_path: Path) -> None:
    steps = ECHO_TWICE.replace(
        'id = "second"\nsource = "fx"\naction = "echo"', 'id = "second"\nsource = "fx"\naction = "fail"'
    )
    fixture = FixtureServer()
    async with manifest_bastion(tmp_path, {"x.md": manifest("risky", steps, risk="R0")}, fixture=fixture) as b:
        await b.wait_listed("actions__risky")
        entry = b.gateway.catalog.entries["actions__risky"]
        assert entry.action.risk == "danger", "declared R0 (read), but fx:fail is destructive"
        assert entry.tool.annotations is not None and entry.tool.annotations.destructive_hint is True

        result = await b.client.call_tool("actions__risky", {"text": "hi"})
        assert error_of(result)["class"] == "policy_denied"
        parent = await b.manifest_invocation()
        assert (parent.status, parent.risk, parent.mode_source) == ("denied", "danger", "inferred")
        assert parent.risk_source == "step:fx:fail", "the approver is told which step made it risky"
        assert fixture.calls == []


@pytest.mark.parametrize(
    ("declared", "tier", "approvers"),
    [("R4", "R4", 2), ("r4", "R4", 2), ("R3", "R3", 1), ("danger", None, 1), ("R2", None, 1)],
)
async def test_a_manifest_keeps_its_declared_tier_for_policy_unless_a_step_raises_its_risk(
    tmp_path: Path, declared: str, tier: str | None, approvers: int
) -> None:
    """`[approvers] R4 = 2` holds a manifest declared R4 for two approvers. Declared R2 (write) over a destructive
    step, it is `danger` of no tier: the tier it declared no longer stands for its risk."""
    steps = ECHO_TWICE.replace(
        'id = "second"\nsource = "fx"\naction = "echo"', 'id = "second"\nsource = "fx"\naction = "fail"'
    )
    policy = PolicyConfig(modes={"actions:gated": "require_approval", "fx:fail": "allow"}, approvers={"R4": 2})
    files = {"x.md": manifest("gated", steps, risk=declared)}
    async with manifest_bastion(tmp_path, files, policy=policy) as b:
        await b.wait_listed("actions__gated")
        spec = b.gateway.catalog.entries["actions__gated"].action.spec
        assert (spec.risk, spec.tier) == ("danger", tier)
        async with anyio.create_task_group() as tg:
            tg.start_soon(b.client.call_tool, "actions__gated", {"text": "hi"})
            pending = await _pending(b.ledger)
            quorum = Quorum.of(await b.ledger.invocations.events(pending.id))
            assert (pending.mode, quorum.required) == ("require_approval", approvers)
            await b.ledger.invocations.decide(pending.id, approve=False, principal="alice", note="no", now=utcnow())


async def test_a_step_denied_by_policy_denies_the_manifest_even_where_policy_allows_it(tmp_path: Path) -> None:
    fixture = FixtureServer()
    modes = {"actions:twice": "allow", "fx:echo": "deny"}
    async with manifest_bastion(tmp_path, {"x.md": manifest("twice", ECHO_TWICE)}, fixture=fixture, modes=modes) as b:
        await b.wait_listed("actions__twice")
        result = await b.client.call_tool("actions__twice", {"text": "hi"})
        assert error_of(result)["class"] == "policy_denied"
        parent = await b.manifest_invocation()
        assert (parent.status, parent.mode, parent.mode_source) == ("denied", "deny", "step:fx:echo")
        assert fixture.calls == []


async def test_declared_approval_holds_a_manifest_that_policy_allows(tmp_path: Path) -> None:
    files = {"x.md": manifest("twice", ECHO_TWICE, extra="[approval]\nrequired = true\n")}
    async with manifest_bastion(tmp_path, files, modes={"actions:twice": "allow"}) as b:
        await b.wait_listed("actions__twice")
        async with anyio.create_task_group() as tg:
            tg.start_soon(b.client.call_tool, "actions__twice", {"text": "hi"})
            pending = await _pending(b.ledger)
            assert (pending.mode, pending.mode_source) == ("require_approval", "declared")
            await b.ledger.invocations.decide(pending.id, approve=False, principal="alice", note="no", now=utcnow())
        assert await b.steps_of(pending.id) == []


HELD_ECHO = {
    "modes": PolicyConfig(modes={"fx:echo": "require_approval"}),
    "rule": PolicyConfig(rules=[PolicyRule(key="fx:echo", when="args.text != ''", mode="require_approval")]),
    "profile": PolicyConfig(profiles={"careful": Profile(modes={"fx:echo": "require_approval"})}),
}


@pytest.mark.parametrize("held_by", HELD_ECHO)
async def test_a_step_policy_holds_holds_the_manifest_the_risk_default_allows(tmp_path: Path, held_by: str) -> None:
    fixture = FixtureServer()
    files = {"x.md": manifest("twice", ECHO_TWICE)}
    async with manifest_bastion(tmp_path, files, policy=HELD_ECHO[held_by], fixture=fixture) as b:
        await b.wait_listed("actions__twice")
        context = CallContext(session_id="s", profile="careful", local_session=True)
        async with anyio.create_task_group() as tg:
            tg.start_soon(b.gateway.call, "actions__twice", {"text": "hi"}, context)
            pending = await _pending(b.ledger)
            assert (pending.tool, pending.mode, pending.mode_source) == (
                "actions__twice",
                "require_approval",
                "step:fx:echo",
            )
            assert fixture.calls == [], "no step ran before an approver decided"
            await b.ledger.invocations.decide(pending.id, approve=True, principal="alice", note=None, now=utcnow())
        steps = await b.steps_of(pending.id)
        assert [(s.status, s.mode) for s in steps] == [("completed", "require_approval")] * 2
        executing = [e for e in await b.ledger.invocations.events(steps[0].id) if e.kind == "executing"]
        assert f"covered by invocation {pending.id}" in executing[0].detail["approval"]


async def test_an_approvers_grant_on_the_manifest_does_not_cover_a_held_step(tmp_path: Path) -> None:
    fixture = FixtureServer()
    files = {"x.md": manifest("twice", ECHO_TWICE, risk="write")}
    async with manifest_bastion(tmp_path, files, modes={"fx:echo": "require_approval"}, fixture=fixture) as b:
        await b.wait_listed("actions__twice")
        now = utcnow()
        grant = Grant(
            id="hour_000000000001",
            policy_key="actions:twice",
            scope="hour",
            grantor="alice",
            invocation_id="earlier",
            created_at=now,
            expires_at=now + timedelta(hours=1),
        )
        await b.ledger.grants.add(grant)
        async with anyio.create_task_group() as tg:
            tg.start_soon(b.client.call_tool, "actions__twice", {"text": "hi"})
            pending = await _pending(b.ledger)
            assert (pending.mode, pending.mode_source) == ("require_approval", "step:fx:echo")
            await b.ledger.invocations.decide(pending.id, approve=False, principal="bob", note=None, now=utcnow())
        assert fixture.calls == []


async def test_the_steps_of_a_manifest_count_against_the_session_rate_limit(tmp_path: Path) -> None:
    fixture = FixtureServer()
    settings = Settings.model_validate({"limits": {"invocations_per_minute": 4}})
    three = ECHO_TWICE + '\n[[execute]]\nid = "third"\nsource = "fx"\naction = "echo"\ninputs = { text = "3" }\n'
    files = {"x.md": manifest("thrice", three)}
    async with manifest_bastion(tmp_path, files, settings=settings, fixture=fixture) as b:
        await b.wait_listed("actions__thrice")
        assert not (await b.client.call_tool("actions__thrice", {"text": "hi"})).is_error
        assert len(fixture.calls) == 3
        refused = await b.client.call_tool("actions__thrice", {"text": "again"})
        assert error_of(refused)["class"] == "rate_limited", "the first call and its 3 steps took the 4 a minute"
        assert len(fixture.calls) == 3


# -- running the steps ----------------------------------------------------------------------------------------


async def test_the_first_failing_step_stops_the_chain_with_its_error_and_nothing_is_undone(tmp_path: Path) -> None:
    steps = (
        ECHO_TWICE.replace(
            'id = "second"\nsource = "fx"\naction = "echo"', 'id = "second"\nsource = "fx"\naction = "fail"'
        )
        + '\n[[execute]]\nid = "third"\nsource = "fx"\naction = "echo"\ninputs = { text = "never" }\n'
    )
    fixture = FixtureServer()
    modes = {"actions:chain": "allow", "fx:fail": "allow"}
    async with manifest_bastion(tmp_path, {"x.md": manifest("chain", steps)}, fixture=fixture, modes=modes) as b:
        await b.wait_listed("actions__chain")
        result = await b.client.call_tool("actions__chain", {"text": "hi"})

        error = error_of(result)
        assert error["class"] == "upstream_error"
        assert not error["retriable"]
        assert "'second'" in error["message"] and "not undone" in error["message"]
        assert [call.name for call in fixture.calls] == ["echo", "fail"]
        parent = await b.manifest_invocation()
        assert (parent.status, parent.error_class, error["invocation_id"]) == ("failed", "upstream_error", parent.id)
        children = await b.steps_of(parent.id)
        assert [(s.action_id, s.status) for s in children] == [("echo", "completed"), ("fail", "failed")]
        assert children[1].id in error["message"]


async def test_a_step_that_needs_approval_runs_without_asking_under_a_manifest_policy_allows(tmp_path: Path) -> None:
    steps = '[[execute]]\nid = "draw"\nsource = "fx"\naction = "shapes"\ninputs = { at = [1, "${args.x}"] }\n'
    inputs = '[[inputs]]\nname = "x"\ntype = "number"\ndescription = "Where."\n'
    files = {"x.md": manifest("draw", steps, inputs=inputs)}
    fixture = FixtureServer()
    async with manifest_bastion(tmp_path, files, fixture=fixture, modes={"actions:draw": "allow"}) as b:
        await b.wait_listed("actions__draw")
        result = await b.client.call_tool("actions__draw", {"x": 2.5})
        assert not result.is_error, result.content
        assert fixture.calls[0].arguments == {"at": [1, 2.5]}, "a whole-value reference keeps its JSON type"
        (step,) = await b.steps_of((await b.manifest_invocation()).id)
        assert (step.mode, step.status) == ("require_approval", "completed")
        executing = [e for e in await b.ledger.invocations.events(step.id) if e.kind == "executing"]
        assert "covered by invocation" in executing[0].detail["approval"]


async def test_a_drifted_step_holds_the_manifest_for_an_approver(tmp_path: Path) -> None:
    fixture = FixtureServer()
    async with manifest_bastion(tmp_path, {"x.md": manifest("twice", ECHO_TWICE)}, fixture=fixture) as b:
        await b.wait_listed("actions__twice")
        assert not (await b.client.call_tool("actions__twice", {"text": "hi"})).is_error
        echo = fixture.tools[0].model_copy(update={"description": "Echo, then mail it away."})
        changed = [echo, *fixture.tools[1:]]
        await fixture.set_tools(changed)
        await b.until(lambda: b.gateway.pins.drift("fx", "echo") is not None)
        async with anyio.create_task_group() as tg:
            tg.start_soon(b.client.call_tool, "actions__twice", {"text": "hi"})
            pending = await _pending(b.ledger)
            assert (pending.mode, pending.mode_source) == ("require_approval", "drift:fx:echo")
            await b.ledger.invocations.decide(pending.id, approve=False, principal="alice", note=None, now=utcnow())


# -- availability ---------------------------------------------------------------------------------------------


def _fixture_hash() -> str:
    status = SourceStatus(source_id="fx", state="ready", server_name="fixture", server_version="1.0.0")
    return connector_hash(status, [ActionSpec(tool=t, risk="read", namespace="fx") for t in default_tools()])


async def test_a_connector_pin_that_no_longer_matches_makes_the_manifest_unavailable(tmp_path: Path) -> None:
    pinned = (
        f'[[requires.connectors]]\nid = "fx"\nversion = "1.0.0"\nhash = "{_fixture_hash()}"\ncapabilities = ["echo"]\n'
    )
    fixture = FixtureServer()
    files = {"x.md": manifest("twice", ECHO_TWICE, requires=pinned)}
    async with manifest_bastion(tmp_path, files, fixture=fixture) as b:
        await b.wait_listed("actions__twice")
        assert not (await b.client.call_tool("actions__twice", {"text": "hi"})).is_error

        await fixture.set_tools([*fixture.tools, types.Tool(name="extra", input_schema={"type": "object"})])
        await b.wait_listed("actions__twice", listed=False)
        assert "actions__twice" not in {t.name for t in (await b.client.list_tools()).tools}
        refused = await b.client.call_tool("actions__twice", {"text": "hi"})
        assert error_of(refused)["class"] == "connector_unavailable"
        assert "content hash" in error_of(refused)["message"]
        (view,) = b.source.views()
        assert view.reason is not None and view.hashes["fx"] != _fixture_hash()


async def test_a_connector_of_another_version_than_pinned_keeps_the_manifest_unavailable(tmp_path: Path) -> None:
    pinned = '[[requires.connectors]]\nid = "fx"\nversion = "0.9.0"\ncapabilities = ["echo"]\n'
    async with manifest_bastion(tmp_path, {"x.md": manifest("twice", ECHO_TWICE, requires=pinned)}) as b:
        await b.until(lambda: b.source.status.state == "ready")
        (view,) = b.source.views()
        assert view.reason is not None and "0.9.0" in view.reason and "1.0.0" in view.reason
        assert "actions__twice" not in b.gateway.catalog.entries
        refused = await b.client.call_tool("actions__twice", {"text": "hi"})
        assert error_of(refused)["class"] == "connector_unavailable"


async def test_a_disabled_manifest_is_hidden_and_refused_until_enabled_again(tmp_path: Path) -> None:
    async with manifest_bastion(tmp_path, {"x.md": manifest("twice", ECHO_TWICE)}) as b:
        await b.wait_listed("actions__twice")
        b.state.set_enabled("twice", False)
        await b.wait_listed("actions__twice", listed=False)
        assert "actions__twice" not in {t.name for t in (await b.client.list_tools()).tools}
        refused = await b.client.call_tool("actions__twice", {"text": "hi"})
        assert error_of(refused)["class"] == "not_found"
        assert "bastion actions enable twice" in error_of(refused)["message"]

        b.state.set_enabled("twice", True)
        await b.wait_listed("actions__twice")
        assert not (await b.client.call_tool("actions__twice", {"text": "hi"})).is_error


async def test_each_step_has_a_span_with_its_invocation_under_the_manifests_downstream_span(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        async with manifest_bastion(tmp_path, {"x.md": manifest("twice", ECHO_TWICE)}) as b:
            await b.wait_listed("actions__twice")
            assert not (await b.client.call_tool("actions__twice", {"text": "hi"})).is_error
            steps = await b.steps_of((await b.manifest_invocation()).id)
    finally:
        tracing.use_provider(None)
        provider.shutdown()

    finished = exporter.get_finished_spans()
    (composite,) = [s for s in finished if s.name == "bastion.downstream actions:twice"]
    step_spans = [s for s in finished if s.name == "bastion.step fx:echo"]
    assert [s.attributes[tracing.INVOCATION_ID] for s in step_spans if s.attributes] == [s.id for s in steps]
    assert all(s.parent is not None and s.parent.span_id == composite.context.span_id for s in step_spans)
    downstream = [s for s in finished if s.name == "bastion.downstream fx:echo"]
    assert [d.parent.span_id for d in downstream if d.parent] == [s.context.span_id for s in step_spans]


async def test_a_manifest_edited_to_a_lower_risk_is_drift_and_keeps_its_pinned_mode(tmp_path: Path) -> None:
    fixture = FixtureServer()
    async with manifest_bastion(tmp_path, {"x.md": manifest("twice", ECHO_TWICE, risk="danger")}, fixture=fixture) as b:
        await b.wait_listed("actions__twice")
        assert error_of(await b.client.call_tool("actions__twice", {"text": "hi"}))["class"] == "policy_denied"

    async with manifest_bastion(tmp_path, {"x.md": manifest("twice", ECHO_TWICE, risk="read")}, fixture=fixture) as b:
        await b.wait_listed("actions__twice")
        assert b.gateway.pins.drift("actions", "twice") is not None, "the declared risk is in the pinned definition"
        result = await b.client.call_tool("actions__twice", {"text": "hi"})
        assert error_of(result)["class"] == "policy_denied", "lowering the risk does not loosen the mode"
        last = (await b.ledger.invocations.list(source_id="actions"))[0]
        assert (last.mode, last.drift is not None) == ("deny", True), "judged by the pinned risk: danger"
    assert fixture.calls == []
