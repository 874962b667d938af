"""Which live run is moving a DLQ, from the ledger's run records: what a shared scan asks
before it reads the DLQ (:class:`redrive.inspection.shared.SharedScans`), since a scan hides
what it reads from the run (SQS visibility, RabbitMQ unacked deliveries).

A run of any front end (a CLI's, a console's, on any host sharing the ledger) records the DLQ
it acts on (``info["dlq"]``); :func:`redrive.runs.lifecycle.run_is_live` says whether it may
still be acting. The listing is read at most every ``ttl`` seconds of the injected clock, and a
run's progress (its keys by state) at most every ``progress_every``: a page view costs no
ledger query.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redrive.broker.base import DlqTarget
from redrive.ledger import KeyState, Ledger, RunInfo
from redrive.runs.lifecycle import run_is_live

RUNS_TTL = 2.0
PROGRESS_EVERY = 10.0
#: Runs that started longer ago than this are not asked about (a move of a day is rare; a
#: run that old and still live is found by its newer heartbeat only if listed).
RECENT = 7 * 86_400.0
COUNTED = (KeyState.CLAIMED, KeyState.SENT, KeyState.DONE)


@dataclass(frozen=True, slots=True)
class RunProgress:
    """A live run moving a DLQ, as the ledger (or the console that runs it) knows it."""

    run_id: str
    command: str
    started_at: float
    heartbeat_at: float
    user: str | None = None
    counts: Mapping[str, int] = field(default_factory=dict)
    """Its keys by state so far (``claimed``, ``sent``, ``done``), or its live counts."""

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "command": self.command,
            "started_at": self.started_at,
            "heartbeat_at": self.heartbeat_at,
            "user": self.user,
            "counts": dict(self.counts),
        }


class LedgerRuns:
    """The live run moving a DLQ (what :class:`redrive.inspection.shared.SharedScans` asks
    before a scan), read from
    the ledger ``ledger`` opens (asked again while it gives none: a console may start before
    the first run makes the ledger; the caller closes the one it gave); thread-safe.
    ``own``: a run's live counts where the caller runs it itself (a console's operation),
    else its keys by state in the ledger."""

    def __init__(
        self,
        ledger: Callable[[], Ledger | None],
        *,
        clock: Callable[[], float] = time.time,
        ttl: float = RUNS_TTL,
        progress_every: float = PROGRESS_EVERY,
        own: Callable[[str], Mapping[str, int] | None] = lambda run_id: None,
    ) -> None:
        self._open = ledger
        self._ledger: Ledger | None = None
        self._clock = clock
        self._ttl = ttl
        self._progress_every = progress_every
        self._own = own
        self._lock = threading.Lock()
        self._runs: list[RunInfo] = []
        self._read_at: float | None = None
        self._progress: dict[str, tuple[float, Mapping[str, int]]] = {}

    def __call__(self, target: DlqTarget) -> RunProgress | None:
        now = self._clock()
        for run in self._listing(now):
            if (run.info or {}).get("dlq") == target.dlq.url and run_is_live(run, now):
                return self._of(run, now)
        return None

    def _listing(self, now: float) -> list[RunInfo]:
        with self._lock:
            if self._read_at is None or now - self._read_at >= self._ttl:
                if self._ledger is None:
                    self._ledger = self._open()
                ledger = self._ledger
                runs = ledger.runs(since=now - RECENT) if ledger is not None else []
                self._runs = [r for r in runs if not r.ended_at]
                self._read_at = now
            return self._runs

    def _of(self, run: RunInfo, now: float) -> RunProgress:
        user = (run.info or {}).get("user")
        return RunProgress(
            run.run_id,
            run.command,
            run.started_at,
            run.heartbeat_at,
            str(user) if user is not None else None,
            self._counts(run.run_id, now),
        )

    def _counts(self, run_id: str, now: float) -> Mapping[str, int]:
        own = self._own(run_id)
        if own is not None:
            return own
        with self._lock:
            known = self._progress.get(run_id)
            if known is not None and now - known[0] < self._progress_every:
                return known[1]
        ledger = self._ledger
        assert ledger is not None  # the run was listed from it
        counts = {
            state.value: sum(1 for _ in ledger.iter_keys(state, run_id=run_id)) for state in COUNTED
        }
        with self._lock:
            self._progress[run_id] = (now, counts)
        return counts
