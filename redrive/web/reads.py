"""What the pages and the JSON API show, each the CLI's view of it: ``status --json``,
``report --format json`` (with ``--since-last``'s changes and the alerts), ``inspect
--json``, the ``--where`` record of a message, ``audit --json`` and ``ledger in-doubt
--json``. Plain functions of the console's state: no request, no HTML."""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from redrive.broker.server import server_of
from redrive.errors import BrokerUnavailable, RedriveError, UsageProblem
from redrive.ledger import Ledger, RunInfo
from redrive.operations.resolve import Choices, Resolution, resolve_in_doubt_paged
from redrive.reporting import alerts
from redrive.reporting.audit import list_runs, own_runs, run_json
from redrive.reporting.report import FamilyReport, Report
from redrive.reporting.status import family_status
from redrive.runs.lifecycle import run_is_live
from redrive.web.console import Console
from redrive.web.filters import DlqFilters
from redrive.web.paging import PageAsk, messages_page
from redrive.web.samples import KEPT_PER_GROUP, public_record
from redrive.web.scans import ScanOutcome, ScanRequest


@dataclass
class SinceLast:
    """The overview's previous report (``report --since-last``'s state, kept in memory:
    the console's changes are since the scan it showed before, not the CLI's)."""

    state: dict[str, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def changes(self, report: Report) -> list[alerts.Change]:
        with self.lock:
            changes = alerts.changes_since(self.state, report)
            previous = {f: s for f, s in self.state.get("families", {}).items()}
            now = alerts.snapshot(report)
            if now != previous:
                self.state = {"generated_at": report.generated_at, "families": now}
        return changes


def status_json(console: Console) -> dict[str, Any]:
    """``redrive status --json``."""
    workspace = console.workspace
    try:
        server = server_of(workspace.broker_for(None))
    except BrokerUnavailable:
        raise
    except RedriveError:
        server = None
    rows = family_status(workspace.layout, workspace.broker_for)
    return {
        "layout": workspace.layout.source,
        "broker": server.to_json() if server else None,
        "families": [r.to_json() for r in rows],
    }


STATUS_SECONDS = 5.0
"""How long one ``status`` (the broker's counts: a few calls per family) serves every
overview: 20 viewers would otherwise ask the broker 18 times each per page (bench/console.py)."""


@dataclass
class StatusCache:
    """The last ``status --json``, for :data:`STATUS_SECONDS` of the console's clock. Once
    it is older, one viewer asks the broker again while the others are served the last one
    (they do not wait in line behind the broker's calls: bench/console.py's p95)."""

    at: float | None = None
    data: dict[str, Any] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    refreshing: bool = False

    def get(self, console: Console, fresh: bool) -> dict[str, Any]:
        with self.lock:
            now = console.clock()
            last = self.data
            if last is None or fresh:
                # Nothing to show yet, or asked for anew: this viewer waits for it.
                self.data, self.at = status_json(console), now
                return self.data
            if self.refreshing or (self.at is not None and now - self.at < STATUS_SECONDS):
                return last
            self.refreshing = True
        try:
            data = status_json(console)
        finally:
            with self.lock:
                self.refreshing = False
        with self.lock:
            self.data, self.at = data, now
        return data


def overview_json(console: Console, *, fresh: bool = False) -> dict[str, Any]:
    """The overview: ``status --json``, and ``report --format json`` built from each
    family's scan (as the scan source serves it), with the changes since the previous
    overview and the alerts ``report --fail-on-messages`` would raise."""
    status = console.extras.setdefault("status", StatusCache()).get(console, fresh)
    report = Report(generated_at=console.clock(), layout=console.workspace.layout.source)
    scans: dict[str, dict[str, Any]] = {}
    for family in console.workspace.layout.families:
        outcome = console.source.scan(ScanRequest(family.name), fresh=fresh)
        report.queues.append(
            FamilyReport(
                family.name,
                outcome.result.dlq if outcome.result is not None else family.dlq,
                outcome.result,
                outcome.problem,
            )
        )
        scans[family.name] = scan_note(outcome)
    since = console.extras.setdefault("since_last", SinceLast()).changes(report)
    decision, _ = alerts.decide_alert({}, report, throttle=None, now=report.generated_at)
    data = report.to_json()
    data["since_last"] = [c.to_json() for c in since]
    return {
        "status": status,
        "report": data,
        "alerts": [
            {"family": family, "reason": reason} for family, reason in decision.reasons.items()
        ],
        "scans": scans,
    }


def scan_note(outcome: ScanOutcome) -> dict[str, Any]:
    """When the scan shown was made, and why there is none (or why it is not fresh)."""
    return {
        "scanned_at": outcome.result.to_json()["scanned_at"] if outcome.result else None,
        "problem": outcome.problem,
        "moving": outcome.moving,
    }


def dlq_json(
    outcome: ScanOutcome, filters: DlqFilters | None = None, ask: PageAsk | None = None
) -> dict[str, Any]:
    """A DLQ's page: ``inspect --json`` of its scan, a page of its messages (records with
    their arguments withheld: of the groups the filters' tasks pick, from the scan's spool)
    with where that page is among the others, and the scan's note."""
    page = messages_page(outcome, filters or DlqFilters(), ask or PageAsk())
    return {
        "inspect": outcome.result.to_json() if outcome.result is not None else None,
        **page,
        "scan": scan_note(outcome),
    }


def runs_json(console: Console, *, since: float | None = None) -> list[dict[str, Any]]:
    """``redrive audit --json``: every run in the ledger, newest first (none without one)."""
    ledger = console.workspace.ledger()
    if ledger is None:
        return []
    try:
        return [run_json(run) for run in list_runs(ledger, since=since)]
    finally:
        ledger.close()


NOT_KEPT = (
    f"this scan kept the arguments of the first {KEPT_PER_GROUP} messages of each group "
    "only, not this one's (they are never written to disk)"
)


def message_json(outcome: ScanOutcome, message_id: str, *, revealed: bool) -> dict[str, Any] | None:
    """A message of the scan: its ``--where`` record (docs/where.md), arguments withheld
    unless ``revealed`` (and kept: ``arguments_kept``, the first few of each group); None
    when the scan counted no such message."""
    record = outcome.records.get(message_id)
    kept = record is not None
    if record is None and outcome.spool is not None:
        record = outcome.spool.record(message_id)
    if record is None:
        return None
    return {
        "target": outcome.request.target,
        "dlq": outcome.result.dlq if outcome.result is not None else None,
        "revealed": revealed and kept,
        "arguments_kept": kept,
        "record": dict(record) if revealed and kept else public_record(record),
        "scan": scan_note(outcome),
    }


IN_DOUBT_PAGE = 50
"""In-doubt messages shown at a time: a ledger may hold thousands."""


def page_number(value: str | None) -> int:
    """A page's number from a URL (1 when none is given); a UsageProblem (400) otherwise."""
    if value is None or value == "":
        return 1
    if not value.isdigit() or not 1 <= int(value) <= 10**6:
        raise UsageProblem(f"in_doubt_page: a page number from 1, not {value!r}")
    return int(value)


def operations_json(console: Console, *, in_doubt_page: int = 1) -> dict[str, Any]:
    """The operations page: the runs that are live now (their counts as far as they got),
    ``redrive audit --json`` (every run, the console's reveals and actions among them), and
    one page of ``ledger resolve --json`` as a dry run (:func:`in_doubt_json`)."""
    workspace = console.workspace
    ledger = workspace.ledger()
    if ledger is None:
        return {"ledger": None, "live": [], "runs": [], "in_doubt": None}
    try:
        runs = list_runs(ledger, since=None)
        now = console.clock()
        return {
            "ledger": ledger.location,
            "live": [
                live_json(ledger, r) for r in runs if r.ended_at is None and run_is_live(r, now)
            ],
            "runs": [run_json(r) for r in runs],
            "in_doubt": in_doubt_json(console, ledger, in_doubt_page),
        }
    finally:
        ledger.close()


def live_runs_json(console: Console) -> dict[str, Any]:
    """The live runs alone (what the operations page's script polls): no in-doubt list."""
    ledger = console.workspace.ledger()
    if ledger is None:
        return {"ledger": None, "live": []}
    try:
        now = console.clock()
        live = [r for r in list_runs(ledger, since=None) if r.ended_at is None]
        return {
            "ledger": ledger.location,
            "live": [live_json(ledger, r) for r in live if run_is_live(r, now)],
        }
    finally:
        ledger.close()


@dataclass
class PageOf:
    """Keeps the resolutions of one page (``size`` from ``start``, in the ledger's order) of
    those a paged resolve hands over, and lets the others go."""

    start: int
    size: int
    seen: int = 0
    kept: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, resolutions: Sequence[Resolution]) -> None:
        for item in resolutions:
            if self.start <= self.seen < self.start + self.size:
                self.kept.append(item.to_json())
            self.seen += 1


