"""The ledger's seams: what the pipeline needs of the durable store (a source's are in `bastion.sources.seam`).

They are `typing.Protocol`s owned by the pipeline; ledger/ satisfies them structurally without importing this
module. The ledger is split by what each consumer needs: invocations (the call
pipeline and the held calls), pins (the pins and their drift), tokens (authentication), the change feed (whoever
waits for a decision), instance leases (recovery) and rate limits (the call pipeline).
"""

from __future__ import annotations

import builtins
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

import anyio
from anyio.abc import TaskStatus

from bastion.actions import WireResult
from bastion.models import (
    Admission,
    AuditCheckpoint,
    AuditReport,
    ChainedEvent,
    Change,
    EventKind,
    Exported,
    Grant,
    Invocation,
    InvocationEvent,
    OutboxItem,
    Pin,
    Principal,
    PruneReport,
    RecoveryReport,
    RetryWindow,
    Role,
    Status,
    TokenInfo,
)

Deliver = Callable[[WireResult], Awaitable[None]]
"""Hands the result of an express call that ran to its host, before its outcome is recorded."""


class InvocationStore(Protocol):
    """Invocations and their events. Whatever it is given is stored redacted and truncated."""

    def hash_args(self, arguments: Any) -> str:
        """The keyed hash of raw arguments an invocation is recorded with (never shown to anyone)."""
        ...

    def args_match(self, arguments: Any, stored: str) -> bool:
        """Whether `arguments` are the ones an invocation was recorded with (its `args_hash`)."""
        ...

    async def record(
        self,
        invocation: Invocation,
        events: Sequence[EventKind],
        detail: Mapping[str, Any] | None = None,
        *,
        may_share: bool = False,
    ) -> None:
        """Insert a new invocation and its first events in one transaction (durable on return). `may_share`: other
        calls are in flight, and the write may wait a moment to share one commit with theirs."""
        ...

    async def record_admitted(
        self,
        invocation: Invocation,
        events: Sequence[EventKind],
        detail: Mapping[str, Any] | None = None,
        *,
        admission: Admission,
        may_share: bool = False,
    ) -> float | None:
        """`record`, after admitting the call against its rate limit in the same transaction; when the limit refuses
        it nothing is recorded, and the seconds until one more fits come back (None: recorded)."""
        ...

    async def record_pending(
        self,
        invocation: Invocation,
        events: Sequence[EventKind],
        detail: Mapping[str, Any] | None,
        *,
        limit: int,
        retries: RetryWindow | None = None,
    ) -> int | Invocation | None:
        """Record a call that waits for approval only if its session has fewer than `limit` pending, counted
        atomically with the insert (across instances). None when recorded; else how many are pending. With
        `retries`, a call that retries an earlier one is not recorded: the earlier one (its twin) comes back, with
        a `retried` event noted on it, looked up atomically with the insert."""
        ...

    async def finish(
        self,
        invocation_id: str,
        to: Status,
        *,
        result: Any = None,
        error_class: str | None = None,
        error_message: str | None = None,
        may_defer: bool = False,
    ) -> bool:
        """executing -> `to` with the call's result and error, and the event; False when it was no longer
        executing. `may_defer`: the call ended while others run, and the write may wait for the next one that
        commits (durable then, or at the latest a moment later; reads of this process see it at once)."""
        ...

    async def transition(
        self,
        invocation_id: str,
        *,
        from_statuses: Collection[Status],
        to: Status,
        event: EventKind | None = None,
        detail: Mapping[str, Any] | None = None,
        fields: Mapping[str, Any] | None = None,
    ) -> Invocation | None:
        """Move an invocation to `to` only if its status is one of `from_statuses`, append the event
        (default: `to`) and set `fields` (result, error_class, error_message, owner, expires_at).
        Returns the updated invocation, or None when the condition did not hold (a conflict)."""
        ...

    async def decide(
        self,
        invocation_id: str,
        *,
        approve: bool,
        principal: str | None,
        note: str | None,
        now: datetime,
        grant: Grant | None = None,
        approvers: int = 1,
    ) -> Invocation:
        """An approver's decision on a pending invocation: `approved` or `denied` (the note is the reason), and the
        standing `grant` an approval leaves, stored with it (or not at all). `approvers`: how many distinct approvers
        the call needs (its signature covers it). Raises NotFound, ApprovalExpired (pending but past expires_at: it
        is marked expired), or Conflict (no longer pending; the message names its status). Only
        `bastion.pipeline.authority` calls it."""
        ...

    async def record_approval(
        self, invocation_id: str, *, principal: str, note: str | None, now: datetime, approvers: int
    ) -> Invocation | None:
        """One approval of a pending call that needs `approvers` distinct approvers, not the last one: a signed
        `approval_recorded` event, the call left pending. None when it is no longer pending. Only
        `bastion.pipeline.authority` calls it."""
        ...

    async def expire_due(self, now: datetime) -> builtins.list[Invocation]:
        """Mark every pending invocation whose expires_at <= now as expired; return them."""
        ...

    async def next_expiry(self) -> datetime | None:
        """The earliest expires_at among pending invocations."""
        ...

    async def claim(self, invocation_id: str, *, owner: str) -> Invocation | None:
        """approved -> executing for exactly one claimer (None for the others)."""
        ...

    async def recover(self, gone_of: Callable[[Sequence[str]], Awaitable[Collection[str]]]) -> RecoveryReport:
        """`executing` invocations whose owner is gone become `unknown`; report the approved ones of owners that
        are gone (never started) and how many are pending. `gone_of` is asked, once, with the owners found after
        they are read, so an instance that recorded work is judged on a lease it already held."""
        ...

    async def get(self, invocation_id: str) -> Invocation | None: ...

    async def find(self, prefix: str, *, principal: str | None = None, limit: int = 2) -> builtins.list[str]:
        """Ids starting with `prefix` (of `principal`'s invocations only, when given), at most `limit`."""
        ...

    async def list(
        self,
        *,
        status: Status | None = None,
        source_id: str | None = None,
        session_id: str | None = None,
        principal: str | None = None,
        parent_id: str | None = None,
        limit: int = 100,
    ) -> builtins.list[Invocation]:
        """Newest first; each filter given narrows the list (`parent_id`: the steps of a manifest invocation)."""
        ...

    async def events(self, invocation_id: str) -> builtins.list[InvocationEvent]: ...

    async def count(self, status: Status | None = None, *, session_id: str | None = None) -> int: ...


