"""Tool calls Bastion writes to a stdio connector's process itself, and their answers picked out of its output.

The SDK's client models each request and each answer: it builds a request model, dumps it, parses the answer line
into a message model, validates the result once for the protocol version and once more into a `CallToolResult`.
For a call whose result Bastion forwards as it came (the express lane) that is most of the CPU a call
costs Bastion. `WireCalls` sends such a call as one JSON line under an id of its own (`bastion-<n>`, never one of
the SDK client's integer ids), and the reader of the process's stdout offers it every line first (`claims`): the
answer to one of its calls is taken, anything else goes on to the SDK's session. Everything else on the connection
(the handshake, listings, notifications, the downstream's own requests, calls with progress) stays the SDK's.

A 2026-07-28 downstream needs the per-request `_meta` envelope (protocol version, client info, capabilities): it is
the one the SDK's client stamps on its own requests, read off them as they are written (`noticed`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

import anyio
import mcp_types as types
from mcp_types import CLIENT_CAPABILITIES_META_KEY, CLIENT_INFO_META_KEY, PROTOCOL_VERSION_META_KEY, methods
from mcp_types.version import KNOWN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter
from referencing.exceptions import Unresolvable

from bastion.jsontext import dumps, loads
from bastion.schemas import SchemaCheck

logger = logging.getLogger(__name__)

ID_PREFIX: Final = "bastion-"
_ID_MARK: Final = b'"bastion-'
_LEADING_ID: Final = re.compile(rb'\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*"(bastion-\d+)"')
"""The id of a JSON-RPC answer whose first members are `jsonrpc` and `id` (or `id`), found without parsing it."""
_ENVELOPE_KEYS: Final = (PROTOCOL_VERSION_META_KEY, CLIENT_INFO_META_KEY, CLIENT_CAPABILITIES_META_KEY)
_CANCEL_TIMEOUT: Final = 1.0
_LOG_MARK: Final = b'"notifications/message"'
_LOGS_TIMEOUT: Final = 1.0
"""The longest an answered call waits for the log messages read before its answer to reach their host."""

PROTOCOL_META_PREFIX: Final = "io.modelcontextprotocol/"
"""Protocol-internal `_meta` keys of the downstream, stripped from forwarded results. On 2026-07-28 a downstream
stamps its own identity there (`io.modelcontextprotocol/serverInfo`), and the SDK's server keeps a stamp the
handler's result already carries: forwarded as is, the result would name the downstream instead of Bastion."""

SendFn = Callable[[bytes], Awaitable[None]]
_Result = TypeVar("_Result", bound=types.Result)


class WireClosed(Exception):
    """The connection ended (or was never open) before the call was answered."""


class WireUnreadable(Exception):
    """The downstream answered the call with a line that is not JSON that can be read."""


class WireError(Exception):
    """The downstream answered the call with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class _Call:
    __slots__ = ("answered", "closed", "error", "expired", "logs_before", "result", "unreadable")

    def __init__(self) -> None:
        self.answered = asyncio.Event()  # the loop's own: anyio's wraps it in a per-call object more
        self.result: dict[str, Any] | None = None
        self.error: WireError | None = None
        self.closed = False
        self.unreadable = False
        self.expired = False
        self.logs_before = 0
        """How many log messages the process wrote before this call's answer (see `WireCalls.heard_log`)."""

    def expire(self) -> None:
        """Its timeout came before its answer (a timer of the loop calls this)."""
        if not self.answered.is_set():
            self.expired = True
            self.answered.set()


