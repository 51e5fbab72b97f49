"""The only code that knows every kind of source: it builds the configured sources, each loaded once, with every
problem found loading them (`load_sources`), for `serve`, every command and `doctor` alike.

Four kinds ship with Bastion (`mcp`, `providers`, `plugins`, `manifests`). A kind from an installed package is
offered through the entry point group `bastion.sources` and runs only where `[sources.<id>]` in `bastion.toml`
names it (`kind = "<entry point name>"`): the entry point is a `SourceKind`, which declares the version of
`bastion.sources.seam` it implements (`SOURCE_INTERFACE`), checks its settings with its own pydantic model and
builds one `ActionSource` per table.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from pydantic import BaseModel, ValidationError

from bastion.config import SQLITE_PREFIX, Config, ConfigIssue, ExternalSource, sqlite_path
from bastion.models import PLUGIN_SOURCE_ID
from bastion.sources.manifests import ACTIONS_DIR, STATE_FILE, ActionState, Manifest, load_manifests
from bastion.sources.manifests.source import ManifestSource
from bastion.sources.mcp import McpConnector
from bastion.sources.plugins import ACTION_FILE, PluginProblem, PluginSource, StepLimits, load_plugins
from bastion.sources.plugins.sandbox import sandbox
from bastion.sources.providers import ProviderSource, provider_source
from bastion.sources.seam import ActionSource

ENTRY_POINT_GROUP: Final = "bastion.sources"
"""The entry point group installed packages offer kinds of source in."""

SOURCE_INTERFACE: Final = 1
"""The version of `bastion.sources.seam` this Bastion offers; a kind declaring another is not loaded."""


@dataclass(frozen=True)
class KindContext:
    """What a kind from a package is told about the configuration it is built for."""

    directory: Path | None
    """The configuration directory (None: the embedded default)."""
    call_timeout: float
    """`[limits] call_timeout_seconds`: how long one call may take."""


class SourceKind(Protocol):
    """What an entry point of the group `bastion.sources` names: one kind of source."""

    interface: int
    """The version of `bastion.sources.seam` it implements: `SOURCE_INTERFACE` to be loaded."""
    settings: type[BaseModel]
    """Its settings: the keys of `[sources.<id>]` but `kind`, checked by this model."""

    def build(self, source_id: str, settings: Any, context: KindContext) -> ActionSource:
        """One source of this kind, with the id `source_id` and the checked `settings` (a `settings` instance)."""
        ...


@dataclass
class Sources:
    """The configured sources, each built once, and every problem found building them."""

    all: list[ActionSource] = field(default_factory=list)
    """Every source, the disabled ones included (the gateway neither runs nor lists those)."""
    manifests: list[Manifest] = field(default_factory=list)
    """The manifest actions loaded (the source `actions`, when there are any)."""
    plugins: PluginSource | None = None
    problems: list[ConfigIssue] = field(default_factory=list)
    """The action files', the plugin packages' and the package kinds' problems, each with its file and line."""


def load_sources(config: Config, *, marker_key: bytes | None = None) -> Sources:
    """Every source the configuration names: its connectors, providers, manifest actions, plugin packages and the
    sources of kinds installed packages offer. Nothing is started; a source that cannot be built is a problem.
    `marker_key` (the ledger's) keys what provider calls make; without it they cannot be run or looked up (for
    the commands that only read the configuration)."""
    limits = config.settings.limits
    found = Sources()
    found.all += [McpConnector(c, list_timeout=limits.list_timeout_seconds) for c in config.connectors]
    found.all += [provider_of(config, provider_id, marker_key=marker_key) for provider_id in config.providers]
    found.manifests, manifest_problems = _manifests(config)
    found.problems += manifest_problems
    if found.manifests:
        found.all.append(ManifestSource(found.manifests, action_state(config)))
    found.plugins, plugin_problems = _plugins(config, taken={m.name for m in found.manifests})
    found.problems += [ConfigIssue(file=p.file, line=p.line, message=p.message) for p in plugin_problems]
    if found.plugins is not None:
        found.all.append(found.plugins)
    for source_id, wanted in config.sources.items():
        source = _external(config, source_id, wanted, found.problems)
        if source is not None:
            found.all.append(source)
    return found


def provider_of(config: Config, provider_id: str, *, marker_key: bytes | None = None) -> ProviderSource:
    """The configured provider `provider_id` as a source (unbound when its credential is not), its calls' marks
    keyed with `marker_key` (see `load_sources`)."""
    unbound = config.unbound.get(provider_id)
    return provider_source(
        provider_id,
        config.providers[provider_id],
        unbound=unbound.message if unbound else None,
        call_timeout=config.settings.limits.call_timeout_seconds,
        marker_key=marker_key,
    )


def action_state(config: Config) -> ActionState:
    """Which manifest actions are enabled: `action-state.json` outside the action files, beside the SQLite ledger
    (beside the ledger's key file for a PostgreSQL one)."""
    if config.directory is None:
        return ActionState(None)
    beside = config.ledger_key if config.ledger_key is not None else sqlite_path(config.ledger_url)
    return ActionState(beside.parent / STATE_FILE)


