"""The shared vocabulary of Bastion: risks, modes, statuses, invocations."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, NamedTuple, get_args

from pydantic import BaseModel, ConfigDict, Field

from bastion.terms import ROLES as ROLES
from bastion.terms import SCOPES as SCOPES
from bastion.terms import STATUSES as STATUSES
from bastion.terms import Role as Role
from bastion.terms import Scope as Scope
from bastion.terms import Status as Status

Risk = Literal["read", "write", "danger"]
Mode = Literal["allow", "require_approval", "deny"]
EventKind = Literal[
    "planned",
    "pending",
    "approved",
    "denied",
    "expired",
    "executing",
    "completed",
    "failed",
    "unknown",
    "reconciled",
    "checked",
    "approval_recorded",
    "scrubbed",
    "retried",
]
"""What an invocation's events say: a status it moved to, or `planned` (its intent, before anything runs),
`reconciled` (an outcome found after the fact), `checked` (a look-up whose evidence was refused: it moved
nowhere), `approval_recorded` (one approval of a call that needs more than one: it stays pending), `scrubbed` (a
leaked secret replaced in it and its events: bastion.ledger.scrubbing) or `retried` (the same call came again and
was attached to this one: it moved nowhere)."""

RISKS: Final[tuple[Risk, ...]] = get_args(Risk)
MODES: Final[tuple[Mode, ...]] = get_args(Mode)

MANIFEST_SOURCE_ID: Final = "actions"
"""The source id (and namespace) of the manifest actions of `actions/*.md`: policy keys `actions:<name>`, tools
`actions__<name>`. Reserved (`RESERVED_SOURCE_IDS`)."""

PLUGIN_SOURCE_ID: Final = "plugins"
"""The source id (and namespace) of the plugin action packages of `actions/<name>/action.json`: policy keys
`plugins:<name>`, tools `plugins__<name>`. Reserved (`RESERVED_SOURCE_IDS`)."""

RESERVED_SOURCE_IDS: Final[dict[str, str]] = {
    MANIFEST_SOURCE_ID: "the manifest actions of actions/ (a reserved id)",
    PLUGIN_SOURCE_ID: "the plugin actions of actions/ (a reserved id)",
    "bastion": "Bastion's own tool, bastion__invocation (a reserved id)",
}
"""The source ids Bastion's own sources use, and what holds each: no connector or provider may take one."""

Tier = Literal["R0", "R1", "R2", "R3", "R4"]
"""The risk tiers of an action API: finer than a risk, kept beside it for policy to match (`[approvers]`)."""
TIERS: Final[tuple[Tier, ...]] = get_args(Tier)
RISK_ALIASES: Final[dict[Tier, Risk]] = {"R0": "read", "R1": "read", "R2": "write", "R3": "danger", "R4": "danger"}
"""The risk tiers R0-R4 and the risk each stands for, accepted wherever a risk is configured."""


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class Admission:
    """One call counted against the rate limit: `key` (a session) may have `per_minute` calls in any
    minute; `now` is when it came."""

    key: str
    per_minute: int
    now: datetime


@dataclass(frozen=True, slots=True)
class RetryWindow:
    """Which earlier call a new held call retries (its twin): one of the same caller, policy key and arguments hash,
    held for an approver too, that is still undecided or running, or whose status last changed at `decided_since` or
    later. `created_since` bounds how far back the ledger looks (a twin decided in the window was made after it)."""

    decided_since: datetime
    created_since: datetime

    @classmethod
    def before(cls, now: datetime, *, window_seconds: float, longest_held_seconds: float) -> RetryWindow:
        """The window of a call made at `now`: twins decided in the last `window_seconds`, made in the last
        `window_seconds + longest_held_seconds` (how long a held call can wait and run before it ends)."""
        return cls(
            decided_since=now - timedelta(seconds=window_seconds),
            created_since=now - timedelta(seconds=window_seconds + longest_held_seconds),
        )


def policy_key(source_id: str, action_id: str) -> str:
    """The `source_id:action_id` key used by every policy map, the ledger and the CLI."""
    return f"{source_id}:{action_id}"


