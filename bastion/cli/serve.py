"""`bastion serve`: the gateway for agent hosts over stdio or HTTP."""

from __future__ import annotations

from typing import Annotated, Literal

import typer

from bastion import __version__
from bastion.cli.app import ConfigOption, Exit, app, err, load, open_gateway, open_ledger, run_async
from bastion.config import Config, validate_profile
from bastion.errors import ConfigError
from bastion.server.http import is_loopback, serve_http
from bastion.server.mcp import FrontDoor, serve_stdio


@app.command()
def serve(
    config_dir: ConfigOption = None,
    transport: Annotated[
        Literal["stdio", "http"], typer.Option(help="stdio for one local host; http serves /mcp, /sse and /healthz.")
    ] = "stdio",
    host: Annotated[str, typer.Option(help="Address to bind (http).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to bind (http).")] = 8765,
    profile: Annotated[str | None, typer.Option(help="Policy profile bound to every session.")] = None,
) -> None:
    """Serve the gateway to agent hosts over stdio (default) or HTTP."""
    config = load(config_dir)
    if profile is not None:
        try:
            validate_profile(config, profile)
        except ConfigError as exc:
            raise Exit(f"error: {exc.message}", 2) from exc

    async def run() -> None:
        if transport == "http" and not is_loopback(host):
            async with open_ledger(config) as ledger:
                if not await ledger.has_tokens():  # refuse before starting any connector
                    raise ConfigError(
                        f"refusing to serve on {host} without tokens: anyone who can reach it could call tools. "
                        "Create one first with `bastion tokens create NAME --role admin` (and agent tokens for "
                        "hosts), or bind to 127.0.0.1."
                    )
        async with open_gateway(config) as gateway:
            if transport == "stdio":
                await serve_stdio(FrontDoor(gateway, profile=profile, session_id="stdio"))
            else:
                tokens = await gateway.ledger.has_tokens()

                def ready(base_url: str) -> None:
                    _print_connect_help(config, base_url, len(gateway.tools), tokens=tokens)

                await serve_http(FrontDoor(gateway, profile=profile), host=host, port=port, on_ready=ready)

    run_async(run)


def _print_connect_help(config: Config, base_url: str, tools: int, *, tokens: bool) -> None:
    url = f"{base_url}/mcp"
    where = str(config.directory) if config.directory else "the embedded default (demo notes connector)"
    err.print(f"Bastion {__version__} serving {tools} tools from {where}", markup=False, highlight=False)
    err.print(f"  listening on {base_url}", markup=False, highlight=False)
    err.print(
        f"  MCP (streamable HTTP): {url}   legacy SSE: {base_url}/sse   health: {base_url}/healthz", highlight=False
    )
    err.print(f"  ledger: {config.ledger_url}", markup=False, highlight=False)
    header = ' --header "Authorization: Bearer $BASTION_AGENT_TOKEN"' if tokens else ""
    if tokens:
        err.print("  tokens are configured: hosts need an agent token (bastion tokens create NAME --role agent)")
    err.print("Connect Claude Code:", highlight=False)
    err.print(f"  claude mcp add --transport http bastion {url}{header}", markup=False, highlight=False)
    err.print("Connect Codex (add to ~/.codex/config.toml):", highlight=False)
    err.print(f'  [mcp_servers.bastion]\n  url = "{url}"', markup=False, highlight=False)
    if tokens:
        err.print('  bearer_token_env_var = "BASTION_AGENT_TOKEN"', markup=False, highlight=False)
    err.print("Press Ctrl-C to stop.", highlight=False)
