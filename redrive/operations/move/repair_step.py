"""A move or replay with edits (issue 26): each selected message repaired on its way back
(:func:`redrive.repair.repair`), and the originals archived before any edited copy is sent.

The step sits beside the engine's own: :meth:`RepairStep.check` screens a selected message
(one the edits leave unchanged, cannot open, make too big for the broker, or that changed
since its plan is left in the DLQ, counted under its reason), and gives the body to send;
:meth:`RepairStep.archive` writes the originals of a decided batch, durable before its keys
are claimed and its copies sent. The key of an edited task is its original's: a rerun with
another edit finds the key sent and sends nothing again."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from redrive import attributes
from redrive.archive import ArchiveRecord, ArchiveWriter, default_archive_path, open_writer
from redrive.archive.storage import absolute_location, archive_part, archive_parts, free_part
from redrive.broker.base import Broker, Delivery, SendEntry
from redrive.celery.knowledge import UNREGISTERED
from redrive.errors import ArchiveError, NotRepairable
from redrive.ledger import Ledger
from redrive.messages import TaskInfo
from redrive.operations.move.candidate import Candidate, DecidedBatch
from redrive.operations.plan import CHANGED_SINCE_PLAN
from redrive.operations.purge.engine import check_archive_path
from redrive.repair import CLEAR_EXPIRES, Change, Edit, Repair, body_digest, repair

# Reasons a selected message is left in the DLQ by the edits (keys of MoveResult.skipped).
UNCHANGED = "unchanged-by-edit"
NOT_REPAIRABLE = "not-repairable"
TOO_BIG = "too-big-after-edit"
REPAIR_DIFFERS = "repair-differs-from-plan"
REASONS = (UNCHANGED, NOT_REPAIRABLE, TOO_BIG, CHANGED_SINCE_PLAN, REPAIR_DIFFERS)

SAMPLES_PER_TASK = 1
LISTED = 100
"""How many left messages the result names, each with why."""


@dataclass(frozen=True, slots=True)
class RepairOptions:
    """What a run with edits needs (picklable: ``--processes`` hands it to its children)."""

    edits: tuple[Edit, ...]
    archive_to: str | None = None
    """Where the originals go (a path or ``s3://`` prefix); None only with --no-archive."""
    show_args: bool = False
    """Show argument values in the diff (as elsewhere, they are hidden unless asked)."""
    planned: Mapping[str, tuple[str, str]] | None = None
    """``apply``: MessageId -> (digest before, digest after) of the reviewed plan."""
    suggested: bool = False
    """A dry run's archive that no option named: the one the command it prints names."""
    continues: bool = False
    """The local archive exists, begun by an earlier run of the command (the ledger says):
    this run writes a new part beside it (:func:`redrive.archive.storage.free_part`), which
    a replay of the archive's name reads with it."""

    @property
    def words(self) -> list[str]:
        return [word for edit in self.edits for word in edit.words]

    def with_suggested_archive(self, label: str) -> RepairOptions:
        """A dry run with edits that names no archive: the path its ``--execute`` would
        archive the originals to (purge's default), named in the command the dry run
        prints, so that the command runs as it is."""
        if self.archive_to is not None:
            return self
        now = datetime.fromtimestamp(time.time(), UTC)
        return replace(self, archive_to=default_archive_path(label, now), suggested=True)


def change_text(change: Change, show_args: bool) -> str:
    """One place of the diff: ``kwargs.currency: "USD" → "EUR"``, or with the values hidden
    ``kwargs.currency: … → …`` (a place added or removed still says so)."""
    if show_args:
        return change.text
    before = "(absent)" if repr(change.before) == "ABSENT" else "…"
    after = "(absent)" if repr(change.after) == "ABSENT" else "…"
    return f"{change.path}: {before} → {after}"


@dataclass(slots=True)
class RepairReport:
    """What the edits did to a run's selected messages: changed, or left (and why)."""

    edits: list[str]
    archive: str | None = None
    changed: int = 0
    left: Counter[str] = field(default_factory=Counter)
    details: Counter[str] = field(default_factory=Counter)
    """Why messages were left, in words (``no kwargs.region``), with how many."""
    samples: dict[str, list[list[str]]] = field(default_factory=dict)
    """Task -> a sample's diff (each place's line)."""
    messages: list[dict[str, str]] = field(default_factory=list)
    """The first :data:`LISTED` messages left, each with why."""
    archived: int = 0
    continued: bool = False
    """The archive is a new part beside one an earlier run of the command began."""

    def to_json(self) -> dict[str, Any]:
        return {
            "edits": self.edits,
            "archive": self.archive,
            "archived": self.archived,
            "archive_continued": self.continued,
            "changed": self.changed,
            "unchanged_by_edit": self.left[UNCHANGED],
            "not_repairable": self.left[NOT_REPAIRABLE],
            "too_big": self.left[TOO_BIG],
            "changed_since_plan": self.left[CHANGED_SINCE_PLAN],
            "differs_from_plan": self.left[REPAIR_DIFFERS],
            "reasons": dict(self.details),
            "samples": self.samples,
            "left_messages": self.messages,
        }

    def fates(
        self, *, moved: int, duplicates: int, failed: int, skipped: Mapping[str, int]
    ) -> tuple[int, list[tuple[str, int]]]:
        """What became of the messages the edits changed, from the run's counts: every count
        but the skips decided before the edits (a task no worker registers) or by them.
        Those the counts do not hold were not reached (--limit, or the run stopped first).
        The total is at least what the counts hold (a process that died took its report
        with it). Each fate with its count: ``moved``, ``duplicates``, ``failed``,
        ``skipped:REASON``, ``not reached``."""
        fates = [
            ("moved", moved),
            ("duplicates", duplicates),
            ("failed", failed),
            *(
                (f"skipped:{reason}", n)
                for reason, n in sorted(skipped.items())
                if n and reason not in REASONS and reason != UNREGISTERED
            ),
        ]
        counted = sum(n for _, n in fates)
        total = max(self.changed, counted)
        return total, [*((k, n) for k, n in fates if n), ("not reached", total - counted)]

    def merge(self, other: RepairReport) -> None:
        """Add another process's report (``--processes``)."""
        self.changed += other.changed
        self.archived += other.archived
        self.continued = self.continued or other.continued
        self.left.update(other.left)
        self.details.update(other.details)
        for task, sample in other.samples.items():
            self.samples.setdefault(task, sample)
        self.messages.extend(other.messages[: max(0, LISTED - len(self.messages))])


class RepairStep:
    """A run's edits: screens each selected message and archives originals. Thread-safe."""

    def __init__(self, options: RepairOptions, writer: ArchiveWriter | None = None) -> None:
        self.options = options
        self.writer = writer
        self.report = RepairReport(options.words, options.archive_to)
        self.report.continued = options.continues
        self.clears_expires = CLEAR_EXPIRES in options.edits
        self._lock = threading.Lock()

    def check(self, broker: Broker, message: Delivery, info: TaskInfo) -> tuple[str | None, str]:
        """(why it is left, or None; the body to send)."""
        planned = self.options.planned.get(message.message_id) if self.options.planned else None
        if planned is not None and body_digest(message.body) != planned[0]:
            return self._left(message, info, CHANGED_SINCE_PLAN, "its body is not the planned one")
        try:
            done = repair(message.body, self.options.edits)
        except NotRepairable as exc:
            return self._left(message, info, NOT_REPAIRABLE, str(exc))
        if not done.changed:
            why = "; ".join(o.detail for o in done.outcomes if o.detail) or "nothing to change"
            return self._left(message, info, UNCHANGED, why)
        if planned is not None and done.digest_after != planned[1]:
            return self._left(message, info, REPAIR_DIFFERS, "the edit no longer gives the body")
        limit = max(broker.capabilities.message_size_limits)
        size = SendEntry("0", done.body, attributes.originals(message.headers)).size()
        if size > limit:
            return self._left(message, info, TOO_BIG, f"{size:,} bytes edited, over {limit:,}")
        self._changed(info, done)
        return None, done.body

    def left_changed(self, message: Delivery, info: TaskInfo) -> None:
        """Count a message the run left because it changed since its plan (the digest of
        the whole message said so before the edits were tried)."""
        self._left(message, info, CHANGED_SINCE_PLAN, "the message is not the planned one")

    def _changed(self, info: TaskInfo, done: Repair) -> None:
        with self._lock:
            self.report.changed += 1
            if len(self.report.samples.get(info.task, ())) < SAMPLES_PER_TASK:
                lines = [change_text(c, self.options.show_args) for c in done.diff()]
                self.report.samples.setdefault(info.task, []).append(lines)

    def _left(self, message: Delivery, info: TaskInfo, reason: str, detail: str) -> tuple[str, str]:
        with self._lock:
            report = self.report
            report.left[reason] += 1
            report.details[detail] += 1
            if len(report.messages) < LISTED:
                report.messages.append(
                    {
                        "message_id": message.message_id,
                        "task": info.task,
                        "reason": reason,
                        "detail": detail,
                    }
                )
        return reason, message.body

    def archive(
        self,
        broker: Broker,
        decided: DecidedBatch,
        *,
        run_id: str,
        dlq: str,
        clock: Callable[[], float],
    ) -> None:
        """Write the originals of every copy this batch may delete (the ones to send, their
        further copies, the duplicates), durable before anything is claimed or sent."""
        if self.writer is None:
            return
        now = datetime.fromtimestamp(clock(), UTC)
        records = [
            ArchiveRecord.from_message(
                cand.message,
                kept=broker.capabilities.archived_attributes,
                task=cand.info.task,
                task_id=cand.info.task_id,
                dlq=dlq,
                run_id=run_id,
                archived_at=now,
                # inspect ARCHIVE counts a consumer's receives as the DLQ showed them.
                redrive_receives=cand.message.redrive_receives or None,
            )
            for cand in _deletable(decided)
        ]
        if records:
            with self._lock:
                self.writer.write_batch(records)
                self.report.archived += len(records)


def _deletable(decided: DecidedBatch) -> Iterable[Candidate]:
    yield from decided.to_send
    yield from (cand for cand, _ in decided.takeovers)
    for followers in decided.followers.values():
        yield from followers
    yield from (cand for cand, _ in decided.duplicates)


def planned_digests(cand: Candidate) -> dict[str, str]:
    """What a plan records of an edited item: its body's digests before and after."""
    if cand.body is None:
        return {}
    return {
        "digest_before": body_digest(cand.message.body),
        "digest_after": body_digest(cand.body),
    }


@contextlib.contextmanager
def repair_step(
    options: RepairOptions | None,
    *,
    execute: bool,
    s3_client_factory: Callable[[], Any] | None = None,
    part: int | None = None,
) -> Iterator[RepairStep | None]:
    """The run's repair step, its archive open while the run lasts (an executed run with an
    archive: ``part``, a process's own beside it, as purge's); an archive that holds no
    message is removed (it is no evidence, and would block a rerun naming the same path)."""
    if options is None:
        yield None
        return
    where = options.archive_to
    if where is not None and part is not None:
        where = archive_part(where, part)
    if not execute or where is None:
        yield RepairStep(options)
        return
    writer, where = _open_archive(where, options, s3_client_factory)
    step = RepairStep(options, writer)
    step.report.archive = where
    try:
        yield step
    finally:
        writer.close()
        if not step.report.archived and "://" not in where:
            with contextlib.suppress(OSError):
                Path(where).expanduser().unlink()
            step.report.archive = None


def _open_archive(
    where: str, options: RepairOptions, s3_client_factory: Callable[[], Any] | None
) -> tuple[ArchiveWriter, str]:
    """The run's archive writer, and where it writes: ``where``, or when the run continues
    an earlier run's archive (``options.continues``), the first free part beside the
    archive named (each process of a rerun takes its own: a part taken meanwhile by a
    sibling is passed over)."""
    if not options.continues or "://" in where or options.archive_to is None:
        return open_writer(where, s3_client_factory=s3_client_factory), where
    for _ in range(64):
        part = free_part(options.archive_to)
        try:
            return open_writer(part, s3_client_factory=s3_client_factory), part
        except ArchiveError:
            if not os.path.lexists(os.path.expanduser(part)):
                raise
    raise ArchiveError(f"no free part beside archive {options.archive_to}; choose another path")


def continued_archive(repair: RepairOptions, ledger: Ledger | None) -> RepairOptions:
    """The edits' archive as this run writes it: a local archive that exists is continued
    (a new part beside it) when a run in the ledger wrote it, as the rerun of a killed
    edited move does; refused otherwise, as ever (archives are never overwritten). The dry
    run says so where the execute would fail."""
    where = repair.archive_to
    if where is None or "://" in where or not _archive_begun(where):
        if where is not None:
            check_archive_path(where)
        return repair
    if ledger is not None and _archive_of_a_run(ledger, where):
        return replace(repair, continues=True)
    check_archive_path(where)
    return repair


def _archive_begun(where: str) -> bool:
    """Whether the local archive exists: the file, or the parts a --processes run wrote."""
    path = os.path.expanduser(where)
    return os.path.lexists(path) or bool(archive_parts(path))


def _archive_of_a_run(ledger: Ledger, where: str) -> bool:
    """Whether a run in the ledger wrote its originals to archive ``where``."""
    location = absolute_location(where)
    return any(run.info.get("archive") == location for run in ledger.runs())