class ModeDecision(BaseModel):
    """A resolved mode and the rule that produced it (`profile`, `org`, `inferred`, `drift`, `unknown_mode:<v>`),
    and, for a call held for approval, how many distinct approvers must approve it (`[approvers]` of the policy)."""

    model_config = ConfigDict(frozen=True)

    mode: Mode
    source: str
    approvers: int = 1


class RiskDecision(BaseModel):
    """A risk and where it came from, shown to approvers as part of why a call waits.

    `source` is one of: `override` (the per-tool `risk` in the connector file), `destructiveHint` or `readOnlyHint`
    (the tool's annotations), `default_risk` (the connector's), `default` (none of those: `write`), `declared` (by a
    provider action, a manifest or a plugin package), or `step:<key>` (a manifest action's riskiest step)."""

    model_config = ConfigDict(frozen=True)

    risk: Risk
    source: str


class PolicyRule(BaseModel):
    """`[[rules]]` of a policy file (org, or a profile's): the mode of `key` when the CEL condition `when` holds for
    the call's arguments. Rules of a key are tried before its plain mode, in the order written."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: str
    """The policy key it applies to: `source:action` or `source:*`."""
    when: str
    """A CEL condition over `args`, the call's arguments (compare paths as `normpath(args.path)`)."""
    mode: str
    """Kept as text, as in `[modes]`: a value that is not a mode resolves to deny."""
    approvers: int | None = None
    """How many distinct approvers a call this rule holds needs (2: two-person approval); None: as `[approvers]`."""


