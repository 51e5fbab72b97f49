"""The generated reference pages of the documentation site: configuration, command line, REST API, error classes
and action file formats, each rendered from the code that defines it, so the pages cannot drift from the code.

`python -m bastion.docs_reference` (`make docs-reference`) writes them under `docs/`; `tests/test_docs_reference.py`
renders them again and fails when they differ from the committed files. Nothing in Bastion imports this package.
"""

from __future__ import annotations

from pathlib import Path

from bastion.docs_reference import actions, api, cli, config, errors


def pages() -> dict[str, str]:
    """Every generated file, by its path under `docs/`."""
    return {
        "reference/configuration.md": config.render(),
        "reference/cli.md": cli.render(),
        **api.pages(),
        "reference/errors.md": errors.render(),
        "reference/action-files.md": actions.render(),
    }


def stale(docs: Path) -> list[str]:
    """The generated files under `docs` that are missing or differ from what the code generates now."""
    return [name for name, text in pages().items() if _read(docs / name) != text]


def write(docs: Path) -> list[Path]:
    """Write every generated file under `docs` that is not current; the paths written."""
    written = []
    for name, text in pages().items():
        path = docs / name
        if _read(path) != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None