class WireCalls:
    """The calls written to one connection of a connector's process, waiting for their answers."""

    def __init__(self) -> None:
        self._send: SendFn | None = None
        self._calls: dict[str, _Call] = {}
        self._ids = itertools.count(1)
        self.envelope: dict[str, Any] | None = None
        """The 2026-07-28 `_meta` envelope of the SDK client's requests on this connection (None until one is seen,
        and on a 2025-era connection)."""
        self._logs_passed = 0
        self._logs_heard = 0
        self._log_heard = asyncio.Event()

    @property
    def open(self) -> bool:
        return self._send is not None

    def attach(self, send: SendFn) -> None:
        """Start writing calls with `send` (one line to the process's stdin)."""
        self._send = send

    def close(self) -> None:
        """The connection ended: every call waiting for an answer fails with WireClosed, and so do new ones."""
        self._send = None
        for call in self._calls.values():
            call.closed = True
            call.answered.set()

    def noticed(self, message: types.JSONRPCMessage) -> None:
        """Keep the envelope of an SDK client request about to be written (2026-07-28 connections)."""
        if self.envelope is not None or not isinstance(message, types.JSONRPCRequest) or not message.params:
            return
        meta = message.params.get("_meta")
        if isinstance(meta, dict) and PROTOCOL_VERSION_META_KEY in meta:
            self.envelope = {key: meta[key] for key in _ENVELOPE_KEYS if key in meta}

    def claims(self, line: bytes) -> bool:
        """Take `line` if it answers one of the calls waiting here; False leaves it to the SDK's session."""
        if not self._calls or _ID_MARK not in line:
            return self._passed(line)
        try:
            message = loads(line)
        except (ValueError, RecursionError):  # e.g. nested beyond every parser's depth
            return self._unreadable(line) or self._passed(line)
        request_id = message.get("id") if isinstance(message, dict) else None
        call = self._calls.get(request_id) if isinstance(request_id, str) else None
        if call is None or call.answered.is_set():
            return self._passed(line)
        result, error = message.get("result"), message.get("error")
        if isinstance(result, dict):
            call.result = result
        elif isinstance(error, dict):
            code, text = error.get("code"), error.get("message")
            call.error = WireError(code if isinstance(code, int) else 0, str(text), error.get("data"))
        else:
            return self._passed(line)
        call.logs_before = self._logs_passed
        call.answered.set()
        return True

    def _passed(self, line: bytes) -> bool:
        """Leave `line` to the SDK's session (False), counting it if it is a log message."""
        if _LOG_MARK in line:
            self._logs_passed += 1
        return False

    def heard_log(self) -> None:
        """The SDK's session has handed one log message of the process to its host (the connector's logging callback).

        A log message the process writes during a call, before the call's answer, goes to the SDK's session, which
        relays it to the call's host; the answer is taken here at once. So that the host hears the message before
        the answer (and while the call is still in flight, which is how the message finds its host), an answered
        call waits until the session has relayed the log messages written before its answer."""
        self._logs_heard += 1
        self._log_heard.set()
        self._log_heard = asyncio.Event()

    async def _logs_relayed(self, call: _Call) -> None:
        """Wait (at most `_LOGS_TIMEOUT`) until the log messages written before `call`'s answer were relayed; after
        that, count any the session dropped as relayed, so no later call waits for them."""
        if self._logs_heard >= call.logs_before:
            return
        with anyio.move_on_after(_LOGS_TIMEOUT):
            while self._logs_heard < call.logs_before:
                await self._log_heard.wait()
        self._logs_heard = max(self._logs_heard, call.logs_before)

    def _unreadable(self, line: bytes) -> bool:
        """Take an answer that does not parse, when it opens with one of the ids waiting here: its call learns at
        once that it was answered unreadably (the SDK's session would drop the line, and the call wait until its
        timeout)."""
        found = _LEADING_ID.match(line)
        call = self._calls.get(found.group(1).decode()) if found else None
        if call is None or call.answered.is_set():
            return False
        call.unreadable = True
        call.answered.set()
        return True

    async def request(self, method: str, params: Mapping[str, Any], *, timeout: float) -> dict[str, Any]:
        """Send one request and wait (at most `timeout` seconds, TimeoutError) for its result.

        Raises WireError for an error answer and WireClosed when the connection ends first. A call given up (timed
        out or cancelled) after it was sent is cancelled at the downstream with `notifications/cancelled`, as the
        SDK's client does."""
        send = self._send
        if send is None:
            raise WireClosed("the connection is not open")
        request_id = f"{ID_PREFIX}{next(self._ids)}"
        call = self._calls[request_id] = _Call()
        try:
            try:
                await send(dumps({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}) + b"\n")
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
                raise WireClosed("the process's stdin is closed") from exc
            # The timeout is a timer of the loop that ends the wait, not a deadline scope around it: a scope with a
            # deadline costs several times the wait itself, on every call.
            timer = asyncio.get_running_loop().call_later(timeout, call.expire)
            try:
                await call.answered.wait()
            except BaseException:
                await self._cancel_shielded(request_id)
                raise
            finally:
                timer.cancel()
            if call.expired:
                await self._cancel_shielded(request_id)
                raise TimeoutError(f"no answer within {timeout:g}s")
            await self._logs_relayed(call)
        finally:
            del self._calls[request_id]
        if call.closed:
            raise WireClosed("the connection closed before the call was answered")
        if call.unreadable:
            raise WireUnreadable("the answer could not be parsed as JSON")
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result

    async def _cancel_shielded(self, request_id: str) -> None:
        with anyio.CancelScope(shield=True), anyio.move_on_after(_CANCEL_TIMEOUT):
            await self._cancel(request_id)

    async def _cancel(self, request_id: str) -> None:
        send = self._send
        if send is None:
            return
        cancelled = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": request_id}}
        try:
            await send(dumps(cancelled) + b"\n")
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            logger.debug("the cancellation of %s could not be sent: the connection is gone", request_id)