class CallContext(BaseModel):
    """Who is calling: the host session, the profile bound to it and the authenticated principal."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    profile: str | None = None
    principal: str | None = None
    local_session: bool = False
    """No other process serves this session (a stdio host's; a handshake-era HTTP session, which lives in this
    process's memory): its rate limit is counted in this process, not in the ledger."""


def caller_session_id(principal: str | None, client_name: str | None) -> str:
    """The session a host without sessions (2026-07-28) is counted in: its caller's identity, principal and client
    name. Such an id has a `/`, which no host session id has (see `has_host_session`)."""
    return f"{principal or 'anonymous'}/{client_name or 'unknown-client'}"


def has_host_session(session_id: str) -> bool:
    """Whether `session_id` is a host's session (it ends when the host disconnects), not a caller's identity."""
    return "/" not in session_id


class Invocation(BaseModel):
    """One call of one action: a ledger row with its current status. Args and result are stored redacted."""

    id: str
    status: Status
    policy_key: str
    tool: str
    source_id: str
    action_id: str
    risk: Risk
    risk_source: str | None = None
    """Where `risk` came from (see `RiskDecision.source`); None for a call recorded before Bastion kept it."""
    mode: Mode
    mode_source: str
    fingerprint: str | None = None
    session_id: str
    profile: str | None = None
    principal: str | None = None
    args: Any = None
    args_hash: str = Field(default="", exclude=True)
    """A keyed hash of the raw arguments (is what runs what was approved?); never shown, never serialised."""
    result: Any = None
    error_class: str | None = None
    error_message: str | None = None
    owner: str | None = None
    """The instance id of the Bastion process that is executing (or last touched) this invocation."""
    drift: list[str] | None = None
    """When the action's definition had drifted from its pin at call time: the diff (pinned -> current)."""
    parent_id: str | None = None
    """For a step of a manifest action: the manifest's invocation, whose approval covered this one."""
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    expires_at: datetime | None = None


class InvocationEvent(BaseModel):
    """One entry of the append-only event history of an invocation."""

    id: int = 0
    """The event's place in the whole ledger's history: increasing, the cursor a stream of events resumes from."""
    invocation_id: str
    seq: int
    """1..n within its invocation."""
    kind: EventKind
    at: datetime
    detail: dict[str, Any] = Field(default_factory=dict)


APPROVERS: Final = "approvers"
"""The key of a `pending` event's detail that says how many distinct approvers the call needs (absent: one). The
requirement lives in the chained history, where `bastion audit verify` checks the approvals against it."""


@dataclass(frozen=True, slots=True)
class Quorum:
    """Who has approved a held call that needs several approvers, and how many it needs (two-person approval)."""

    required: int
    by: tuple[str, ...] = ()
    """The approvers whose approval is recorded so far (`approval_recorded` events), oldest first."""

    @classmethod
    def of(cls, events: Sequence[InvocationEvent]) -> Quorum:
        """The quorum an invocation's events record: its `pending` event's requirement, and the approvals since."""
        required = next((e.detail.get(APPROVERS) for e in events if e.kind == "pending"), None)
        by = tuple(dict.fromkeys(str(e.detail.get("by")) for e in events if e.kind == "approval_recorded"))
        return cls(required if isinstance(required, int) and not isinstance(required, bool) else 1, by)

    @property
    def summary(self) -> str | None:
        """`1 of 2 approvals, by alice`, as every companion shows it; None for a call one approver decides."""
        if self.required <= 1:
            return None
        by = f", by {', '.join(self.by)}" if self.by else ""
        return f"{len(self.by)} of {self.required} approvals{by}"


PreviewKind = Literal["diff", "request", "steps", "plan", "none"]
"""What a preview shows: a file's `diff`, the HTTP `request` a provider would send, a composite's `steps`, a plugin's
`plan` (its dry-run step), or `none` (the action offers previews, but this one could not be made)."""


class Preview(BaseModel):
    """What a held call would do, worked out without doing it, shown to approvers beside its arguments and recorded
    (redacted) in the detail of its `pending` event; an approval's signature covers its digest."""

    kind: PreviewKind
    summary: str
    """One line: what the preview is of (`write /srv/a.txt: 2 lines added, 1 removed`), or `no preview: <why>`."""
    text: str = ""
    """The preview itself, lines of text (a unified diff for `diff`), cut to the configured size with a note."""

    @classmethod
    def unavailable(cls, why: str) -> Preview:
        """The preview of a call whose action offers previews, when this one could not be made."""
        return cls(kind="none", summary=f"no preview: {why}")


@dataclass(frozen=True, slots=True)
class Change:
    """One event of the ledger as the change feed announces it: which invocation changed, and how."""

    id: int
    """The event's id (see `InvocationEvent.id`): changes come in increasing id order."""
    invocation_id: str
    kind: EventKind

    @property
    def status(self) -> Status | None:
        """The status the invocation moved to; None for an event that is not a status (`planned`, `reconciled`,
        `checked`, `retried`)."""
        return self.kind if self.kind in STATUSES else None


class OutboxItem(BaseModel):
    """One message waiting in the ledger's outbox for one webhook (`target`): the named event `event_id` of the
    change feed, as the JSON `body` to send (built from redacted ledger data)."""

    model_config = ConfigDict(frozen=True)

    id: int
    target: str
    event_id: int
    body: str
    attempts: int = 0
    """Deliveries tried and failed so far."""


SourceState = Literal["starting", "ready", "down", "unavailable", "disabled"]
"""`down`: failed, retried with backoff. `unavailable`: cannot start until its configuration changes (a provider
whose credential is not bound: `binding_required`), so it is not retried. `disabled`: by policy."""


class SourceStatus(BaseModel):
    """What `bastion connectors list` shows for one source."""

    source_id: str
    state: SourceState
    tools: int = 0
    last_error: str | None = None
    since: datetime = Field(default_factory=utcnow)
    protocol_version: str | None = None
    server_name: str | None = None
    server_version: str | None = None


class PinObservation(BaseModel):
    """A definition of an action as seen at some moment: its two fingerprints and the wire-form definition."""

    fingerprint: str
    structural: str
    definition: dict[str, Any]
    seen_at: datetime = Field(default_factory=utcnow)


class Pin(BaseModel):
    """The trusted definition of one action, keyed by source and upstream tool name.

    `drift` holds the latest definition seen that differs from the pinned one, until an approver
    accepts it (re-pins) — drift never clears by itself.
    """

    source_id: str
    action_id: str
    pinned: PinObservation
    pinned_by: str | None = None
    """Who pinned it: `first-use` for trust on first use, `config` for an explicit pin, else a principal."""
    drift: PinObservation | None = None

    @property
    def key(self) -> str:
        return policy_key(self.source_id, self.action_id)


class RecoveryReport(BaseModel):
    """What a start-up found in the ledger: interrupted, approved-but-not-run and pending work."""

    unknown: list[str] = Field(default_factory=list)
    """Ids of `executing` invocations of a stopped process, now `unknown`."""
    approved: list[str] = Field(default_factory=list)
    """Ids of `approved` invocations of a stopped process that never started; they may be claimed and run."""
    pending: int = 0
    """How many `pending` invocations are kept, with their expiry, still decidable."""


APPROVER_ROLES: Final[frozenset[Role]] = frozenset({"owner", "admin"})


class Principal(BaseModel):
    """Who is acting: a token's name and role (and, for agent tokens, the profile its sessions use)."""

    model_config = ConfigDict(frozen=True)

    name: str
    role: Role
    profile: str | None = None

    @property
    def may_decide(self) -> bool:
        return self.role in APPROVER_ROLES


GrantScope = Literal["session", "hour", "always"]
"""The scopes that leave a standing grant behind."""


class Grant(BaseModel):
    """A standing approval: later calls of one action that it covers are allowed without an approver (mode source
    `grant:<id>`), as long as no operator rule denies or holds them on their arguments. Kept in the ledger: ended by
    its expiry or a revocation (by an approver, or by the action drifting from its pin), never deleted."""

    id: str
    policy_key: str
    scope: GrantScope
    session_id: str | None = None
    """For a "session" grant: the host session it covers."""
    principal: str | None = None
    """For an "hour" grant: the caller it covers (None: callers without a token)."""
    rule: str | None = None
    """A condition on the arguments (CEL, as in policy rules) a call must meet to be covered; None: any call."""
    grantor: str
    invocation_id: str | None = None
    """The call whose approval made it (None: imported from a file of an earlier Bastion)."""
    created_at: datetime
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    revoked_by: str | None = None
    """Who revoked it: an approver's name, or `drift` when the action's definition drifted from its pin."""

    def standing(self, now: datetime) -> bool:
        """Whether it still covers calls at `now`: not revoked, not expired."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def covers(self, *, session_id: str, principal: str | None) -> bool:
        """Whether a call in this session by this caller is one it was given for (its action and arguments aside)."""
        if self.scope == "session":
            return session_id == self.session_id
        if self.scope == "hour":
            return principal == self.principal
        return True


class TokenInfo(BaseModel):
    """A stored token, never its secret: the ledger keeps only the SHA-256 of it."""

    name: str
    role: Role
    profile: str | None = None
    created_at: datetime
    revoked_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True, slots=True)
class Guarantee:
    """What Bastion guarantees about the side effects it gates, as a guarantee level (G0 best effort, G1
    wrapper-enforced, G2 durable/transactional), declared by `bastion doctor` and `/healthz` so Bastion never
    claims more than its ledger gives."""

    level: str
    """`G1`: Bastion itself records every call's intent before sending it, and its outcome (or `unknown`) after."""
    scope: str
    """Where that holds: one machine (SQLite) or every instance sharing one PostgreSQL database."""
    recovery: str
    """What happens to the work of a Bastion that stopped."""
    not_g2: str
    """Why it is not G2."""


class ChainedEvent(BaseModel):
    """An event as the audit chain holds it (the ledger's tamper-evident history): its stored text and hashes."""

    id: int
    position: int
    """Its place in the chain: the event id on SQLite (one writer), the order of commit on PostgreSQL."""
    invocation_id: str | None
    """Its invocation; None for an event of a record chained beside invocations (`record`)."""
    record: str | None = None
    """The key of the token, pin or grant it records a change of (bastion.ledger.kept), or None."""
    seq: int
    kind: str
    at: datetime
    detail: str
    """The detail exactly as stored (JSON text): the hash covers this text."""
    prev_hash: str
    hash: str
    state: str | None = None
    """The digest of its invocation's (or record's) row after the change (bastion.ledger.chain.record_state); None
    for an event recorded before records were chained."""

    @property
    def subject(self) -> str:
        """What the chain hashes it as about: its invocation's id, or its record's key."""
        subject = self.invocation_id if self.record is None else self.record
        assert subject is not None, "an event is about an invocation or a record"
        return subject

    @property
    def about(self) -> str:
        """What it is about, for a person: `invocation inv_...` or `record token:7`."""
        return f"invocation {self.invocation_id}" if self.record is None else f"record {self.record}"


class Exported(NamedTuple):
    """One event of an audit export with what it is checked against (bastion.ledger.offline): its invocation as
    stored now, that row exactly as stored (`INVOCATION_COLUMNS` order), and the grant its detail names, if any. The
    event of a record (a token, pin or grant: bastion.ledger.kept) has no invocation, and its record's row."""

    event: ChainedEvent
    invocation: Invocation | None
    row: Sequence[Any]
    grant: Grant | None


class AuditCheckpoint(BaseModel):
    """Where pruning cut the chain: the last pruned event's position and hash, so what follows still verifies."""

    position: int
    event_id: int
    hash: str
    at: datetime
    events: int
    """How many events that prune removed."""
    invocations: int
    key: str | None = None
    """The public key that signed it (bastion.ledger.anchors); None for a checkpoint made before they were signed."""
    signature: str | None = None


class ChainBreak(BaseModel):
    """The first place the audit chain does not hold: an event whose hash is not that of its content (`hash`), whose
    previous hash is not the hash of the event before it (`link`: an event removed, inserted or reordered), a chain
    that does not end where the ledger's head of record says (`head`: its newest events removed), a checkpoint no
    prune made (`checkpoint`), an invocation row that is not what its events say (`record`), a chain that does not
    reach a signed anchor of its head (`anchor`), an approval of a held call without a valid signature (`decision`), or
    a call a grant let through that the grant does not cover (`grant`)."""

    event_id: int
    position: int
    reason: Literal["hash", "link", "head", "checkpoint", "record", "anchor", "decision", "grant"]
    message: str
    invocation_id: str | None = None
    """The invocation whose row broke it (reason `record`)."""


class AuditReport(BaseModel):
    """What `bastion audit verify` found: how many events verified, from which checkpoint, up to which head."""

    verified: int
    pre_chain: int = 0
    """Of them, the events recorded before records were chained (their hash covers the event alone)."""
    scrubbed: int = 0
    """Of them, the events a signed scrub changed (`bastion audit scrub`): their hash is the one the scrub signed."""
    anchors: int = 0
    """The signed anchors the chain was found to hold (`bastion audit verify --anchors`)."""
    trusted_keys: int = 0
    """How many public keys signatures were checked against (none: the checkpoint's signature was not checked)."""
    decisions: int = 0
    """The approvals of held calls whose signature was found to hold (checked only with trusted keys)."""
    decisions_unsigned: int = 0
    """Approvals recorded before decisions were signed: not checked."""
    grant_uses: int = 0
    """The calls grants let through, each found inside its grant's scope."""
    records: int = 0
    """The rows (invocations, tokens, pins, grants) found equal to the state their newest event carries."""
    records_not_covered: int = 0
    """The rows whose newest event is pre-chain (or was pruned under a kept step): not checked."""
    checkpoint: AuditCheckpoint | None = None
    head_id: int | None = None
    head_position: int | None = None
    head_hash: str | None = None
    """The hash of the newest event verified: anchor it elsewhere to notice a later rewrite of the whole history."""
    broken: ChainBreak | None = None


class ScrubReport(BaseModel):
    """What `bastion audit scrub` changed: invocations (rows or events), event details, outbox messages."""

    invocations: int
    events: int
    outbox: int


class PruneReport(BaseModel):
    """What a retention prune removed and, when it stopped early, the invocation it had to keep."""

    events: int
    invocations: int
    checkpoint: AuditCheckpoint | None = None
    kept_by: str | None = None
    """The oldest invocation still unresolved or too recent: pruning keeps a prefix of the chain, so it stops there."""
