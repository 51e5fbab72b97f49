"""The downstreams of the interop matrix: MCP servers people run, at pinned versions, each with the calls a cell
makes of it and the features it offers.

- the official TypeScript servers from npm (`tests/tools.py` pins and installs them), which speak 2025-11-25:
  filesystem, everything and memory over stdio, and everything over streamable HTTP;
- `mcp-server-git` and `mcp-server-time` from PyPI (the dev dependencies pin them), which speak 2026-07-28;
- Bastion's own demo notes server (2026-07-28).

Each is started here the same way for the direct call a cell compares with and for Bastion: the same program, the
same arguments, the same seeded state in a folder of its own.
"""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, Final

import anyio
from mcp import StdioServerParameters

from tests.processes import served
from tests.tools import EVERYTHING_PACKAGE, FILESYSTEM_PACKAGE, MEMORY_PACKAGE, NODE_BIN, SERVERS_VERSION, TOOLS

FEATURES: Final = (
    "resources",
    "subscribe",
    "prompts",
    "progress",
    "logging",
    "cancellation",
    "list_changed",
    "sampling",
    "elicitation",
)
"""What a cell tries beyond listing and calling, where the server offers it."""

LOOPBACK_SHIM: Final = Path(__file__).resolve().parent / "loopback.cjs"
"""Preloaded into Node servers that listen on every interface by default: they listen on 127.0.0.1 only."""


@dataclass(frozen=True)
class Call:
    tool: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Offers:
    """What a server offers beyond tools, and the call or name that shows each (None: not offered)."""

    resource: str | None = None
    """A resource URI to read."""
    subscription: tuple[str, Call] | None = None
    """A resource URI to subscribe to, and a call after which the server says it was updated."""
    prompt: tuple[str, dict[str, str]] | None = None
    progress: Call | None = None
    """A call that reports progress when the request carries a token."""
    logging: Call | None = None
    """A call during which the server sends log messages."""
    cancellation: Call | None = None
    """A call that runs long enough to be cancelled, reporting progress as it goes."""
    sampling: Call | None = None
    elicitation: Call | None = None
    toggles: frozenset[str] = frozenset()
    """Calls that switch a behaviour on and off (everything's `toggle-*`): each says which it did."""

    def offered(self) -> set[str]:
        names = {
            "resources": self.resource,
            "subscribe": self.subscription,
            "prompts": self.prompt,
            "progress": self.progress,
            "logging": self.logging,
            "cancellation": self.cancellation,
            "sampling": self.sampling,
            "elicitation": self.elicitation,
        }
        return {name for name, offer in names.items() if offer is not None}


@dataclass(frozen=True)
class Started:
    """A downstream ready to be called: how Bastion runs it (a connector file) and how a direct call reaches it."""

    connector: str
    direct: StdioServerParameters | str


@dataclass(frozen=True)
class Downstream:
    id: str
    """Its source id behind Bastion: its tools are `<id>__<tool>`."""
    program: str
    """What it is, for the table."""
    allowed: Call
    """Allowed by policy: its result must equal the direct call's."""
    refused: Call
    """Denied by policy."""
    held: Call
    """Held for an approver by policy, then approved."""
    offers: Offers
    start: Callable[[Path], Any]
    """`start(folder)`: an async context manager yielding `Started`, its state seeded in `folder`."""
    policy: str = ""
    """More policy (TOML) beside the modes the calls above get."""

    @property
    def modes(self) -> dict[str, str]:
        modes = {f"{self.id}:*": "allow", f"{self.id}:{self.refused.tool}": "deny"}
        if self.held.tool != self.allowed.tool:
            modes[f"{self.id}:{self.held.tool}"] = "require_approval"
        return modes

    def policy_file(self) -> str:
        modes = "".join(f"{json.dumps(key)} = {json.dumps(mode)}\n" for key, mode in self.modes.items())
        return f"[modes]\n{modes}{self.policy}"


