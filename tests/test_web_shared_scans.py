"""The console's pages on the shared scan source (redrive/web/shared_scans.py): every viewer
served from one scan per refresh interval (counted by SQS itself: each message's receive
count), and a DLQ a live run moves shown with that run instead of a scan."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import Family
from web_console import client, console, sqs_workspace

from redrive.ledger import open_ledger
from redrive.runs.lifecycle import RunLifecycle
from redrive.sandbox.encoder import encode
from redrive.web import reads
from redrive.web.console import Console
from redrive.web.scans import ScanRequest
from redrive.web.settings import ConsoleSettings
from redrive.web.shared_scans import SharedScanSource

REFRESH = 300.0


class Clock:
    def __init__(self) -> None:
        self.now = time.time()  # read once: the ledger records wall-clock times

    def __call__(self) -> float:
        return self.now


def receive_counts(family: Family) -> list[int]:
    """Each DLQ message's receive count before this look; all visible again after it."""
    got = family.client.receive_message(
        QueueUrl=family.dlq_url,
        MaxNumberOfMessages=10,
        VisibilityTimeout=0,
        MessageSystemAttributeNames=["ApproximateReceiveCount"],
    ).get("Messages", [])
    return sorted(int(m["Attributes"]["ApproximateReceiveCount"]) - 1 for m in got)


def shared_console(clock: Clock, tmp_path: Path) -> Console:
    workspace = sqs_workspace(ledger_uri=str(tmp_path / "ledger.sqlite3"))
    source = SharedScanSource(workspace, refresh=REFRESH, clock=clock)
    settings = ConsoleSettings(secret=b"test-secret" * 3, refresh=REFRESH)
    return Console(settings, workspace, scans=source, clock=clock)


def test_many_viewers_of_the_pages_cause_one_scan_per_dlq(
    all_families: dict[str, Family], tmp_path: Path
) -> None:
    checkout = all_families["checkout"]
    for n in range(5):
        checkout.send_to_dlq(encode("apps.payments.tasks.refund", [n], task_id=f"r-{n}"))
    clock = Clock()
    shared = shared_console(clock, tmp_path)
    barrier = threading.Barrier(12)

    def viewer() -> None:
        barrier.wait()
        shared.source.scan(ScanRequest("checkout"))

    threads = [threading.Thread(target=viewer) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    with client(shared) as test:
        for _ in range(3):
            assert test.get("/").status_code == 200
            data = test.get("/api/dlq/checkout").json()
    assert data["inspect"]["total"] == 5 and data["scan"]["problem"] is None
    assert receive_counts(checkout) == [1] * 5  # one scan's worth, for 15 views
    source = shared.source
    assert isinstance(source, SharedScanSource) and source.cache.scans == 3  # one per DLQ


def test_a_dlq_a_live_run_moves_shows_the_run_not_a_scan(
    all_families: dict[str, Family], tmp_path: Path
) -> None:
    checkout = all_families["checkout"]
    checkout.send_to_dlq(encode("apps.payments.tasks.refund", [1], task_id="r-1"))
    clock = Clock()
    shared = shared_console(clock, tmp_path)
    ledger = open_ledger(str(tmp_path / "ledger.sqlite3"))
    try:
        with (
            RunLifecycle(
                ledger,
                execute=True,
                command="redrive move checkout --execute",
                info={"dlq": checkout.dlq_url, "user": "alice"},
            ) as run,
            client(shared) as test,
        ):
            data = test.get("/api/dlq/checkout").json()
            page = test.get("/dlq/checkout")
    finally:
        ledger.close()
    assert data["scan"]["moving"] == run.run_id and data["inspect"] is None
    assert "is moving this DLQ" in data["scan"]["problem"] and "alice" in data["scan"]["problem"]
    assert "is moving this DLQ" in page.text
    assert receive_counts(checkout) == [0]  # never scanned


def test_a_stale_status_is_served_while_one_viewer_asks_the_broker_again(
    all_families: dict[str, Family], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The overview's ``status`` (the broker's counts) once older than STATUS_SECONDS: one
    viewer asks the broker again, the others get the last one at once instead of waiting in
    line behind it."""
    clock = Clock()
    shown = console(sqs_workspace(), clock=clock)
    real, calls = reads.status_json, []
    asking, answer = threading.Event(), threading.Event()

    def status_json(c: Console) -> dict[str, Any]:
        calls.append(c)
        if len(calls) == 2:  # the refresh: held until the test lets it answer
            asking.set()
            answer.wait(60)
        return real(c)

    monkeypatch.setattr(reads, "status_json", status_json)
    cache = reads.StatusCache()
    first = cache.get(shown, False)
    clock.now += reads.STATUS_SECONDS
    refresher = threading.Thread(target=cache.get, args=(shown, False))
    refresher.start()
    assert asking.wait(60)
    assert cache.get(shown, False) is first and len(calls) == 2  # at once, no call
    answer.set()
    refresher.join(60)
    assert cache.get(shown, False) is not first and len(calls) == 2
