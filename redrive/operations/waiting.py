"""How long a thread has waited for something other than a CPU: what a second stage could
hide behind it (a network's round trips, a disk flush), as against the time a busy machine
kept it off a CPU, which no second thread of the same process would get back.

Linux counts, per thread, the time it ran and the time it sat runnable waiting for a CPU
(``/proc/thread-self/schedstat``); elsewhere the wait is wall time less the thread's CPU time.
"""

from __future__ import annotations

import contextlib
import os
import time
from types import TracebackType

_SCHEDSTAT = "/proc/thread-self/schedstat"


class BlockedClock:
    """Seconds the calling thread spent blocked (off the CPU and not waiting for one), as a
    running total: the difference of two :meth:`now` is the time blocked between them. Use
    it from the thread that made it; close it when done."""

    def __init__(self) -> None:
        self._fd: int | None = None
        # /proc/thread-self names the thread that opens it: this one.
        with contextlib.suppress(OSError):
            self._fd = os.open(_SCHEDSTAT, os.O_RDONLY)
            self._runnable()  # closes it if it cannot be read

    def now(self) -> float:
        delayed = self._runnable()
        return time.perf_counter() - time.thread_time() - (delayed or 0.0)

    def _runnable(self) -> float | None:
        """Seconds this thread was runnable but waiting for a CPU so far (None: the kernel
        does not say). The CPU time comes from thread_time(): schedstat's own lags up to a
        scheduler tick behind a running thread, its wait for a CPU does not."""
        if self._fd is None:
            return None
        try:
            return int(os.pread(self._fd, 100, 0).split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            self.close()
            return None

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __enter__(self) -> BlockedClock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
