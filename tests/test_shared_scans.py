"""Shared scans (issue 41, item 4; redrive/inspection/shared.py): every viewer of a DLQ served
from one scan per refresh interval, on moto's server with many threads asking at once. What a
scan read is counted by the broker itself: each message's SQS receive count."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Family, MotoServer, make_family, unreachable, wait_until

from redrive.broker import resolve_target
from redrive.broker.base import Broker, DlqTarget
from redrive.broker.sqs import SqsBroker
from redrive.config import built_in_layout
from redrive.inspection.scan import InspectResult
from redrive.inspection.shared import (
    Failed,
    InspectView,
    Moving,
    Refused,
    Scanned,
    Scanning,
    ScanStatus,
    SharedScans,
    inspect_view,
)
from redrive.ledger import open_ledger
from redrive.runs.lifecycle import RunLifecycle
from redrive.runs.live import LedgerRuns
from redrive.sandbox.encoder import encode

REFRESH = 60.0
BY_TASK = InspectView()
Status = ScanStatus[InspectResult]
Cache = SharedScans[InspectView, InspectResult]
VIEWERS = 24
MESSAGES = 30


class Clock:
    """The cache's clock, moved by the test only."""

    def __init__(self) -> None:
        self.now = time.time()  # read once: the ledger records wall-clock times

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def family(server: MotoServer) -> Family:
    family = make_family(server.client())
    for n in range(MESSAGES):
        family.send_to_dlq(encode("apps.shop.tasks.charge", [n], {}, task_id=f"c-{n}"))
    return family


@pytest.fixture
def brokers(server: MotoServer) -> Callable[[str | None], Broker]:
    return lambda region: SqsBroker(server.client())


@pytest.fixture
def target(brokers: Callable[[str | None], Broker]) -> DlqTarget:
    return resolve_target(built_in_layout({}), "checkout", brokers)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def cache(brokers: Callable[[str | None], Broker], clock: Clock, **more: Any) -> Cache:
    return SharedScans(inspect_view(brokers), brokers, refresh=REFRESH, clock=clock, **more)


@pytest.fixture
def scans(brokers: Callable[[str | None], Broker], clock: Clock) -> Iterator[Cache]:
    shared = cache(brokers, clock)
    yield shared
    shared.close()


def receives(family: Family) -> list[int]:
    """Each DLQ message's SQS receive count before this look (which is one more receive),
    every message visible again after it."""
    seen: dict[str, int] = {}
    handles = []
    while True:
        got = family.client.receive_message(
            QueueUrl=family.dlq_url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=60,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        ).get("Messages", [])
        if not got:
            break
        for m in got:
            seen[m["MessageId"]] = int(m["Attributes"]["ApproximateReceiveCount"]) - 1
            handles.append(m["ReceiptHandle"])
    for start in range(0, len(handles), 10):
        family.client.change_message_visibility_batch(
            QueueUrl=family.dlq_url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0}
                for i, h in enumerate(handles[start : start + 10])
            ],
        )
    return sorted(seen.values())


