"""Finding the twin of a held call, the same on both backends: the earlier call a retry attaches to instead of being
recorded (see `bastion.models.RetryWindow`). The backends run the statement in the transaction that would record the
retry, under their write lock (SQLite's, PostgreSQL's advisory lock on the twin's key), so of two retries that arrive
at once the second always finds what the first recorded.

A twin is a call of the same caller, policy key and arguments hash that was held for an approver and is not a step of
a composite. The caller is the token's principal; a caller without a token has no identity beyond its host session,
so its retries attach only within that session. A twin whose outcome is still to come (`bastion.states.OPEN`)
attaches at any age the ledger still looks at (`created_since`); one that ended (decided, expired, run, unknown) only
while its last change is recent (`decided_since`). The newest twin wins.
"""

from __future__ import annotations

from collections.abc import Callable

from bastion import states
from bastion.ledger.backend import INVOCATION_COLUMNS
from bastion.models import Invocation, RetryWindow


def twin_query(named: Callable[[str], str], invocation: Invocation) -> str:
    """The statement selecting the twin of `invocation` (`INVOCATION_COLUMNS`), with parameters named through
    `named` (`:x` for SQLite, `%(x)s` for PostgreSQL) and bound by `twin_params`."""
    who = (
        f"principal = {named('principal')}"
        if invocation.principal is not None
        else f"principal IS NULL AND session_id = {named('session_id')}"
    )
    waiting = ", ".join(f"'{status}'" for status in states.OPEN)  # the twin's outcome is still to come
    return f"""
        SELECT {", ".join(INVOCATION_COLUMNS)} FROM invocations
        WHERE policy_key = {named("policy_key")} AND args_hash = {named("args_hash")}
            AND mode = 'require_approval' AND parent_id IS NULL AND {who}
            AND created_at >= {named("created_since")}
            AND (status IN ({waiting}) OR updated_at >= {named("decided_since")})
        ORDER BY created_at DESC
        LIMIT 1
    """


def twin_params(invocation: Invocation, window: RetryWindow) -> dict[str, object]:
    """The parameters of `twin_query` (the window's moments as datetimes: a backend converts them as it stores
    time)."""
    return {
        "principal": invocation.principal,
        "session_id": invocation.session_id,
        "policy_key": invocation.policy_key,
        "args_hash": invocation.args_hash,
        "created_since": window.created_since,
        "decided_since": window.decided_since,
    }


def twin_key(invocation: Invocation) -> str:
    """What two retries of one call share: the key a backend serialises their look-ups on."""
    who = (
        f"principal {invocation.principal}" if invocation.principal is not None else f"session {invocation.session_id}"
    )
    return f"{who} {invocation.policy_key} {invocation.args_hash}"
