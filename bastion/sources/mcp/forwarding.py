"""A tool call forwarded to a stdio connector's process as JSON (the express lane), with what the SDK's
client does around it: the same request `_meta`, the same checks of the result, the same errors, and a 2026-07-28
downstream's input rounds followed as the SDK's client follows them.

Only a call whose host cannot answer the downstream's questions is forwarded to a 2026-07-28 downstream this way
(see `McpConnector.call_wire`): its input requests are then refused by the call's relay, as the SDK's client has
its callbacks refuse them, and the call fails with the refusal; a round with no request in it (only
`requestState`) is retried after the SDK's backoff.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import anyio
import mcp_types as types
from mcp_types import LOG_LEVEL_META_KEY
from pydantic import ValidationError

from bastion import tracing
from bastion.actions import WireResult
from bastion.errors import CallTimeout, UnknownOutcome, UpstreamError
from bastion.sources.mcp.failures import first_line
from bastion.sources.mcp.inflight import InFlightCalls, nowhere
from bastion.sources.mcp.wire import OutputSchemaError, ResultChecks, WireCalls, WireClosed, WireError, WireUnreadable
from bastion.sources.seam import HostRequest

CORRELATION_META_KEY: Final = "io.bastion/correlation-id"
"""The request `_meta` key that carries an invocation's correlation id to the downstream."""

MAX_ROUNDS: Final = 10
"""Input rounds followed before giving up (the SDK client's `input_required_max_rounds`)."""
_BACKOFF_INITIAL: Final = 0.05
_BACKOFF_CAP: Final = 0.25


@dataclass(frozen=True)
class Forwarding:
    """One connection's way of forwarding calls: its wire, its protocol version, and what the connector keeps."""

    source_id: str
    wire: WireCalls
    version: str
    modern: bool
    calls: InFlightCalls
    checks: ResultChecks
    lose: Callable[[str], None]
    """Marks the connection lost (a call found it closed)."""

    async def call(
        self,
        action_id: str,
        arguments: dict[str, Any],
        tool: types.Tool | None,
        *,
        correlation_id: str,
        timeout: float,
        relay: HostRequest | None,
    ) -> WireResult:
        """Call `action_id` and return its checked result; raises what `ActionSource.call` raises."""
        meta: dict[str, Any] = {CORRELATION_META_KEY: correlation_id}
        if self.modern:
            meta.update(self.wire.envelope or {})
            if relay is not None and relay.log_level is not None:
                meta[LOG_LEVEL_META_KEY] = relay.log_level
        tracing.inject_context(meta)  # the host's trace context, as the SDK's client passes it on
        params: dict[str, Any] = {"name": action_id, "arguments": arguments, "_meta": meta}
        with self.calls.calling(relay):
            raw = await self._request(action_id, params, timeout)
            raw = await self._rounds(action_id, params, raw, timeout, relay or nowhere(self.source_id))
        if raw.get("resultType", "complete") != "complete":  # an extension's result shape: not a tool result
            raise UpstreamError(f"{self.source_id}:{action_id} returned an unusable result: {raw.get('resultType')}")
        try:
            checked = self.checks.checked(tool, raw, self.version)
        except ValidationError as exc:
            raise UpstreamError(f"{self.source_id}:{action_id} returned an unusable result: {exc}") from exc
        except OutputSchemaError as exc:
            raise UpstreamError(
                f"{self.source_id}:{action_id} ran, but its result breaks the tool's own output schema "
                f"({first_line(exc)}); the result is withheld, and the call is not safe to repeat blindly"
            ) from exc
        return WireResult(checked, checked_at=self.version)

    async def _request(self, action_id: str, params: Mapping[str, Any], timeout: float) -> dict[str, Any]:
        try:
            return await self.wire.request("tools/call", params, timeout=timeout)
        except TimeoutError as exc:
            raise CallTimeout(f"{self.source_id}:{action_id} did not answer within {timeout:g}s") from exc
        except WireClosed as exc:
            self.lose(f"the connection closed during a call of {action_id}")
            raise UnknownOutcome(
                f"the connection to {self.source_id} closed while {action_id} was running; its outcome is unknown"
            ) from exc
        except WireError as exc:
            raise UpstreamError(f"{self.source_id}:{action_id} failed with error {exc.code}: {exc.message}") from exc
        except WireUnreadable as exc:
            raise UnknownOutcome(
                f"{self.source_id}:{action_id} answered, but its answer cannot be read ({exc}); its outcome is "
                "unknown: check the downstream before retrying"
            ) from exc

    async def _rounds(
        self, action_id: str, params: dict[str, Any], raw: dict[str, Any], timeout: float, relay: HostRequest
    ) -> dict[str, Any]:
        """Follow input rounds until the downstream's final result (see the module docstring)."""
        backoff = _BACKOFF_INITIAL
        for _ in range(MAX_ROUNDS):
            if raw.get("resultType") != "input_required":
                return raw
            try:
                asked = types.InputRequiredResult.model_validate(raw, by_name=False)
            except ValidationError as exc:
                raise UpstreamError(f"{self.source_id}:{action_id} returned an unusable result: {exc}") from exc
            answers: dict[str, Any] = {}
            for key, request in (asked.input_requests or {}).items():
                answer = await _ask(relay, request)
                if isinstance(answer, types.ErrorData):
                    raise UpstreamError(
                        f"{self.source_id}:{action_id} failed with error {answer.code}: {answer.message}"
                    )
                answers[key] = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
            if not answers:
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_CAP)
            retry = {**params, "inputResponses": answers or None, "requestState": asked.request_state}
            raw = await self._request(action_id, {k: v for k, v in retry.items() if v is not None}, timeout)
        if raw.get("resultType") == "input_required":
            raise UpstreamError(f"{self.source_id}:{action_id} asked for input more than {MAX_ROUNDS} times")
        return raw


async def _ask(relay: HostRequest, request: types.InputRequest) -> types.InputResponse | types.ErrorData:
    """One input request, answered by the call's relay as the SDK client's callbacks would answer it."""
    if isinstance(request, types.CreateMessageRequest):
        return await relay.sample(request.params)
    if isinstance(request, types.ElicitRequest):
        return await relay.elicit(request.params)
    return types.ErrorData(code=types.INVALID_REQUEST, message="List roots not supported")
