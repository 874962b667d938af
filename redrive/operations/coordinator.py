"""One run's life, for every front end (the CLI, a console): s3transfer's coordinator as
the model. A front end parses what it was asked into a typed request (:class:`MoveRequest`,
:class:`PurgeRequest` for purge and archive, :class:`ReplayRequest`, :class:`ApplyRequest`,
:class:`InspectRequest`, :class:`ArchiveInspectRequest`), decides whether to ask for a
confirmation, and calls :func:`run_operation` once; it renders the :class:`Outcome` it gets
back.

The coordinator opens and closes the ledger, writes the run's record for the audit trail
(:class:`Caller` is its who), writes a plan when asked, chooses this process (with the
request's ``--workers`` threads) or ``processes`` processes, runs, and returns the typed
result, or the partial result and the error that stopped it. Stopping is the ``stop``
event: the run finishes the batch in flight and gives back every message it holds.

It never prints, never asks anything and holds no state between runs: several runs may go
at once in one process, one per thread, each with its own ``stop``. What it runs with is
the front end's :class:`Setup` (its brokers, its clients, its result backend).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from redrive.archive.storage import absolute_location
from redrive.aws.identity import local_identity
from redrive.broker.base import Broker, DlqTarget, QueueRef
from redrive.celery.knowledge import TaskKnowledge
from redrive.celery.results import ResultLookup
from redrive.dlq.receive_log import ReceiveLog
from redrive.errors import RedriveError, UsageProblem
from redrive.inspection.archive import ArchiveInspectResult, inspect_archive
from redrive.inspection.entry import inspect_queue
from redrive.inspection.processes import InspectScan
from redrive.inspection.scan import Focus, InspectResult
from redrive.ledger import Ledger, default_ledger_path, open_ledger
from redrive.operations.apply.engine import (
    ApplyOptions,
    ApplyResult,
    apply_plan,
    plan_move_options,
    plan_purge_options,
)
from redrive.operations.move import MoveOptions, MoveResult, continued_archive
from redrive.operations.move.entry import move
from redrive.operations.plan import Plan, PlanWriter
from redrive.operations.purge.engine import PurgeOptions, PurgeResult, purge_whole_queue
from redrive.operations.purge.entry import purge
from redrive.operations.replay.engine import ReplayResult
from redrive.operations.replay.entry import replay
from redrive.runs.lifecycle import RunRecord, audit_filters, audit_record
from redrive.runs.observer import NULL_OBSERVER, Observers, RunObserver
from redrive.runs.processes import ProcessesResult, Wiring

R = TypeVar("R")

# -- who asks, and what a front end runs with ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks for a run: the audit trail's who. ``user`` is the person (the OS user for a
    terminal, the signed-in user for a console), ``host`` this machine's name, where the
    front end runs (the ledger tells a live run by its host and process: :meth:`of` fills
    it), ``address`` where the request came from (a console's client), ``command`` how the
    front end names the request (the CLI's command line; a console's action)."""

    user: str
    host: str
    command: str
    address: str | None = None

    @classmethod
    def of(cls, user: str, command: str, address: str | None = None) -> Caller:
        """``user`` asking from ``address``, through a front end on this machine."""
        return cls(user, socket.gethostname(), command, address)

    @classmethod
    def local(cls, command: str) -> Caller:
        """The person at this terminal, as the OS knows them."""
        me = local_identity()
        return cls(me["user"], me["host"], command)

    def identity(self) -> dict[str, str]:
        """The record's ``user`` and ``host`` (and ``address`` when there is one)."""
        extra = {"address": self.address} if self.address is not None else {}
        return {"user": self.user, "host": self.host, **extra}


def _none() -> Any:
    return None


