"""Remote hosts: which Host and Origin names Bastion's HTTP surface answers to.

DNS rebinding needs a name the attacker controls, so names are served only when listed (loopback names, the
bound address, `[server] allowed_hosts`, `serve --allowed-host`); IP addresses cannot be rebound, so every one
is served once Bastion listens beyond loopback, and loopback addresses always. Everything else is answered 421
(Host) or 403 (Origin) with an error body naming the fix.

Real HTTP on loopback: Bastion bound to the wildcard address (or 127.0.0.1) in this process, requests with
crafted Host and Origin headers, a real MCP client and the remote CLI.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from bastion.config import Config, PolicyConfig, Settings, load_config
from bastion.ledger import Redactor, open_ledger
from bastion.models import utcnow
from bastion.pipeline.gateway import Gateway
from bastion.server.http import bind_listener, serve_http
from bastion.server.mcp import HostServer
from tests.processes import bastion_command, bastion_env, bastion_http, run_cli, write_config

pytestmark = pytest.mark.anyio

WAIT = 20  # seconds: the bound of every wait in this file
NAME = "bastion.example.com"


@dataclass
class Served:
    """A Bastion listening on `port` of every address (or of the address it was bound to)."""

    port: int
    token: str
    http: httpx2.AsyncClient

    async def status(self, host: str, *, origin: str | None = None, path: str = "/healthz") -> int:
        """The status of a request that says it is for `host` (and comes from a page of `origin`)."""
        headers = {"Host": host} | ({"Origin": origin} if origin is not None else {})
        return (await self.http.get(path, headers=headers)).status_code


@asynccontextmanager
async def bastion(
    tmp_path: Path, *, bind: str = "0.0.0.0", allowed: tuple[str, ...] = (NAME,)
) -> AsyncIterator[Served]:
    """Bastion's HTTP surface bound to `bind` on a free port, with an admin token (required beyond loopback)."""
    config = Config(
        directory=None,
        settings=Settings(),
        connectors=[],
        policy=PolicyConfig(),
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    async with await open_ledger(tmp_path / "l.db", redactor=Redactor()) as ledger:
        token = await ledger.tokens.create_token("alice", role="admin", profile=None, now=utcnow())
        gateway = Gateway(config, ledger, [])
        listener = bind_listener(bind, 0)
        port = listener.getsockname()[1]
        stop = anyio.Event()
        async with gateway.running(wait_for_sources=False), anyio.create_task_group() as tg:
            front = HostServer(gateway)
            tg.start_soon(
                partial(serve_http, front, host=bind, port=0, extra_hosts=allowed, listener=listener, stop=stop)
            )
            try:
                async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=WAIT) as http:
                    yield Served(port, token, http)
            finally:
                stop.set()


async def test_a_listed_name_is_served_at_any_port_and_an_unknown_name_is_refused_421_naming_the_fix(
    tmp_path: Path,
) -> None:
    async with bastion(tmp_path) as served:
        assert await served.status(f"{NAME}:8765") == 200
        assert await served.status("BASTION.Example.COM.") == 200  # names compare as DNS does

        refused = await served.http.get("/healthz", headers={"Host": "evil.example.com:8765"})
        assert refused.status_code == 421
        error = refused.json()["error"]
        assert error["class"] == "host_not_allowed"
        assert "allowed_hosts" in error["message"]


async def test_bound_to_every_address_any_ip_address_is_served_but_only_listed_names(tmp_path: Path) -> None:
    async with bastion(tmp_path) as served:
        for address in ("10.0.0.5:8765", "192.168.1.20", "[2001:db8::1]:8765", "127.0.0.2"):
            assert await served.status(address) == 200, address
        assert await served.status("myhost.lan:8765") == 421
        assert await served.status("10.0.0.5.nip.io") == 421  # a name, whatever it looks like
        assert await served.status("evil.example.com@10.0.0.5") == 421  # a Host is host[:port], nothing more


async def test_bound_to_loopback_loopback_addresses_and_listed_names_are_served_but_no_other_address(
    tmp_path: Path,
) -> None:
    async with bastion(tmp_path, bind="127.0.0.1") as served:
        for host in ("127.0.0.1:8765", "127.0.0.2", "localhost:8765", "[::1]:8765", NAME):
            assert await served.status(host) == 200, host
        assert await served.status("10.0.0.5:8765") == 421


