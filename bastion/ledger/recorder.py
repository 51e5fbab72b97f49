"""The invocation store the pipeline writes to: redaction and truncation happen here, once, above every backend.

`Recorder` satisfies `bastion.pipeline.seams.InvocationStore`. Each write turns the free-form values it is given
(arguments, results, error messages, event details) into `Scrubbed` JSON and scrubbed text with the Redactor,
then hands them to the backend (`bastion.ledger.backend.InvocationBackend`); reads pass through. It also
owns the ledger's argument-hash key (bastion.ledger.keys), since only it sees the raw arguments.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bastion import states
from bastion.errors import InvalidArguments
from bastion.ledger import keys
from bastion.ledger.anchors import load_or_create_signing_key
from bastion.ledger.backend import EMPTY_DETAIL, GoneFn, InvocationBackend, Scrubbed
from bastion.ledger.decisions import PREVIEW, SIGNED, decision_text, preview_digest, sign_decision
from bastion.ledger.redaction import Redactor
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


class Recorder:
    """Scrubs what the pipeline records, then stores it through a backend."""

    def __init__(
        self, backend: InvocationBackend, redactor: Redactor, key: bytes, signing_key_path: Path | None = None
    ) -> None:
        self._backend = backend
        self.redactor = redactor
        self._key = key
        self._signing_key_path = signing_key_path
        self._signing_key: Ed25519PrivateKey | None = None

    # -- argument hashes -------------------------------------------------------------------------------

    def hash_args(self, arguments: Any) -> str:
        """The keyed hash of raw arguments that an invocation stores (never shown; see bastion.ledger.keys).

        Raises InvalidArguments for arguments that can be neither stored nor sent (nested too deeply, or text that
        is not Unicode): refused before anything is recorded."""
        try:
            return keys.keyed_hash(self._key, arguments)
        except ValueError as exc:
            raise InvalidArguments(f"invalid arguments: {exc}") from exc

    def args_match(self, arguments: Any, stored: str) -> bool:
        """Whether `arguments` are those an invocation was recorded with."""
        return keys.matches(self._key, arguments, stored)

    # -- writes: scrubbed here, stored by the backend ---------------------------------------------------

    async def record(
        self,
        invocation: Invocation,
        events: Sequence[EventKind],
        detail: Mapping[str, Any] | None = None,
        *,
        may_share: bool = False,
    ) -> None:
        """Insert a new invocation and its first events in one transaction (durable on return). `detail` goes
        on the last event. Raises Conflict if the id is taken. `may_share`: other calls are in flight, and the
        write may wait a moment to share their commit."""
        await self._backend.insert(self._scrubbed(invocation), events, self._detail(detail), may_share=may_share)

    async def record_admitted(
        self,
        invocation: Invocation,
        events: Sequence[EventKind],
        detail: Mapping[str, Any] | None = None,
        *,
        admission: Admission,
        may_share: bool = False,
    ) -> float | None:
        """Admit the call against its rate limit and record it, in one transaction (durable on return); when the
        limit refuses it nothing is recorded, and the seconds until one more fits come back (None: recorded)."""
        return await self._backend.insert_admitted(
            self._scrubbed(invocation), events, self._detail(detail), admission=admission, may_share=may_share
        )

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
        in the same transaction. None when recorded; else how many are pending (nothing was recorded). With
        `retries`: when the call retries an earlier one (its twin, bastion.ledger.twins), nothing is recorded but a
        `retried` event on the twin (`by`: the principal who retried; none for a caller without a token, who retries
        only within its own session), and the twin comes back as it is now."""
        retried = self._detail({"by": invocation.principal})
        return await self._backend.insert_pending(
            self._scrubbed(invocation), events, self._detail(detail), limit=limit, retries=retries, retried=retried
        )

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
        executing. `may_defer`: the call ended while others run; the write may wait for the next one that commits."""
        return await self._backend.finish(
            invocation_id,
            to,
            result=self._json(result),
            error_class=error_class,
            error_message=self._text(error_message),
            may_defer=may_defer,
        )

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
        Returns the updated invocation, or None when the condition did not hold (a conflict). ValueError for a move
        the state machine does not allow (bastion.ledger.states), before anything is written."""
        states.check(tuple(from_statuses), to)
        stored = dict(fields or {})
        if "result" in stored:
            stored["result"] = self._json(stored["result"])
        if "error_message" in stored:
            stored["error_message"] = self._text(stored["error_message"])
        return await self._backend.transition(
            invocation_id,
            from_statuses=from_statuses,
            to=to,
            event=event or to,
            detail=self._detail(detail),
            fields=stored,
        )

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
        """An approver's decision on a pending invocation: `approved` or `denied` (the note is the reason), with
        who decided in the event, the approval's scope (`once`, or its `grant`'s, whose id the event names), and,
        with a signing key, its signature (bastion.ledger.decisions; covering `approvers`, how many the call needs).
        Raises NotFound, ApprovalExpired (pending but past expires_at: it is marked expired), or Conflict (no longer
        pending; the message names its status)."""
        denied_by = f"denied by {principal or 'an approver'}"
        detail: dict[str, Any] = {"by": principal, "note" if approve else "reason": note}
        if approve:
            detail["scope"] = "once" if grant is None else grant.scope
            if grant is not None:
                detail["grant"] = grant.id
        kind: EventKind = "approved" if approve else "denied"
        stored = await self._signed(invocation_id, kind, self._detail(detail), now, grant, approvers)
        return await self._backend.decide(
            invocation_id,
            approve=approve,
            detail=stored,
            error_message=None if approve else self._text(denied_by if note is None else f"{denied_by}: {note}"),
            now=now,
            grant=grant,
        )

    async def record_approval(
        self, invocation_id: str, *, principal: str, note: str | None, now: datetime, approvers: int
    ) -> Invocation | None:
        """One approval of a pending call that needs `approvers` distinct approvers, not the last one: an
        `approval_recorded` event (who, the note, signed as a decision is), the call left pending. None when it is no
        longer pending."""
        detail = self._detail({"by": principal, "note": note, "scope": "once"})
        stored = await self._signed(invocation_id, "approval_recorded", detail, now, None, approvers)
        return await self._backend.transition(
            invocation_id,
            from_statuses=states.RECORD_APPROVAL.from_,
            to=states.RECORD_APPROVAL.start,
            event="approval_recorded",
            detail=stored,
            fields={},
            at=now,
        )

    async def expire_due(self, now: datetime) -> builtins.list[Invocation]:
        """Mark every pending invocation whose expires_at <= now as expired; return them."""
        return await self._backend.expire_due(now)

    async def claim(self, invocation_id: str, *, owner: str) -> Invocation | None:
        """approved -> executing for exactly one claimer (None for the others)."""
        return await self._backend.claim(invocation_id, owner=owner)

    async def recover(self, gone_of: GoneFn) -> RecoveryReport:
        """`executing` invocations whose owner is gone become `unknown`; report the approved ones of owners that
        are gone (never started) and how many are pending. `gone_of` is asked after the owners are read."""
        return await self._backend.recover(gone_of)

    async def _signed(
        self,
        invocation_id: str,
        kind: EventKind,
        stored: Scrubbed,
        now: datetime,
        grant: Grant | None,
        approvers: int,
    ) -> Scrubbed:
        """The decision's detail as stored, with (given a signing key) its signature over what it decides: who, as
        stored (scrubbed), and the call's arguments hash, pinned definition and preview (its digest, also named in the
        detail), which do not change while it is pending."""
        if self._signing_key_path is None:
            return stored
        if self._signing_key is None:  # created by the first decision, not by every process that opens the ledger
            self._signing_key = load_or_create_signing_key(self._signing_key_path)
        invocation = await self._backend.get(invocation_id)
        if invocation is None:
            return stored  # the decision will be refused: NotFound
        held = [event.detail for event in await self._backend.events(invocation_id) if event.kind == "pending"]
        preview = preview_digest(held[0]) if held else None
        detail = json.loads(stored.json)
        if preview is not None:
            detail[PREVIEW] = preview
        text = decision_text(
            invocation_id,
            kind,
            detail.get("by"),
            invocation.args_hash,
            invocation.fingerprint,
            str(detail.get("scope", "once")),
            now,
            grant,
            approvers,
            preview,
        )
        detail[SIGNED] = sign_decision(self._signing_key, text)
        return Scrubbed(json.dumps(detail, ensure_ascii=False, separators=(",", ":")))

    # -- reads -----------------------------------------------------------------------------------------

    async def get(self, invocation_id: str) -> Invocation | None:
        return await self._backend.get(invocation_id)

    async def find(self, prefix: str, *, principal: str | None = None, limit: int = 2) -> builtins.list[str]:
        """Ids starting with `prefix` (of `principal`'s invocations only, when given), at most `limit`."""
        return await self._backend.find(prefix, principal=principal, limit=limit)

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
        return await self._backend.list(
            status=status,
            source_id=source_id,
            session_id=session_id,
            principal=principal,
            parent_id=parent_id,
            limit=limit,
        )

    async def events(self, invocation_id: str) -> builtins.list[InvocationEvent]:
        return await self._backend.events(invocation_id)

    async def count(self, status: Status | None = None, *, session_id: str | None = None) -> int:
        return await self._backend.count(status, session_id=session_id)

    async def next_expiry(self) -> datetime | None:
        """The earliest expires_at among pending invocations."""
        return await self._backend.next_expiry()

    # -- scrubbing -------------------------------------------------------------------------------------

    def _scrubbed(self, invocation: Invocation) -> Invocation:
        return invocation.model_copy(
            update={
                "args": self._json(invocation.args),
                "result": self._json(invocation.result),
                "error_message": self._text(invocation.error_message),
            }
        )

    def _json(self, value: Any) -> Scrubbed | None:
        return None if value is None else Scrubbed(self.redactor.scrub_json(value))

    def _text(self, message: str | None) -> str | None:
        if message is None:
            return None
        scrubbed = self.redactor.scrub(message)
        return scrubbed if isinstance(scrubbed, str) else self.redactor.scrub_json(scrubbed)

    def _detail(self, detail: Mapping[str, Any] | None) -> Scrubbed:
        return Scrubbed(self.redactor.scrub_json(dict(detail))) if detail else EMPTY_DETAIL
