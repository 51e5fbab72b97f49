"""Signed anchors as operators use them: `bastion audit key`, `audit anchor`, `audit verify --anchors` and
`bastion serve` anchoring on its own, as real processes on a real SQLite ledger; a history rewritten with every hash
recomputed verifies from the store alone and is caught by the anchor."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bastion.ledger.anchors import read_anchors
from tests.ledger_contract.tampering import edit_field, recompute, store_of
from tests.processes import bastion_env, bastion_http, run_cli, write_config
from tests.test_cli_approvals import make_invocation, open_ledger

pytestmark = pytest.mark.anyio


def _config(tmp_path: Path, every: float = 300) -> Path:
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    toml = config / "bastion.toml"
    toml.write_text(toml.read_text() + f'[ledger]\nanchor_file = "anchors.jsonl"\nanchor_every_seconds = {every}\n')
    return config


async def _completed(config: Path, *numbers: int) -> None:
    async with open_ledger(config) as ledger:
        for number in numbers:
            invocation = make_invocation(number, status="approved", mode="allow")
            await ledger.invocations.record(invocation, ["planned", "approved"])
            await ledger.invocations.claim(invocation.id, owner="instance-a")
            await ledger.invocations.finish(invocation.id, "completed", result={"ok": number})


def _cli(config: Path, *args: str) -> tuple[int, str, str]:
    done = run_cli(*args, "--config", str(config), env=bastion_env(config.parent))
    return done.returncode, done.stdout, done.stderr


async def test_an_anchor_catches_a_history_rewritten_with_every_hash_recomputed(tmp_path: Path) -> None:
    config = _config(tmp_path)
    await _completed(config, 1, 2, 3)
    code, out, err = _cli(config, "audit", "anchor")
    assert code == 0, err
    assert out.startswith("anchored position 12 ") and "anchors.jsonl" in out
    code, out, _ = _cli(config, "audit", "verify")
    assert code == 0
    assert "12 events verified from the start" in out and "3 invocations match" in out and "1 signed anchors" in out
    code, out, _ = _cli(config, "audit", "key", "--json")
    public_key = json.loads(out)["public_key"]
    assert public_key.startswith("ed25519:")

    async with open_ledger(config) as ledger, store_of(ledger) as store:
        await edit_field("status")(store)  # inv-0001 "failed", and every hash after it recomputed
        await recompute(store)
    empty = tmp_path / "none.jsonl"
    empty.write_text("")
    code, out, _ = _cli(config, "audit", "verify", "--anchors", str(empty))
    assert code == 0, "the store alone agrees with itself again"
    code, out, _ = _cli(config, "audit", "verify", "--json")
    assert code == 1
    broken = json.loads(out)["broken"]
    assert broken["reason"] == "anchor" and "rewritten" in broken["message"]

    # Elsewhere, without the signing key: the published public key is needed, and enough.
    signing_key = config / "state" / "ledger.signing.pem"
    shutil.move(signing_key, tmp_path / "aside.pem")
    code, _, err = _cli(config, "audit", "verify")
    assert code == 2 and "--public-key" in err
    code, out, _ = _cli(config, "audit", "verify", "--public-key", public_key, "--json")
    assert code == 1 and json.loads(out)["broken"]["reason"] == "anchor"
    code, _, err = _cli(config, "audit", "verify", "--public-key", "ed25519:not-a-key")
    assert code == 2 and "expected ed25519:<base64 of 32 bytes>" in err


async def test_a_broken_history_is_never_anchored(tmp_path: Path) -> None:
    config = _config(tmp_path)
    await _completed(config, 1)
    async with open_ledger(config) as ledger, store_of(ledger) as store:
        await edit_field("result")(store)
    code, _, err = _cli(config, "audit", "anchor")
    assert code == 1 and "not anchored" in err and "inv-0001" in err
    assert not (config / "anchors.jsonl").exists()
    code, out, _ = _cli(config, "audit", "anchor", "--to", "-")
    assert code == 1 and out == ""


async def test_a_prune_signs_its_checkpoint_and_verify_checks_it(tmp_path: Path) -> None:
    config = _config(tmp_path)
    async with open_ledger(config) as ledger:
        for number in (1, 2):
            invocation = make_invocation(number, status="completed", mode="allow")
            old = invocation.created_at.replace(year=2020)
            await ledger.invocations.record(
                invocation.model_copy(update={"created_at": old, "updated_at": old}), ["planned", "completed"]
            )
    code, out, err = _cli(config, "audit", "prune", "--older-than-days", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["checkpoint"]["signature"]
    code, out, _ = _cli(config, "audit", "verify", "--json")
    assert code == 0 and json.loads(out)["trusted_keys"] == 1
    async with open_ledger(config) as ledger, store_of(ledger) as store:
        await store.run("UPDATE audit_checkpoints SET signature = NULL")
    code, out, _ = _cli(config, "audit", "verify", "--json")
    assert code == 1 and json.loads(out)["broken"]["reason"] == "checkpoint"


async def test_serve_anchors_the_head_when_it_starts_and_when_it_stops(tmp_path: Path) -> None:
    config = _config(tmp_path, every=3600)
    anchors = config / "anchors.jsonl"
    env = bastion_env(config.parent, BASTION_LOG_LEVEL="INFO")
    async with bastion_http(["--config", str(config)], env=env) as running:
        await running.stderr.wait_for(lambda line: "anchored the audit chain at position 0" in line)
        await _completed(config, 1, 2)  # another process's calls, recorded while it serves
    written = read_anchors(anchors)
    assert [anchor.position for anchor in written] == [0, 8]
    code, out, _ = _cli(config, "audit", "verify", "--json")
    assert code == 0, out
    assert json.loads(out)["anchors"] == 1


async def test_an_export_is_verified_offline_with_the_anchors_and_the_public_key_only(tmp_path: Path) -> None:
    config = _config(tmp_path)
    await _completed(config, 1, 2)
    assert _cli(config, "audit", "anchor")[0] == 0
    public_key = json.loads(_cli(config, "audit", "key", "--json")[1])["public_key"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code, out, _ = _cli(config, "audit", "export")
    assert code == 0
    (elsewhere / "export.jsonl").write_text(out)
    shutil.copy(config / "anchors.jsonl", elsewhere / "anchors.jsonl")

    def offline(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "bastion.ledger.offline", "export.jsonl", *args]
        return subprocess.run(command, cwd=elsewhere, capture_output=True, text=True, timeout=60, check=False)

    held = offline("--anchors", "anchors.jsonl", "--public-key", public_key)
    assert held.returncode == 0, held.stdout + held.stderr
    assert held.stdout.startswith("ok: 8 events, 2 invocations") and "1 anchors" in held.stdout

    async with open_ledger(config) as ledger, store_of(ledger) as store:
        await edit_field("result")(store)
        await recompute(store)
    (elsewhere / "export.jsonl").write_text(_cli(config, "audit", "export")[1])
    broken = offline("--anchors", "anchors.jsonl", "--public-key", public_key, "--json")
    assert broken.returncode == 1
    assert json.loads(broken.stdout)["broken"]["reason"] == "anchor"
    unusable = offline("--public-key", "ed25519:nope")
    assert unusable.returncode == 2 and "expected ed25519" in unusable.stderr
