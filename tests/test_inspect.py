"""Tests for redrive.inspection: group a DLQ by Celery task without disturbing it (moto)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import Family as QueueFamily
from conftest import make_family, start_moto_server

from redrive import attributes
from redrive.broker import resolve_target
from redrive.broker.base import Delivery, DlqTarget
from redrive.broker.sqs import SqsBroker
from redrive.config import built_in_layout
from redrive.dlq.receive_log import ReceiveLog
from redrive.errors import AwsError
from redrive.inspection.groups import DAY, Grouping
from redrive.inspection.scan import InspectResult, inspect_dlq
from redrive.messages import UNKNOWN_TASK, decode
from redrive.sandbox import dead_letter
from redrive.sandbox.encoder import encode

CHECKOUT = "apps.webhooks.tasks.save_checkout_ibft"
EMAIL = "apps.notifications.tasks.send_email"
PROGRESS = "apps.engagements.tasks.save_progress_lesson"
ODD_BODIES = ["plain text, not Celery", json.dumps({"hello": "world"}), "eyJub3QiOiAiYSB0YXNrIn0="]


@pytest.fixture
def target(family: QueueFamily) -> DlqTarget:
    return resolve_target(built_in_layout({}), "checkout", lambda region: SqsBroker(family.client))


@pytest.fixture
def factory(family: QueueFamily) -> Callable[[], SqsBroker]:
    return lambda: SqsBroker(family.client)


def redriven(count: int) -> dict[str, Any]:
    return {attributes.COUNT: {"DataType": "Number", "StringValue": str(count)}}


def by_task(result: InspectResult) -> dict[str, dict[str, Any]]:
    return {g["task"]: g for g in result.to_json()["groups"]}


def comparable(result: InspectResult) -> dict[str, Any]:
    """The JSON of an inspect, without what changes from one run to the next by nature."""
    data = result.to_json()
    for key in ("seconds", "scanned_at", "oldest_age_seconds"):
        data.pop(key)
    for group in data["groups"]:
        # SQS counts every receive, this scan's too (and redrive counts its own).
        group.pop("max_receive_count")
        group.pop("max_redrive_receives")
    return data


# -- grouping --------------------------------------------------------------------------


def test_groups_protocol_1_and_2_samples_and_odd_bodies(
    family: QueueFamily,
    target: DlqTarget,
    factory: Callable[[], SqsBroker],
    samples: list[dict[str, Any]],
) -> None:
    for sample in samples:
        family.send_to_dlq(sample["Body"])
    for body in ODD_BODIES:
        family.send_to_dlq(body)
    result = inspect_dlq(target, factory)
    assert result.total == len(samples) + len(ODD_BODIES) == 11
    # Largest group first, ties by name.
    assert [(g.task, g.count) for g in result.groups] == [
        (UNKNOWN_TASK, 3),
        (PROGRESS, 3),
        (CHECKOUT, 3),
        (EMAIL, 2),
    ]
    groups = {g.task: g for g in result.groups}
    assert groups[CHECKOUT].count == 3
    assert dict(groups[CHECKOUT].protocols) == {"2": 2, "1": 1}
    assert dict(groups[EMAIL].protocols) == {"2": 1, "1": 1}
    assert dict(groups[PROGRESS].protocols) == {"2": 2, "1": 1}
    assert groups[UNKNOWN_TASK].count == 3
    assert sum(groups[UNKNOWN_TASK].notes.values()) == 3
    assert groups[UNKNOWN_TASK].sample_task_ids == []
    assert family.depth() == (11, 0)


def test_counts_times_and_sample_ids(
    family: QueueFamily, target: DlqTarget, factory: Callable[[], SqsBroker]
) -> None:
    before = time.time()
    task_ids = [f"task-{i}" for i in range(5)]
    message_ids = [
        family.send_to_dlq(encode(EMAIL, [i], task_id=t)) for i, t in enumerate(task_ids)
    ]
    after = time.time()
    result = inspect_dlq(target, factory)
    (group,) = result.groups
    assert group.task == EMAIL and group.count == 5
    assert group.oldest is not None and group.newest is not None
    assert before - 1 <= group.oldest <= group.newest <= after + 1
    assert result.oldest == group.oldest
    # A few samples per task, never every message.
    assert len(group.sample_message_ids) == len(group.sample_task_ids) == 3
    assert set(group.sample_message_ids) <= set(message_ids)
    assert set(group.sample_task_ids) <= set(task_ids)
    assert result.depth_before == 5 and result.hidden_before == 0
    assert result.released == 5 and result.seen_again == 0
    assert result.label == "checkout"
    assert result.dlq == "onion-checkout-dlq"
    assert result.dlq_url == family.dlq_url
    assert result.sources == ["onion-checkout"]
    assert not result.partial and not result.interrupted and not result.fifo


def test_max_receive_count_of_dead_lettered_messages(
    family: QueueFamily, target: DlqTarget, factory: Callable[[], SqsBroker]
) -> None:
    family.client.send_message(QueueUrl=family.queue_url, MessageBody=encode(CHECKOUT, [1]))
    # A consumer that fails it five times (maxReceiveCount 5): SQS moves it to the DLQ.
    for _ in range(6):
        family.client.receive_message(QueueUrl=family.queue_url, VisibilityTimeout=0)
    assert family.depth() == (1, 0)
    (group,) = inspect_dlq(target, factory).groups
    # SQS keeps the count through dead-lettering, and counts the inspect's receive too.
    assert group.max_receive_count >= 5


def test_expired(family: QueueFamily, target: DlqTarget, factory: Callable[[], SqsBroker]) -> None:
    now = datetime.now(UTC)
    family.send_to_dlq(encode(CHECKOUT, [1], expires=now - timedelta(hours=1)))
    family.send_to_dlq(encode(CHECKOUT, [2], protocol=1, expires=now - timedelta(minutes=1)))
    family.send_to_dlq(encode(CHECKOUT, [3], expires=now + timedelta(days=1)))
    family.send_to_dlq(encode(CHECKOUT, [4]))
    result = inspect_dlq(target, factory)
    assert result.groups[0].expired == 2
    assert result.expired == 2
    # Seen from two days later, the one that expires tomorrow has expired too.
    later = inspect_dlq(target, factory, now=time.time() + 2 * DAY)
    assert later.expired == 3


def test_redriven_and_poison(
    family: QueueFamily, target: DlqTarget, factory: Callable[[], SqsBroker]
) -> None:
    family.send_to_dlq(encode(CHECKOUT, [1]))
    family.send_to_dlq(encode(CHECKOUT, [2]), redriven(1))
    family.send_to_dlq(encode(CHECKOUT, [3]), redriven(2))
    family.send_to_dlq(encode(CHECKOUT, [4]), redriven(3))
    family.send_to_dlq(encode(CHECKOUT, [5]), redriven(7))
    result = inspect_dlq(target, factory)
    (group,) = result.groups
    assert group.redriven == 4
    assert group.poison == 2  # redriven 3 times (the default cap) or more
    assert result.poison == 2
    lenient = inspect_dlq(target, factory, max_redrives=5)
    assert lenient.poison == 1


def test_leaving_within_24h(
    family: QueueFamily, target: DlqTarget, factory: Callable[[], SqsBroker]
) -> None:
    for i in range(4):
        family.send_to_dlq(encode(PROGRESS, [i]))
    assert target.dlq.retention_seconds == 14 * DAY
    assert inspect_dlq(target, factory).leaving_within_24h == 0
    # 13.5 days on, SQS deletes them all within the next 24 hours.
    soon = inspect_dlq(target, factory, now=time.time() + 13.5 * DAY)
    assert soon.leaving_within_24h == 4
    assert soon.groups[0].leaving_within_24h == 4
    assert inspect_dlq(target, factory, now=time.time() + 12.5 * DAY).leaving_within_24h == 0


def test_args_only_when_asked(
    family: QueueFamily,
    target: DlqTarget,
    factory: Callable[[], SqsBroker],
    samples: list[dict[str, Any]],
) -> None:
    for sample in samples:
        family.send_to_dlq(sample["Body"])
    plain = json.dumps(inspect_dlq(target, factory).to_json())
    assert "sample_args" not in plain
    assert "ana@example.com" not in plain
    assert "les-9" not in plain
    shown = inspect_dlq(target, factory, show_args=True)
    email = by_task(shown)[EMAIL]
    # Protocol 2 keeps Celery's argsrepr; protocol 1 args are shown the same short way.
    assert {a["args"] for a in email["sample_args"]} == {
        "('ana@example.com', 'welcome')",
        "['ana@example.com', 'welcome']",
    }
    assert all("Ana" in (a["kwargs"] or "") for a in email["sample_args"])
    assert all(set(a) == {"args", "kwargs"} for a in email["sample_args"])
    assert len(email["sample_args"]) == 2


def test_show_args_shows_the_start_of_a_body_that_is_not_a_celery_task(
    family: QueueFamily, target: DlqTarget, factory: Callable[[], SqsBroker]
) -> None:
    from redrive.inspection.groups import SHOWN_BODY_CHARS
    from redrive.render.inspect import inspect_text

    # A terminal escape and a newline in it, and longer than what is shown.
    long_text = "legacy cron 4242:\x1b[31m resync\n" + "x" * 1000
    for text in (long_text, *ODD_BODIES[:2]):
        family.send_to_dlq(text)

    shown = inspect_dlq(target, factory, show_args=True)

    samples = {s["body_chars"]: s for s in by_task(shown)[UNKNOWN_TASK]["sample_args"]}
    assert set(samples) == {len(long_text), *(len(b) for b in ODD_BODIES[:2])}
    assert all(s["args"] is None and s["kwargs"] is None for s in samples.values())
    assert samples[len(long_text)]["body"] == long_text[:SHOWN_BODY_CHARS] + "..."
    assert samples[len(ODD_BODIES[0])]["body"] == ODD_BODIES[0]
    text = inspect_text(shown)
    assert "args=None kwargs=None" not in text
    assert "  body (22 characters): plain text, not Celery" in text
    assert "  body (1030 characters): legacy cron 4242:\\x1b[31m resync\\nxxx" in text
    assert "\x1b" not in text  # escaped, never sent to the terminal


# -- leaving the DLQ as it was ---------------------------------------------------------


def test_inspect_twice_gives_the_same_result_and_leaves_the_depth(
    family: QueueFamily,
    target: DlqTarget,
    factory: Callable[[], SqsBroker],
    samples: list[dict[str, Any]],
    tmp_path: Path,
) -> None:
    for sample in samples:
        family.send_to_dlq(sample["Body"])
    for i in range(25):
        family.send_to_dlq(encode(EMAIL, [i]), redriven(i % 4))
    total = len(samples) + 25
    now = time.time()
    log = ReceiveLog(tmp_path / "receives.sqlite3")
    first = inspect_dlq(target, factory, now=now, receive_log=log)
    assert family.depth() == (total, 0)
    second = inspect_dlq(target, factory, now=now, receive_log=log)
    assert family.depth() == (total, 0)
    assert first.total == second.total == total
    assert comparable(first) == comparable(second)
    # SQS counts each receive: the second inspect sees one more on every message.
    firsts = {g.task: g.max_receive_count for g in first.groups}
    assert {g.task: g.max_receive_count - 1 for g in second.groups} == firsts


def test_receive_counts_shown_are_the_consumers_not_redrive_s_own_reads(
    family: QueueFamily, target: DlqTarget, factory: Callable[[], SqsBroker], tmp_path: Path
) -> None:
    """Each inspect receives each message once more, which raises SQS's count: a dozen
    scans took a DLQ's "max receives" from 6 to 20. The count shown leaves redrive's own
    receives out, scan after scan and process after process (the log is a file)."""
    dead_letter(family.client, family.queue_url, [(encode(EMAIL, [i]), {}) for i in range(12)])
    path = tmp_path / "state" / "receives.sqlite3"
    for scan in range(1, 13):
        with ReceiveLog(path) as log:  # a new process each time
            result = inspect_dlq(target, factory, receive_log=log, workers=1 + scan % 2)
        [group] = result.groups
        # moto, like SQS, dead-letters a message after maxReceiveCount (5) receives.
        assert group.max_consumer_receives == 5, scan
        assert group.max_redrive_receives == scan
        assert group.max_receive_count == 5 + scan
    data = result.to_json()["groups"][0]
    assert (data["max_receive_count"], data["max_consumer_receives"]) == (17, 5)
    assert data["max_redrive_receives"] == 12
    assert result.receive_log_problem is None
    # Without the log, the count is SQS's own, redrive's receives included.
    unlogged = inspect_dlq(target, factory)
    assert unlogged.groups[0].max_consumer_receives == 5 + 13


def test_empty_dlq(
    family: QueueFamily, target: DlqTarget, factory: Callable[[], SqsBroker]
) -> None:
    result = inspect_dlq(target, factory)
    assert result.total == 0
    assert result.groups == []
    assert result.oldest is None
    data = result.to_json()
    assert data["total"] == 0 and data["groups"] == []
    assert data["oldest"] is None and data["oldest_age_seconds"] is None


def test_limit_is_partial_and_releases(
    family: QueueFamily, target: DlqTarget, factory: Callable[[], SqsBroker]
) -> None:
    for i in range(25):
        family.send_to_dlq(encode(CHECKOUT, [i]))
    progress: list[int] = []
    result = inspect_dlq(target, factory, limit=15, on_progress=progress.append)
    assert result.total == 15
    assert result.partial
    assert progress == [10, 15]
    assert family.depth() == (25, 0)


def test_interrupted_by_the_stop_event_releases_everything(
    family: QueueFamily, target: DlqTarget, factory: Callable[[], SqsBroker]
) -> None:
    for i in range(25):
        family.send_to_dlq(encode(CHECKOUT, [i]))
    stop = threading.Event()
    result = inspect_dlq(target, factory, stop=stop, on_progress=lambda n: stop.set())
    assert result.interrupted
    assert result.total == 10  # the batch in hand is still counted
    assert not result.partial
    assert result.released == 10
    assert family.depth() == (25, 0)


def test_stopped_before_it_starts(
    family: QueueFamily, target: DlqTarget, factory: Callable[[], SqsBroker]
) -> None:
    family.send_to_dlq(encode(CHECKOUT, [1]))
    stop = threading.Event()
    stop.set()
    result = inspect_dlq(target, factory, stop=stop)
    assert result.interrupted and result.total == 0
    assert family.depth() == (1, 0)


class FailingReceives(SqsBroker):
    """Receives work twice, then the network goes."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.receives = 0

    def receive(self, url: str, **kwargs: Any) -> list[Delivery]:
        self.receives += 1
        if self.receives > 2:
            raise AwsError("ReceiveMessage failed: InternalError")
        return super().receive(url, **kwargs)


