"""The configuration's pydantic models (DESIGN.md §8): `bastion.toml` settings, connector files, policies.

They validate what a file says; `bastion.config.loader` finds the files, reports every problem with its
file and line, and builds a `Config` from what is usable.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from bastion.models import Risk
from bastion.policies import normalize_risk


def _risk(value: Any) -> Any:
    """A risk or one of seed 000's tiers, in any case; anything else is left for pydantic to refuse."""
    try:
        return normalize_risk(value) if isinstance(value, str) else value
    except ValueError:
        return value


RiskSetting = Annotated[Risk, BeforeValidator(_risk)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerSettings(_Strict):
    ledger: str = "sqlite:///state/ledger.db"
    """`sqlite:///path` (relative to the config directory) or `postgresql://...`."""
    shutdown_grace_seconds: float = Field(default=10, ge=0)
    """On SIGTERM/SIGINT, how long calls already running may take to finish before they are cancelled."""


class ApprovalSettings(_Strict):
    expiry_seconds: float = Field(default=300, gt=0)
    heartbeat_seconds: float = Field(default=5, gt=0)
    max_pending_per_session: int = Field(default=10, ge=1)


class LimitSettings(_Strict):
    invocations_per_minute: int = Field(default=60, ge=1)
    list_timeout_seconds: float = Field(default=15, gt=0)
    call_timeout_seconds: float = Field(default=30, gt=0)


class LedgerSettings(_Strict):
    max_result_bytes: int = Field(default=16384, ge=256)
    extra_secret_keys: list[str] = Field(default_factory=list)
    key_file: str | None = None
    """The file of the key of argument hashes, relative to the config directory. Default: beside a SQLite ledger;
    `state/ledger.key` for PostgreSQL, where every instance on one database needs the same key."""


class Settings(_Strict):
    """`bastion.toml`."""

    server: ServerSettings = Field(default_factory=ServerSettings)
    approvals: ApprovalSettings = Field(default_factory=ApprovalSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)


class ToolPin(_Strict):
    """An explicit pin of a tool's definition (DESIGN.md §5)."""

    fingerprint: str
    structural: str | None = None


class ToolOverride(_Strict):
    """`[tools.<upstream name>]` in a connector file."""

    risk: RiskSetting | None = None
    hidden: bool = False
    pin: ToolPin | None = None


class ConnectorConfig(_Strict):
    """`connectors/<id>.toml`: one downstream MCP server."""

    id: str = Field(pattern=r"^[a-z0-9_-]+$")
    transport: Literal["stdio", "http", "sse"] = "stdio"
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    namespace: str | None = None
    """Prefix of the tool names the host sees; None means the id, "" mounts tools unprefixed."""
    default_risk: RiskSetting | None = None
    pin_new_tools: Literal["trust", "approve"] = "trust"
    tools: dict[str, ToolOverride] = Field(default_factory=dict)

    @property
    def effective_namespace(self) -> str:
        return self.id if self.namespace is None else self.namespace


class Profile(_Strict):
    modes: dict[str, str] = Field(default_factory=dict)
    """Mode values stay strings: an unknown value must fail safe to `deny` at resolution (§4)."""
    inline_approval: bool = False


class SourcesPolicy(_Strict):
    disabled: list[str] = Field(default_factory=list)


class PolicyConfig(_Strict):
    """`policies/*.toml`, all files merged into one."""

    modes: dict[str, str] = Field(default_factory=dict)
    profiles: dict[str, Profile] = Field(default_factory=dict)
    sources: SourcesPolicy = Field(default_factory=SourcesPolicy)


class ConfigIssue(BaseModel):
    """One problem found in a configuration file, with where it is and how to fix it."""

    model_config = ConfigDict(frozen=True)

    file: Path
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.message}"


class Config(BaseModel):
    """A loaded configuration directory (or the embedded default when `directory` is None)."""

    directory: Path | None
    settings: Settings
    connectors: list[ConnectorConfig]
    policy: PolicyConfig
    issues: list[ConfigIssue] = Field(default_factory=list)
    command_lines: dict[str, tuple[Path, int]] = Field(default_factory=dict)
    """Where each loaded connector's `command` is set (file, line), by connector id: for `bastion doctor`."""
    ledger_url: str
    """The ledger URL with relative SQLite paths resolved against the config directory."""
    ledger_key: Path | None = None
    """The file of the ledger's key of argument hashes; None: beside the SQLite file."""

    @property
    def ledger_display(self) -> str:
        """The ledger URL as messages show it: without a password."""
        return display_url(self.ledger_url)

    @property
    def has_errors(self) -> bool:
        """Whether any file had a problem (`doctor` lists them; what was broken is skipped or defaulted)."""
        return bool(self.issues)

    def issues_by_file(self) -> dict[Path, list[ConfigIssue]]:
        """The issues grouped per file, in loading order (for `doctor`)."""
        grouped: dict[Path, list[ConfigIssue]] = {}
        for issue in self.issues:
            grouped.setdefault(issue.file, []).append(issue)
        return grouped


def display_url(url: str) -> str:
    """`url` without its password (a PostgreSQL ledger URL may carry one), for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))
