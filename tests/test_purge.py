"""Purge and archive: a message leaves the DLQ only after its archive record is durable.

The core (``purge_dlq``) is driven directly with in-process moto, crashes are injected
through its ``fault`` hook and through failing writers; the commands (``purge``,
``archive``) are run through click's CliRunner.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from conftest import REGION, Cli, Family, ParkOneWorker, Redelivery, SqsClock, make_family

import redrive.archive.writer as archive_writer
from redrive.archive import ArchiveRecord, ArchiveWriter, open_writer, read_records
from redrive.broker import resolve_target
from redrive.broker.base import BatchResult, Delivery, DlqTarget, QueueRef
from redrive.broker.sqs import SqsBroker
from redrive.config import load_layout
from redrive.errors import ArchiveError, AwsError
from redrive.operations.purge import (
    S3_BUFFER,
    PurgeOptions,
    PurgeResult,
    purge_dlq,
    purge_whole_queue,
)
from redrive.runs.observer import Callbacks
from redrive.sandbox.encoder import encode
from redrive.selection import Selection

REFUND = "apps.payments.tasks.refund"
RECEIPT = "apps.emails.tasks.send_receipt"
PROGRESS = "apps.engagements.tasks.save_progress"
SQS_MAX_BYTES = 262_144


class Crash(BaseException):
    """A simulated SIGKILL: not an Exception, so the run's own error handling skips it."""


# -- helpers ------------------------------------------------------------------------------


def checkout(client: Any) -> DlqTarget:
    return resolve_target(load_layout(None), "checkout", lambda region: SqsBroker(client))


def seed(family: Family, plan: Sequence[tuple[str, int]]) -> dict[str, dict[str, Any]]:
    """Interleaved Celery tasks in the DLQ; returns MessageId -> what was sent."""
    sent: dict[str, dict[str, Any]] = {}
    queue = [(task, i) for task, count in plan for i in range(count)]
    # Interleave so every receive mixes tasks, as a real DLQ does.
    queue.sort(key=lambda item: (item[1], item[0]))
    for task, i in queue:
        task_id = f"{task.rsplit('.', 1)[-1]}-{i:04d}"
        body = encode(task, [i], {"note": f"olá {i} ✓"}, task_id=task_id)
        attributes = {
            "trace-id": {"DataType": "String", "StringValue": f"trace-{i}-ü"},
            "blob": {"DataType": "Binary", "BinaryValue": bytes([i % 256, 0, 255])},
        }
        message_id = family.send_to_dlq(body, attributes)
        sent[message_id] = {
            "task": task,
            "task_id": task_id,
            "body": body,
            "attributes": attributes,
        }
    return sent


def of_task(sent: Mapping[str, Mapping[str, Any]], task: str) -> set[str]:
    return {mid for mid, m in sent.items() if m["task"] == task}


def archived(source: str, **kw: Any) -> tuple[list[ArchiveRecord], list[str]]:
    problems: list[str] = []
    return list(read_records(source, on_problem=problems.append, **kw)), problems


def peek(client: Any, url: str) -> dict[str, dict[str, Any]]:
    """Every visible message of a queue, made visible again afterwards (SQS has no peek)."""
    seen: dict[str, dict[str, Any]] = {}
    handles: list[str] = []
    while True:
        messages = client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=60,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        ).get("Messages", [])
        if not messages:
            break
        for message in messages:
            seen[message["MessageId"]] = message
            handles.append(message["ReceiptHandle"])
    for start in range(0, len(handles), 10):
        client.change_message_visibility_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0}
                for i, h in enumerate(handles[start : start + 10])
            ],
        )
    return seen


def run_purge(
    client: Any,
    writer: ArchiveWriter | None,
    *,
    tasks: Sequence[str] = (),
    fault: Callable[[str], None] | None = None,
    broker_factory: Callable[[], SqsBroker] | None = None,
    target: DlqTarget | None = None,
    **options: Any,
) -> PurgeResult:
    options.setdefault("execute", True)
    return purge_dlq(
        target or checkout(client),
        PurgeOptions(selection=Selection(tasks=tuple(tasks)), **options),
        broker_factory=broker_factory or (lambda: SqsBroker(client)),
        writer=writer,
        observer=Callbacks(on_step=fault),
    )


def json_of(result: Any) -> dict[str, Any]:
    assert result.exit_code in (0, 3), (result.exit_code, result.output)
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def crash_at(step: str, nth: int) -> Callable[[str], None]:
    calls: Counter[str] = Counter()

    def hook(name: str) -> None:
        calls[name] += 1
        if name == step and calls[name] == nth:
            raise Crash(f"killed after {step} #{nth}")

    return hook


class RecordingSqs(SqsBroker):
    """Remembers which message every receipt handle belongs to."""

    def __init__(self, client: Any, log: list[tuple[str, Any]] | None = None) -> None:
        super().__init__(client)
        self.handles: dict[str, str] = {}
        self.log = log if log is not None else []

    def receive(self, url: str, **kwargs: Any) -> list[Delivery]:
        messages = super().receive(url, **kwargs)
        for message in messages:
            self.handles[message.tag] = message.message_id
        return messages

    def delete_batch(self, url: str, handles: Mapping[str, str]) -> BatchResult:
        self.log.append(("delete", {self.handles[h] for h in handles.values()}))
        return super().delete_batch(url, handles)


