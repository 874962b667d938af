"""Purge and archive: copy selected DLQ messages to an archive, and (purge) then delete them.

A message is deleted only after its archive record is durable (fsynced, or the S3 object
written), so a purge killed at any point leaves every message in the DLQ, in the archive,
or both: never neither. ``archive`` is the same run without the delete.
"""

from __future__ import annotations

import enum
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from redrive.archive import ArchiveRecord, ArchiveWriter, default_archive_path, open_writer
from redrive.archive.storage import absolute_location
from redrive.broker.base import Broker, Delivery, DlqTarget
from redrive.dlq.receive_log import ReceiveLog
from redrive.dlq.scan import DlqScan, run_pipelines
from redrive.errors import ArchiveError, RedriveError, UsageProblem
from redrive.ledger import Ledger
from redrive.messages import TaskInfo, decode
from redrive.operations.limit import Limit
from redrive.operations.plan import changed_since_plan, message_digest
from redrive.operations.seen import SeenByFilters
from redrive.runs.lifecycle import RunLifecycle, new_run_id
from redrive.runs.observer import NULL_OBSERVER, PlanItem, RunObserver
from redrive.runs.shared import LimitLike, RunShares
from redrive.selection import FilterMisses, Selection, Sightings

DEFAULT_LEASE = 30
# Messages buffered before one archive write: S3 wants large objects, and every buffered
# message is hidden by its lease until it is written and deleted.
S3_BUFFER = 200
LOCAL_BUFFER = 10
# A buffer older than this is written even when not full, well inside the lease.
BUFFER_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class PurgeOptions:
    selection: Selection = field(default_factory=Selection)
    execute: bool = False
    delete: bool = True
    """False for ``archive``: copy, never delete."""
    archive: bool = True
    """False only with ``--no-archive``: delete without keeping a copy."""
    lease: int = DEFAULT_LEASE
    workers: int = 1
    buffer: int = LOCAL_BUFFER
    """Messages per archive write to a local file (an S3 archive writes S3_BUFFER)."""
    archive_to: str | None = None
    """Where to archive (a path or s3:// prefix); None: ./redrive-archive/FAMILY-TIME.jsonl.gz."""
    planned_digests: Mapping[str, str] | None = None
    """``apply``: MessageId -> the digest its plan recorded; a message whose digest differs
    is left in the DLQ (``changed_since_plan``; :mod:`redrive.operations.plan`)."""


@dataclass(slots=True)
class PurgeResult:
    dry_run: bool
    target: str
    dlq: str
    archive: str | None
    command: str = "purge"
    run_id: str | None = None
    method: str = "delete"
    """``delete`` (per message) or ``purge-queue`` (SQS PurgeQueue, unfiltered --no-archive)."""
    scanned: int = 0
    matched: int = 0
    archived: int = 0
    purged: int = 0
    failed: int = 0
    by_task: Counter[str] = field(default_factory=Counter)
    misses: FilterMisses | None = None
    """A --task or --message-id filter that matched nothing: what the scan saw instead."""
    interrupted: bool = False
    error: str | None = None
    """The error that stopped the run partway (the counts are what it had done by then)."""
    still_hidden: int = 0
    seconds: float = 0.0
    depth_before: int | None = None
    """SQS's count of visible messages when the run started (for progress)."""
    redelivered: int = 0
    """Copies SQS delivered again after their message was archived and deleted: deleted
    once more, not archived or counted twice."""
    parts: list[str] = field(default_factory=list)
    """A ``--processes`` run's archives, one per process that wrote one (``archive``: the
    name they were written beside, which replay takes for all of them)."""
    changed_since_plan: int = 0
    """``apply``: planned messages left because they are not the ones reviewed."""

    @property
    def needs_attention(self) -> bool:
        return bool(self.failed or self.changed_since_plan)

    @property
    def in_doubt(self) -> int:
        return 0

    @property
    def acted(self) -> bool:
        """Whether the run got anywhere (a summary of it says something): not ``scanned``,
        which counts a batch as it is received, before anything is done with it."""
        return bool(self.archived or self.purged or self.failed)

    def run_counts(self) -> dict[str, int]:
        """What the ledger records at the run's end (the audit trail's counts)."""
        return {
            "matched": self.matched,
            "archived": self.archived,
            "purged": self.purged,
            "failed": self.failed,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "command": self.command,
            "target": self.target,
            "dlq": self.dlq,
            "run_id": self.run_id,
            "method": self.method,
            "scanned": self.scanned,
            "matched": self.matched,
            "archived": self.archived,
            "purged": self.purged,
            "failed": self.failed,
            "archive": self.archive,
            "by_task": dict(sorted(self.by_task.items())),
            "filter_misses": self.misses.to_json() if self.misses is not None else None,
            "interrupted": self.interrupted,
            "error": self.error,
            "still_hidden": self.still_hidden,
            "seconds": round(self.seconds, 3),
            "redelivered": self.redelivered,
        }


