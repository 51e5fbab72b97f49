"""Scoped approvals: an approver approves a call "once", "for this session", "for an hour" or "always".

- `once`: this call only.
- `session`: later calls of the same action in the same host session, for at most `SESSION_GRANT`. Offered only
  where the host has a session: a 2026-07-28 host has none (Bastion counts its calls by caller, principal and
  client name, which would make "this session" last as long as the caller's token), so it is offered "for an
  hour" instead.
- `hour`: later calls of the same action by the same caller (its token; without tokens, any caller) for an hour.
- `always`: later calls of the same action by anyone, until `[approvals] always_grant_days` have passed. Not offered
  on the embedded default configuration, where no operator chose the policy an approval would widen for good.

Every scope but `once` leaves a grant (bastion.models.Grant): a record in the ledger, stored in the transaction of
the approval itself (an approval never holds without its grant, nor a grant without its approval), saying who
granted what, for which session or caller, under which condition, until when. The approver may narrow it with a
condition on the arguments, in the CEL of policy rules (`normpath(args.path).startsWith("/srv/public/")`): a call
it does not hold for, or that it cannot be decided on, is not covered. `bastion grants list|revoke`, the API and
the inbox show and revoke standing grants; every instance sharing the ledger sees a grant or its revocation on the
next call it would hold.

A grant sits beside the operator's rules, never among them (`bastion.policies.resolve_mode`): the operator's rules
decide first, and a grant only lifts a `require_approval` that a key's plain mode or the risk's default gave (a
"session" or "hour" grant also a profile's). No grant undoes a deny, and a call a rule on its arguments holds stays
held. A call a grant lets through names it: mode source `grant:<id>`.

A call that policy marks for two-person approval (`[approvers]`: several distinct approvers for each call) takes no
standing grant: only "once" is offered, and no grant lifts its hold. A grant is one approver's word for later
calls, the very thing two-person approval refuses; asking both approvers to agree on a scope would still let a
later call through with nobody looking at it.

A grant ends when its action's definition drifts from its pin (revoked by `drift`): what was approved was another
definition, and accepting the drift does not silently bring it back.
"""

from __future__ import annotations

import logging
import re
import secrets
import tomllib
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from bastion.config import Config
from bastion.config.conditions import ConditionError, Conditions, compile_condition, raw_path_prefixes
from bastion.config.loader import APPROVED_FILE
from bastion.errors import ConfigError, InvalidArguments
from bastion.models import SCOPES, Grant, Invocation, PolicyRule, Scope, has_host_session, policy_key
from bastion.pipeline.seams import GrantStore

logger = logging.getLogger(__name__)

SESSION_GRANT: Final = timedelta(hours=12)
"""How long a "session" grant lasts at most (a host session usually ends sooner; its id never comes back)."""
HOUR_GRANT: Final = timedelta(hours=1)
_ONE_ACTION: Final = re.compile(r"^[a-z0-9_-]+:[^\s*]+$")
DRIFT: Final = "drift"
"""Who revoked the grants of an action that drifted from its pin."""

SCOPE_LABELS: Final[dict[Scope, str]] = {
    "once": "once",
    "session": "for this session",
    "hour": "for an hour",
    "always": "always",
}
"""How each scope reads to an approver."""


