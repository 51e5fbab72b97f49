"""Bastion reaches past the MCP SDK's public API in one place only, `bastion/server/sdk.py`.

Read from every module's syntax tree: outside that module, no module that imports the SDK (`mcp`,
`mcp_types`) reads a private attribute (`x._name`) of anything but itself (`self`, `cls`), nor imports a
private name or module of the SDK; and no module at all reads `_connection`. Comments explain the SDK's
behaviour where they rely on it, instead of citing notes kept outside the repository.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "bastion"
SDK_PACKAGES = frozenset({"mcp", "mcp_types"})
THE_ONE_PLACE = PACKAGE / "server" / "sdk.py"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _imports_sdk(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] in SDK_PACKAGES for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in SDK_PACKAGES:
            return True
    return False


def private_reaches(tree: ast.Module) -> list[tuple[int, str]]:
    """Where a module reads a private attribute of another object, or imports a private SDK name or module."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] in SDK_PACKAGES:
                private = [a.name for a in node.names if _is_private(a.name)]
                if any(_is_private(p) for p in parts) or private:
                    found.append((node.lineno, f"from {node.module} import {', '.join(private) or '...'}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in SDK_PACKAGES and any(_is_private(p) for p in parts):
                    found.append((node.lineno, f"import {alias.name}"))
    return found


def test_only_the_sdk_module_reaches_past_the_sdks_public_api() -> None:
    offenders: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == THE_ONE_PLACE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        reaches = private_reaches(tree)
        if not _imports_sdk(tree):  # modules without the SDK: only the attribute the SDK keeps private
            reaches = [(line, text) for line, text in reaches if text.endswith("._connection")]
        offenders += [f"{path.relative_to(PACKAGE.parent)}:{line}: {text}" for line, text in reaches]
    assert not offenders, "private SDK access outside bastion/server/sdk.py:\n" + "\n".join(offenders)


def test_the_scan_finds_a_private_attribute_and_a_private_sdk_import() -> None:
    tree = ast.parse(
        "import mcp_types\n"
        "from mcp.shared._httpx_utils import create_mcp_http_client\n"
        "from mcp.server.session import _Hidden\n"
        "def handler(ctx):\n"
        "    self._mine = ctx.session._connection\n"
    )
    assert [text for _, text in private_reaches(tree)] == [
        "from mcp.shared._httpx_utils import ...",
        "from mcp.server.session import _Hidden",
        "ctx.session._connection",
    ]


def test_no_comment_cites_an_sdk_note_kept_outside_the_repository() -> None:
    cited = re.compile(r"\b(gotcha|notes)\s+G\d+\b", re.IGNORECASE)
    roots = [PACKAGE, PACKAGE.parent / "tests", PACKAGE.parent / "bench"]
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}"
        for root in roots
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if cited.search(line) and path != Path(__file__).resolve()
    ]
    assert not offenders, "explain the SDK behaviour where it is cited:\n" + "\n".join(offenders)