def _nothing() -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True, slots=True)
class Setup:
    """What a front end runs its runs with; shared by its runs, each call made per run.

    ``brokers``: a broker for a region (None: the default), called once per worker thread;
    ``ledger_clients``: the AWS client factory a DynamoDB ledger opens with; ``identity``:
    whom the broker knows the run as, for the audit (``caller``, ``sqs_client``,
    ``broker_server`` of :func:`redrive.runs.lifecycle.audit_record`); ``wiring``: how each
    process of ``--processes`` builds its own adapters (the DLQ, None for a replay; the
    ledger's URI; the request's options), None where a front end runs in one process."""

    brokers: Callable[[str | None], Broker]
    s3_client: Callable[[], Any] | None = None
    ledger_clients: Callable[[str], Any] | None = None
    receive_log: Callable[[], ReceiveLog | None] = _none
    results: Callable[[], ResultLookup | None] = _none
    identity: Callable[[], Mapping[str, Any]] = _nothing
    wiring: Callable[[DlqTarget | None, str | None, Any], Wiring] | None = None

    def broker_of(self, target: DlqTarget) -> Callable[[], Broker]:
        """Brokers for the DLQ's own region (a family may name one)."""
        return lambda: self.brokers(target.region)

    def wiring_for(self, target: DlqTarget | None, ledger: Ledger | None, options: Any) -> Any:
        if self.wiring is None:
            return None
        return self.wiring(target, ledger.uri if ledger is not None else None, options)


@dataclass(slots=True)
class Outcome(Generic[R]):
    """What a run came to: its result (None when it got nowhere), and the error that stopped
    it, if one did (then ``result`` is what it had done by then, when it had begun)."""

    result: R | None
    error: RedriveError | None = None
    plan: PlanWriter | None = None
    """The plan written (``plan_out``), once closed: its path and ``count``."""

    def unwrap(self) -> R:
        """The result, or the error raised (its ``partial``: the result so far)."""
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


# -- the requests -----------------------------------------------------------------------------


class Request(Generic[R]):
    """One operation as a front end asks for it. ``prepare`` does what must come before a
    confirmation (opening Celery's result backend, which must answer before anything is
    sent); ``run_operation`` prepares a request that was not."""

    prepared: bool = True

    def prepare(self, setup: Setup) -> Request[R]:
        return self

    def run(self, run: _Run) -> R:
        raise NotImplementedError


def with_results(options: MoveOptions, setup: Setup) -> MoveOptions:
    """The options with Celery's result backend, checked to answer before anything is
    sent (none is read with ``include_succeeded``, unless ``in_doubt`` is auto)."""
    if options.include_succeeded and options.in_doubt != "auto":
        return options
    results = setup.results()
    if results is None and options.in_doubt == "auto":
        raise UsageProblem(
            "--in-doubt auto consults Celery's result backend: give --result-backend URL "
            "(or REDRIVE_RESULT_BACKEND)"
        )
    return replace(options, results=results)


@dataclass(frozen=True, slots=True)
class MoveRequest(Request[MoveResult | ProcessesResult[MoveResult]]):
    """``move``: the DLQ's selected messages back where they belong (``plan_out``: a dry run
    writes the plan of what it would do there)."""

    target: DlqTarget
    options: MoveOptions
    processes: int = 1
    plan_out: str | None = None
    prepared: bool = False

    def prepare(self, setup: Setup) -> MoveRequest:
        if self.prepared:
            return self
        if self.plan_out and self.options.execute:
            raise UsageProblem("--plan-out records a dry run: run without --execute")
        return replace(self, options=with_results(self.options, setup), prepared=True)

    def run(self, run: _Run) -> MoveResult | ProcessesResult[MoveResult]:
        options = self.options
        ledger = run.open_for_sends(options.execute)
        if options.repair is not None:
            options = replace(options, repair=continued_archive(options.repair, ledger))
        record = run.record(self.target.label, options, ledger)
        with run.plan(self.plan_out, self.target, "move", options) as observer:
            return move(
                self.target,
                ledger,
                options,
                broker_factory=run.setup.broker_of(self.target),
                receive_log=run.setup.receive_log(),
                wiring=run.setup.wiring_for(self.target, ledger, options),
                observer=observer,
                stop=run.stop,
                record=record,
                processes=self.processes,
                s3_client_factory=run.setup.s3_client,
            )