def _manifests(config: Config) -> tuple[list[Manifest], list[ConfigIssue]]:
    """The manifest actions of `actions/*.md` and every problem of those files (none for the embedded default)."""
    if config.directory is None:
        return [], []
    manifests, problems = load_manifests(
        config.directory / ACTIONS_DIR, sources={c.id for c in config.connectors} | set(config.providers)
    )
    issues = [
        ConfigIssue(file=p.file, line=p.line, message=p.message, error_class=p.error_class, boundary=p.boundary)
        for p in problems
    ]
    return manifests, issues


def _plugins(config: Config, *, taken: Collection[str]) -> tuple[PluginSource | None, list[PluginProblem]]:
    """The plugin packages of `actions/<name>/action.json` as a source (None when there are none, or when
    `[plugins] allow_plugin_code` is off: each package is then a problem saying how to turn it on)."""
    if config.directory is None:
        return None, []
    settings = config.settings.plugins
    packages, problems = load_plugins(
        config.directory / ACTIONS_DIR, allowed_commands=settings.allowed_commands, taken=taken
    )
    if not settings.allow_plugin_code:
        why = (
            "plugin packages run code of their own and are not loaded: set allow_plugin_code = true under [plugins] "
            "in bastion.toml to load them, or remove the package"
        )
        return None, [PluginProblem(package.directory / ACTION_FILE, 1, why) for package in packages] + problems
    if not packages:
        return None, problems
    workspace = config.directory / settings.workspace
    confined = sandbox(workspace, hidden=_hidden_from_plugins(config))
    if isinstance(confined, str):  # a permission Bastion cannot apply is never accepted
        refused = [
            PluginProblem(
                package.directory / ACTION_FILE,
                1,
                f'permissions.filesystem "{package.action.permissions.filesystem}" cannot be enforced here: '
                f"{confined} (this package is not loaded until then)",
            )
            for package in packages
        ]
        return None, refused + problems
    limits = StepLimits(
        workspace=workspace,
        sandbox=confined,
        state=config.directory / "state" / PLUGIN_SOURCE_ID,
        env={name: value.get_secret_value() for name, value in settings.env.items()},
        timeout=settings.timeout_seconds,
        max_output=settings.max_output_bytes,
        allowed_commands=settings.allowed_commands,
    )
    return PluginSource(packages, limits), problems


def _hidden_from_plugins(config: Config) -> list[Path]:
    """What no plugin step may see: the configuration directory and the SQLite ledger's (its key beside it)."""
    hidden = [config.directory] if config.directory is not None else []
    if config.ledger_url.startswith(SQLITE_PREFIX):
        hidden.append(sqlite_path(config.ledger_url).parent)
    return hidden


def _external(
    config: Config, source_id: str, wanted: ExternalSource, problems: list[ConfigIssue]
) -> ActionSource | None:
    """The source `[sources.<source_id>]` names, built by the kind an installed package offers; None, with the
    problem added to `problems`, when the kind is missing, of another interface, or refuses its settings."""

    def refuse(message: str, line: int = wanted.line) -> None:
        problems.append(ConfigIssue(file=wanted.file, line=line, message=f"[sources.{source_id}]: {message}"))

    offered = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP, name=wanted.kind)
    if not offered:
        known = sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)})
        refuse(
            f'no installed package offers the kind "{wanted.kind}" (entry point group {ENTRY_POINT_GROUP}; installed: '
            f"{', '.join(known) or 'none'}); install the package that offers it, or fix kind (not loaded until then)"
        )
        return None
    if len(offered) > 1:
        owners = ", ".join(sorted(f"{ep.value}" for ep in offered))
        refuse(f'more than one installed package offers the kind "{wanted.kind}" ({owners}); uninstall all but one')
        return None
    (entry,) = offered
    try:
        kind: SourceKind = entry.load()
    except Exception as exc:  # noqa: BLE001 (a package's import fails in its own ways: reported, the rest load)
        refuse(f'the kind "{wanted.kind}" ({entry.value}) cannot be imported: {type(exc).__name__}: {exc}')
        return None
    interface = getattr(kind, "interface", None)
    if interface != SOURCE_INTERFACE:
        refuse(
            f'the kind "{wanted.kind}" ({entry.value}) implements source interface {interface!r}, and this Bastion '
            f"offers {SOURCE_INTERFACE}; install a version of the package made for it (not loaded until then)"
        )
        return None
    try:
        settings = kind.settings.model_validate(wanted.settings)
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "its settings"
            refuse(f"{where}: {error['msg']} (the kind {wanted.kind} checks it; not loaded until then)")
        return None
    try:
        source = kind.build(
            source_id, settings, KindContext(config.directory, config.settings.limits.call_timeout_seconds)
        )
    except Exception as exc:  # noqa: BLE001 (the package's code fails in its own ways: reported, the rest load)
        refuse(f'the kind "{wanted.kind}" could not build the source: {type(exc).__name__}: {exc}')
        return None
    if source.source_id != source_id:
        refuse(f'the kind "{wanted.kind}" built a source with the id {source.source_id!r}, not {source_id!r}')
        return None
    return source
