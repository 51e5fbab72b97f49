"""What a ledger keeps at rest: no secret through any write, values truncated to the redactor's budget, and a
hash of the raw arguments that is keyed with the store's own secret."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from bastion.ledger import OpenLedger, Redactor
from bastion.policies import canonical_json
from tests.ledger_contract.backends import Backend
from tests.ledger_contract.samples import BEFORE_EXPIRY, CANARY, EXPIRY, make_invocation

pytestmark = pytest.mark.anyio


async def everything_stored(ledger: OpenLedger) -> str:
    """All an invocation store reads back: every invocation (args, result, messages) and every event's detail."""
    invocations = await ledger.invocations.list(limit=1000)
    events = [event for invocation in invocations for event in await ledger.invocations.events(invocation.id)]
    return json.dumps(
        [invocation.model_dump(mode="json") for invocation in invocations]
        + [event.model_dump(mode="json") for event in events],
        ensure_ascii=False,
    )


async def test_secrets_are_never_stored_whatever_write_carries_them(ledger: OpenLedger) -> None:
    """Through record, record_pending, transition, finish and decide: in args, results, error messages, notes
    and event details."""
    secret_args = {"note": f"use {CANARY}", "api_key": "plain-secret-value", "list": [f"Bearer {CANARY}"]}
    await ledger.invocations.record(
        make_invocation(1, args=secret_args, error_message=f"failed with token={CANARY}"),
        ["planned", "pending"],
        {"why": CANARY},
    )
    await ledger.invocations.transition(
        "inv-0001",
        from_statuses=["pending"],
        to="denied",
        detail={"header": f"Authorization: Bearer {CANARY}"},
        fields={"result": {"text": json.dumps({"secret": CANARY})}, "error_message": f"x {CANARY}"},
    )
    assert (
        await ledger.invocations.record_pending(
            make_invocation(2, args=secret_args, expires_at=EXPIRY), ["planned", "pending"], {"cookie": "c"}, limit=5
        )
        is None
    )
    await ledger.invocations.decide(
        "inv-0002", approve=False, principal="bob", note=f"leaked {CANARY}", now=BEFORE_EXPIRY
    )
    await ledger.invocations.record(
        make_invocation(3, status="executing", args=secret_args), ["planned", "approved", "executing"]
    )
    await ledger.invocations.finish(
        "inv-0003",
        "failed",
        result={"content": [{"type": "text", "text": f"token={CANARY}"}]},
        error_class="upstream_error",
        error_message=f"upstream said password=hunter22 and {CANARY}",
    )
    await ledger.invocations.record(make_invocation(4, expires_at=EXPIRY), ["planned", "pending"])
    await ledger.invocations.decide("inv-0004", approve=True, principal="alice", note=f"ok {CANARY}", now=BEFORE_EXPIRY)

    stored = await everything_stored(ledger)
    assert CANARY not in stored
    assert "plain-secret-value" not in stored
    assert "hunter22" not in stored
    assert "[REDACTED]" in stored
    first = await ledger.invocations.get("inv-0001")
    assert first is not None
    assert first.args["api_key"] == "[REDACTED]"
    assert first.args["note"].startswith("use ")


async def test_the_ledgers_own_secret_keys_are_redacted(backend: Backend, tmp_path: Path) -> None:
    async with await backend.open_fresh(tmp_path, Redactor(extra_secret_keys=["pin_code"])) as ledger:
        await ledger.invocations.record(make_invocation(args={"pin_code": "4711", "path": "/x"}), ["planned"])
        stored = await ledger.invocations.get("inv-0001")
    assert stored is not None
    assert stored.args == {"pin_code": "[REDACTED]", "path": "/x"}


async def test_large_results_are_stored_truncated_to_max_bytes(backend: Backend, tmp_path: Path) -> None:
    async with await backend.open_fresh(tmp_path, Redactor(max_bytes=1024)) as ledger:
        await ledger.invocations.record(make_invocation(status="executing"), ["planned"])
        result = {"content": [{"type": "text", "text": "x" * 100_000}]}
        updated = await ledger.invocations.transition(
            "inv-0001", from_statuses=["executing"], to="completed", fields={"result": result}
        )
        stored = await ledger.invocations.get("inv-0001")
    assert updated is not None
    assert stored == updated
    assert len(json.dumps(updated.result, ensure_ascii=False, separators=(",", ":")).encode()) <= 1024
    assert "[truncated" in updated.result["content"][0]["text"]


async def test_large_args_and_details_are_stored_truncated_and_still_json(backend: Backend, tmp_path: Path) -> None:
    async with await backend.open_fresh(tmp_path, Redactor(max_bytes=256)) as ledger:
        await ledger.invocations.record(
            make_invocation(args={"blob": "é" * 10_000, "items": list(range(1000))}),
            ["planned", "denied"],
            {"reason": "r" * 10_000},
        )
        stored = await ledger.invocations.get("inv-0001")
        events = await ledger.invocations.events("inv-0001")
    assert stored is not None
    assert len(json.dumps(stored.args, ensure_ascii=False, separators=(",", ":")).encode()) <= 256
    assert len(json.dumps(events[-1].detail, ensure_ascii=False, separators=(",", ":")).encode()) <= 256


# -- the keyed hash of the arguments ---------------------------------------------------------------------------

ARGUMENTS: dict[str, Any] = {"path": "/etc/hosts", "password": "123456"}


async def test_an_argument_hash_is_keyed_so_two_ledgers_hash_the_same_arguments_differently(
    backend: Backend, tmp_path: Path
) -> None:
    async with (
        await backend.open_fresh(tmp_path / "one", Redactor()) as one,
        await backend.open_fresh(tmp_path / "two", Redactor()) as two,
    ):
        first, second = one.invocations.hash_args(ARGUMENTS), two.invocations.hash_args(ARGUMENTS)
        assert first != second
        assert hashlib.sha256(canonical_json(ARGUMENTS)).hexdigest() not in (first, second)
        assert one.invocations.args_match(ARGUMENTS, first)
        assert not one.invocations.args_match(ARGUMENTS, second)
        assert not two.invocations.args_match(ARGUMENTS, first)


async def test_args_match_only_the_arguments_that_were_hashed(ledger: OpenLedger) -> None:
    stored = ledger.invocations.hash_args(ARGUMENTS)
    assert stored == ledger.invocations.hash_args(dict(reversed(ARGUMENTS.items())))  # canonical: key order is moot
    assert ledger.invocations.args_match(ARGUMENTS, stored)
    assert not ledger.invocations.args_match(ARGUMENTS | {"password": "123457"}, stored)
    assert not ledger.invocations.args_match({"path": "/etc/hosts"}, stored)
    assert not ledger.invocations.args_match(ARGUMENTS, "")
    # A hash recorded before hashes were keyed still lets an approval that was waiting then run.
    assert ledger.invocations.args_match(ARGUMENTS, hashlib.sha256(canonical_json(ARGUMENTS)).hexdigest())


async def test_another_connection_to_the_same_store_shares_its_key(ledger: OpenLedger, another: OpenLedger) -> None:
    stored = ledger.invocations.hash_args(ARGUMENTS)
    await ledger.invocations.record(make_invocation(args=ARGUMENTS, args_hash=stored), ["planned", "pending"])
    recorded = await another.invocations.get("inv-0001")
    assert recorded is not None
    assert another.invocations.hash_args(ARGUMENTS) == stored
    assert another.invocations.args_match(ARGUMENTS, recorded.args_hash)
    assert recorded.args == {"path": "/etc/hosts", "password": "[REDACTED]"}
