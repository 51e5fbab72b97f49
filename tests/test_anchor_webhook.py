"""Anchors POSTed to a webhook (`[ledger] anchor_url`): a real receiver on loopback gets each anchor, signed as every
webhook message is; what it received, written to a file line by line, verifies with the ledger's public key; an
anchor it does not take is kept in the ledger's outbox and sent first at the next anchoring, even by another
process, on both ledgers. `bastion audit anchor --to URL`, `bastion serve`'s anchoring, and URLs refused with the
fix."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from pydantic import ValidationError

from bastion import assembly
from bastion.config import LedgerSettings, load_config
from bastion.ledger import OpenLedger, Redactor, open_ledger
from bastion.ledger.anchors import (
    Anchor,
    Anchoring,
    load_or_create_signing_key,
    public_text,
    read_anchors,
    signing_key_path_for,
    trusted_keys,
)
from bastion.ledger.verify import verify_signed
from bastion.pipeline.notify import AnchorWebhook, anchor_target
from tests.ledger_contract.backends import BACKENDS, Backend
from tests.ledger_contract.samples import add_pending
from tests.processes import bastion_command, bastion_env, write_config
from tests.test_api import WAIT
from tests.test_webhooks import SECRET, Receiver, receiving, valid_signature

pytestmark = pytest.mark.anyio


@pytest.fixture(params=BACKENDS, ids=lambda backend: backend.name)
def backend(request: pytest.FixtureRequest) -> Backend:
    chosen: Backend = request.param
    return chosen


@asynccontextmanager
async def anchoring_to(ledger: OpenLedger, url: str, path: Path | None = None) -> AsyncIterator[Anchoring]:
    """Anchoring as `bastion serve` does it (one process's lifetime): to `url`, and to the file `path` if given."""
    key = load_or_create_signing_key(signing_key_path_for(ledger.key_path))
    async with httpx2.AsyncClient() as http:
        yield Anchoring(ledger.audit, key, path, AnchorWebhook(ledger.outbox, url, SECRET, http=http))


def received_file(receiver: Receiver, path: Path) -> list[Anchor]:
    """What an operator's receiver keeps: each body it took, one line each; read back as `audit verify` reads it."""
    path.write_bytes(b"".join(body + b"\n" for _, body, status in receiver.requests if status == 204))
    return read_anchors(path)


async def test_each_anchor_is_posted_signed_and_what_the_receiver_keeps_verifies_with_the_public_key(
    backend: Backend, tmp_path: Path
) -> None:
    async with await backend.open_fresh(tmp_path, Redactor()) as ledger, receiving() as receiver:
        await add_pending(ledger, 1)
        async with anchoring_to(ledger, receiver.url) as anchors:
            first = await anchors.once()
            unmoved = await anchors.once()
            await add_pending(ledger, 2)
            second = await anchors.once()
        public = public_text(load_or_create_signing_key(signing_key_path_for(ledger.key_path)))
        received = received_file(receiver, tmp_path / "received.jsonl")
        report = await verify_signed(ledger.audit, received, [public])
        forged = received[0].model_copy(update={"hash": "0" * 64})
        refused = await verify_signed(ledger.audit, [forged, received[1]], [public])

    assert first is not None and second is not None and unmoved is None, "an unmoved head is not sent again"
    assert received == [first, second]
    assert [status for _, _, status in receiver.requests] == [204, 204]
    for (headers, body, _), anchor in zip(receiver.requests, received, strict=True):
        assert valid_signature(headers, body)
        assert (headers["x-bastion-event"], headers["x-bastion-event-id"]) == ("audit_anchor", str(anchor.position))
        assert headers["content-type"] == "application/json"
    assert report.broken is None, report.broken
    assert report.anchors == 2
    assert refused.broken is not None and refused.broken.reason == "anchor"


async def test_an_anchor_the_receiver_does_not_take_is_kept_and_sent_first_at_the_next_anchoring(
    backend: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    file = tmp_path / "anchors.jsonl"
    async with await backend.open_fresh(tmp_path, Redactor()) as ledger, receiving() as receiver:
        await add_pending(ledger, 1)
        receiver.down = True
        with caplog.at_level(logging.WARNING, logger="bastion.pipeline.notify"):
            async with anchoring_to(ledger, receiver.url, file) as anchors:
                first = await anchors.once()
        assert [status for _, _, status in receiver.requests] == [503]
        assert read_anchors(file) == [first], "the file keeps it all the same"
        pending = await ledger.outbox.next_due(anchor_target(receiver.url))

        receiver.down = False
        await add_pending(ledger, 2)
        async with await backend.open_another(ledger, Redactor()) as restarted:  # another process, later
            async with anchoring_to(restarted, receiver.url, file) as anchors:
                second = await anchors.once()
            left = await restarted.outbox.next_due(anchor_target(receiver.url))

    assert first is not None and second is not None
    assert pending is not None and left is None
    assert [body["position"] for _, body in receiver.accepted()] == [first.position, second.position], "oldest first"
    assert received_file(receiver, tmp_path / "received.jsonl") == read_anchors(file) == [first, second]
    (warning,) = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert receiver.url in warning and "HTTP 503" in warning, "the log names the URL and what went wrong"
    assert "anchor_url" in warning, "and what to check"


def test_an_anchor_url_must_be_https_or_reach_this_machine_and_needs_a_secret() -> None:
    for url in ("https://anchors.example.com/in", "http://127.0.0.1:9000/in", "http://localhost/in", "http://[::1]/"):
        assert LedgerSettings(anchor_url=url, anchor_secret=SECRET).anchor_url == url  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="plain http"):
        LedgerSettings(anchor_url="http://anchors.example.com/in", anchor_secret=SECRET)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="https://"):
        LedgerSettings(anchor_url="ftp://anchors.example.com/in", anchor_secret=SECRET)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="anchor_secret"):
        LedgerSettings(anchor_url="https://anchors.example.com/in")


