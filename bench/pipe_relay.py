"""The floor of any relay process: the demo notes server behind a process that forwards bytes and nothing else.

Run as `python bench/pipe_relay.py` (the demo server's notes file comes from $BASTION_NOTES_FILE). It starts the
demo server and copies what arrives on its own stdin to the server's, and what the server writes back to its own
stdout, as it comes, in one `poll` loop: no parsing, no model, no check, no record. bench/latency.py measures it
beside the direct path, so the price of a third process on the call's way (a pipe more each way, another
process to wake) is told apart from what a relay does with a call.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys

_CHUNK = 1 << 16


def main() -> None:
    server = subprocess.Popen(
        [sys.executable, "-m", "bastion.demo.notes"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
    )
    assert server.stdin is not None and server.stdout is not None
    to_server, from_server = server.stdin.fileno(), server.stdout.fileno()
    forward = {0: to_server, from_server: 1}
    poller = select.poll()
    for fd in forward:
        poller.register(fd, select.POLLIN)
    try:
        while True:
            for fd, _ in poller.poll():
                data = os.read(fd, _CHUNK)
                if not data:  # either side ended: so does the relay
                    return
                out = memoryview(data)
                while out:
                    out = out[os.write(forward[fd], out) :]
    finally:
        server.stdin.close()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
