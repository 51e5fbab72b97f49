"""Relay: resources, templates, subscriptions, prompts, completion, logging, sampling and
elicitation of a downstream, through an in-process Bastion, in both protocol eras on both hops.

Real parts: the SDK host client, Bastion's host server and gateway, a SQLite ledger, and the
`ContentFixture` downstream behind a real McpConnector, reached in-process (2026-07-28) or over
memory streams with the 2025-11-25 handshake.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
import pytest
from mcp import MCPError
from mcp.client.session import ClientRequestContext, IncomingMessage
from mcp.client.subscriptions import PromptsListChanged, ResourcesListChanged, ResourceUpdated, Subscription

from bastion.errors import NotFound
from bastion.pipeline.content import ContentCatalog, ContentRouter, SourceContent
from bastion.sources.mcp import McpConnector
from bastion.sources.mcp.inflight import InFlightCalls
from tests.downstream import ContentFixture, StreamTarget
from tests.harness import Harness, harness
from tests.test_connector import Changes, config, down, ready, running
from tests.test_gateway import error_of

pytestmark = pytest.mark.anyio

WAIT = 10.0
HOSTS = ["legacy", "auto"]  # the host's era: 2025-11-25 over JSON-RPC streams, or 2026-07-28 in-process
DOWNSTREAMS = ["direct", "legacy-streams"]  # the downstream's era: 2026-07-28, or 2025-11-25
README = "fixture://notes/readme"
KEPT_META = {"example.com/kept": 1}


class Heard:
    """A host message handler that keeps every notification and lets a test wait for one."""

    def __init__(self) -> None:
        self.notifications: list[types.ServerNotification] = []
        self._news = anyio.Event()

    async def __call__(self, message: IncomingMessage) -> None:
        if isinstance(message, Exception):
            return
        self.notifications.append(message)
        self._news.set()
        self._news = anyio.Event()

    def of(self, kind: type[types.ServerNotification]) -> list[types.ServerNotification]:
        return [n for n in self.notifications if isinstance(n, kind)]

    async def until(self, predicate: Callable[[], bool]) -> None:
        with anyio.fail_after(WAIT):
            while not predicate():
                await self._news.wait()


class Logs:
    """A host logging callback."""

    def __init__(self) -> None:
        self.received: list[types.LoggingMessageNotificationParams] = []

    async def __call__(self, params: types.LoggingMessageNotificationParams) -> None:
        self.received.append(params)

    @property
    def levels(self) -> list[str]:
        return [p.level for p in self.received]


class Model:
    """A host sampling callback that answers with a fixed text and remembers the prompts."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def __call__(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        content = params.messages[0].content
        assert isinstance(content, types.TextContent)
        self.prompts.append(content.text)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="a poem"), model="test-model"
        )


