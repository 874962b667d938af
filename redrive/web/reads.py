"""What the pages and the JSON API show, each the CLI's view of it: ``status --json``,
``report --format json`` (with ``--since-last``'s changes and the alerts), ``inspect
--json``, the ``--where`` record of a message, ``audit --json`` and ``ledger in-doubt
--json``. Plain functions of the console's state: no request, no HTML."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from redrive.broker.server import server_of
from redrive.errors import BrokerUnavailable, RedriveError
from redrive.reporting import alerts
from redrive.reporting.audit import list_runs, run_json
from redrive.reporting.report import FamilyReport, Report
from redrive.reporting.status import family_status
from redrive.web.console import Console
from redrive.web.samples import public_record
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
    """The last ``status --json``, for :data:`STATUS_SECONDS` of the console's clock."""

    at: float | None = None
    data: dict[str, Any] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, console: Console, fresh: bool) -> dict[str, Any]:
        with self.lock:
            now = console.clock()
            if fresh or self.data is None or self.at is None or now - self.at >= STATUS_SECONDS:
                self.data, self.at = status_json(console), now
            return self.data


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


def dlq_json(outcome: ScanOutcome) -> dict[str, Any]:
    """A DLQ's page: ``inspect --json`` of its scan, the messages kept from it (records
    with their arguments withheld), and the scan's note."""
    return {
        "inspect": outcome.result.to_json() if outcome.result is not None else None,
        "messages": [public_record(r) for r in outcome.records.values()],
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
