"""The approver side of bench/approval_wakeup.py, in a process of its own.

Reads invocation ids on stdin, approves each in the ledger, and answers with the wall-clock time
at which the decision was committed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import anyio

from bastion.ledger import Redactor, open_ledger
from bastion.models import utcnow


async def main(path: Path) -> None:
    async with await open_ledger(path, redactor=Redactor()) as ledger:
        stdin = anyio.wrap_file(sys.stdin)
        async for line in stdin:
            invocation_id = line.strip()
            if not invocation_id:
                continue
            await ledger.invocations.decide(invocation_id, approve=True, principal="bench", note=None, now=utcnow())
            print(f"{time.time():.6f}", flush=True)


if __name__ == "__main__":
    anyio.run(main, Path(sys.argv[1]))
