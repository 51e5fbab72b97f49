"""`bastion` with parts of a call's allow path taken out: how bench/instructions.py (`--parts`) tells what each part
costs, as the instructions per call of Bastion less those of Bastion without it.

Run as `python -m bench.without PART[,PART...] serve ...` (after the parts, the arguments of `bastion`). A variant is a
measuring device, never a way to run Bastion: it records, checks or redacts less than Bastion must.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from bastion.cli import main as bastion_main
from bastion.ledger.recorder import Recorder
from bastion.ledger.redaction import Redactor
from bastion.ledger.sqlite.invocations import SqliteInvocations
from bastion.pipeline.observer import Observers
from bastion.sources.mcp.wire import ResultChecks


async def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


async def _finished(*args: Any, **kwargs: Any) -> bool:
    return True


class _Unchecked:
    def validate_python(self, value: Any, **kwargs: Any) -> Any:
        return value


def _without_ledger_writes() -> None:
    """The two SQLite transactions of a call (statements, chained events, commits): the SQLite store's intent and
    outcome writes return at once. What the recorder scrubs before them is still scrubbed."""
    SqliteInvocations.insert = _nothing  # type: ignore[method-assign]
    SqliteInvocations.insert_admitted = _nothing  # type: ignore[method-assign]
    SqliteInvocations.finish = _finished  # type: ignore[method-assign]


def _without_records() -> None:
    """The whole record of a call: the recorder scrubs and stores nothing of its intent or outcome."""
    Recorder.record = _nothing  # type: ignore[method-assign]
    Recorder.record_admitted = _nothing  # type: ignore[method-assign]
    Recorder.finish = _finished  # type: ignore[method-assign]


def _without_redaction() -> None:
    """The redactor's walk of the arguments, results and event details: stored as they came (still serialised)."""
    Redactor._clean = lambda self, value, depth, *, redacting: value  # type: ignore[method-assign]


def _without_result_check() -> None:
    """The check of a result's shape against its protocol version's model (the tool's output schema is still
    checked)."""
    ResultChecks._surface = lambda self, version: _Unchecked()  # type: ignore[assignment,method-assign,return-value]


def _without_args_hash() -> None:
    """The keyed hash of the raw arguments (canonical JSON, HMAC): every call gets the same one."""
    Recorder.hash_args = lambda self, arguments: "0" * 64  # type: ignore[method-assign]


def _without_observers() -> None:
    """Telling the pipeline's observers (traces, metrics) the four moments of each invocation."""
    Observers._tell = _nothing  # type: ignore[method-assign]


PARTS: dict[str, Callable[[], None]] = {
    "ledger-writes": _without_ledger_writes,
    "records": _without_records,
    "redaction": _without_redaction,
    "result-check": _without_result_check,
    "args-hash": _without_args_hash,
    "observers": _without_observers,
}
"""Each part a call's allow path can be measured without, and what taking it out does."""


def describe(part: str) -> str:
    """What taking `part` out leaves out (its function's docstring, on one line)."""
    return " ".join((PARTS[part].__doc__ or part).split())


def main() -> None:
    if len(sys.argv) < 2 or not set(sys.argv[1].split(",")) <= PARTS.keys():
        sys.exit(f"usage: python -m bench.without PART[,PART...] ARGS... (parts: {', '.join(PARTS)})")
    for part in sys.argv[1].split(","):
        PARTS[part]()
    sys.argv = ["bastion", *sys.argv[2:]]
    bastion_main()


if __name__ == "__main__":
    main()
