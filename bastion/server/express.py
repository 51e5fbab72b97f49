"""The express lane: a host's `tools/call` answered without the SDK's server models.

Through the SDK's server a call is parsed into a message model, dumped back to a dict, its params validated twice,
wrapped in middleware and a per-request session, and its result modelled, dumped, validated for the protocol
version and dumped again. For the common call (allowed by policy) that is most of what a call costs Bastion. The
express lane takes such a call as the JSON it came as, runs it through the same gateway pipeline
(`Gateway.call_express`: the same policy, drift guard, limits, records and observers), and writes the result as the
downstream sent it, shaped for the host's protocol version as the SDK's server shapes it. The answer leaves before
the call's outcome is recorded (the recording then overlaps the host's reading of it; a Bastion killed in between
leaves the call `executing`, and the restart marks it `unknown`). What the downstream logs, reports or asks
meanwhile reaches the host on the request's own stream, as through the SDK's server.

It takes a call only when it can serve it as the SDK's server would, and leaves every other message to that server
untouched. It takes `tools/call` requests that:

- have only `name`, `arguments` and `_meta` params, and pass the SDK's own check of them for the protocol version;
- come on a connection the SDK has set up: an initialized 2025-era connection, or a 2026-07-28 request whose
  envelope passes the SDK's own ladder (`classify_inbound_request`);
- at 2026-07-28, come from a host that declares neither sampling nor elicitation (it is asked in an
  `InputRequiredResult` by a parked call, which only the SDK's server serves);
- name a listed tool, while no tracer records the SDK's spans (with one, every call keeps its SDK spans).

A call that turns out to wait for an approver is handed back (`NotExpress`) before anything is recorded or sent, and
the SDK's server serves it as any other. Refusals are the same tool results the SDK path gives. The transports
(`express_stdio`, `express_http`) offer it their requests first.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

import anyio
import mcp_types as types
import orjson
from mcp.server.connection import Connection
from mcp.shared.inbound import InboundLadderRejection, classify_inbound_request
from mcp_types import PROTOCOL_VERSION_META_KEY, SERVER_INFO_META_KEY, methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry import trace
from pydantic import BaseModel, ValidationError

from bastion import tracing
from bastion.actions import WireResult
from bastion.errors import BastionError
from bastion.jsontext import loads
from bastion.models import CallContext
from bastion.pipeline.calls import NotExpress
from bastion.server.errors import tool_result
from bastion.server.mcp import HostServer
from bastion.server.relay import cannot_answer, elicitation_question, log_level_of, relayed_log, sampling_question

logger = logging.getLogger(__name__)

_PARAMS: Final = frozenset({"name", "arguments", "_meta"})
_MESSAGE: Final = frozenset({"jsonrpc", "id", "method", "params"})
QUESTION_ID_PREFIX: Final = "bastion-q-"

_R = TypeVar("_R", bound=BaseModel)


class HostStream(Protocol):
    """The stream an express call's own messages reach its host on (the request's SSE response, or stdout)."""

    async def send(self, message: dict[str, Any]) -> None:
        """Send one JSON-RPC message (a notification, or a request of `HostQuestions`) to the host."""
        ...


Respond = Callable[[dict[str, Any]], Awaitable[None]]
"""Sends an express call's JSON-RPC response to its host (the lane's last word on that call)."""


@dataclass(frozen=True, slots=True)
class ExpressCall:
    """A `tools/call` the express lane takes: what it asks and what the answer must be shaped for."""

    id: types.RequestId
    name: str
    arguments: dict[str, Any]
    meta: Mapping[str, Any]
    protocol_version: str
    capabilities: types.ClientCapabilities | None
    """What a 2025-era host declared (None at 2026-07-28: the lane takes only hosts that cannot be asked)."""
    connection_state: Mapping[str, Any] | None
    """The 2025-era connection's state (the log level it set); None at 2026-07-28."""

    @property
    def modern(self) -> bool:
        return self.protocol_version in MODERN_PROTOCOL_VERSIONS

    @property
    def progress_token(self) -> types.ProgressToken | None:
        token = self.meta.get("progressToken")
        return token if isinstance(token, str | int) and not isinstance(token, bool) else None


