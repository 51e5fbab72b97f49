"""What every provider shares: its actions as code, and the source that serves them.

A provider action is a pydantic params model (its JSON Schema is the tool's input schema), a declared risk, a
description an agent can act on, an output model (its JSON Schema is the tool's output schema) and an execute
function over an `Api` (one call's view of the provider's `httpx2.AsyncClient`). `ProviderSource` satisfies
the pipeline's `ActionSource` structurally: one client per provider, opened by `run()` and reused by every call.

A provider whose credential is not bound is `unavailable`: it lists no actions and a call of one of its tools
is refused with `binding_required`. The credential lives only in the client's headers; whatever a call returns
or raises is scrubbed of it, so even an API that echoes it back cannot hand it to a host or the ledger.

What a call makes carries a mark keyed with the marker key the source is given (the ledger's, see
`evidence.py`); a look-up accepts only what carries that mark and fits the call itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import partial
from typing import Any, Final, Generic, Literal, TypeVar

import anyio
import httpx2
import mcp_types as types
from pydantic import BaseModel, ConfigDict, ValidationError

from bastion import __version__
from bastion.actions import ActionSpec, Found, Reconciliation
from bastion.config import ProviderConfig
from bastion.errors import BastionError, BindingRequired, ConnectorUnavailable, InvalidArguments, UpstreamError
from bastion.models import Invocation, Preview, Risk, SourceStatus
from bastion.sources.providers.api import Api, Rehearsed, without_marker_key
from bastion.sources.providers.evidence import Window
from bastion.sources.providers.rehearsal import request_preview
from bastion.sources.seam import ChangeFn, ProgressFn
from bastion.sources.secrets import scrub

logger = logging.getLogger(__name__)

USER_AGENT: Final = f"bastion/{__version__}"
CONNECT_TIMEOUT: Final = 10.0

CLOCK_SKEW: Final = timedelta(minutes=10)
"""A look-up accepts what was made this long before the invocation was recorded, or after its last update (the
API's clock may differ from ours)."""

LookUpFn = Callable[[Api, Mapping[str, Any], Window], Awaitable[Found | None]]
"""Find what one call made: (the call's view of the API, its arguments as the ledger kept them, when it can have
been made). The invocation id is `api.correlation_id`, its tag `api.tag`. What carries the call's mark but does
not prove the call made it comes back not accepted (`Found.reason`), see `evidence.py`."""

P = TypeVar("P", bound=BaseModel)
M = TypeVar("M", bound=BaseModel)


class Params(BaseModel):
    """Base of every action's params: unknown arguments are refused (`additionalProperties: false`); patterns are
    Python regular expressions, as the gateway's JSON Schema check reads them."""

    model_config = ConfigDict(extra="forbid", regex_engine="python-re")


class Output(BaseModel):
    """Base of every action's result: the compact shape an agent gets, ignoring what else the API sends."""

    model_config = ConfigDict(extra="ignore")


@dataclass(frozen=True)
class ProviderAction(Generic[P]):
    """One action of a provider, declared in code."""

    name: str
    title: str
    description: str
    risk: Risk
    """read: changes nothing; write: changes something a person can undo; danger: hard or impossible to undo."""
    params: type[P]
    output: type[Output]
    execute: Callable[[Api, P], Awaitable[Output]]
    idempotency_key: bool = False
    """The action is safe to repeat with the same correlation id (it sets a state, or the API takes the key)."""
    look_up: LookUpFn | None = None
    """How to find what a call made by its keyed mark (a marker, a derived id) when its outcome is unknown; None
    when the API offers no way."""

    @property
    def reconcile(self) -> Reconciliation:
        """`lookup` when the action has a `look_up`, else an unknown outcome is settled by hand."""
        return "lookup" if self.look_up is not None else "manual"

    def tool(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            title=self.title,
            description=self.description,
            input_schema=json_schema(self.params, "validation"),
            output_schema=json_schema(self.output, "serialization"),
            annotations=types.ToolAnnotations(
                title=self.title,
                read_only_hint=self.risk == "read",
                destructive_hint=self.risk == "danger",
                idempotent_hint=self.risk == "read" or self.idempotency_key,
                open_world_hint=True,
            ),
        )


@dataclass(frozen=True)
class ProviderDefinition:
    """One API Bastion has actions for: where it is, how a token is presented, and its actions."""

    kind: str
    default_base_url: str
    auth_headers: Callable[[str], dict[str, str]]
    """The headers that carry the token (and whatever else every request of this API needs)."""
    actions: Sequence[ProviderAction[Any]]
    by_name: dict[str, ProviderAction[Any]] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {action.name: action for action in self.actions})