@dataclass(slots=True)
class _Pending:
    message: Delivery
    info: TaskInfo
    at: float


def run_purge(
    target: DlqTarget,
    options: PurgeOptions,
    *,
    broker_factory: Callable[[], Broker],
    ledger: Ledger | None = None,
    command: str = "purge",
    record: Mapping[str, Any] | None = None,
    s3_client_factory: Callable[[], Any] | None = None,
    observer: RunObserver[PurgeResult] = NULL_OBSERVER,
    stop: threading.Event | None = None,
    receive_log: ReceiveLog | None = None,
    clock: Callable[[], float] = time.time,
    run_id: str | None = None,
    shares: RunShares | None = None,
    sightings: Callable[[Sightings | None], None] | None = None,
) -> PurgeResult:
    """``purge`` or ``archive`` as a command runs it: the archive opened where the options say
    (a dry run checks the execute could write there), the run recorded in ``ledger`` for the
    audit trail (``record``: its who and what), and an archive that holds nothing removed.
    ``run_id``, ``shares`` and ``sightings`` (hears what the filters saw): a process of
    ``--processes`` (redrive.runs.processes)."""
    where = archive_location(target, options, clock)
    writer = _open_archive(where, options.execute, s3_client_factory)
    if where and where.startswith("s3://"):
        options = replace(options, buffer=S3_BUFFER)
    stop = stop or threading.Event()
    ended = _PurgeEnd(DeletedMessages())
    life = _purge_lifecycle(
        target, options, ledger, command, record, where, stop, clock, ended, run_id
    )
    with life:
        try:
            result = purge_dlq(
                target,
                options,
                broker_factory=broker_factory,
                writer=writer,
                observer=observer,
                stop=stop,
                clock=clock,
                # The archive's records name the run the ledger and the audit trail know.
                run_id=life.run_id,
                on_deleted=ended.deleted.add if ledger is not None else None,
                receive_log=receive_log,
                shares=shares,
                sightings=sightings,
            )
        finally:
            if writer is not None:
                writer.close()
        ended.dropped = _drop_empty_archive(where, result.archived) if writer is not None else False
        result.archive = None if ended.dropped else result.archive or where
        ended.result = result
    return result


def _purge_lifecycle(
    target: DlqTarget,
    options: PurgeOptions,
    ledger: Ledger | None,
    command: str,
    record: Mapping[str, Any] | None,
    where: str | None,
    stop: threading.Event,
    clock: Callable[[], float],
    ended: _PurgeEnd,
    run_id: str | None,
) -> RunLifecycle:
    """The run as the ledger records it: what was asked, where it archives, and (from
    ``ended``) how it ended."""
    return RunLifecycle(
        ledger,
        execute=options.execute,
        command=command,
        info={**(record or {}), "archive": absolute_location(where), "dlq": target.dlq.url},
        lease=options.lease,
        stop=stop,
        clock=clock,
        counts=ended.counts,
        end_info=ended.info,
        run_id=run_id,
    )


def _open_archive(
    where: str | None, execute: bool, s3_client_factory: Callable[[], Any] | None
) -> ArchiveWriter | None:
    if where and not execute:
        # The dry run says "would be archived to" only where the execute could write.
        check_archive_path(where)
    return open_writer(where, s3_client_factory=s3_client_factory) if where and execute else None


