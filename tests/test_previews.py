"""Previews of held calls beside their arguments: a provider write shows the request it would send (never sent,
credentials redacted), a composite its steps with resolved arguments and their modes, a plugin its dry run (its
`plan` step, which cannot write the workspace), and `bastion approvals watch` shows the preview of the selected call;
a preview that cannot be made says why, and the call is held all the same."""

from __future__ import annotations

import json
import textwrap
from contextlib import suppress
from pathlib import Path

import anyio
import pytest
from mcp import Client

from bastion.config import Config, PolicyConfig, ProviderConfig, Settings
from bastion.errors import ChangesLost
from bastion.ledger import Redactor, open_ledger
from bastion.models import Invocation, Preview, utcnow
from bastion.pipeline.documents import stored_preview
from bastion.pipeline.gateway import Gateway
from bastion.pipeline.previews import bounded
from bastion.pipeline.seams import ChangeFeed, InvocationStore
from bastion.server.mcp import HostServer
from bastion.sources.providers import provider_source
from tests.fake_apis import FakeGitHub
from tests.providers import CANARY
from tests.test_manifests import ECHO_TWICE, manifest, manifest_bastion
from tests.test_plugins import action_json, make_config, plugin_bastion, workspace_hash, write_package

pytestmark = pytest.mark.anyio

WAIT = 20


async def held_call(store: InvocationStore, changes: ChangeFeed) -> Invocation:
    """The first pending call, once there is one (the caller bounds the wait)."""
    while not (found := await store.list(status="pending")):
        with anyio.move_on_after(0.1), suppress(ChangesLost):
            await changes.next(changes.cursor)
    return found[0]


async def _preview_of(store: InvocationStore, invocation: Invocation) -> Preview:
    found = stored_preview(await store.events(invocation.id))
    assert found is not None
    return found


async def test_a_provider_write_shows_the_request_it_would_send_and_sends_nothing_before_the_approval(
    tmp_path: Path,
) -> None:
    fake = FakeGitHub()
    config = Config(
        directory=None,
        settings=Settings(),
        connectors=[],
        policy=PolicyConfig(modes={"github:create_issue": "require_approval"}),
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    async with await open_ledger(tmp_path / "l.db", redactor=Redactor()) as ledger:
        github = provider_source(
            "github",
            ProviderConfig.model_validate({"token": CANARY}),
            marker_key=ledger.marker_key,
            transport=fake.transport,
        )
        gateway = Gateway(config, ledger, [github])
        async with gateway.running(), Client(HostServer(gateway).server, cache=None) as client:
            arguments = {"owner": "acme", "repo": "app", "title": "Crash on save", "body": "Steps: save."}
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(client.call_tool, "github__create_issue", arguments)
                    held = await held_call(gateway.invocations, gateway.ledger.changes)
                    preview = await _preview_of(ledger.invocations, held)
                    assert fake.requests == [], "the preview sent nothing"
                    await ledger.invocations.decide(held.id, approve=True, principal="alice", note=None, now=utcnow())
    assert preview.kind == "request"
    assert preview.summary == "github:create_issue would send POST https://api.github.com/repos/acme/app/issues"
    lines = preview.text.splitlines()
    assert lines[0] == "POST https://api.github.com/repos/acme/app/issues"
    assert "authorization: [REDACTED]" in lines
    assert f"idempotency-key: {held.id}" in lines
    assert '  "title": "Crash on save",' in lines
    assert CANARY not in preview.text
    (sent,) = fake.requests  # what the approval sent is what the preview showed
    assert f"{sent.method} {sent.url}" == lines[0]
    assert json.loads(preview.text.split("\n\n", 1)[1]) == json.loads(sent.content)


async def test_a_composite_shows_its_steps_with_resolved_arguments_and_their_modes(tmp_path: Path) -> None:
    files = {"x.md": manifest("twice", ECHO_TWICE)}
    modes = {"actions:twice": "require_approval", "fx:echo": "allow"}
    async with manifest_bastion(tmp_path, files, modes=modes) as b:
        await b.wait_listed("actions__twice")
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(b.client.call_tool, "actions__twice", {"text": "hi"})
                held = await held_call(b.ledger.invocations, b.ledger.changes)
                preview = await _preview_of(b.ledger.invocations, held)
                assert await b.steps_of(held.id) == [], "the preview ran no step"
                await b.ledger.invocations.decide(held.id, approve=False, principal="alice", note="no", now=utcnow())
    assert (preview.kind, preview.summary) == ("steps", "twice runs 2 step(s), in order")
    assert preview.text.splitlines() == [
        "1. first: fx:echo  [allow (org)]",
        "   {",
        '     "text": "hi"',
        "   }",
        "2. second: fx:echo  [allow (org)]",
        "   {",
        '     "text": "again: ${first.echo.text}"',
        "   }",
    ]


PLAN = """
import json, os, sys
call = json.load(sys.stdin)
path = call["input"]["path"]
try:
    open(path, "a").close()
    wrote = "it could write"
except OSError:
    wrote = "the workspace is read-only"
before = open(path).read() if os.path.exists(path) else ""
print(json.dumps({"summary": f"write {path} ({wrote})", "text": f"-{before.strip()}\\n+{call['input']['text']}"}))
"""


async def test_a_plugin_with_a_plan_step_shows_its_dry_run_which_cannot_write_the_workspace(tmp_path: Path) -> None:
    config = make_config(tmp_path, modes='"plugins:writer" = "require_approval"')
    package = write_package(config, "writer", action_json("writer"))
    (package / "plan.py").write_text(textwrap.dedent(PLAN))
    before = workspace_hash(config / "workspace")
    async with plugin_bastion(config) as (client, gateway):
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "plugins__writer", {"path": "docs/readme.txt", "text": "changed"})
                held = await held_call(gateway.invocations, gateway.ledger.changes)
                preview = await _preview_of(gateway.invocations, held)
                assert workspace_hash(config / "workspace") == before
                await gateway.invocations.decide(held.id, approve=False, principal="alice", note="no", now=utcnow())
    assert preview == Preview(
        kind="plan", summary="write docs/readme.txt (the workspace is read-only)", text="-original\n+changed"
    )


async def test_a_preview_that_fails_says_why_and_the_call_is_held_all_the_same(tmp_path: Path) -> None:
    config = make_config(tmp_path, modes='"plugins:writer" = "require_approval"')
    package = write_package(config, "writer", action_json("writer"))
    (package / "plan.py").write_text("import sys\nsys.exit(3)\n")
    async with plugin_bastion(config) as (client, gateway):
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.call_tool, "plugins__writer", {"path": "docs/readme.txt", "text": "x"})
                held = await held_call(gateway.invocations, gateway.ledger.changes)
                preview = await _preview_of(gateway.invocations, held)
                await gateway.invocations.decide(held.id, approve=False, principal="alice", note="no", now=utcnow())
    assert preview.kind == "none"
    assert preview.summary == "no preview: plugins:writer's plan step failed (it exited with status 3)"


def test_a_long_preview_is_cut_at_a_line_with_a_note() -> None:
    text = "".join(f"+line {n}\n" for n in range(1000))
    cut = bounded(Preview(kind="diff", summary="big", text=text), 256)
    lines = cut.text.splitlines()
    assert len(cut.text.encode()) < 400
    assert lines[0] == "+line 0"
    assert lines[-1].startswith("[preview cut: ") and "more line(s) not shown" in lines[-1]
    assert bounded(Preview(kind="diff", summary="small", text="+a\n"), 256).text == "+a\n"