def _node(package: str, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Started:
    script = TOOLS / "node_modules" / package / "dist" / "index.js"
    node = str(NODE_BIN / "node")
    connector = f"command = {json.dumps(node)}\nargs = {json.dumps([str(script), *args])}\n"
    if env:
        connector += "env = { " + ", ".join(f"{key} = {json.dumps(value)}" for key, value in env.items()) + " }\n"
    if cwd is not None:
        connector += f"cwd = {json.dumps(str(cwd))}\n"
    return Started(connector, StdioServerParameters(command=node, args=[str(script), *args], env=env, cwd=cwd))


def _python(module: str, *args: str, env: dict[str, str] | None = None) -> Started:
    connector = f"command = {json.dumps(sys.executable)}\nargs = {json.dumps(['-m', module, *args])}\n"
    if env:
        connector += "env = { " + ", ".join(f"{key} = {json.dumps(value)}" for key, value in env.items()) + " }\n"
    return Started(connector, StdioServerParameters(command=sys.executable, args=["-m", module, *args], env=env))


@asynccontextmanager
async def _filesystem(folder: Path) -> AsyncIterator[Started]:
    served_dir = folder / "served"
    served_dir.mkdir()
    (served_dir / "hello.txt").write_text("hello from the filesystem server\n")
    yield _node(FILESYSTEM_PACKAGE, str(served_dir))


@asynccontextmanager
async def _everything(folder: Path) -> AsyncIterator[Started]:
    yield _node(EVERYTHING_PACKAGE, "stdio")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@asynccontextmanager
async def _everything_http(folder: Path) -> AsyncIterator[Started]:
    """server-everything over streamable HTTP, on a loopback port of its own, stopped when the block ends."""
    port = _free_port()
    script = TOOLS / "node_modules" / EVERYTHING_PACKAGE / "dist" / "index.js"
    argv = [str(NODE_BIN / "node"), "--require", str(LOOPBACK_SHIM), str(script), "streamableHttp"]
    env = {"PATH": str(NODE_BIN), "PORT": str(port), "HOME": str(folder)}
    async with served(argv, env=env, port=port, cwd=folder):
        url = f"http://127.0.0.1:{port}/mcp"
        yield Started(f'transport = "http"\nurl = {json.dumps(url)}\n', url)


@asynccontextmanager
async def _memory(folder: Path) -> AsyncIterator[Started]:
    graph = folder / "memory.jsonl"
    seeded = [
        {"type": "entity", "name": "interop", "entityType": "test", "observations": ["seeded"]},
        {"type": "entity", "name": "updates", "entityType": "test", "observations": []},
    ]
    graph.write_text("".join(json.dumps(entity) + "\n" for entity in seeded))
    yield _node(MEMORY_PACKAGE, env={"MEMORY_FILE_PATH": str(graph)})


@asynccontextmanager
async def _git(folder: Path) -> AsyncIterator[Started]:
    repository = folder / "repository"
    repository.mkdir()
    environment = {"GIT_CONFIG_GLOBAL": "/dev/null", "HOME": str(folder), "PATH": "/usr/bin:/bin"}
    for command in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "-c", "user.name=interop", "-c", "user.email=interop@example.com", "commit", "-q", "--allow-empty",
         "-m", "first"],
    ):  # fmt: skip
        await anyio.run_process(command, cwd=repository, env=environment)
    (repository / "untracked.txt").write_text("not yet added\n")
    yield _python("mcp_server_git", "--repository", str(repository))


@asynccontextmanager
async def _time(folder: Path) -> AsyncIterator[Started]:
    yield _python("mcp_server_time", "--local-timezone", "UTC")


@asynccontextmanager
async def _demo(folder: Path) -> AsyncIterator[Started]:
    notes = folder / "notes.json"
    notes.write_text(json.dumps({"groceries": "milk, eggs"}))
    yield _python("bastion.demo.notes", env={"BASTION_NOTES_FILE": str(notes)})


