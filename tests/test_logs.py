"""Logging of the `bastion` command: `BASTION_LOG_LEVEL` reaches Bastion's loggers only, and every line is
redacted."""

from __future__ import annotations

import io
import json
import logging
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from anyio.streams.text import TextReceiveStream
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from bastion.cli.logs import log_handler, use_redactor
from bastion.ledger import Redactor
from tests.processes import READY, bastion_command, bastion_env, run_cli, stop, write_config

pytestmark = pytest.mark.anyio

CANARIES = {
    "github": "ghp_" + "L0gC4n4ry" * 4,
    "password": "hunter2-log-canary",
    "bastion": "bst_" + "L0gCanaryL0gCanaryL0gCanaryL0gCanaryL0gCana",
}


@asynccontextmanager
async def logging_bastion(config: Path, env: dict[str, str], stderr: list[str]) -> AsyncIterator[str]:
    """`bastion serve` over HTTP; yields its MCP URL, then stops it and reads its stderr to the end into `stderr`."""
    argv = bastion_command("serve", "--transport", "http", "--port", "0", "--config", str(config))
    process = await anyio.open_process(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
    )
    assert process.stderr is not None
    chunks = TextReceiveStream(process.stderr)
    text = ""
    try:
        with anyio.fail_after(60):
            while (ready := READY.search(text)) is None:
                text += await chunks.receive()
        yield ready.group(1)
        process.send_signal(signal.SIGTERM)
        with anyio.fail_after(30):
            async for chunk in chunks:
                text += chunk
    finally:
        stderr.extend(text.splitlines())
        await stop(process, group=True)


async def test_debug_logging_shows_bastions_lines_redacted_and_no_third_party_call_data(tmp_path: Path) -> None:
    notes = tmp_path / "notes.json"
    notes.write_text(json.dumps({"keys": f"github {CANARIES['github']} and {CANARIES['bastion']}"}))
    policy = '[modes]\n"notes:write_note" = "allow"\n'
    config = write_config(tmp_path / "config", notes_file=notes, time_server=False, policy=policy)
    env = bastion_env(tmp_path / "home", BASTION_LOG_LEVEL="debug")
    lines: list[str] = []
    async with logging_bastion(config, env, lines) as base_url:
        async with (
            httpx2.AsyncClient(timeout=httpx2.Timeout(30)) as http,
            Client(streamable_http_client(f"{base_url}/mcp", http_client=http), cache=None) as client,
        ):
            written = await client.call_tool(
                "notes__write_note", {"name": "pw", "text": f"password={CANARIES['password']}"}
            )
            assert not written.is_error
        # The legacy SSE transport writes every response through sse_starlette, which logs each chunk at DEBUG.
        async with Client(sse_client(f"{base_url}/sse"), mode="legacy", cache=None) as client:
            read = await client.call_tool("notes__read_note", {"name": "keys"})
            assert not read.is_error
            assert CANARIES["github"] in json.dumps(read.model_dump(mode="json"))  # the host gets the real one
    stderr = "\n".join(lines)
    for name, secret in CANARIES.items():
        assert secret not in stderr, f"the {name} canary reached the log"
    called = [line for line in stderr.splitlines() if "DEBUG bastion." in line and "notes__write_note" in line]
    assert called, stderr
    assert "password=[REDACTED]" in called[0]
    assert not [line for line in stderr.splitlines() if " DEBUG " in line and " bastion." not in line], stderr


def test_an_unknown_log_level_is_a_clear_usage_error(tmp_path: Path) -> None:
    done = run_cli("catalog", "--help", env=bastion_env(tmp_path / "home", BASTION_LOG_LEVEL="chatty"))
    assert done.returncode == 2
    assert "BASTION_LOG_LEVEL" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, logging.Logger, logging.Logger]]:
    """The CLI's log handler writing to a string, on one Bastion logger and one third-party logger."""
    stream = io.StringIO()
    handler = log_handler(stream)
    loggers = logging.getLogger("bastion.tests.logs"), logging.getLogger("sse_starlette.sse")
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
    try:
        yield stream, *loggers
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
            logger.setLevel(logging.NOTSET)
            logger.propagate = True
        use_redactor(Redactor())


def test_the_log_handler_redacts_messages_structured_arguments_and_tracebacks(
    captured: tuple[io.StringIO, logging.Logger, logging.Logger],
) -> None:
    stream, ours, _ = captured
    ours.debug("call with %s", {"credentials": {"user": "bob", "pw": "nested-pw"}, "query": "kept"})
    try:
        raise ValueError(f"upstream said password={CANARIES['password']}")
    except ValueError:
        ours.exception("failed with token %s", CANARIES["github"])
    written = stream.getvalue()
    for secret in ("nested-pw", CANARIES["password"], CANARIES["github"]):
        assert secret not in written
    assert "'credentials': '[REDACTED]'" in written
    assert "'query': 'kept'" in written
    assert "password=[REDACTED]" in written
    assert "Traceback" in written


def test_third_party_loggers_write_nothing_below_warning(
    captured: tuple[io.StringIO, logging.Logger, logging.Logger],
) -> None:
    stream, ours, theirs = captured
    theirs.debug("chunk: %s", "third-party debug")
    theirs.info("chunk: %s", "third-party info")
    theirs.warning("chunk: token=%s", "third-party-warning")
    ours.debug("bastion debug")
    written = stream.getvalue()
    assert "third-party debug" not in written
    assert "third-party info" not in written
    assert "chunk: token=[REDACTED]" in written
    assert "bastion debug" in written


def test_the_configured_extra_secret_keys_reach_the_log_handler(
    captured: tuple[io.StringIO, logging.Logger, logging.Logger],
) -> None:
    stream, ours, _ = captured
    use_redactor(Redactor(extra_secret_keys=["tenant_ref"]))
    ours.info("tenantRef=abc123 for %s", {"tenant_ref": "t-9"})
    written = stream.getvalue()
    assert "abc123" not in written
    assert "t-9" not in written
