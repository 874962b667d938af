"""Replay archived messages to any queue.

Replay runs the move engine with an archive as its source: the same idempotency keys,
ledger states and in-doubt handling, so replaying an archive twice sends nothing the second
time, and a message the engine already moved back (its key is done) is not sent again.

An archive is read twice: first whole, counting records and looking for damage, then for
the engine. A damaged archive is refused before anything is sent (unless ``allow_partial``),
so a replay never stops halfway through because of what it finds in its archive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from redrive.archive import (
    ArchiveCheck,
    ArchiveDamaged,
    ArchiveReader,
    ArchiveRecord,
    DamageReport,
    archive_label,
    as_message,
    check_archive,
)
from redrive.broker.base import Broker, Delivery, DlqTarget, QueueRef
from redrive.errors import RedriveError
from redrive.ledger import Ledger
from redrive.operations.move import MoveEngine, MoveOptions, MoveResult
from redrive.operations.move.repair_step import RepairStep
from redrive.runs.lifecycle import RunRecord
from redrive.runs.observer import NULL_OBSERVER, RunObserver


class ArchiveSource:
    """Archive records as the engine's batches of messages; nothing to hide or delete."""

    deletes = False

    def __init__(self, records: Iterator[ArchiveRecord], stop: threading.Event) -> None:
        self._records = records
        self._lock = threading.Lock()
        self._done = False
        self.stop = stop
        self.read = 0
        self.damage: DamageReport | None = None

    def next_batch(self, broker: Broker) -> list[Delivery] | None:
        with self._lock:
            if self._done or self.stop.is_set():
                return None
            batch = []
            try:
                for record in self._records:
                    batch.append(as_message(record, broker))
                    if len(batch) == broker.capabilities.batch_size:
                        break
            except ArchiveDamaged as exc:
                # Damaged since the check (it is being changed?): send nothing more.
                self.damage = exc.report
                self._done = True
                return None
            self.read += len(batch)
            if not batch:
                self._done = True
                return None
            return batch

    def keep(self, broker: Broker, messages: Sequence[Delivery]) -> None:
        pass

    def extend(self, broker: Broker, messages: Sequence[Delivery], seconds: int) -> None:
        pass

    def forget(self, messages: Sequence[Delivery]) -> None:
        """Nothing is remembered of an archive's records."""

    def stop_receiving(self) -> None:
        with self._lock:
            self._done = True

    def release_all(self, broker: Broker) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(slots=True)
class ReplayResult:
    """What a replay did, and the damage it replayed around (only with ``allow_partial``)."""

    move: MoveResult
    damage: DamageReport | None = None

    @property
    def dry_run(self) -> bool:
        return self.move.dry_run

    @property
    def interrupted(self) -> bool:
        return self.move.interrupted

    @property
    def needs_attention(self) -> bool:
        return self.move.needs_attention

    @property
    def acted(self) -> bool:
        return self.move.acted

    def to_json(self) -> dict[str, Any]:
        """The engine's JSON, in the words of a replay: ``replayed``, ``already_sent``,
        ``archive``, ``damaged``."""
        data = self.move.to_json()
        data = {"replayed": data["moved"], **data}
        # Replaying twice: what was already sent counts as skipped (there is nothing to
        # delete). A dry run too knows what was already sent: it is a fact, not a plan.
        data.pop("duplicates_deleted")
        data.pop("duplicates_to_delete", None)
        data["already_sent"] = self.move.duplicates
        data["skipped"] += data["already_sent"]
        data["archive"] = data.pop("target")
        data.pop("dlq", None)
        data["damaged"] = self.damage.to_json() if self.damage is not None else None
        return data


def replay_archive(
    source: str,
    to: QueueRef | None,
    ledger: Ledger | None,
    options: MoveOptions,
    *,
    broker_factory: Callable[[], Broker],
    s3_client_factory: Callable[[], Any] | None = None,
    observer: RunObserver[MoveResult] = NULL_OBSERVER,
    stop: threading.Event | None = None,
    record: RunRecord | None = None,
    allow_partial: bool = False,
) -> ReplayResult:
    """Send every selected archived message to ``to`` (None: where each task's route names,
    ``options.celery``), byte-identical, each task once.

    The whole archive is checked first (``observer.on_check`` hears the records read so far,
    ``on_problem`` what is damaged): a damaged one raises :class:`ArchiveDamaged` before
    anything is sent, unless ``allow_partial``, which replays the records that read cleanly
    and returns the damage.
    """
    stop = stop or threading.Event()
    check = check_whole_archive(source, s3_client_factory, observer, stop, allow_partial)
    if check is None:
        return stopped_replay(source, options)
    # Problems were reported by the check; damage is skipped only when allowed.
    reader = ArchiveReader(
        source,
        s3_client_factory=s3_client_factory,
        on_problem=lambda problem: None,
        skip_damage=allow_partial,
    )
    archive = ArchiveSource(iter(reader), stop)
    engine = MoveEngine(
        archive_target(source),
        ledger,
        replace(options, to=to),
        broker_factory=broker_factory,
        observer=observer,
        stop=stop,
        source=archive,
        record=record or RunRecord("replay"),
        # Edits (issue 26): the archive replayed is the originals' copy already.
        repair=RepairStep(options.repair) if options.repair is not None else None,
    )
    try:
        result = engine.run()
    except RedriveError as exc:
        if isinstance(exc.partial, MoveResult):
            damage = archive.damage or check.damage or reader.report()
            exc.partial = ReplayResult(exc.partial, damage)
        raise
    return ReplayResult(result, archive.damage or check.damage or reader.report())


def check_whole_archive(
    source: str,
    s3_client_factory: Callable[[], Any] | None,
    observer: RunObserver[MoveResult],
    stop: threading.Event,
    allow_partial: bool,
) -> ArchiveCheck | None:
    """A replay's first step, before anything is sent: the whole archive checked (its
    progress and problems to ``observer``); None when ``stop`` ended the check early. Damage
    raises :class:`ArchiveDamaged`, unless ``allow_partial``."""
    check = check_archive(
        source,
        s3_client_factory=s3_client_factory,
        on_problem=observer.on_problem,
        stop=stop,
        on_progress=observer.on_check,
    )
    if not check.complete:
        return None
    if check.damage is not None and not allow_partial:
        raise ArchiveDamaged(check.damage)
    return check


def stopped_replay(source: str, options: MoveOptions) -> ReplayResult:
    """A replay stopped while it checked its archive: nothing sent."""
    label = archive_label(source)
    return ReplayResult(
        MoveResult(dry_run=not options.execute, target=label, dlq=source, interrupted=True)
    )


def archive_target(source: str) -> DlqTarget:
    """The engine's target for an archive: the archive stands where a DLQ would."""
    label = archive_label(source)
    return DlqTarget(
        label=label,
        family=None,
        dlq=QueueRef(url=source, name=label, ident="", fifo=False),
        sources=(),
    )
