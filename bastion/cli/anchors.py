"""`bastion audit key` and `bastion audit anchor`: the key that signs the audit chain, and signed anchors of its head
kept outside the ledger (bastion.ledger.anchors)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
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
            help="Append the anchor to this file, or POST it to this URL (https, or http to this machine; signed "
            "with [ledger] anchor_secret); - prints it for a log shipper. Default: [ledger] anchor_file and "
            "anchor_url.",
        ),
    ] = None,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Sign the audit chain's head and keep it outside the ledger: an anchor. `bastion audit verify --anchors FILE`
    then notices a history rewritten before it, or cut after it, even with every hash recomputed. The chain since the
    last anchor in the file (or the whole ledger) is verified first: a broken history is never signed (exit 1).
    An anchor the URL does not take is kept in the ledger's outbox and sent first at the next anchoring (exit 1).
    `bastion serve` anchors on its own while [ledger] anchor_file or anchor_url is set."""
    import anyio

    from bastion import assembly
    from bastion.cli.compose import load, open_ledger, run_async
    from bastion.errors import ConfigError
    from bastion.ledger.anchors import (
        Anchor,
        anchor_head,
        anchor_line,
        append_anchor,
        last_anchor,
        load_or_create_signing_key,
    )
    from bastion.models import AuditReport, utcnow
    from bastion.pipeline.notify import shown_url

    config = load(config_dir, report=False)
    target = _target(config, to)
    if target.url is not None:
        try:
            assembly.anchor_secret_of(config, target.url)
        except ConfigError as exc:
            raise Exit.of(exc) from exc

    async def run() -> tuple[Anchor | AuditReport, str | None]:
        async with open_ledger(config) as ledger:
            key = await anyio.to_thread.run_sync(load_or_create_signing_key, signing_key_path(ledger))
            file = target.file
            last = await anyio.to_thread.run_sync(last_anchor, file) if file is not None else None
            made = await anchor_head(ledger.audit, key, last=last, now=utcnow())
            if isinstance(made, AuditReport):
                return made, None
            if file is not None:  # first: the anchor is kept even if the URL does not take it
                await anyio.to_thread.run_sync(append_anchor, file, made)
            if target.url is None:
                return made, None
            async with assembly.anchor_webhook(config, ledger, target.url) as sender:
                return made, await sender.send(made)

    made, undelivered = run_async(run)
    if isinstance(made, AuditReport):
        assert made.broken is not None
        raise Exit(f"error: not anchored: the audit chain does not verify: {made.broken.message}", 1)
    if target.file is None and target.url is None:
        sys.stdout.write(anchor_line(made) + "\n")
        sys.stdout.flush()
        return
    shown = shown_url(target.url) if target.url is not None else None
    if as_json:
        file = str(target.file) if target.file is not None else None
        delivered = None if shown is None else undelivered is None
        emit_json(
            {"anchor": made.model_dump(mode="json"), "file": file, "url": shown, "delivered": delivered}
            | ({"error": undelivered} if undelivered is not None else {})
        )
        if undelivered is not None:
            raise typer.Exit(1)
        return
    kept = [f"in {target.file}"] if target.file is not None else []
    if shown is not None and undelivered is None:
        kept.append(f"sent to {shown}")
    if kept:
        line = f"anchored position {made.position} ({made.hash[:16]}...) {' and '.join(kept)}"
        out.print(line, markup=False, highlight=False)
    if undelivered is not None:
        raise Exit(
            f"error: anchors were not delivered to {shown} ({undelivered}); they are kept in the ledger's outbox and "
            "sent, oldest first, at the next anchoring (this command, or `bastion serve` with [ledger] anchor_url): "
            "check that the receiver is up and answers 2xx",
            1,
        )


@dataclass(frozen=True)
class _Target:
    """Where an anchor goes: a file, a URL, both (the configured ones), or neither: stdout."""

    file: Path | None
    url: str | None


def _target(config: Config, to: str | None) -> _Target:
    """The place given (`-`: stdout; a URL, checked as `[ledger] anchor_url` is; else a file), or the configured
    ones."""
    from bastion.config import anchor_url

    if to == STDOUT:
        return _Target(None, None)
    if to is None:
        return _Target(config.anchor_file, config.settings.ledger.anchor_url)
    if "://" not in to:
        return _Target(Path(to).expanduser(), None)
    try:
        return _Target(None, anchor_url(to))
    except ValueError as exc:
        raise Exit(f"error: --to {exc}", 2) from exc
