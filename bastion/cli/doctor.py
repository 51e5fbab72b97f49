"""`bastion doctor`: check a configuration without starting anything; every problem with file:line and its fix.

Besides what loading finds (syntax, unknown keys, bad values: `Config.issues`), it checks every action file of
`actions/*.md` (each problem with its class: `parse_error`, `validation_error`, `capability_denied`,
`not_found`) and the overlay that enables them; that each enabled stdio connector's `command` can be started: an
absolute or relative path must be an executable file, a bare name must be found on the PATH the connector will get
(its own `env` PATH, else Bastion's); and that each enabled provider's credential is bound (a provider without it
is `binding_required`). It never calls a provider's API. From the ledger, if there is one, it warns of the actions
the next start lists under another name than their own, since another action keeps or also claims it. It also
declares the guarantee the configured ledger gives (G1 on SQLite, G1 across instances on PostgreSQL).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from bastion.cli.app import ConfigOption, Exit, JsonOption, app, emit_json, out
from bastion.errors import BastionError, ConfigError

if TYPE_CHECKING:
    from bastion.config import Config, ConfigIssue, ConnectorConfig
    from bastion.sources.manifests import Manifest
    from bastion.sources.seam import ActionSource


@dataclass(frozen=True)
class Check:
    """One check `doctor` made: what (`check`), on what (`subject`), whether it passed, and what it found."""

    check: str
    subject: str
    ok: bool
    detail: str


def find_command(connector: ConnectorConfig, environ: Mapping[str, str], cwd: Path) -> tuple[str | None, str]:
    """Where the connector's command is (None when it cannot be started) and what was found, or the problem.

    The child process resolves a bare name on its own PATH: the connector's `env` PATH when set, else the
    one Bastion runs with. A name with a slash is a path, relative to the connector's `cwd` (else `cwd`).
    """
    command = connector.command or ""
    if "/" in command:
        path = Path(connector.cwd or cwd) / command
        if not path.exists():
            return None, f'command "{command}" does not exist ({path}); install it or fix `command`'
        if not path.is_file() or not os.access(path, os.X_OK):
            return None, f'command "{command}" is not an executable file ({path}); chmod +x it or fix `command`'
        return str(path), str(path)
    if "PATH" in connector.env:
        search, origin = connector.env["PATH"], "its env PATH"
    else:
        search, origin = environ.get("PATH", os.defpath), "Bastion's PATH"
    found = shutil.which(command, path=search)
    if found is None:
        return None, (
            f'command "{command}" is not found on {origin} ({search}); install it, write its absolute path, '
            "or set PATH in the connector's env"
        )
    return found, found


def examine(
    config: Config, manifests: Sequence[Manifest], issues: Sequence[ConfigIssue], environ: Mapping[str, str], cwd: Path
) -> tuple[list[Check], list[ConfigIssue]]:
    """Every check on a loaded configuration and its action files (loaded as `manifests`, with `issues`), and every
    problem found (the loader's first, then the action files', then the commands')."""
    from bastion.config import ConfigIssue
    from bastion.sources.registry import action_state, provider_of

    where = str(config.directory) if config.directory else "embedded default configuration"
    problems = list(config.issues)
    checks = [Check("configuration", where, not problems, f"{len(problems)} problem(s)" if problems else "loaded")]
    if manifests or issues:
        detail = f"{len(manifests)} loaded" + (f", {len(issues)} problem(s)" if issues else "")
        checks.append(Check("actions", str(Path(where) / "actions"), not issues, detail))
    problems += issues
    state = action_state(config)
    try:
        state.read()
    except ConfigError as exc:
        checks.append(Check("action state", str(state.path), False, exc.message))
        problems.append(ConfigIssue(file=state.path or Path(where), line=1, message=exc.message))
    disabled = set(config.policy.sources.disabled)
    for connector in config.connectors:
        if connector.transport != "stdio" or connector.id in disabled:
            continue
        found, detail = find_command(connector, environ, cwd)
        checks.append(Check("command", connector.id, found is not None, detail))
        if found is None:
            file, line = config.command_lines.get(connector.id, (Path(where), 1))
            problems.append(ConfigIssue(file=file, line=line, message=f"connector {connector.id}: {detail}"))
    for provider_id in config.providers:
        if provider_id in disabled:
            continue
        unbound = config.unbound.get(provider_id)
        source = provider_of(config, provider_id)
        detail = unbound.message if unbound else f"{source.kind} API at {source.base_url}, token bound"
        checks.append(Check("credential", provider_id, unbound is None, detail))
        if unbound is not None:
            problems.append(unbound)
    return checks, problems


async def name_warnings(config: Config, sources: Sequence[ActionSource]) -> list[str]:
    """The host-name collisions the next start resolves, judged on the actions the ledger has seen (their pins) and
    the names it keeps for them (see `bastion.policies.assign_tool_names`): who is renamed, and why. Nothing when
    there is no ledger yet; a warning when it cannot be read."""
    from bastion.cli.compose import open_ledger
    from bastion.config import SQLITE_PREFIX, sqlite_path
    from bastion.policies import NameRequest, assign_tool_names

    if config.ledger_url.startswith(SQLITE_PREFIX) and not sqlite_path(config.ledger_url).exists():
        return []
    disabled = set(config.policy.sources.disabled)
    namespaces = {source.source_id: source.namespace for source in sources if source.source_id not in disabled}
    try:
        async with open_ledger(config) as ledger:
            pins, kept = await ledger.pins.pins(), await ledger.pins.tool_names()
    except BastionError as exc:
        return [f"the names the ledger keeps were not checked: {exc.message}"]
    requests = [
        NameRequest(source_id=pin.source_id, namespace=namespaces[pin.source_id], action_id=pin.action_id)
        for pin in pins
        if pin.source_id in namespaces
    ]
    return assign_tool_names(requests, kept).warnings


@app.command()
def doctor(config_dir: ConfigOption = None, as_json: JsonOption = False) -> None:
    """Check the configuration, each stdio connector's command and each provider's credential (without calling
    anything), and declare the ledger's guarantee level; every problem with file:line, exit 2 if any."""
    import anyio

    from bastion.config import find_config_dir, load_config
    from bastion.ledger import guarantee_of
    from bastion.sources.registry import load_sources

    try:
        directory = find_config_dir(config_dir, env=os.environ, cwd=Path.cwd(), home=Path.home())
        config = load_config(directory)
    except ConfigError as exc:
        raise Exit.of(exc) from exc
    sources = load_sources(config)
    manifests = sources.manifests
    checks, problems = examine(config, manifests, sources.problems, os.environ, Path.cwd())
    warnings = anyio.run(name_warnings, config, sources.all)
    if as_json:
        emit_json(report_json(config, len(manifests), checks, problems) | {"warnings": warnings})
        if problems:
            raise typer.Exit(2)  # the report is the whole answer, problems included
        return
    where = checks[0].subject
    for problem in problems:
        out.print(f"error: {problem}", markup=False, highlight=False)
    if problems:
        raise Exit(f"error: {len(problems)} problem(s) in {where}", 2, ConfigError.error_class)
    counts = f"{len(config.connectors)} connector(s), {len(config.providers)} provider(s)"
    out.print(
        f"ok: {where}: {counts}, {len(config.policy.modes)} org mode(s), {len(config.policy.profiles)} profile(s), "
        f"{len(manifests)} manifest action(s); ledger {config.ledger_display}",
        markup=False,
        highlight=False,
    )
    for check in checks[1:]:
        if check.check in ("command", "credential"):
            line = f"connector {check.subject} runs" if check.check == "command" else f"provider {check.subject}:"
            out.print(f"ok: {line} {check.detail}", markup=False, highlight=False)
    for warning in warnings:
        out.print(f"warning: {warning}", markup=False, highlight=False)
    guarantee = guarantee_of(config.ledger_url)
    out.print(f"guarantee: {guarantee.level} (wrapper-enforced), {guarantee.scope}", markup=False, highlight=False)
    out.print(f"  recovery: {guarantee.recovery}", markup=False, highlight=False)
    out.print(f"  not G2: {guarantee.not_g2}", markup=False, highlight=False)


def report_json(config: Config, actions: int, checks: list[Check], problems: list[ConfigIssue]) -> dict[str, Any]:
    """`doctor --json`: whether all is well, what was checked, and every problem with file and line."""
    from bastion.ledger import guarantee_of

    return {
        "ok": not problems,
        "config_dir": str(config.directory) if config.directory else None,
        "ledger": config.ledger_display,
        "guarantee": asdict(guarantee_of(config.ledger_url)),
        "counts": {
            "connectors": len(config.connectors),
            "providers": len(config.providers),
            "org_modes": len(config.policy.modes),
            "profiles": len(config.policy.profiles),
            "actions": actions,
        },
        "checks": [asdict(check) for check in checks],
        "problems": [
            {"file": str(p.file), "line": p.line, "message": p.message, "class": p.error_class, "boundary": p.boundary}
            for p in problems
        ],
    }