def archive_location(
    target: DlqTarget, options: PurgeOptions, now: Callable[[], float] = time.time
) -> str | None:
    """Where the run archives: the options' destination, or the default path; None with
    ``--no-archive``."""
    if not options.archive:
        return None
    return options.archive_to or default_archive_path(
        target.label, datetime.fromtimestamp(now(), UTC)
    )


DELETED_KEPT = 500
"""How many deleted messages a purge lists in its run record: enough for any incident note,
and a bounded record (a DynamoDB item holds at most 400 KB). The archive holds every one."""


class DeletedMessages:
    """The first :data:`DELETED_KEPT` messages a purge deleted: ``[message id, task, task id]``
    each, for the audit trail. Not thread-safe: the purge calls it under its own lock."""

    def __init__(self, keep: int | None = None) -> None:
        self.keep = DELETED_KEPT if keep is None else keep
        self.items: list[list[str | None]] = []
        self.total = 0

    def add(self, deleted: Sequence[tuple[str, str, str | None]]) -> None:
        self.total += len(deleted)
        room = self.keep - len(self.items)
        # A task name is producer text: long ones must not blow the record's bound.
        self.items.extend([m, t[:200], i] for m, t, i in deleted[: max(0, room)])


@dataclass(slots=True)
class _PurgeEnd:
    """What a purge's run records at its end: the counts, and the messages it deleted."""

    deleted: DeletedMessages
    result: PurgeResult | None = None
    dropped: bool = False

    def counts(self) -> dict[str, int]:
        result = self.result
        if result is None:
            # Failed or interrupted: the run still says what it had deleted by then.
            return {"purged": self.deleted.total}
        return result.run_counts()

    def info(self) -> dict[str, Any]:
        return {"deleted": self.deleted.items, **({"archive": None} if self.dropped else {})}


def _drop_empty_archive(where: str | None, archived: int) -> bool:
    """Remove the file a run that archived nothing created (its writer made it new, with
    O_EXCL, and it holds only the archive's header): an archive that holds no message is no
    evidence of anything, and would block a rerun that names the same path."""
    if where is None or "://" in where or archived:
        return False
    try:
        Path(where).expanduser().unlink()
    except OSError:
        return False
    return True


def purge_dlq(
    target: DlqTarget,
    options: PurgeOptions,
    *,
    broker_factory: Callable[[], Broker],
    writer: ArchiveWriter | None,
    observer: RunObserver[PurgeResult] = NULL_OBSERVER,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.time,
    run_id: str | None = None,
    on_deleted: Callable[[list[tuple[str, str, str | None]]], None] | None = None,
    receive_log: ReceiveLog | None = None,
    shares: RunShares | None = None,
    sightings: Callable[[Sightings | None], None] | None = None,
) -> PurgeResult:
    """Archive (if ``writer``) and delete (if ``options.delete``) every selected message.

    ``run_id`` names the run in the archive records; give the ledger's run id, so the
    audit trail and the archive name the same run. ``on_deleted`` hears ``(message id,
    task, task id)`` of the messages each delete removed (one call at a time).
    ``receive_log``: where redrive counts its own receives (archive records keep the count
    beside SQS's attributes).
    """
    if options.execute and options.archive and writer is None:
        raise UsageProblem("an archiving run needs an archive writer")
    if not options.delete and writer is None and options.execute:
        raise UsageProblem("archive needs a destination")
    purge = _Purge(
        target,
        options,
        broker_factory=broker_factory,
        writer=writer,
        observer=observer,
        stop=stop or threading.Event(),
        clock=clock,
        run_id=(run_id or new_run_id()) if options.execute else None,
        on_deleted=on_deleted,
        shares=shares,
    )
    result = purge.run(receive_log)
    if sightings is not None:
        sightings(purge.seen.sightings())
    return result


class PurgeFate(enum.Enum):
    NOT_SELECTED = "not-selected"
    """Left out by the filters: kept, not counted."""
    LIMIT_REACHED = "limit-reached"
    """--limit messages are taken already: kept, not counted."""
    TAKE = "take"
    """Archived (and, for purge, deleted once archived)."""


