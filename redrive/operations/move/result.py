"""What a move run found and did: its :class:`MoveResult` (with per-task :class:`TaskCounts`
and the messages it names, :class:`Listed`), the :class:`MoveTally` that counts into it, and
what each step of a batch came to (:class:`ClaimOutcome`, :class:`SendOutcome`,
:class:`DeleteOutcome`)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from redrive.broker.base import Delivery
from redrive.celery.knowledge import NoTarget
from redrive.messages import TaskInfo
from redrive.operations.move.candidate import Candidate
from redrive.operations.move.repair_step import RepairReport
from redrive.operations.move.returns import ReturnsLimit, grown_by
from redrive.operations.plan import CHANGED_SINCE_PLAN
from redrive.operations.seen import SeenByFilters
from redrive.operations.verdict import (
    AMBIGUOUS,
    CAME_BACK,
    DIED_DURING_RUN,
    IN_DOUBT,
    NO_TARGET,
    Fate,
    Verdict,
)
from redrive.runs.listed import MAX_LISTED, Listed, listed_json
from redrive.selection import FilterMisses


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
    when it died; the others were left by earlier runs, or by this one (``own_in_doubt``)."""
    own_in_doubt: int = 0
    """Of ``in_doubt``: this run's own sends whose fate the broker left unconfirmed (its
    answer lost, e.g. to a broker restart)."""
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
    cut_short: bool = False
    """``--processes``: a process died, and the others stopped with it (not interrupted)."""
    error: str | None = None
    still_hidden: int = 0
    hidden_until: float | None = None
    stopped_leases: dict[str, float] = field(default_factory=dict)
    """Other runs of this DLQ that stopped without ending (killed, crashed) and whose leases
    still run: run id -> when the lease ends. Until then their holds may hide messages and
    the ledger resolves none of their claims: what they left is for a rerun after that."""
    live_runs: list[str] = field(default_factory=list)
    """Other runs of this DLQ still running (pid or heartbeat): what they hold is theirs."""
    seconds: float = 0.0
    throttled: int = 0
    depth_before: int | None = None
    """SQS's count of visible messages in the DLQ when the run started (for progress)."""
    redelivered: int = 0
    """Copies SQS delivered again after the run deleted their message: deleted once more."""
    repair: RepairReport | None = None
    """What the run's edits did (issue 26); None without edits."""
    dlq_grew_by: int = 0
    """The most the DLQ grew by while the run went on, where the broker counts exactly
    (RabbitMQ): tasks it moved that came back, and whatever else died meanwhile."""
    stopped_by_returns: str | None = None
    """The ``--stop-after-returns`` the moved tasks that came back exceeded, when the run
    stopped receiving for it (None: it did not stop for them)."""

    @property
    def came_back(self) -> int:
        """Tasks this run moved that came back failed while it ran (left in the DLQ)."""
        return self.skipped[CAME_BACK]

    @property
    def died_during_run(self) -> int:
        """Messages that died after the run began (left in the DLQ for the next run)."""
        return self.skipped[DIED_DURING_RUN]

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    @property
    def not_scanned(self) -> int:
        """About how many of the DLQ's messages (its depth as the run began) a run that
        stopped never reached: they stay in the DLQ (0 when it did not stop)."""
        if not (self.interrupted or self.error or self.cut_short) or not self.depth_before:
            return 0
        return max(0, self.depth_before - self.scanned)

    @property
    def by_task(self) -> dict[str, int]:
        """Messages moved (or, in a dry run, that would move) per task."""
        return {task: c.moved for task, c in sorted(self.tasks.items()) if c.moved}

    @property
    def ambiguous(self) -> int:
        return self.skipped[AMBIGUOUS]

    @property
    def changed_since_plan(self) -> int:
        """An apply's planned messages left because they are not the ones reviewed."""
        return self.skipped[CHANGED_SINCE_PLAN]

    @property
    def left_to_stopped_runs(self) -> bool:
        """Whether messages stay hidden while a stopped run's lease runs: the DLQ is not
        drained, and only a rerun after that lease can say what is left (some in doubt)."""
        return bool(self.still_hidden and self.stopped_leases)

    @property
    def rerun_at(self) -> float | None:
        """When the leases of the stopped runs of this DLQ are over (None: none runs)."""
        return max(self.stopped_leases.values()) if self.stopped_leases else None

    @property
    def needs_attention(self) -> bool:
        return bool(
            self.failed
            or self.in_doubt
            or self.ambiguous
            # A plan's message that changed is still to be reviewed again.
            or self.changed_since_plan
            or self.stopped_by_returns
            or self.left_to_stopped_runs
        )

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

    def _repair_json(self, repair: RepairReport) -> dict[str, Any]:
        """The edits' report, with what became of the messages they changed (``became``:
        fate -> count, adding up to ``changed``)."""
        total, fates = repair.fates(
            moved=self.moved, duplicates=self.duplicates, failed=self.failed, skipped=self.skipped
        )
        return {**repair.to_json(), "changed": total, "became": {k: n for k, n in fates if n}}

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
            "not_scanned": self.not_scanned,
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
            "hidden_until": _iso(self.hidden_until),
            "own_in_doubt": self.own_in_doubt,
            "stopped_runs": {run: _iso(until) for run, until in self.stopped_leases.items()},
            "live_runs": list(self.live_runs),
            "rerun_at": _iso(self.rerun_at),
            "seconds": round(self.seconds, 3),
            "redelivered": self.redelivered,
            "came_back": self.came_back,
            "died_during_run": self.died_during_run,
            "dlq_grew_by": self.dlq_grew_by,
            "stopped_by_returns": self.stopped_by_returns,
            **({"repair": self._repair_json(self.repair)} if self.repair is not None else {}),
        }


