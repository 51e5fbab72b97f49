"""Telling the listeners of a SQLite ledger's commits (`CommitNews`): the change feed reads what is new after them.

A commit made on the loop is told once the writer's caller yields (a tool call: once its request has left for the
downstream), not on the call's way there; commits until then are told at once. While no listener waits for news
nothing is scheduled: the commits are told when one asks (`SqliteDatabase.tell_now`).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger(__name__)

CommitListener = Callable[[sqlite3.Connection], None]
"""Called on the writer after commits that changed something (the change feed reads what is new): once their task
yields while the listener waits for news, else when it asks (`tell_now`)."""

FreeWriter = Callable[[], sqlite3.Connection | None]
"""The writer connection when nothing else uses it (no worker thread, not closed); else None."""


class CommitNews:
    """The listeners of one ledger file's commits, and whether commits wait to be told."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._listeners: list[CommitListener] = []
        self._waiting: list[Callable[[], bool]] = []
        self.untold = False
        """Commits on the loop not told to the listeners yet (see `soon`)."""

    def add(self, listener: CommitListener, waiting: Callable[[], bool] | None) -> None:
        """Tell `listener` of commits that changed something; with `waiting`, only while it answers True (someone
        waits for news), else when asked."""
        self._listeners.append(listener)
        self._waiting.append(waiting or (lambda: True))

    def soon(self, free: FreeWriter) -> None:
        """A commit was made on the loop: tell it once the caller yields, if anyone waits for news."""
        if not self.untold:
            self.untold = True
            if any(waiting() for waiting in self._waiting):
                asyncio.get_running_loop().call_soon(self.now, free)

    def now(self, free: FreeWriter) -> None:
        """Tell the commits not told yet, if the writer is free (a worker that has it tells when its write is done)."""
        if self.untold:
            writer = free()
            if writer is not None:
                self.tell(writer)

    def tell(self, writer: sqlite3.Connection) -> None:
        """Tell every listener now, on `writer` (the caller holds it)."""
        self.untold = False
        for listener in self._listeners:
            try:
                listener(writer)
            except sqlite3.Error as exc:  # the next commit, or the feed's poll, tells them again
                logger.warning("the ledger %s could not be read after a commit: %s", self._path, exc)
