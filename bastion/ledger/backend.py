"""What a ledger backend (SQLite now, PostgreSQL later) offers the `Recorder` above it.

The pipeline never talks to a backend's invocation store directly: it talks to the `Recorder`, which
redacts and truncates every free-form value once and hands the backend only `Scrubbed` JSON text and
scrubbed messages. A backend stores what it is given; it cannot store a value that was not scrubbed,
because `stored_json` refuses anything else.
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Protocol

from bastion.models import (
    Admission,
    EventKind,
    Grant,
    Invocation,
    InvocationEvent,
    RecoveryReport,
    RetryWindow,
    Status,
)

GoneFn = Callable[[Sequence[str]], Awaitable[Collection[str]]]
"""Given the instances that own executing or approved invocations, those that are gone (stopped)."""


@dataclass(frozen=True, slots=True)
class Scrubbed:
    """Compact JSON text of a value that went through the Redactor: the only form args, results and event
    details reach a backend in."""

    json: str


EMPTY_DETAIL = Scrubbed("{}")

INVOCATION_COLUMNS: Final = (
    "id",
    "status",
    "policy_key",
    "tool",
    "source_id",
    "action_id",
    "risk",
    "mode",
    "mode_source",
    "fingerprint",
    "session_id",
    "profile",
    "principal",
    "args",
    "args_hash",
    "result",
    "error_class",
    "error_message",
    "owner",
    "drift",
    "created_at",
    "updated_at",
    "expires_at",
    "parent_id",
    "risk_source",
)
"""The columns of the `invocations` table, in the order every backend selects them: the fields of `Invocation`."""

GRANT_COLUMNS: Final = tuple(Grant.model_fields)

TRANSITION_FIELDS: Final = ("result", "error_class", "error_message", "owner", "expires_at")
"""The columns a transition may set besides status and updated_at."""


def transition_params(
    invocation_id: str,
    from_statuses: Any,
    to: Status,
    fields: Mapping[str, Any],
    *,
    now: Any,
    value: Callable[[str, Any], Any],
) -> dict[str, Any]:
    """The parameters of a backend's one transition statement: `:set_<field>` says whether each of
    `TRANSITION_FIELDS` is set, `from_statuses` and `now` come as the backend stores them, and `value` turns a
    field's value into what it stores. ValueError for a field outside `TRANSITION_FIELDS`."""
    unknown = set(fields) - set(TRANSITION_FIELDS)
    if unknown:
        raise ValueError(f"transition cannot set {sorted(unknown)}; allowed: {', '.join(TRANSITION_FIELDS)}")
    params: dict[str, Any] = {"id": invocation_id, "to": to, "now": now, "from_statuses": from_statuses}
    for name in TRANSITION_FIELDS:
        params[f"set_{name}"] = name in fields
        params[name] = value(name, fields[name]) if name in fields else None
    return params


"""The columns of the `grants` table, in the order every backend selects them: the fields of `Grant`."""

LAST_CODE_POINT: Final = chr(0x10FFFF)
FIRST_SURROGATE: Final = 0xD800
AFTER_SURROGATES: Final = 0xE000


def stored_json(value: object) -> str | None:
    """The text a backend stores for a JSON field: a `Scrubbed` value's text, SQL NULL for None.

    Raises TypeError for anything else: a raw value reaching a backend is a bug that would store secrets.
    """
    if value is None:
        return None
    if not isinstance(value, Scrubbed):
        raise TypeError(f"a ledger backend stores only scrubbed JSON, got {type(value).__name__}")
    return value.json