def in_doubt_json(console: Console, ledger: Ledger, page: int) -> dict[str, Any]:
    """``ledger resolve --json`` as a dry run, its messages one page of them: each with what
    the evidence says and what would be done; the counts are of them all. Resolved a page at
    a time as the CLI's is (``resolve_in_doubt_paged``): memory does not grow with the keys
    in doubt, whichever page is shown."""
    workspace = console.workspace
    shown = PageOf((page - 1) * IN_DOUBT_PAGE, IN_DOUBT_PAGE)
    tally = resolve_in_doubt_paged(
        ledger,
        Choices(),
        execute=False,
        on_page=shown,
        results=workspace.results,
        ignores_result=workspace.ignores_result,
    )
    return tally.head_json() | {
        "messages": shown.kept,
        "page": page,
        "pages": max(1, math.ceil(tally.in_doubt / IN_DOUBT_PAGE)),
        "page_size": IN_DOUBT_PAGE,
    }


def live_json(ledger: Ledger, run: RunInfo) -> dict[str, Any]:
    """A live run as ``audit --json`` has it, and its progress as the ledger knows it now:
    its keys (its processes' too) by state (claimed, sent, done, skipped). The ledger is
    what every run writes as it goes, the CLI's as the console's."""
    keys = Counter(
        str(entry.state) for owner in own_runs(ledger, run) for entry in ledger.keys_for_run(owner)
    )
    return {**run_json(run), "keys": dict(sorted(keys.items()))}


def resolve_json(console: Console, choices: Choices) -> dict[str, Any]:
    """``redrive ledger resolve --execute`` with the operator's choices: its ``--json``'s
    counts (its messages, however many, are let go page by page: the page shows the
    in-doubt list as it stands after)."""
    workspace = console.workspace
    ledger = workspace.ledger()
    if ledger is None:
        return {"in_doubt": 0}
    try:
        return resolve_in_doubt_paged(
            ledger,
            choices,
            execute=True,
            on_page=lambda page: None,
            command="redrive web: ledger resolve",
            results=workspace.results,
            ignores_result=workspace.ignores_result,
        ).head_json()
    finally:
        ledger.close()