class Grants:
    """The standing grants of one ledger: which scopes an approval of a call may take, the grant it leaves, and the
    grant (if any) that covers a call."""

    def __init__(self, store: GrantStore, *, always_days: float | None) -> None:
        """`always_days`: how long an "always" grant lasts; None where "always" is not offered (the embedded
        default)."""
        self.store = store
        self.always_days = always_days
        self._conditions = Conditions([])
        """The grants' conditions, compiled once each (on first use)."""

    @classmethod
    def of(cls, store: GrantStore, config: Config) -> Grants:
        """The grants of `config`'s ledger: "always" lasts `[approvals] always_grant_days`, and is not offered on the
        embedded default (it has no configuration directory)."""
        days = None if config.directory is None else config.settings.approvals.always_grant_days
        return cls(store, always_days=days)

    def offered(self, invocation: Invocation, *, approvers: int = 1) -> tuple[Scope, ...]:
        """The scopes an approval of `invocation` (which needs `approvers` distinct approvers) may take here,
        narrowest first."""
        return tuple(scope for scope in SCOPES if self._unavailable(invocation, scope, approvers) is None)

    def check(self, invocation: Invocation, scope: str, rule: str | None, *, approvers: int = 1) -> None:
        """Raise (InvalidArguments, or ConfigError for "always" on the embedded default) when an approval of
        `invocation` (which needs `approvers` distinct approvers) with `scope` and `rule` cannot be given: checked
        before anything is decided, so a refused scope leaves the call pending."""
        if scope not in SCOPES:
            raise InvalidArguments(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
        unavailable = self._unavailable(invocation, scope, approvers)
        if unavailable is not None:
            offered = _either(self.offered(invocation, approvers=approvers))
            if scope == "always" and self.always_days is None:
                raise ConfigError(f"{unavailable}; approve {offered}")
            raise InvalidArguments(f"{unavailable}; approve {offered}")
        if rule is None:
            return
        if scope == "once":
            standing = _either([s for s in self.offered(invocation, approvers=approvers) if s != "once"])
            raise InvalidArguments(
                f'a condition narrows a standing grant, and "once" approves this call only; drop the condition or '
                f"choose {standing}"
            )
        try:
            compile_condition(rule)
        except ConditionError as exc:
            raise InvalidArguments(f"the grant's condition: {exc}") from exc
        problems = raw_path_prefixes(rule)
        if problems:
            raise InvalidArguments(f"the grant's condition {problems[0]}")

    def make(self, invocation: Invocation, scope: Scope, rule: str | None, *, by: str, now: datetime) -> Grant | None:
        """The grant an approval of `invocation` with `scope` leaves (None for "once"); `check` it first."""
        if scope == "once":
            return None
        if scope == "session":
            lasts = SESSION_GRANT
        elif scope == "hour":
            lasts = HOUR_GRANT
        else:
            assert self.always_days is not None  # `check` refuses "always" otherwise
            lasts = timedelta(days=self.always_days)
        return Grant(
            id=f"{scope}_{secrets.token_hex(6)}",
            policy_key=invocation.policy_key,
            scope=scope,
            session_id=invocation.session_id if scope == "session" else None,
            principal=invocation.principal if scope == "hour" else None,
            rule=rule,
            grantor=by,
            invocation_id=invocation.id,
            created_at=now,
            expires_at=now + lasts,
        )

    async def covering(
        self, key: str, *, session_id: str, principal: str | None, arguments: Mapping[str, Any], now: datetime
    ) -> Grant | None:
        """The oldest grant standing at `now` that covers a call of `key` in this session by this caller with these
        arguments (its condition, if any, holds for them)."""
        for grant in await self.store.covering(key, session_id=session_id, principal=principal, now=now):
            if grant.rule is None:
                return grant
            if self._conditions.holds(PolicyRule(key=key, when=grant.rule, mode="allow"), arguments) is True:
                return grant
        return None

    async def revoke_drifted(self, source_id: str, action_id: str, *, now: datetime) -> None:
        """The action drifted from its pin: end its grants."""
        key = policy_key(source_id, action_id)
        ended = await self.store.revoke_key(key, by=DRIFT, now=now)
        if ended:
            logger.warning(
                "%s drifted from its pin: its grants are revoked (%s)", key, ", ".join(grant.id for grant in ended)
            )

    async def import_approved_file(self, directory: Path | None, *, now: datetime) -> list[Grant]:
        """Bring in the "always" approvals an earlier Bastion wrote to `policies/bastion-approved.toml`: each
        `"source:action" = "allow"` entry becomes an "always" grant from `now`, and the file is renamed
        `bastion-approved.toml.imported` first (so of several instances starting at once, one imports it). A file
        that cannot be read grants nothing (the log says how to retry); the grants made."""
        if directory is None or self.always_days is None:
            return []
        path = directory / "policies" / APPROVED_FILE
        imported = path.with_name(f"{APPROVED_FILE}.imported")
        try:
            path.rename(imported)
        except FileNotFoundError:
            return []
        try:
            modes = tomllib.loads(imported.read_text(encoding="utf-8")).get("modes", {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            logger.error(
                "%s cannot be read (%s): its approvals were not imported; fix it and rename it back to %s to retry",
                imported,
                exc,
                APPROVED_FILE,
            )
            return []
        keys = (
            [key for key, value in modes.items() if value == "allow" and _ONE_ACTION.match(key)]
            if isinstance(modes, dict)
            else []
        )
        grants = [
            Grant(
                id=f"always_{secrets.token_hex(6)}",
                policy_key=key,
                scope="always",
                grantor=f"policies/{APPROVED_FILE}",
                created_at=now,
                expires_at=now + timedelta(days=self.always_days),
            )
            for key in keys
        ]
        try:
            for grant in grants:
                await self.store.add(grant)
        except BaseException:
            imported.rename(path)  # nothing is lost: the next start imports it again
            raise
        logger.warning(
            'imported %d "always" approval(s) from %s into the ledger as grants (see `bastion grants list`); the '
            "file was renamed %s",
            len(grants),
            path,
            imported.name,
        )
        return grants

    def _unavailable(self, invocation: Invocation, scope: Scope, approvers: int) -> str | None:
        """Why an approval of `invocation` cannot take `scope` here; None when it can."""
        if scope != "once" and approvers > 1:
            return (
                f"{invocation.policy_key} needs {approvers} distinct approvers for each call, and a standing grant "
                "would let later calls through on one approver's word"
            )
        if scope == "session" and not has_host_session(invocation.session_id):
            return (
                f'the host that made {invocation.id} has no session (2026-07-28 hosts do not keep one), so "for this '
                'session" would last as long as its token'
            )
        if scope == "always" and self.always_days is None:
            return (
                "this Bastion runs on its embedded default configuration, where no operator chose the policy an "
                '"always" approval would widen; run it with --config DIR (see `bastion init DIR`)'
            )
        return None


def _either(scopes: Sequence[Scope]) -> str:
    """`"a", "b" or "c"`."""
    quoted = [f'"{scope}"' for scope in scopes]
    return " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)
