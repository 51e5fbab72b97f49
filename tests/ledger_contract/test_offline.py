"""An export verified offline (bastion.ledger.offline): the lines `bastion audit export` writes, read back with the
anchors and the public key only, make the report `verify` makes on the ledger, and a line changed after the export
breaks it. Both on every backend."""

from __future__ import annotations

import json

import pytest

from bastion.ledger import OpenLedger
from bastion.ledger.anchors import public_text, sign_anchor, trusted_keys
from bastion.ledger.offline import _parsed, export_line, verify_export
from bastion.ledger.verify import verify_signed
from tests.ledger_contract.samples import BEFORE_EXPIRY, T0
from tests.ledger_contract.test_signed_decisions import _approved_with_grant, held_with_preview
from tests.ledger_contract.test_tampering import SIGNING_KEY

pytestmark = pytest.mark.anyio


async def _exported(ledger: OpenLedger) -> list[str]:
    return [json.dumps(export_line(exported)) for exported in await ledger.audit.export(0, 10_000)]


async def test_an_export_verifies_offline_as_the_ledger_does(ledger: OpenLedger) -> None:
    await _approved_with_grant(ledger)
    trusted = trusted_keys(ledger.key_path, [])
    online = await verify_signed(ledger.audit, [], trusted)
    head = await ledger.audit.head()
    anchor = sign_anchor(SIGNING_KEY, head[0], head[1], T0)
    lines = [_parsed(number, text) for number, text in enumerate(await _exported(ledger), start=1)]
    offline = await verify_export(lines, [anchor], [*trusted, public_text(SIGNING_KEY)])
    assert offline.broken is None, offline.broken
    assert (offline.verified, offline.records, offline.decisions, offline.grant_uses, offline.anchors) == (
        online.verified,
        online.records,
        1,
        1,
        1,
    )


@pytest.mark.parametrize("change", ["row", "detail", "grant"])
async def test_a_line_changed_after_the_export_breaks_it(ledger: OpenLedger, change: str) -> None:
    await _approved_with_grant(ledger)
    trusted = trusted_keys(ledger.key_path, [])
    texts = await _exported(ledger)
    approved = next(i for i, text in enumerate(texts) if json.loads(text)["kind"] == "approved" and "grant" in text)
    line = json.loads(texts[approved])
    if change == "row":
        line["stored"]["row"][1] = "completed"  # the status, in the row the chain's state covers
    elif change == "detail":
        line["stored"]["detail"] = line["stored"]["detail"].replace('"alice"', '"mallory"')
    else:
        line["stored"]["grant"]["scope"] = "always"
    texts[approved] = json.dumps(line)
    lines = [_parsed(number, text) for number, text in enumerate(texts, start=1)]
    report = await verify_export(lines, [], trusted)
    assert report.broken is not None
    assert report.broken.reason == {"row": "record", "detail": "hash", "grant": "decision"}[change]


async def test_an_anchor_the_export_does_not_reach_breaks_it(ledger: OpenLedger) -> None:
    await _approved_with_grant(ledger)
    lines = [_parsed(number, text) for number, text in enumerate(await _exported(ledger), start=1)]
    head = await ledger.audit.head()
    beyond = sign_anchor(SIGNING_KEY, head[0] + 5, "e" * 64, BEFORE_EXPIRY)
    report = await verify_export(lines, [beyond], [public_text(SIGNING_KEY)])
    assert report.broken is not None and report.broken.reason == "anchor"


async def test_a_preview_changed_in_an_export_breaks_the_approval_made_on_it(ledger: OpenLedger) -> None:
    held = await held_with_preview(ledger)
    await ledger.invocations.decide(held, approve=True, principal="alice", note=None, now=BEFORE_EXPIRY)
    trusted = trusted_keys(ledger.key_path, [])
    texts = await _exported(ledger)
    lines = [_parsed(number, text) for number, text in enumerate(texts, start=1)]
    assert (await verify_export(lines, [], trusted)).broken is None
    pending = next(i for i, text in enumerate(texts) if json.loads(text)["kind"] == "pending")
    line = json.loads(texts[pending])
    line["stored"]["detail"] = line["stored"]["detail"].replace("+new", "+harmless")
    texts[pending] = json.dumps(line)
    report = await verify_export([_parsed(n, text) for n, text in enumerate(texts, start=1)], [], trusted)
    assert report.broken is not None
