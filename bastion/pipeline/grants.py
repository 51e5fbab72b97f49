"""Scoped approvals: an approver approves a call "once", "for this session" or "always".

- `once`: this call only (what every decision did before).
- `session`: later calls of the same action in the same host session are allowed (mode source `session`). Kept in
  this process's memory: it ends when Bastion stops, and other instances sharing the ledger do not know of it.
- `always`: an entry `"source:action" = "allow"` in the policy file Bastion owns (bastion.config.approved), so later
  calls are allowed (mode source `always`) in every process that loads the configuration (a running one within a
  second: it reads the file again when it changes).

A grant sits beside the operator's rules, never among them: the operator's rules decide first, and a grant only
lifts the `require_approval` of a key's plain mode or of the risk's default (`bastion.policies.granted_mode`). No
grant undoes a deny, and a call that a rule on its arguments holds stays held.

Both are revoked when the action's definition drifts from its pin: what was approved is another definition. Drift
tightens `allow` anyway (DESIGN.md §5); revoking means accepting the drift does not silently bring them back.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Final, Literal, get_args

from bastion.config.approved import ApprovedModes
from bastion.models import Invocation

logger = logging.getLogger(__name__)

Scope = Literal["once", "session", "always"]
SCOPES: Final[tuple[Scope, ...]] = get_args(Scope)


class Grants:
    """The "session" and "always" approvals the gateway's mode resolution consults."""

    def __init__(self, approved: ApprovedModes) -> None:
        self.approved = approved
        self._sessions: set[tuple[str, str]] = set()

    def scope_of(self, session_id: str, key: str) -> Scope | None:
        """The standing grant that covers `key` (`source:action`) in this session: "session", "always" or None."""
        if (session_id, key) in self._sessions:
            return "session"
        if self.approved.current().get(key) == "allow":
            return "always"
        return None

    def check(self, invocation: Invocation, scope: Scope) -> None:
        """Raise (ConfigError) when an approval of `invocation` with `scope` could not be recorded: checked before
        the decision, so an approval never holds without the grant it was given with."""
        if scope == "always":
            self.approved.check(invocation.policy_key)

    def grant(self, invocation: Invocation, scope: Scope, *, by: str, now: datetime) -> None:
        """Record the scope of an approval of `invocation` (nothing more for "once")."""
        if scope == "session":
            self._sessions.add((invocation.session_id, invocation.policy_key))
        elif scope == "always":
            self.approved.add(invocation.policy_key, by=by, invocation_id=invocation.id, at=now)

    def revoke(self, source_id: str, action_id: str) -> None:
        """The action drifted: forget its approvals beyond "once"."""
        key = f"{source_id}:{action_id}"
        self._sessions = {granted for granted in self._sessions if granted[1] != key}
        if self.approved.revoke(key):
            logger.warning('%s drifted from its pin: its "always" approval is revoked (%s)', key, self.approved.path)