@dataclass(frozen=True, slots=True)
class PurgeRequest(Request[PurgeResult | ProcessesResult[PurgeResult]]):
    """``purge`` (archive, then delete) and ``archive`` (``options.delete`` off). Unfiltered
    and unarchived (:attr:`whole_queue`), it is the broker's purge of the whole queue."""

    target: DlqTarget
    options: PurgeOptions
    processes: int = 1
    plan_out: str | None = None

    @property
    def whole_queue(self) -> bool:
        o = self.options
        return not o.archive and not o.selection.is_filtered and not self.plan_out

    def prepare(self, setup: Setup) -> PurgeRequest:
        if self.plan_out and self.options.execute:
            raise UsageProblem("--plan-out records a dry run: run without --execute")
        return self

    def run(self, run: _Run) -> PurgeResult | ProcessesResult[PurgeResult]:
        # A purge sends nothing, so it needs no keys; its run goes in the ledger for the audit.
        execute = self.options.execute and self.options.delete
        ledger = run.open_ledger() if execute else None
        record = run.record(self.target.label, self.options, ledger)
        if self.whole_queue:
            return purge_whole_queue(
                self.target,
                run.setup.broker_of(self.target)(),
                execute=self.options.execute,
                ledger=ledger,
                command=run.caller.command,
                record=record.info or None,
            )
        with run.plan(self.plan_out, self.target, "purge", self.options) as observer:
            return purge(
                self.target,
                self.options,
                broker_factory=run.setup.broker_of(self.target),
                ledger=ledger,
                command=run.caller.command,
                record=record.info or None,
                s3_client_factory=run.setup.s3_client,
                receive_log=run.setup.receive_log(),
                wiring=run.setup.wiring_for(self.target, ledger, None),
                observer=observer,
                stop=run.stop,
                processes=self.processes,
            )


@dataclass(frozen=True, slots=True)
class ReplayRequest(Request[ReplayResult | ProcessesResult[ReplayResult]]):
    """``replay``: an archive's selected messages sent to ``to`` (None: where each task's
    route names). A damaged archive is :class:`~redrive.archive.ArchiveDamaged`, unless
    ``allow_partial``."""

    source: str
    to: QueueRef | None
    options: MoveOptions
    allow_partial: bool = False
    processes: int = 1

    def run(self, run: _Run) -> ReplayResult | ProcessesResult[ReplayResult]:
        ledger = run.open_for_sends(self.options.execute)
        # The originals are the archive itself: the record names it, and the edits' words.
        repair = self.options.repair
        edits = {"edits": repair.words} if repair is not None else {}
        record = run.record(self.source, self.options, ledger, archive=self.source, edits=edits)
        options = with_results(self.options, run.setup)
        return replay(
            self.source,
            self.to,
            ledger,
            options,
            broker_factory=lambda: run.setup.brokers(None),
            s3_client_factory=run.setup.s3_client,
            wiring=run.setup.wiring_for(None, ledger, options),
            observer=run.observer,
            stop=run.stop,
            record=record,
            allow_partial=self.allow_partial,
            processes=self.processes,
        )


@dataclass(frozen=True, slots=True)
class ApplyRequest(Request[ApplyResult]):
    """``apply``: exactly a plan's messages (``options``: from ``plan_move_options`` or
    ``plan_purge_options``)."""

    target: DlqTarget
    plan: Plan
    options: MoveOptions | PurgeOptions
    processes: int = 1
    prepared: bool = False

    def prepare(self, setup: Setup) -> ApplyRequest:
        if self.prepared or not isinstance(self.options, MoveOptions):
            return self
        return replace(self, options=with_results(self.options, setup), prepared=True)

    def run(self, run: _Run) -> ApplyResult:
        options = self.options
        if isinstance(options, MoveOptions):
            ledger = run.open_for_sends(options.execute)
        else:
            # A purge sends nothing, so it needs no keys; its run goes in the ledger for the audit.
            ledger = run.open_ledger() if options.execute else None
        return apply_plan(
            self.target,
            self.plan,
            options,
            broker_factory=run.setup.broker_of(self.target),
            ledger=ledger,
            record=run.record(self.target.label, options, ledger),
            s3_client_factory=run.setup.s3_client,
            observer=run.observer,
            stop=run.stop,
            receive_log=run.setup.receive_log(),
            processes=self.processes,
            wiring=run.setup.wiring_for(self.target, ledger, options),
        )


