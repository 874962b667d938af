"""The console's shared scan source: :class:`~redrive.inspection.shared.SharedScans` behind
the pages' :class:`~redrive.web.scans.ScanSource` seam. Every viewer of a DLQ is served from
one scan per ``--refresh`` interval; an operator's fresh scan is one at a time; a DLQ a live
run moves (the console's own or a CLI's, from the ledger's run records) is not scanned and
its page says which run moves it and how far it got; a delivery limit's refusal and a failed
scan are said on the page, never an error page."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from redrive.broker import resolve_target
from redrive.broker.base import DlqTarget
from redrive.errors import RedriveError
from redrive.inspection.shared import (
    DEFAULT_REFRESH,
    Failed,
    Moving,
    Refused,
    ScanControl,
    Scanned,
    Scanning,
    ScanStatus,
    SharedScans,
)
from redrive.ledger import Ledger
from redrive.runs.live import LedgerRuns, RunProgress
from redrive.web.scans import ScanOutcome, ScanRequest, scan_dlq
from redrive.web.workspace import Workspace

WAIT_SECONDS = 30.0
"""How long a page waits for a DLQ's first scan before it says the scan is under way."""


class SharedScanSource:
    """A :class:`~redrive.web.scans.ScanSource` sharing scans between every viewer."""

    def __init__(
        self,
        workspace: Workspace,
        *,
        refresh: float = DEFAULT_REFRESH,
        clock: Callable[[], float] = time.time,
        wait: float | None = WAIT_SECONDS,
        own_progress: Callable[[str], Mapping[str, int] | None] = lambda run_id: None,
    ) -> None:
        self.workspace = workspace
        self.wait = wait
        self._clock = clock
        self._refresh = refresh
        self._ledgers: list[Ledger] = []
        self.runs = LedgerRuns(self._open_ledger, clock=clock, own=own_progress)
        self.cache: SharedScans[ScanRequest, ScanOutcome] = SharedScans(
            self._scan,
            workspace.broker_for,
            refresh=refresh,
            clock=clock,
            live_runs=self.runs,
            receive_log=lambda: workspace.receive_log,
            allow_delivery_limit=workspace.allow_delivery_limit,
        )
        self._targets: dict[str, tuple[float, DlqTarget]] = {}
        self._lock = threading.Lock()

    def scan(self, request: ScanRequest, *, fresh: bool = False) -> ScanOutcome:
        try:
            target = self._target(request.target)
        except RedriveError as exc:
            return ScanOutcome(request, None, problem=str(exc))
        return outcome_of(request, self.cache.status(target, request, fresh=fresh, wait=self.wait))

    def _target(self, name: str) -> DlqTarget:
        """The TARGET resolved at most once per interval (each resolve asks the broker)."""
        now = self._clock()
        with self._lock:
            known = self._targets.get(name)
            if known is not None and now - known[0] < self._refresh:
                return known[1]
        found = resolve_target(self.workspace.layout, name, self.workspace.broker_for)
        with self._lock:
            self._targets[name] = (now, found)
        return found

    def _scan(self, target: DlqTarget, request: ScanRequest, control: ScanControl) -> ScanOutcome:
        return scan_dlq(
            self.workspace,
            target,
            request,
            now=control.now,
            stop=control.stop,
            on_progress=control.on_progress,
        )

    def _open_ledger(self) -> Ledger | None:
        ledger = self.workspace.ledger()
        if ledger is not None:
            self._ledgers.append(ledger)
        return ledger

    def close(self) -> None:
        self.cache.close()
        for ledger in self._ledgers:
            ledger.close()


def outcome_of(request: ScanRequest, status: ScanStatus[ScanOutcome]) -> ScanOutcome:
    """What the page shows for a status: the scan (the last one, where there is one), and
    in one line why there is no newer one."""
    if isinstance(status, Scanned):
        return status.result
    if isinstance(status, Moving):
        last = status.last.result if status.last is not None else None
        return _with(request, last, moving_text(status.run), moving=status.run.run_id)
    if isinstance(status, Refused):
        return ScanOutcome(request, None, problem=status.reason)
    if isinstance(status, Failed):
        last = status.last.result if status.last is not None else None
        return _with(request, last, f"the scan failed: {status.error}")
    return _with(request, None, scanning_text(status))


def _with(
    request: ScanRequest, last: ScanOutcome | None, problem: str, moving: str | None = None
) -> ScanOutcome:
    if last is None:
        return ScanOutcome(request, None, problem=problem, moving=moving)
    return ScanOutcome(
        request,
        last.result,
        records=last.records,
        spool=last.spool,
        problem=f"{problem} (shown: the last scan)",
        moving=moving,
        scanned_at=last.scanned_at,
    )


def moving_text(run: RunProgress) -> str:
    who = f" by {run.user}" if run.user else ""
    done = ", ".join(f"{state} {n:,}" for state, n in run.counts.items() if n) or "nothing yet"
    return (
        f"run {run.run_id} ({run.command}{who}) is moving this DLQ: not scanned while it runs "
        f"(a scan would hide what it reads); its keys so far: {done}"
    )


def scanning_text(status: Scanning) -> str:
    if status.started_at is not None:
        return f"scanning: {status.received:,} message(s) received so far; reload to see it"
    return "not scanned yet: the next scan of this DLQ is due within the refresh interval"
