"""What commands run on: the configuration found and loaded as `serve` finds it, the ledger and the gateway it
composes (`bastion.assembly`), the approver deciding from this command line, and the async bodies run to an exit
status. Heavy to import (the ledger, the sources, the pipeline behind them): commands import it inside their bodies.
"""

from __future__ import annotations

import getpass
import importlib.util
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeVar

import anyio
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from bastion import assembly
from bastion.cli.app import TOKEN_ENV_VAR, Exit, err
from bastion.cli.logs import use_redactor
from bastion.cli.remote import RemoteApi, remote_api
from bastion.config import Config, config_hint, find_config_dir, load_config
from bastion.errors import BastionError, ConfigError, NotFound, Unauthenticated
from bastion.ledger import OpenLedger, Redactor
from bastion.models import Invocation, Principal
from bastion.pipeline.authority import local_owner, resolve_invocation_id
from bastion.pipeline.gateway import Gateway
from bastion.program import bastion_command
from bastion.sources.mcp import McpConnector
from bastion.sources.registry import Sources

T = TypeVar("T")

PRINCIPAL_ENV_VAR: Final = "BASTION_PRINCIPAL"

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
                f"check it, or see `{bastion_command()} tokens list{config_hint(config)}`"
            )
        return principal
    if await ledger.tokens.has_approver_tokens():
        raise Unauthenticated(
            f"{config.ledger_display} has owner or admin tokens, so deciding from the command line needs one: pass "
            f"--token TOKEN or set ${TOKEN_ENV_VAR} (keep it out of your agents' environment)"
        )
    return local_owner(approver_principal())


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
    with Live(
        Spinner("dots", text=StartupProgress(sources)), console=err.console, transient=True, refresh_per_second=10
    ):
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