# -- purge --task X --execute -------------------------------------------------------------


def test_purge_task_takes_exactly_that_task_and_leaves_the_rest_visible(
    family: Family, tmp_path: Path
) -> None:
    sent = seed(family, [(REFUND, 12), (RECEIPT, 9), (PROGRESS, 6)])
    family.send_to_dlq("not a celery message at all")
    path = str(tmp_path / "refund.jsonl.gz")
    started = time.time()
    with open_writer(path) as writer:
        result = run_purge(family.client, writer, tasks=[REFUND])

    assert (result.matched, result.archived, result.purged, result.failed) == (12, 12, 12, 0)
    assert result.by_task == Counter({REFUND: 12})
    assert not result.dry_run and result.method == "delete" and result.command == "purge"
    assert result.scanned == 28 and result.still_hidden == 0

    # The others are back, visible, untouched.
    assert family.depth() == (16, 0)
    left = peek(family.client, family.dlq_url)
    others = of_task(sent, RECEIPT) | of_task(sent, PROGRESS)
    assert set(left) - set(sent) != set() and set(left) & set(sent) == others
    assert len(set(left) - set(sent)) == 1  # the non-Celery body stays too
    for mid in of_task(sent, RECEIPT) | of_task(sent, PROGRESS):
        assert left[mid]["Body"] == sent[mid]["body"]
        assert left[mid]["MessageAttributes"] == sent[mid]["attributes"]

    records, problems = archived(path)
    assert problems == []
    assert {r.message_id for r in records} == of_task(sent, REFUND)
    for record in records:
        original = sent[record.message_id]
        assert record.body == original["body"]
        assert record.message_attributes == original["attributes"]
        assert record.task == REFUND
        assert record.task_id == original["task_id"]
        assert record.dlq == family.dlq_url
        assert record.run_id == result.run_id and result.run_id
        assert started - 1 <= record.archived_at.timestamp() <= time.time() + 1
        assert record.attributes["ApproximateReceiveCount"] == "1"
        sent_at = int(record.attributes["SentTimestamp"]) / 1000
        assert started - 5 <= sent_at <= time.time() + 1
        # System attributes outside the archived set (SenderId...) stay out.
        assert "SenderId" not in record.attributes


def test_purge_limit_takes_at_most_n(family: Family, tmp_path: Path) -> None:
    sent = seed(family, [(REFUND, 15), (RECEIPT, 5)])
    path = str(tmp_path / "a.jsonl")
    with open_writer(path) as writer:
        result = purge_dlq(
            checkout(family.client),
            PurgeOptions(selection=Selection(tasks=(REFUND,), limit=4), execute=True),
            broker_factory=lambda: SqsBroker(family.client),
            writer=writer,
        )
    assert (result.matched, result.purged) == (4, 4)
    records, _ = archived(path)
    assert len(records) == 4 and {r.message_id for r in records} <= of_task(sent, REFUND)
    assert family.depth() == (16, 0)


def test_parallel_workers_share_one_archive_and_lose_nothing(
    family: Family, tmp_path: Path
) -> None:
    sent = seed(family, [(REFUND, 60), (RECEIPT, 20)])
    path = str(tmp_path / "a.jsonl.gz")
    with open_writer(path) as writer:
        result = run_purge(family.client, writer, tasks=[REFUND], workers=3)
    assert (result.archived, result.purged, result.failed) == (60, 60, 0)
    records, problems = archived(path)
    assert problems == []
    assert sorted(r.message_id for r in records) == sorted(of_task(sent, REFUND))
    assert set(peek(family.client, family.dlq_url)) == of_task(sent, RECEIPT)


def test_progress_never_shows_more_matched_than_scanned(family: Family, tmp_path: Path) -> None:
    """Issue 22: one worker's message matched while another worker reports its progress:
    the report counts that worker's batch as scanned too."""
    seed(family, [(RECEIPT, 30), (REFUND, 30)])
    watch = ParkOneWorker("plan", lambda r: (r.scanned, r.matched, r.archived, r.purged))
    with open_writer(str(tmp_path / "a.jsonl.gz")) as writer:
        result = purge_dlq(
            checkout(family.client),
            PurgeOptions(execute=True, workers=2, buffer=10),
            broker_factory=lambda: SqsBroker(family.client),
            writer=writer,
            observer=watch,
        )
    assert watch.heard_while_parked.is_set() and result.purged == 60
    for scanned, matched, archived, purged in watch.reports:
        assert purged <= archived <= matched <= scanned, watch.reports


