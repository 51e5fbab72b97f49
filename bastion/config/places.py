"""Where a configuration and its state live: finding the directory, the embedded default and its
state directory, ledger URLs and the key file, and writing a starter directory (`bastion init`)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Final

from bastion.config.models import Config, ConnectorConfig, PolicyConfig, ServerSettings, Settings
from bastion.errors import ConfigError
from bastion.program import bastion_command

CONFIG_FILE: Final = "bastion.toml"
CONFIG_ENV_VAR: Final = "BASTION_CONFIG"
PYTHON_COMMAND: Final = "python"
"""A connector `command` of exactly this runs the interpreter that runs Bastion (`sys.executable`)."""
STARTER_FILES: Final = ("bastion.toml", "connectors/notes.toml", "policies/default.toml")

SQLITE_PREFIX: Final = "sqlite:///"
POSTGRES_PREFIXES: Final = ("postgresql://", "postgres://")
DEFAULT_POSTGRES_KEY: Final = "state/ledger.key"
"""Where a PostgreSQL ledger's key of argument hashes is kept, relative to the config directory, by default."""


def find_config_dir(explicit: Path | None, *, env: Mapping[str, str], cwd: Path, home: Path) -> Path | None:
    """The configuration directory: `explicit` (`--config`), else `$BASTION_CONFIG`, else the current directory
    when it holds `bastion.toml`, else `~/.config/bastion` when it exists; None for the embedded default.

    `--config` and `$BASTION_CONFIG` must name an existing directory: a typo there must not silently
    fall back to another configuration.
    """
    if explicit is not None:
        return existing_config_dir(cwd / _expand_home(explicit, home), "--config")
    from_env = env.get(CONFIG_ENV_VAR, "")
    if from_env:
        return existing_config_dir(cwd / _expand_home(Path(from_env), home), f"${CONFIG_ENV_VAR}")
    if (cwd / CONFIG_FILE).is_file():
        return cwd
    user_dir = user_config_dir(home)
    return user_dir if user_dir.is_dir() else None


def user_config_dir(home: Path) -> Path:
    """The configuration directory every command finds when nothing else names one: `~/.config/bastion`."""
    return home / ".config" / "bastion"


def config_option(directory: Path | None, *, home: Path | None) -> str:
    """What a printed `bastion ...` hint appends to reach this configuration (and so its ledger) from any
    directory: ` --config DIR`, shell-quoted; "" for the embedded default (None) and for `~/.config/bastion`,
    which commands find by default. An unknown `home` (None) always names the directory."""
    if directory is None or (home is not None and directory == user_config_dir(home).resolve()):
        return ""
    return f" --config {shlex.quote(str(directory))}"


def config_hint(config: Config) -> str:
    """`config_option` of a loaded configuration, for the current user (whose home may be unknown)."""
    try:
        home: Path | None = Path.home()
    except (RuntimeError, KeyError):
        home = None
    return config_option(config.directory, home=home)


def _expand_home(path: Path, home: Path) -> Path:
    if path.parts and path.parts[0] == "~":
        return home.joinpath(*path.parts[1:])
    return path


def existing_config_dir(path: Path, origin: str) -> Path:
    """`path` when it is a directory, else a ConfigError naming where it came from and how to make one."""
    if path.is_dir():
        return path
    problem = "is not a directory" if path.exists() else "does not exist"
    raise ConfigError(
        f"config directory {path} (from {origin}) {problem}; "
        f"create a starter one with `{bastion_command()} init {shlex.quote(str(path))}` or point {origin} at an "
        "existing directory"
    )


def default_state_dir(*, env: Mapping[str, str], home: Path) -> Path:
    """Where the embedded default keeps its state: `$XDG_STATE_HOME/bastion` or `~/.local/state/bastion`."""
    xdg = env.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".local" / "state"
    return base / "bastion"


def sqlite_path(ledger_url: str) -> Path:
    """The file of a `sqlite:///relative` or `sqlite:////absolute` ledger URL (ConfigError for another scheme):
    the loader resolves relative ones against the config directory, and `bastion.ledger.open_ledger` opens it."""
    path = ledger_url.removeprefix(SQLITE_PREFIX)
    if path == ledger_url or not path:
        scheme = ledger_url.split(":", 1)[0] if ":" in ledger_url else ledger_url
        raise ConfigError(
            f'ledger URL scheme "{scheme}" is not supported; use "sqlite:///state/ledger.db" (relative to the '
            'config directory), "sqlite:////absolute/path.db" or "postgresql://user:password@host:5432/database"'
        )
    return Path(path)


def is_postgres_url(url: str) -> bool:
    """Whether `url` names a PostgreSQL ledger (`postgresql://...` or `postgres://...`)."""
    return url.startswith(POSTGRES_PREFIXES)


def ledger_key(directory: Path, settings: Settings, ledger_url: str) -> Path | None:
    """The file of the key of argument hashes: `[ledger] key_file`, else `state/ledger.key` for PostgreSQL; None
    lets a SQLite ledger keep it beside its file."""
    key_file = settings.ledger.key_file
    if key_file is None and is_postgres_url(ledger_url):
        key_file = DEFAULT_POSTGRES_KEY
    return None if key_file is None else directory / key_file


def embedded_default(*, env: Mapping[str, str], home: Path) -> Config:
    """The configuration used when no directory is found: the bundled notes demo and a SQLite ledger."""
    state = default_state_dir(env=env, home=home)
    notes = ConnectorConfig(
        id="notes",
        transport="stdio",
        command=sys.executable,
        args=["-m", "bastion.demo.notes"],
        env={"BASTION_NOTES_FILE": str(state / "notes.json")},
    )
    ledger_url = SQLITE_PREFIX + str(state / "ledger.db")
    return Config(
        directory=None,
        settings=Settings(server=ServerSettings(ledger=ledger_url)),
        connectors=[notes],
        policy=PolicyConfig(),
        ledger_url=ledger_url,
    )


def init_config_dir(target: Path) -> list[Path]:
    """Write the starter configuration (the templates in `bastion/starter/`) into `target`.

    Creates `target` if needed and refuses to overwrite any existing file. Returns the files written.
    """
    if target.exists() and not target.is_dir():
        raise ConfigError(f"{target} is a file; choose an empty or new directory for `bastion init`")
    destinations = [target.joinpath(*name.split("/")) for name in STARTER_FILES]
    for destination in destinations:
        if destination.exists():
            raise _refuse_overwrite(destination)
    templates = resources.files("bastion.starter")
    written: list[Path] = []
    for name, destination in zip(STARTER_FILES, destinations, strict=True):
        template = templates
        for part in name.split("/"):
            template = template / part
        try:
            destination.parent.mkdir(parents=True, exist_ok=True)
            with destination.open("x", encoding="utf-8") as out:
                out.write(template.read_text(encoding="utf-8"))
        except FileExistsError as exc:
            raise _refuse_overwrite(destination) from exc
        except OSError as exc:
            raise ConfigError(f"cannot write {destination} ({exc.strerror}); choose a writable directory") from exc
        written.append(destination)
    return written


def _refuse_overwrite(path: Path) -> ConfigError:
    return ConfigError(
        f"{path} already exists and `bastion init` never overwrites files; choose an empty or new directory"
    )
