"""Tests for redrive.dlq.scan: every message seen exactly once, everything held given back."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import REGION, MotoServer, SqsClock, make_family, start_moto_server, wait_until
from conftest import Family as QueueFamily
from moto.core import DEFAULT_ACCOUNT_ID
from moto.core.utils import unix_time
from moto.sqs.models import Message as MotoMessage
from moto.sqs.models import SQSBackend, sqs_backends

from redrive.broker.base import BatchResult, Delivery, queue_name
from redrive.broker.sqs import SqsBroker
from redrive.broker.sqs.calls import MAX_VISIBILITY_SECONDS as MAX_VISIBILITY
from redrive.broker.sqs.calls import message as sqs_message
from redrive.dlq.scan import (
    DlqScan,
    digest,
    hold_seconds,
    renew_ahead,
    run_pipelines,
    sort_received,
)
from redrive.errors import AwsError


@pytest.fixture
def fast_moto(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto checks each received message's retention by computing every attribute of the
    queue, which walks all its messages: a 1,000-message scan would take 40 s instead of 2.
    The same check, on the queue's own retention period."""

    def valid(self: SQSBackend, name: str, message: MotoMessage) -> bool:
        retention = int(self.get_queue(name).message_retention_period)
        return bool(retention + message.sent_timestamp / 1000 > unix_time())

    monkeypatch.setattr(SQSBackend, "is_message_valid_based_on_retention_period", valid)


NewScan = Callable[..., DlqScan]


@pytest.fixture
def new_scan() -> Iterator[NewScan]:
    """DlqScans that are closed after the test, even when it fails (their spool is a file)."""
    made: list[DlqScan] = []

    def make(url: str, **options: Any) -> DlqScan:
        made.append(DlqScan(url=url, **options))
        return made[-1]

    yield make
    for scan in made:
        scan.close()


def seed(url: str, count: int) -> list[str]:
    """Put ``count`` messages straight into moto's queue (SendMessage also walks the whole
    queue per message in moto, which is quadratic) and return their MessageIds."""
    queue = sqs_backends[DEFAULT_ACCOUNT_ID][REGION].get_queue(queue_name(url))
    ids = []
    for i in range(count):
        message = MotoMessage(str(uuid.uuid4()), f"message {i}")
        message.mark_sent()
        queue.add_message(message)
        ids.append(message.id)
    return ids


def send(family: QueueFamily, count: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, count, 10):
        entries = [
            {"Id": str(i), "MessageBody": f"message {start + i}"}
            for i in range(min(10, count - start))
        ]
        response = family.client.send_message_batch(QueueUrl=family.dlq_url, Entries=entries)
        ids.extend(item["MessageId"] for item in response["Successful"])
    return ids


def drain_scan(scan: DlqScan, sqs: SqsBroker, *, after_batch: Any = None) -> list[Delivery]:
    """What a read-only operation does: look at each batch, then keep it held."""
    seen: list[Delivery] = []
    batches = 0
    while (batch := scan.next_batch(sqs)) is not None:
        seen.extend(batch)
        batches += 1
        if after_batch is not None:
            after_batch(batches, batch)
        scan.keep(sqs, batch)
    return seen


# -- how long holds last --------------------------------------------------------------


def test_a_hold_is_the_lease_while_renewing_them_all_costs_little() -> None:
    # Up to 100 held messages per second of lease, renewing each once per lease costs at
    # most 10 calls a second: the hold is the lease, however long the run has lived.
    assert hold_seconds(lease=30, age=0, held=0) == 30
    assert hold_seconds(lease=30, age=3_600, held=3_000) == 30
    assert hold_seconds(lease=4, age=600, held=30) == 4