_EVERYTHING_OFFERS = Offers(
    resource="demo://resource/static/document/features.md",
    subscription=("demo://resource/static/document/features.md", Call("toggle-subscriber-updates")),
    prompt=("args-prompt", {"city": "Lyon", "state": "Rhône"}),
    progress=Call("trigger-long-running-operation", {"duration": 0.3, "steps": 3}),
    logging=Call("toggle-simulated-logging"),
    cancellation=Call("trigger-long-running-operation", {"duration": 60, "steps": 60}),
    sampling=Call("trigger-sampling-request", {"prompt": "a haiku about gateways", "maxTokens": 20}),
    elicitation=Call("trigger-elicitation-request"),
    toggles=frozenset({"toggle-subscriber-updates", "toggle-simulated-logging"}),
)


def _everything_downstream(source_id: str, transport: str, start: Callable[[Path], Any]) -> Downstream:
    """server-everything behind Bastion over `transport`: the same calls and offers either way."""
    return Downstream(
        id=source_id,
        program=f"npm {EVERYTHING_PACKAGE}@{SERVERS_VERSION} ({transport}, 2025-11-25)",
        allowed=Call("get-structured-content", {"location": "New York"}),
        refused=Call("get-env"),
        held=Call("get-sum", {"a": 2, "b": 3}),
        offers=_EVERYTHING_OFFERS,
        start=start,
    )


DOWNSTREAMS: Final = {
    "fs": Downstream(
        id="fs",
        program=f"npm {FILESYSTEM_PACKAGE}@{SERVERS_VERSION} (stdio, 2025-11-25)",
        allowed=Call("read_text_file", {"path": "{folder}/served/hello.txt"}),
        refused=Call("move_file", {"source": "{folder}/served/hello.txt", "destination": "{folder}/served/moved.txt"}),
        held=Call("write_file", {"path": "{folder}/served/written-{cell}.txt", "content": "approved"}),
        offers=Offers(),
        start=_filesystem,
    ),
    "everything": _everything_downstream("everything", "stdio", _everything),
    "everything_http": _everything_downstream("everything_http", "streamable HTTP", _everything_http),
    "memory": Downstream(
        id="memory",
        program=f"npm {MEMORY_PACKAGE}@{SERVERS_VERSION} (stdio, 2025-11-25)",
        allowed=Call("open_nodes", {"names": ["interop"]}),
        refused=Call("delete_entities", {"entityNames": ["interop"]}),
        held=Call("create_entities", {"entities": [{"name": "held-{cell}", "entityType": "test", "observations": []}]}),
        offers=Offers(
            resource="memory://knowledge-graph",
            subscription=(
                "memory://knowledge-graph",
                Call("add_observations", {"observations": [{"entityName": "updates", "contents": ["{cell}"]}]}),
            ),
        ),
        start=_memory,
    ),
    "git": Downstream(
        id="git",
        program=f"PyPI mcp-server-git {version('mcp-server-git')} (stdio, 2026-07-28)",
        allowed=Call("git_status", {"repo_path": "{folder}/repository"}),
        refused=Call("git_reset", {"repo_path": "{folder}/repository"}),
        held=Call("git_create_branch", {"repo_path": "{folder}/repository", "branch_name": "cell-{cell}"}),
        offers=Offers(),
        start=_git,
    ),
    "time": Downstream(
        id="time",
        program=f"PyPI mcp-server-time {version('mcp-server-time')} (stdio, 2026-07-28)",
        allowed=Call("convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Europe/Paris"}),
        refused=Call("get_current_time", {"timezone": "UTC"}),
        held=Call("convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
        offers=Offers(),
        start=_time,
        # Held by a condition on its arguments, beside the same tool allowed for others.
        policy='[[rules]]\nkey = "time:convert_time"\nwhen = \'args.target_timezone == "Asia/Tokyo"\'\n'
        'mode = "require_approval"\n',
    ),
    "demo": Downstream(
        id="demo",
        program="Bastion's demo notes server, `python -m bastion.demo.notes` (stdio, 2026-07-28)",
        allowed=Call("read_note", {"name": "groceries"}),
        refused=Call("delete_note", {"name": "groceries"}),
        held=Call("write_note", {"name": "cell-{cell}", "text": "approved"}),
        offers=Offers(),
        start=_demo,
    ),
}
"""Every downstream of the matrix, by its source id."""