def apply_request(
    target: DlqTarget,
    plan: Plan,
    applying: ApplyOptions,
    *,
    processes: int = 1,
    to: QueueRef | None = None,
    to_celery_queue: bool = True,
    celery: TaskKnowledge | None = None,
) -> ApplyRequest:
    """The request that applies ``plan`` to ``target``: a purge plan's options, or a move
    plan's with where it sends (``to``, ``to_celery_queue``, ``celery``: as the front end
    found them for the plan), ``applying`` over them."""
    options: MoveOptions | PurgeOptions
    if plan.kind == "move":
        options = plan_move_options(
            plan, applying, to=to, to_celery_queue=to_celery_queue, celery=celery
        )
    else:
        options = plan_purge_options(plan, applying)
    return ApplyRequest(target, plan, options, processes)


@dataclass(frozen=True, slots=True)
class InspectRequest(Request[InspectResult]):
    """``inspect`` of a DLQ: grouped by task, every message received given back.
    ``results``: Celery's result backend, read (None: none). The observer's ``on_progress``
    hears how many messages were received so far, ``on_depth`` the DLQ's depth."""

    target: DlqTarget
    scan: InspectScan
    processes: int = 1
    results: ResultLookup | None = None

    def run(self, run: _Run) -> InspectResult:
        observer = run.observer
        return inspect_queue(
            self.target,
            self.scan,
            broker_factory=run.setup.broker_of(self.target),
            receive_log=run.setup.receive_log(),
            results=self.results,
            wiring=run.setup.wiring_for(self.target, None, self),
            stop=run.stop,
            on_progress=observer.on_progress if observer.wants_progress else None,
            on_depth=observer.on_depth,
            processes=self.processes,
        )


@dataclass(frozen=True, slots=True)
class ArchiveInspectRequest(Request[ArchiveInspectResult]):
    """``inspect`` of an archive, offline: what reads cleanly grouped as a live inspect
    groups it, and the damage said (the observer's ``on_problem``)."""

    source: str
    focus: Focus | None = None
    limit: int | None = None

    def run(self, run: _Run) -> ArchiveInspectResult:
        return inspect_archive(
            self.source,
            focus=self.focus,
            limit=self.limit,
            s3_client_factory=run.setup.s3_client,
            on_problem=run.observer.on_problem,
        )