def all_at_once(n: int, ask: Callable[[], Status]) -> list[Status]:
    """``n`` threads asking at the same moment."""
    barrier = threading.Barrier(n)
    out: list[Status] = []
    lock = threading.Lock()

    def viewer() -> None:
        barrier.wait()
        status = ask()
        with lock:
            out.append(status)

    threads = [threading.Thread(target=viewer) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(out) == n
    return out


def test_many_viewers_at_once_cause_one_scan_and_each_gets_its_result(
    family: Family, target: DlqTarget, scans: Cache
) -> None:
    shown = all_at_once(VIEWERS, lambda: scans.status(target, BY_TASK))
    assert all(isinstance(s, Scanned) for s in shown)
    results = {id(s.result) for s in shown if isinstance(s, Scanned)}
    assert len(results) == 1 and scans.scans == 1
    first = shown[0]
    assert isinstance(first, Scanned) and first.result.total == MESSAGES
    assert receives(family) == [1] * MESSAGES  # exactly one scan's worth


def test_inside_the_interval_no_scan_after_it_one_and_the_last_result_meanwhile(
    family: Family, target: DlqTarget, scans: Cache, clock: Clock
) -> None:
    first = scans.status(target, BY_TASK)
    assert isinstance(first, Scanned)
    clock.advance(REFRESH - 1)
    again = all_at_once(VIEWERS, lambda: scans.status(target, BY_TASK))
    assert all(isinstance(s, Scanned) and s.result is first.result for s in again)
    assert scans.scans == 1
    clock.advance(1)
    # The interval is over: one viewer starts the scan; the others get the last result.
    later = all_at_once(VIEWERS, lambda: scans.status(target, BY_TASK))
    assert scans.scans == 2
    assert all(isinstance(s, Scanned) for s in later)
    clock.advance(1)
    assert isinstance(scans.status(target, BY_TASK, wait=None), Scanned)

    def second_scan_shown() -> bool:
        # Inside the interval again: asking starts nothing, it shows the second scan's
        # result once that scan has ended (until then the first's, marked refreshing).
        shown = scans.status(target, BY_TASK)
        return isinstance(shown, Scanned) and shown.result is not first.result

    # The second scan's end is an event, not a pace: closing while it runs would stop it
    # partway, and the receive counts would then depend on how far it got.
    wait_until(second_scan_shown, timeout=60, what="the second scan ends")
    assert scans.scans == 2
    scans.close()
    assert receives(family) == [2] * MESSAGES  # two scans, each message received once by each


def test_an_operators_fresh_scan_is_one_however_many_ask(
    family: Family, target: DlqTarget, scans: Cache
) -> None:
    first = scans.status(target, BY_TASK)
    assert isinstance(first, Scanned) and not first.fresh
    fresh = all_at_once(8, lambda: scans.status(target, BY_TASK, fresh=True))
    assert all(isinstance(s, Scanned) and s.result is not first.result for s in fresh)
    assert scans.scans == 2
    assert receives(family) == [2] * MESSAGES


def test_a_view_with_a_where_waits_for_the_next_interval_unless_asked_fresh(
    family: Family, target: DlqTarget, scans: Cache, clock: Clock
) -> None:
    assert isinstance(scans.status(target, BY_TASK), Scanned)
    focus = InspectView(where=("args[0] < `10`",))
    waiting = scans.status(target, focus)
    assert isinstance(waiting, Scanning) and waiting.due_at == clock.now + REFRESH
    assert scans.scans == 1
    counted = scans.status(target, focus, fresh=True)
    assert isinstance(counted, Scanned) and counted.result.total == 10
    assert scans.scans == 2
    clock.advance(REFRESH)
    assert isinstance(scans.status(target, focus), Scanned)
    assert scans.scans == 2 + 1  # one automatic scan of the DLQ for the interval
    assert isinstance(scans.status(target, BY_TASK), Scanned)
    assert scans.scans == 3


def test_a_dlq_a_live_run_moves_is_not_scanned_its_progress_is_shown(
    family: Family,
    target: DlqTarget,
    brokers: Callable[[str | None], Broker],
    clock: Clock,
    tmp_path: Path,
) -> None:
    ledger = open_ledger(str(tmp_path / "ledger.sqlite3"))
    scans = cache(brokers, clock, live_runs=LedgerRuns(lambda: ledger, clock=clock, ttl=0))
    try:
        run = RunLifecycle(
            ledger, execute=True, command="redrive move checkout", info={"dlq": target.dlq.url}
        )
        with run:
            shown = all_at_once(VIEWERS, lambda: scans.status(target, BY_TASK))
            assert all(isinstance(s, Moving) and s.run.run_id == run.run_id for s in shown)
            moving = shown[0]
            assert isinstance(moving, Moving) and moving.run.counts == {
                "claimed": 0,
                "sent": 0,
                "done": 0,
            }
            assert scans.scans == 0
            assert receives(family) == [0] * MESSAGES
        # The run ended: the DLQ is scanned again.
        assert isinstance(scans.status(target, BY_TASK), Scanned)
        assert scans.scans == 1
    finally:
        scans.close()
        ledger.close()


def test_a_dlq_with_a_delivery_limit_is_refused_as_the_cli_refuses_it(
    server: MotoServer, brokers: Callable[[str | None], Broker], clock: Clock
) -> None:
    client = server.client()
    family = make_family(client)
    last = client.create_queue(QueueName="onion-last-resort")["QueueUrl"]
    arn = client.get_queue_attributes(QueueUrl=last, AttributeNames=["QueueArn"])["Attributes"]
    policy = {"deadLetterTargetArn": arn["QueueArn"], "maxReceiveCount": 4}
    client.set_queue_attributes(
        QueueUrl=family.dlq_url, Attributes={"RedrivePolicy": json.dumps(policy)}
    )
    family.send_to_dlq(encode("apps.shop.tasks.charge", [1], {}, task_id="c-1"))
    target = resolve_target(built_in_layout({}), "checkout", brokers)
    scans = cache(brokers, clock)
    try:
        refused = scans.status(target, BY_TASK)
        assert isinstance(refused, Refused)
        assert "--allow-delivery-limit" in refused.reason and "4" in refused.reason
        assert scans.scans == 0 and receives(family) == [0]
        allowed = cache(brokers, clock, allow_delivery_limit=True)
        assert isinstance(allowed.status(target, BY_TASK), Scanned)
        allowed.close()
    finally:
        scans.close()


def test_a_scan_that_fails_is_a_status_with_why_and_the_last_result(
    family: Family, target: DlqTarget, clock: Clock
) -> None:
    scans = cache(unreachable(), clock)
    try:
        failed = scans.status(target, BY_TASK)
        assert isinstance(failed, Failed) and "cannot reach" in failed.error
        assert failed.last is None
        assert scans.status(target, BY_TASK) is failed and scans.scans == 1  # not retried at once
    finally:
        scans.close()


def test_a_viewer_that_will_not_wait_is_told_a_scan_is_under_way(
    family: Family, target: DlqTarget, brokers: Callable[[str | None], Broker], clock: Clock
) -> None:
    gate = threading.Event()

    def slow(region: str | None) -> Broker:
        gate.wait(60)
        return brokers(region)

    scans = SharedScans(inspect_view(slow), brokers, refresh=REFRESH, clock=clock)
    try:
        under_way = scans.status(target, BY_TASK, wait=0)
        assert isinstance(under_way, Scanning) and under_way.started_at == clock.now
        gate.set()
        assert isinstance(scans.status(target, BY_TASK), Scanned)
        assert scans.scans == 1
    finally:
        scans.close()