class User:
    """A host elicitation callback that fills the form with a name."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        self.asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Ada"})


async def legacy_request(h: Harness, request: Any) -> None:
    """A 2025-era request the SDK only offers as a deprecated helper."""
    await h.client.session.send_request(request, types.EmptyResult)


def assert_eras(h: Harness, mode: str, downstream: str) -> None:
    """Both hops speak the era the test names."""
    assert h.client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
    (fx,) = [s for s in h.gateway.statuses() if s.source_id == "fx"]
    assert fx.protocol_version == ("2025-11-25" if downstream == "legacy-streams" else "2026-07-28")


def relayed_meta(meta: dict[str, Any] | None) -> dict[str, Any]:
    """A relayed result's `_meta` with Bastion's own 2026-07-28 identity stamp set aside (it is not the
    downstream's: the downstream's protocol keys must all be gone)."""
    meta = dict(meta or {})
    stamp = meta.pop("io.modelcontextprotocol/serverInfo", None)
    assert stamp is None or stamp["name"] == "bastion"
    return meta


def text_of(result: types.CallToolResult) -> str:
    assert not result.is_error, result
    content = result.content[0]
    assert isinstance(content, types.TextContent)
    return content.text


# -- listing ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", HOSTS)
async def test_resources_templates_and_prompts_are_listed_under_the_connector_namespace(
    tmp_path: Path, mode: str
) -> None:
    async with harness(tmp_path, fixture=ContentFixture(), mode=mode) as h:
        resources = (await h.client.list_resources()).resources
        assert {(r.name, r.uri) for r in resources} == {("fx__readme", README), ("fx__blob", "fixture://blob")}
        readme = next(r for r in resources if r.uri == README)
        assert (readme.title, readme.mime_type) == ("Read me", "text/plain")
        (template,) = (await h.client.list_resource_templates()).resource_templates
        assert (template.name, template.uri_template) == ("fx__item", "fixture://items/{id}")
        (prompt,) = (await h.client.list_prompts()).prompts
        assert prompt.name == "fx__greet"
        assert prompt.arguments == h.fixture.prompts[0].arguments  # type: ignore[attr-defined]


async def test_an_unprefixed_connector_is_mounted_under_its_own_names(tmp_path: Path) -> None:
    async with harness(tmp_path, fixture=ContentFixture(), namespace="") as h:
        assert {r.name for r in (await h.client.list_resources()).resources} == {"readme", "blob"}
        assert [t.name for t in (await h.client.list_resource_templates()).resource_templates] == ["item"]
        assert [p.name for p in (await h.client.list_prompts()).prompts] == ["greet"]
        assert "echo" in {t.name for t in (await h.client.list_tools()).tools}
        got = await h.client.get_prompt("greet", {"who": "bob"})
        assert got.messages


async def test_bastion_advertises_what_it_relays(tmp_path: Path) -> None:
    async with harness(tmp_path, fixture=ContentFixture(), mode="legacy") as h:
        capabilities = h.client.server_capabilities
        assert capabilities.resources is not None and capabilities.resources.subscribe
        assert capabilities.resources.list_changed
        assert capabilities.prompts is not None and capabilities.prompts.list_changed
        assert capabilities.completions is not None
        assert capabilities.logging is not None


# -- resources ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("downstream", DOWNSTREAMS)
@pytest.mark.parametrize("mode", HOSTS)
async def test_reading_a_resource_returns_the_downstream_contents_without_its_protocol_meta(
    tmp_path: Path, mode: str, downstream: str
) -> None:
    async with harness(tmp_path, fixture=ContentFixture(), mode=mode, downstream=downstream) as h:
        assert_eras(h, mode, downstream)
        read = await h.client.read_resource(README)
        (contents,) = read.contents
        assert isinstance(contents, types.TextResourceContents)
        assert (contents.uri, contents.text, contents.mime_type) == (README, "read me", "text/plain")
        assert relayed_meta(read.meta) == KEPT_META
        (blob,) = (await h.client.read_resource("fixture://blob")).contents
        assert isinstance(blob, types.BlobResourceContents) and blob.blob == "AAEC"
        (item,) = (await h.client.read_resource("fixture://items/42")).contents
        assert isinstance(item, types.TextResourceContents) and item.text == "item 42"
        assert await h.ledger.invocations.list() == []  # not an action: nothing gated, nothing recorded


@pytest.mark.parametrize("mode", HOSTS)
async def test_an_unknown_uri_is_invalid_params_and_a_downstream_error_passes_through(
    tmp_path: Path, mode: str
) -> None:
    fixture = ContentFixture()
    fixture.templates = [types.ResourceTemplate(uri_template="fixture://{+rest}", name="anything")]
    async with harness(tmp_path, fixture=fixture, mode=mode) as h:
        with pytest.raises(MCPError) as unrouted:
            await h.client.read_resource("elsewhere://nothing")
        assert unrouted.value.code == types.INVALID_PARAMS
        with pytest.raises(MCPError) as refused:
            await h.client.read_resource("fixture://missing")  # routed by the template, refused downstream
        assert (refused.value.code, refused.value.message) == (types.INVALID_PARAMS, "Resource not found")
        assert refused.value.error.data == {"uri": "fixture://missing"}


@pytest.mark.parametrize("downstream", DOWNSTREAMS)
async def test_a_legacy_hosts_subscription_forwards_updates_until_it_unsubscribes(
    tmp_path: Path, downstream: str
) -> None:
    heard = Heard()
    fixture = ContentFixture()
    async with harness(tmp_path, fixture=fixture, mode="legacy", downstream=downstream, messages=heard) as h:
        item = "fixture://items/7"
        await legacy_request(h, types.SubscribeRequest(params=types.SubscribeRequestParams(uri=README)))
        await legacy_request(h, types.SubscribeRequest(params=types.SubscribeRequestParams(uri=item)))
        if downstream == "legacy-streams":
            assert fixture.subscribed == {README, item}
        await fixture.touch(README)
        await heard.until(lambda: bool(heard.of(types.ResourceUpdatedNotification)))

        await legacy_request(h, types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=README)))
        if downstream == "legacy-streams":
            assert fixture.subscribed == {item}
        await fixture.touch(README)  # no longer subscribed: not relayed ...
        await fixture.touch(item)  # ... while this one, sent after it, is
        await heard.until(lambda: len(heard.of(types.ResourceUpdatedNotification)) == 2)
        uris = [n.params.uri for n in heard.of(types.ResourceUpdatedNotification)]  # type: ignore[union-attr]
        assert uris == [README, item]


@pytest.mark.parametrize("downstream", DOWNSTREAMS)
async def test_a_modern_hosts_listen_stream_holds_its_resource_subscriptions(tmp_path: Path, downstream: str) -> None:
    fixture = ContentFixture()
    async with harness(tmp_path, fixture=fixture, downstream=downstream) as h:
        async with h.client.listen(resource_subscriptions=[README]) as subscription:
            if downstream == "legacy-streams":
                assert fixture.subscribed == {README}
            await fixture.touch(README)
            assert await next_event(subscription) == ResourceUpdated(README)
        if downstream == "legacy-streams":
            with anyio.fail_after(WAIT):
                while fixture.subscribed:  # the stream's end releases the subscription
                    await fixture.subscriptions_changed.wait()


async def next_event(subscription: Subscription) -> object:
    with anyio.fail_after(WAIT):
        return await subscription.__anext__()


# -- prompts and completion ---------------------------------------------------------------------------


@pytest.mark.parametrize("downstream", DOWNSTREAMS)
@pytest.mark.parametrize("mode", HOSTS)
async def test_getting_a_prompt_routes_to_its_upstream_name(tmp_path: Path, mode: str, downstream: str) -> None:
    fixture = ContentFixture()
    async with harness(tmp_path, fixture=fixture, mode=mode, downstream=downstream) as h:
        got = await h.client.get_prompt("fx__greet", {"who": "bob", "tone": "briefly"})
        (message,) = got.messages
        assert isinstance(message.content, types.TextContent)
        assert message.content.text == "Say hello to bob, briefly."
        assert (got.description, relayed_meta(got.meta)) == ("A greeting", KEPT_META)
        assert [r.name for r in fixture.prompt_requests] == ["greet"]
        with pytest.raises(MCPError) as unknown:
            await h.client.get_prompt("fx__nope")
        assert unknown.value.code == types.INVALID_PARAMS
        assert await h.ledger.invocations.list() == []


@pytest.mark.parametrize("mode", HOSTS)
async def test_completion_is_forwarded_for_prompts_and_resource_templates(tmp_path: Path, mode: str) -> None:
    fixture = ContentFixture()
    async with harness(tmp_path, fixture=fixture, mode=mode) as h:
        names = await h.client.complete(types.PromptReference(name="fx__greet"), {"name": "who", "value": "al"})
        assert names.completion.values == ["alice", "albert"]
        assert relayed_meta(names.meta) == KEPT_META
        assert isinstance(fixture.completions[0].ref, types.PromptReference)
        assert fixture.completions[0].ref.name == "greet"
        ids = await h.client.complete(
            types.ResourceTemplateReference(uri="fixture://items/{id}"), {"name": "id", "value": ""}
        )
        assert ids.completion.values == ["1", "2", "3"]
        with pytest.raises(MCPError) as unknown:
            await h.client.complete(types.PromptReference(name="greet"), {"name": "who", "value": ""})
        assert unknown.value.code == types.INVALID_PARAMS


# -- listing changes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("downstream", DOWNSTREAMS)
async def test_a_legacy_host_hears_resource_and_prompt_list_changes(tmp_path: Path, downstream: str) -> None:
    heard = Heard()
    fixture = ContentFixture()
    async with harness(tmp_path, fixture=fixture, mode="legacy", downstream=downstream, messages=heard) as h:
        fresh = types.Resource(uri="fixture://fresh", name="fresh")
        await fixture.set_resources([*fixture.resources, fresh])
        await heard.until(lambda: bool(heard.of(types.ResourceListChangedNotification)))
        assert "fx__fresh" in {r.name for r in (await h.client.list_resources()).resources}
        await fixture.set_prompts([])
        await heard.until(lambda: bool(heard.of(types.PromptListChangedNotification)))
        assert (await h.client.list_prompts()).prompts == []
        assert not heard.of(types.ToolListChangedNotification)  # the tools did not change


@pytest.mark.parametrize("downstream", DOWNSTREAMS)
async def test_a_modern_host_hears_resource_and_prompt_list_changes(tmp_path: Path, downstream: str) -> None:
    fixture = ContentFixture()
    async with (
        harness(tmp_path, fixture=fixture, downstream=downstream) as h,
        h.client.listen(resources_list_changed=True, prompts_list_changed=True) as subscription,
    ):
        await fixture.set_resources([types.Resource(uri="fixture://fresh", name="fresh")])
        assert await next_event(subscription) == ResourcesListChanged()
        assert [r.uri for r in (await h.client.list_resources()).resources] == ["fixture://fresh"]
        await fixture.set_prompts([])
        assert await next_event(subscription) == PromptsListChanged()
        assert (await h.client.list_prompts()).prompts == []


# -- logging, sampling, elicitation inside the call ---------------------------------------------------


@pytest.mark.parametrize("downstream", DOWNSTREAMS)
async def test_a_legacy_hosts_log_level_filters_the_downstreams_log_messages(tmp_path: Path, downstream: str) -> None:
    logs = Logs()
    fixture = ContentFixture()
    async with harness(tmp_path, fixture=fixture, mode="legacy", downstream=downstream, logging=logs) as h:
        assert text_of(await h.call("fx__chatty")) == "chatted"
        assert logs.levels == ["info", "warning"]  # info until the host sets a level
        await legacy_request(h, types.SetLevelRequest(params=types.SetLevelRequestParams(level="debug")))
        assert text_of(await h.call("fx__chatty")) == "chatted"
        assert logs.levels == ["info", "warning", "debug", "info", "warning"]
        assert logs.received[-1].logger == "fixture"
        if downstream == "legacy-streams":
            assert fixture.log_level == "debug"  # asked once for everything; each host's level applies on relay
        else:
            assert fixture.log_opt_ins == ["info", "debug"]  # opted in per call


@pytest.mark.parametrize("downstream", DOWNSTREAMS)
async def test_a_modern_host_hears_log_messages_only_when_its_request_opts_in(tmp_path: Path, downstream: str) -> None:
    logs = Logs()
    fixture = ContentFixture()
    async with harness(tmp_path, fixture=fixture, downstream=downstream, logging=logs, log_level="warning") as h:
        assert text_of(await h.call("fx__chatty")) == "chatted"
        assert logs.levels == ["warning"]
    quiet = Logs()
    async with harness(tmp_path / "quiet", fixture=ContentFixture(), downstream=downstream, logging=quiet) as h:
        assert text_of(await h.call("fx__chatty")) == "chatted"
        assert quiet.levels == []


@pytest.mark.parametrize("downstream", [*DOWNSTREAMS, "streams"])
@pytest.mark.parametrize("mode", HOSTS)
async def test_sampling_by_the_downstream_is_answered_by_the_calling_host(
    tmp_path: Path, mode: str, downstream: str
) -> None:
    model = Model()
    async with harness(tmp_path, fixture=ContentFixture(), mode=mode, downstream=downstream, sampling=model) as h:
        assert_eras(h, mode, downstream)
        assert text_of(await h.call("fx__sample", {"prompt": "write a poem"})) == "sampled: a poem"
        assert model.prompts == ["write a poem"]
        assert (await h.only_invocation()).status == "completed"


@pytest.mark.parametrize("downstream", [*DOWNSTREAMS, "streams"])
@pytest.mark.parametrize("mode", HOSTS)
async def test_elicitation_by_the_downstream_is_answered_by_the_calling_host(
    tmp_path: Path, mode: str, downstream: str
) -> None:
    user = User()
    async with harness(tmp_path, fixture=ContentFixture(), mode=mode, downstream=downstream, elicitation=user) as h:
        assert_eras(h, mode, downstream)
        assert text_of(await h.call("fx__ask")) == "elicited: accept {'name': 'Ada'}"
        assert user.asked == ["What is your name?"]


@pytest.mark.parametrize("downstream", DOWNSTREAMS)
@pytest.mark.parametrize("mode", HOSTS)
async def test_a_host_that_cannot_sample_makes_the_downstream_call_fail(
    tmp_path: Path, mode: str, downstream: str
) -> None:
    async with harness(tmp_path, fixture=ContentFixture(), mode=mode, downstream=downstream) as h:
        error = error_of(await h.call("fx__sample", {"prompt": "write"}))
        assert error["class"] == "upstream_error"
        assert (await h.only_invocation()).status == "failed"


# -- the connector keeps subscriptions; the gateway hides disabled sources -----------------------------


@pytest.mark.parametrize("era", ["modern-streams", "legacy-streams"])
async def test_a_connector_subscribes_again_after_it_reconnects(era: str) -> None:
    fixture = ContentFixture()
    target = StreamTarget(fixture.server, legacy_only=era == "legacy-streams")
    connector = McpConnector(config(), target=target, backoff_initial=0.01, backoff_cap=0.05, probe_interval=0.05)
    changes = Changes()
    updated: list[str] = []
    heard = anyio.Event()

    async def on_updated(uri: str) -> None:
        updated.append(uri)
        heard.set()

    async with running(connector, changes):
        await changes.until(ready(connector))
        assert [r.uri for r in connector.resources()] == [README, "fixture://blob"]
        assert [p.name for p in connector.prompts()] == ["greet"]
        await connector.subscribe(README, on_updated)
        target.kill()
        await changes.until(down(connector))
        assert connector.resources() == [] and connector.prompts() == []
        target.revive()
        await changes.until(lambda: ready(connector)() and target.connections == 2)
        await fixture.touch(README)  # only a subscription made on the new connection hears this
        with anyio.fail_after(WAIT):
            await heard.wait()
        assert updated == [README]


async def test_a_disabled_sources_resources_and_prompts_are_not_exposed(tmp_path: Path) -> None:
    async with harness(tmp_path, fixture=ContentFixture(), disabled=["fx"]) as h:
        assert (await h.client.list_resources()).resources == []
        assert (await h.client.list_resource_templates()).resource_templates == []
        assert (await h.client.list_prompts()).prompts == []
        with pytest.raises(MCPError) as refused:
            await h.client.read_resource(README)
        assert refused.value.code == types.INVALID_PARAMS


# -- naming and routing (pure) -------------------------------------------------------------------------


def content(source_id: str, namespace: str | None = None, **listed: Any) -> SourceContent:
    return SourceContent(source_id, source_id if namespace is None else namespace, **listed)


def test_a_uri_listed_by_two_sources_belongs_to_the_first_in_source_id_order() -> None:
    shared = types.Resource(uri="x://shared", name="shared")
    catalog = ContentCatalog(
        [
            content("zeta", resources=[shared]),
            content("alpha", resources=[shared, types.Resource(uri="x://a", name="a")]),
        ]
    )
    assert [(r.name, r.uri) for r in catalog.resources] == [("alpha__shared", "x://shared"), ("alpha__a", "x://a")]
    assert catalog.route_uri("x://shared") == "alpha"
    assert any("x://shared" in w and "zeta" in w for w in catalog.warnings)


def test_a_uri_nobody_lists_goes_to_the_first_source_whose_template_matches() -> None:
    catalog = ContentCatalog(
        [
            content("b", templates=[types.ResourceTemplate(uri_template="files://{+path}", name="file")]),
            content("a", templates=[types.ResourceTemplate(uri_template="files://docs/{name}", name="doc")]),
            content("c", resources=[types.Resource(uri="files://docs/listed", name="listed")]),
        ]
    )
    assert catalog.route_uri("files://docs/readme") == "a"
    assert catalog.route_uri("files://src/main.py") == "b"
    assert catalog.route_uri("files://docs/listed") == "c"  # an exact listing wins over any template
    assert catalog.route_uri("other://x") is None
    assert catalog.route_reference("files://{+path}") == "b"
    assert [t.name for t in catalog.templates] == ["a__doc", "b__file"]


def test_prompt_names_are_namespaced_and_collisions_resolved_like_tools() -> None:
    greet = types.Prompt(name="greet")
    catalog = ContentCatalog([content("b", namespace="", prompts=[greet]), content("a", namespace="", prompts=[greet])])
    assert sorted(p.name for p in catalog.prompts) == ["a__greet", "b__greet"], "neither source takes the name"
    for source_id in ("a", "b"):
        entry = catalog.prompt(f"{source_id}__greet")
        assert entry is not None and (entry.source_id, entry.upstream_name) == (source_id, "greet")
    spaced = ContentCatalog([content("fx", prompts=[types.Prompt(name="say hi")])])
    assert [p.name for p in spaced.prompts] == ["fx__say_hi"]
    assert spaced.prompt("fx__say_hi") is not None


# -- which call a downstream message belongs to ---------------------------------------------------------


class EchoModel(Model):
    """Answers each sampling request with its own prompt, so a test can tell the answers apart."""

    async def __call__(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        await super().__call__(context, params)
        content = params.messages[0].content
        assert isinstance(content, types.TextContent)
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=f"re {content.text}"), model="echo"
        )


@pytest.mark.parametrize("mode", HOSTS)
async def test_concurrent_calls_each_get_their_own_answers_from_a_modern_downstream(tmp_path: Path, mode: str) -> None:
    model = EchoModel()
    results: dict[str, str] = {}
    async with harness(tmp_path, fixture=ContentFixture(), mode=mode, sampling=model) as h:

        async def call(prompt: str) -> None:
            results[prompt] = text_of(await h.call("fx__sample", {"prompt": prompt}))

        async with anyio.create_task_group() as tg:
            for prompt in ("one", "two", "three"):
                tg.start_soon(call, prompt)
    assert results == {p: f"sampled: re {p}" for p in ("one", "two", "three")}


class Recorder:
    """A relay that keeps what reaches it."""

    def __init__(self) -> None:
        self.logged: list[str] = []

    @property
    def log_level(self) -> types.LoggingLevel | None:
        return "debug"

    @property
    def answers(self) -> bool:
        return False

    @property
    def protocol_version(self) -> str:
        return types.LATEST_PROTOCOL_VERSION

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logged.append(str(params.data))

    async def sample(
        self, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        return types.ErrorData(code=types.INVALID_REQUEST, message="no")

    async def elicit(self, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        return types.ErrorData(code=types.INVALID_REQUEST, message="no")


async def test_a_message_read_outside_any_call_goes_to_the_most_recently_started_call() -> None:
    """The documented limit: a 2025-era downstream's log line names no call, so with several in
    flight the most recent one gets it; in the calling task itself the call is known exactly."""
    calls = InFlightCalls("fx")
    first, second = Recorder(), Recorder()
    released = anyio.Event()

    def line(text: str) -> types.LoggingMessageNotificationParams:
        return types.LoggingMessageNotificationParams(level="info", data=text)

    async def in_flight(relay: Recorder, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        with calls.calling(relay):
            await calls.log(line("from its own task"))
            task_status.started()
            await released.wait()

    await calls.log(line("nobody"))  # no call in flight: dropped
    async with anyio.create_task_group() as tg:
        await tg.start(in_flight, first)
        await calls.log(line("only one"))
        await tg.start(in_flight, second)
        await calls.log(line("ambiguous"))
        with calls.calling(None):
            await calls.log(line("a read made without a relay"))  # goes nowhere, not to a call in flight
        released.set()
    assert first.logged == ["from its own task", "only one"]
    assert second.logged == ["from its own task", "ambiguous"]
    context = ClientRequestContext(session=None, request_id=1)  # type: ignore[arg-type]
    no_call = await calls.sample(context, sample_params())  # refused: no call to ask for
    assert isinstance(no_call, types.ErrorData) and no_call.code == types.INVALID_REQUEST


def sample_params() -> types.CreateMessageRequestParams:
    message = types.SamplingMessage(role="user", content=types.TextContent(type="text", text="hi"))
    return types.CreateMessageRequestParams(messages=[message], max_tokens=5)


async def test_a_uri_nothing_lists_yet_is_subscribed_at_the_only_source_that_offers_resources(tmp_path: Path) -> None:
    fixture = ContentFixture()
    later = "later://created/1"  # no listing and no template names it: the server will create it later
    async with harness(tmp_path, fixture=fixture, mode="legacy", downstream="legacy-streams") as h:
        await legacy_request(h, types.SubscribeRequest(params=types.SubscribeRequestParams(uri=later)))
        assert later in fixture.subscribed


def test_a_uri_nothing_routes_is_refused_naming_the_candidates() -> None:
    relay = ContentRouter({}, timeout=1)
    with pytest.raises(NotFound, match="no source offers resources"):
        relay._route("later://created/1")
