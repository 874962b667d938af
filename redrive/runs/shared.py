"""What the processes of one ``--processes N`` run share: ``--limit`` (exact across them),
``--rate`` (one token bucket) and a dry run's planned keys (a copy in another process's
batch is still a duplicate). Each has the interface of its one-process form
(:class:`~redrive.operations.limit.Limit`, :class:`~redrive.rate.RateLimiter`, the engine's
planned keys), so the engine takes either (:class:`RunShares`).

Made in the parent with a multiprocessing context and handed to each child as it is
spawned (multiprocessing's shared memory pickles only then). Their locks are flocks, which
the kernel gives back when a process dies: a child SIGKILLed inside one cannot hang the rest.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.context import SpawnContext
from pathlib import Path
from typing import Any, Protocol

from redrive.dlq.receive_log import sqlite_integer
from redrive.dlq.scan import digest


class LimitLike(Protocol):
    @property
    def reached(self) -> bool: ...

    def take(self) -> bool: ...

    def give_back(self) -> None: ...


class RateLike(Protocol):
    def acquire(self, n: int = 1) -> float: ...


class PlannedLike(Protocol):
    def add(self, key: str) -> bool:
        """Plan ``key``, atomically; False when it was planned already."""
        ...

    def __contains__(self, key: object) -> bool: ...


@dataclass(frozen=True, slots=True)
class RunShares:
    limit: LimitLike
    rate: RateLike
    planned: PlannedLike
    scan_ended: Callable[[], None] | None = None
    """Called when this process's scan has ended, before it gives back what it holds: waits
    until every sibling's scan has ended too, so that none receives (and counts again) a
    message another one held and gave back."""


class ScanEnds:
    """Which processes' scans have ended: one byte each, without a lock (a child SIGKILLed
    while it held a lock would hang its siblings). The parent marks a child that ended
    without marking itself (it died)."""

    POLL = 0.05

    def __init__(self, processes: int, context: SpawnContext) -> None:
        self._ended = context.RawArray("b", processes)

    def end(self, number: int) -> None:
        self._ended[number - 1] = 1

    @property
    def all_ended(self) -> bool:
        return all(self._ended)

    def wait_for_all(self, number: int, give_up: threading.Event) -> None:
        """Mark ``number``'s scan ended; wait for the others (or until ``give_up``: the
        parent is gone, and nobody will mark a dead sibling)."""
        self.end(number)
        while not self.all_ended and not give_up.wait(self.POLL):
            pass


class ProcessLock:
    """A lock across processes that the kernel gives back when its holder dies (flock on a
    file: a child SIGKILLed while holding it must not hang its siblings, as a semaphore
    would), and across each process's threads (flock does not tell them apart). Pickles as
    its path: each process opens the file itself."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        self._threads = threading.Lock()
        self._fd: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self._threads = threading.Lock()
        self._fd = None

    def __enter__(self) -> None:
        self._threads.acquire()
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR)
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._threads.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._threads.release()


class SharedLimit:
    """--limit across processes: one counter in shared memory, under a :class:`ProcessLock`."""

    def __init__(self, limit: int | None, context: SpawnContext, lock: ProcessLock) -> None:
        self._unlimited = limit is None
        self._left = context.RawValue("q", limit or 0)
        self._lock = lock

    @property
    def reached(self) -> bool:
        if self._unlimited:
            return False
        with self._lock:
            return bool(self._left.value <= 0)

    def take(self) -> bool:
        """Take one; False when none is left (in any process)."""
        if self._unlimited:
            return True
        with self._lock:
            if self._left.value <= 0:
                return False
            self._left.value -= 1
            return True

    def give_back(self) -> None:
        if self._unlimited:
            return
        with self._lock:
            self._left.value += 1

    @property
    def left(self) -> int | None:
        if self._unlimited:
            return None
        with self._lock:
            return int(self._left.value)


class SharedRate:
    """--rate across processes: :class:`redrive.rate.RateLimiter`'s token bucket, its tokens
    and last refill in shared memory. CLOCK_MONOTONIC is one clock for every process of
    the machine, so the children's readings compare."""

    def __init__(
        self,
        rate: float | None,
        context: SpawnContext,
        lock: ProcessLock,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``clock`` and ``sleep`` (picklable: they go to the children too) for tests."""
        if rate is not None and rate <= 0:
            raise ValueError("rate must be positive")
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._lock = lock
        self._state = context.RawArray("d", [float(rate or 0), clock()])

    def acquire(self, n: int = 1) -> float:
        """Wait until ``n`` messages may go (all processes together); the seconds waited."""
        if self.rate is None or n <= 0:
            return 0.0
        with self._lock:
            tokens, last = self._state[0], self._state[1]
            now = self._clock()
            # Capped at one second's worth, as the one-process bucket is.
            tokens = min(self.rate, tokens + (now - last) * self.rate) - n
            self._state[0], self._state[1] = tokens, now
        wait = -tokens / self.rate if tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)
        return wait


class SharedPlanned:
    """A dry run's planned keys across processes: digests (as the one-process set keeps) in
    a SQLite file of the parent's temporary directory, so memory stays bounded however many
    keys a dry run plans. Each process opens it on first use."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("CREATE TABLE IF NOT EXISTS planned (d INTEGER PRIMARY KEY)")

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path = state["path"]
        self._conn = None
        self._lock = threading.Lock()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(
                self.path, timeout=60, isolation_level=None, check_same_thread=False
            )
            # A dry run's scratch file, removed when the run ends: no durability needed.
            conn.execute("PRAGMA synchronous=OFF")
            self._conn = conn
        return self._conn

    def add(self, key: str) -> bool:
        # One statement, so two processes planning one key cannot both be first.
        with self._lock:
            cur = self._connection().execute(
                "INSERT OR IGNORE INTO planned (d) VALUES (?)", (sqlite_integer(digest(key)),)
            )
        return cur.rowcount == 1

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        with self._lock:
            row = (
                self._connection()
                .execute("SELECT 1 FROM planned WHERE d = ?", (sqlite_integer(digest(key)),))
                .fetchone()
            )
        return row is not None

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def make_shares(
    context: SpawnContext,
    *,
    limit: int | None,
    rate: float | None,
    scratch: Path,
    plans: bool,
) -> RunShares:
    """The shares of one run, their files in ``scratch`` (a directory of the parent's):
    the locks, and (``plans``: a dry run) the planned keys."""
    planned: PlannedLike = SharedPlanned(scratch / "planned.sqlite3") if plans else _NoPlans()
    return RunShares(
        SharedLimit(limit, context, ProcessLock(scratch / "limit.lock")),
        SharedRate(rate, context, ProcessLock(scratch / "rate.lock")),
        planned,
    )


class _NoPlans:
    """An executed run's planned keys: none (it claims in the ledger instead)."""

    def add(self, key: str) -> bool:
        return True

    def __contains__(self, key: object) -> bool:
        return False
