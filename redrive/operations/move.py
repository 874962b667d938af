"""Move: send dead-lettered messages back, each task once, and delete a DLQ copy only after
its send is confirmed.

Per batch of received messages (every step is a point a crash may hit; see the tests):

1. **receive** a batch with a short lease (the visibility timeout);
2. decide per message: not selected, expired, poison, no target, not a Celery task,
   duplicate (a copy of a task sent) or a second publish of its task id (see
   :func:`redrive.keys.copy_verdict`), in doubt...;
3. **claim** the keys to send in the ledger (durable before anything is sent);
4. **send** them (SendMessageBatch, one batch per target, the 256 KiB limit respected);
5. **record** the confirmed ones as SENT, release the claims of the failed ones;
6. **delete** the DLQ copies of what was sent (and of duplicates of what was sent before);
7. record the deleted keys as DONE.

A crash between 3 and 5 leaves keys CLAIMED by a dead run: *in doubt*, reported by the next
run and resolved only by the operator (``--in-doubt resend|skip``). A crash anywhere else is
harmless: the next run finds SENT keys and only deletes, or finds nothing and starts over.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

from redrive import attributes
from redrive.broker.base import (
    Broker,
    Capabilities,
    Delivery,
    DlqTarget,
    QueueRef,
    SendEntry,
    queue_name,
    split_batches,
)
from redrive.celery.knowledge import NoTarget, TaskKnowledge, skip_reason
from redrive.celery.results import (
    ALREADY_SUCCEEDED,
    ResultLookup,
    delivered_after_claim,
    succeeded_ids,
)
from redrive.dlq.receive_log import ReceiveLog
from redrive.dlq.scan import DlqScan, digest, run_pipelines
from redrive.durations import iso_utc
from redrive.errors import QueueNotFound, RedriveError, UsageProblem
from redrive.keys import Verdict as CopyVerdict
from redrive.keys import copy_verdict, key_for, legacy_key_for
from redrive.ledger import Claim, Entry, KeyState, Ledger
from redrive.messages import UNKNOWN_TASK, TaskInfo, decode
from redrive.operations.limit import Limit
from redrive.operations.observer import NULL_OBSERVER, PlanItem, RunObserver
from redrive.operations.run import Outcome, RunLifecycle, RunRecord, run_is_live
from redrive.operations.seen import SeenByFilters
from redrive.operations.shared import LimitLike, PlannedLike, RateLike, RunShares
from redrive.operations.verdict import (  # noqa: F401  (the skip reasons, for callers)
    AMBIGUOUS,
    BUSY,
    EXPIRED,
    IN_DOUBT,
    NO_TARGET,
    NOT_CELERY,
    POISON,
    RESOLVED_SKIP,
    DecisionOptions,
    EntryFacts,
    Fate,
    MessageFacts,
    RunFacts,
    Verdict,
    decide,
    screen,
)
from redrive.operations.waiting import BlockedClock
from redrive.rate import RateLimiter
from redrive.selection import FilterMisses, Selection, Sightings

InDoubtPolicy = Literal["hold", "resend", "skip", "auto"]
IN_DOUBT_POLICIES: tuple[InDoubtPolicy, ...] = ("hold", "resend", "skip", "auto")
AmbiguousPolicy = Literal["hold", "move"]
AMBIGUOUS_POLICIES: tuple[AmbiguousPolicy, ...] = ("hold", "move")
DEFAULT_LEASE = 30
DEFAULT_MAX_REDRIVES = 3
MAX_LISTED = 100
# Delivery sizes (bytes, body plus attributes) queues accept: SQS's old maximum, which many
# queues still set as MaximumMessageSize, and its current one.

# Names of the points between steps, where tests inject crashes.
STEPS = ("received", "claimed", "sent", "recorded", "deleted")
#: A worker's first stage (receive and decide) waiting at least this long per batch, off the
#: CPU, is worth overlapping with the second (claim, send, delete): see overlap_pays.
OVERLAP_MIN_WAIT = 0.001
#: Batches of one stage whose waits overlap_pays looks at (their median).
OVERLAP_SAMPLE = 5


def overlap_pays(waits: Sequence[float]) -> bool:
    """Whether a worker should receive and decide its next batch in a second thread, given
    how long its first stage was blocked in its last batches, in seconds: neither on a CPU
    nor waiting for one (:class:`redrive.operations.waiting.BlockedClock`; a busy machine's
    queue for a CPU is no wait a second thread could use). Yes once the median of the last
    :data:`OVERLAP_SAMPLE` is at least :data:`OVERLAP_MIN_WAIT`.

    Against a network each receive waits a round trip (milliseconds): overlapping it with
    the send and delete of the batch before is what makes a worker faster than the loop
    that does one after the other. Against an endpoint that answers in a fraction of a
    millisecond (loopback) there is no waiting to hide, and the two threads only cost CPU:
    about 60 µs a message in handing the GIL to each other (``bench/move.py``)."""
    recent = sorted(list(waits)[-OVERLAP_SAMPLE:])
    return len(recent) == OVERLAP_SAMPLE and recent[len(recent) // 2] >= OVERLAP_MIN_WAIT


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
    :func:`overlap_pays`)."""
    celery: TaskKnowledge | None = None
    """Where each task routes to now and which tasks the app registers (redrive.celery)."""
    results: ResultLookup | None = None
    """Celery's result backend: a task whose record is SUCCESS is skipped
    (``already-succeeded``; see :mod:`redrive.celery.results`)."""
    include_succeeded: bool = False
    """Send such tasks all the same (and do not consult the backend)."""


@dataclass(frozen=True, slots=True)
class Listed:
    """One message named in the result (in doubt, or failed)."""

    task: str
    task_id: str | None
    message_id: str
    key: str
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "task_id": self.task_id,
            "message_id": self.message_id,
            "key": self.key,
            "detail": self.detail,
        }


def listed_json(name: str, count: int, listing: Sequence[object]) -> dict[str, Any]:
    """How much of a capped list (at most :data:`MAX_LISTED`) the JSON holds: ``NAME_listed``
    (its length) and ``NAME_truncated`` (whether ``count``, NAME's total, is more)."""
    return {f"{name}_listed": len(listing), f"{name}_truncated": count > len(listing)}


@dataclass(slots=True)
class TaskCounts:
    matched: int = 0
    moved: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    failed: int = 0
    duplicates: int = 0
    targets: Counter[str] = field(default_factory=Counter)
    rerouted: Counter[str] = field(default_factory=Counter)
    """Source queue -> messages sent elsewhere than their source by their task's route."""

    def sent_to(self, target: str, source: str | None) -> None:
        self.targets[target] += 1
        if source is not None and source != target:
            self.rerouted[source] += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "matched": self.matched,
            "moved": self.moved,
            "skipped": dict(self.skipped),
            "failed": self.failed,
            "duplicates_deleted": self.duplicates,
            "targets": dict(self.targets),
            "routed_from": dict(self.rerouted),
        }


