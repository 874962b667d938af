"""Whose claims a run meets in the ledger: its own, a live sibling process's (``--processes``),
or another run's, live (still sending) or dead (its claims in doubt)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from redrive.ledger import Entry, KeyState, Ledger, RunInfo
from redrive.runs.lifecycle import run_is_live


class ClaimOwners:
    """The runs that hold claims, as this run sees them; liveness found once per run id.
    Thread-safe."""

    def __init__(
        self,
        ledger: Ledger | None,
        run_id: str | None,
        parent: str | None,
        clock: Callable[[], float],
    ) -> None:
        """``parent``: the run this one is a process of (``--processes``), if any."""
        self.ledger = ledger
        self.run_id = run_id
        self._parent = parent
        self._now = clock
        self._lock = threading.Lock()
        self._liveness: dict[str, bool] = {}
        self._runs: dict[str, RunInfo | None] = {}

    def live_others(self, entries: Iterable[Entry]) -> set[str]:
        """The live runs other than this one that hold claims among ``entries``."""
        return {
            e.run_id
            for e in entries
            if e.state == KeyState.CLAIMED and e.run_id != self.run_id and self.is_live(e.run_id)
        }

    def decided_as(self, run_id: str, live: set[str]) -> str:
        """Who a claim of ``run_id`` is decided as: this run's own when a live sibling process
        holds it (``live``: the live runs found), else its holder's."""
        return decided_owner(run_id, self.run_id, self.sibling(run_id, live))

    def of_this_run(self, run_id: str) -> bool:
        """Whether ``run_id`` is this run or another process of it (``--processes``), live
        or not: what it sent, this run sent (a dry run, with no run id, sends nothing)."""
        if self.run_id is None:
            return False
        if run_id == self.run_id:
            return True
        return self._parent is not None and run_id.rpartition(".")[0] == self._parent

    def of_this_command(self, run_id: str) -> bool:
        """Whether ``run_id`` is this run, a process of it, or the ``--processes`` run that
        started them: none of them is another run of the DLQ."""
        return self.of_this_run(run_id) or (self._parent is not None and run_id == self._parent)

    def sibling(self, run_id: str, live: set[str] | None = None) -> bool:
        """Whether ``run_id`` is another live process of this ``--processes`` run (runs
        PARENT.1, PARENT.2, ...): its claims are settled as this run's own are (the claim
        decides: a copy of a key it sent is a duplicate, one still in flight is busy). A dead
        one's claims are in doubt, as any dead run's."""
        if self._parent is None or run_id.rpartition(".")[0] != self._parent:
            return False
        return run_id in live if live is not None else self.is_live(run_id)

    def is_live(self, run_id: str) -> bool:
        """Whether the run that holds a claim may still be sending it."""
        with self._lock:
            if run_id in self._liveness:
                return self._liveness[run_id]
        run = self._run(run_id)
        live = run is not None and run_is_live(run, self._now())
        with self._lock:
            self._liveness[run_id] = live
        return live

    def leased_until(self, run_id: str) -> float | None:
        """When ``run_id``'s ledger lease runs out, if it has not yet (None: it has, or the
        run ended or is unknown). A run found dead (its pid gone) may still hold one, and
        the ledger resolves none of its claims before it ends."""
        run = self._run(run_id)
        if run is None or run.ended_at is not None or run.lease_until <= self._now():
            return None
        return run.lease_until

    def _run(self, run_id: str) -> RunInfo | None:
        """The ledger's record of a run, read once: a dead run's lease does not move."""
        with self._lock:
            if run_id in self._runs:
                return self._runs[run_id]
        assert self.ledger is not None
        run = self.ledger.run(run_id)
        with self._lock:
            self._runs[run_id] = run
        return run


def decided_owner(run_id: str, mine: str | None, sibling: bool) -> str:
    """Who a claim is decided as: this run's own when a live sibling process holds it."""
    return mine if sibling and mine is not None else run_id
