"""--limit: at most N messages per run, shared by the run's workers."""

from __future__ import annotations

import threading


class Limit:
    """--limit: how many more messages the run may send (None: no limit). Shared by the
    workers, under its own lock."""

    def __init__(self, limit: int | None) -> None:
        self._left = limit
        self._lock = threading.Lock()

    @property
    def reached(self) -> bool:
        if self._left is None:  # never changes: no lock needed to read it
            return False
        with self._lock:
            return self._left is not None and self._left <= 0

    def take(self) -> bool:
        """Take one; False when none is left."""
        if self._left is None:
            return True
        with self._lock:
            if self._left <= 0:
                return False
            self._left -= 1
            return True

    def give_back(self) -> None:
        """One taken for a send that did not happen (its claim was lost)."""
        with self._lock:
            if self._left is not None:
                self._left += 1