def test_a_bad_anchor_url_in_bastion_toml_is_reported_at_its_line_and_the_rest_of_the_ledger_table_holds(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    toml = config / "bastion.toml"
    toml.write_text(
        toml.read_text()
        + '[ledger]\nanchor_file = "anchors.jsonl"\nanchor_url = "http://anchors.example.com/in"\n'
        + 'anchor_secret = "s"\n'
    )
    line = toml.read_text().splitlines().index('anchor_url = "http://anchors.example.com/in"') + 1
    loaded = load_config(config)
    (issue,) = loaded.issues
    assert (issue.file, issue.line, issue.error_class) == (toml, line, "config_error")
    assert "https" in issue.message and "anchor_url" in issue.message
    assert loaded.settings.ledger.anchor_url is None
    assert loaded.anchor_file == config / "anchors.jsonl"


async def test_serve_s_anchoring_sends_to_the_configured_url_alone(tmp_path: Path) -> None:
    config_dir = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    async with receiving() as receiver:
        toml = config_dir / "bastion.toml"
        toml.write_text(toml.read_text() + f'[ledger]\nanchor_url = "{receiver.url}"\nanchor_secret = "{SECRET}"\n')
        config = load_config(config_dir)
        assert config.issues == [] and config.anchor_file is None
        async with await open_ledger(config.ledger_url, redactor=Redactor(), key_path=config.ledger_key) as ledger:
            async with assembly.anchoring(config, ledger):
                await receiver.wait_for(lambda: len(receiver.accepted()) == 1)
                await add_pending(ledger, 1)
            # Stopping anchors the head once more.
            received = received_file(receiver, tmp_path / "received.jsonl")
            report = await verify_signed(ledger.audit, received, trusted_keys(ledger.key_path, []))
    positions = [anchor.position for anchor in received]
    # A send the stop cut off before its answer came is sent again: a receiver may get an anchor twice, harmlessly.
    assert sorted(set(positions)) == [0, 2] and positions[-1] == 2
    assert report.broken is None, report.broken


async def test_audit_anchor_sends_to_a_url_keeps_what_it_could_not_and_sends_it_next_time(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    env = bastion_env(tmp_path / "home", ANCHOR_SECRET=SECRET)

    async def cli(*args: str) -> tuple[int, str, str]:
        command = bastion_command("audit", *args, "--config", str(config))
        with anyio.fail_after(WAIT):
            done = await anyio.run_process(command, env=env, check=False)
        return done.returncode, done.stdout.decode(), done.stderr.decode()

    async def seeded(number: int) -> None:
        async with await open_ledger(load_config(config).ledger_url, redactor=Redactor()) as ledger:
            await add_pending(ledger, number)

    async with receiving() as receiver:
        toml = config / "bastion.toml"
        toml.write_text(
            toml.read_text()
            + f'[ledger]\nanchor_file = "anchors.jsonl"\nanchor_url = "{receiver.url}"\n'
            + 'anchor_secret = "${env:ANCHOR_SECRET}"\n'
        )
        await seeded(1)
        sent = await cli("anchor")
        await seeded(2)
        receiver.down = True
        kept = await cli("anchor", "--json")
        receiver.down = False
        await seeded(3)
        by_url = await cli("anchor", "--to", receiver.url)
        refused = await cli("anchor", "--to", "http://anchors.example.com/in")
        received = tmp_path / "received.jsonl"
        received_file(receiver, received)
        verified = await cli("verify", "--anchors", str(received), "--json")

    assert sent[0] == 0, sent
    assert "anchors.jsonl" in sent[1] and f"sent to {receiver.url}" in sent[1]
    assert kept[0] == 1, kept
    report = json.loads(kept[1])
    assert (report["delivered"], report["url"]) == (False, receiver.url) and "503" in report["error"]
    assert by_url[0] == 0, by_url
    assert refused[0] == 2 and "https" in refused[2]
    positions = [body["position"] for _, body in receiver.accepted()]
    in_file = [anchor.position for anchor in read_anchors(config / "anchors.jsonl")]
    assert positions == [*in_file, positions[-1]], "the one not taken came before the newest, and none is lost"
    assert len(positions) == 3 and report["anchor"]["position"] == positions[1]
    assert verified[0] == 0, verified
    assert json.loads(verified[1])["anchors"] == 3