class PinStore(Protocol):
    """The trusted definition of every action and its drift, stored verbatim."""

    async def pins(self, source_id: str | None = None) -> builtins.list[Pin]: ...

    async def save_pin(self, pin: Pin) -> None:
        """Insert or replace the pin of (source_id, action_id), drift included."""
        ...

    async def accept_drift(self, *, source_id: str, action_id: str | None, principal: str | None) -> builtins.list[Pin]:
        """Re-pin drifted actions (one, or every drifted one of a source) to their drifted definition. Only
        `bastion.pipeline.authority` calls it."""
        ...

    async def tool_names(self) -> dict[str, tuple[str, str]]:
        """Every host name given to an action: name -> (source_id, action_id)."""
        ...

    async def keep_tool_names(self, names: Mapping[str, tuple[str, str]], *, now: datetime) -> None:
        """Remember that each name was given to its action; a name already given to one stays with it."""
        ...


class GrantStore(Protocol):
    """Standing approvals (bastion.pipeline.grants): stored with the decision that makes them, never deleted."""

    async def add(self, grant: Grant) -> None:
        """Store a grant made without a decision (imported from an earlier Bastion's file)."""
        ...

    async def covering(
        self, key: str, *, session_id: str, principal: str | None, now: datetime
    ) -> builtins.list[Grant]:
        """The grants standing at `now` on `key` that cover a call in this session by this caller, oldest first."""
        ...

    async def grants(self, *, standing_at: datetime | None = None, limit: int = 200) -> builtins.list[Grant]:
        """Newest first: those standing at `standing_at`, or (None) the last `limit` made, ended or not."""
        ...

    async def revoke(self, grant_id: str, *, by: str, now: datetime) -> Grant:
        """End a standing grant; NotFound when none of that id stands."""
        ...

    async def revoke_key(self, key: str, *, by: str, now: datetime) -> builtins.list[Grant]:
        """End every grant standing on `key`; the grants it ended."""
        ...


class TokenStore(Protocol):
    """Bearer tokens, kept only as the SHA-256 of their secret."""

    async def create_token(self, name: str, *, role: Role, profile: str | None, now: datetime) -> str:
        """Store a new token (only its SHA-256) and return its secret, once. Conflict if the name is taken."""
        ...

    async def tokens(self) -> builtins.list[TokenInfo]: ...

    async def revoke_token(self, name: str, *, now: datetime) -> TokenInfo:
        """Revoke an active token; NotFound if there is no active token of that name."""
        ...

    async def authenticate(self, secret: str) -> Principal | None:
        """The principal of an active token with this secret, else None."""
        ...

    async def has_tokens(self) -> bool:
        """Whether any active token exists (then every HTTP caller must present one)."""
        ...

    async def has_approver_tokens(self) -> bool:
        """Whether an active owner or admin token exists (then local decisions need one too)."""
        ...