async def test_an_origin_must_name_a_served_host_too(tmp_path: Path) -> None:
    async with bastion(tmp_path) as served:
        for origin in (f"https://{NAME}", "http://10.0.0.5:8765", "http://localhost:3000", "null"):
            assert await served.status("10.0.0.5:8765", origin=origin) == 200, origin

        refused = await served.http.get("/healthz", headers={"Host": NAME, "Origin": "https://evil.example.com"})
        assert refused.status_code == 403
        assert refused.json()["error"]["class"] == "origin_not_allowed"


async def test_a_remote_host_reaches_the_api_and_mcp_by_a_listed_name(tmp_path: Path) -> None:
    async with bastion(tmp_path) as served:
        authorized = {"Authorization": f"Bearer {served.token}"}
        approvals = await served.http.get("/api/approvals", headers={"Host": NAME} | authorized)
        assert approvals.status_code == 200
        assert approvals.json() == {"approvals": []}

        headers = {"Host": f"{NAME}:{served.port}"} | authorized
        async with (
            httpx2.AsyncClient(headers=headers, timeout=WAIT) as http,
            Client(streamable_http_client(f"http://127.0.0.1:{served.port}/mcp", http_client=http), cache=None) as mcp,
        ):
            assert "bastion__invocation" in {tool.name for tool in (await mcp.list_tools()).tools}


async def test_the_remote_cli_reaches_a_bastion_bound_to_every_address_by_an_ip_address(tmp_path: Path) -> None:
    async with bastion(tmp_path) as served:
        url = f"http://127.0.0.2:{served.port}"  # an address of this machine, not the one the CLI usually uses
        command = bastion_command("approvals", "list", "--json", "--url", url, "--token", served.token)
        with anyio.fail_after(WAIT * 3):
            done = await anyio.run_process(command, env=bastion_env(tmp_path / "home"), check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout) == []


def test_an_allowed_hosts_entry_with_a_port_or_a_scheme_is_a_config_issue_at_its_line(tmp_path: Path) -> None:
    config_dir = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    (config_dir / "bastion.toml").write_text(
        '[server]\nledger = "sqlite:///state/ledger.db"\nallowed_hosts = [\n  "Bastion.Example.com",\n'
        '  "10.0.0.5:8765",\n]\n'
    )
    config = load_config(config_dir.resolve(), env={}, home=tmp_path / "home")
    (issue,) = config.issues
    assert (issue.line, "allowed_hosts" in issue.message, "port" in issue.message) == (
        5,
        True,
        True,
    )  # the entry's own line

    (config_dir / "bastion.toml").write_text('[server]\nallowed_hosts = ["Bastion.Example.com."]\n')
    config = load_config(config_dir.resolve(), env={}, home=tmp_path / "home")
    assert not config.issues
    assert config.settings.server.allowed_hosts == [NAME]


def test_serve_refuses_an_allowed_host_that_is_not_a_name_before_starting(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    env = bastion_env(tmp_path / "home")
    done = run_cli(
        "serve", "--transport", "http", "--config", str(config), "--allowed-host", "https://x.example", env=env
    )
    assert done.returncode == 2
    assert "error: --allowed-host" in done.stderr
    assert not (config / "state").exists()  # no ledger opened


async def test_serve_answers_the_names_of_its_configuration_and_command_line(tmp_path: Path) -> None:
    config = write_config(tmp_path / "config", notes_file=tmp_path / "notes.json", time_server=False)
    bastion_toml = config / "bastion.toml"
    bastion_toml.write_text(bastion_toml.read_text().replace("[server]\n", f'[server]\nallowed_hosts = ["{NAME}"]\n'))
    env = bastion_env(tmp_path / "home")
    created = run_cli("tokens", "create", "alice", "--role", "admin", "--config", str(config), env=env)
    assert created.returncode == 0, created.stderr
    args = ["--host", "0.0.0.0", "--config", str(config), "--allowed-host", "other.example.com"]
    async with bastion_http(args, env=env) as served, httpx2.AsyncClient(timeout=WAIT) as http:
        port = served.base_url.rsplit(":", 1)[1]

        async def status(host: str) -> int:
            return (await http.get(f"http://127.0.0.1:{port}/healthz", headers={"Host": host})).status_code

        assert await status(f"{NAME}:{port}") == 200
        assert await status("other.example.com") == 200
        assert await status("10.0.0.5") == 200
        assert await status("evil.example.com") == 421
