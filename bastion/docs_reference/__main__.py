"""`python -m bastion.docs_reference [--check] [DOCS_DIR]`: write the generated reference pages under DOCS_DIR
(default: ./docs), or with `--check` only say which differ from what the code generates (exit 1 when any does)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bastion.docs_reference import stale, write


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bastion.docs_reference", description=__doc__)
    parser.add_argument("docs", nargs="?", type=Path, default=Path("docs"), help="the docs directory")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is not current")
    options = parser.parse_args(argv)
    if not options.docs.is_dir():
        sys.stderr.write(f"error: {options.docs} is not a directory; run this from the repository root\n")
        return 2
    if options.check:
        differ = stale(options.docs)
        for name in differ:
            sys.stderr.write(f"{options.docs / name} is not what the code generates\n")
        if differ:
            sys.stderr.write("run `make docs-reference` and commit the pages it writes\n")
        return 1 if differ else 0
    for path in write(options.docs):
        sys.stdout.write(f"wrote {path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
