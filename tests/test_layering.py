"""The import direction of Bastion's layers (`LAYERS`), read from every module's imports."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "bastion"

# Lower number = lower layer. A module may import only modules of a strictly lower layer, or of its
# own group (a package importing its own submodules). Sibling groups at the same layer never import
# each other: the kinds of source and the ledger are independent; policies are pure functions below both.
LAYERS: dict[str, int] = {
    "bastion": 0,  # the package root (__init__: version only)
    "bastion.program": 0,  # how a person runs this Bastion from their shell, for hints
    "bastion.terms": 0,  # the words and numbers people type: Literals and constants, no imports
    "bastion.models": 1,
    "bastion.errors": 1,
    "bastion.states": 2,  # the invocation's state machine: the moves a record may make
    "bastion.config.tomlpos": 1,
    "bastion.starter": 1,
    "bastion.actions": 2,  # what a source declares about its actions (ActionSpec)
    "bastion.jsontext": 1,  # JSON both ways on the hot path (orjson, the standard library where it must)
    "bastion.tracing": 2,  # OpenTelemetry attribute names and spans, for the pipeline and the sources
    "bastion.policies": 2,  # pure functions over the vocabulary: anyone above may call them
    "bastion.schemas": 2,  # JSON Schema checks of arguments and results (jsonschema-rs, then jsonschema)
    "bastion.config": 3,
    "bastion.sources": 4,  # the package docstring only
    "bastion.sources.seam": 3,  # what the pipeline needs of a source, beneath every kind
    "bastion.sources.secrets": 3,  # scrubbing bound secrets by value: providers and plugins
    # The kinds of source, beside the ledger: none imports another, nor the ledger.
    "bastion.sources.mcp": 4,
    "bastion.sources.providers": 4,
    "bastion.sources.plugins": 4,
    "bastion.sources.manifests": 4,  # action files parsed and checked, and run as the source `actions`
    "bastion.sources.registry": 5,  # the only code that knows every kind: builds and checks the sources
    "bastion.ledger": 4,
    "bastion.pipeline": 5,  # the package docstring only
    "bastion.pipeline.seams": 5,  # the pipeline: seams and catalog, then pins, approvals and content, then the gateway
    "bastion.pipeline.catalog": 5,
    "bastion.pipeline.content": 6,  # relayed resources, templates and prompts: naming, routing, relaying
    "bastion.pipeline.pinning": 6,
    "bastion.pipeline.instances": 6,  # this instance's lease, and who else is alive
    "bastion.pipeline.observer": 5,  # the hook observers of invocations register on
    "bastion.pipeline.traces": 5,  # the span of each call, kept while its invocation lives
    "bastion.pipeline.recorded": 5,  # what a call that ended answered, read back from the ledger
    "bastion.pipeline.approvals": 6,
    "bastion.pipeline.previews": 6,  # a held call's preview, bounded in time and size
    "bastion.pipeline.grants": 6,  # approvals' standing grants, kept in the ledger
    "bastion.pipeline.authority": 7,
    "bastion.pipeline.documents": 6,  # the JSON shapes the CLI prints and the API answers
    "bastion.pipeline.outcomes": 6,  # recording what came of a call that was sent
    "bastion.pipeline.steps": 7,  # the gateway's step runner: a composite's steps, each a child invocation
    "bastion.pipeline.listings": 7,  # the sources and what hosts list of them
    "bastion.pipeline.events": 7,  # the change feed read as named events (event stream, inbox, webhooks)
    "bastion.pipeline.notify": 8,  # webhooks: the outbox filled from the events and delivered
    "bastion.pipeline.modes": 8,  # what mode each call gets: policy, a composite's steps, drift, grants
    "bastion.pipeline.calls": 9,  # the stages every call passes
    "bastion.pipeline.gateway": 10,  # the facade: what server/ and cli/ use
    "bastion.server": 11,
    "bastion.assembly": 12,  # the composition root: configuration -> ledger -> sources -> gateway -> servers
    "bastion.cli": 13,
    "bastion.launcher": 14,  # the entry point: --version without importing the command line
    "bastion.__main__": 15,
    "bastion.demo": 14,  # standalone demo programs (a server, a client): nothing in bastion imports them
    "bastion.docs_reference": 14,  # the docs site's generated pages, read from the code: nothing imports it
}

# Third-party imports allowed per group, beyond the standard library (None = anything).
THIRD_PARTY: dict[str, set[str] | None] = {
    "bastion.terms": set(),
    "bastion.program": set(),
    "bastion.models": {"pydantic"},
    "bastion.actions": {"mcp_types", "pydantic"},
    "bastion.tracing": {"opentelemetry"},  # the API only: the SDK and the exporter are set up by the server
    "bastion.errors": set(),
    "bastion.states": set(),
    "bastion.jsontext": {"orjson"},
    "bastion.config": {"pydantic", "cel"},  # cel: policy conditions, compiled at load
    "bastion.policies": {"pydantic"},
    "bastion.schemas": {"jsonschema", "jsonschema_rs"},
    "bastion.ledger": {"pydantic", "aiosqlite", "anyio", "psycopg", "psycopg_pool", "cryptography"},
    "bastion.sources": set(),
    "bastion.sources.seam": {"mcp_types", "anyio"},
    "bastion.sources.secrets": set(),
    # referencing: an output schema that cannot be resolved
    "bastion.sources.mcp": {"mcp", "mcp_types", "httpx2", "anyio", "pydantic", "referencing"},
    "bastion.sources.providers": {"mcp_types", "httpx2", "anyio", "pydantic"},
    "bastion.sources.plugins": {"mcp_types", "anyio", "pydantic", "jsonschema"},  # jsonschema: action.json
    "bastion.sources.manifests": {"pydantic", "mcp_types", "anyio"},
    "bastion.sources.registry": {"pydantic"},
    "bastion.config.tomlpos": set(),
    "bastion.starter": set(),
    "bastion.pipeline": set(),
    "bastion.pipeline.catalog": {"mcp_types", "pydantic"},
    "bastion.pipeline.seams": {"mcp_types", "anyio"},
    "bastion.pipeline.content": {"mcp_types", "mcp", "anyio"},  # mcp.shared.uri_template: RFC 6570 matching
    "bastion.pipeline.pinning": set(),
    "bastion.pipeline.instances": {"anyio"},
    "bastion.pipeline.observer": set(),
    "bastion.pipeline.traces": set(),
    "bastion.pipeline.recorded": {"mcp_types", "pydantic"},
    "bastion.pipeline.approvals": {"mcp_types", "anyio"},
    "bastion.pipeline.previews": {"anyio"},
    "bastion.pipeline.authority": set(),
    "bastion.pipeline.grants": set(),
    "bastion.pipeline.documents": {"pydantic"},
    "bastion.pipeline.listings": {"mcp_types", "anyio"},
    "bastion.pipeline.events": {"anyio"},
    "bastion.pipeline.notify": {"anyio", "httpx2"},
    "bastion.pipeline.outcomes": {"mcp_types", "anyio"},
    "bastion.pipeline.steps": {"mcp_types"},
    "bastion.pipeline.modes": set(),
    "bastion.pipeline.calls": {"mcp_types", "anyio"},
    "bastion.pipeline.gateway": {"mcp_types", "anyio", "pydantic"},
    "bastion.server": None,
    "bastion.assembly": {"anyio", "httpx2"},
    "bastion.cli": None,
    "bastion.__main__": None,
    "bastion.launcher": set(),
    "bastion.demo": None,
    "bastion.docs_reference": {"pydantic", "pydantic_core", "annotated_types", "typer"},
    "bastion": set(),
}

SERVER_ONLY = ("mcp.server", "starlette", "uvicorn", "sse_starlette")


def _group(module: str) -> str:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in LAYERS:
            return candidate
    raise AssertionError(f"{module} belongs to no layer; add it to LAYERS in tests/test_layering.py")


def _modules() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(p for p in rel.parts if p != "__init__")
        imports: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imports.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imports.append(node.module)
        found[name] = imports
    return found


def _stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names or name == "__future__"


def test_every_import_points_down_the_layers() -> None:
    wrong = []
    for module, imports in _modules().items():
        group = _group(module)
        for imported in imports:
            if not imported.startswith("bastion"):
                continue
            target = _group(imported)
            if target == group or (target == "bastion" and imported == "bastion"):
                continue
            if LAYERS[target] >= LAYERS[group]:
                wrong.append(f"{module} imports {imported} ({group} -> {target})")
    assert not wrong, "imports that point the wrong way:\n" + "\n".join(wrong)


def test_third_party_imports_stay_in_their_layer() -> None:
    wrong = []
    for module, imports in _modules().items():
        allowed = THIRD_PARTY[_group(module)]
        for imported in imports:
            if imported.startswith("bastion") or _stdlib(imported):
                continue
            top = imported.split(".")[0]
            if allowed is not None and top not in allowed:
                wrong.append(f"{module} imports {imported}")
            if allowed is not None and imported.startswith(SERVER_ONLY):
                wrong.append(f"{module} imports server-side {imported}")
    assert not wrong, "third-party imports outside their layer:\n" + "\n".join(wrong)


def test_nothing_imports_the_composition_root_or_the_demo() -> None:
    offenders = [
        f"{module} imports {imported}"
        for module, imports in _modules().items()
        for imported in imports
        if imported.startswith(("bastion.cli", "bastion.demo", "bastion.__main__"))
        and not module.startswith(
            ("bastion.__main__", "bastion.launcher", "bastion.demo", "bastion.cli", "bastion.docs_reference")
        )
    ]
    assert not offenders, "\n".join(offenders)


AUTHORITY = "bastion.pipeline.authority"
DECIDING = ("decide", "accept_drift")
"""Store methods that decide a pending call or re-pin a drifted action: only the authority module calls them."""


def test_only_the_authority_module_decides_or_re_pins() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(p for p in path.relative_to(PACKAGE.parent).with_suffix("").parts if p != "__init__")
        if module == AUTHORITY or module.startswith("bastion.ledger"):
            continue  # the store itself (and the Recorder above its backends) defines them
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in DECIDING:
                target = ast.unparse(node.func.value)
                # A store is reached as `<ledger>.invocations`, `<ledger>.pins` or a `store` of the pipeline; other
                # `decide`s are the remote API's (the server decides through authority) and views over it.
                if target.endswith(("invocations", "pins", "store")) or node.func.attr == "accept_drift":
                    offenders.append(f"{module}:{node.lineno} calls {target}.{node.func.attr}")
    assert not offenders, "decisions and re-pins must go through bastion.pipeline.authority:\n" + "\n".join(offenders)


MAX_MODULE_LINES = 600


def test_every_module_stays_readable_at_most_600_lines() -> None:
    """A module past 600 lines holds more than one idea: split it along its seams."""
    long = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
