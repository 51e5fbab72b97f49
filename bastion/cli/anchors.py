"""`bastion audit key` and `bastion audit anchor`: the key that signs the audit chain, and signed anchors of its head
kept outside the ledger (bastion.ledger.anchors)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final

import typer

from bastion.cli.app import ConfigOption, Exit, JsonOption, emit_json, out
from bastion.cli.audit import audit_app

if TYPE_CHECKING:
    from bastion.config import Config
    from bastion.ledger import OpenLedger

STDOUT: Final = "-"


def signing_key_path(ledger: OpenLedger) -> Path:
    """Where the ledger's signing key is kept: beside its key of argument hashes."""
    from bastion.ledger.anchors import signing_key_path_for

    return signing_key_path_for(ledger.key_path)


@audit_app.command("key")
def audit_key(config_dir: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Print the public key that signs this ledger's anchors and prune checkpoints (the key is created beside the
    ledger's key on first use). Publish it where those who verify the ledger look: `bastion audit verify
    --public-key` trusts it on another machine."""
    import anyio

    from bastion.cli.compose import load, open_ledger, run_async
    from bastion.ledger.anchors import load_or_create_signing_key, public_text

    config = load(config_dir, report=False)

    async def run() -> tuple[str, Path]:
        async with open_ledger(config) as ledger:
            path = signing_key_path(ledger)
            key = await anyio.to_thread.run_sync(load_or_create_signing_key, path)
            return public_text(key), path

    public, path = run_async(run)
    if as_json:
        emit_json({"public_key": public, "signing_key_file": str(path)})
        return
    out.print(public, markup=False, highlight=False, soft_wrap=True)
    out.print(f"(signing key: {path}; keep it out of the database's backups)", markup=False, highlight=False)


@audit_app.command("anchor")
def audit_anchor(
    to: Annotated[
        str | None,
        typer.Option(
            "--to",
            help="Append the anchor to this file (default: \\[ledger] anchor_file); - prints it for a log shipper.",
        ),
    ] = None,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Sign the audit chain's head and keep it outside the ledger: an anchor. `bastion audit verify --anchors FILE`
    then notices a history rewritten before it, or cut after it, even with every hash recomputed. The chain since the
    last anchor in the file (or the whole ledger) is verified first: a broken history is never signed (exit 1).
    `bastion serve` anchors on its own while \\[ledger] anchor_file is set."""
    import anyio

    from bastion.cli.compose import load, open_ledger, run_async
    from bastion.ledger.anchors import (
        Anchor,
        anchor_head,
        anchor_line,
        append_anchor,
        last_anchor,
        load_or_create_signing_key,
    )
    from bastion.models import AuditReport, utcnow

    config = load(config_dir, report=False)
    target = _target(config, to)

    async def run() -> Anchor | AuditReport:
        async with open_ledger(config) as ledger:
            key = await anyio.to_thread.run_sync(load_or_create_signing_key, signing_key_path(ledger))
            last = await anyio.to_thread.run_sync(last_anchor, target) if target is not None else None
            return await anchor_head(ledger.audit, key, last=last, now=utcnow())

    made = run_async(run)
    if isinstance(made, AuditReport):
        assert made.broken is not None
        raise Exit(f"error: not anchored: the audit chain does not verify: {made.broken.message}", 1)
    if target is None:
        sys.stdout.write(anchor_line(made) + "\n")
        sys.stdout.flush()
        return
    append_anchor(target, made)
    if as_json:
        emit_json({"anchor": made.model_dump(mode="json"), "file": str(target)})
        return
    out.print(f"anchored position {made.position} ({made.hash[:16]}...) in {target}", markup=False, highlight=False)


def _target(config: Config, to: str | None) -> Path | None:
    """Where an anchor goes: the file given, or the configured one; None: stdout."""
    if to == STDOUT:
        return None
    if to is not None:
        return Path(to).expanduser()
    return config.anchor_file
