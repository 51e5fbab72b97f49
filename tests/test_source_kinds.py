"""Kinds of source from installed packages: a tiny package, built as a wheel and installed with pip, offers a kind
through the `bastion.sources` entry point group; `[sources.<id>]` names it, and `bastion serve` runs its action
for a real MCP client. Whatever the package gets wrong is a problem with its file and line, never a crash."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters

from bastion.config import load_config
from bastion.sources.registry import SOURCE_INTERFACE, load_sources
from tests.processes import bastion_command, bastion_env, run_cli

pytestmark = pytest.mark.anyio

PACKAGE = "bastion_weather"

MODULE = f'''
"""A kind of source for Bastion, as a third party would write one: no MCP server, one read-only action."""

from typing import Any

import anyio
import mcp_types as types
from pydantic import BaseModel, ConfigDict

from bastion.actions import ActionSpec
from bastion.models import SourceStatus


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str


class Weather:
    def __init__(self, source_id: str, settings: Settings) -> None:
        self.source_id = source_id
        self.namespace = source_id
        self.city = settings.city
        self.status = SourceStatus(source_id=source_id, state="starting")

    def actions(self) -> list[ActionSpec]:
        schema = {{"type": "object", "properties": {{"day": {{"type": "string"}}}}, "required": ["day"]}}
        annotations = types.ToolAnnotations(read_only_hint=True)
        tool = types.Tool(name="forecast", description="The forecast.", input_schema=schema, annotations=annotations)
        return [ActionSpec(tool=tool, risk="read", namespace=self.namespace)]

    def risk_of(self, action_id: str, definition: Any) -> str:
        return "read"

    async def run(self, on_change: Any) -> None:
        self.status = SourceStatus(source_id=self.source_id, state="ready")
        await on_change(self.source_id)
        await anyio.sleep_forever()

    async def call(self, action_id: str, arguments: dict[str, Any], **_: Any) -> types.CallToolResult:
        text = f"sunny in {{self.city}} on {{arguments['day']}}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


class Kind:
    interface = {SOURCE_INTERFACE}
    settings = Settings

    def build(self, source_id: str, settings: Settings, context: Any) -> Weather:
        return Weather(source_id, settings)


kind = Kind()


class Future:
    interface = {SOURCE_INTERFACE + 1}
    settings = Settings

    def build(self, source_id: str, settings: Settings, context: Any) -> Weather:
        raise AssertionError("a kind of another interface is never built")


future = Future()
'''


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(directory: Path) -> Path:
    """The tiny package as a wheel: its module, and entry points for the kinds `weather` and `future`."""
    info = f"{PACKAGE}-0.1.dist-info"
    files = {
        f"{PACKAGE}.py": MODULE.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {PACKAGE}\nVersion: 0.1\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": (
            f"[bastion.sources]\nweather = {PACKAGE}:kind\nfuture = {PACKAGE}:future\n".encode()
        ),
    }
    record = [_record_line(name, data) for name, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = directory / f"{PACKAGE}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory the tiny package is installed into by pip, kept off this process's path."""
    root = tmp_path_factory.mktemp("kinds")
    target = root / "site"
    wheel = build_wheel(root)
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(target), wheel],
        capture_output=True,
        text=True,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    return target


def config_dir(tmp_path: Path, sources: str) -> Path:
    directory = tmp_path / "config"
    (directory / "policies").mkdir(parents=True)
    (directory / "bastion.toml").write_text(textwrap.dedent(sources))
    (directory / "policies" / "default.toml").write_text('[modes]\n"sky:*" = "allow"\n')
    return directory


async def test_an_installed_kind_named_in_the_configuration_serves_its_action(tmp_path: Path, site: Path) -> None:
    directory = config_dir(tmp_path, '[sources.sky]\nkind = "weather"\ncity = "Lyon"\n')
    env = bastion_env(tmp_path / "home", PYTHONPATH=str(site))
    argv = bastion_command("serve", "--config", str(directory))
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)
    async with Client(params, cache=None) as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
        assert "sky__forecast" in names
        result = await client.call_tool("sky__forecast", {"day": "monday"})
    assert not result.is_error
    assert result.content[0].text == "sunny in Lyon on monday"  # type: ignore[union-attr]

    listed = run_cli("invocations", "list", "--json", "--config", str(directory), env=env)
    assert '"sky:forecast"' in listed.stdout and '"completed"' in listed.stdout


def test_what_a_package_gets_wrong_is_a_problem_at_its_line(
    tmp_path: Path, site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(site))
    directory = config_dir(
        tmp_path,
        """\
        [sources.sky]
        kind = "weather"
        town = "Lyon"

        [sources.later]
        kind = "future"
        city = "Lyon"

        [sources.nowhere]
        kind = "absent"

        [sources.actions]
        kind = "weather"
        city = "Lyon"
        """,
    )
    config = load_config(directory)
    sources = load_sources(config)
    found: dict[int, str] = {}
    for issue in [*config.issues, *sources.problems]:
        found[issue.line] = found.get(issue.line, "") + issue.message + "\n"
    assert "city: Field required" in found[1] and "town: Extra inputs are not permitted" in found[1]
    assert "implements source interface 2" in found[5] and "offers 1" in found[5]
    assert 'no installed package offers the kind "absent"' in found[9] and "weather" in found[9]
    assert "already claimed by the manifest actions" in found[12]
    assert [source.source_id for source in sources.all] == []

    doctor = run_cli("doctor", "--config", str(directory), env=bastion_env(tmp_path / "home", PYTHONPATH=str(site)))
    assert doctor.returncode == 2
    assert "[sources.later]" in doctor.stdout and "[sources.nowhere]" in doctor.stdout
