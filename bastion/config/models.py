"""The configuration's pydantic models: `bastion.toml` settings, connector files, policies.

They validate what a file says; `bastion.config.loader` finds the files, reports every problem with its
file and line, and builds a `Config` from what is usable.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Final, Literal, get_args
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from bastion.actions import DriftListing
from bastion.models import PolicyRule
from bastion.policies import KeepsTiers, RiskSetting

_DNS_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_DNS_NAME = re.compile(rf"(?=.{{1,253}}$){_DNS_LABEL}(?:\.{_DNS_LABEL})*")


def host_name(text: str) -> str:
    """A name or address hosts may reach Bastion by (`[server] allowed_hosts`, `serve --allowed-host`), as the
    Host check compares it: a DNS name in lower case without a trailing dot, or an IP address in its usual form.

    Ports are not part of it: DNS rebinding needs a name the attacker controls, so the name is what is checked,
    and any port of an allowed name is served. ValueError names what is wrong and the fix.
    """
    entry = text.strip().lower().rstrip(".")
    bare = entry[1:-1] if entry.startswith("[") and entry.endswith("]") else entry
    try:
        return str(ipaddress.ip_address(bare))
    except ValueError:
        pass
    if _DNS_NAME.fullmatch(entry):
        return entry
    if "/" in entry:
        raise ValueError(
            f"{text!r} is not a host name; give the name alone, without scheme or path, e.g. 'bastion.example.com'"
        )
    name, _, port = entry.rpartition(":")
    if port.isdigit() and (_DNS_NAME.fullmatch(name) or name.startswith("[")):
        raise ValueError(f"{text!r} has a port; give the name alone ({name!r}): any port of an allowed name is served")
    raise ValueError(
        f"{text!r} is not a host name or an IP address (no wildcards); give names such as 'bastion.example.com' "
        "or addresses such as '10.0.0.5'"
    )


HostName = Annotated[str, AfterValidator(host_name)]

WEBHOOK_URL: Final = r"^https?://[^\s/]+"
"""What every URL Bastion POSTs to looks like: http or https, then a host."""
LOOPBACK_NAMES: Final = frozenset({"127.0.0.1", "localhost", "::1"})


def is_loopback(host: str) -> bool:
    """Whether `host` (an address to bind, a URL's host name without brackets) is this machine only: localhost or a
    loopback address."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def anchor_url(text: str) -> str:
    """Where signed anchors of the audit chain are POSTed: a webhook URL, over https unless the receiver is on this
    machine (plain http elsewhere lets anyone on the way read and drop them). ValueError names the problem and the
    fix."""
    parts = urlsplit(text)
    if re.match(WEBHOOK_URL, text) is None or not parts.hostname:
        raise ValueError(f"{text!r} is not a URL to POST anchors to; write it as https://receiver.example.com/anchors")
    if parts.scheme == "http" and not is_loopback(parts.hostname):
        raise ValueError(
            f"anchors would go to {parts.hostname} over plain http, which anyone on the way can read or drop; use "
            "https, or plain http only to a receiver on this machine (localhost, 127.0.0.1, [::1])"
        )
    return text


AnchorUrl = Annotated[str, AfterValidator(anchor_url)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServerSettings(_Strict):
    """`[server]`: where the ledger lives and how `bastion serve` starts, stops and is reached."""

    ledger: str = "sqlite:///state/ledger.db"
    """`sqlite:///path` (relative to the config directory) or `postgresql://...`."""
    shutdown_grace_seconds: float = Field(default=10, ge=0)
    """On SIGTERM/SIGINT, how long calls already running may take to finish before they are cancelled."""
    allowed_hosts: list[HostName] = Field(default_factory=list)
    """Names (or addresses) hosts may reach Bastion by over HTTP, besides loopback, the bound address and, when it
    listens beyond loopback, any IP address. Everything else is refused 421 (DNS-rebinding protection)."""
    startup_wait_seconds: float = Field(default=5, ge=0)
    """`bastion serve` answers hosts at once; for this long after it starts, a listing (or a call of a tool not
    listed yet) waits for connectors still starting, then is answered with what is ready."""
    express_lane: bool = True
    """Answer plain allowed tool calls without the MCP SDK's server and client models (bastion.server.express):
    the same pipeline, checks and records, a fraction of the CPU. `false` serves every call through the SDK."""


class ApprovalSettings(_Strict):
    """`[approvals]`: how long held calls wait, what their hosts hear meanwhile, and what approvals leave."""

    expiry_seconds: float = Field(default=300, gt=0)
    """How long a held call waits for a decision; then it is `expired` and its host gets `approval_expired`."""
    heartbeat_seconds: float = Field(default=5, gt=0)
    """How often a waiting host that sent a progress token is told the call still waits, and where to approve it."""
    max_pending_per_session: int = Field(default=10, ge=1)
    """How many calls one session may have waiting at once; the next is refused `pending_limit`."""
    wait_without_progress_seconds: float = Field(default=45, ge=0)
    """How long a call waits for its approver when the host sent no progress token (so gets no heartbeats and
    may time out): then it returns `approval_pending`, naming the invocation, and stays pending."""
    drift_listing: DriftListing = "pinned"
    """What `tools/list` shows of a drifted tool until `pins accept` (a connector file may override it)."""
    always_grant_days: float = Field(default=90, gt=0)
    """How long an approval "always" lets later calls of its action through (bastion.pipeline.grants)."""
    preview_timeout_seconds: float = Field(default=5, gt=0)
    """How long a held call's preview may take (a file read, a dry run): past it the approver is shown `no preview`,
    and the call is held all the same."""
    preview_max_bytes: int = Field(default=8192, ge=256)
    """How much of a preview is kept (UTF-8 bytes of its text); a longer one is cut at a line, with a note."""
    retry_window_seconds: float = Field(default=300, ge=0)
    """How long after a held call ended (decided, expired, run) the same call sent again by the same caller gets that
    call's outcome instead of a new invocation. While the call is undecided or running, a retry always waits for it."""


class LimitSettings(_Strict):
    """`[limits]`: the rate of calls per session and how long Bastion waits for its sources."""

    invocations_per_minute: int = Field(default=60, ge=1)
    """Calls one session may make in any 60 seconds; the next is refused `rate_limited` with the wait."""
    list_timeout_seconds: float = Field(default=15, gt=0)
    """How long a connector may take to connect and list its tools before the attempt is abandoned; `catalog` and
    `connectors list|check` wait for every connector up to this long."""
    call_timeout_seconds: float = Field(default=30, gt=0)
    """How long one call to a source may take before Bastion stops waiting for it (`timeout`; a provider call that may
    have changed something is recorded `unknown`)."""


class LedgerSettings(_Strict):
    """`[ledger]`: what is stored of each call, where its keys live, how long it is kept and where its chain is
    anchored."""

    max_result_bytes: int = Field(default=16384, ge=256)
    """Arguments and results are stored redacted and truncated to valid JSON under this size (the host still gets
    the whole result)."""
    extra_secret_keys: list[str] = Field(default_factory=list)
    """Argument and result keys whose values are redacted too, beside the built-in ones (`password`, `token`, ...)."""
    key_file: str | None = None
    """The file of the key of argument hashes, relative to the config directory. Default: beside a SQLite ledger;
    `state/ledger.key` for PostgreSQL, where every instance on one database needs the same key."""
    retention_days: float | None = Field(default=None, gt=0)
    """How long finished calls are kept: what `bastion audit prune` removes when given no age. None: no default
    (prune then needs `--older-than-days`); nothing is ever pruned unless that command runs."""
    anchor_file: str | None = None
    """Where signed anchors of the audit chain's head are appended (bastion.ledger.anchors), relative to the config
    directory: by `bastion audit anchor`, and by `bastion serve` every `anchor_every_seconds` the chain moved.
    `bastion audit verify` checks the chain against them. Keep it where the database's writers cannot rewrite it
    (another disk, a log shipper). None: anchors go to `anchor_url` only; with neither, `audit anchor` prints the
    anchor, and serve anchors nothing."""
    anchor_secret: SecretStr | None = None
    """Signs each anchor POSTed to `anchor_url`, as a `json` webhook's bodies are (`X-Bastion-Signature`: HMAC-SHA256
    over `<timestamp>.<body>`); required with it. Bind it as `anchor_secret = "${env:NAME}"`."""
    anchor_url: AnchorUrl | None = None
    """Where each anchor is also POSTed, as JSON (the line `anchor_file` gets): https, or plain http to a receiver on
    this machine. One that fails is kept in the ledger's outbox and sent, before any newer one, at the next
    anchoring. Set alone, `bastion serve` anchors to it; with `anchor_file` too, both get every anchor."""
    anchor_every_seconds: float = Field(default=300, gt=0)
    """How often `bastion serve` anchors the chain's head, when `anchor_file` or `anchor_url` is set and the chain
    moved since."""

    @field_validator("anchor_url")
    @classmethod
    def _anchor_signed(cls, url: str | None, info: ValidationInfo) -> str | None:
        secret = info.data.get("anchor_secret")
        if url is not None and (secret is None or not secret.get_secret_value()):
            raise ValueError(
                'anchor_url needs anchor_secret to sign what it sends: add anchor_secret = "${env:NAME}" to [ledger] '
                "(the receiver checks X-Bastion-Signature with it)"
            )
        return url


NotifiedEvent = Literal[
    "approval_requested", "approval_recorded", "approval_decided", "invocation_finished", "drift_detected"
]
"""The named events of bastion.pipeline.events, as webhooks may choose them."""


class WebhookSettings(_Strict):
    """One `[[notify.webhook]]`: where to POST each event, and how."""

    url: str = Field(pattern=WEBHOOK_URL)
    """Where each message is POSTed (http or https); bind a Slack webhook's as `url = "${env:NAME}"`."""
    secret: SecretStr | None = None
    """Signs each body (HMAC-SHA256 over `<timestamp>.<body>`); required for the `json` format."""
    format: Literal["json", "slack"] = "json"
    """`json`: Bastion's own signed body. `slack`: a Slack incoming-webhook message (its URL is the secret)."""
    events: list[NotifiedEvent] = Field(default_factory=lambda: list(get_args(NotifiedEvent)))
    """Which events it is told of (default: all)."""

    @model_validator(mode="after")
    def _signed(self) -> WebhookSettings:
        if self.format == "json" and (self.secret is None or not self.secret.get_secret_value()):
            raise ValueError(
                'a "json" webhook needs a secret to sign its bodies with: add secret = "${env:NAME}" '
                "(receivers check X-Bastion-Signature with it)"
            )
        return self


class NotifySettings(_Strict):
    """`[notify]`: webhooks told of approvals and outcomes, from an outbox in the ledger."""

    inbox_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+")
    """The inbox as approvers reach it (`https://bastion.example.com/inbox`), for the links in messages; default:
    the address `bastion serve --transport http` listens on."""
    webhook: list[WebhookSettings] = Field(default_factory=list)
    """The `[[notify.webhook]]` tables: each POSTed every event it chooses, retried from the ledger's outbox."""


class PluginSettings(_Strict):
    """`[plugins]` in `bastion.toml`: plugin action packages `actions/<name>/action.json`."""

    allow_plugin_code: bool = False
    """Plugin packages run code of their own; they are loaded only when this is true."""
    workspace: str = "."
    """The working directory of every step of every plugin, relative to the config directory; path arguments are
    checked against it (and their scopes) with symlinks and `..` resolved."""
    allowed_commands: list[Annotated[list[str], Field(min_length=1)]] = Field(default_factory=list)
    """The global command allowlist: argument vectors. A package's verification command runs only if its vector
    starts with one of these (write the whole vector to allow exactly one command); never through a shell."""
    timeout_seconds: float = Field(default=30, gt=0)
    """How long each step (execute, verify, repair, rollback, each verification command) may run."""
    max_output_bytes: int = Field(default=1_048_576, ge=1024)
    """The most a step may write to stdout (its JSON output); past it the step is stopped and fails."""
    env: dict[str, SecretStr] = Field(default_factory=dict)
    """The bound credentials: the whole environment of every step (nothing else of Bastion's is passed)."""


class Settings(_Strict):
    """`bastion.toml`."""

    server: ServerSettings = Field(default_factory=ServerSettings)
    approvals: ApprovalSettings = Field(default_factory=ApprovalSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    ledger: LedgerSettings = Field(default_factory=LedgerSettings)
    notify: NotifySettings = Field(default_factory=NotifySettings)
    plugins: PluginSettings = Field(default_factory=PluginSettings)


class ToolPin(_Strict):
    """An explicit pin of a tool's definition."""

    fingerprint: str
    """The SHA-256 of the tool's canonical definition that is trusted (`bastion pins list` shows it)."""
    structural: str | None = None
    """The hash of its structure (names and schemas, without descriptions); None: not checked."""


class _KeepsTiers(KeepsTiers, _Strict):
    """A configuration model whose risks may be written as tiers (`KeepsTiers`)."""


class ToolPreview(_Strict):
    """`[tools.<upstream name>.preview]` in a connector file: how a held call of the tool is previewed, without
    acting, through the same downstream. Either `dry_run` (the tool itself answers what it would do when this
    argument is true), or `read` (a tool of the downstream that reads the file the call writes: the preview is the
    diff from what it reads to the call's `content`)."""

    dry_run: str | None = None
    """The tool's own argument that makes it change nothing and answer what it would do (`dryRun`)."""
    read: str | None = None
    """The downstream's tool that reads the current file (`read_text_file`), called with `{<path>: <the path>}`."""
    path: str = "path"
    """The argument of the call (and of `read`) naming the file."""
    content: str = "content"
    """The argument of the call holding the file's new content."""

    @model_validator(mode="after")
    def _one_way(self) -> ToolPreview:
        if (self.dry_run is None) == (self.read is None):
            raise ValueError("set exactly one of dry_run (the tool's own dry-run argument) or read (a read tool)")
        return self


class ToolOverride(_KeepsTiers):
    """`[tools.<upstream name>]` in a connector file."""

    _TIERED = ("risk",)
    risk: RiskSetting | None = None
    """The tool's risk (`read`, `write`, `danger`, or a tier `R0`-`R4`), over its annotations and `default_risk`."""
    hidden: bool = False
    """Keep the tool out of the catalog: hosts do not see it, and a call of it is `not_found`."""
    pin: ToolPin | None = None
    """Trust exactly this definition (`[tools.<name>.pin]`), instead of the one first seen."""
    preview: ToolPreview | Literal[False] | None = None
    """How a held call is previewed; None: the built-in way, if any (the official filesystem server's `write_file`
    and `edit_file`); false: no preview."""


class ConnectorConfig(_KeepsTiers):
    """`connectors/<id>.toml`: one downstream MCP server."""

    _TIERED = ("default_risk",)
    id: str = Field(pattern=r"^[a-z0-9_-]+$")
    """The source id: policy keys `<id>:<tool>`. Default: the file's name without `.toml`."""
    transport: Literal["stdio", "http", "sse"] = "stdio"
    """`stdio` starts `command` and talks to it on stdin and stdout; `http` (streamable HTTP) and `sse` connect to
    `url`."""
    command: str | None = None
    """The program to start (stdio). Exactly `python` means the Python that runs Bastion."""
    args: list[str] = Field(default_factory=list)
    """Its arguments, as a vector (never through a shell)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables for the program, on top of Bastion's; bind secrets as `${env:NAME}`."""
    cwd: str | None = None
    """Its working directory, relative to the config directory; None: Bastion's own."""
    url: str | None = None
    """The server's endpoint (http, sse)."""
    headers: dict[str, str] = Field(default_factory=dict)
    """HTTP headers sent to it (http, sse), e.g. `Authorization = "Bearer ${env:TOKEN}"`."""
    namespace: str | None = None
    """Prefix of the tool names the host sees; None means the id, "" mounts tools unprefixed."""
    default_risk: RiskSetting | None = None
    """The risk of a tool with no override and no `readOnlyHint` or `destructiveHint`; None: `write`."""
    pin_new_tools: Literal["trust", "approve"] = "trust"
    """A tool that appears later: `trust` pins it as first seen, `approve` holds its calls until an approver pins
    it."""
    drift_listing: DriftListing | None = None
    """Overrides `[approvals] drift_listing` for this connector's tools."""
    tools: dict[str, ToolOverride] = Field(default_factory=dict)
    """Per-tool settings (`[tools.<name>]`), by the tool's own name on the server."""

    @property
    def effective_namespace(self) -> str:
        return self.id if self.namespace is None else self.namespace


ProviderKind = Literal["github", "linear", "sentry", "slack"]
"""The HTTP APIs Bastion has its own actions for (`bastion.sources.providers`)."""
PROVIDER_KINDS: Final[tuple[ProviderKind, ...]] = get_args(ProviderKind)


class ProviderConfig(_Strict):
    """`[providers.<id>]` in `bastion.toml`: one provider source, enabled by being there.

    The table key is its source id; `kind` says which API it speaks (default: the id), so two GitHub
    instances can be `[providers.github]` and `[providers.ghe] kind = "github"`.
    """

    kind: ProviderKind | None = None
    """Which API it speaks; None: the table's key, which must then be one of them."""
    token: SecretStr | None = None
    """The credential, bound as `token = "${env:NAME}"`. Kept secret: never shown in a repr or a dump."""
    base_url: str | None = Field(default=None, pattern=r"^https?://[^\s/]+")
    """The API root for GitHub Enterprise, self-hosted Sentry or a test server; None means the public API."""
    namespace: str | None = None
    """Prefix of the tool names the host sees; None means the id, "" mounts them unprefixed."""
    organization: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    """Sentry only (and required there): the organization slug its issues belong to."""

    def effective_kind(self, provider_id: str) -> ProviderKind | None:
        """The API it speaks: `kind`, else its id when that names one; None when neither does."""
        if self.kind is not None:
            return self.kind
        return next((kind for kind in PROVIDER_KINDS if kind == provider_id), None)

    def effective_namespace(self, provider_id: str) -> str:
        return provider_id if self.namespace is None else self.namespace


class Profile(_Strict):
    """`[profiles.<name>]`: modes and rules for the sessions bound to the profile (`serve --profile`, an agent
    token's `--profile`), tried before the organisation's."""

    modes: dict[str, str] = Field(default_factory=dict)
    """Mode values stay strings: an unknown value must fail safe to `deny` at resolution (`bastion.policies.modes`)."""
    rules: list[PolicyRule] = Field(default_factory=list)
    """Conditional modes (`[[profiles.<name>.rules]]`), tried before `modes` for their key."""
    approvers: dict[str, int] = Field(default_factory=dict)
    """`[profiles.<name>.approvers]`: as `[approvers]`, for this profile's sessions."""
    inline_approval: bool = False
    """Also ask the host's own user with a form (elicitation) while a call waits; never for sessions with a token."""


class SourcesPolicy(_Strict):
    """`[sources]` of a policy file."""

    disabled: list[str] = Field(default_factory=list)
    """Source ids that expose nothing: their tools are not listed, a call of one is `source_disabled`."""


class PolicyConfig(_Strict):
    """`policies/*.toml`, all files merged into one."""

    modes: dict[str, str] = Field(default_factory=dict)
    """The organisation's modes (`[modes]`) by policy key (`source:action` or `source:*`): `allow`,
    `require_approval` or `deny`; any other value denies."""
    rules: list[PolicyRule] = Field(default_factory=list)
    """Conditional organisation modes (`[[rules]]`), tried before `modes` for their key."""
    approvers: dict[str, int] = Field(default_factory=dict)
    """`[approvers]`: how many distinct approvers a held call needs, by policy key (`source:action`, `source:*`) or
    risk tier (`R0`..`R4`); 2 is two-person approval. The most any entry for a call asks applies (default 1); 0 marks
    a value that was invalid (bastion.config.approvers): its calls are denied."""
    profiles: dict[str, Profile] = Field(default_factory=dict)
    """Named profiles (`[profiles.<name>]`)."""
    sources: SourcesPolicy = Field(default_factory=SourcesPolicy)
    """Which sources are disabled (`[sources]`)."""


class ConfigIssue(BaseModel):
    """One problem found in a configuration file, with where it is and how to fix it."""

    model_config = ConfigDict(frozen=True)

    file: Path
    line: int
    message: str
    error_class: str = "config_error"
    """`config_error`, or for an action file one of the manifest error classes `parse_error`, `validation_error`,
    `capability_denied` or `not_found`."""
    boundary: str = "config"
    """Which side to fix: `config` (the file), or for an action file `manifest` (it) or `connector` (one it needs)."""

    def __str__(self) -> str:
        kind = "" if self.error_class == "config_error" else f"{self.error_class}: "
        return f"{self.file}:{self.line}: {kind}{self.message}"


class ExternalSource(BaseModel):
    """`[sources.<id>]` in `bastion.toml`: a source of a kind an installed package offers (the entry point named
    `kind` in the group `bastion.sources`). Its other keys are the kind's settings, checked by the kind's own model
    when it loads: third-party code runs only for a kind the configuration names."""

    model_config = ConfigDict(frozen=True)

    kind: str
    settings: dict[str, Any] = Field(default_factory=dict)
    file: Path
    line: int
    """Where `[sources.<id>]` is, for the problems of loading it."""


class Config(BaseModel):
    """A loaded configuration directory (or the embedded default when `directory` is None)."""

    directory: Path | None
    settings: Settings
    connectors: list[ConnectorConfig]
    policy: PolicyConfig
    unreadable_policies: list[str] = Field(default_factory=list)
    """Policy files that could not be read or parsed (`policies/<file>:<line>`). Skipping one could allow what it
    denies, so while there is one every call resolves `deny` (mode source `unreadable_policy:<file>:<line>`)."""
    issues: list[ConfigIssue] = Field(default_factory=list)
    command_lines: dict[str, tuple[Path, int]] = Field(default_factory=dict)
    """Where each loaded connector's `command` is set (file, line), by connector id: for `bastion doctor`."""
    providers: dict[str, ProviderConfig] = Field(default_factory=dict)
    """`[providers.<id>]` of `bastion.toml` by source id, each checked (kind, Sentry's organization, no id clash)."""
    sources: dict[str, ExternalSource] = Field(default_factory=dict)
    """`[sources.<id>]` of `bastion.toml` by source id: sources of kinds installed packages offer."""
    unbound: dict[str, ConfigIssue] = Field(default_factory=dict)
    """Providers whose credential is not bound (`binding_required`), by id: where and how to bind it. They are
    loaded, listed as `unavailable` and refuse their calls; `bastion doctor` reports them as problems."""
    ledger_url: str
    """The ledger URL with relative SQLite paths resolved against the config directory."""
    ledger_key: Path | None = None
    """The file of the ledger's key of argument hashes; None: beside the SQLite file."""

    @property
    def anchor_file(self) -> Path | None:
        """`[ledger] anchor_file`, resolved against the config directory; None when not set."""
        relative = self.settings.ledger.anchor_file
        if relative is None:
            return None
        path = Path(relative).expanduser()
        return path if path.is_absolute() or self.directory is None else self.directory / path

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