def _iso(when: float | None) -> str | None:
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="seconds") if when else None


@dataclass(slots=True)
class ClaimOutcome:
    claimed: list[Candidate] = field(default_factory=list)
    lost: list[Candidate] = field(default_factory=list)
    """Claimed by another run between the read and the claim (or taken over first)."""


@dataclass(slots=True)
class SendOutcome:
    sent: list[tuple[Candidate, str]] = field(default_factory=list)
    """Confirmed, with the MessageId SQS gave the copy."""
    refused: list[tuple[Candidate, str]] = field(default_factory=list)
    """Refused by SQS, with its error: the claim is given back."""
    unconfirmed: list[Candidate] = field(default_factory=list)
    """Named in neither list of SQS's answer: may have been queued, so in doubt."""


@dataclass(slots=True)
class DeleteOutcome:
    done: set[str] = field(default_factory=set)
    """Keys whose DLQ copies are all gone."""
    kept: list[Delivery] = field(default_factory=list)
    """Copies not deleted: kept hidden, found again by the next run."""


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
        self._watch = threading.local()

    # -- what a batch being carried out has counted (this thread's) ----------------------

    def watch(self) -> None:
        """From now on, note in this thread which messages are counted (by their decoded
        task, or MessageId): a batch the run stops in counts the rest as the ledger has
        them (:meth:`MoveEngine._count_stopped`)."""
        self._watch.counted = set()

    def watched(self) -> set[object]:
        """What was counted in this thread since :meth:`watch`; watching ends."""
        counted: set[object] = getattr(self._watch, "counted", None) or set()
        self._watch.counted = None
        return counted

    def _note(self, *marks: object) -> None:
        counted = getattr(self._watch, "counted", None)
        if counted is not None:
            counted.update(marks)

    def decided(
        self, info: TaskInfo, verdict: Verdict, message_id: str = "", key: str = ""
    ) -> None:
        """Count a message as its verdict says, as soon as it is decided."""
        if not verdict.matched:
            return
        with self._lock:
            self._matched(info)
            reason = verdict.skip_reason
            # An executed run counts a resolved skip once the ledger says it marked the key
            # (redrive.operations.move.execute): a leased claim it refuses stays in doubt.
            if reason is not None and not (
                verdict.fate is Fate.RESOLVE_SKIP and not self.result.dry_run
            ):
                self._skip(info.task, reason)
            if verdict.fate in (Fate.IN_DOUBT, Fate.LEASED):
                self.result.in_doubt += 1
                listing = self.result.in_doubt_messages
                add_listed(
                    listing, Listed(info.task, info.task_id, message_id, key, verdict.detail)
                )
            elif verdict.fate is Fate.AMBIGUOUS:
                listing = self.result.ambiguous_messages
                add_listed(
                    listing, Listed(info.task, info.task_id, message_id, key, verdict.detail)
                )
            elif verdict.fate is Fate.PLANNED_DUPLICATE:
                self._duplicate(info)

    def matched(self, info: TaskInfo) -> None:
        with self._lock:
            self._matched(info)

    def skipped(self, info: TaskInfo, reason: str) -> None:
        self._note(id(info))
        with self._lock:
            self._skip(info.task, reason)

    def duplicate(self, info: TaskInfo, *, matched: bool = False) -> None:
        self._note(id(info))
        with self._lock:
            if matched:
                self._matched(info)
            self._duplicate(info)

    def in_doubt(self, listed: Listed, reason: str = IN_DOUBT, *, own: bool = False) -> None:
        """Count a message in doubt, under ``reason`` (IN_DOUBT, or LEASE_LIVE: one the
        ledger would not resolve yet), and list it; ``own``: this run's send left it so."""
        with self._lock:
            self.result.in_doubt += 1
            self.result.own_in_doubt += own
            self._skip(listed.task, reason)
            add_listed(self.result.in_doubt_messages, listed)
        self._note(listed.message_id)

    def moved(self, cand: Candidate) -> None:
        self._note(id(cand.info))
        with self._lock:
            self._moved(cand)

    def sent(self, outcome: SendOutcome) -> None:
        self._note(*(id(c.info) for c, _ in [*outcome.sent, *outcome.refused]))
        with self._lock:
            for cand, _ in outcome.sent:
                self._moved(cand)
            for cand, error in outcome.refused:
                self._failed(cand, error)

    def refused_follower(self, follower: Candidate, error: str) -> None:
        """A further copy of a key whose first copy the broker refused: matched, and failed
        as that one did (not sent, it stays in the DLQ)."""
        self._note(id(follower.info))
        with self._lock:
            self._matched(follower.info)
            self._failed(follower, error)

    def _failed(self, cand: Candidate, error: str) -> None:
        self.result.failed += 1
        self.result.task(cand.info.task).failed += 1
        add_listed(self.result.failed_messages, listed_for(cand, error))

    def check_returns(self, limit: ReturnsLimit, ready: int | None) -> None:
        """Stop the run (``stopped_by_returns``) once more of what it moved came back failed
        than ``limit`` allows: those it received, or (``ready``: the DLQ's exact count now,
        None where the broker has none) by how much the DLQ grew meanwhile."""
        with self._lock:
            result = self.result
            if ready is not None and result.depth_before is not None:
                grown = grown_by(ready, result.depth_before, result.scanned)
                result.dlq_grew_by = max(result.dlq_grew_by, grown)
            back = max(result.came_back, result.dlq_grew_by)
            if result.stopped_by_returns is None and limit.exceeded(back, result.moved):
                result.stopped_by_returns = limit.describe()

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

    def _moved(self, cand: Candidate) -> None:
        counts = self.result.task(cand.info.task)
        counts.moved += 1
        counts.sent_to(cand.target.name, self._source_of(cand.message))
        self.result.moved += 1


def add_listed(listing: list[Listed], listed: Listed) -> None:
    if len(listing) < MAX_LISTED:
        listing.append(listed)


def listed_for(cand: Candidate, detail: str) -> Listed:
    """A candidate as the result names it (in doubt, or failed)."""
    return Listed(cand.info.task, cand.info.task_id, cand.message.message_id, cand.key, detail)
