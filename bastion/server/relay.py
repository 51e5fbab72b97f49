"""The host side of relaying: a downstream's log messages, sampling and elicitation
reach the host request that made the call, inside that request.

- 2025-era host: log messages are sent on the request's own channel (`related_request_id`), at or
  above the level the host set with `logging/setLevel` for its connection (`info` until it does);
  sampling and elicitation are server-to-client requests on that channel.
- 2026-07-28 host: there are no server-to-client requests, and a request opts into log messages
  with `io.modelcontextprotocol/logLevel` in its `_meta`. When the host declares sampling or
  elicitation, the call runs in the background (`ParkedCall`): a question from the downstream ends
  the host's request with an `InputRequiredResult`, and the host's retry brings the answer back to
  the waiting downstream (and waits for the result, or the next question). A host that declares
  neither gets an error answer for the downstream instead.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, get_args

import anyio
import anyio.abc
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.validation import wants_sampling_tools
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types import LOG_LEVEL_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from bastion.errors import BastionError, UnknownOutcome
from bastion.pipeline.approvals import AwaitingInput
from bastion.server.sdk import connection_of
from bastion.sources.seam import HostRequest, ProgressFn

logger = logging.getLogger(__name__)

LOG_LEVELS: Final[tuple[types.LoggingLevel, ...]] = get_args(types.LoggingLevel)
"""The MCP logging levels (syslog severities), least severe first."""

DEFAULT_LOG_LEVEL: Final[types.LoggingLevel] = "info"
"""What a 2025-era host hears before it sends `logging/setLevel`."""

LOG_LEVEL_STATE: Final = "bastion.log_level"
"""Where a 2025-era host connection's `logging/setLevel` level is kept (`Connection.state`)."""

PARKED_TTL: Final = 600.0
"""How long a finished background call waits for the host's retry to collect its result (the
lifetime of the sealed request_state)."""

STATE_VERSION: Final = 1

_R = TypeVar("_R", bound=types.Result)

CallFn = Callable[[HostRequest, ProgressFn | None], Awaitable[types.CallToolResult]]
"""Runs one tool call through the gateway with a relay and an optional progress callback."""


def host_log_level(ctx: ServerRequestContext[Any]) -> types.LoggingLevel | None:
    """The lowest level this host request wants; None when it wants no log messages."""
    modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
    return log_level_of(ctx.protocol_version, ctx.meta, None if modern else connection_of(ctx).state)


def log_level_of(
    protocol_version: str, meta: Mapping[str, Any] | None, connection_state: Mapping[str, Any] | None
) -> types.LoggingLevel | None:
    """The lowest level a host request wants: a 2026-07-28 request's own `_meta` opt-in, else what its 2025-era
    connection set with `logging/setLevel` (`info` until it does)."""
    if protocol_version in MODERN_PROTOCOL_VERSIONS:
        requested = (meta or {}).get(LOG_LEVEL_META_KEY)
        return next((level for level in LOG_LEVELS if level == requested), None)
    level: types.LoggingLevel = (connection_state or {}).get(LOG_LEVEL_STATE, DEFAULT_LOG_LEVEL)
    return level


def set_host_log_level(ctx: ServerRequestContext[Any], level: types.LoggingLevel) -> None:
    connection_of(ctx).state[LOG_LEVEL_STATE] = level