class ChangeFeed(Protocol):
    """Every event of the ledger, in id order, as it happens in any process sharing the ledger.

    A waiting call wakes on its own invocation's changes (not on every commit); a stream of events resumes
    from a cursor (an event id). A backend announces through whatever it has (SQLite: polling its file's
    data_version; PostgreSQL: LISTEN/NOTIFY).
    """

    @property
    def cursor(self) -> int:
        """The id of the newest change announced so far: take it before reading what you wait on."""
        ...

    async def next(self, after: int) -> Sequence[Change]:
        """The changes after id `after`, oldest first, waiting for the first. Raises ChangesLost when some are no
        longer kept, or when `after` is beyond every change of the ledger (re-read what you watch, then continue
        from `cursor`)."""
        ...

    async def since(self, after: int, *, limit: int = 1000) -> builtins.list[Change]:
        """At most `limit` changes after id `after`, read from storage (however old)."""
        ...

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled, notice what other processes commit (and do the backend's upkeep)."""
        ...


class InstanceRegistry(Protocol):
    """The Bastion instances sharing a ledger and their leases: one whose lease lapsed is gone."""

    async def renew(self, instance_id: str, *, now: datetime, until: datetime) -> None:
        """Register the instance, or extend its lease, up to `until`."""
        ...

    async def release(self, instance_id: str, *, now: datetime) -> None:
        """End the instance's lease now (it is stopping)."""
        ...

    async def leases(self) -> dict[str, datetime]:
        """Every registered instance and when its lease ends (or ended)."""
        ...


class RateLimits(Protocol):
    """The rate limit counted in the ledger, so every instance sharing it counts against one budget
    per key (a session)."""

    async def admit(self, key: str, *, per_minute: int, now: datetime) -> float | None:
        """Count one admission of `key` at `now`, unless it had `per_minute` in the last minute, atomically across
        instances. None when admitted; else the seconds until one more fits (nothing was counted)."""
        ...


class Outbox(Protocol):
    """Messages for webhooks, kept until delivered: a restart or a receiver that is down loses none.

    One item per (target, event id): enqueuing it again does nothing, so a notifier that re-reads the change feed
    after a restart adds no duplicates. Items are claimed for a while before being sent, so two instances sharing
    the ledger do not send the same one at once.
    """

    async def enqueue(self, target: str, event_id: int, body: str, *, now: datetime) -> bool:
        """Add the message of event `event_id` for `target`, due at once; False when it was there already."""
        ...

    async def last_event(self, target: str) -> int | None:
        """The newest event id enqueued for `target` (None: none ever was)."""
        ...

    async def claim(self, target: str, *, now: datetime, until: datetime, limit: int) -> builtins.list[OutboxItem]:
        """At most `limit` undelivered items of `target` due at `now`, oldest first, each claimed until `until` (due
        again then, unless `delivered` or `retry` says otherwise)."""
        ...

    async def delivered(self, item_id: int, *, now: datetime) -> None:
        """The receiver took it: never sent again."""
        ...

    async def retry(self, item_id: int, *, at: datetime | None, error: str) -> None:
        """A delivery failed with `error`: count the attempt and send it again at `at` (None: give up; it stays in
        the outbox, undelivered, with its last error)."""
        ...

    async def next_due(self, target: str) -> datetime | None:
        """When the earliest undelivered item of `target` is due (None: none is)."""
        ...


class AuditLog(Protocol):
    """The ledger's tamper-evident history (bastion.ledger.chain): each event carries the hash of the one before."""

    async def checkpoint(self) -> AuditCheckpoint | None:
        """Where the latest retention prune cut the chain; None when nothing was pruned."""
        ...

    async def chain(self, after: int, limit: int) -> builtins.list[ChainedEvent]:
        """At most `limit` events after chain position `after`, in chain order."""
        ...

    async def head(self) -> tuple[int, str]:
        """The chain's head of record (position, hash), kept apart from the events."""
        ...

    async def verify(self, anchored: Mapping[int, str] = ...) -> AuditReport:
        """Check the chain from the checkpoint to its head of record, and every invocation against its newest event;
        `anchored`: (position: hash) of signed anchors it must hold. The report names the first break."""
        ...

    async def export(self, after: int, limit: int) -> builtins.list[Exported]:
        """At most `limit` events with a chain position above `after` (the last position an earlier export saw; 0 for
        the start), in chain order, each with its invocation as stored now (redacted as stored), its row exactly as
        stored and the grant its detail names (what bastion.ledger.offline verifies an export with)."""
        ...

    async def prune(
        self, before: datetime, *, now: datetime, sign: Callable[[int, str, datetime], tuple[str, str]] | None = None
    ) -> PruneReport:
        """Remove the oldest part of the history whose invocations all finished (completed, failed, denied,
        expired) before `before`, never the newest event, with a checkpoint that keeps the rest verifiable (signed
        with `sign`, when given: bastion.ledger.anchors)."""
        ...


class CommitTimes(Protocol):
    """How long the ledger's writes take to commit: whoever listens is told the seconds of each (`/metrics`)."""

    @property
    def backend(self) -> str:
        """`sqlite` or `postgresql`."""
        ...

    def listen(self, listener: Callable[[float], None]) -> None: ...


class Ledger(Protocol):
    """The durable store, as the stores each consumer takes what it needs from."""

    @property
    def invocations(self) -> InvocationStore: ...

    @property
    def pins(self) -> PinStore: ...

    @property
    def tokens(self) -> TokenStore: ...

    @property
    def grants(self) -> GrantStore: ...

    @property
    def changes(self) -> ChangeFeed: ...

    @property
    def instances(self) -> InstanceRegistry: ...

    @property
    def limits(self) -> RateLimits: ...

    @property
    def outbox(self) -> Outbox: ...

    @property
    def audit(self) -> AuditLog: ...

    @property
    def commits(self) -> CommitTimes: ...
