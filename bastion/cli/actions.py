"""`bastion actions`: the manifest actions of `actions/*.md`: list, show, enable, disable.

Whether an action is enabled is kept outside its file, in `action-state.json` beside the ledger, so the choice
survives a re-install of the file and a restart; a running Bastion notices it within a second. A disabled action is
hidden from `tools/list` and refused on call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from bastion.cli.app import ConfigOption, Exit, JsonOption, command_group, emit_json, out
from bastion.cli.tables import Column, fitted_table
from bastion.errors import BastionError, NotFound
from bastion.program import bastion_command

if TYPE_CHECKING:
    from bastion.config import Config
    from bastion.pipeline.gateway import Gateway
    from bastion.sources.manifests import Manifest
    from bastion.sources.manifests.source import ManifestView

actions_app = command_group("actions", "Manifest actions (actions/*.md): list, show, enable and disable them.")


def name_argument(what: str) -> Any:
    """The NAME argument of one `actions` command: the help says what that command does with it."""
    return typer.Argument(help=f"The action to {what}, by its `name` (without the actions__ prefix).")


ACTION_COLUMNS: Final = (
    Column("action", "id"),
    Column("state", "word"),
    Column("risk", "word"),
    Column("mode", "word", optional=True),
    Column("mode source", optional=True),
    Column("file", optional=True),
    Column("why"),
)


@actions_app.command("list")
def actions_list(config_dir: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Start the connectors once and show every manifest action: enabled, disabled or unavailable (and why), its
    risk (never below its steps') and mode."""
    from bastion.cli.compose import load, run_async

    config = load(config_dir)
    actions = run_async(_described, config, not as_json)
    if as_json:
        emit_json(actions)
        return
    rows = [
        (
            a["name"],
            a["state"],
            a["risk"] or a["declared_risk"],
            a["mode"] or "",
            a["mode_source"] or "",
            a["file"],
            a["reason"] or "",
        )
        for a in actions
    ]
    out.print(fitted_table(ACTION_COLUMNS, rows, width=out.width, title=f"{len(actions)} manifest actions"))


@actions_app.command("show")
def actions_show(
    name: Annotated[str, name_argument("show")], config_dir: ConfigOption = None, as_json: JsonOption = False
) -> None:
    """Show one manifest action: its description and documentation, inputs, the connectors it requires (each with
    the version and content hash it runs now, to pin), its steps, and why it is unavailable if it is."""
    from bastion.cli.compose import load, run_async

    config = load(config_dir)
    _known(config, name)
    (action,) = [a for a in run_async(_described, config, not as_json) if a["name"] == name]
    if as_json:
        emit_json(action)
        return
    lines = [
        f"{action['name']} {action['version']} ({action['file']})",
        f"tool: {action['tool']}   state: {action['state']}   risk: {action['risk'] or '-'} "
        f"(declared {action['declared_risk']})   mode: {action['mode'] or '-'} ({action['mode_source'] or '-'})",
    ]
    if action["reason"]:
        lines.append(f"why: {action['reason']}")
    lines += ["", action["description"]]
    if action["details"]:
        lines += ["", action["details"]]
    lines += ["", "inputs:"]
    for item in action["inputs"]:
        optional = "" if item["required"] else f", optional (default {item.get('default')})"
        lines.append(f"  {item['name']} ({item['type']}{optional}): {item['description']}")
    lines += ["", "requires:"]
    for required in action["requires"]:
        pinned = f"pins version {required['version'] or '-'}, hash {required['hash'] or '-'}"
        now = f"runs version {required['current_version'] or '-'}, hash {required['current_hash'] or '-'}"
        lines.append(f"  {required['id']}: may call {', '.join(required['capabilities']) or 'nothing'}")
        lines.append(f"    {pinned}; {now}")
    lines += ["", "steps:"]
    lines += [f"  {s['id']}: {s['source']}:{s['action']} {s['inputs']}" for s in action["steps"]]
    lines.append(f"approval required: {'yes' if action['approval_required'] else 'no'}")
    out.print("\n".join(lines), markup=False, highlight=False)