def test_a_deep_hold_grows_with_what_is_held_but_never_past_twice_the_runs_age() -> None:
    # 100,000 held: renewing them every 30 s would be 333 calls a second. At 10 calls a
    # second a hold lasts 1,000 s; a run younger than 500 s holds for twice its age instead.
    assert hold_seconds(lease=30, age=3_600, held=100_000) == 1_000
    assert hold_seconds(lease=30, age=120, held=100_000) == 240
    assert hold_seconds(lease=30, age=5, held=100_000) == 30
    # SQS's longest visibility timeout caps it, as the SQS broker says.
    assert hold_seconds(lease=30, age=10**9, held=10**9, max_hold=MAX_VISIBILITY) == MAX_VISIBILITY


def test_a_hold_is_never_shorter_than_the_renewer_can_keep_up_with() -> None:
    # A renewer that manages 1,000 handles a second may spend half of it: 100,000 held then
    # need 200 s holds, even from a young run (else they run out under a live one).
    assert hold_seconds(lease=30, age=5, held=100_000, renew_capacity=1_000) == 200
    assert hold_seconds(lease=30, age=5, held=1_000, renew_capacity=1_000) == 30


def test_holds_are_renewed_ahead_of_their_end_but_not_continuously() -> None:
    assert renew_ahead(1) == 0.5
    assert renew_ahead(4) == 1.0
    assert renew_ahead(30) == 6.0
    assert renew_ahead(1_000) == 15.0


# -- one pass over the queue -----------------------------------------------------------


def test_every_message_once_then_all_released_at_1000(
    new_scan: NewScan, family: QueueFamily, fast_moto: None
) -> None:
    sent = seed(family.dlq_url, 1000)
    assert family.depth() == (1000, 0)
    sqs = SqsBroker(family.client)
    received: list[int] = []
    scan = new_scan(family.dlq_url, lease=120, on_receive=received.append)
    seen = drain_scan(scan, sqs)
    ids = [m.message_id for m in seen]
    assert len(ids) == 1000
    assert set(ids) == set(sent)
    # Until the scan ends, what it saw stays hidden: it is not received twice.
    assert family.depth() == (0, 1000)
    assert scan.done
    assert scan.stats.received == 1000
    assert scan.stats.seen_again == 0
    assert scan.stats.held == 1000
    assert received[-1] == 1000 and received == sorted(received)
    scan.release_all(sqs)
    assert scan.stats.released == 1000
    assert scan.stats.release_failed == 0
    assert family.depth() == (1000, 0)


def test_empty_queue_ends_at_the_first_empty_receive_when_sqs_counts_nothing(
    new_scan: NewScan, family: QueueFamily
) -> None:
    sqs = SqsBroker(family.client)
    scan = new_scan(family.dlq_url, lease=30, stop_after_empty=3)
    assert scan.next_batch(sqs) is None
    assert scan.stats.receives == scan.stats.empty_receives == 1
    scan.release_all(sqs)
    assert scan.stats.released == 0


