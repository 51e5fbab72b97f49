"""The generated reference pages of the documentation site are what the code generates now, and every key they
document has a description to show."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from bastion.docs_reference import actions, config, pages, stale
from bastion.docs_reference.fields import undocumented

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_committed_reference_pages_are_what_the_code_generates() -> None:
    differ = stale(DOCS)
    assert not differ, (
        f"{', '.join(differ)} differ from what the code generates: run make docs-reference and commit the pages"
    )


def test_every_generated_page_is_in_the_site() -> None:
    navigation = (DOCS.parent / "mkdocs.yml").read_text(encoding="utf-8")
    missing = [name for name in pages() if name.endswith(".md") and name not in navigation]
    assert not missing, f"add {missing} to the nav of mkdocs.yml"


def test_every_configuration_and_action_file_key_has_a_description() -> None:
    models: list[type[BaseModel]] = [section.model for _, _, sections in config.FILES for section in sections]
    models += [model for _, model, _ in (*actions.MANIFEST, *actions.PLUGIN)]
    missing = [field for model in models for field in undocumented(model)]
    assert not missing, f"give these fields a docstring (the reference shows it): {missing}"