class ResultChecks:
    """What the SDK's client checks of a `tools/call` result, done on the JSON the downstream sent: its shape for the
    connection's protocol version, then the tool's own output schema (compiled once per schema)."""

    def __init__(self) -> None:
        self._schemas: dict[str, SchemaCheck] = {}
        self._surfaces: dict[str, TypeAdapter[Any]] = {}

    def checked(self, tool: types.Tool | None, raw: dict[str, Any], version: str) -> dict[str, Any]:
        """The result without its protocol `_meta` keys. Raises ValidationError for a result off its protocol
        version's shape, and OutputSchemaError for structured content off the tool's output schema."""
        try:
            surface = self._surface(version)
        except KeyError:  # a version the SDK has no result surface for: the model checks it
            types.CallToolResult.model_validate(raw, by_name=False)
        else:
            surface.validate_python(raw, by_name=False)
        schema = tool.output_schema if tool is not None else None
        if tool is not None and schema is not None and raw.get("isError") is not True:
            if "structuredContent" not in raw:
                raise OutputSchemaError(f"Tool {tool.name} has an output schema but did not return structured content")
            try:
                error = self._check(tool.name, schema).error(raw["structuredContent"])
            except Unresolvable as exc:
                raise OutputSchemaError(f"Invalid schema for tool {tool.name}: {exc}") from exc
            if error is not None:
                raise OutputSchemaError(f"Invalid structured content returned by tool {tool.name}: {error}")
        meta = raw.get("_meta")
        if isinstance(meta, dict) and any(key.startswith(PROTOCOL_META_PREFIX) for key in meta):
            kept = {key: value for key, value in meta.items() if not key.startswith(PROTOCOL_META_PREFIX)}
            raw = {key: value for key, value in raw.items() if key != "_meta"}
            if kept:
                raw["_meta"] = kept
        return raw

    def _surface(self, version: str) -> TypeAdapter[Any]:
        """The SDK's result surface of `tools/call` at `version`, the model its `validate_server_result` checks
        against. That function also dumps what it validated, which a check does not need: the same validation,
        without the dump, is a third cheaper. ValueError for a version the SDK does not know, KeyError
        for one without that surface, as from the SDK's function."""
        surface = self._surfaces.get(version)
        if surface is None:
            if version not in KNOWN_PROTOCOL_VERSIONS:
                raise ValueError(f"version must be a known protocol version, got {version!r}")
            shape: Any = methods.SERVER_RESULTS[("tools/call", version)]  # a model, or a union of models
            surface = self._surfaces[version] = TypeAdapter(shape)
        return surface

    def _check(self, name: str, schema: Mapping[str, Any]) -> SchemaCheck:
        known = self._schemas.get(name)
        if known is None or known.schema is not schema:
            known = self._schemas[name] = SchemaCheck(schema)
        return known


class OutputSchemaError(Exception):
    """A tool's result breaks the tool's own output schema (the SDK's client raises RuntimeError for it)."""


def strip_protocol_meta(result: _Result) -> _Result:
    """Drop the downstream's `io.modelcontextprotocol/*` `_meta` keys, and `_meta` itself if that empties it.

    Everything else of a forwarded result (contents, structured content, other `_meta` keys) is kept as is.
    """
    meta = result.meta
    if not meta or not any(key.startswith(PROTOCOL_META_PREFIX) for key in meta):
        return result
    kept = {key: value for key, value in meta.items() if not key.startswith(PROTOCOL_META_PREFIX)}
    return result.model_copy(update={"meta": kept or None})