def relayable_meta(meta: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A downstream message's `_meta` without what only made sense between it and Bastion."""
    if not meta:
        return None
    kept = {k: v for k, v in meta.items() if not k.startswith("io.modelcontextprotocol/") and k != "progressToken"}
    return kept or None


def relayed_log(
    params: types.LoggingMessageNotificationParams, threshold: types.LoggingLevel | None
) -> types.LoggingMessageNotification | None:
    """The notification that relays a downstream's log message to a host wanting `threshold` and above; None when
    the host does not want it."""
    if threshold is None or LOG_LEVELS.index(params.level) < LOG_LEVELS.index(threshold):
        return None
    return types.LoggingMessageNotification(params=params.model_copy(update={"meta": relayable_meta(params.meta)}))


def sampling_question(
    params: types.CreateMessageRequestParams,
) -> tuple[types.CreateMessageRequest, type[types.CreateMessageResult | types.CreateMessageResultWithTools]]:
    """The request that relays a downstream's sampling to the host, and the result to expect of the host."""
    request = types.CreateMessageRequest(params=params.model_copy(update={"meta": relayable_meta(params.meta)}))
    if wants_sampling_tools(params.tools, params.tool_choice):
        return request, types.CreateMessageResultWithTools
    return request, types.CreateMessageResult


def elicitation_question(params: types.ElicitRequestParams) -> types.ElicitRequest:
    """The request that relays a downstream's elicitation to the host."""
    return types.ElicitRequest(params=params.model_copy(update={"meta": relayable_meta(params.meta)}))


async def _send_log(ctx: ServerRequestContext[Any], params: types.LoggingMessageNotificationParams) -> None:
    notification = relayed_log(params, host_log_level(ctx))
    if notification is None:
        return
    try:
        await ctx.session.send_notification(notification, related_request_id=ctx.request_id)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        logger.debug("a log message arrived after its host request ended")


class SdkHostRequest:
    """One host request as the destination of its call's downstream messages (satisfies `HostRequest`)."""

    def __init__(self, ctx: ServerRequestContext[Any], *, answer_timeout: float) -> None:
        """`answer_timeout` bounds the wait for the host's answer to a sampling or elicitation request."""
        self._ctx = ctx
        self._answer_timeout = answer_timeout

    @property
    def log_level(self) -> types.LoggingLevel | None:
        return host_log_level(self._ctx)

    @property
    def protocol_version(self) -> str:
        return self._ctx.protocol_version

    @property
    def answers(self) -> bool:
        """A 2025-era host that declares sampling or elicitation (a 2026-07-28 host is asked by a `ParkedCall`)."""
        return self._ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS and (
            _declares(self._ctx, "sampling") or _declares(self._ctx, "elicitation")
        )

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        await _send_log(self._ctx, params)

    async def sample(
        self, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        capabilities = self._ctx.session.client_capabilities
        if capabilities is None or capabilities.sampling is None:
            return _cannot("sampling", self._ctx)
        return await self._ask(*sampling_question(params))

    async def elicit(self, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        capabilities = self._ctx.session.client_capabilities
        if capabilities is None or capabilities.elicitation is None:
            return _cannot("elicitation", self._ctx)
        return await self._ask(elicitation_question(params), types.ElicitResult)

    async def _ask(
        self, request: types.CreateMessageRequest | types.ElicitRequest, result_type: type[_R]
    ) -> _R | types.ErrorData:
        ctx = self._ctx
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return _cannot(request.method, ctx)
        try:
            return await ctx.session.send_request(
                request,
                result_type,
                request_read_timeout_seconds=self._answer_timeout,
                metadata=ServerMessageMetadata(related_request_id=ctx.request_id),
            )
        except MCPError as exc:
            return exc.error
        except ValidationError as exc:
            return types.ErrorData(
                code=types.INTERNAL_ERROR, message=f"the host answered {request.method} badly: {exc}"
            )


def _cannot(what: str, ctx: ServerRequestContext[Any]) -> types.ErrorData:
    return cannot_answer(what, ctx.protocol_version)


def cannot_answer(what: str, protocol_version: str) -> types.ErrorData:
    """The downstream's answer when the host behind Bastion cannot answer its `what` (sampling, elicitation)."""
    return types.ErrorData(
        code=types.INVALID_REQUEST,
        message=f"the host behind Bastion (protocol {protocol_version}) cannot answer {what} during this call",
    )


@dataclass(eq=False)
class _Question:
    """A downstream's sampling or elicitation request, waiting for a 2026-07-28 host's answer."""

    request: types.CreateMessageRequest | types.ElicitRequest
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: types.InputResponse | None = None


class ParkedCall:
    """A 2026-07-28 host's call running in the background, so the downstream's questions can be asked
    in `InputRequiredResult`s and answered by the host's retries (satisfies `HostRequest`).

    Log messages and progress go to whichever host request currently waits for the call.
    """

    def __init__(self, ctx: ServerRequestContext[Any], *, tool: str, args_hash: str, answer_timeout: float) -> None:
        self.id = secrets.token_urlsafe(12)
        self._answer_timeout = answer_timeout
        self.tool = tool
        self.args_hash = args_hash
        self._ctx = ctx
        self._questions: dict[str, _Question] = {}
        self._asked = 0
        self._news = anyio.Event()
        self.done = anyio.Event()
        self.collected = anyio.Event()
        self.result: types.CallToolResult | None = None
        self.error: Exception | None = None

    @property
    def log_level(self) -> types.LoggingLevel | None:
        return host_log_level(self._ctx)

    @property
    def protocol_version(self) -> str:
        return self._ctx.protocol_version

    @property
    def answers(self) -> bool:
        return _declares(self._ctx, "sampling") or _declares(self._ctx, "elicitation")

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        await _send_log(self._ctx, params)

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        await self._ctx.session.report_progress(progress, total, message)

    async def sample(
        self, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        if not _declares(self._ctx, "sampling"):
            return _cannot("sampling", self._ctx)
        answer = await self._ask(types.CreateMessageRequest(params=params))
        if isinstance(answer, types.CreateMessageResult | types.CreateMessageResultWithTools):
            return answer
        return _unanswered("sampling/createMessage")

    async def elicit(self, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        if not _declares(self._ctx, "elicitation"):
            return _cannot("elicitation", self._ctx)
        answer = await self._ask(types.ElicitRequest(params=params))
        return answer if isinstance(answer, types.ElicitResult) else _unanswered("elicitation/create")

    async def _ask(self, request: types.CreateMessageRequest | types.ElicitRequest) -> types.InputResponse | None:
        """Wait for the host's answer to come with a retry; None when none came in time."""
        self._asked += 1
        key = f"bastion.relay/{self._asked}"
        question = self._questions[key] = _Question(request.model_copy(deep=True))
        self._wake()
        try:
            with anyio.move_on_after(self._answer_timeout):
                await question.answered.wait()
        finally:
            self._questions.pop(key, None)
        return question.answer

    def _wake(self) -> None:
        self._news.set()
        self._news = anyio.Event()

    def finish(self, result: types.CallToolResult | None, error: Exception | None) -> None:
        self.result, self.error = result, error
        self.done.set()
        self._wake()

    async def outcome(
        self, ctx: ServerRequestContext[Any], answers: types.InputResponses | None = None
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Serve one host request: take its answers, then wait for the result or the next questions."""
        self._ctx = ctx
        for key, answer in (answers or {}).items():
            question = self._questions.get(key)
            if question is not None and not question.answered.is_set():
                question.answer = answer
                question.answered.set()
        while True:
            news = self._news
            if self.done.is_set():
                self.collected.set()
                if self.error is not None:
                    raise self.error
                if self.result is None:
                    raise UnknownOutcome("Bastion stopped while this call ran; ask bastion__invocation for it")
                return self.result
            waiting: types.InputRequests = {k: q.request for k, q in self._questions.items() if not q.answered.is_set()}
            if waiting:
                state = json.dumps({"v": STATE_VERSION, "relay": self.id, "tool": self.tool, "args": self.args_hash})
                return types.InputRequiredResult(input_requests=waiting, request_state=state)
            await news.wait()


def _declares(ctx: ServerRequestContext[Any], capability: str) -> bool:
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and getattr(capabilities, capability) is not None


def _unanswered(method: str) -> types.ErrorData:
    return types.ErrorData(code=types.INVALID_REQUEST, message=f"the host did not answer {method}")


@dataclass
class Background:
    """The task group behind a server run (its lifespan state), where parked calls live."""

    tg: anyio.abc.TaskGroup


@asynccontextmanager
async def background(server: Server[Any]) -> AsyncIterator[Background]:
    """The host server's Server lifespan: entered once per HTTP manager, stdio run or SSE connection."""
    async with anyio.create_task_group() as tg:
        try:
            yield Background(tg)
        finally:
            tg.cancel_scope.cancel()


class HostRequests:
    """Chooses how one host request relays its call, and keeps the calls parked for 2026-07-28 hosts."""

    def __init__(self, *, answer_timeout: float) -> None:
        """`answer_timeout` bounds the wait for a host's answer to the downstream (the call timeout:
        the downstream call itself cannot outlast it)."""
        self._answer_timeout = answer_timeout
        self._parked: dict[str, ParkedCall] = {}

    async def run(
        self,
        ctx: ServerRequestContext[Any],
        call: CallFn,
        *,
        tool: str,
        args_hash: str,
        with_progress: bool,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Run `call` inline with a `SdkHostRequest`, or parked when only an `InputRequiredResult` can ask the host."""
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        if not modern or not (_declares(ctx, "sampling") or _declares(ctx, "elicitation")):
            relay = SdkHostRequest(ctx, answer_timeout=self._answer_timeout)

            async def report(progress: float, total: float | None, message: str | None) -> None:
                await ctx.session.report_progress(progress, total, message)

            return await call(relay, report if with_progress else None)
        if not isinstance(ctx.lifespan_context, Background):
            raise TypeError("the host server's Server must run with the `background` lifespan")
        parked = ParkedCall(ctx, tool=tool, args_hash=args_hash, answer_timeout=self._answer_timeout)
        self._parked[parked.id] = parked
        ctx.lifespan_context.tg.start_soon(self._run_parked, parked, call, with_progress, name=f"parked:{tool}")
        return await parked.outcome(ctx)

    def resumed(self, params: types.CallToolRequestParams, hashed_args: str) -> ParkedCall | None:
        """The parked call a retry continues; None when its request_state is not a relay's (inline approval)."""
        try:
            state = json.loads(params.request_state or "")
            call_id = state["relay"]
        except (ValueError, KeyError, TypeError):
            return None
        parked = self._parked.get(str(call_id))
        expected = (state.get("tool"), state.get("args"))
        if parked is None or not (parked.tool, parked.args_hash) == expected == (params.name, hashed_args):
            raise UnknownOutcome(
                "the call this retry continues is no longer held by this Bastion process; "
                "ask bastion__invocation for its outcome"
            )
        return parked

    async def _run_parked(self, parked: ParkedCall, call: CallFn, with_progress: bool) -> None:
        try:
            result = await call(parked, parked.progress if with_progress else None)
        except (BastionError, AwaitingInput) as exc:  # raised again in the host request that collects it
            parked.finish(None, exc)
        except Exception as exc:  # supervisor of a background task: the host still gets an answer
            logger.exception("a parked call of %s failed unexpectedly", parked.tool)
            parked.finish(None, BastionError(f"internal error: {exc}"))
        else:
            parked.finish(result, None)
        finally:
            if not parked.done.is_set():
                parked.finish(None, None)
        try:
            with anyio.move_on_after(PARKED_TTL):
                await parked.collected.wait()
        finally:
            self._parked.pop(parked.id, None)