@dataclass(slots=True)
class MoveResult:
    dry_run: bool
    target: str
    dlq: str
    run_id: str | None = None
    ledger: str | None = None
    scanned: int = 0
    matched: int = 0
    moved: int = 0
    failed: int = 0
    in_doubt: int = 0
    died_in_doubt: int = 0
    """Of ``in_doubt``: the claims a process of this run (``--processes``) left unconfirmed
    when it died; the others were left by earlier runs."""
    duplicates: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    tasks: dict[str, TaskCounts] = field(default_factory=dict)
    in_doubt_messages: list[Listed] = field(default_factory=list)
    failed_messages: list[Listed] = field(default_factory=list)
    ambiguous_messages: list[Listed] = field(default_factory=list)
    no_target_reason: str | None = None
    """Why messages had no single target (the DLQ's source queues, and what SQS said)."""
    no_target_candidates: list[str] = field(default_factory=list)
    no_target_missing: str | None = None
    """A queue named for them that does not exist (creating it is a way)."""
    no_target_by_route: bool = False
    """A task route or a plan named where they go (``--route source`` is a way)."""
    misses: FilterMisses | None = None
    """A --task or --message-id filter that matched nothing: what the scan saw instead."""
    interrupted: bool = False
    error: str | None = None
    still_hidden: int = 0
    hidden_until: float | None = None
    seconds: float = 0.0
    throttled: int = 0
    depth_before: int | None = None
    """SQS's count of visible messages in the DLQ when the run started (for progress)."""
    redelivered: int = 0
    """Copies SQS delivered again after the run deleted their message: deleted once more."""

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    @property
    def by_task(self) -> dict[str, int]:
        """Messages moved (or, in a dry run, that would move) per task."""
        return {task: c.moved for task, c in sorted(self.tasks.items()) if c.moved}

    @property
    def ambiguous(self) -> int:
        return self.skipped[AMBIGUOUS]

    @property
    def needs_attention(self) -> bool:
        return bool(self.failed or self.in_doubt or self.ambiguous)

    @property
    def acted(self) -> bool:
        """Whether the run got anywhere (a summary of it says something): a message sent,
        deleted, skipped, failed or left in doubt. Not ``scanned``, which counts a batch as it
        is received: a first send refused has received its batch and done nothing."""
        return bool(
            self.moved or self.duplicates or self.skipped_total or self.failed or self.in_doubt
        )

    def run_counts(self) -> dict[str, int]:
        """What the ledger records at the run's end (the audit trail's counts)."""
        return {
            "matched": self.matched,
            "moved": self.moved,
            "skipped": self.skipped_total,
            "failed": self.failed,
            "in_doubt": self.in_doubt,
            "duplicates_deleted": self.duplicates,
        }

    def task(self, name: str) -> TaskCounts:
        counts = self.tasks.get(name)
        if counts is None:
            counts = self.tasks[name] = TaskCounts()
        return counts

    def to_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "target": self.target,
            "dlq": self.dlq,
            "run_id": self.run_id,
            "ledger": self.ledger,
            "scanned": self.scanned,
            "matched": self.matched,
            "moved": self.moved,
            "skipped": self.skipped_total,
            "skipped_by_reason": dict(self.skipped),
            "failed": self.failed,
            "in_doubt": self.in_doubt,
            # A dry run deletes nothing: it says what it would delete under its own name.
            "duplicates_deleted": 0 if self.dry_run else self.duplicates,
            **({"duplicates_to_delete": self.duplicates} if self.dry_run else {}),
            "by_task": self.by_task,
            "tasks": {task: c.to_json() for task, c in sorted(self.tasks.items())},
            "in_doubt_messages": [m.to_json() for m in self.in_doubt_messages],
            **listed_json("in_doubt", self.in_doubt, self.in_doubt_messages),
            "failed_messages": [m.to_json() for m in self.failed_messages],
            **listed_json("failed", self.failed, self.failed_messages),
            "ambiguous": self.ambiguous,
            "ambiguous_messages": [m.to_json() for m in self.ambiguous_messages],
            **listed_json("ambiguous", self.ambiguous, self.ambiguous_messages),
            "no_target": (
                {"reason": self.no_target_reason, "candidates": self.no_target_candidates}
                if self.skipped[NO_TARGET]
                else None
            ),
            "filter_misses": self.misses.to_json() if self.misses is not None else None,
            "interrupted": self.interrupted,
            "error": self.error,
            "still_hidden": self.still_hidden,
            "hidden_until": (
                datetime.fromtimestamp(self.hidden_until, UTC).isoformat(timespec="seconds")
                if self.hidden_until
                else None
            ),
            "seconds": round(self.seconds, 3),
            "redelivered": self.redelivered,
        }


@dataclass(slots=True)
class _Candidate:
    """A selected message on its way: its key, where it goes and how it goes there."""

    message: Delivery
    info: TaskInfo
    key: str
    generation: int
    target: QueueRef
    namespace: str
    """The broker's key namespace (``Capabilities.key_namespace``)."""
    legacy_key: str | None = None
    """Its key in the form before keys named the publish, when the ledger may hold those."""
    held: str | None = None
    """Why it is held as an ambiguous copy (it shares a key, and nothing tells a copy of
    that task from a second publish)."""

    @property
    def tagged(self) -> bool:
        return self.info.delivery_tag is not None

    def rekey(self, *, by_message: bool = False) -> None:
        self.key = key_for(
            self.info,
            message_id=self.message.message_id,
            generation=self.generation,
            body=self.message.body,
            namespace=self.namespace,
            by_message=by_message,
        )
        if self.legacy_key is not None:
            self.legacy_key = legacy_key_for(
                self.info,
                message_id=self.message.message_id,
                generation=self.generation,
                namespace=self.namespace,
            )


@dataclass(slots=True)
class _Decided:
    """A batch decided on and not yet claimed: what each message is to become."""

    batch: Sequence[Delivery]
    received_at: float
    keep: list[Delivery]
    to_send: list[_Candidate] = field(default_factory=list)
    takeovers: list[tuple[_Candidate, str]] = field(default_factory=list)
    duplicates: list[tuple[_Candidate, str]] = field(default_factory=list)  # (copy, key sent)
    followers: dict[str, list[_Candidate]] = field(default_factory=dict)
    """Key -> further copies of that key in this batch: they follow the first copy."""
    resolve_skip: list[tuple[_Candidate, str]] = field(default_factory=list)
    proven: list[tuple[_Candidate, str]] = field(default_factory=list)
    """In doubt, and proven delivered by the result backend (--in-doubt auto): (copy, the
    dead run that claimed it); also in ``duplicates``, to be deleted."""

    def add(self, cand: _Candidate, verdict: Verdict, entry: Entry | None) -> None:
        """Put a candidate where its verdict says."""
        fate = verdict.fate
        if fate is Fate.FOLLOWER:
            self.followers[cand.key].append(cand)
        elif fate is Fate.SEND:
            self.followers[cand.key] = []
            self.to_send.append(cand)
        elif fate is Fate.TAKEOVER and entry is not None:
            self.followers[cand.key] = []
            self.takeovers.append((cand, entry.run_id))
        elif fate is Fate.DUPLICATE and entry is not None:
            self.duplicates.append((cand, entry.key))
        elif fate is Fate.PROVEN and entry is not None:
            self.duplicates.append((cand, entry.key))
            self.proven.append((cand, entry.run_id))
        elif fate is Fate.RESOLVE_SKIP and entry is not None:
            self.resolve_skip.append((cand, entry.run_id))
            self.keep.append(cand.message)
        else:
            self.keep.append(cand.message)


@dataclass(slots=True)
class ClaimOutcome:
    claimed: list[_Candidate] = field(default_factory=list)
    lost: list[_Candidate] = field(default_factory=list)
    """Claimed by another run between the read and the claim (or taken over first)."""


@dataclass(slots=True)
class SendOutcome:
    sent: list[tuple[_Candidate, str]] = field(default_factory=list)
    """Confirmed, with the MessageId SQS gave the copy."""
    refused: list[tuple[_Candidate, str]] = field(default_factory=list)
    """Refused by SQS, with its error: the claim is given back."""
    unconfirmed: list[_Candidate] = field(default_factory=list)
    """Named in neither list of SQS's answer: may have been queued, so in doubt."""


@dataclass(slots=True)
class DeleteOutcome:
    done: set[str] = field(default_factory=set)
    """Keys whose DLQ copies are all gone."""
    kept: list[Delivery] = field(default_factory=list)
    """Copies not deleted: kept hidden, found again by the next run."""


