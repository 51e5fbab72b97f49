"""Loading a configuration directory: parsing, validation and policy merging (finding it, the
embedded default and `init` are in `places`).

Loading never raises for what a file says: every problem becomes a `ConfigIssue` with its file, line and
fix, every file is checked in the same pass, and a broken file never stops the others.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from bastion.config.approvers import ApproverCounts, approver_problems
from bastion.config.conditions import rule_problems
from bastion.config.models import (
    Config,
    ConfigIssue,
    ConnectorConfig,
    ExternalSource,
    PolicyConfig,
    Profile,
    ProviderConfig,
    ServerSettings,
    Settings,
    SourcesPolicy,
)
from bastion.config.places import (
    CONFIG_FILE,
    PYTHON_COMMAND,
    SQLITE_PREFIX,
    embedded_default,
    existing_config_dir,
    is_postgres_url,
    ledger_key,
    sqlite_path,
)
from bastion.config.providers import is_credential, load_providers, load_source_tables
from bastion.config.tomlpos import (
    MAX_NESTING,
    KeyIndex,
    KeyPath,
    describe_error,
    describe_syntax_error,
    dotted_key,
    drop_invalid,
    line_containing,
)
from bastion.errors import ConfigError
from bastion.models import MODES, RESERVED_SOURCE_IDS, PolicyRule
from bastion.policies import strictness

_ENV_REFERENCE: Final = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")
_ENV_START: Final = "${env:"
_SOURCE_ID: Final = re.compile(r"^[a-z0-9_-]+$")
_POLICY_KEY: Final = re.compile(r"^[a-z0-9_-]+:(\*|[^\s*]+)$")
_TOO_DEEP: Final = (
    f"values nest deeper than {MAX_NESTING} levels here (tables, arrays and dotted keys count alike); flatten them"
)

APPROVED_FILE: Final = "bastion-approved.toml"
"""Where, under `policies/`, earlier Bastions wrote "always" approvals: not policy (the loader skips it), imported
into the ledger as grants when Bastion starts (bastion.pipeline.grants)."""


def validate_profile(config: Config, name: str) -> None:
    """Refuse an unknown profile name (`serve --profile`), naming the profiles that exist."""
    if name in config.policy.profiles:
        return
    known = ", ".join(sorted(config.policy.profiles)) or "none are defined"
    raise ConfigError(
        f'unknown profile "{name}" (known profiles: {known}); '
        f"pick a known one or define [profiles.{name}.modes] in policies/*.toml"
    )


# -- loading


def load_config(directory: Path | None, *, env: Mapping[str, str] | None = None, home: Path | None = None) -> Config:
    """Load a configuration directory, or the embedded default when `directory` is None.

    Problems in the files never raise: they are collected in `Config.issues`. Only a directory that
    does not exist, or a setting that decides where data lives or how it is protected whose `${env:NAME}` is not
    set (`PROTECTIVE`), raises `ConfigError`. `env` (default `os.environ`) feeds `${env:NAME}`; `home` is
    used only by the embedded default.
    """
    environ = os.environ if env is None else env
    if directory is None:
        return embedded_default(env=environ, home=Path.home() if home is None else home)
    directory = existing_config_dir(directory.resolve(), "the configuration")
    loader = _Loader(directory, environ)
    settings, settings_file = loader.settings()
    ledger_url = loader.ledger_url(settings, settings_file)
    connectors = loader.connectors()
    providers = loader.providers(settings_file)
    sources = loader.sources(settings_file)
    policy = loader.policy()
    order = {file: i for i, file in enumerate(dict.fromkeys(issue.file for issue in loader.issues))}
    issues = sorted(loader.issues, key=lambda issue: (order[issue.file], issue.line))
    return Config(
        directory=directory,
        settings=settings,
        connectors=connectors,
        policy=policy,
        unreadable_policies=loader.unreadable_policies,
        issues=issues,
        command_lines={c.id: loader.command_lines[c.id] for c in connectors if c.id in loader.command_lines},
        providers=providers,
        sources=sources,
        unbound={pid: issue for pid, issue in loader.unbound.items() if pid in providers},
        ledger_url=ledger_url,
        ledger_key=ledger_key(directory, settings, ledger_url),
    )


_M = TypeVar("_M", bound=BaseModel)
_IGNORED: Final = "this file is ignored until then"
_POLICY_UNREADABLE: Final = "until then every call is denied: skipping the file could allow what it denies"


@dataclass
class _TomlFile:
    path: Path
    text: str
    data: dict[str, Any]
    index: KeyIndex
    unset_credentials: dict[KeyPath, str] = field(default_factory=dict)
    """Credential keys (`providers.<id>.token`) whose `${env:NAME}` is not set, with the NAME: left out of `data`
    (the provider is then `binding_required`) instead of making the whole file unusable."""


@dataclass(frozen=True)
class _Placed:
    """A policy value with the file and line that set it, to report merge conflicts."""

    value: str
    file: Path
    line: int


class _Loader:
    """One pass over a configuration directory, collecting every issue."""

    def __init__(self, directory: Path, env: Mapping[str, str]) -> None:
        self.directory = directory
        self.env = env
        self.issues: list[ConfigIssue] = []
        self.command_lines: dict[str, tuple[Path, int]] = {}
        self.unbound: dict[str, ConfigIssue] = {}
        self.unreadable_policies: list[str] = []
        """The policy files that could not be used (`file:line`): while there is one, every call is denied."""
        self.source_ids: dict[str, str] = dict(RESERVED_SOURCE_IDS)
        """Every source id claimed so far, and where: one id, one source, whatever the kinds."""

    def claim_source_id(self, source_id: str, where: str) -> str | None:
        """Claim `source_id` for the source defined at `where`: None when it was free, else where it is claimed."""
        first = self.source_ids.setdefault(source_id, where)
        return None if first == where else first

    def report(self, file: Path, line: int, message: str) -> None:
        self.issues.append(ConfigIssue(file=file, line=line, message=message))

    def report_invalid(self, file: _TomlFile, model: type[BaseModel], error: Mapping[str, Any], outcome: str) -> None:
        loc: KeyPath = tuple(error["loc"])
        message = describe_error(error, _known_keys(model, loc[:-1]))
        self.report(file.path, file.index.line_of(loc), f"{message} ({outcome} until then)")

    def name(self, file: Path) -> str:
        return file.relative_to(self.directory).as_posix()

    def toml_files(self, subdirectory: str) -> list[Path]:
        folder = self.directory / subdirectory
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.glob("*.toml") if p.is_file() and not p.name.startswith("."))

    def read(self, path: Path, *, settings: bool = False, until: str = _IGNORED) -> _TomlFile | None:
        """Parse a file and substitute `${env:NAME}`; None (with issues, each ending with `until`: what holds until
        it is fixed) when the file cannot be used.

        With `settings` (bastion.toml) an unset variable disables only what uses it (`_contain`), and stops
        everything when it decides where data lives or how it is protected.
        """
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            self.report(path, 1, f"the file is not UTF-8 text; save it as UTF-8 ({until})")
            return None
        except OSError as exc:
            self.report(path, 1, f"the file cannot be read ({exc.strerror}); check its permissions ({until})")
            return None
        index = KeyIndex(text)
        if index.too_deep is not None:
            self.report(path, index.too_deep, f"{_TOO_DEEP} ({until})")
            return None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            line, message = describe_syntax_error(exc, text)
            self.report(path, line, f"{message} ({until})")
            return None
        except RecursionError:  # nesting the index did not see (it is lenient on broken text)
            self.report(path, 1, f"{_TOO_DEEP} ({until})")
            return None
        file = _TomlFile(path, text, data, index)
        problems: list[tuple[KeyPath, str | None]] = []
        file.data = _substitute_env(data, self.env, (), problems)
        if settings:
            self._contain(file, problems)
            return file
        for key_path, variable in problems:
            line, message = _unset(file, key_path, variable)
            self.report(path, line, f"{message} ({until})")
        return None if problems else file

    def _contain(self, file: _TomlFile, problems: list[tuple[KeyPath, str | None]]) -> None:
        """Leave out of bastion.toml only what an unset (or malformed) reference is in: that provider's token (it is
        then `binding_required`), that provider, that webhook, that setting (its default applies). One in a setting
        that decides where data lives or how it is protected stops everything (ConfigError): another ledger or
        key would be used without a word."""
        webhooks: set[int] = set()
        for key_path, variable in problems:
            line, message = _unset(file, key_path, variable)
            if any(key_path[: len(prefix)] == prefix for prefix in PROTECTIVE):
                raise ConfigError(
                    f"{file.path}:{line}: {message}; [{key_path[0]}] {key_path[1]} decides where Bastion's data lives "
                    "or how it is protected, so nothing runs without it"
                )
            if variable is not None and is_credential(key_path):
                file.unset_credentials[key_path] = variable
                del file.data["providers"][key_path[1]]["token"]
                continue
            if key_path[:1] == ("providers",) and len(key_path) > 2:
                file.data["providers"].pop(key_path[1], None)
                outcome = f"provider {key_path[1]} is left out until then"
            elif key_path[:2] == ("notify", "webhook") and len(key_path) > 2 and isinstance(key_path[2], int):
                webhooks.add(key_path[2])
                outcome = "that webhook is left out until then"
            else:
                dropped = _drop(file.data, key_path)
                outcome = (
                    f"the default of {dotted_key(dropped)} applies until then"
                    if len(dropped) <= 2
                    else f"{dotted_key(dropped)} is left out until then"
                )
            self.report(file.path, line, f"{message} ({outcome})")
        listed = file.data.get("notify", {}).get("webhook")
        if webhooks and isinstance(listed, list):
            file.data["notify"]["webhook"] = [hook for i, hook in enumerate(listed) if i not in webhooks]

    def validate_salvaging(self, file: _TomlFile, model: type[_M], outcome: str) -> _M:
        """Validate, dropping each invalid entry (reported) so that the valid rest of the file applies."""
        seen: set[tuple[KeyPath, str]] = set()
        for _ in range(100):
            try:
                return model.model_validate(file.data)
            except ValidationError as exc:
                errors = exc.errors()
            for error in errors:
                key = (tuple(error["loc"]), error["type"])
                if key not in seen:
                    seen.add(key)
                    self.report_invalid(file, model, error, outcome)
            if not drop_invalid(file.data, errors[0]):
                break
        return model()

    def settings(self) -> tuple[Settings, _TomlFile | None]:
        """`bastion.toml` without its `[providers]` (which `providers` reads, one provider at a time)."""
        path = self.directory / CONFIG_FILE
        file = self.read(path, settings=True) if path.is_file() else None
        if file is None:
            return Settings(), None
        tables: dict[str, Any] = {key: file.data.pop(key) for key in ("providers", "sources") if key in file.data}
        settings = self.validate_salvaging(file, Settings, "the default applies")
        file.data.update(tables)
        return settings, file

    def sources(self, file: _TomlFile | None) -> dict[str, ExternalSource]:
        """Every usable `[sources.<id>]` of bastion.toml (see `bastion.config.providers.load_source_tables`)."""
        if file is None:
            return {}
        return load_source_tables(
            file.data.get("sources"),
            file.path,
            file.index,
            claim=lambda source_id, line: self.claim_source_id(
                source_id, f"{CONFIG_FILE}:{line} [sources.{source_id}]"
            ),
            report=self.report,
        )

    def providers(self, file: _TomlFile | None) -> dict[str, ProviderConfig]:
        """Every usable `[providers.<id>]` of bastion.toml (see `bastion.config.providers`)."""
        if file is None:
            return {}
        providers, unbound = load_providers(
            file.data.get("providers"),
            file.path,
            file.index,
            unset_credentials=file.unset_credentials,
            claim=lambda provider_id, line: self.claim_source_id(
                provider_id, f"{CONFIG_FILE}:{line} [providers.{provider_id}]"
            ),
            report=self.report,
        )
        self.unbound.update(unbound)
        return providers

    def ledger_url(self, settings: Settings, file: _TomlFile | None) -> str:
        if is_postgres_url(settings.server.ledger):
            return settings.server.ledger
        try:
            path = sqlite_path(settings.server.ledger)
        except ConfigError as exc:
            line = file.index.line_of(("server", "ledger")) if file else 1
            default = ServerSettings().ledger
            self.report(self.directory / CONFIG_FILE, line, f"{exc.message}; using the default {default}")
            path = sqlite_path(default)
        return SQLITE_PREFIX + str(self.directory / path)

    def connectors(self) -> list[ConnectorConfig]:
        loaded: dict[str, tuple[ConnectorConfig, Path]] = {}
        for path in self.toml_files("connectors"):
            found = self.connector(path)
            if found is None:
                continue
            connector, line = found
            first = self.claim_source_id(connector.id, f"{self.name(path)}:{line}")
            if first is not None:
                self.report(
                    path,
                    line,
                    f'source id "{connector.id}" is already claimed by {first}; this file is ignored: rename it or '
                    "set another id",
                )
                continue
            loaded[connector.id] = (connector, path)
        return [connector for connector, _ in loaded.values()]

    def connector(self, path: Path) -> tuple[ConnectorConfig, int] | None:
        """One connector file and the line of its id, or None (with issues) when it is not usable."""
        file = self.read(path)
        if file is None:
            return None
        data = file.data
        if "id" not in data:
            if not _SOURCE_ID.match(path.stem):
                suggestion = re.sub(r"[^a-z0-9_-]+", "_", path.stem.lower()).strip("_") or "my_connector"
                self.report(
                    path,
                    1,
                    f'the file name "{path.name}" is not a valid connector id (lowercase letters, digits, "_", "-"); '
                    f'rename it (e.g. "{suggestion}.toml") or set id = "{suggestion}" in it',
                )
                return None
            data = {"id": path.stem, **data}
        try:
            connector = ConnectorConfig.model_validate(data)
        except ValidationError as exc:
            for error in exc.errors():
                self.report_invalid(file, ConnectorConfig, error, "this file is ignored")
            return None
        needed = "command" if connector.transport == "stdio" else "url"
        if not getattr(connector, needed):
            example = 'command = "npx"' if needed == "command" else 'url = "https://example.com/mcp"'
            self.report(
                path,
                file.index.line_of(("transport",)),
                f'transport "{connector.transport}" needs {needed}; add e.g. {example} (file ignored until then)',
            )
            return None
        updates: dict[str, Any] = {}
        if connector.command == PYTHON_COMMAND:
            updates["command"] = sys.executable
        if connector.cwd is not None:
            updates["cwd"] = str(self.directory / connector.cwd)
        self.command_lines.setdefault(connector.id, (path, file.index.line_of(("command",))))
        return connector.model_copy(update=updates), file.index.line_of(("id",))

    def policy(self) -> PolicyConfig:
        modes: dict[str, _Placed] = {}
        profile_modes: dict[str, dict[str, _Placed]] = {}
        counts = ApproverCounts()
        inline: dict[str, _Placed] = {}
        disabled: list[str] = []
        rules: list[PolicyRule] = []
        profile_rules: dict[str, list[PolicyRule]] = {}
        for path in self.toml_files("policies"):
            if path.name == APPROVED_FILE:  # not policy: earlier approvals, imported as grants (pipeline.grants)
                continue
            reported = len(self.issues)
            file = self.read(path, until=_POLICY_UNREADABLE)
            if file is None:
                # Skipping it could allow what it denies: every call is denied until it is fixed (fails closed).
                self.unreadable_policies.append(f"{self.name(path)}:{self.issues[reported].line}")  # its first problem
                continue
            _stringify_modes(file.data)
            problems = list(approver_problems(file.data, _POLICY_KEY, file.index.line_of))  # before it is validated
            policy = self.validate_salvaging(file, PolicyConfig, "this entry is ignored")
            self.merge_modes(modes, policy.modes, file, ("modes",))
            for line, message in [*problems, *counts.add(policy, file.path, file.index.line_of)]:
                self.report(file.path, line, message)
            rules.extend(self.check_rules(policy.rules, file, ("rules",)))
            for name, profile in policy.profiles.items():
                self.merge_modes(profile_modes.setdefault(name, {}), profile.modes, file, ("profiles", name, "modes"))
                profile_rules.setdefault(name, []).extend(
                    self.check_rules(profile.rules, file, ("profiles", name, "rules"))
                )
                if "inline_approval" in profile.model_fields_set:
                    self.merge_inline(inline, name, profile.inline_approval, file)
            disabled.extend(source for source in policy.sources.disabled if source not in disabled)
        return PolicyConfig(
            modes={key: placed.value for key, placed in modes.items()},
            rules=rules,
            approvers=counts.of(None),
            profiles={
                name: Profile(
                    modes={key: placed.value for key, placed in profile_modes.get(name, {}).items()},
                    rules=profile_rules.get(name, []),
                    approvers=counts.of(name),
                    inline_approval=name in inline and inline[name].value == "true",
                )
                for name in {**profile_modes, **profile_rules, **counts.profiles}
            },
            sources=SourcesPolicy(disabled=disabled),
        )

    def merge_modes(self, merged: dict[str, _Placed], modes: dict[str, str], file: _TomlFile, table: KeyPath) -> None:
        """Check one file's mode map and merge it; a key set in two files keeps the stricter value."""
        where = dotted_key(table)
        for key, value in modes.items():
            line = file.index.line_of((*table, key))
            if not _POLICY_KEY.match(key):
                self.report(
                    file.path,
                    line,
                    f'[{where}] key "{key}" is not a policy key; write "source:action" or "source:*" '
                    '(source: lowercase letters, digits, "_", "-"; "*" only as the whole action)',
                )
            if value not in MODES:
                self.report(
                    file.path,
                    line,
                    f'[{where}] "{key}" = "{value}" is not a mode; use allow, require_approval or deny '
                    "(until then it resolves to deny)",
                )
            here = _Placed(value, file.path, line)
            earlier = merged.get(key)
            if earlier is None:
                merged[key] = here
                continue
            kept = here if strictness(value) > strictness(earlier.value) else earlier
            merged[key] = kept
            self.report(
                file.path,
                line,
                f'[{where}] "{key}" is set in both {self.name(earlier.file)}:{earlier.line} ("{earlier.value}") '
                f'and {self.name(file.path)}:{line} ("{value}"); the stricter "{kept.value}" applies. '
                "Keep it in one file only",
            )

    def check_rules(self, rules: list[PolicyRule], file: _TomlFile, table: KeyPath) -> list[PolicyRule]:
        """Report what is wrong with one file's rules (each kept: a broken one only ever resolves stricter)."""
        for i, rule in enumerate(rules):
            for field_name, message in rule_problems(rule, _POLICY_KEY, MODES):
                self.report(
                    file.path, file.index.line_of((*table, i, field_name)), f"[[{dotted_key(table)}]] {message}"
                )
        return rules

    def merge_inline(self, merged: dict[str, _Placed], profile: str, value: bool, file: _TomlFile) -> None:
        line = file.index.line_of(("profiles", profile, "inline_approval"))
        here = _Placed("true" if value else "false", file.path, line)
        earlier = merged.get(profile)
        if earlier is None:
            merged[profile] = here
        elif earlier.value != here.value:
            merged[profile] = _Placed("false", file.path, line)
            self.report(
                file.path,
                line,
                f"profiles.{profile}.inline_approval is {earlier.value} in {self.name(earlier.file)}:{earlier.line} "
                f"and {here.value} here; it stays off. Set it in one file only",
            )


