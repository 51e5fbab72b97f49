"""How long the ledger's writes take to commit: each backend times its transactions and tells whoever
listens (the server's `/metrics`), so the ledger knows nothing of what reads the figures."""

from __future__ import annotations

import time
from collections.abc import Callable

CommitListener = Callable[[float], None]
"""Told the seconds one write took, from its call to its commit (waiting for the write lock or a connection
included). Called on the event loop; it must be quick."""


class CommitTimes:
    """The commit times of one backend's writes, told to its listeners; nothing is timed while none listens."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        """`sqlite` or `postgresql`."""
        self._listeners: list[CommitListener] = []

    def listen(self, listener: CommitListener) -> None:
        self._listeners.append(listener)

    def committed(self, started: float) -> None:
        """A write that started at `started` (`time.perf_counter()`) has committed."""
        if self._listeners:
            seconds = time.perf_counter() - started
            for listener in self._listeners:
                listener(seconds)
