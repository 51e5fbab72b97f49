"""Scoped approvals (issue 14): an approver approves a call "once", "for this session" or "always".

- `once`: this call only (what every decision did before).
- `session`: later calls of the same action in the same host session are allowed (mode source `session`). Kept in
  this process's memory: it ends when Bastion stops, and other instances sharing the ledger do not know of it.
- `always`: an organisation mode entry `"source:action" = "allow"` in the policy file Bastion owns
  (bastion.config.approved), so the next call resolves `allow` with mode source `org`, in every process that loads
  the configuration (a running one within a second: it reads the file again when it changes).

Both are revoked when the action's definition drifts from its pin: what was approved is another definition. Drift
tightens `allow` anyway (DESIGN.md §5); revoking means accepting the drift does not silently bring them back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Final, Literal, get_args

from bastion.config.approved import ApprovedModes
from bastion.models import Invocation, ModeDecision

logger = logging.getLogger(__name__)

Scope = Literal["once", "session", "always"]
SCOPES: Final[tuple[Scope, ...]] = get_args(Scope)
SESSION_SOURCE: Final = "session"
"""The mode source of a call allowed by a "for this session" approval."""


class Grants:
    """The "session" and "always" approvals the gateway's mode resolution consults."""

    def __init__(self, approved: ApprovedModes) -> None:
        self.approved = approved
        self._sessions: set[tuple[str, str]] = set()

    def org_modes(self, modes: Mapping[str, str]) -> Mapping[str, str]:
        """The organisation map with the "always" approvals laid over it (never over a `deny`)."""
        approved = self.approved.current()
        if not approved:
            return modes
        merged = dict(modes)
        for key, mode in approved.items():
            if merged.get(key) != "deny":
                merged[key] = mode
        return merged

    def for_session(self, decision: ModeDecision, session_id: str, key: str) -> ModeDecision:
        """`decision`, or `allow` when it asks for approval and the session holds a "for this session" approval."""
        if decision.mode == "require_approval" and (session_id, key) in self._sessions:
            return ModeDecision(mode="allow", source=SESSION_SOURCE)
        return decision

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