def decide_purge(*, selected: bool, limit_left: bool) -> PurgeFate:
    """One message's fate in a purge or archive (``limit_left``: whether --limit leaves room
    for it)."""
    if not selected:
        return PurgeFate.NOT_SELECTED
    if not limit_left:
        return PurgeFate.LIMIT_REACHED
    return PurgeFate.TAKE


class _PurgeTally:
    """A purge's counts (its PurgeResult), under the tally's own lock: workers share it."""

    def __init__(self, result: PurgeResult, seen: SeenByFilters) -> None:
        self.result = result
        self.seen = seen
        self._lock = threading.Lock()

    def matched(self, info: TaskInfo) -> None:
        with self._lock:
            self.result.matched += 1
            self.result.by_task[info.task] += 1

    def changed(self, info: TaskInfo) -> None:
        """A planned message left as not the one reviewed: matched, not taken."""
        with self._lock:
            self.result.matched += 1
            self.result.changed_since_plan += 1

    def scanned(self, n: int) -> None:
        with self._lock:
            self.result.scanned += n

    def snapshot(self) -> PurgeResult:
        """The counts as they stand, taken under the lock (what a progress line reads)."""
        with self._lock:
            return replace(self.result)

    def archived(self, n: int) -> None:
        with self._lock:
            self.result.archived += n

    def deleted(
        self,
        gone: Sequence[_Pending],
        failed: int,
        on_deleted: Callable[[list[tuple[str, str, str | None]]], None] | None,
    ) -> None:
        with self._lock:
            self.result.purged += len(gone)
            self.result.failed += failed
            if on_deleted is not None and gone:
                on_deleted([(p.message.message_id, p.info.task, p.info.task_id) for p in gone])


