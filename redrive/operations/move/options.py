"""What configures a move run: its options (:class:`MoveOptions`), the policies they name,
and where its messages come from (:class:`MessageSource`)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from redrive.broker.base import Broker, Delivery, QueueRef
from redrive.celery.knowledge import TaskKnowledge
from redrive.celery.results import ResultLookup
from redrive.operations.move.repair_step import RepairOptions
from redrive.operations.move.returns import DEFAULT_RETURNS_LIMIT, ReturnsLimit
from redrive.operations.verdict import DecisionOptions
from redrive.selection import Selection

InDoubtPolicy = Literal["hold", "resend", "skip", "auto"]
IN_DOUBT_POLICIES: tuple[InDoubtPolicy, ...] = ("hold", "resend", "skip", "auto")
AmbiguousPolicy = Literal["hold", "move"]
AMBIGUOUS_POLICIES: tuple[AmbiguousPolicy, ...] = ("hold", "move")
DEFAULT_LEASE = 30
DEFAULT_MAX_REDRIVES = 3


class MessageSource(Protocol):
    """Where the engine's messages come from: a DLQ scan, or an archive being replayed."""

    deletes: bool
    """Whether copies are deleted from the source once sent (a DLQ: yes; an archive: no)."""
    stop: threading.Event

    def next_batch(self, broker: Broker) -> list[Delivery] | None: ...

    def keep(self, broker: Broker, messages: Sequence[Delivery]) -> None: ...

    def extend(self, broker: Broker, messages: Sequence[Delivery], seconds: int) -> None: ...

    def stop_receiving(self) -> None: ...

    def forget(self, messages: Sequence[Delivery]) -> None: ...

    def release_all(self, broker: Broker) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class MoveOptions:
    selection: Selection = field(default_factory=Selection)
    execute: bool = False
    to: QueueRef | None = None
    include_expired: bool = False
    max_redrives: int = DEFAULT_MAX_REDRIVES
    in_doubt: InDoubtPolicy = "hold"
    lease: int = DEFAULT_LEASE
    workers: int = 1
    rate: float | None = None
    include_unknown: bool = False
    """Also send bodies that are not Celery tasks to a Celery queue."""
    to_celery_queue: bool = True
    """Whether ``to`` is a queue Celery workers consume (a family's queue). Without ``to``
    every message goes back to its source: the family's Celery queue."""
    ambiguous: AmbiguousPolicy = "hold"
    """What to do with a message that shares the key of a task already sent when nothing
    tells a copy from a second publish (see :func:`redrive.keys.copy_verdict`)."""
    pipelined: bool | Literal["auto"] = "auto"
    """Receive and decide the next batch while this one is sent: ``True`` always, ``False``
    never (one stage, batch after batch, as a FIFO DLQ always goes), ``"auto"`` once the
    first stage's waiting for SQS and the ledger is worth overlapping (see
    :func:`redrive.operations.move.stages.overlap_pays`)."""
    celery: TaskKnowledge | None = None
    """Where each task routes to now and which tasks the app registers (redrive.celery)."""
    results: ResultLookup | None = None
    """Celery's result backend: a task whose record is SUCCESS is skipped
    (``already-succeeded``; see :mod:`redrive.celery.results`)."""
    include_succeeded: bool = False
    """Send such tasks all the same (and do not consult the backend)."""
    stop_after_returns: ReturnsLimit = DEFAULT_RETURNS_LIMIT
    """When to stop receiving for the moved tasks that came back failed during the run
    (:mod:`redrive.operations.move.returns`)."""
    repair: RepairOptions | None = None
    """Edits of each task on its way back, and where the originals are archived (issue 26;
    see :mod:`redrive.operations.move.repair_step`)."""
    planned_digests: Mapping[str, str] | None = None
    """``apply``: MessageId -> the digest its plan recorded; a message whose digest differs
    is left in the DLQ (``changed-since-plan``; :mod:`redrive.operations.plan`)."""


def decision_options(options: MoveOptions) -> DecisionOptions:
    """What :mod:`redrive.operations.verdict` needs of a run's options."""
    return DecisionOptions(
        include_expired=options.include_expired,
        include_unknown=options.include_unknown,
        # Non-Celery bodies are kept out of Celery queues: every message's own source is
        # one, and so is a --to that names a family's queue.
        to_celery=options.to is None or options.to_celery_queue,
        max_redrives=options.max_redrives,
        in_doubt=options.in_doubt,
    )