PROTECTIVE: Final[tuple[KeyPath, ...]] = (("server", "ledger"), ("ledger", "key_file"), ("audit",))
"""Settings of bastion.toml that decide where data lives or how it is protected: one whose `${env:NAME}` is not
set stops every command, rather than have it run on a default ledger, key or audit setting."""


def _unset(file: _TomlFile, key_path: KeyPath, variable: str | None) -> tuple[int, str]:
    """The line and the message of an unset or malformed `${env:...}` reference at `key_path`."""
    key_line = file.index.line_of(key_path)
    if variable is None:
        line = line_containing(file.text, _ENV_START, key_line)
        return line, f"malformed reference in {dotted_key(key_path)}; write it as ${{env:NAME}}"
    line = line_containing(file.text, f"${{env:{variable}}}", key_line)
    return line, f"environment variable {variable} is not set; set it or remove the reference"


def _drop(data: dict[str, Any], key_path: KeyPath) -> KeyPath:
    """Remove the setting an unset reference is in, so its default applies: the deepest key along `key_path`
    through tables, never into a list (a list is dropped whole). Returns the path of what was removed."""
    table: dict[str, Any] = data
    depth = 1
    while depth < len(key_path) and isinstance(table.get(str(key_path[depth - 1])), dict):
        table = table[str(key_path[depth - 1])]
        depth += 1
    table.pop(str(key_path[depth - 1]), None)
    return key_path[:depth]