class _PlannedKeys:
    """A dry run's keys it "would claim": a second copy is then a duplicate. Digests, not
    keys: a dry run of a million messages must not hold a million strings."""

    def __init__(self) -> None:
        self._digests: set[int] = set()
        self._lock = threading.Lock()

    def add(self, key: str) -> bool:
        """Plan ``key``; False when it was planned already (the dry run's lost claim)."""
        seen = digest(key)
        with self._lock:
            if seen in self._digests:
                return False
            self._digests.add(seen)
            return True

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str) or not self._digests:  # an executed run plans nothing
            return False
        with self._lock:
            return digest(key) in self._digests


class MoveTally:
    """The run's counts, its MoveResult: changed only here, under the tally's own lock (the
    workers share it)."""

    def __init__(
        self,
        result: MoveResult,
        seen: SeenByFilters,
        source_of: Callable[[Delivery], str | None],
    ) -> None:
        self.result = result
        self.seen = seen
        self._source_of = source_of
        """The queue a message came from (its target may be another: a task's route)."""
        self._lock = threading.Lock()

    def decided(
        self, info: TaskInfo, verdict: Verdict, message_id: str = "", key: str = ""
    ) -> None:
        """Count a message as its verdict says, as soon as it is decided."""
        if not verdict.matched:
            return
        with self._lock:
            self._matched(info)
            reason = verdict.skip_reason
            if reason is not None:
                self._skip(info.task, reason)
            if verdict.fate is Fate.IN_DOUBT:
                self.result.in_doubt += 1
                listing = self.result.in_doubt_messages
                _add_listed(
                    listing, Listed(info.task, info.task_id, message_id, key, verdict.detail)
                )
            elif verdict.fate is Fate.AMBIGUOUS:
                listing = self.result.ambiguous_messages
                _add_listed(
                    listing, Listed(info.task, info.task_id, message_id, key, verdict.detail)
                )
            elif verdict.fate is Fate.PLANNED_DUPLICATE:
                self._duplicate(info)

    def matched(self, info: TaskInfo) -> None:
        with self._lock:
            self._matched(info)

    def skipped(self, info: TaskInfo, reason: str) -> None:
        with self._lock:
            self._skip(info.task, reason)

    def duplicate(self, info: TaskInfo, *, matched: bool = False) -> None:
        with self._lock:
            if matched:
                self._matched(info)
            self._duplicate(info)

    def in_doubt(self, listed: Listed) -> None:
        with self._lock:
            self.result.in_doubt += 1
            self._skip(listed.task, IN_DOUBT)
            _add_listed(self.result.in_doubt_messages, listed)

    def moved(self, cand: _Candidate) -> None:
        with self._lock:
            self._moved(cand)

    def sent(self, outcome: SendOutcome, listed: Callable[[_Candidate, str], Listed]) -> None:
        with self._lock:
            for cand, _ in outcome.sent:
                self._moved(cand)
            for cand, error in outcome.refused:
                self.result.failed += 1
                self.result.task(cand.info.task).failed += 1
                _add_listed(self.result.failed_messages, listed(cand, error))

    def scanned(self, n: int) -> None:
        with self._lock:
            self.result.scanned += n

    def snapshot(self) -> MoveResult:
        """The counts as they stand, taken under the lock: what a progress line reads, so
        that it never catches one worker's matches without its batch's scan (issue 22)."""
        with self._lock:
            return replace(self.result)

    def no_target(self, problem: NoTarget) -> None:
        """Why messages had no single target (the first reason found is kept)."""
        with self._lock:
            if self.result.no_target_reason is None:
                self.result.no_target_reason = problem.reason
                self.result.no_target_candidates = list(problem.candidates)
                self.result.no_target_missing = problem.missing
                self.result.no_target_by_route = problem.by_route

    # -- callers hold self._lock -------------------------------------------------------

    def _matched(self, info: TaskInfo) -> None:
        self.result.matched += 1
        self.result.task(info.task).matched += 1

    def _skip(self, task: str, reason: str) -> None:
        self.result.skipped[reason] += 1
        self.result.task(task).skipped[reason] += 1

    def _duplicate(self, info: TaskInfo) -> None:
        self.result.duplicates += 1
        self.result.task(info.task).duplicates += 1

    def _moved(self, cand: _Candidate) -> None:
        counts = self.result.task(cand.info.task)
        counts.moved += 1
        counts.sent_to(cand.target.name, self._source_of(cand.message))
        self.result.moved += 1


def _add_listed(listing: list[Listed], listed: Listed) -> None:
    if len(listing) < MAX_LISTED:
        listing.append(listed)


@dataclass(frozen=True, slots=True)
class _Raised:
    error: BaseException


class _Prefetch:
    """The first stage of a worker: ``produce`` runs in a thread of its own, at most one
    result ahead of the consumer. ``None`` ends the stream; what ``produce`` raises is
    raised by :meth:`get`."""

    def __init__(self, produce: Callable[[], _Decided | None]) -> None:
        self._produce = produce
        self._queue: queue.Queue[_Decided | _Raised | None] = queue.Queue(maxsize=1)
        # Taken before producing, given back by get(): one batch decided ahead, never two
        # (an interrupt then finishes at most that one more).
        self._slot = threading.Semaphore(1)
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redrive-receive", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._halt.is_set():
                if not self._slot.acquire(timeout=0.1):
                    continue
                item = self._produce()
                self._put(item)
                if item is None:
                    return
        except BaseException as exc:
            self._put(_Raised(exc))

    def _put(self, item: _Decided | _Raised | None) -> None:
        while not self._halt.is_set():
            with contextlib.suppress(queue.Full):
                self._queue.put(item, timeout=0.1)
                return

    def get(self) -> _Decided | None:
        item = self._queue.get()
        self._slot.release()
        if isinstance(item, _Raised):
            raise item.error
        return item

    def close(self) -> list[_Decided]:
        """Stop the thread; return what it decided that nobody took."""
        self._halt.set()
        left: list[_Decided] = []
        while self._thread.is_alive() or not self._queue.empty():
            with contextlib.suppress(queue.Empty):
                item = self._queue.get(timeout=0.1)
                if isinstance(item, _Decided):
                    left.append(item)
        return left


