"""A small notes MCP server: the bundled demo connector.

Run it with `python -m bastion.demo.notes [--transport stdio|http] [--host 127.0.0.1] [--port N]`.
Over stdio it stops quietly, with status 0, when its input ends, when its host stops reading its
output, or on SIGTERM or SIGINT.
It offers read tools (`list_notes`, `read_note`), a write tool (`write_note`) and a destructive
tool (`delete_note`), so every policy path of the gateway has something to act on. Notes live in
one JSON file (`$BASTION_NOTES_FILE`, default `~/.local/state/bastion/notes.json`), rewritten
atomically, so a test can check that a refused call left the downstream's state unchanged.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import tempfile
from pathlib import Path
from typing import Annotated

import anyio
import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

NOTES_FILE_ENV = "BASTION_NOTES_FILE"
DEFAULT_NOTES_FILE = Path("~/.local/state/bastion/notes.json")
DEFAULT_PORT = 8766
MAX_NAME_LENGTH = 200

NoteName = Annotated[str, Field(description="The note's name: 1 to 200 characters, case-sensitive.")]


def notes_file() -> Path:
    """Where the notes live: `$BASTION_NOTES_FILE`, else the per-user default."""
    return Path(os.environ.get(NOTES_FILE_ENV) or DEFAULT_NOTES_FILE).expanduser()


class NoteStore:
    """The notes, as one JSON object `{name: text}` in a file replaced atomically on every write."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = anyio.Lock()

    def load(self) -> dict[str, str]:
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        data = json.loads(raw)
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            raise ToolError(f"the notes file {self.path} is not a JSON object of strings; fix or remove it")
        return {str(k): v for k, v in data.items()}

    def save(self, notes: dict[str, str]) -> None:
        """Write to a temporary file beside the target, fsync it, then rename over the target."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(notes, f, ensure_ascii=False, indent=2, sort_keys=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @property
    def lock(self) -> anyio.Lock:
        """Serialises read-modify-write cycles of concurrent tool calls."""
        return self._lock


class NoteSummary(BaseModel):
    name: str
    characters: int


class NoteList(BaseModel):
    notes: list[NoteSummary]


class Note(BaseModel):
    name: str
    text: str


class WriteOutcome(BaseModel):
    name: str
    created: bool
    characters: int


class DeleteOutcome(BaseModel):
    name: str
    deleted: bool


def _check_name(name: str) -> str:
    if not name or len(name) > MAX_NAME_LENGTH:
        raise ToolError(f"a note name must be 1 to {MAX_NAME_LENGTH} characters long")
    return name


def _missing(name: str) -> ToolError:
    return ToolError(f"there is no note named {name!r}; call list_notes to see the existing names")


def _result(text: str, structured: BaseModel) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=structured.model_dump())


def create_server(store: NoteStore) -> MCPServer:
    """Build the notes server over `store`."""
    server = MCPServer(
        "bastion-notes",
        title="Bastion demo notes",
        instructions="A small notebook of named text notes. List them, read one, write one or delete one.",
        version="0.1.0",
        log_level="WARNING",
    )

    @server.tool(
        title="List notes",
        description="List the names of all notes, with the length of each, sorted by name.",
        annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True),
    )
    async def list_notes() -> Annotated[CallToolResult, NoteList]:
        notes = store.load()
        listing = NoteList(notes=[NoteSummary(name=n, characters=len(t)) for n, t in sorted(notes.items())])
        if not notes:
            return _result("There are no notes yet.", listing)
        lines = "\n".join(f"- {s.name} ({s.characters} characters)" for s in listing.notes)
        return _result(f"{len(notes)} note(s):\n{lines}", listing)

    @server.tool(
        title="Read a note",
        description="Return the full text of the note with the given name.",
        annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True),
    )
    async def read_note(name: NoteName) -> Annotated[CallToolResult, Note]:
        notes = store.load()
        if name not in notes:
            raise _missing(name)
        return _result(notes[name], Note(name=name, text=notes[name]))

    @server.tool(
        title="Write a note",
        description="Create the note with the given name, or replace its text if it already exists.",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True),
    )
    async def write_note(
        name: NoteName, text: Annotated[str, Field(description="The note's new full text.")]
    ) -> Annotated[CallToolResult, WriteOutcome]:
        _check_name(name)
        async with store.lock:
            notes = store.load()
            created = name not in notes
            notes[name] = text
            store.save(notes)
        verb = "Created" if created else "Replaced"
        outcome = WriteOutcome(name=name, created=created, characters=len(text))
        return _result(f"{verb} note {name!r} ({len(text)} characters).", outcome)

    @server.tool(
        title="Delete a note",
        description="Delete the note with the given name. This cannot be undone.",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True),
    )
    async def delete_note(name: NoteName) -> Annotated[CallToolResult, DeleteOutcome]:
        async with store.lock:
            notes = store.load()
            if name not in notes:
                raise _missing(name)
            del notes[name]
            store.save(notes)
        return _result(f"Deleted note {name!r}.", DeleteOutcome(name=name, deleted=True))

    return server


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and serve until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m bastion.demo.notes", description="Bastion's demo notes MCP server."
    )
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1", help="loopback address to bind in http mode")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to bind in http mode")
    args = parser.parse_args(argv)

    server = create_server(NoteStore(notes_file()))
    if args.transport == "stdio":
        serve_stdio(server)
        return
    if not _is_loopback(args.host):
        parser.error(f"--host {args.host} is not a loopback address; the demo server has no authentication")
    app = server.streamable_http_app(streamable_http_path="/mcp", host=args.host)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


def serve_stdio(server: MCPServer) -> None:
    """Serve over stdin and stdout until the input ends, the host stops reading, or SIGTERM/SIGINT: quietly."""

    async def serve() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_signal, tg.cancel_scope)
            await server.run_stdio_async()
            tg.cancel_scope.cancel()

    try:
        anyio.run(serve)
    except* BrokenPipeError:
        # The host closed its end of stdout: nothing more can be said. Point fd 1 at the null device so the
        # interpreter's last flush of stdout cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()
            return


if __name__ == "__main__":
    main()