def test_an_error_mid_scan_still_releases_what_was_received(
    family: QueueFamily, target: DlqTarget
) -> None:
    for i in range(30):
        family.send_to_dlq(encode(CHECKOUT, [i]))
    with pytest.raises(AwsError, match="InternalError"):
        inspect_dlq(target, lambda: FailingReceives(family.client))
    assert family.depth() == (30, 0)


def test_a_failure_while_counting_a_batch_still_releases_that_batch(
    family: QueueFamily, target: DlqTarget, factory: Callable[[], SqsBroker], monkeypatch: Any
) -> None:
    # Ctrl-C a second time (KeyboardInterrupt) or a bug while a batch is in hand: the batch
    # was received, so it is hidden for the whole lease unless it is given back too.
    for i in range(30):
        family.send_to_dlq(encode(CHECKOUT, [i]))
    real_add = Grouping.add
    calls = 0

    def add_then_fail(self: Grouping, *args: Any, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 15:
            raise KeyboardInterrupt
        real_add(self, *args, **kwargs)

    monkeypatch.setattr(Grouping, "add", add_then_fail)
    with pytest.raises(KeyboardInterrupt):
        inspect_dlq(target, factory)
    assert family.depth() == (30, 0)


@pytest.mark.e2e
def test_several_workers(tmp_path: Path) -> None:
    # In-process moto is not safe for concurrent receives on one queue: a server on
    # 127.0.0.1 that serves one request at a time.
    server = start_moto_server(tmp_path / "serial.log", serial=True)
    try:
        family = make_family(server.client())
        for i in range(60):
            family.send_to_dlq(encode(CHECKOUT if i % 3 else EMAIL, [i]))
        target = resolve_target(
            built_in_layout({}), "checkout", lambda r: SqsBroker(server.client())
        )
        result = inspect_dlq(target, lambda: SqsBroker(server.client()), workers=3)
        assert result.total == 60
        assert {g.task: g.count for g in result.groups} == {CHECKOUT: 40, EMAIL: 20}
        assert result.seen_again == 0
        assert family.depth() == (60, 0)
    finally:
        server.process.terminate()
        server.process.wait(10)


# -- JSON ------------------------------------------------------------------------------


def test_json_shape(
    family: QueueFamily,
    target: DlqTarget,
    factory: Callable[[], SqsBroker],
    samples: list[dict[str, Any]],
) -> None:
    for sample in samples:
        family.send_to_dlq(sample["Body"])
    family.send_to_dlq("not celery")
    data = json.loads(json.dumps(inspect_dlq(target, factory).to_json()))
    assert data["total"] == 9
    assert isinstance(data["groups"], list)
    assert sum(g["count"] for g in data["groups"]) == 9
    for group in data["groups"]:
        assert isinstance(group["task"], str)
        assert isinstance(group["count"], int)
        assert {
            "oldest",
            "newest",
            "max_receive_count",
            "expired",
            "redriven",
            "poison",
            "leaving_within_24h",
            "sample_task_ids",
            "sample_message_ids",
            "protocols",
        } <= set(group)
        assert group["oldest"].endswith("Z")
        # SQS says nothing of why a message died: no death keys (RabbitMQ's are tested in
        # tests/test_rabbitmq_death_reasons.py).
        assert not {"death_reasons", "died_in", "died_oldest", "died_newest"} & set(group)
    assert data["target"] == "checkout"
    assert data["dlq"] == "onion-checkout-dlq"
    assert data["sources"] == ["onion-checkout"]
    assert data["partial"] is False and data["interrupted"] is False
    assert data["depth_before"] == 9
    unknown = next(g for g in data["groups"] if g["task"] == UNKNOWN_TASK)
    assert "notes" in unknown


# -- Grouping on its own (shared with archive inspect) ---------------------------------

NOW = 1_800_000_000.0


def add(grouping: Grouping, body: str, **kwargs: Any) -> None:
    values: dict[str, Any] = {
        "message_id": "m",
        "sent_at": NOW - 60,
        "receive_count": 1,
        "redrive_count": 0,
    }
    values.update(kwargs)
    grouping.add(decode(body), **values)


def test_grouping_times_and_receive_counts() -> None:
    grouping = Grouping(now=NOW)
    add(grouping, encode(CHECKOUT, [1]), sent_at=NOW - 300, receive_count=6)
    add(grouping, encode(CHECKOUT, [2]), sent_at=NOW - 100, receive_count=2)
    add(grouping, encode(CHECKOUT, [3]), sent_at=None, receive_count=9)
    (group,) = grouping.sorted_groups()
    assert group.count == 3
    assert (group.oldest, group.newest) == (NOW - 300, NOW - 100)
    assert group.max_receive_count == 9
    assert grouping.oldest == NOW - 300
    assert grouping.total == 3


def test_grouping_without_timestamps() -> None:
    grouping = Grouping(now=NOW, retention_seconds=60)
    add(grouping, encode(CHECKOUT, [1]), sent_at=None)
    (group,) = grouping.sorted_groups()
    assert group.oldest is None and grouping.oldest is None
    assert group.leaving_within_24h == 0
    assert group.to_json()["oldest"] is None


def test_grouping_leaving_boundary() -> None:
    retention = 4 * DAY
    grouping = Grouping(now=NOW, retention_seconds=retention)
    add(grouping, encode(CHECKOUT, [1]), sent_at=NOW - retention + DAY)  # exactly 24 h left
    add(grouping, encode(CHECKOUT, [2]), sent_at=NOW - retention + DAY - 1)
    add(grouping, encode(CHECKOUT, [3]), sent_at=NOW)
    assert grouping.sorted_groups()[0].leaving_within_24h == 1
    unknown_retention = Grouping(now=NOW)
    add(unknown_retention, encode(CHECKOUT, [1]), sent_at=NOW - 100 * DAY)
    assert unknown_retention.sorted_groups()[0].leaving_within_24h == 0


def test_grouping_samples_are_capped_per_task() -> None:
    grouping = Grouping(now=NOW, show_args=True)
    for i in range(10):
        add(grouping, encode(EMAIL, [i], task_id=f"t{i}"), message_id=f"m{i}")
    (group,) = grouping.sorted_groups()
    assert group.count == 10
    assert group.sample_message_ids == ["m0", "m1", "m2"]
    assert group.sample_task_ids == ["t0", "t1", "t2"]
    assert group.sample_args == [{"args": f"({i},)", "kwargs": "{}"} for i in range(3)]


def test_grouping_order_ties_by_name() -> None:
    grouping = Grouping(now=NOW)
    for task in ("b.task", "a.task", "c.task", "c.task"):
        add(grouping, encode(task))
    assert [g.task for g in grouping.sorted_groups()] == ["c.task", "a.task", "b.task"]


def test_a_scan_that_saw_fewer_than_sqs_counted_says_so() -> None:
    """Held messages that came back before the end, or SQS's in-flight quota, can hide
    messages from a scan: the result must say so, never pass for the whole DLQ."""
    from redrive.inspection.scan import InspectResult
    from redrive.render.inspect import inspect_text

    def result(**kw: object) -> InspectResult:
        base: dict[str, object] = dict(
            label="checkout",
            dlq="onion-checkout-dlq",
            dlq_url="u",
            sources=[],
            total=1927,
            groups=[],
            oldest=None,
            scanned_at=0.0,
            seconds=1.0,
            depth_before=2000,
            hidden_before=0,
            partial=False,
        )
        base.update(kw)
        return InspectResult(**base)  # type: ignore[arg-type]

    short = result()
    assert short.incomplete and short.to_json()["incomplete"] is True
    assert "counted 1927 message(s) but SQS counted 2000" in inspect_text(short)
    assert not result(total=2000).incomplete
    assert not result(partial=True).incomplete
    assert not result(interrupted=True).incomplete