def read_message(raw: bytes) -> dict[str, Any] | None:
    """A host's message as the lane reads it: a JSON object, or None for anything else (the SDK's server then
    answers what it makes of it)."""
    try:
        message = loads(raw)
    except (ValueError, RecursionError):  # not JSON, or nested beyond every parser's depth
        return None
    return message if isinstance(message, dict) else None


def is_request(message: Any) -> bool:
    """Whether a parsed JSON-RPC message is a request the SDK would take as one."""
    return (
        isinstance(message, dict)
        and message.get("jsonrpc") == "2.0"
        and isinstance(message.get("method"), str)
        and isinstance(message.get("id"), int | str)
        and not isinstance(message.get("id"), bool)
    )


def is_response(message: Any) -> bool:
    """Whether a parsed JSON-RPC message answers a request (a result or an error, no method)."""
    return isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message)


def opens_modern(message: Mapping[str, Any]) -> bool:
    """Whether a connection's first request opens it in the 2026-07-28 era (the SDK's rule: not `initialize`,
    and the version key of the per-request envelope)."""
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    return message.get("method") != "initialize" and isinstance(meta, dict) and PROTOCOL_VERSION_META_KEY in meta


def express_call(
    message: Mapping[str, Any],
    *,
    modern: bool,
    connection: Connection | None,
    headers: Mapping[str, str] | None = None,
) -> ExpressCall | None:
    """The call `message` asks for, if the express lane may answer it (see the module docstring); else None.

    `modern`: the connection serves 2026-07-28 requests (each carries its envelope); otherwise `connection` is the
    SDK's 2025-era connection it arrives on. `headers`: the HTTP request's, checked against the envelope."""
    if message.get("method") != "tools/call" or not is_request(message) or not _MESSAGE.issuperset(message):
        return None
    params = message.get("params")
    if not isinstance(params, dict) or not _PARAMS.issuperset(params) or not isinstance(params.get("name"), str):
        return None
    arguments = params.get("arguments")
    meta = params.get("_meta")
    if (arguments is not None and not isinstance(arguments, dict)) or (meta is not None and not isinstance(meta, dict)):
        return None
    meta = meta or {}
    if _recording_spans():
        return None
    capabilities: types.ClientCapabilities | None = None
    state: Mapping[str, Any] | None = None
    if modern:
        route = classify_inbound_request(message, headers=headers)
        if isinstance(route, InboundLadderRejection) or not isinstance(route.client_capabilities, dict):
            return None
        if any(route.client_capabilities.get(key) is not None for key in ("sampling", "elicitation")):
            return None
        version = route.protocol_version
    else:
        if connection is None or not connection.initialize_accepted or PROTOCOL_VERSION_META_KEY in meta:
            return None
        version, capabilities, state = connection.protocol_version, connection.client_capabilities, connection.state
    if not _valid_params(version, params):
        return None
    return ExpressCall(message["id"], params["name"], arguments or {}, meta, version, capabilities, state)


_VALID_PARAMS: dict[bytes, bool] = {}
"""The SDK's verdicts on the params of recent calls, their arguments aside (see `_valid_params`)."""
_VALID_PARAMS_KEPT: Final = 1024


def _valid_params(version: str, params: Mapping[str, Any]) -> bool:
    """The SDK's own check of a call's params for the protocol version (`validate_client_request`).

    Its verdict does not depend on what the arguments hold (they are `dict[str, Any]`, and a JSON object's keys are
    strings), so it is asked once for the params with their arguments emptied, and kept for the calls that send
    the same name and `_meta` again: the same check, not asked again of what it has already judged."""
    judged = {key: ({} if key == "arguments" and value is not None else value) for key, value in params.items()}
    try:
        key: bytes | None = version.encode() + b"\n" + orjson.dumps(judged)
    except TypeError:  # not JSON orjson writes (an integer beyond 64 bits in _meta): judged, not kept
        key = None
    if key is not None and b"null" in key:  # orjson writes NaN and infinities as null too: judged, not kept
        key = None
    verdict = _VALID_PARAMS.get(key) if key is not None else None
    if verdict is None:
        try:
            methods.validate_client_request("tools/call", version, judged)
            verdict = True
        except (KeyError, ValueError):  # a ValidationError, or a version the SDK's checks do not know
            verdict = False
        if key is not None:
            if len(_VALID_PARAMS) >= _VALID_PARAMS_KEPT:
                _VALID_PARAMS.clear()
            _VALID_PARAMS[key] = verdict
    return verdict