def json_schema(model: type[BaseModel], mode: Literal["validation", "serialization"]) -> dict[str, Any]:
    """A model's JSON Schema without pydantic's generated `title`s (noise to an agent): of what it accepts
    (params) or of what it dumps (results, whose fields are read from the API's own names)."""
    schema: dict[str, Any] = _untitled(model.model_json_schema(mode=mode))
    return schema


def _untitled(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_untitled(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    kept: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            kept[key] = {name: _untitled(sub) for name, sub in value.items()}
        else:
            kept[key] = _untitled(value)
    return kept


def arguments_for(api: Api, model: type[M], arguments: Mapping[str, Any]) -> M:
    """The fields of `model` read from a call's arguments as the ledger kept them (redacted, maybe truncated: only
    what a look-up needs is read); InvalidArguments when they are not there."""
    try:
        return model.model_validate({k: v for k, v in arguments.items() if k in model.model_fields})
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(part) for part in problem["loc"]) or "(root)"
        raise InvalidArguments(
            f"{api.name}: the ledger's copy of the call's arguments lacks what a look-up needs ({where}: "
            f"{problem['msg']}); look for it yourself and settle it by hand with --outcome"
        ) from exc


class ProviderSource:
    """A provider's actions as a source of the catalog: ready as soon as its client is open (nothing to list)."""

    def __init__(
        self,
        provider_id: str,
        config: ProviderConfig,
        definition: ProviderDefinition,
        *,
        unbound: str | None = None,
        call_timeout: float = 30.0,
        marker_key: bytes | None = None,
        transport: httpx2.AsyncBaseTransport | None = None,
    ) -> None:
        """`unbound` says why the credential is not bound and how to bind it (then the provider is `unavailable`;
        a provider without a token always is); `marker_key` keys the marks of what its calls make (the ledger's
        `marker_key`: without it, an action that marks what it makes and every look-up are refused, before
        anything is sent); `transport` replaces the network (tests hand in an `httpx2.MockTransport`)."""
        self._id = provider_id
        self._marker_key = marker_key
        self._config = config
        self._definition = definition
        self._secret = config.token.get_secret_value() if config.token is not None else ""
        if unbound is None and not self._secret:
            unbound = f"provider {provider_id}: binding_required: its token is not set"
        self._unbound = unbound
        self._call_timeout = call_timeout
        self._transport = transport
        self._client: httpx2.AsyncClient | None = None
        self._status = SourceStatus(source_id=provider_id, state="starting", server_name=self.base_url)
        self._specs = [
            ActionSpec(
                tool=action.tool(),
                risk=action.risk,
                namespace=config.effective_namespace(provider_id),
                idempotency_key=action.idempotency_key,
                reconcile=action.reconcile,
                preview=None if action.risk == "read" else partial(self.preview, action.name),
            )
            for action in definition.actions
        ]

    @property
    def source_id(self) -> str:
        return self._id

    @property
    def kind(self) -> str:
        return self._definition.kind

    @property
    def base_url(self) -> str:
        return (self._config.base_url or self._definition.default_base_url).rstrip("/")

    @property
    def status(self) -> SourceStatus:
        return self._status

    @property
    def namespace(self) -> str:
        return self._config.effective_namespace(self._id)

    @property
    def organization(self) -> str | None:
        return self._config.organization

    def actions(self) -> list[ActionSpec]:
        """Every action while the client is open; none while unbound or stopped."""
        return list(self._specs) if self._client is not None else []

    def risk_of(self, action_id: str, definition: Mapping[str, Any]) -> Risk:
        """The declared risk (a provider's definitions come from Bastion's code); an action it no longer has is
        judged `danger`."""
        action = self._definition.by_name.get(action_id)
        return action.risk if action is not None else "danger"

    async def run(self, on_change: ChangeFn) -> None:
        """Open the provider's one client and keep it until cancelled; an unbound provider stays unavailable."""
        if self._unbound is not None:
            self._status = SourceStatus(
                source_id=self._id, state="unavailable", last_error=self._unbound, server_name=self.base_url
            )
            await on_change(self._id)
            await anyio.sleep_forever()
        headers = {"User-Agent": USER_AGENT, **self._definition.auth_headers(self._secret)}
        client = httpx2.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx2.Timeout(self._call_timeout, connect=min(CONNECT_TIMEOUT, self._call_timeout)),
            follow_redirects=True,  # httpx drops the Authorization header on a redirect to another origin
            transport=self._transport,
        )
        async with client:
            self._client = client
            self._status = SourceStatus(
                source_id=self._id, state="ready", tools=len(self._specs), server_name=self.base_url
            )
            try:
                await on_change(self._id)
                await anyio.sleep_forever()
            finally:
                self._client = None
                self._status = SourceStatus(source_id=self._id, state="down", last_error="stopped")

    async def call(
        self,
        action_id: str,
        arguments: dict[str, Any],
        *,
        correlation_id: str,
        timeout: float,
        on_progress: ProgressFn | None = None,
        relay: object | None = None,
    ) -> types.CallToolResult:
        """Run one action within `timeout`; the errors are those of `ActionSource.call` (see `api.py`)."""
        name = f"{self._id}:{action_id}"
        if self._unbound is not None:
            raise BindingRequired(f"{name} cannot run: {self._unbound}")
        client = self._client
        if client is None:
            raise ConnectorUnavailable(f"provider {self._id} is not running")
        action = self._definition.by_name.get(action_id)
        if action is None:  # the catalog is built from this provider's own specs: a bug of ours
            raise ConnectorUnavailable(f"provider {self._id} has no action {action_id!r}; nothing was sent")
        try:
            params = action.params.model_validate(arguments)
        except ValidationError as exc:  # the gateway checked the same schema: only a bug of ours gets here
            raise UpstreamError(f"{name}: the arguments do not fit the action ({exc.errors()[0]['msg']})") from exc
        api = Api(client, name=name, correlation_id=correlation_id, marker_key=self._marker_key)
        try:
            output: Output | None = None
            with anyio.move_on_after(timeout):
                output = await action.execute(api, params)
            if output is None:
                raise api.lost(TimeoutError(f"no answer within {timeout:g} s"))
        except BastionError as exc:
            exc.message = scrub(exc.message, self._secret)
            exc.args = (exc.message,)
            raise
        structured = scrub(output.model_dump(mode="json"), self._secret)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(structured, ensure_ascii=False))],
            structured_content=structured,
        )

    async def preview(self, action_id: str, invocation: Invocation, arguments: dict[str, Any]) -> Preview:
        """The request a call of `action_id` would send (its preview): the action's own code run in a rehearsal, which
        sends what changes nothing (reads it needs first) and stops, unsent, at the first request that would change
        something. The errors of `call`, for what it could not read."""
        name = f"{self._id}:{action_id}"
        if self._unbound is not None:
            raise BindingRequired(f"{name} cannot be previewed: {self._unbound}")
        client = self._client
        action = self._definition.by_name.get(action_id)
        if client is None or action is None:
            raise ConnectorUnavailable(f"provider {self._id} is not running, or has no action {action_id!r}")
        try:
            params = action.params.model_validate(arguments)
        except ValidationError as exc:
            raise InvalidArguments(f"{name}: the arguments do not fit the action ({exc.errors()[0]['msg']})") from exc
        api = Api(client, name=name, correlation_id=invocation.id, marker_key=self._marker_key, rehearsal=True)
        try:
            await action.execute(api, params)
        except Rehearsed as reached:
            return request_preview(name, reached.request, self._secret)
        except BastionError as exc:
            exc.message = scrub(exc.message, self._secret)
            exc.args = (exc.message,)
            raise
        return Preview(kind="request", summary=f"{name} would send no request that changes anything")

    async def look_up(self, action_id: str, invocation: Invocation) -> Found | None:
        """Ask the API what came of `invocation` (see `LookupSource` in bastion.sources.seam): the action's
        `look_up` over the invocation's window, within the call timeout, its answer scrubbed of the token. Reads
        only."""
        name = f"{self._id}:{action_id}"
        action = self._definition.by_name.get(action_id)
        if action is None or action.look_up is None:
            raise InvalidArguments(
                f"{name} cannot be looked up: its API offers no way to find a call; settle it by hand with --outcome"
            )
        if self._unbound is not None:
            raise BindingRequired(f"{name} cannot be looked up: {self._unbound}")
        client = self._client
        if client is None:
            raise ConnectorUnavailable(f"provider {self._id} is not running; nothing was asked")
        if self._marker_key is None:
            raise without_marker_key(name)
        api = Api(client, name=name, correlation_id=invocation.id, marker_key=self._marker_key)
        arguments = invocation.args if isinstance(invocation.args, Mapping) else {}
        window = Window.of(
            invocation.created_at, invocation.updated_at, call_timeout=self._call_timeout, skew=CLOCK_SKEW
        )
        try:
            with anyio.fail_after(self._call_timeout):
                found = await action.look_up(api, arguments, window)
        except TimeoutError as exc:
            wait = f"{self._call_timeout:g} s"
            raise UpstreamError(f"{name}: the look-up got no answer within {wait}; it changed nothing, retry") from exc
        except BastionError as exc:
            exc.message = scrub(exc.message, self._secret)
            exc.args = (exc.message,)
            raise
        if found is None:
            return None
        secret = self._secret
        return replace(
            found,
            where=scrub(found.where, secret),
            result=scrub(found.result, secret),
            creator=scrub(found.creator, secret),
            created_at=scrub(found.created_at, secret),
            reason=scrub(found.reason, secret),
        )