# -- the run ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Run:
    """One run's state while it goes: what it was given, and what it opened (closed by
    :func:`run_operation` however the run ends)."""

    setup: Setup
    ledger_uri: str | None
    caller: Caller
    observer: RunObserver[Any]
    stop: threading.Event
    ledger: Ledger | None = None
    writer: PlanWriter | None = None
    _plans: list[PlanWriter] = field(default_factory=list)

    def open_ledger(self) -> Ledger:
        """The run's ledger, opened (made if it is a file); what opening it found that the
        user should know goes to the observer's ``on_problem``."""
        self.ledger = open_ledger(self.ledger_uri, client_factory=self.setup.ledger_clients)
        for line in self.ledger.warnings:
            self.observer.on_problem(line)
        return self.ledger

    def open_for_sends(self, execute: bool) -> Ledger | None:
        """The ledger a run that sends runs with: opened (made if need be) to execute; read,
        if it exists, by a dry run (to report duplicates and in-doubt keys), never made."""
        if execute or ledger_exists(self.ledger_uri):
            return self.open_ledger()
        return None

    def record(
        self,
        label: str,
        options: Any,
        ledger: Ledger | None,
        *,
        archive: str | None = None,
        edits: Mapping[str, Any] | None = None,
    ) -> RunRecord:
        """What an executed run's ledger record says of it: who, what, the command line, and
        its edits (``edits``; by default :func:`edit_record`'s)."""
        if ledger is None or not options.execute:
            return RunRecord(self.caller.command)
        info = audit_record(
            command_line=self.caller.command,
            target=label,
            filters=audit_filters(options.selection),
            ledger=ledger.location,
            archive=archive,
            identity=self.caller.identity(),
            **self.setup.identity(),
        )
        edited = edit_record(options) if edits is None else edits
        return RunRecord(self.caller.command, {**info, **edited})

    @contextlib.contextmanager
    def plan(
        self, plan_out: str | None, target: DlqTarget, kind: str, options: Any
    ) -> Iterator[RunObserver[Any]]:
        """The run's observer, and with ``plan_out`` the plan's writer beside it: closed
        when the run returns, removed when it does not."""
        if not plan_out:
            yield self.observer
            return
        self.writer = PlanWriter(
            plan_out,
            kind=kind,
            target=target.label,
            dlq_url=target.dlq.url,
            filters=options.selection.describe(),
            options=plan_options(options),
            caller=self.caller.identity(),
        )
        yield Observers(self.observer, self.writer)
        self.writer.close()


def ledger_exists(uri: str | None) -> bool:
    """Whether a dry run has a ledger to read: a remote one, or a file that exists."""
    if uri is None:
        return default_ledger_path().exists()
    return "://" in uri or Path(uri).expanduser().exists()


def plan_options(options: MoveOptions | PurgeOptions) -> dict[str, Any]:
    """What a plan records of the run's options, for ``apply`` to run it again."""
    if isinstance(options, PurgeOptions):
        return {"archive": options.archive_to, "no_archive": not options.archive}
    knowledge = options.celery
    repair = options.repair
    return {
        "to": options.to.url if options.to else None,
        "include_expired": options.include_expired,
        "include_unknown": options.include_unknown,
        "max_redrives": options.max_redrives,
        "in_doubt": options.in_doubt,
        "ambiguous": options.ambiguous,
        "lease": options.lease,
        "route": "task" if knowledge is not None and knowledge.route_by_task else "source",
        "include_unregistered": knowledge is not None and knowledge.include_unregistered,
        "include_succeeded": options.include_succeeded,
        **(
            {
                "edits": repair.words,
                "archive": repair.archive_to,
                "no_archive": repair.archive_to is None,
                "show_args": repair.show_args,
            }
            if repair is not None
            else {}
        ),
    }


def edit_record(options: Any) -> dict[str, Any]:
    """What the audit trail keeps of a run's edits (issue 26): their words, and where the
    originals went (each key the run sent is the ledger's, under its run)."""
    repair = getattr(options, "repair", None)
    if repair is None:
        return {}
    return {"edits": repair.words, "archive": absolute_location(repair.archive_to)}


def run_operation(
    request: Request[R],
    *,
    setup: Setup,
    ledger: str | None,
    caller: Caller,
    observer: RunObserver[Any] = NULL_OBSERVER,
    stop: threading.Event | None = None,
) -> Outcome[R]:
    """Run ``request`` to its end (or to ``stop``): the one call a front end makes.
    ``ledger``: the ledger's URI (None: the default file). A KeyboardInterrupt (a second
    Ctrl-C: abort) is raised on, once the ledger is closed and a plan half written removed."""
    run = _Run(setup, ledger, caller, observer, stop or threading.Event())
    try:
        prepared = request.prepare(setup)
        result = prepared.run(run)
    except RedriveError as exc:
        _abort_plan(run)
        return Outcome(cast("R | None", exc.partial), exc)
    except BaseException:
        _abort_plan(run)
        raise
    finally:
        if run.ledger is not None:
            run.ledger.close()
    return Outcome(result, None, run.writer)


def _abort_plan(run: _Run) -> None:
    if run.writer is not None:
        run.writer.abort()
