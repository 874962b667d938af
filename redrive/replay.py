"""Replay archived messages to any queue, and inspect an archive offline.

Replay runs the move engine with an archive as its source: the same idempotency keys,
ledger states and in-doubt handling, so replaying an archive twice sends nothing the second
time, and a message the engine already moved back (its key is done) is not sent again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from redrive import attributes
from redrive.archive import ArchiveRecord, read_records
from redrive.inspect import Grouping, InspectResult
from redrive.ledger import Ledger
from redrive.messages import decode
from redrive.move import MoveEngine, MoveOptions, MoveResult
from redrive.queues import DlqTarget, QueueRef
from redrive.sqs import MAX_BATCH_ENTRIES, Message, Sqs


class ArchiveSource:
    """Archive records as the engine's batches of messages; nothing to hide or delete."""

    deletes = False

    def __init__(self, records: Iterator[ArchiveRecord], stop: threading.Event) -> None:
        self._records = records
        self._lock = threading.Lock()
        self._done = False
        self.stop = stop
        self.read = 0

    def next_batch(self, sqs: Sqs) -> list[Message] | None:
        with self._lock:
            if self._done or self.stop.is_set():
                return None
            batch = []
            for record in self._records:
                batch.append(as_message(record))
                if len(batch) == MAX_BATCH_ENTRIES:
                    break
            self.read += len(batch)
            if not batch:
                self._done = True
                return None
            return batch

    def keep(self, sqs: Sqs, messages: Sequence[Message]) -> None:
        pass

    def extend(self, sqs: Sqs, messages: Sequence[Message], seconds: int) -> None:
        pass

    def forget(self, messages: Sequence[Message]) -> None:
        """Nothing is remembered of an archive's records."""

    def stop_receiving(self) -> None:
        with self._lock:
            self._done = True

    def release_all(self, sqs: Sqs) -> None:
        pass

    def close(self) -> None:
        pass


def as_message(record: ArchiveRecord) -> Message:
    return Message(
        message_id=record.message_id,
        receipt_handle="",
        body=record.body,
        attributes=record.attributes,
        message_attributes=record.message_attributes,
    )


def archive_label(source: str) -> str:
    return source.rstrip("/").rsplit("/", 1)[-1] or source


def replay_archive(
    source: str,
    to: QueueRef,
    ledger: Ledger | None,
    options: MoveOptions,
    *,
    sqs_factory: Callable[[], Sqs],
    s3_client_factory: Callable[[], Any] | None = None,
    command: str = "replay",
    stop: threading.Event | None = None,
    on_progress: Callable[[MoveResult], None] | None = None,
    on_problem: Callable[[str], None] | None = None,
    fault: Callable[[str], None] | None = None,
    run_info: Mapping[str, Any] | None = None,
) -> MoveResult:
    """Send every selected archived message to ``to``, byte-identical, each task once."""
    stop = stop or threading.Event()
    label = archive_label(source)
    pseudo = DlqTarget(
        label=label,
        family=None,
        dlq=QueueRef(url=source, name=label, arn="", fifo=False),
        sources=(),
    )
    records = read_records(source, s3_client_factory=s3_client_factory, on_problem=on_problem)
    engine = MoveEngine(
        pseudo,
        ledger,
        replace(options, to=to),
        sqs_factory=sqs_factory,
        command=command,
        stop=stop,
        on_progress=on_progress,
        fault=fault,
        source=ArchiveSource(records, stop),
        run_info=run_info,
    )
    return engine.run()


def inspect_archive(
    source: str,
    *,
    show_args: bool = False,
    limit: int | None = None,
    s3_client_factory: Callable[[], Any] | None = None,
    on_problem: Callable[[str], None] | None = None,
    now: float | None = None,
) -> InspectResult:
    """The grouped view of a live inspect, read offline from an archive."""
    started = time.monotonic()
    now = time.time() if now is None else now
    grouping = Grouping(now=now, show_args=show_args)
    dlqs: set[str] = set()
    partial = False
    for record in read_records(source, s3_client_factory=s3_client_factory, on_problem=on_problem):
        if limit is not None and grouping.total >= limit:
            partial = True
            break
        message = as_message(record)
        dlqs.add(record.dlq.rsplit("/", 1)[-1])
        grouping.add(
            decode(record.body),
            message_id=record.message_id,
            sent_at=message.sent_timestamp,
            receive_count=message.receive_count,
            redrive_count=attributes.redrive_count(record.message_attributes),
            redrive_receives=record.redrive_receives or 0,
        )
    return InspectResult(
        label=archive_label(source),
        dlq=", ".join(sorted(dlqs)) or "-",
        dlq_url=source,
        sources=[],
        total=grouping.total,
        groups=grouping.sorted_groups(),
        oldest=grouping.oldest,
        scanned_at=now,
        seconds=time.monotonic() - started,
        depth_before=grouping.total,
        hidden_before=0,
        partial=partial,
    )