class _Purge:
    """One purge (or archive) run: per batch, a decision per message, then the steps:
    archive (durable first), then delete. Workers share it, each with its own Broker."""

    def __init__(
        self,
        target: DlqTarget,
        options: PurgeOptions,
        *,
        broker_factory: Callable[[], Broker],
        writer: ArchiveWriter | None,
        observer: RunObserver[PurgeResult],
        stop: threading.Event,
        clock: Callable[[], float],
        run_id: str | None,
        on_deleted: Callable[[list[tuple[str, str, str | None]]], None] | None,
        shares: RunShares | None = None,
    ) -> None:
        self.target = target
        self.options = options
        self.broker_factory = broker_factory
        self.writer = writer
        self.observer = observer
        self.stop = stop
        self.clock = clock
        self.on_deleted = on_deleted
        self.result = PurgeResult(
            dry_run=not options.execute,
            target=target.label,
            dlq=target.dlq.name,
            archive=writer.location if writer is not None else None,
            command="purge" if options.delete else "archive",
            run_id=run_id,
        )
        selection = options.selection
        self.seen = SeenByFilters(selection)
        self._tally = _PurgeTally(self.result, self.seen)
        self._shares = shares
        self._limit: LimitLike = shares.limit if shares else Limit(selection.limit)
        self._write_lock = threading.Lock()  # one archive, written one batch at a time

    def run(self, receive_log: ReceiveLog | None) -> PurgeResult:
        started = time.monotonic()
        broker = self.broker_factory()
        self.result.depth_before = broker.counts(self.target.dlq.url).ready
        self._kept_attributes = broker.capabilities.archived_attributes
        # archive keeps every message hidden until the end; purge only the ones it does not
        # take.
        self._scan = DlqScan(
            url=self.target.dlq.url,
            lease=self.options.lease,
            receive_held=not self.options.delete,
            stop=self.stop,
            broker_factory=self.broker_factory,
            receive_log=receive_log,
            # The archive records them; a --no-archive purge reads them only for a --where.
            receive_counts=self.options.archive
            or self.options.selection.reads("consumer_receives"),
        )
        try:
            run_pipelines(self._work, broker, self.broker_factory, self.options.workers, self.stop)
        except RedriveError as exc:
            # What it had archived and deleted by then (completed in the finally below); the
            # stop the error set for the other workers is no interruption.
            self.result.error = str(exc)
            exc.partial = self.result
            raise
        finally:
            if shares_ended := (self._shares and self._shares.scan_ended):
                # --processes: the siblings' scans end first, or one would count what we
                # give back.
                shares_ended()
            self._scan.release_all(broker)
            self._scan.close()
            self.result.redelivered = self._scan.stats.redelivered
            self.result.interrupted = self.stop.is_set() and self.result.error is None
            self.result.seconds = time.monotonic() - started
            self.result.misses = self._tally.seen.misses()
        self.result.still_hidden = broker.counts(self.target.dlq.url).held
        return self.result

    def _work(self, broker: Broker) -> None:
        pending: list[_Pending] = []
        # The batch being sorted into kept and pending: an error before it is sorted must
        # not leave it hidden for a whole lease.
        unsorted: list[Delivery] = []
        try:
            while (batch := self._scan.next_batch(broker)) is not None:
                unsorted = batch
                self.observer.on_step("received")
                pending.extend(self._sort(broker, batch))
                unsorted = []
                if not self.options.execute:
                    self._scan.keep(broker, [p.message for p in pending])
                    pending = []
                elif pending and self._due(pending):
                    self._flush(broker, pending)
                    pending = []
                if self.observer.wants_progress:
                    self.observer.on_progress(self._tally.snapshot())
            self._flush(broker, pending)
            pending = []
        except (Exception, KeyboardInterrupt):
            # Not archived, so not deleted: hand them back with the rest.
            held = {m.message_id: m for m in unsorted}
            held.update((p.message.message_id, p.message) for p in pending)
            self._scan.keep(broker, list(held.values()))
            raise

    def _due(self, pending: Sequence[_Pending]) -> bool:
        """Whether the buffer is to be written now."""
        return (
            len(pending) >= self.options.buffer
            or time.monotonic() - pending[0].at > BUFFER_SECONDS
            # A FIFO DLQ hands out nothing more of a message group while some of it is in
            # flight: buffering would end the scan with groups left behind.
            or self.target.dlq.fifo
        )

    def _sort(self, broker: Broker, batch: Sequence[Delivery]) -> list[_Pending]:
        """Decide each message of a batch: the ones taken, pending; the others kept."""
        keep: list[Delivery] = []
        taken: list[_Pending] = []
        now = self.clock()
        decoded = [(message, decode(message.body, message.parsed)) for message in batch]
        self._tally.seen.add(decoded)
        # Counted as received, before any of it is matched: scanned >= matched at all times.
        self._tally.scanned(len(batch))
        action = "purge" if self.options.delete else "archive"
        for message, info in decoded:
            selected = self.options.selection.matches(
                info,
                message_id=message.message_id,
                sent_at=message.enqueued_at,
                now=now,
                # --where (issue 15): the record reads the message and its DLQ's sources.
                message=message,
                sources=[s.name for s in self.target.sources],
            )
            if selected and changed_since_plan(self.options.planned_digests, message):
                self._tally.changed(info)
                keep.append(message)
                continue
            fate = decide_purge(selected=selected, limit_left=selected and self._limit.take())
            if fate is not PurgeFate.TAKE:
                keep.append(message)
                continue
            self._tally.matched(info)
            taken.append(_Pending(message, info, time.monotonic()))
            self.observer.on_plan(
                PlanItem(
                    message.message_id,
                    info.task,
                    info.task_id,
                    key=None,
                    action=action,
                    digest=message_digest(message),
                )
            )
        self._scan.keep(broker, keep)
        if self._limit.reached:
            self._scan.stop_receiving()
        return taken

    def _flush(self, broker: Broker, pending: list[_Pending]) -> None:
        if not pending:
            return
        self._archive(pending)
        self.observer.on_step("archived")
        if self.options.delete and self.options.execute:
            self._delete(broker, pending)
            self.observer.on_step("deleted")
        else:
            self._scan.keep(broker, [p.message for p in pending])

    def _archive(self, pending: Sequence[_Pending]) -> None:
        """Write the pending messages' records: durable before any of them is deleted."""
        if self.writer is None or not self.options.execute:
            return
        archived_at = datetime.fromtimestamp(self.clock(), UTC)
        records = [
            ArchiveRecord.from_message(
                p.message,
                kept=self._kept_attributes,
                task=p.info.task,
                task_id=p.info.task_id,
                dlq=self.target.dlq.url,
                run_id=self.result.run_id or "",
                archived_at=archived_at,
                redrive_receives=p.message.redrive_receives or None,
            )
            for p in pending
        ]
        with self._write_lock:
            self.writer.write_batch(records)
        self._tally.archived(len(records))

    def _delete(self, broker: Broker, pending: Sequence[_Pending]) -> None:
        for start in range(0, len(pending), 10):
            chunk = pending[start : start + 10]
            outcome = broker.ack(
                self.target.dlq.url, {str(i): p.message.tag for i, p in enumerate(chunk)}
            )
            gone = [chunk[int(i)] for i in outcome.ok]
            self._scan.forget([p.message for p in gone])
            failed = [chunk[int(i)].message for i in outcome.failed]
            # Still in the DLQ (and archived): visible again when the scan ends.
            self._scan.keep(broker, failed)
            self._tally.deleted(gone, len(failed), self.on_deleted)


