"""What the contract's tests store: invocations, pins, and the moments they happen at."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

from bastion.ledger import OpenLedger
from bastion.models import Invocation, Pin, PinObservation

CANARY: Final = "ghp_" + "Zq8" * 12
"""Looks like a GitHub token to the redactor: it must never be stored in an invocation."""
T0: Final = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
EXPIRY: Final = T0 + timedelta(minutes=5)
BEFORE_EXPIRY: Final = T0 + timedelta(minutes=1)


def make_invocation(number: int = 1, **overrides: Any) -> Invocation:
    """Invocation `inv-<number>`, pending, created `number` seconds after T0, with `overrides` applied."""
    fields: dict[str, Any] = {
        "id": f"inv-{number:04d}",
        "status": "pending",
        "policy_key": "fs:write_file",
        "tool": "fs__write_file",
        "source_id": "fs",
        "action_id": "write_file",
        "risk": "write",
        "mode": "require_approval",
        "mode_source": "org",
        "session_id": "session-a",
        "args": {"path": "/tmp/x", "content": "héllo ✓"},
        "args_hash": "0" * 64,
        "created_at": T0 + timedelta(seconds=number),
        "updated_at": T0 + timedelta(seconds=number),
    }
    fields.update(overrides)
    return Invocation(**fields)


async def add_pending(ledger: OpenLedger, number: int = 1, **overrides: Any) -> str:
    """Record a pending invocation expiring at EXPIRY (unless overridden); its id."""
    invocation = make_invocation(number, **({"expires_at": EXPIRY} | overrides))
    await ledger.invocations.record(invocation, ["planned", "pending"])
    return invocation.id


def observation(version: int, **definition: Any) -> PinObservation:
    return PinObservation(
        fingerprint=f"{version:064x}",
        structural=f"{version + 1000:064x}",
        definition={"name": "write_file", "description": f"version {version}", **definition},
        seen_at=T0 + timedelta(minutes=version),
    )


def make_pin(source_id: str, action_id: str, *, drifted: bool = False, pinned_by: str | None = "first-use") -> Pin:
    return Pin(
        source_id=source_id,
        action_id=action_id,
        pinned=observation(1),
        pinned_by=pinned_by,
        drift=observation(2) if drifted else None,
    )


def unsigned(detail: dict[str, Any]) -> dict[str, Any]:
    """A decision event's detail without its signature (bastion.ledger.decisions), which must be there."""
    rest = dict(detail)
    assert set(rest.pop("signed")) == {"key", "signature"}, "a decision is signed"
    return rest