def test_a_message_sqs_delivers_again_after_its_purge_is_neither_archived_nor_counted_twice(
    family: Family, tmp_path: Path
) -> None:
    """SQS delivers at least once: a message already archived and deleted may come again.
    It is the same message: deleted once more, not a second record nor a 61st purge."""
    sent = seed(family, [(REFUND, 60), (RECEIPT, 20)])
    redelivery = Redelivery(family.client)
    path = str(tmp_path / "a.jsonl.gz")
    with open_writer(path) as writer:
        result = run_purge(family.client, writer, tasks=[REFUND], broker_factory=redelivery.sqs)
    assert redelivery.delivered_again == 1
    assert (result.archived, result.purged, result.failed) == (60, 60, 0)
    assert result.redelivered == 1 and result.to_json()["redelivered"] == 1
    records, problems = archived(path)
    assert problems == []
    assert sorted(r.message_id for r in records) == sorted(of_task(sent, REFUND))
    assert set(peek(family.client, family.dlq_url)) == of_task(sent, RECEIPT)


# -- byte-identical archive ---------------------------------------------------------------


def awkward_messages() -> list[tuple[str, dict[str, Any]]]:
    """Bodies and attributes that break naive archivers."""
    text = 'ação ✓ 漢字 🎉 \u2028\u2029 "quoted" \\back\\ \t\r\n\ufffd'
    big_text = text + "é" * ((SQS_MAX_BYTES - len(text.encode()) - 40) // 2)
    assert SQS_MAX_BYTES - 60 < len(big_text.encode()) <= SQS_MAX_BYTES
    # A real Celery task whose base64 envelope ends up just under the limit.
    pad = (SQS_MAX_BYTES - 2_600) * 3 // 4 * 3 // 4
    big_task = encode(RECEIPT, ["p" * pad], task_id="big-task")
    assert SQS_MAX_BYTES - 3_000 < len(big_task.encode()) <= SQS_MAX_BYTES, len(big_task)
    many = {
        "raw": {"DataType": "Binary", "BinaryValue": bytes(range(256))},
        "zipped": {"DataType": "Binary.gzip", "BinaryValue": b"\x1f\x8b\x00\xff"},
        "kind": {"DataType": "String.custom", "StringValue": "ünï € 🎉"},
        "count": {"DataType": "Number.int", "StringValue": "0042"},
        "ratio": {"DataType": "Number", "StringValue": "1.50"},
        "empty-ish": {"DataType": "String", "StringValue": " "},
        "a6": {"DataType": "String", "StringValue": "6"},
        "a7": {"DataType": "String", "StringValue": "7"},
        "a8": {"DataType": "String", "StringValue": "8"},
        "a9": {"DataType": "String", "StringValue": "9"},
    }
    return [
        (encode(REFUND, [text], {"emoji": "🎉"}, task_id="tid-unicode"), many),
        (big_text, {}),
        (big_task, {"tiny": {"DataType": "Binary", "BinaryValue": b"\x00"}}),
        (encode(REFUND, [1], task_id="tid-plain", protocol=1), {}),
        (encode(PROGRESS, [2], task_id="tid-zipped", compression="zlib"), many),
    ]


def test_archive_holds_each_message_byte_identical(family: Family, tmp_path: Path) -> None:
    sent = {
        family.send_to_dlq(body, attributes): (body, attributes)
        for body, attributes in awkward_messages()
    }
    path = str(tmp_path / "awkward.jsonl.gz")
    with open_writer(path) as writer:
        result = run_purge(family.client, writer)
    assert result.purged == len(sent) and family.depth() == (0, 0)

    records, problems = archived(path)
    assert problems == []
    assert {r.message_id for r in records} == set(sent)
    for record in records:
        body, attributes = sent[record.message_id]
        assert record.body == body
        assert record.body.encode("utf-8") == body.encode("utf-8")
        assert record.message_attributes == attributes
    by_id = {r.message_id: r for r in records}
    tasks = sorted(by_id[mid].task for mid in sent)
    assert tasks == sorted(["(unknown)", REFUND, REFUND, RECEIPT, PROGRESS])
    # The file itself is plain gzip'd ASCII JSON, readable without redrive.
    raw = gzip.decompress(Path(path).read_bytes())
    assert raw.isascii()
    line = next(
        json.loads(x) for x in raw.splitlines() if json.loads(x)["task_id"] == "tid-unicode"
    )
    assert base64.b64decode(line["message_attributes"]["raw"]["BinaryValue_b64"]) == bytes(
        range(256)
    )


# -- kill it at any point -----------------------------------------------------------------


def assert_nothing_lost(
    client: Any,
    family: Family,
    sent: Mapping[str, Mapping[str, Any]],
    archive_sources: Sequence[str],
    *,
    s3: Any = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, ArchiveRecord]]:
    """Every original message is in the DLQ, in an archive, or both; never neither."""
    in_dlq = peek(client, family.dlq_url)
    in_archive: dict[str, ArchiveRecord] = {}
    for source in archive_sources:
        records, _ = archived(source, s3_client_factory=(lambda: s3) if s3 else None)
        for record in records:
            assert record.body == sent[record.message_id]["body"]
            assert record.message_attributes == sent[record.message_id]["attributes"]
            in_archive[record.message_id] = record
    for mid, message in in_dlq.items():
        assert message["Body"] == sent[mid]["body"]
    lost = set(sent) - set(in_dlq) - set(in_archive)
    assert not lost, f"{len(lost)} message(s) neither in the DLQ nor in the archive"
    assert set(in_dlq) <= set(sent) and set(in_archive) <= set(sent)
    return in_dlq, in_archive