def test_empty_receives_while_sqs_still_counts_messages_go_on_up_to_the_limit(
    new_scan: NewScan, family: QueueFamily, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQS's counts lag; while they say messages are visible, an empty receive is not the
    end, but the scan still ends after ``stop_after_empty`` of them."""
    sqs = SqsBroker(family.client)
    monkeypatch.setattr(sqs, "attributes", lambda url, names: {"ApproximateNumberOfMessages": "4"})
    scan = new_scan(family.dlq_url, lease=30, stop_after_empty=3)
    assert scan.next_batch(sqs) is None
    assert scan.stats.receives == scan.stats.empty_receives == 3


def test_max_messages(new_scan: NewScan, family: QueueFamily) -> None:
    send(family, 35)
    sqs = SqsBroker(family.client)
    scan = new_scan(family.dlq_url, lease=60, max_messages=12)
    sizes: list[int] = []
    seen = drain_scan(scan, sqs, after_batch=lambda n, batch: sizes.append(len(batch)))
    assert sizes == [10, 2]
    assert len({m.message_id for m in seen}) == 12
    assert scan.stats.received == 12
    assert family.depth() == (23, 12)
    scan.release_all(sqs)
    assert family.depth() == (35, 0)


def test_stop_receiving_ends_the_scan(new_scan: NewScan, family: QueueFamily) -> None:
    send(family, 30)
    sqs = SqsBroker(family.client)
    scan = new_scan(family.dlq_url, lease=60)
    first = scan.next_batch(sqs)
    assert first is not None
    scan.keep(sqs, first)
    scan.stop_receiving()
    assert scan.next_batch(sqs) is None
    assert scan.stats.receives == 1
    scan.release_all(sqs)
    assert family.depth() == (30, 0)


def test_stop_event_ends_the_scan(new_scan: NewScan, family: QueueFamily) -> None:
    send(family, 30)
    sqs = SqsBroker(family.client)
    stop = threading.Event()
    scan = new_scan(family.dlq_url, lease=60, stop=stop)
    seen = drain_scan(scan, sqs, after_batch=lambda n, batch: stop.set())
    assert len(seen) == 10
    scan.release_all(sqs)
    assert family.depth() == (30, 0)


class NoRenewals(SqsBroker):
    """SQS refusing every renewal of a hold (releases still work)."""

    def change_visibility_batch(self, url: str, handles: Any, timeout: int) -> BatchResult:
        if timeout > 0:
            return BatchResult({}, {i: "MessageNotInflight" for i in handles})
        return super().change_visibility_batch(url, handles, timeout)


def test_lease_running_out_mid_scan_keeps_counts_exact(
    new_scan: NewScan, family: QueueFamily, sqs_clock: SqsClock
) -> None:
    """A 1 s lease that cannot be renewed and a consumer that stalls after 30 messages:
    those 30 come back while the scan is running. They are recognised, not counted twice,
    and the scan goes on to the messages it has not seen yet instead of taking the repeats
    for the end."""
    sent = send(family, 50)
    sqs = SqsBroker(family.client, clock=sqs_clock)
    scan = new_scan(
        family.dlq_url,
        lease=1,
        clock=sqs_clock,
        broker_factory=lambda: NoRenewals(family.client, clock=sqs_clock),
    )

    def slow_consumer(batches: int, batch: list[Delivery]) -> None:
        if batches == 3:
            sqs_clock.advance(1.2)  # the stall: past every hold so far
            wait_until(lambda: scan.stats.renew_failed > 0, "a refused renewal")

    seen = drain_scan(scan, sqs, after_batch=slow_consumer)
    ids = [m.message_id for m in seen]
    assert scan.stats.seen_again > 0
    assert scan.stats.renew_failed > 0
    assert scan.stats.received == 50
    assert len(ids) == 50
    assert set(ids) == set(sent)
    scan.release_all(sqs)
    assert family.depth() == (50, 0)


def test_held_messages_stay_hidden_past_their_lease_while_the_scan_lives(
    new_scan: NewScan, family: QueueFamily, sqs_clock: SqsClock
) -> None:
    send(family, 20)
    sqs = SqsBroker(family.client, clock=sqs_clock)
    scan = new_scan(family.dlq_url, lease=1, clock=sqs_clock)

    def slow_consumer(batches: int, batch: list[Delivery]) -> None:
        if batches == 1:
            scan.keep(sqs, batch)  # renewed while held, not just hidden by its 1 s lease
            # 2.5 s of a 1 s lease renewed every half second: each renewal is waited for,
            # since the renewing thread, not the clock, may be slow.
            for step in range(1, 6):
                sqs_clock.advance(0.5)
                wait_until(lambda: scan.stats.renew_calls >= step, f"renewal {step}")  # noqa: B023
                assert family.depth() == (10, 10), f"a held message came back after {step / 2} s"

    seen = drain_scan(scan, sqs, after_batch=slow_consumer)
    assert len(seen) == 20
    assert scan.stats.seen_again == 0
    assert scan.stats.renew_calls >= 2 and scan.stats.renew_failed == 0
    assert scan.stats.longest_hold == 1
    scan.release_all(sqs)
    assert family.depth() == (20, 0)


def test_a_closed_scan_renews_nothing_so_its_holds_end_within_the_lease(
    new_scan: NewScan, family: QueueFamily, sqs_clock: SqsClock
) -> None:
    """What a killed run leaves: no release, no more renewals. Its holds end within about
    its lease, however long it lived (not after a hold sized for the whole scan)."""
    send(family, 25)
    sqs = SqsBroker(family.client, clock=sqs_clock)
    scan = new_scan(family.dlq_url, lease=2, clock=sqs_clock)
    drain_scan(scan, sqs)
    sqs_clock.advance(1.0)  # a 2 s hold is renewed 1 s before it ends: 25 held, 3 calls
    wait_until(lambda: scan.stats.renew_calls >= 3, "the first renewal")
    sqs_clock.advance(1.5)
    wait_until(lambda: scan.stats.renew_calls >= 6, "the second renewal")
    assert family.depth() == (0, 25), "renewed past the receive's own 2 s"
    scan.close()  # the run dies here, 2.5 s in, just after a renewal
    assert scan._renewer is not None and not scan._renewer.is_alive()
    sqs_clock.advance(1.9)
    assert family.depth() == (0, 25), "the last renewal's hold is the 2 s lease"
    sqs_clock.advance(0.1 + 0.01)
    assert family.depth() == (25, 0), "holds outlived the lease"


def test_renewals_go_on_after_a_failed_call_and_stop_at_release(
    new_scan: NewScan, family: QueueFamily, sqs_clock: SqsClock
) -> None:
    send(family, 10)
    sqs = SqsBroker(family.client, clock=sqs_clock)
    calls: list[int] = []

    class Flaky(SqsBroker):
        def change_visibility_batch(self, url: str, handles: Any, timeout: int) -> BatchResult:
            calls.append(timeout)
            if len(calls) == 1:
                raise AwsError("ChangeMessageVisibilityBatch failed: throttled")
            return super().change_visibility_batch(url, handles, timeout)

    scan = new_scan(
        family.dlq_url,
        lease=2,
        clock=sqs_clock,
        broker_factory=lambda: Flaky(family.client, clock=sqs_clock),
    )
    drain_scan(scan, sqs)
    sqs_clock.advance(1.0)  # the renewal 1 s before the 2 s hold ends fails
    wait_until(lambda: scan.stats.renew_errors == 1, "the failed renewal")
    sqs_clock.advance(1.0)  # retried a second later
    wait_until(lambda: scan.stats.renew_calls >= 1, "the renewal after the failed one")
    sqs_clock.advance(0.6)
    assert scan.stats.renew_errors == 1 and scan.stats.renew_calls >= 1
    assert family.depth() == (0, 10), "the renewal after the failed one kept them hidden"
    scan.release_all(sqs)
    renewals = len(calls)
    assert scan.stats.released == 10 and family.depth() == (10, 0)
    assert scan._renewer is not None and not scan._renewer.is_alive()
    sqs_clock.advance(5.0)
    assert len(calls) == renewals, "nothing is renewed after the release"


def test_release_now_makes_messages_visible_at_once(new_scan: NewScan, family: QueueFamily) -> None:
    send(family, 5)
    sqs = SqsBroker(family.client)
    scan = new_scan(family.dlq_url, lease=60)
    batch = scan.next_batch(sqs)
    assert batch is not None and len(batch) == 5
    assert family.depth() == (0, 5)
    assert scan.release_now(sqs, batch) == 5
    assert family.depth() == (5, 0)


# -- giving back -----------------------------------------------------------------------


def test_release_all_after_an_exception(new_scan: NewScan, family: QueueFamily) -> None:
    send(family, 40)
    sqs = SqsBroker(family.client)
    scan = new_scan(family.dlq_url, lease=120)

    def fail_on_third(batches: int, batch: list[Delivery]) -> None:
        if batches == 3:
            raise RuntimeError("operation failed")

    with pytest.raises(RuntimeError, match="operation failed"):
        try:
            drain_scan(scan, sqs, after_batch=fail_on_third)
        finally:
            scan.release_all(sqs)
    # The two batches kept are back; the third was never kept, so its lease still runs.
    assert scan.stats.released == 20
    assert family.depth() == (30, 10)
    # A second call finds nothing more to release and does not fail.
    scan.release_all(sqs)
    assert scan.stats.released == 20


class SpoolSpy:
    """Stands in for the scan's spool file and counts the lines read from it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lines_read = 0

    def __iter__(self) -> Iterator[str]:
        for line in self.inner:
            self.lines_read += 1
            yield line

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_release_all_streams_the_spool(
    new_scan: NewScan, family: QueueFamily, monkeypatch: Any
) -> None:
    send(family, 35)
    sqs = SqsBroker(family.client)
    scan = new_scan(family.dlq_url, lease=120)
    drain_scan(scan, sqs)
    [segment] = scan._holds.segments
    spy = SpoolSpy(segment.file)
    segment.file = spy
    calls: list[tuple[int, int, int]] = []
    real = sqs.change_visibility_batch

    def spying(url: str, handles: dict[str, str], timeout: int) -> BatchResult:
        calls.append((len(handles), timeout, spy.lines_read))
        return real(url, handles, timeout)

    monkeypatch.setattr(sqs, "change_visibility_batch", spying)
    progress: list[int] = []
    scan.release_all(sqs, on_progress=progress.append)
    # Each batch of 10 handles is released as soon as it is read: the spool is never loaded
    # whole, so memory stays flat however many messages the scan held.
    assert calls == [(10, 0, 10), (10, 0, 20), (10, 0, 30), (5, 0, 35)]
    assert progress == [10, 20, 30, 35]
    assert family.depth() == (35, 0)


# -- several workers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def serial_moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """A moto server on 127.0.0.1 that serves one request at a time: in-process moto (and
    its threaded server) can fail concurrent ReceiveMessage calls on one queue with
    "Set changed size during iteration"."""
    server = start_moto_server(tmp_path_factory.mktemp("moto") / "serial.log", serial=True)
    yield server
    server.process.terminate()
    server.process.wait(10)


@pytest.mark.e2e
def test_three_workers_share_one_scan(new_scan: NewScan, serial_moto: MotoServer) -> None:
    serial_moto.reset()
    family = make_family(serial_moto.client())
    sent = send(family, 150)
    first = SqsBroker(family.client)
    made: list[SqsBroker] = []

    def factory() -> SqsBroker:
        made.append(SqsBroker(serial_moto.client()))
        return made[-1]

    scan = new_scan(family.dlq_url, lease=120)
    lock = threading.Lock()
    ids: list[str] = []
    clients: list[SqsBroker] = []

    def work(sqs: SqsBroker) -> None:
        with lock:
            clients.append(sqs)
        while (batch := scan.next_batch(sqs)) is not None:
            with lock:
                ids.extend(m.message_id for m in batch)
            scan.keep(sqs, batch)

    run_pipelines(work, first, factory, 3, scan.stop)
    # Each worker has its own client; the first one is the caller's.
    assert len(made) == 2
    assert {id(c) for c in clients} == {id(first), *(id(c) for c in made)}
    assert sorted(ids) == sorted(sent)
    assert scan.stats.received == 150
    assert not scan.stop.is_set()
    scan.release_all(first)
    assert family.depth() == (150, 0)


def test_one_worker_runs_in_the_calling_thread() -> None:
    threads: list[threading.Thread] = []
    first = object()

    def work(sqs: Any) -> None:
        assert sqs is first
        threads.append(threading.current_thread())

    def factory() -> Any:
        raise AssertionError("a single worker needs no second client")

    run_pipelines(work, first, factory, 1, threading.Event())  # type: ignore[arg-type]
    assert threads == [threading.current_thread()]


def test_first_error_stops_the_others_and_is_raised() -> None:
    stop = threading.Event()
    started = threading.Barrier(3)
    clients = iter(["b", "c"])

    def work(sqs: Any) -> None:
        started.wait(60)
        if sqs == "b":
            raise ValueError("worker b failed")
        # The others run until the failure stops them.
        assert stop.wait(60), "stop was never set"

    with pytest.raises(ValueError, match="worker b failed"):
        run_pipelines(work, "a", lambda: next(clients), 3, stop)  # type: ignore[arg-type]
    assert stop.is_set()


def test_the_error_that_came_first_is_the_one_raised() -> None:
    # The failure that stopped the run explains it; what the others raised while stopping
    # is a consequence, whichever worker they ran in.
    stop = threading.Event()
    clients = iter(["b", "c"])

    def work(sqs: Any) -> None:
        if sqs == "c":
            raise ValueError("the cause")
        assert stop.wait(60)
        raise RuntimeError(f"worker {sqs} gave up after the stop")

    with pytest.raises(ValueError, match="the cause"):
        run_pipelines(work, "a", lambda: next(clients), 3, stop)  # type: ignore[arg-type]
    assert stop.is_set()


def test_single_worker_error_sets_stop() -> None:
    stop = threading.Event()

    def work(sqs: Any) -> None:
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        run_pipelines(work, object(), object, 1, stop)  # type: ignore[arg-type]
    assert stop.is_set()


def test_deleted_messages_are_forgotten_so_memory_follows_what_is_held(
    new_scan: NewScan, family: QueueFamily
) -> None:
    # A move or purge deletes most of what it receives: remembering only what it holds keeps
    # the seen set bounded by SQS's in-flight quota, not by the queue's size.
    send(family, 30)
    sqs = SqsBroker(family.client)
    scan = new_scan(family.dlq_url, lease=60)
    deleted = kept = 0
    while (batch := scan.next_batch(sqs)) is not None:
        gone, held = batch[:7], batch[7:]
        result = sqs.delete_batch(family.dlq_url, {str(i): m.tag for i, m in enumerate(gone)})
        assert len(result.ok) == len(gone)
        scan.forget(gone)
        scan.keep(sqs, held)
        deleted, kept = deleted + len(gone), kept + len(held)
    assert (deleted, kept) == (21, 9)
    assert len(scan._seen) == kept  # only what is held is remembered
    assert scan.stats.received == 30
    scan.release_all(sqs)
    assert family.depth() == (9, 0)


# -- sorting a receive (a pure decision) -----------------------------------------------------


def received(*ids: str) -> tuple[list[Delivery], list[int]]:
    messages = [sqs_message(i, f"handle-{i}", "{}", {}, {}) for i in ids]
    return messages, [digest(i) for i in ids]


def ids_of(messages: list[Delivery]) -> list[str]:
    return [m.message_id for m in messages]


def test_a_receive_sorts_into_fresh_stale_and_deleted_again() -> None:
    messages, digests = received("new", "seen", "gone", "new-2")
    batch = sort_received(
        messages, digests, seen={digest("seen")}, deleted={digest("gone")}, room=None
    )
    assert (ids_of(batch.fresh), ids_of(batch.stale), ids_of(batch.again)) == (
        ["new", "new-2"],
        ["seen"],
        ["gone"],
    )
    assert batch.first_seen == [digest("new"), digest("new-2")]


def test_a_message_twice_in_one_receive_is_fresh_once() -> None:
    messages, digests = received("m", "m")
    batch = sort_received(messages, digests, seen=set(), deleted=set(), room=None)
    assert (ids_of(batch.fresh), ids_of(batch.stale)) == (["m"], ["m"])
    assert batch.first_seen == [digest("m")]


@pytest.mark.parametrize(
    ("room", "fresh"), [(2, ["a", "b"]), (0, []), (-3, []), (9, ["a", "b", "c"])]
)
def test_what_the_limit_leaves_no_room_for_is_held_again_yet_seen(
    room: int, fresh: list[str]
) -> None:
    messages, digests = received("a", "b", "c")
    batch = sort_received(messages, digests, seen=set(), deleted=set(), room=room)
    assert ids_of(batch.fresh) == fresh
    assert ids_of(batch.stale) == [i for i in ("a", "b", "c") if i not in fresh]
    assert batch.first_seen == digests  # over the limit, yet seen: not handed out later
