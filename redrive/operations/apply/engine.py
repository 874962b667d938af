"""Apply a plan (``move/purge --plan-out``): act on exactly its messages, and say how many
of them were gone.

The plan's message ids are the selection: a message not in the plan is left alone even if
it matches the plan's filters now; a planned message no longer in the DLQ is *gone*.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from redrive.broker.base import Broker, DlqTarget, QueueRef
from redrive.celery.knowledge import TaskKnowledge
from redrive.dlq.receive_log import ReceiveLog
from redrive.errors import RedriveError, UsageProblem
from redrive.ledger import KeyState, Ledger
from redrive.operations.move import (
    DEFAULT_LEASE,
    DEFAULT_MAX_REDRIVES,
    InDoubtPolicy,
    MoveOptions,
    MoveResult,
    RepairOptions,
)
from redrive.operations.move.entry import move
from redrive.operations.plan import Plan
from redrive.operations.purge.engine import PurgeOptions, PurgeResult
from redrive.operations.purge.entry import purge
from redrive.repair import parse_edit_words
from redrive.runs.lifecycle import RunRecord
from redrive.runs.observer import NULL_OBSERVER, RunObserver
from redrive.runs.processes import ProcessesResult, Wiring
from redrive.selection import Selection


@dataclass(frozen=True, slots=True)
class ApplyOptions:
    execute: bool = False
    in_doubt: InDoubtPolicy | None = None
    """Overrides the plan's in-doubt policy (move plans)."""
    workers: int = 1
    include_succeeded: bool = False
    """Send tasks the result backend says already succeeded (move plans)."""


@dataclass(slots=True)
class ApplyResult:
    """What applying a plan did: the run's own result, and how many planned messages were
    gone (no longer in the DLQ: acted on already, or removed by someone else)."""

    kind: Literal["move", "purge"]
    planned: int
    result: MoveResult | PurgeResult | None
    """None for a plan that selects no message (nothing ran)."""
    dry_run: bool = True
    spread: ProcessesResult[Any] | None = None
    """With ``--processes``: how its processes ended (``result`` is their merged one)."""
    gone_sent: int | None = None
    """How many of the gone messages the ledger records as sent (an earlier apply or move
    moved them); None when it cannot say (no ledger, or a purge plan, which sends nothing)."""

    @property
    def gone(self) -> int:
        return max(0, self.planned - self.result.matched) if self.result is not None else 0

    @property
    def changed(self) -> int:
        """Planned messages left in the DLQ because they are not the ones reviewed (their
        digest is not the plan's): a new dry run is to review them."""
        return self.result.changed_since_plan if self.result is not None else 0

    @property
    def interrupted(self) -> bool:
        return self.result is not None and self.result.interrupted

    @property
    def acted(self) -> bool:
        return self.result is not None and self.result.acted

    @property
    def needs_attention(self) -> bool:
        if self.spread is not None:
            return self.spread.needs_attention
        return self.result is not None and self.result.needs_attention

    def to_json(self) -> dict[str, Any]:
        if self.result is None:
            acted = "moved" if self.kind == "move" else "purged"
            return {"dry_run": self.dry_run, "kind": self.kind, "planned": 0, "matched": 0} | {
                acted: 0,
                "gone": 0,
                "changed_since_plan": 0,
            }
        data = self.spread.to_json() if self.spread is not None else self.result.to_json()
        data.update(
            planned=self.planned,
            gone=self.gone,
            gone_sent=self.gone_sent,
            changed_since_plan=self.changed,
        )
        return data


def plan_selection(plan: Plan) -> Selection:
    return Selection(message_ids=plan.message_ids)


def plan_move_options(
    plan: Plan,
    options: ApplyOptions,
    *,
    to: QueueRef | None,
    to_celery_queue: bool,
    celery: TaskKnowledge | None = None,
) -> MoveOptions:
    """The engine's options for a move plan: the plan's, with ``options`` over them."""
    opts = plan.options
    in_doubt: InDoubtPolicy = options.in_doubt or opts.get("in_doubt", "hold")
    return MoveOptions(
        selection=plan_selection(plan),
        execute=options.execute,
        to=to,
        include_expired=bool(opts.get("include_expired", False)),
        max_redrives=int(opts.get("max_redrives", DEFAULT_MAX_REDRIVES)),
        in_doubt=in_doubt,
        lease=int(opts.get("lease", DEFAULT_LEASE)),
        workers=options.workers,
        include_unknown=bool(opts.get("include_unknown", False)),
        to_celery_queue=to_celery_queue,
        ambiguous="move" if opts.get("ambiguous") == "move" else "hold",
        celery=celery,
        include_succeeded=options.include_succeeded or bool(opts.get("include_succeeded")),
        repair=plan_repair(plan),
        planned_digests=plan.digests,
    )


def plan_repair(plan: Plan) -> RepairOptions | None:
    """A move plan's edits (issue 26), applied again to each message, which is sent only if
    its body is still the one reviewed and the edits give the very body reviewed."""
    opts = plan.options
    words = opts.get("edits")
    if not words:
        return None
    if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
        raise UsageProblem(f"plan {plan.path} is damaged: its edits are not a list of words")
    archive = opts.get("archive")
    if not archive and not opts.get("no_archive"):
        raise UsageProblem(
            f"plan {plan.path} has edits but no archive for the originals: make it again "
            "with --archive PATH (or --no-archive)"
        )
    planned = {
        item.message_id: (item.digest_before, item.digest_after)
        for item in plan.items
        if item.digest_before is not None and item.digest_after is not None
    }
    return RepairOptions(
        parse_edit_words(words),
        str(archive) if archive else None,
        show_args=bool(opts.get("show_args")),
        planned=planned,
    )