KILL_POINTS = [
    ("received", 1),
    ("received", 3),
    ("archived", 1),
    ("archived", 2),
    ("deleted", 1),
    ("deleted", 2),
]


def test_killed_purge_loses_nothing_and_a_rerun_finishes(
    sqs_client: Any, tmp_path: Path, sqs_clock: SqsClock
) -> None:
    # One DLQ per kill point, so that a single wait for the dead runs' leases covers all.
    runs = []
    for n, (step, nth) in enumerate(KILL_POINTS):
        family = make_family(sqs_client, f"onion-kill-{n}")
        target = resolve_target(
            load_layout(None), f"onion-kill-{n}", lambda r: SqsBroker(sqs_client)
        )
        sent = seed(family, [(REFUND, 25), (RECEIPT, 10)])
        first = str(tmp_path / f"first-{n}.jsonl.gz")
        writer = open_writer(first)
        try:
            with pytest.raises(Crash):
                run_purge(
                    sqs_client,
                    writer,
                    target=target,
                    tasks=[REFUND],
                    lease=1,
                    fault=crash_at(step, nth),
                )
        finally:
            writer.close()
        runs.append((step, nth, family, target, sent, first))
    # What the dead runs held comes back when their short lease runs out: on SQS's clock,
    # wound past any hold they gave (a slow machine's renewals may give more than 1 s).
    sqs_clock.advance(1 + 120)

    for step, nth, family, target, sent, first in runs:
        where = f"killed after {step} #{nth}"
        in_dlq, in_archive = assert_nothing_lost(sqs_client, family, sent, [first])
        assert of_task(sent, RECEIPT) <= set(in_dlq), f"{where}: an unselected message left"
        assert set(in_archive) <= of_task(sent, REFUND), where
        if (step, nth) == ("received", 1):
            assert in_archive == {} and set(in_dlq) == set(sent), where
        if step == "deleted":
            assert set(in_dlq) != set(sent), f"{where}: the first batch should be gone"

        second = first.replace("first", "second")
        with open_writer(second) as writer:
            run_purge(sqs_client, writer, target=target, tasks=[REFUND])
        in_dlq, in_archive = assert_nothing_lost(sqs_client, family, sent, [first, second])
        assert set(in_dlq) == of_task(sent, RECEIPT), where
        assert set(in_archive) == of_task(sent, REFUND), where


@pytest.mark.parametrize("step", ["received", "archived", "deleted"])
def test_an_error_at_any_step_gives_back_everything_at_once(
    family: Family, tmp_path: Path, step: str
) -> None:
    sent = seed(family, [(REFUND, 25), (RECEIPT, 10)])

    def fail(name: str) -> None:
        if name == step:
            raise RuntimeError("boom")

    path = str(tmp_path / "a.jsonl.gz")
    with open_writer(path) as writer, pytest.raises(RuntimeError, match="boom"):
        run_purge(family.client, writer, tasks=[REFUND], fault=fail)
    # No waiting for leases: the run handed back what it held before re-raising.
    in_dlq, _ = assert_nothing_lost(family.client, family, sent, [path])
    assert family.depth() == (len(in_dlq), 0)
    assert of_task(sent, RECEIPT) <= set(in_dlq)


