"""The repository stands alone: its code, tests, benches, docs, README and Makefile cite the code or docs/, never
documents a clone does not have (a design document's sections, issue numbers, seed documents)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CITATION = re.compile(r"design\.md|issues? [0-9]+|seed 0[0-9]|\u00a7", re.IGNORECASE)


def test_nothing_cites_a_document_outside_the_repository() -> None:
    listed = subprocess.run(
        [
            "git",
            "ls-files",
            "bastion",
            "tests",
            "bench",
            "docs",
            "manifests",
            ".ci",
            "README.md",
            "CHANGELOG.md",
            "mkdocs.yml",
            "Makefile",
            "pyproject.toml",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    files = [ROOT / name for name in listed.stdout.splitlines()]
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary: images, compiled files
        for number, line in enumerate(text.splitlines(), 1):
            if CITATION.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not found, "cite the code or docs/ instead:\n" + "\n".join(found)