def plan_purge_options(plan: Plan, options: ApplyOptions) -> PurgeOptions:
    """The purge's options for a purge plan (its archive, or none)."""
    if plan.options.get("no_archive") and plan.options.get("archive"):
        raise UsageProblem("--archive and --no-archive contradict each other")
    return PurgeOptions(
        selection=plan_selection(plan),
        execute=options.execute,
        archive=not plan.options.get("no_archive"),
        archive_to=plan.options.get("archive"),
        workers=options.workers,
        planned_digests=plan.digests,
    )


def apply_plan(
    target: DlqTarget,
    plan: Plan,
    options: MoveOptions | PurgeOptions,
    *,
    broker_factory: Callable[[], Broker],
    ledger: Ledger | None,
    record: RunRecord,
    s3_client_factory: Callable[[], Any] | None = None,
    observer: RunObserver[Any] = NULL_OBSERVER,
    stop: threading.Event | None = None,
    receive_log: ReceiveLog | None = None,
    processes: int = 1,
    wiring: Wiring | None = None,
) -> ApplyResult:
    """Run the plan's move or purge on exactly its messages (``options``: from
    :func:`plan_move_options` or :func:`plan_purge_options`); with ``processes`` above 1,
    in that many processes, each built from ``wiring`` (redrive.runs.processes)."""
    if not plan.items:
        # An empty id set would select *every* message: an empty plan does nothing.
        return ApplyResult("move" if plan.kind == "move" else "purge", 0, None, not options.execute)
    with _partway_as_apply(plan):
        outcome = _run_plan(
            target,
            options,
            broker_factory=broker_factory,
            ledger=ledger,
            record=record,
            s3_client_factory=s3_client_factory,
            observer=observer,
            stop=stop,
            receive_log=receive_log,
            processes=processes,
            wiring=wiring,
        )
        spread: ProcessesResult[Any] | None = None
        result: MoveResult | PurgeResult
        if isinstance(outcome, ProcessesResult):
            spread, result = outcome, outcome.result
        else:
            result = outcome
        kind: Literal["move", "purge"] = "move" if isinstance(options, MoveOptions) else "purge"
        applied = ApplyResult(kind, len(plan.items), result, result.dry_run, spread)
        return _with_gone(applied, plan, ledger)


def _run_plan(
    target: DlqTarget,
    options: MoveOptions | PurgeOptions,
    *,
    broker_factory: Callable[[], Broker],
    ledger: Ledger | None,
    record: RunRecord,
    s3_client_factory: Callable[[], Any] | None,
    observer: RunObserver[Any],
    stop: threading.Event | None,
    receive_log: ReceiveLog | None,
    processes: int,
    wiring: Wiring | None,
) -> MoveResult | PurgeResult | ProcessesResult[Any]:
    """The plan's move or purge, in this process or in ``processes``."""
    if isinstance(options, MoveOptions):
        return move(
            target,
            ledger,
            options,
            broker_factory=broker_factory,
            receive_log=receive_log,
            wiring=wiring,
            observer=observer,
            stop=stop,
            record=record,
            processes=processes,
            s3_client_factory=s3_client_factory,
        )
    return purge(
        target,
        options,
        broker_factory=broker_factory,
        ledger=ledger,
        command=record.command,
        record=record.info,
        s3_client_factory=s3_client_factory,
        receive_log=receive_log,
        wiring=wiring,
        observer=observer,
        stop=stop,
        processes=processes,
    )


@contextlib.contextmanager
def _partway_as_apply(plan: Plan) -> Iterator[None]:
    """An apply an error stops partway: what its run had done by then goes with the error,
    as an apply's result (the CLI prints it before the error)."""
    try:
        yield
    except RedriveError as exc:
        partial = exc.partial
        spread = partial if isinstance(partial, ProcessesResult) else None
        result = spread.result if spread is not None else partial
        if isinstance(result, MoveResult | PurgeResult):
            result.misses = None  # the plan's ids are no --message-id values (_with_gone)
            kind: Literal["move", "purge"] = "move" if plan.kind == "move" else "purge"
            exc.partial = ApplyResult(kind, len(plan.items), result, result.dry_run, spread)
        raise


def _with_gone(applied: ApplyResult, plan: Plan, ledger: Ledger | None) -> ApplyResult:
    """The plan's messages the scan did not find are gone, not --message-id values that
    matched nothing (the plan's ids are its selection; no one typed them): the run's misses
    give way to ``gone``, and the ledger says how many of them it records as sent."""
    result = applied.result
    if result is None:
        return applied
    missing = result.misses.ids_missing if result.misses is not None else frozenset()
    result.misses = None
    if ledger is None or applied.kind != "move":
        return applied
    items = [i for i in plan.items if i.key is not None and i.message_id in missing]
    entries = ledger.get_many(list({i.key for i in items if i.key is not None}))
    applied.gone_sent = sum(
        1
        for i in items
        if i.key in entries and entries[i.key].state in (KeyState.SENT, KeyState.DONE)
    )
    return applied