@actions_app.command("enable")
def actions_enable(
    name: Annotated[str, name_argument("enable (listed and callable again)")],
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Enable a manifest action again: listed and callable (kept outside its file, across restarts)."""
    _set_enabled(config_dir, name, True, as_json)


@actions_app.command("disable")
def actions_disable(
    name: Annotated[str, name_argument("disable (hidden, its calls refused)")],
    config_dir: ConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Disable a manifest action: hidden from tools/list and refused on call (kept outside its file, so it
    survives a re-install of the file and a restart)."""
    _set_enabled(config_dir, name, False, as_json)


def _set_enabled(config_dir: ConfigOption, name: str, enabled: bool, as_json: bool) -> None:
    from bastion.cli.compose import load
    from bastion.sources.registry import action_state

    config = load(config_dir, report=False)
    _known(config, name)
    state = action_state(config)
    try:
        state.set_enabled(name, enabled)
    except BastionError as exc:
        raise Exit.of(exc) from exc
    if as_json:
        emit_json({"name": name, "enabled": enabled, "state_file": str(state.path)})
        return
    what = "listed and callable" if enabled else "hidden from tools/list and refused on call"
    out.print(
        f"{'enabled' if enabled else 'disabled'} {name}: {what} (a running Bastion notices within a second; "
        f"kept in {state.path})",
        markup=False,
        highlight=False,
    )


def _known(config: Config, name: str) -> Manifest:
    """The loaded manifest called `name`; NotFound (exit 1) naming the ones there are."""
    from bastion.sources.registry import load_sources

    manifests = load_sources(config).manifests
    found = next((m for m in manifests if m.name == name), None)
    if found is None:
        known = ", ".join(sorted(m.name for m in manifests)) or "none loaded"
        raise Exit.of(NotFound(f"no manifest action {name!r} (known: {known}); see `{bastion_command()} actions list`"))
    return found


async def _described(config: Config, progress: bool) -> list[dict[str, Any]]:
    from bastion.cli.compose import open_gateway
    from bastion.models import MANIFEST_SOURCE_ID
    from bastion.sources.manifests.source import ManifestSource

    async with open_gateway(config, progress=progress) as gateway:
        source = gateway.steps.source(MANIFEST_SOURCE_ID)
        views = source.views() if isinstance(source, ManifestSource) else []
        return [_describe(gateway, view) for view in views]


def _describe(gateway: Gateway, view: ManifestView) -> dict[str, Any]:
    """One manifest action as `--json` prints it."""
    from bastion.models import MANIFEST_SOURCE_ID, CallContext

    manifest, front = view.manifest, view.manifest.front
    entry = gateway.catalog.by_action.get((MANIFEST_SOURCE_ID, view.name)) if view.listed else None
    decision = gateway.mode_of(entry, CallContext(session_id="cli")) if entry is not None else None
    state = "enabled" if view.listed else "disabled" if not view.enabled else "unavailable"
    return {
        "name": view.name,
        "tool": entry.name if entry is not None else f"{MANIFEST_SOURCE_ID}__{view.name}",
        "file": str(manifest.file),
        "version": front.version,
        "state": state,
        "enabled": view.enabled,
        "available": view.reason is None,
        "reason": view.reason,
        "declared_risk": front.risk,
        "risk": view.risk,
        "mode": decision.mode if decision else None,
        "mode_source": decision.source if decision else None,
        "approval_required": front.approval.required,
        "description": manifest.description,
        "details": manifest.details,
        "inputs": [item.model_dump(exclude_none=True) for item in front.inputs],
        "requires": [
            required.model_dump()
            | {"current_version": view.versions.get(required.id), "current_hash": view.hashes.get(required.id)}
            for required in front.requires.connectors
        ],
        "steps": [step.model_dump() for step in front.execute],
    }