def _recording_spans() -> bool:
    """Whether spans are recorded: Bastion's, or the SDK's through a global tracer provider."""
    provider = trace.get_tracer_provider()
    return tracing.recording() or not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


class HostQuestions:
    """The requests express calls send their hosts (a downstream's sampling and elicitation), under ids of their own
    (`bastion-q-<n>`), and the answers that come back as responses (`answered`)."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._waiting: dict[str, tuple[anyio.Event, list[dict[str, Any]]]] = {}

    async def ask(self, outlet: HostStream, method: str, params: dict[str, Any], *, timeout: float) -> dict[str, Any]:
        """Send the request and wait (at most `timeout` seconds, TimeoutError) for the host's response message."""
        request_id = f"{QUESTION_ID_PREFIX}{next(self._ids)}"
        answered, answers = self._waiting[request_id] = (anyio.Event(), [])
        try:
            await outlet.send({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            with anyio.fail_after(timeout):
                await answered.wait()
        finally:
            del self._waiting[request_id]
        return answers[0]

    def answered(self, message: Mapping[str, Any]) -> bool:
        """Take a response if it answers one of the questions waiting here."""
        request_id = message.get("id")
        waiting = self._waiting.get(request_id) if isinstance(request_id, str) else None
        if waiting is None or waiting[0].is_set():
            return False
        waiting[1].append(dict(message))
        waiting[0].set()
        return True


class ExpressHostRequest:
    """Where the downstream's messages go during an express call (satisfies the pipeline's `HostRequest`), as
    `SdkHostRequest` sends them through the SDK's session: log messages and questions on the request's stream."""

    def __init__(
        self, call: ExpressCall, outlet: HostStream, questions: HostQuestions, *, answer_timeout: float
    ) -> None:
        self._call = call
        self._outlet = outlet
        self._questions = questions
        self._answer_timeout = answer_timeout

    @property
    def log_level(self) -> types.LoggingLevel | None:
        return log_level_of(self._call.protocol_version, self._call.meta, self._call.connection_state)

    @property
    def protocol_version(self) -> str:
        return self._call.protocol_version

    @property
    def answers(self) -> bool:
        capabilities = self._call.capabilities
        return capabilities is not None and (capabilities.sampling is not None or capabilities.elicitation is not None)

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        notification = relayed_log(params, self.log_level)
        if notification is not None:
            await self._send(notification)

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Relay the call's progress under the host's own token (only called when the request carried one)."""
        params = types.ProgressNotificationParams(
            progress_token=self._call.progress_token or "", progress=progress, total=total, message=message
        )
        await self._send(types.ProgressNotification(params=params))

    async def sample(
        self, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        if self._call.capabilities is None or self._call.capabilities.sampling is None:
            return cannot_answer("sampling", self._call.protocol_version)
        return await self._ask(*sampling_question(params))

    async def elicit(self, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        if self._call.capabilities is None or self._call.capabilities.elicitation is None:
            return cannot_answer("elicitation", self._call.protocol_version)
        return await self._ask(elicitation_question(params), types.ElicitResult)

    async def _ask(
        self, request: types.CreateMessageRequest | types.ElicitRequest, result_type: type[_R]
    ) -> _R | types.ErrorData:
        dumped = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        try:
            answer = await self._questions.ask(
                self._outlet, dumped["method"], dumped.get("params") or {}, timeout=self._answer_timeout
            )
        except TimeoutError:
            return types.ErrorData(code=types.REQUEST_TIMEOUT, message=f"the host did not answer {request.method}")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return types.ErrorData(code=types.CONNECTION_CLOSED, message="the host's connection closed")
        if "error" in answer:
            try:
                return types.ErrorData.model_validate(answer["error"])
            except ValidationError:
                return types.ErrorData(code=types.INTERNAL_ERROR, message=f"the host answered {request.method} badly")
        try:
            return result_type.model_validate(answer.get("result"), by_name=False)
        except ValidationError as exc:
            return types.ErrorData(
                code=types.INTERNAL_ERROR, message=f"the host answered {request.method} badly: {exc}"
            )

    async def _send(self, notification: types.ServerNotification) -> None:
        dumped = notification.model_dump(by_alias=True, mode="json", exclude_none=True)
        try:
            await self._outlet.send({"jsonrpc": "2.0", **dumped})
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            logger.debug("a %s arrived after its host request ended", dumped["method"])


@dataclass
class ExpressCounts:
    """How many calls an express lane answered, and how many it handed back to the SDK's server (`/metrics`)."""

    answered: int = 0
    handed_back: int = 0


class ExpressLane:
    """Answers express calls through one host server's gateway."""

    def __init__(self, front: HostServer, counts: ExpressCounts | None = None) -> None:
        self.front = front
        self.counts = counts if counts is not None else ExpressCounts()
        self.questions = HostQuestions()
        self._answer_timeout = front.gateway.config.settings.limits.call_timeout_seconds
        self._server_info = front.server.server_info_stamp
        """Bastion's `serverInfo` stamp on 2026-07-28 results (the SDK's server copies it for each result; here each
        result is serialized at once, so one copy serves all)."""

    def knows(self, call: ExpressCall) -> bool:
        """Whether the call names a tool in the catalog (the SDK's server waits for a source still starting)."""
        return self.front.gateway.catalog.get(call.name) is not None

    async def answer(self, call: ExpressCall, context: CallContext, outlet: HostStream, respond: Respond) -> bool:
        """Answer `call`: its JSON-RPC response goes to `respond` (before the call's outcome is recorded, for a call
        that ran), what the downstream logs, reports or asks meanwhile to `outlet`. False when the call is handed
        back to the SDK's server, nothing recorded or sent."""
        front = self.front
        relay = ExpressHostRequest(call, outlet, self.questions, answer_timeout=self._answer_timeout)
        responded = False

        async def deliver(result: WireResult) -> None:
            nonlocal responded
            responded = True
            await respond(self._response(call, result))

        with front.answering(), tracing.continuing(call.meta):
            try:
                await front.gateway.call_express(
                    call.name,
                    call.arguments,
                    context,
                    deliver,
                    relay=relay,
                    on_progress=relay.progress if call.progress_token is not None else None,
                )
            except NotExpress:
                self.counts.handed_back += 1
                return False
            except BastionError as exc:
                if responded:  # raised by `respond` itself
                    raise
                await respond(self._refusal(call, exc))
            except Exception as exc:  # the MCP boundary translator: a bug must still answer the host
                if responded:
                    raise
                logger.exception("tools/call %s failed unexpectedly", call.name)
                await respond(self._refusal(call, BastionError(f"internal error: {exc}")))
        self.counts.answered += 1
        return True

    def _refusal(self, call: ExpressCall, error: BastionError) -> dict[str, Any]:
        """The response to a call refused or failed with `error`: the tool result the SDK path gives."""
        version = call.protocol_version
        refusal = tool_result(error, version=version, output_schema=self.front.declares_output(call.name))
        return self._response(call, WireResult(refusal, checked_at=version))

    def _response(self, call: ExpressCall, result: WireResult) -> dict[str, Any]:
        """The JSON-RPC response: the result shaped for the host's version (the gateway shaped a call's result before
        recording its outcome, so this finds it done), and at 2026-07-28 Bastion's `serverInfo` stamp, as the SDK's
        server stamps it."""
        shaped = result.for_host(call.protocol_version).data
        if call.modern:
            meta = shaped.get("_meta")
            if meta is None or (isinstance(meta, dict) and meta.get(SERVER_INFO_META_KEY) is None):
                # a copy: the ledger's record keeps the result as sent
                shaped = {**shaped, "_meta": {**(meta or {}), SERVER_INFO_META_KEY: self._server_info}}
        return {"jsonrpc": "2.0", "id": call.id, "result": shaped}