def _substitute_env(
    value: Any, env: Mapping[str, str], path: KeyPath, problems: list[tuple[KeyPath, str | None]]
) -> Any:
    """Replace `${env:NAME}` in every string; unset names and malformed references go to `problems`."""
    if isinstance(value, dict):
        return {key: _substitute_env(item, env, (*path, key), problems) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute_env(item, env, (*path, i), problems) for i, item in enumerate(value)]
    if not isinstance(value, str) or _ENV_START not in value:
        return value
    if _ENV_START in _ENV_REFERENCE.sub("", value):
        problems.append((path, None))

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            problems.append((path, name))
            return ""
        return env[name]

    return _ENV_REFERENCE.sub(replace, value)


def _stringify_modes(data: dict[str, Any]) -> None:
    """Keep a non-string mode value (in `[modes]` or a rule's `mode`) as text: it is then reported and resolves to
    deny, instead of vanishing."""
    tables = [data.get("modes")]
    rule_lists = [data.get("rules")]
    profiles = data.get("profiles")
    if isinstance(profiles, dict):
        tables.extend(profile.get("modes") for profile in profiles.values() if isinstance(profile, dict))
        rule_lists.extend(profile.get("rules") for profile in profiles.values() if isinstance(profile, dict))
    for table in tables:
        if isinstance(table, dict):
            for key, value in table.items():
                if not isinstance(value, str):
                    table[key] = json.dumps(value, default=str)
    for rules in rule_lists:
        for rule in rules if isinstance(rules, list) else []:
            if isinstance(rule, dict) and "mode" in rule and not isinstance(rule["mode"], str):
                rule["mode"] = json.dumps(rule["mode"], default=str)


def _known_keys(model: type[BaseModel], loc: KeyPath) -> list[str]:
    """The keys the model accepts at `loc`, to suggest a correction for an unknown key."""
    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return []
            current = field.annotation
        elif get_origin(current) in (dict, list):
            current = get_args(current)[-1]
        else:
            return []
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _unwrap(annotation: Any) -> Any:
    """`X` from `Annotated[X, ...]`, `X | None` and `Optional[X]`."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            members = [arg for arg in get_args(annotation) if arg is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation
