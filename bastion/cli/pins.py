"""`bastion pins`: the trusted definitions of actions and their drift.

Drift never clears by itself: only an approver accepts a drifted definition, which re-pins it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Final

import typer

from bastion.cli.app import ConfigOption, Exit, JsonOption, TokenOption, command_group, emit_json, out, timestamp
from bastion.cli.tables import Column, fitted_table
from bastion.errors import Conflict, NotFound
from bastion.program import bastion_command

if TYPE_CHECKING:
    from rich.text import Text

    from bastion.models import Pin

pins_app = command_group("pins", "Pinned tool definitions and their drift: list, accept a new definition.")

FINGERPRINT_PREFIX = 12
PIN_COLUMNS: Final = (
    Column("key", "id"),
    Column("pinned by", optional=True),
    Column("pinned at", "time", optional=True),
    Column("fingerprint", "word"),
    Column("drift", "word"),
)
_DIFF_STYLES = (("+++", "bold"), ("---", "bold"), ("@@", "cyan"), ("+", "green"), ("-", "red"))


def diff_text(lines: list[str]) -> Text:
    """A unified diff coloured for people (additions green, removals red)."""
    from rich.text import Text

    text = Text()
    for line in lines:
        style = next((style for prefix, style in _DIFF_STYLES if line.startswith(prefix)), "")
        text.append(line + "\n", style=style)
    return text


@pins_app.command("list")
def pins_list(
    config_dir: ConfigOption = None,
    source: Annotated[str | None, typer.Option("--source", help="Only this source id.")] = None,
    drifted: Annotated[bool, typer.Option("--drifted", help="Only drifted pins.")] = False,
    as_json: JsonOption = False,
) -> None:
    """List pinned actions: who pinned them and when, their fingerprint, and any drift with its diff."""
    from bastion.cli.compose import load, open_ledger, run_async
    from bastion.config import config_hint
    from bastion.pipeline.documents import drift_diff, pin_json

    config = load(config_dir, report=False)

    async def run() -> list[Pin]:
        async with open_ledger(config) as ledger:
            return await ledger.pins.pins(source)

    pins = [pin for pin in run_async(run) if pin.drift is not None or not drifted]
    where = config_hint(config)
    if as_json:
        emit_json([pin_json(pin) for pin in pins])
        return
    rows = [
        (
            pin.key,
            pin.pinned_by or "",
            timestamp(pin.pinned.seen_at),
            pin.pinned.fingerprint[:FINGERPRINT_PREFIX],
            "drifted" if pin.drift is not None else "",
        )
        for pin in pins
    ]
    title = f"{len(pins)} {'drifted ' if drifted else ''}pins"
    out.print(fitted_table(PIN_COLUMNS, rows, width=out.width, title=title))
    for pin in pins:
        diff = drift_diff(pin)
        if pin.drift is None or diff is None:
            continue
        seen = timestamp(pin.drift.seen_at)
        out.print(f"\ndrift of {pin.key}, seen {seen} (pinned -> current):", markup=False, highlight=False)
        out.print(diff_text(diff), end="")
        out.print(f"accept it with: {bastion_command()} pins accept {pin.key}{where}", markup=False, highlight=False)


@pins_app.command("accept")
def pins_accept(
    key: Annotated[str | None, typer.Argument(help="The drifted action's policy key, source:action.")] = None,
    source: Annotated[str | None, typer.Option("--source", help="Accept every drifted pin of this source.")] = None,
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """Re-pin drifted actions to their current definition: one KEY, or every drifted one of --source.

    Once the ledger has an owner or admin token, this needs one (--token or $BASTION_TOKEN).
    """
    from bastion.cli.compose import load, local_approver, open_ledger, run_async
    from bastion.config import config_hint
    from bastion.pipeline.authority import accept_pins
    from bastion.pipeline.documents import pin_json

    source_id, action_id = _target(key, source)
    config = load(config_dir, report=False)

    async def run() -> tuple[list[Pin], str]:
        async with open_ledger(config) as ledger:
            approver = await local_approver(ledger, config, token)
            if action_id is None and not await ledger.pins.pins(source_id):
                listing = f"{bastion_command()} pins list{config_hint(config)}"
                raise NotFound(f"no pins of source {source_id!r} in {config.ledger_display}; see `{listing}`")
            accepted = await accept_pins(ledger, principal=approver, source_id=source_id, action_id=action_id)
            if key is not None and not accepted:
                raise Conflict(f"pin {key} is not drifted; there is nothing to accept")
            return accepted, approver.name

    accepted, principal = run_async(run)
    if as_json:
        emit_json([pin_json(pin) for pin in accepted])
        return
    for pin in accepted:
        fingerprint = pin.pinned.fingerprint[:FINGERPRINT_PREFIX]
        out.print(f"accepted {pin.key}: re-pinned to {fingerprint} as {principal}", markup=False, highlight=False)
    if key is None:
        out.print(f"{len(accepted)} drifted pin(s) of source {source_id} accepted", markup=False, highlight=False)


def _target(key: str | None, source: str | None) -> tuple[str, str | None]:
    """The (source_id, action_id) to accept: one action from KEY, or a whole source (action None)."""
    if key is not None and source is None:
        source_id, _, action_id = key.partition(":")
        if not source_id or not action_id:
            raise Exit(f"error: {key!r} is not a policy key; write it as source:action, e.g. notes:write_note", 2)
        return source_id, action_id
    if source is not None and key is None:
        return source, None
    raise Exit("error: give either KEY (source:action) or --source ID, not both or neither", 2)
