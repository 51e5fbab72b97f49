"""The typer application every command group registers on, and what the commands share: options,
output, exit statuses, and the composition config -> ledger -> gateway.

Exit statuses: 0 success, 1 a refused operation (not found, conflict, expired), 2 a usage or config error.
"""

from __future__ import annotations

import getpass
import importlib.util
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Final, TypeVar

import anyio
import typer
from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text
from typer.core import TyperOption

from bastion import __version__, assembly
from bastion.cli.logs import use_redactor
from bastion.cli.remote import TOKEN_ENV_VAR, RemoteApi, remote_api
from bastion.config import Config, config_hint, find_config_dir, load_config
from bastion.errors import BastionError, ConfigError, NotFound, Unauthenticated
from bastion.ledger import OpenLedger, Redactor
from bastion.models import Invocation, Principal
from bastion.pipeline.authority import local_owner, resolve_invocation_id
from bastion.pipeline.gateway import Gateway
from bastion.sources.mcp import McpConnector
from bastion.sources.registry import Sources

USAGE_ERROR: Final = "usage_error"
"""The error class of a command line used wrongly (exit 2), in `--json` error output."""
JSON_FLAG: Final = "--json"


def _flags_shown_as_flags() -> None:
    """typer's help writes `<bool>` beside every flag (`--json <bool>`), as if it took a value; a flag takes none,
    so its type column is left empty, as click's own help does."""
    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_shown_as_flags()

app = typer.Typer(
    help="Bastion: one policy-gated, audited MCP gateway for your agents' side effects.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)
logger = logging.getLogger("bastion")

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config", "-c", help="Configuration directory (else $BASTION_CONFIG, ./bastion.toml, ~/.config/bastion)."
    ),
]
JsonOption = Annotated[
    bool, typer.Option(JSON_FLAG, help='Print JSON for scripts instead of text; errors too, as {"error": ...}.')
]
T = TypeVar("T")

PRINCIPAL_ENV_VAR: Final = "BASTION_PRINCIPAL"
TIME_FORMAT: Final = "%Y-%m-%d %H:%M:%S"


class Exit(Exception):
    """A clean stop: the line people see (`error: ...`), the exit status, and the error class for `--json`."""

    def __init__(self, message: str, code: int, error_class: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.error_class = error_class or (USAGE_ERROR if code == 2 else "refused")

    @classmethod
    def of(cls, exc: BastionError) -> Exit:
        """Bastion's error as an exit: a configuration error exits 2, any other refusal 1 (named by its class)."""
        if isinstance(exc, ConfigError):
            return cls(f"error: {exc.message}", 2, exc.error_class)
        return cls(f"error: {exc.error_class}: {exc.message}", 1, exc.error_class)

    def json(self) -> dict[str, Any]:
        """`{"error": {"class", "message"}}`: what `--json` prints instead of the line."""
        message = str(self).removeprefix("error: ").removeprefix(f"{self.error_class}: ")
        return {"error": {"class": self.error_class, "message": message}}


def _print_version(value: bool) -> None:
    if value:
        out.print(__version__, markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", callback=_print_version, is_eager=True, help="Print Bastion's version and exit."
        ),
    ] = False,
) -> None:
    """Options that come before any command."""


UVLOOP: Final = importlib.util.find_spec("uvloop") is not None
"""uvloop is a dependency where it is built (not on Windows)."""


def run_async(fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, serving: bool = False) -> T:
    """Run a command's async body, turning Bastion's errors into exit statuses (config 2, refusals 1).

    `serving` (`bastion serve`) runs it on uvloop where it is installed: measured in one run against asyncio's own
    loop (bench/http_stack.py, and the stdio calls of bench/latency.py), it takes Bastion about a tenth less CPU
    per call. The other commands run for a moment and keep asyncio's loop."""
    try:
        return anyio.run(fn, *args, backend_options={"use_uvloop": serving and UVLOOP})
    except BastionError as exc:
        raise Exit.of(exc) from exc


def remote_or_local(url: str | None, token: str | None) -> RemoteApi | None:
    """The client of a remote Bastion's API when a URL is given (`--url` or its variable), else None: the command
    works on the local ledger. A URL without a token exits 2, saying how to get one."""
    try:
        return remote_api(url, token)
    except ConfigError as exc:
        raise Exit.of(exc) from exc