class MoveEngine:
    """One move run. Thread-safe: ``--workers`` threads share it, each with its own Broker."""

    def __init__(
        self,
        target: DlqTarget,
        ledger: Ledger | None,
        options: MoveOptions,
        *,
        broker_factory: Callable[[], Broker],
        observer: RunObserver[MoveResult] = NULL_OBSERVER,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.time,
        source: MessageSource | None = None,
        record: RunRecord | None = None,
        receive_log: ReceiveLog | None = None,
        shares: RunShares | None = None,
    ) -> None:
        """``source``: where the messages come from (default: a scan of the target's DLQ);
        ``record``: what the run's ledger record says of it (its command line, who, what);
        ``receive_log``: where the DLQ scan counts redrive's own receives; ``shares``: the
        limit, rate and dry-run keys this run shares with other processes (``--processes``,
        redrive.operations.shared), else its own."""
        if options.execute and ledger is None:
            raise UsageProblem("an executed move needs a ledger")
        self.target = target
        self.ledger = ledger
        self.options = options
        self.broker_factory = broker_factory
        self.observer = observer
        self.stop = stop or threading.Event()
        self.now = clock
        self.source = source
        self.receive_log = receive_log
        record = record or RunRecord("move")
        self._life = self._lifecycle(record, clock)
        self.run_id = self._life.run_id
        parent = record.info.get("parent")
        self._parent = parent if isinstance(parent, str) and self.run_id else None
        self.result = self._empty_result()
        self._tally = MoveTally(self.result, SeenByFilters(options.selection), self._source_name)
        self._wire_shares(shares)
        self._open_caches()
        self._decision_options = _decision_options(options)
        self._run_open, self._run_full = RunFacts(self.run_id), RunFacts(self.run_id, True)
        self.limits: Capabilities | None = None
        """The broker's limits, from the first broker the run uses."""

    @property
    def _limits(self) -> Capabilities:
        assert self.limits is not None, "the run has not used its broker yet"
        return self.limits

    def _know(self, broker: Broker) -> None:
        if self.limits is None:
            self.limits = broker.capabilities

    def _lifecycle(self, record: RunRecord, clock: Callable[[], float]) -> RunLifecycle:
        """The run as the ledger records it: target, DLQ and filters, with ``record``'s say."""
        info = {"target": self.target.label, "dlq": self.target.dlq.url}
        return RunLifecycle(
            self.ledger,
            execute=self.options.execute,
            command=record.command,
            info={**info, "filters": self.options.selection.describe(), **record.info},
            lease=self.options.lease,
            stop=self.stop,
            clock=clock,
            counts=self._counts,
            run_id=record.run_id,
        )

    def _empty_result(self) -> MoveResult:
        ledger = self.ledger
        return MoveResult(
            dry_run=not self.options.execute,
            target=self.target.label,
            dlq=self.target.dlq.name,
            run_id=self.run_id,
            ledger=ledger.location if ledger is not None else None,
        )

    def _wire_shares(self, shares: RunShares | None) -> None:
        """The limit, rate and dry-run keys: ``shares``' (``--processes``), else the run's own."""
        self._shares = shares
        self._limit: LimitLike = shares.limit if shares else Limit(self.options.selection.limit)
        self._planned: PlannedLike = shares.planned if shares else _PlannedKeys()
        self._rate: RateLike = shares.rate if shares else RateLimiter(self.options.rate)

    def _open_caches(self) -> None:
        # Routes per source ARN and liveness per run id, found once per run.
        self._cache_lock = threading.Lock()
        self._routes: dict[str, QueueRef | None] = {}
        self._liveness: dict[str, bool] = {}
        self._legacy = self.ledger is not None and self.ledger.legacy_keys

    @property
    def sightings(self) -> Sightings | None:
        """What the run's --task and --message-id filters saw (merged across processes)."""
        return self._tally.seen.sightings()

    # -- the run -------------------------------------------------------------------------

    def run(self) -> MoveResult:
        started = time.monotonic()
        broker = self.broker_factory()
        self._know(broker)
        scan: MessageSource
        if self.source is not None:
            scan = self.source
        else:
            # What the run skips stays hidden until its end, renewed while it lives: a
            # killed run's messages come back within about --lease (see redrive.dlq.scan).
            depth = broker.counts(self.target.dlq.url).ready
            self.result.depth_before = depth
            scan = DlqScan(
                url=self.target.dlq.url,
                lease=self.options.lease,
                stop=self.stop,
                broker_factory=self.broker_factory,
                receive_log=self.receive_log,
                # Only a --where on them reads redrive's own receives (a move shows none).
                receive_counts=self.options.selection.reads("consumer_receives"),
            )
        self._scan = scan
        with self._life:
            try:
                try:
                    run_pipelines(
                        self._work, broker, self.broker_factory, self.options.workers, self.stop
                    )
                except (Exception, KeyboardInterrupt) as exc:
                    # Give back what is held and end the run as failed. A real crash (SIGKILL)
                    # never gets here, nor do the simulated ones in the tests (a BaseException
                    # subclass): then leases run out by themselves and the ledger keeps what
                    # was claimed.
                    if isinstance(exc, RedriveError):
                        self.result.error = str(exc)
                    # A second Ctrl-C is an interruption the operator asked for.
                    how: Outcome = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
                    with contextlib.suppress(Exception):
                        self._finish(self.broker_factory(), scan, how, started)
                    if isinstance(exc, RedriveError):
                        # What it had done by then (the ledger's audit has the same counts).
                        exc.partial = self.result
                    raise
                outcome: Outcome = "interrupted" if self.stop.is_set() else "completed"
                self._finish(broker, scan, outcome, started)
            finally:
                scan.close()
        return self.result

    def _finish(
        self, broker: Broker, scan: MessageSource, outcome: Outcome, started: float
    ) -> None:
        if self._shares is not None and self._shares.scan_ended is not None:
            # --processes: the siblings' scans end first, or one would count what we give back.
            self._shares.scan_ended()
        scan.release_all(broker)
        scan.close()
        result = self.result
        result.misses = self._tally.seen.misses()
        result.interrupted = outcome == "interrupted"
        result.seconds = time.monotonic() - started
        result.throttled = broker.throttled
        if isinstance(scan, DlqScan):
            result.redelivered = scan.stats.redelivered
        if scan.deletes:
            result.still_hidden = broker.counts(self.target.dlq.url).held
        if self.ledger is not None and result.still_hidden:
            leases = [
                r.lease_until
                for r in self.ledger.runs(since=self.now() - 86_400)
                if r.run_id != self.run_id and r.lease_until > self.now()
            ]
            result.hidden_until = max(leases) if leases else None
        self._life.end(outcome)

    def _work(self, broker: Broker) -> None:
        # A FIFO queue hands out nothing more of a message group while a batch of it is in
        # flight: a receive ahead would come back empty and end the scan early.
        if not self.options.pipelined or (self._scan.deletes and self.target.dlq.fifo):
            while (decided := self._receive_and_decide(broker)) is not None:
                self._complete(broker, decided)
            return
        if self.options.pipelined == "auto" and not self._one_stage_until_overlap_pays(broker):
            return
        # Two stages: a helper thread receives and decides batch k+1 while this one claims,
        # sends and deletes batch k. Claims stay in this thread, in batch order, so a crash
        # still leaves at most one batch in doubt; what the helper overlaps is the waiting
        # (SQS's answers, the ledger's disk flush, SQLite's own work outside the GIL).
        ahead = _Prefetch(lambda: self._receive_and_decide(broker))
        try:
            while (decided := ahead.get()) is not None:
                self._complete(broker, decided)
        except Exception:
            # Batches received but never worked on: hold them like the rest, so that the
            # run's end gives them back at once instead of after their lease.
            with contextlib.suppress(Exception):
                for left in ahead.close():
                    self._scan.keep(broker, left.batch)
            raise
        finally:
            ahead.close()

    def _one_stage_until_overlap_pays(self, broker: Broker) -> bool:
        """Work batch after batch in this thread while the first stage barely waits; True
        once a second stage would pay (:func:`overlap_pays`), False when the scan is over."""
        waits: deque[float] = deque(maxlen=OVERLAP_SAMPLE)
        with BlockedClock() as blocked:
            while not overlap_pays(waits):
                before = blocked.now()
                decided = self._receive_and_decide(broker)
                if decided is None:
                    return False
                waits.append(blocked.now() - before)
                self._complete(broker, decided)
        return True

    def _receive_and_decide(self, broker: Broker) -> _Decided | None:
        batch = self._scan.next_batch(broker)
        if batch is None:
            return None
        received_at = time.monotonic()
        self.observer.on_step("received")
        # Counted as received, before any of it is matched: scanned >= matched at all times.
        self._tally.scanned(len(batch))
        try:
            decided = self._decide(broker, batch, received_at)
        except Exception:
            # Its decision failed (a result backend, the ledger): hold it like the rest, so
            # that the run's end gives it back at once instead of after its lease.
            with contextlib.suppress(Exception):
                self._scan.keep(broker, batch)
            raise
        if self._limit.reached:
            self._scan.stop_receiving()
        return decided

    def _complete(self, broker: Broker, decided: _Decided) -> None:
        try:
            keep = self._execute(broker, decided)
        except Exception:
            # Stopped mid-batch (the ledger, SQS): hold the batch like the rest, so that the
            # run's end gives back at once what it did not delete (the ledger knows what it
            # sent or claimed), instead of after its lease.
            with contextlib.suppress(Exception):
                self._scan.keep(broker, decided.batch)
            raise
        self._scan.keep(broker, keep)
        self.observer.on_progress(self._tally.snapshot())

    # -- one batch -----------------------------------------------------------------------

    def _select(
        self, broker: Broker, batch: Sequence[Delivery], keep: list[Delivery]
    ) -> list[_Candidate]:
        """The batch's selected messages that may be sent, with their keys; the others go
        to ``keep`` (counted as skipped when selected)."""
        candidates: list[_Candidate] = []
        now = self.now()
        now_dt = datetime.fromtimestamp(now, UTC)
        decoded = [(message, decode(message.body)) for message in batch]
        self._tally.seen.add(decoded)
        gates = self._gate_reasons(decoded)
        # redrive.celery.results: one lookup per batch; a backend that cannot answer stops
        # the run here, before this batch is claimed or sent.
        succeeded = succeeded_ids(
            None if self.options.include_succeeded else self.options.results,
            (info.task_id for _, info in decoded),
        )
        for message, info in decoded:
            gate = gates.get(message.message_id)
            done = info.task_id in succeeded
            facts, route = self._message_facts(broker, message, info, (now, now_dt), gate, done)
            screened = screen(facts, self._decision_options)
            if screened is not None or route is None:
                self._tally.decided(info, screened or Verdict(Fate.NO_TARGET))
                keep.append(message)
                continue
            candidates.append(self._candidate(message, info, facts.generation, route))
        return candidates

    def _message_facts(
        self,
        broker: Broker,
        message: Delivery,
        info: TaskInfo,
        now: tuple[float, datetime],
        gate: str | None,
        succeeded: bool,
    ) -> tuple[MessageFacts, QueueRef | None]:
        """What :func:`screen` needs to know of a message, found in its order: a fact that
        already decides spares the rest (an expired message is not routed)."""
        selection = self.options.selection
        if not selection.matches(
            info,
            message_id=message.message_id,
            sent_at=message.enqueued_at,
            now=now[0],
            # --where (issue 15): the record reads the message and its DLQ's sources.
            message=message,
            sources=[s.name for s in self.target.sources],
        ):
            return MessageFacts(selected=False), None
        # redrive.celery: a task no worker registers would be dropped.
        if (gate := gate or skip_reason(self.options.celery, info)) is not None:
            return MessageFacts(gate=gate), None
        if not self.options.include_expired and info.is_expired(now[1]):
            return MessageFacts(expired=True), None
        if succeeded:  # redrive.celery.results: the result backend says it succeeded
            return MessageFacts(late_gate=ALREADY_SUCCEEDED), None
        route = self._route(broker, message, info.task)
        facts = MessageFacts(
            routed=route is not None,
            celery=info.is_celery,
            generation=attributes.redrive_count(message.message_attributes),
        )
        return facts, route

    def _gate_reasons(self, decoded: Sequence[tuple[Delivery, TaskInfo]]) -> Mapping[str, str]:
        """Gates' reasons to skip messages of a batch (MessageId -> reason, e.g. a task whose
        result says it succeeded), asked once per received batch: none yet."""
        return {}

    def _candidate(
        self, message: Delivery, info: TaskInfo, generation: int, route: QueueRef
    ) -> _Candidate:
        namespace = self._limits.key_namespace
        mid = message.message_id
        key = key_for(
            info, message_id=mid, generation=generation, body=message.body, namespace=namespace
        )
        legacy = (
            legacy_key_for(info, message_id=mid, generation=generation, namespace=namespace)
            if self._legacy and info.task_id
            else None
        )
        return _Candidate(message, info, key, generation, route, namespace, legacy)

    def _decide(self, broker: Broker, batch: Sequence[Delivery], received_at: float) -> _Decided:
        """Decode a batch and decide each message's fate from the ledger as it stands; a
        dry run ends here."""
        self._know(broker)
        decided = _Decided(batch, received_at, keep=[])
        candidates = self._select(broker, batch, decided.keep)
        entries = self._entries_for(candidates)
        live_owners = {
            e.run_id
            for e in entries.values()
            if e.state == KeyState.CLAIMED and e.run_id != self.run_id and self._is_live(e.run_id)
        }
        # redrive.celery.results: which in-doubt tasks the result backend proves delivered.
        delivered = (
            delivered_after_claim(self.options.results, candidates, entries, self.run_id)
            if self.options.in_doubt == "auto"
            else set()
        )
        for cand in candidates:
            entry = entries.get(cand.key)
            verdict = self._verdict(cand, entry, (live_owners, delivered), decided)
            self._tally.decided(cand.info, verdict, cand.message.message_id, cand.key)
            decided.add(cand, verdict, entry)
            if verdict.fate is Fate.PLANNED_DUPLICATE:
                self._to_plan(cand, "delete-duplicate")
        if not self.options.execute:
            self._plan_only(decided)
        return decided

    def _verdict(
        self,
        cand: _Candidate,
        entry: Entry | None,
        known_of: tuple[set[str], set[str]],
        decided: _Decided,
    ) -> Verdict:
        """The candidate's verdict; one that would send takes one of --limit's messages."""
        facts = MessageFacts(
            generation=cand.generation,
            held=cand.held,
            in_batch=cand.key in decided.followers,
            planned=entry is None and cand.key in self._planned,
        )
        live_owners, delivered = known_of
        known = (
            EntryFacts(
                entry.state,
                _owner(entry.run_id, self.run_id, self._sibling(entry.run_id, live_owners)),
                owner_live=entry.run_id in live_owners,
                delivered=cand.key in delivered,
            )
            if entry is not None
            else None
        )
        options = self._decision_options
        run = self._run_full if self._limit.reached else self._run_open
        verdict = decide(facts, known, run, options)
        if verdict.sends and not self._limit.take():
            # Another worker took the last one meanwhile.
            verdict = decide(facts, known, self._run_full, options)
        return verdict

    def _execute(self, broker: Broker, decided: _Decided) -> list[Delivery]:
        """Claim, send, record and delete what was decided; return the messages to keep
        hidden until the scan ends."""
        if not self.options.execute:
            return decided.keep
        claimed = self._claim(decided)
        self._life.heartbeat()
        self.observer.on_step("claimed")
        self._extend_if_slow(broker, decided.batch, decided.received_at)
        sent = self._send(broker, claimed.claimed)
        self.observer.on_step("sent")
        self._record(sent)
        self.observer.on_step("recorded")
        self._settle(sent, decided)
        deleted = self._delete(broker, self._deletable(sent, decided))
        decided.keep.extend(deleted.kept)
        self.observer.on_step("deleted")
        if deleted.done:
            assert self.ledger is not None and self.run_id is not None
            self.ledger.mark_done_many(self.run_id, sorted(deleted.done))
        return decided.keep

    def _claim(self, decided: _Decided) -> ClaimOutcome:
        """Claim the keys to send (and take over the in-doubt ones to resend, mark the ones
        to skip): durable before anything is sent."""
        assert self.ledger is not None and self.run_id is not None
        if decided.proven:
            decided.duplicates = self._adopt_delivered(
                decided.proven, decided.duplicates, decided.keep
            )
        if decided.resolve_skip:
            self.ledger.mark_skipped_many(self.run_id, [c.key for c, _ in decided.resolve_skip])
        outcome = ClaimOutcome()
        if decided.to_send:
            won = self.ledger.claim_many(
                self.run_id,
                [
                    Claim(c.key, c.info.task, c.message.message_id, c.target.url)
                    for c in decided.to_send
                ],
            )
            for cand in decided.to_send:
                if cand.key in won.won:
                    outcome.claimed.append(cand)
                else:
                    # Another run claimed it between our read and our claim.
                    outcome.lost.append(cand)
                    self._lost_race(cand, won[cand.key], decided)
        if decided.takeovers:
            self._take_over(decided, outcome)
        return outcome

    def _adopt_delivered(
        self,
        proven: Sequence[tuple[_Candidate, str]],
        duplicates: list[tuple[_Candidate, str]],
        keep: list[Delivery],
    ) -> list[tuple[_Candidate, str]]:
        """--in-doubt auto: take over the keys the result backend proved delivered and
        record them SENT (by the dead run's copy), so their DLQ copies are deleted as
        duplicates and the keys end DONE. A key another run took meanwhile stays held."""
        assert self.ledger is not None and self.run_id is not None
        taken = self.ledger.takeover_many(self.run_id, [(c.key, run) for c, run in proven])
        self.ledger.mark_sent_many(self.run_id, {key: "" for key in taken})
        untaken = {id(c) for c, _ in proven if c.key not in taken}
        keep.extend(c.message for c, _ in proven if id(c) in untaken)
        return [(c, k) for c, k in duplicates if id(c) not in untaken]

    def _take_over(self, decided: _Decided, outcome: ClaimOutcome) -> None:
        assert self.ledger is not None and self.run_id is not None
        takeovers = decided.takeovers
        taken = self.ledger.takeover_many(self.run_id, [(c.key, old) for c, old in takeovers])
        lost = [c for c, _ in takeovers if c.key not in taken]
        # Decided on before an earlier batch of this run went through, a takeover may find
        # that batch sent another copy of the key since: then this one is a duplicate.
        now_entries = self.ledger.get_many([c.key for c in lost]) if lost else {}
        for cand, _ in takeovers:
            if cand.key in taken:
                outcome.claimed.append(cand)
                continue
            outcome.lost.append(cand)
            if (entry := now_entries.get(cand.key)) is not None:
                self._lost_race(cand, entry, decided)
            else:
                decided.keep.append(cand.message)
                decided.keep.extend(f.message for f in decided.followers.pop(cand.key, []))
                self._tally.skipped(cand.info, BUSY)

    def _record(self, sent: SendOutcome) -> None:
        """Record the confirmed sends; give back the claims of the refused ones (the
        unconfirmed stay claimed: in doubt)."""
        assert self.ledger is not None and self.run_id is not None
        if sent.sent:
            self.ledger.mark_sent_many(self.run_id, {c.key: mid for c, mid in sent.sent})
        if sent.refused:
            self.ledger.release_many(self.run_id, [c.key for c, _ in sent.refused])

    def _settle(self, sent: SendOutcome, decided: _Decided) -> None:
        """Count what the send did; keep what was not sent (with its followers) hidden."""
        self._tally.sent(sent, self._listed)
        for cand, _ in sent.refused:
            decided.keep.append(cand.message)
            decided.keep.extend(f.message for f in decided.followers.pop(cand.key, []))
        for cand in sent.unconfirmed:
            self._tally.in_doubt(
                self._listed(cand, "SQS confirmed neither success nor failure of its send")
            )
            decided.keep.append(cand.message)
            decided.keep.extend(f.message for f in decided.followers.pop(cand.key, []))

    def _deletable(self, sent: SendOutcome, decided: _Decided) -> list[tuple[Delivery, str]]:
        """The DLQ copies to delete, with the key each was sent under: the ones sent, their
        followers, and the duplicates of keys sent before."""
        deletable: list[tuple[Delivery, str]] = [(c.message, c.key) for c, _ in sent.sent]
        for cand, _ in sent.sent:
            for follower in decided.followers.get(cand.key, []):
                deletable.append((follower.message, cand.key))
                self._tally.duplicate(follower.info, matched=True)
        for cand, key in decided.duplicates:
            deletable.append((cand.message, key))
            self._tally.duplicate(cand.info)
        return deletable

    def _plan_only(self, decided: _Decided) -> None:
        """A dry run: count what would happen, change nothing, keep every message."""
        keep = decided.keep
        for cand in [*decided.to_send, *(c for c, _ in decided.takeovers)]:
            if not self._planned.add(cand.key):
                self._lost_planned_race(cand, decided)
                continue
            self._to_plan(cand, "send")
            self._tally.moved(cand)
            keep.append(cand.message)
            for follower in decided.followers.get(cand.key, []):
                self._tally.duplicate(follower.info, matched=True)
                self._to_plan(follower, "delete-duplicate")
                keep.append(follower.message)
        for cand, _ in decided.duplicates:
            self._tally.duplicate(cand.info)
            self._to_plan(cand, "delete-duplicate")
            keep.append(cand.message)

    def _to_plan(self, cand: _Candidate, action: str) -> None:
        self.observer.on_plan(
            PlanItem(
                message_id=cand.message.message_id,
                task=cand.info.task,
                task_id=cand.info.task_id,
                key=cand.key,
                target=cand.target.url,
                action=action,
                routed_from=_routed_from(self._source_name(cand.message), cand.target.name),
            )
        )

    def _listed(self, cand: _Candidate, detail: str) -> Listed:
        return Listed(cand.info.task, cand.info.task_id, cand.message.message_id, cand.key, detail)

    # -- steps ---------------------------------------------------------------------------

    def _entries_for(self, candidates: Sequence[_Candidate]) -> dict[str, Entry]:
        """Ledger entries of the candidates' keys, after settling which key each has: a
        message that is redrive's own copy come back moves on a generation, one whose key
        belongs to another invocation gets a key of its own, one that may be either is held
        (:meth:`_tell_copies_apart`)."""
        if not candidates:
            return {}
        if self.ledger is None:
            self._tell_copies_apart(candidates, {})
            return {}
        wanted = [c.key for c in candidates] + [c.legacy_key for c in candidates if c.legacy_key]
        entries = self.ledger.get_many(wanted)
        self._follow_returns(candidates, entries)
        self._adopt_legacy_keys(candidates, entries)
        rekeyed = self._tell_copies_apart(candidates, entries)
        if rekeyed:
            entries.update(self.ledger.get_many([c.key for c in rekeyed]))
        return entries

    def _follow_returns(self, candidates: Sequence[_Candidate], entries: dict[str, Entry]) -> None:
        """A message whose MessageId is the one SQS gave our own copy came back to the DLQ
        (failed again): it moves on a generation; it is not a duplicate, whatever its key
        says."""
        assert self.ledger is not None
        # An unstamped copy (no room for our attributes) always computes the key of the
        # generation its count says, however often it came back: look along its later
        # generations for the one whose send it is. Comparing with the first generation
        # only would call a second return a duplicate of the first send, and delete it.
        suspects = [
            c
            for c in candidates
            if any(
                (e := entries.get(k)) is not None and e.sent_message_id is not None
                for k in (c.key, c.legacy_key)
                if k is not None
            )
        ]
        if not suspects:
            return
        chains = [self._chain(c) for c in suspects]
        found = self.ledger.get_many([key for chain in chains for keys in chain for key in keys])
        for cand, chain in zip(suspects, chains, strict=True):
            for generation, keys in enumerate(chain, start=cand.generation):
                if any(
                    (e := found.get(k)) is not None and e.sent_message_id == cand.message.message_id
                    for k in keys
                ):
                    cand.generation = generation + 1
                    cand.rekey()
                    break
        entries.update(found)
        missing = [
            k for c in suspects for k in (c.key, c.legacy_key) if k is not None and k not in entries
        ]
        if missing:
            entries.update(self.ledger.get_many(missing))

    def _chain(self, cand: _Candidate) -> list[list[str]]:
        """Per generation from the candidate's own on, the keys it would have there."""
        info, message = cand.info, cand.message
        chain = []
        ns, mid = cand.namespace, message.message_id
        for g in range(cand.generation, cand.generation + self.options.max_redrives + 1):
            keys = [key_for(info, message_id=mid, generation=g, body=message.body, namespace=ns)]
            if cand.legacy_key is not None:
                keys.append(legacy_key_for(info, message_id=mid, generation=g, namespace=ns))
            chain.append(keys)
        return chain

    def _adopt_legacy_keys(
        self, candidates: Sequence[_Candidate], entries: Mapping[str, Entry]
    ) -> None:
        """A key of the legacy form (it does not name the publish) decides as it did before
        when it is this very message's. One held for another message with the same task id
        may be a copy of it or a second publish: only an enqueue time after that message was
        sent tells (a second publish); otherwise the candidate is held."""
        for cand in candidates:
            if cand.legacy_key is None or cand.key in entries:
                continue
            old = entries.get(cand.legacy_key)
            if old is None:
                continue
            if old.message_id == cand.message.message_id:
                cand.key = cand.legacy_key
                continue
            sent = old.state in (KeyState.SENT, KeyState.DONE)
            verdict = copy_verdict(
                same_message=False,
                tagged=False,  # the legacy key says nothing of the publish
                enqueued_at=cand.message.enqueued_at,
                first_sent_at=_sent_at(old) if sent else None,
            )
            if verdict is CopyVerdict.AMBIGUOUS and self.options.ambiguous == "hold":
                done = f"sent at {iso_utc(_sent_at(old))}" if sent else f"{old.state} (not sent)"
                cand.held = (
                    f"same task id and retries as message {old.message_id}, {done} by run "
                    f"{old.run_id} under a key of the earlier form, which does not name the "
                    "publish: a copy of it or a second publish"
                )
            # Otherwise its own key (the new form) decides: the legacy one was another's.

    def _tell_copies_apart(
        self, candidates: Sequence[_Candidate], entries: Mapping[str, Entry]
    ) -> list[_Candidate]:
        """For each candidate whose key another message holds (sent, claimed earlier in this
        run, or earlier in this batch or dry run), whether it is a copy of that message: a
        second publish is re-keyed by its own MessageId, an ambiguous one held (re-keyed with
        ``--ambiguous move``). Returns the re-keyed candidates."""
        rekeyed: list[_Candidate] = []
        first_of: dict[str, _Candidate] = {}
        for cand in candidates:
            if cand.held is not None:
                continue
            other, sent_at = self._other_holder(cand, entries.get(cand.key), first_of)
            if other is not None:
                verdict = copy_verdict(
                    same_message=other == cand.message.message_id,
                    tagged=cand.tagged,
                    enqueued_at=cand.message.enqueued_at,
                    first_sent_at=sent_at,
                )
                if verdict is CopyVerdict.AMBIGUOUS and self.options.ambiguous == "hold":
                    cand.held = (
                        f"same task id, retries and body as message {other or '(planned)'}"
                        + (f", sent at {iso_utc(sent_at)}" if sent_at is not None else "")
                        + ", and no delivery tag to tell a copy from a second publish"
                    )
                elif verdict in (CopyVerdict.AMBIGUOUS, CopyVerdict.SECOND_PUBLISH):
                    cand.rekey(by_message=True)
                    rekeyed.append(cand)
            first_of.setdefault(cand.key, cand)
        return rekeyed

    def _other_holder(
        self, cand: _Candidate, entry: Entry | None, first_of: Mapping[str, _Candidate]
    ) -> tuple[str | None, float | None]:
        """(MessageId, when sent) of the message that holds the candidate's key before it:
        one sent, an earlier copy in this batch, one an earlier batch of this run claimed,
        or ("", None) for one planned earlier in this dry run; (None, None) for none (or a
        key claimed by another run, or skipped: those decide as they always did)."""
        if entry is not None and entry.state in (KeyState.SENT, KeyState.DONE):
            return entry.message_id, _sent_at(entry)
        if (first := first_of.get(cand.key)) is not None:
            return first.message.message_id, None
        if entry is not None:
            if entry.state == KeyState.CLAIMED and (
                entry.run_id == self.run_id or self._sibling(entry.run_id)
            ):
                return entry.message_id, None
            return None, None
        if cand.key in self._planned:
            return "", None  # the scan never hands out one message twice: another one
        return None, None

    def _send(self, broker: Broker, claimed: Sequence[_Candidate]) -> SendOutcome:
        """Send the claimed messages: what SQS confirmed, refused, or left unconfirmed.

        An entry SQS named in neither list of its response may have been queued: its claim
        is kept (in doubt for the next run), never released to be resent blindly.
        """
        outcome = SendOutcome()
        sent, failed, doubtful = outcome.sent, outcome.refused, outcome.unconfirmed
        by_target: dict[str, list[_Candidate]] = {}
        for cand in claimed:
            by_target.setdefault(cand.target.url, []).append(cand)
        for url, cands in by_target.items():
            by_id = {str(i): c for i, c in enumerate(cands)}
            entries = [self._entry(entry_id, c) for entry_id, c in by_id.items()]
            for chunk in split_batches(entries, self._limits):
                self._rate.acquire(len(chunk))
                try:
                    result = broker.send(url, chunk)
                except Exception:
                    # Earlier unconfirmed entries stay claimed, like the request in flight.
                    self._settle_before_error(
                        claimed,
                        sent,
                        failed,
                        {by_id[e.id].key for e in chunk} | {c.key for c in doubtful},
                    )
                    raise
                sent.extend((by_id[i], mid) for i, mid in result.ok.items())
                failed.extend(
                    (by_id[i], err)
                    for i, err in result.failed.items()
                    if i not in result.unconfirmed
                )
                doubtful.extend(by_id[i] for i in result.unconfirmed)
        return outcome

    def _settle_before_error(
        self,
        claimed: Sequence[_Candidate],
        sent: Sequence[tuple[_Candidate, str]],
        failed: Sequence[tuple[_Candidate, str]],
        in_flight: set[str],
    ) -> None:
        """A send raised (e.g. it timed out): only its own request is in doubt. Record the
        requests SQS confirmed before it and give back the ones never made, so that an
        operator's ``--in-doubt resend`` cannot send a confirmed message a second time."""
        assert self.ledger is not None and self.run_id is not None
        settled = {c.key for c, _ in sent} | {c.key for c, _ in failed}
        untried = [c.key for c in claimed if c.key not in settled and c.key not in in_flight]
        # Best effort: if the ledger fails too, those keys stay claimed, i.e. in doubt.
        with contextlib.suppress(Exception):
            if sent:
                self.ledger.mark_sent_many(self.run_id, {c.key: mid for c, mid in sent})
            released = [c.key for c, _ in failed] + untried
            if released:
                self.ledger.release_many(self.run_id, released)

    def _entry(self, entry_id: str, cand: _Candidate) -> SendEntry:
        message = cand.message
        fifo = cand.target.fifo
        entry = SendEntry(
            id=entry_id,
            body=message.body,
            message_attributes=attributes.stamped(
                message.message_attributes,
                count=cand.generation + 1,
                key=cand.key,
                dlq=self.target.dlq.name,
                room=self._limits.max_message_attributes,
            ),
            group_id=(message.group_id or "default") if fifo else None,
            # A FIFO queue drops a resend with the same deduplication id (SQS: for 5 minutes).
            deduplication_id=cand.key if fifo else None,
        )
        limits = self._limits.message_size_limits
        if entry.size() <= limits[0]:
            return entry
        bare = replace(entry, message_attributes=attributes.originals(message.message_attributes))
        if any(bare.size() <= limit < entry.size() for limit in limits):
            # A broker counts attributes in a message's size: our stamp must never be what makes
            # a message too big to send. Unstamped, a return is still recognised (by the
            # MessageId the ledger recorded for the send).
            return bare
        return entry

    def _delete(self, broker: Broker, deletable: Sequence[tuple[Delivery, str]]) -> DeleteOutcome:
        """Delete DLQ copies: the keys whose copies are all gone, and what stays."""
        if not self._scan.deletes:
            # An archive being replayed: there is no copy to delete.
            return DeleteOutcome(done={key for _, key in deletable})
        done: set[str] = set()
        failed_keys: set[str] = set()
        not_deleted: list[Delivery] = []
        for start in range(0, len(deletable), 10):
            chunk = deletable[start : start + 10]
            result = broker.ack(
                self.target.dlq.url, {str(i): m.tag for i, (m, _) in enumerate(chunk)}
            )
            self._scan.forget([m for i, (m, _) in enumerate(chunk) if str(i) in result.ok])
            for i, (message, key) in enumerate(chunk):
                if str(i) in result.ok:
                    done.add(key)
                else:
                    # Stays SENT: the next run finds the copy and only deletes it.
                    failed_keys.add(key)
                    not_deleted.append(message)
        return DeleteOutcome(done - failed_keys, not_deleted)

    def _extend_if_slow(
        self, broker: Broker, batch: Sequence[Delivery], received_at: float
    ) -> None:
        # Past half the lease, another receiver could get these messages: extend it. Safety
        # does not depend on this (the ledger does), but it saves needless "busy" skips.
        if time.monotonic() - received_at > self.options.lease / 2:
            self._scan.extend(broker, batch, self.options.lease)

    def _counts(self) -> dict[str, int]:
        return self.result.run_counts()

    def _route(self, broker: Broker, message: Delivery, task: str | None = None) -> QueueRef | None:
        if self.options.to is not None:
            return self.options.to
        # redrive.celery: the queue the task routes to now (or a plan's target), if known.
        if self.options.celery is not None and task is not None:
            routed = self.options.celery.route(broker, task, message.message_id)
            if routed is not None:
                if routed.queue is None and routed.problem is not None:
                    self._tally.no_target(routed.problem)
                return routed.queue
        died_in = message.died_in
        if not died_in:
            if self.target.single_source is None:
                self._tally.no_target(
                    _why_no_single_source(self.target)
                    if self.source is None
                    else _why_no_archived_source(task)
                )
            return self.target.single_source
        with self._cache_lock:
            if died_in in self._routes:
                return self._routes[died_in]
        route = self.target.source_for(died_in)
        if route is None:
            name = queue_name(died_in)
            try:
                route = broker.describe(died_in)
            except RedriveError as exc:
                route = None
                self._tally.no_target(
                    NoTarget(
                        f"the source queue the broker names ({name}, the queue the message "
                        f"died in) cannot be used: {exc}",
                        missing=name if isinstance(exc, QueueNotFound) else None,
                    )
                )
        with self._cache_lock:
            self._routes[died_in] = route
        return route

    def _source_name(self, message: Delivery) -> str | None:
        """The queue the message came from, when it is not sent there by choice (``--to``):
        a task's route may send it elsewhere (redrive.celery)."""
        if self.options.to is not None:
            return None
        if message.died_in:
            return queue_name(message.died_in)
        return self.target.single_source.name if self.target.single_source else None

    def _sibling(self, run_id: str, live: set[str] | None = None) -> bool:
        """Whether ``run_id`` is another live process of this ``--processes`` run (runs
        PARENT.1, PARENT.2, ...): its claims are settled as this run's own are (the claim
        decides: a copy of a key it sent is a duplicate, one still in flight is busy). A dead
        one's claims are in doubt, as any dead run's."""
        if self._parent is None or run_id.rpartition(".")[0] != self._parent:
            return False
        return run_id in live if live is not None else self._is_live(run_id)

    def _is_live(self, run_id: str) -> bool:
        """Whether the run that holds a claim may still be sending it."""
        with self._cache_lock:
            if run_id in self._liveness:
                return self._liveness[run_id]
        assert self.ledger is not None
        run = self.ledger.run(run_id)
        live = run is not None and run_is_live(run, self.now())
        with self._cache_lock:
            self._liveness[run_id] = live
        return live

    def _lost_planned_race(self, cand: _Candidate, decided: _Decided) -> None:
        """A dry run's claim lost: another worker or process planned the same task between
        this one's decision and its plan, as a real run's claim_many would have found it
        claimed. This copy and its followers are then duplicates, as the real run's are."""
        more = decided.followers.pop(cand.key, [])
        self._limit.give_back()  # taken as a send when decided; it is not one
        decided.duplicates.append((cand, cand.key))
        decided.duplicates.extend((f, cand.key) for f in more)
        for f in more:
            self._tally.matched(f.info)

    def _lost_race(self, cand: _Candidate, entry: Entry, decided: _Decided) -> None:
        more = decided.followers.pop(cand.key, [])
        self._limit.give_back()  # taken as a send when decided; it is not one
        if entry.state in (KeyState.SENT, KeyState.DONE) and _copy_of(cand, entry):
            decided.duplicates.append((cand, entry.key))
            decided.duplicates.extend((f, entry.key) for f in more)
            for f in more:
                self._tally.matched(f.info)
            return
        # Claimed by a live run, or sent for a message this one may not be a copy of:
        # the next run decides, with that key's entry in hand.
        self._tally.skipped(cand.info, BUSY)
        decided.keep.append(cand.message)
        decided.keep.extend(f.message for f in more)