def test_a_write_that_fails_mid_way_deletes_nothing_of_that_batch(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqs_clock: SqsClock
) -> None:
    sent = seed(family, [(REFUND, 30), (RECEIPT, 5)])
    real_write_all = archive_writer._write_all
    writes = [0]

    def disk_fills_up(fd: int, data: bytes | bytearray) -> int:
        writes[0] += 1
        # Write 1 is the archive's header, written when it is opened; 2 the first batch.
        if writes[0] == 3:
            real_write_all(fd, bytes(data[: len(data) // 2]))
            raise OSError(28, "No space left on device")
        return real_write_all(fd, data)

    monkeypatch.setattr(archive_writer, "_write_all", disk_fills_up)
    path = str(tmp_path / "full.jsonl.gz")
    log: list[tuple[str, Any]] = []
    sqs = RecordingSqs(family.client, log)
    with open_writer(path) as writer, pytest.raises(ArchiveError, match="disk full"):
        run_purge(family.client, writer, tasks=[REFUND], broker_factory=lambda: sqs)

    records, problems = archived(path)
    # The half-written member was rolled back: the archive reads cleanly, and holds
    # exactly the first batch, the only one deleted.
    assert problems == []
    assert len(records) >= 10
    deleted = set().union(*(ids for _, ids in log))
    assert deleted == {r.message_id for r in records}
    in_dlq, _ = assert_nothing_lost(family.client, family, sent, [path])
    assert set(in_dlq) == set(sent) - deleted
    # Given back at once, the failed batch included.
    assert family.depth() == (len(sent) - len(deleted), 0)


def test_a_writer_killed_mid_write_leaves_a_readable_archive_and_the_batch_in_the_dlq(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqs_clock: SqsClock
) -> None:
    sent = seed(family, [(REFUND, 30), (RECEIPT, 5)])
    real_write_all = archive_writer._write_all
    writes = [0]

    def killed_mid_write(fd: int, data: bytes | bytearray) -> int:
        writes[0] += 1
        # Write 1 is the archive's header; the kill lands in the third batch.
        if writes[0] == 4:
            real_write_all(fd, bytes(data[: len(data) // 2]))
            raise Crash("SIGKILL while writing")
        return real_write_all(fd, data)

    monkeypatch.setattr(archive_writer, "_write_all", killed_mid_write)
    # A killed process does not get to truncate its half-written tail.
    monkeypatch.setattr(archive_writer.LocalArchiveWriter, "_roll_back", lambda self: None)
    path = str(tmp_path / "killed.jsonl.gz")
    writer = open_writer(path)
    try:
        with pytest.raises(Crash):
            run_purge(family.client, writer, tasks=[REFUND], lease=1)
    finally:
        writer.close()
    sqs_clock.advance(1 + 120)  # past the killed run's holds (see above)

    records, problems = archived(path)
    assert len(records) >= 20
    assert len(problems) == 1 and "incomplete gzip member" in problems[0]
    in_dlq, in_archive = assert_nothing_lost(family.client, family, sent, [path])
    # The two acknowledged batches were deleted; the one cut short never was.
    assert set(in_dlq) == set(sent) - set(in_archive)
    assert of_task(sent, REFUND) & set(in_dlq)


# -- durable before deleted ---------------------------------------------------------------


class LoggingWriter:
    """An archive writer that logs when each batch starts and when it returned."""

    def __init__(self, inner: ArchiveWriter, log: list[tuple[str, Any]]) -> None:
        self.inner = inner
        self.location = inner.location
        self.log = log

    def write_batch(self, records: Sequence[ArchiveRecord]) -> None:
        ids = {r.message_id for r in records}
        self.log.append(("write", ids))
        self.inner.write_batch(records)
        self.log.append(("written", ids))

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> LoggingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def test_local_archive_is_fsynced_before_any_of_its_messages_is_deleted(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = seed(family, [(REFUND, 35), (RECEIPT, 7)])
    log: list[tuple[str, Any]] = []
    real_fsync = os.fsync
    real_write_all = archive_writer._write_all

    def fsync(fd: int) -> None:
        real_fsync(fd)
        log.append(("fsync", fd))

    def write_all(fd: int, data: bytes | bytearray) -> int:
        log.append(("data", fd))
        return real_write_all(fd, data)

    # The archive module calls os.fsync through the os module: patch it there.
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(archive_writer, "_write_all", write_all)
    inner = open_writer(str(tmp_path / "a.jsonl.gz"))
    fd = inner._fd  # type: ignore[attr-defined]
    sqs = RecordingSqs(family.client, log)
    with LoggingWriter(inner, log) as writer:
        result = run_purge(family.client, writer, tasks=[REFUND], broker_factory=lambda: sqs)
    assert result.purged == 35

    deletes = [(i, ids) for i, (kind, ids) in enumerate(log) if kind == "delete"]
    assert len(deletes) >= 4, "expected several batches"
    assert set().union(*(ids for _, ids in deletes)) == of_task(sent, REFUND)
    for j, ids in deletes:
        for mid in ids:
            starts = [i for i, (k, v) in enumerate(log[:j]) if k == "write" and mid in v]
            assert starts, "deleted before it was handed to the archive"
            end = next(i for i, (k, v) in enumerate(log) if k == "written" and mid in v)
            assert end < j, "deleted before its write returned"
            data = [i for i in range(starts[-1], end) if log[i] == ("data", fd)]
            assert data, "deleted before its record reached the archive file"
            assert any(log[i] == ("fsync", fd) for i in range(data[-1], j)), (
                "deleted before the fsync covering its record"
            )


class LoggingS3:
    """An S3 client proxy that logs, after each successful put, the messages it holds."""

    def __init__(self, client: Any, log: list[tuple[str, Any]]) -> None:
        self._client = client
        self._log = log

    def put_object(self, **kwargs: Any) -> Any:
        response = self._client.put_object(**kwargs)
        lines = gzip.decompress(kwargs["Body"]).splitlines()
        self._log.append(("put", {json.loads(x)["message_id"] for x in lines}))
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


@pytest.fixture
def s3(sqs_client: Any) -> Any:
    client = boto3.client("s3", region_name=REGION)
    client.create_bucket(Bucket="dlq-archive")
    return client


def test_s3_purge_writes_chunked_objects_before_deleting(family: Family, s3: Any) -> None:
    sent = seed(family, [(REFUND, 45), (RECEIPT, 6)])
    log: list[tuple[str, Any]] = []
    proxy = LoggingS3(s3, log)
    writer = open_writer(
        "s3://dlq-archive/checkout", s3_client_factory=lambda: proxy, chunk_records=7
    )
    sqs = RecordingSqs(family.client, log)
    with writer:
        result = run_purge(
            family.client, writer, tasks=[REFUND], broker_factory=lambda: sqs, buffer=S3_BUFFER
        )
    assert result.purged == 45 and result.archive == writer.location
    assert result.archive.startswith("s3://dlq-archive/checkout/")

    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="dlq-archive")["Contents"]]
    run = result.archive.removeprefix("s3://dlq-archive/")
    assert all(re.fullmatch(re.escape(run) + r"part-\d{6}\.jsonl\.gz", k) for k in keys)
    # Part 0 is the run's header, put when the writer closed; it holds no record.
    assert sorted(keys) == [f"{run}part-{n:06d}.jsonl.gz" for n in range(len(keys))]
    assert len(keys) == 1 + 7  # 45 records, at most 7 per object
    for n, key in enumerate(sorted(keys)):
        body = s3.get_object(Bucket="dlq-archive", Key=key)["Body"].read()
        lines = len(gzip.decompress(body).splitlines())
        assert lines == 0 if n == 0 else 1 <= lines <= 7

    for j, (kind, ids) in enumerate(log):
        if kind != "delete":
            continue
        for mid in ids:
            assert any(k == "put" and mid in v for k, v in log[:j]), "deleted before put"
    records, problems = archived(result.archive, s3_client_factory=lambda: s3)
    assert problems == [] and {r.message_id for r in records} == of_task(sent, REFUND)
    assert set(peek(family.client, family.dlq_url)) == of_task(sent, RECEIPT)


def test_s3_put_failure_mid_way_deletes_nothing_unwritten(family: Family, s3: Any) -> None:
    sent = seed(family, [(REFUND, 30)])
    puts = [0]
    real_put = s3.put_object

    class FailingS3(LoggingS3):
        def put_object(self, **kwargs: Any) -> Any:
            puts[0] += 1
            if puts[0] == 2:
                return real_put(Bucket="no-such-bucket", Key="x", Body=b"")
            return real_put(**kwargs)

    writer = open_writer(
        "s3://dlq-archive/p", s3_client_factory=lambda: FailingS3(s3, []), chunk_records=10
    )
    with writer, pytest.raises(ArchiveError, match="does not exist"):
        run_purge(family.client, writer, buffer=10)
    records, _ = archived(writer.location, s3_client_factory=lambda: s3)
    assert len(records) == 10
    in_dlq, _ = assert_nothing_lost(family.client, family, sent, [writer.location], s3=s3)
    assert set(in_dlq) == set(sent) - {r.message_id for r in records}


def test_fifo_dlq_is_purged_completely_with_a_large_buffer(sqs_client: Any, tmp_path: Path) -> None:
    # A FIFO DLQ hands out no more messages of a group while some are in flight, so a
    # purge that buffers (S3) must still not stop after the first receive.
    family = make_family(sqs_client, "onion-orders.fifo")
    for i in range(37):
        family.send_to_dlq(
            encode(REFUND, [i], task_id=f"t{i}"),
            MessageGroupId=f"user-{i % 3}",
            MessageDeduplicationId=f"d{i}",
        )
    target = resolve_target(load_layout(None), "onion-orders.fifo", lambda r: SqsBroker(sqs_client))
    path = str(tmp_path / "fifo.jsonl.gz")
    with open_writer(path) as writer:
        result = purge_dlq(
            target,
            PurgeOptions(execute=True, buffer=S3_BUFFER),
            broker_factory=lambda: SqsBroker(sqs_client),
            writer=writer,
        )
    assert (result.matched, result.purged) == (37, 37)
    assert family.depth() == (0, 0)
    records, _ = archived(path)
    assert len(records) == 37
    assert {r.attributes["MessageGroupId"] for r in records} == {"user-0", "user-1", "user-2"}


# -- delete failures ----------------------------------------------------------------------


class FlakyDeletes(RecordingSqs):
    """DeleteMessageBatch reports some entries as Failed."""

    def __init__(self, client: Any, fail_ids: set[str]) -> None:
        super().__init__(client)
        self.fail_ids = fail_ids

    def delete_batch(self, url: str, handles: Mapping[str, str]) -> BatchResult:
        bad = {i for i, h in handles.items() if self.handles[h] in self.fail_ids}
        result = super().delete_batch(url, {i: h for i, h in handles.items() if i not in bad})
        failed = dict(result.failed) | {i: "InternalError: try again" for i in bad}
        return BatchResult(result.ok, failed)


def test_failed_deletes_are_counted_and_stay_in_dlq_and_archive(
    family: Family, tmp_path: Path
) -> None:
    sent = seed(family, [(REFUND, 14), (RECEIPT, 4)])
    failing = set(sorted(of_task(sent, REFUND))[:3])
    sqs = FlakyDeletes(family.client, failing)
    path = str(tmp_path / "a.jsonl")
    with open_writer(path) as writer:
        result = run_purge(family.client, writer, tasks=[REFUND], broker_factory=lambda: sqs)
    assert (result.archived, result.purged, result.failed) == (14, 11, 3)
    assert result.needs_attention
    # Visible again at once: the run gave them back.
    assert family.depth() == (7, 0)
    assert set(peek(family.client, family.dlq_url)) == of_task(sent, RECEIPT) | failing
    records, _ = archived(path)
    assert {r.message_id for r in records} == of_task(sent, REFUND)


def test_cli_purge_with_failed_deletes_exits_3(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    seed(family, [(REFUND, 5)])
    real = SqsBroker.delete_batch

    def first_fails(self: SqsBroker, url: str, handles: Mapping[str, str]) -> BatchResult:
        first, *rest = handles
        result = real(self, url, {i: handles[i] for i in rest})
        return BatchResult(result.ok, {**result.failed, first: "InternalError: x"})

    monkeypatch.setattr(SqsBroker, "delete_batch", first_fails)
    path = str(tmp_path / "a.jsonl.gz")
    result = cli.raising("purge", "checkout", "--archive", path, "--execute", "--yes", "--json")
    assert result.exit_code == 3
    data = json_of(result)
    assert (data["archived"], data["purged"], data["failed"]) == (5, 4, 1)
    assert family.depth() == (1, 0)


# -- dry runs and the archive command -----------------------------------------------------


def test_purge_is_a_dry_run_by_default(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    monkeypatch.chdir(tmp_path)
    seed(family, [(REFUND, 6), (RECEIPT, 4)])
    result = cli.raising("purge", "checkout", "--task", REFUND, "--json")
    assert result.exit_code == 0, result.output
    data = json_of(result)
    assert {"dry_run", "matched", "purged", "archive"} <= set(data)
    assert data["dry_run"] is True
    assert (data["matched"], data["purged"], data["archived"]) == (6, 0, 0)
    assert data["by_task"] == {REFUND: 6}
    assert re.fullmatch(r"\./redrive-archive/checkout-\d{8}T\d{6}Z\.jsonl\.gz", data["archive"])
    assert not (tmp_path / "redrive-archive").exists()
    assert family.depth() == (10, 0)

    text = cli.raising("purge", "checkout")
    assert text.exit_code == 0 and "DRY RUN" in text.stdout
    assert not (tmp_path / "redrive-archive").exists()
    assert family.depth() == (10, 0)


def test_core_purge_defaults_to_a_dry_run(family: Family) -> None:
    seed(family, [(REFUND, 3)])
    result = purge_dlq(
        checkout(family.client),
        PurgeOptions(),
        broker_factory=lambda: SqsBroker(family.client),
        writer=None,
    )
    assert result.dry_run and result.matched == 3 and result.purged == 0
    assert result.run_id is None and family.depth() == (3, 0)


def test_cli_purge_execute_archives_to_the_default_path(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    monkeypatch.chdir(tmp_path)
    sent = seed(family, [(REFUND, 6), (RECEIPT, 4)])
    result = cli.raising("purge", "checkout", "--task", REFUND, "--execute", "--yes", "--json")
    data = json_of(result)
    assert result.exit_code == 0
    assert data["dry_run"] is False and (data["matched"], data["purged"]) == (6, 6)
    [path] = (tmp_path / "redrive-archive").iterdir()
    assert data["archive"].endswith(path.name)
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    records, _ = archived(str(path))
    assert {r.message_id for r in records} == of_task(sent, REFUND)
    assert set(peek(family.client, family.dlq_url)) == of_task(sent, RECEIPT)


def test_archive_command_deletes_nothing(family: Family, tmp_path: Path, cli: Cli) -> None:
    sent = seed(family, [(REFUND, 8), (RECEIPT, 5)])
    path = str(tmp_path / "snapshot.jsonl.gz")
    result = cli.raising("archive", "checkout", "--task", REFUND, "--archive", path, "--json")
    data = json_of(result)
    assert result.exit_code == 0
    assert data["command"] == "archive"
    assert (data["matched"], data["archived"], data["purged"]) == (8, 8, 0)
    assert data["archive"] == path
    # The DLQ is as it was: every message visible again, none gone.
    assert family.depth() == (13, 0)
    assert set(peek(family.client, family.dlq_url)) == set(sent)
    records, _ = archived(path)
    assert {r.message_id for r in records} == of_task(sent, REFUND)

    everything = str(tmp_path / "all.jsonl")
    assert cli.raising("archive", "checkout", "--archive", everything).exit_code == 0
    assert len(archived(everything)[0]) == 13 and family.depth() == (13, 0)


# -- --no-archive and PurgeQueue ----------------------------------------------------------


def test_archive_and_no_archive_together_is_a_usage_error(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    seed(family, [(REFUND, 2)])
    path = tmp_path / "x.jsonl.gz"
    result = cli("purge", "checkout", "--archive", str(path), "--no-archive", "--execute", "--yes")
    assert result.exit_code == 2
    assert "--no-archive" in result.output
    assert not path.exists() and family.depth() == (2, 0)


def test_unfiltered_no_archive_purge_uses_purge_queue_once_a_minute(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    monkeypatch.setenv("MOTO_SQS_ENFORCE_STRICT_QUEUE_PURGE_BEHAVIOUR", "true")
    monkeypatch.chdir(tmp_path)
    seed(family, [(REFUND, 4), (RECEIPT, 3)])
    dry = json_of(cli.raising("purge", "checkout", "--no-archive", "--json"))
    assert dry["dry_run"] is True and dry["method"] == "purge-queue" and dry["matched"] == 7
    assert family.depth() == (7, 0)

    data = json_of(cli.raising("purge", "checkout", "--no-archive", "--execute", "--yes", "--json"))
    assert data["method"] == "purge-queue" and data["archive"] is None
    assert (data["dry_run"], data["purged"]) == (False, 7)
    assert family.depth() == (0, 0)
    assert not (tmp_path / "redrive-archive").exists()

    seed(family, [(REFUND, 1)])
    again = cli("purge", "checkout", "--no-archive", "--execute", "--yes")
    assert again.exit_code == 1
    assert "Traceback" not in again.output
    [line] = again.stderr.strip().splitlines()
    assert "60 seconds" in line and "wait a minute" in line
    assert family.depth() == (1, 0)


def test_purge_queue_in_progress_is_one_clear_line_whatever_moto_does() -> None:
    client = boto3.client("sqs", region_name=REGION)
    url = "https://sqs.us-east-1.amazonaws.com/123456789012/onion-checkout-dlq"
    target = DlqTarget(
        label="checkout",
        family=None,
        dlq=QueueRef(url=url, name="onion-checkout-dlq", ident="", fifo=False),
        sources=(),
    )
    with Stubber(client) as stub:
        stub.add_response(
            "get_queue_attributes",
            {
                "Attributes": {
                    "ApproximateNumberOfMessages": "5",
                    "ApproximateNumberOfMessagesNotVisible": "0",
                }
            },
        )
        stub.add_client_error(
            "purge_queue",
            service_error_code="AWS.SimpleQueueService.PurgeQueueInProgress",
            service_message="Only one PurgeQueue operation on onion-checkout-dlq is allowed "
            "every 60 seconds.",
            http_status_code=403,
        )
        with pytest.raises(AwsError) as raised:
            purge_whole_queue(target, SqsBroker(client), execute=True)
    message = str(raised.value)
    assert "\n" not in message
    assert "one PurgeQueue per 60 seconds on onion-checkout-dlq" in message
    assert "wait a minute" in message


def test_filtered_no_archive_purge_deletes_without_purge_queue(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    monkeypatch.chdir(tmp_path)
    sent = seed(family, [(REFUND, 4), (RECEIPT, 3)])

    def no_purge_queue(self: SqsBroker, url: str) -> None:
        raise AssertionError("PurgeQueue must not be used for a filtered purge")

    monkeypatch.setattr(SqsBroker, "purge", no_purge_queue)
    data = json_of(
        cli.raising(
            "purge", "checkout", "--task", RECEIPT, "--no-archive", "--execute", "--yes", "--json"
        )
    )
    assert data["method"] == "delete" and data["archive"] is None
    assert (data["purged"], data["archived"]) == (3, 0)
    assert set(peek(family.client, family.dlq_url)) == of_task(sent, REFUND)
    assert not (tmp_path / "redrive-archive").exists()


def test_cli_purge_to_s3_then_the_objects_hold_the_messages(
    family: Family, s3: Any, cli: Cli
) -> None:
    sent = seed(family, [(REFUND, 12), (PROGRESS, 3)])
    result = cli.raising(
        "purge",
        "checkout",
        "--task",
        REFUND,
        "--archive",
        "s3://dlq-archive/checkout",
        "--execute",
        "--yes",
        "--json",
    )
    data = json_of(result)
    assert data["purged"] == 12 and data["archive"].startswith("s3://dlq-archive/checkout/")
    records, problems = archived("s3://dlq-archive/checkout", s3_client_factory=lambda: s3)
    assert problems == [] and {r.message_id for r in records} == of_task(sent, REFUND)
    assert set(peek(family.client, family.dlq_url)) == of_task(sent, PROGRESS)


def test_purge_run_id_can_be_given_so_the_archive_names_the_ledger_run(
    family: Family, tmp_path: Path
) -> None:
    seed(family, [(REFUND, 3)])
    path = str(tmp_path / "a.jsonl.gz")
    with open_writer(path) as writer:
        result = purge_dlq(
            checkout(family.client),
            PurgeOptions(execute=True),
            broker_factory=lambda: SqsBroker(family.client),
            writer=writer,
            run_id="ledger-run-1",
        )
    assert result.run_id == "ledger-run-1"
    assert {r.run_id for r in archived(path)[0]} == {"ledger-run-1"}


def test_cli_purge_run_id_names_the_archived_records(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    # The JSON summary, the ledger's audit and the archive must agree on which run it was.
    seed(family, [(REFUND, 3)])
    path = str(tmp_path / "a.jsonl.gz")
    data = json_of(
        cli.raising("purge", "checkout", "--archive", path, "--execute", "--yes", "--json")
    )
    records, _ = archived(path)
    assert {r.run_id for r in records} == {data["run_id"]}