class InvocationBackend(Protocol):
    """The invocation store as a backend implements it: `args`, `result` and details arrive scrubbed.

    In an `Invocation` handed to `insert` or `insert_pending`, `args` and `result` are `Scrubbed` (or None)
    and `error_message` is scrubbed text. Reads return invocations as stored (args and result parsed back).
    """

    async def insert(
        self, invocation: Invocation, events: Sequence[EventKind], detail: Scrubbed, *, may_share: bool = False
    ) -> None:
        """Insert a new invocation and its first events (the detail goes on the last) in one transaction, durable on
        return. Raises Conflict when the id exists. `may_share`: other calls are in flight, so the write may wait a
        moment to share one commit with theirs (a backend that commits each write on its own ignores it)."""
        ...

    async def insert_admitted(
        self,
        invocation: Invocation,
        events: Sequence[EventKind],
        detail: Scrubbed,
        *,
        admission: Admission,
        may_share: bool = False,
    ) -> float | None:
        """Like `insert`, after admitting the call against its rate limit in the same transaction; when the limit
        refuses it nothing is inserted, and the seconds until one more fits come back (None when inserted)."""
        ...

    async def insert_pending(
        self,
        invocation: Invocation,
        events: Sequence[EventKind],
        detail: Scrubbed,
        *,
        limit: int,
        retries: RetryWindow | None = None,
        retried: Scrubbed = EMPTY_DETAIL,
    ) -> int | Invocation | None:
        """Like `insert`, but only if its session has fewer than `limit` pending invocations, counted in the
        same transaction (so two instances cannot both take the last slot). None when inserted, else the count.

        With `retries`, a twin found first in the same transaction (bastion.ledger.twins) comes back instead, as it
        is now with a `retried` event appended (`retried` its detail), and nothing is inserted."""
        ...

    async def finish(
        self,
        invocation_id: str,
        to: Status,
        *,
        result: Scrubbed | None,
        error_class: str | None,
        error_message: str | None,
        may_defer: bool = False,
    ) -> bool:
        """executing -> `to` with the outcome and its event; False when it was no longer executing. `may_defer`: the
        call ended while others run, so the write may wait for the next write that commits (a backend that commits
        each write on its own ignores it)."""
        ...

    async def transition(
        self,
        invocation_id: str,
        *,
        from_statuses: Collection[Status],
        to: Status,
        event: EventKind,
        detail: Scrubbed,
        fields: Mapping[str, Any],
        at: datetime | None = None,
    ) -> Invocation | None:
        """Move to `to` only from one of `from_statuses`, set `fields` (`result` Scrubbed, `error_message`
        scrubbed) and append the event (stamped `at`, default now: a signed event's time is the one signed); None
        when the condition did not hold."""
        ...

    async def decide(
        self,
        invocation_id: str,
        *,
        approve: bool,
        detail: Scrubbed,
        error_message: str | None,
        now: datetime,
        grant: Grant | None = None,
    ) -> Invocation:
        """pending -> approved or denied (with `error_message`), unless expired (then marked expired and
        ApprovalExpired raised), storing `grant` in the same transaction if the decision holds. NotFound for an
        unknown id, Conflict when it is no longer pending."""
        ...

    async def expire_due(self, now: datetime) -> builtins.list[Invocation]: ...

    async def next_expiry(self) -> datetime | None: ...

    async def claim(self, invocation_id: str, *, owner: str) -> Invocation | None: ...

    async def recover(self, gone_of: GoneFn) -> RecoveryReport: ...

    async def get(self, invocation_id: str) -> Invocation | None: ...

    async def find(self, prefix: str, *, principal: str | None = None, limit: int = 2) -> builtins.list[str]: ...

    async def list(
        self,
        *,
        status: Status | None = None,
        source_id: str | None = None,
        session_id: str | None = None,
        principal: str | None = None,
        parent_id: str | None = None,
        limit: int = 100,
    ) -> builtins.list[Invocation]: ...

    async def events(self, invocation_id: str) -> builtins.list[InvocationEvent]: ...

    async def count(self, status: Status | None = None, *, session_id: str | None = None) -> int: ...


def prefix_end(prefix: str) -> str | None:
    """The least text after every text that starts with `prefix`, in code point order (SQLite compares UTF-8 bytes,
    and so does PostgreSQL's "C" collation: both sort the same); None when there is none (the prefix is empty or
    all U+10FFFF). Finding ids by prefix is then a range on the primary key."""
    stem = prefix.rstrip(LAST_CODE_POINT)
    if not stem:
        return None
    following = ord(stem[-1]) + 1
    if following == FIRST_SURROGATE:
        following = AFTER_SURROGATES  # surrogates are no text: the next character is U+E000
    return stem[:-1] + chr(following)