def _decision_options(options: MoveOptions) -> DecisionOptions:
    return DecisionOptions(
        include_expired=options.include_expired,
        include_unknown=options.include_unknown,
        # Non-Celery bodies are kept out of Celery queues: every message's own source is
        # one, and so is a --to that names a family's queue.
        to_celery=options.to is None or options.to_celery_queue,
        max_redrives=options.max_redrives,
        in_doubt=options.in_doubt,
    )


def _owner(run_id: str, mine: str | None, sibling: bool) -> str:
    """Who a claim is decided as: this run's own when a live sibling process holds it."""
    return mine if sibling and mine is not None else run_id


def _why_no_single_source(target: DlqTarget) -> NoTarget:
    names = tuple(s.name for s in target.sources)
    if not names:
        return NoTarget(
            f"no queue dead-letters into {target.dlq.name} (ListDeadLetterSourceQueues found "
            "none) and SQS did not say where the messages came from"
        )
    return NoTarget(
        f"{target.dlq.name} has {len(names)} source queues ({', '.join(names)}, from "
        "ListDeadLetterSourceQueues) and SQS did not say which one each message came from",
        names,
    )


def _why_no_archived_source(task: str | None) -> NoTarget:
    """An archive stands where a DLQ would, but no queue dead-letters into a file: its
    records go where their route or their recorded source says, or nowhere."""
    if task is None or task == UNKNOWN_TASK:
        return NoTarget(
            "their bodies are not Celery tasks, so no task route names a queue for them, and "
            "the archive does not say which queue they came from"
        )
    return NoTarget(
        f"no route names a queue for task {task} and the archive does not say which queue "
        "it came from (no DeadLetterQueueSourceArn)"
    )


def _routed_from(source: str | None, target: str) -> str | None:
    """The source a task's route sends a message away from (redrive.celery), else None."""
    return source if source is not None and source != target else None


def _sent_at(entry: Entry) -> float:
    """When the ledger recorded the key's send (a ledger of schema 2 kept only the time of
    the key's last change, which is then as close as it gets)."""
    return entry.sent_at if entry.sent_at is not None else entry.updated_at


def _copy_of(cand: _Candidate, entry: Entry) -> bool:
    """Whether the candidate is the message ``entry`` sent, or a copy of it."""
    verdict = copy_verdict(
        same_message=entry.message_id == cand.message.message_id,
        tagged=cand.tagged,
        enqueued_at=cand.message.enqueued_at,
        first_sent_at=_sent_at(entry),
    )
    return verdict in (CopyVerdict.SAME_MESSAGE, CopyVerdict.COPY)
