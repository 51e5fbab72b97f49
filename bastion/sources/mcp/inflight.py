"""Which host request a downstream's own messages belong to.

An `mcp.Client` has one sampling, elicitation and logging callback for the whole connection, while
a connector serves many calls at once. `InFlightCalls` keeps the relay of every call in flight and
answers those callbacks by finding the call a message belongs to:

- in the task that made the call, a context variable names it exactly. That covers sampling and
  elicitation from a 2026-07-28 downstream (they come back as `InputRequiredResult`, which the SDK
  answers inside `call_tool`) and everything an in-process downstream sends;
- messages read by the client's receive loop (log messages, and the requests of a 2025-era
  downstream) carry nothing that names the call, so they go to the only call in flight, or, when
  several are, to the one started most recently. That is a guess: with concurrent calls on one
  connector a log line or a sampling request may reach the host request of another call.

With no call in flight, log messages are dropped and requests are refused; so are those that come
in the task of a request made without a relay (a resource read, a prompt, a call nobody waits for).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import mcp_types as types
from mcp.client.session import ClientRequestContext

from bastion.sources.seam import HostRequest

logger = logging.getLogger(__name__)


class _Nowhere:
    """The relay of a request made without one: it hears nothing and answers no question."""

    def __init__(self, source_id: str) -> None:
        self._source_id = source_id

    @property
    def log_level(self) -> types.LoggingLevel | None:
        return None

    @property
    def answers(self) -> bool:
        return False

    @property
    def protocol_version(self) -> str:
        return types.LATEST_PROTOCOL_VERSION  # nobody receives the result through it

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        logger.debug("connector %s logged for no host request: %s %r", self._source_id, params.level, params.data)

    async def sample(
        self, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        return _refused("sampling", self._source_id)

    async def elicit(self, params: types.ElicitRequestParams) -> types.ElicitResult | types.ErrorData:
        return _refused("elicitation", self._source_id)


def nowhere(source_id: str) -> HostRequest:
    """The relay of a request made without one (see `_Nowhere`)."""
    return _Nowhere(source_id)


_calling: ContextVar[HostRequest | None] = ContextVar("bastion_calling", default=None)
"""The relay of the downstream request the current task is making, if any."""


class InFlightCalls:
    """The relays of one connector's calls in flight, and the client callbacks that route to them."""

    def __init__(self, source_id: str) -> None:
        self._source_id = source_id
        self._relays: list[HostRequest] = []
        """In start order: the last one is the most recently started."""
        self._nowhere = _Nowhere(source_id)

    @contextmanager
    def calling(self, relay: HostRequest | None) -> Iterator[None]:
        """Mark a downstream request in flight for the duration of the block (in the calling task).

        Without a relay, what comes back in this task goes nowhere, and the request is not a candidate
        for messages read elsewhere."""
        if relay is None:
            token = _calling.set(self._nowhere)
            try:
                yield
            finally:
                _calling.reset(token)
            return
        token = _calling.set(relay)
        self._relays.append(relay)
        try:
            yield
        finally:
            self._relays.remove(relay)
            _calling.reset(token)

    def _target(self) -> HostRequest | None:
        relay = _calling.get()
        if relay is not None:
            return relay
        return self._relays[-1] if self._relays else None

    async def sample(
        self, context: ClientRequestContext, params: types.CreateMessageRequestParams
    ) -> types.CreateMessageResult | types.CreateMessageResultWithTools | types.ErrorData:
        """The client's sampling callback."""
        return await (self._target() or self._nowhere).sample(params)

    async def elicit(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        """The client's elicitation callback."""
        return await (self._target() or self._nowhere).elicit(params)

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        """The client's logging callback (the relay drops what is below the host's level)."""
        await (self._target() or self._nowhere).log(params)


def _refused(what: str, source_id: str) -> types.ErrorData:
    return types.ErrorData(
        code=types.INVALID_REQUEST,
        message=f"{source_id} asked for {what} outside any tool call a host made through Bastion: nobody can answer",
    )