def check_archive_path(destination: str) -> None:
    """Refuse, in a dry run, a local archive path the ``--execute`` would fail on: an existing
    file (archives are never overwritten), a directory, a parent that is not a directory, or
    one that cannot be written. Nothing is created. An S3 prefix is not checked: only a write
    could tell."""
    if "://" in destination:
        return
    path = os.path.abspath(os.path.expanduser(destination))
    if os.path.isdir(path):
        raise ArchiveError(
            f"archive path {destination} is a directory; give a file name such as "
            f"{os.path.join(destination, 'archive.jsonl.gz')}"
        )
    if os.path.lexists(path):
        raise ArchiveError(
            f"archive {destination} already exists; refusing to overwrite it, "
            "choose another archive path"
        )
    # The writer creates missing directories: what matters is the nearest one that exists.
    parent = os.path.dirname(path)
    while not os.path.lexists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ArchiveError(
            f"cannot create archive {destination}: {parent} is not a directory; "
            "choose another archive path"
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ArchiveError(
            f"permission denied writing archive {destination} ({parent} is not writable); "
            "choose a writable archive path"
        )
    _probe_directory(destination, parent)


def _probe_directory(destination: str, parent: str) -> None:
    """Make and remove a directory where the writer would: permission bits do not tell what
    root may do, nor what a read-only or virtual filesystem (``/proc``) refuses."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".redrive-probe-", dir=parent))
    except OSError as error:
        raise ArchiveError(
            f"cannot create archive {destination}: {parent} refuses new files "
            f"({error.strerror or error}); choose another archive path"
        ) from None


def purge_whole_queue(
    target: DlqTarget,
    broker: Broker,
    *,
    execute: bool,
    ledger: Ledger | None = None,
    command: str = "purge",
    record: Mapping[str, Any] | None = None,
) -> PurgeResult:
    """SQS PurgeQueue: unfiltered, unarchived, cannot be undone, once per 60 s per queue.

    With a ``ledger``, an executed purge is a run in it, for the audit trail (``record``: the
    who and what of :func:`redrive.reporting.audit.run_record`)."""
    info = {**(record or {}), "archive": None, "dlq": target.dlq.url}
    life = RunLifecycle(ledger, execute=execute, command=command, info=info)
    with life:
        counts = broker.counts(target.dlq.url)
        depth = counts.ready + counts.held
        result = PurgeResult(
            dry_run=not execute,
            target=target.label,
            dlq=target.dlq.name,
            archive=None,
            method="purge-queue",
            matched=depth,
            run_id=life.run_id,
        )
        if execute:
            broker.purge(target.dlq.url)
            result.purged = depth
            life.counts = lambda: {"matched": result.matched, "purged": result.purged}
            # SQS does not say which messages PurgeQueue deleted: the record says so.
            life.end_info = lambda: {"deleted": [], "method": "purge-queue"}
    return result
