"""A downstream that comes up late: it serves as the demo notes server only once its gate opens.

Run as `python -m tests.gated_server FIFO`; stdio only. The gate is the named pipe FIFO: opening it for
reading blocks until a test opens it for writing (or both ways: `os.open(FIFO, os.O_RDWR)` never blocks).
Until then the process reads nothing and answers nothing, as a server that is slow to start.
"""

from __future__ import annotations

import sys

from bastion.demo.notes import main

if __name__ == "__main__":
    with open(sys.argv[1], "rb"):
        pass
    main([])