def emit_json(data: Any) -> None:
    """JSON for scripts: plain stdout, never wrapped or coloured."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def timestamp(moment: datetime) -> str:
    """A moment as people read it in tables (UTC, to the second)."""
    return moment.strftime(TIME_FORMAT)


def approver_principal() -> str:
    """Who decides from this command line while the ledger has no approver token: `$BASTION_PRINCIPAL`, else
    `local:<login name>`."""
    explicit = os.environ.get(PRINCIPAL_ENV_VAR, "").strip()
    if explicit:
        return explicit
    try:
        return f"local:{getpass.getuser()}"
    except (OSError, KeyError) as exc:  # no login name in the environment nor in the user database
        raise Exit(
            f"error: cannot tell who you are; set ${PRINCIPAL_ENV_VAR} to name the approver", 2, ConfigError.error_class
        ) from exc


async def local_approver(ledger: OpenLedger, config: Config, token: str | None) -> Principal:
    """Who decides (or re-pins, or manages tokens) on the local ledger: the principal of the token given
    (`--token`, else `$BASTION_TOKEN`), else the local owner (`approver_principal`), but only while the ledger
    has no owner or admin token. Once it has one, a token is required: an agent with a shell as the same user
    could otherwise approve its own calls. An agent's token is refused later, by `bastion.pipeline.authority`.
    """
    secret = token or os.environ.get(TOKEN_ENV_VAR) or None
    if secret is not None:
        principal = await ledger.tokens.authenticate(secret.strip())
        if principal is None:
            raise Unauthenticated(
                f"the token given (--token or ${TOKEN_ENV_VAR}) is not an active token of {config.ledger_display}; "
                f"check it, or see `bastion tokens list{config_hint(config)}`"
            )
        return principal
    if await ledger.tokens.has_approver_tokens():
        raise Unauthenticated(
            f"{config.ledger_display} has owner or admin tokens, so deciding from the command line needs one: pass "
            f"--token TOKEN or set ${TOKEN_ENV_VAR} (keep it out of your agents' environment)"
        )
    return local_owner(approver_principal())


# -- composition ------------------------------------------------------------------------------------


def load(config_dir: Path | None, *, report: bool = True) -> Config:
    """Find and load the configuration as `serve` does; warn about skipped parts when `report`."""
    try:
        directory = find_config_dir(config_dir, env=os.environ, cwd=Path.cwd(), home=Path.home())
        config = load_config(directory)
    except ConfigError as exc:
        raise Exit.of(exc) from exc
    if report:
        for issue in config.issues:
            err.print(f"warning: {issue}", markup=False, highlight=False)  # each says what holds until it is fixed
    return config


def redactor_in_logs(config: Config) -> Redactor:
    """The configuration's redactor, also scrubbing what the logs show."""
    redactor = assembly.redactor_of(config)
    use_redactor(redactor)
    return redactor


@asynccontextmanager
async def open_ledger(config: Config) -> AsyncIterator[OpenLedger]:
    """The configured ledger (`bastion.assembly.open_ledger`), its redactor scrubbing the logs too; closed on exit."""
    async with assembly.open_ledger(config, redactor_in_logs(config)) as ledger:
        yield ledger


async def find_invocation(ledger: OpenLedger, config: Config, text: str) -> Invocation:
    """The invocation `text` names (its id or a unique prefix); NotFound names the ledger looked in."""
    try:
        invocation = await ledger.invocations.get(await resolve_invocation_id(ledger.invocations, text))
    except NotFound as exc:
        raise NotFound(f"{exc.message} in {config.ledger_display}", invocation_id=text) from exc
    if invocation is None:
        raise NotFound(f"no invocation {text!r} in {config.ledger_display}", invocation_id=text)
    return invocation


class StartupProgress:
    """What the spinner says while connectors start: how many are ready or down, and which are still starting.

    Rendered afresh at every refresh of the spinner (from its thread), so it needs no updates of its own.
    """

    def __init__(self, sources: Sequence[McpConnector]) -> None:
        self.sources = sources

    def __rich__(self) -> Text:
        states = [source.status.state for source in self.sources]
        waiting = [source.source_id for source in self.sources if source.status.state == "starting"]
        line = f"starting {len(states)} connector(s): {states.count('ready')} ready, {states.count('down')} down"
        return Text(line + (f"; waiting for {', '.join(waiting)}" if waiting else ""))


@contextmanager
def startup_spinner(sources: Sequence[McpConnector], *, show: bool) -> Iterator[None]:
    """A spinner on stderr while `sources` start, when `show` and stderr is a terminal; erased when done."""
    if not (show and sources and err.is_terminal):
        yield
        return
    with Live(Spinner("dots", text=StartupProgress(sources)), console=err, transient=True, refresh_per_second=10):
        yield


@asynccontextmanager
async def open_gateway(
    config: Config, *, progress: bool = False, wait_for_sources: bool = True
) -> AsyncIterator[Gateway]:
    """A running gateway (`bastion.assembly.open_gateway`), its sources' problems printed as warnings. With
    `progress`, a spinner on stderr (a terminal only) says how the connectors are starting."""
    starting = partial(startup_spinner, show=progress)
    async with assembly.open_gateway(
        config,
        loaded=_warn_of_problems,
        wait_for_sources=wait_for_sources,
        redactor=redactor_in_logs(config),
        starting=starting,
    ) as gateway:
        yield gateway


def _warn_of_problems(sources: Sources) -> None:
    """Each problem found loading the sources, as a warning on stderr."""
    for problem in sources.problems:
        skipped = " (this action file is skipped)" if problem.error_class in ("parse_error", "validation_error") else ""
        err.print(f"warning: {problem}{skipped}", markup=False, highlight=False)
