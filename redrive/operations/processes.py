"""``--processes N``: one command's run spread over N worker processes, each running the
one-process engine with its ``--workers`` threads, sharing the ledger and the limits.

Who owns what:

- The **parent** owns the command's run: one ledger record (:class:`RunLifecycle`: the audit
  trail's one entry, with the children's counts summed at its end), one result (the
  children's merged, :mod:`redrive.operations.merge`), the progress line, a ``--plan-out``
  file, and Ctrl-C. It claims nothing, so its own liveness decides nothing about keys.
- Each **child** (started with multiprocessing's ``spawn``: the parent has threads, and a
  forked copy of them would hold their locks) builds its own AWS clients from the picklable
  settings (:class:`Wiring`), opens the ledger itself and runs the engine as a run of its
  own, ``PARENT.K``, recorded with ``parent`` and its own pid in its info and heartbeating
  its own lease. A child killed mid-run therefore leaves exactly what a killed one-process
  run leaves: at most one claimed batch per worker, in doubt for its live siblings (its pid
  is gone) and for the next run, while the siblings' own claims are untouched.
- The children share ``--limit``, ``--rate`` and a dry run's planned keys through
  :mod:`redrive.operations.shared`.

Signals: children ignore SIGINT and SIGTERM (a terminal's Ctrl-C reaches the whole process
group; each child aborting at once is what the first Ctrl-C must not do). The parent tells
them over a pipe: ``stop`` (finish the batch in flight, give back what is held) on the first
Ctrl-C, ``abort`` (a KeyboardInterrupt in the child, as a second Ctrl-C is for one process)
on the second. The same pipe closing tells a child its parent is gone (SIGKILLed): it stops
as on ``stop`` instead of running on unsupervised.

A child that dies (a signal, or an exit without its result) stops the run: its siblings are
told to stop, finish what is in flight and end; the result names the child, how it ended
and what it left in doubt (its claimed keys, from the ledger), and needs attention (exit 3).

Per command: ``move`` and ``apply`` (:func:`move_in_processes`, :func:`purge_in_processes`)
scan the same DLQ from every child; ``purge`` and ``archive`` give each child an archive of
its own (:func:`archive_part`); ``replay`` checks the archive in the parent, then each child
replays its share, split by task id (:func:`share_of`); ``inspect`` merges the children's
groups (:func:`inspect_in_processes`). The scans end together (``RunShares.scan_ended``):
a child holds what it received until every sibling's scan has ended, so none receives,
and counts, what another gave back.
"""

from __future__ import annotations

import _thread
import contextlib
import multiprocessing
import os
import pickle
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from redrive.archive import ArchiveReader, ArchiveRecord
from redrive.archive.storage import absolute_location, archive_part
from redrive.aws.session import AwsSettings
from redrive.broker import open_broker
from redrive.broker.base import Broker, DlqTarget, QueueRef
from redrive.dlq.receive_log import ReceiveLog
from redrive.dlq.scan import digest
from redrive.errors import RedriveError, UsageProblem
from redrive.inspection.groups import DEFAULT_MAX_REDRIVES
from redrive.inspection.scan import Focus, InspectResult, inspect_counts, inspect_dlq
from redrive.keys import task_id_of_key
from redrive.ledger import Entry, KeyState, Ledger, open_ledger
from redrive.messages import decode
from redrive.operations.merge import (
    merge_inspect_results,
    merge_move_results,
    merge_purge_results,
    merge_sightings,
)
from redrive.operations.move import MAX_LISTED, Listed, MoveEngine, MoveOptions, MoveResult
from redrive.operations.observer import NULL_OBSERVER, PlanItem, RunObserver
from redrive.operations.purge import (
    PurgeOptions,
    PurgeResult,
    archive_location,
    check_archive_path,
    run_purge,
)
from redrive.operations.replay import (
    ArchiveSource,
    ReplayResult,
    archive_label,
    archive_target,
    check_whole_archive,
    stopped_replay,
)
from redrive.operations.run import Finished, Outcome, RunLifecycle, RunRecord
from redrive.operations.shared import RunShares, ScanEnds, make_shares
from redrive.operations.verdict import IN_DOUBT
from redrive.selection import Sightings

MAX_PROCESSES = 64
PROGRESS_EVERY = 0.25
"""Seconds between a child's progress reports (and the parent's progress line)."""
ABORT_WAIT = 30.0
"""After a second Ctrl-C, how long the parent waits for its children to give back what they
hold before it leaves them to their leases."""
ABORT_SIGNAL = signal.SIGUSR1
"""What carries the parent's ``abort`` to a child's main thread (never the terminal's)."""

R = TypeVar("R")
T = TypeVar("T")


# -- what a child builds for itself -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Wiring:
    """What a child needs to build its own adapters: AWS settings (not clients: those do not
    cross a process boundary), the DLQ's region, the ledger to open, whether to count
    receives, and ``rebuild``: a picklable function the child applies to the options first
    (what cannot be pickled, such as a loaded Celery app, is rebuilt there)."""

    endpoint_url: str | None = None
    aws_region: str | None = None
    profile: str | None = None
    max_attempts: int = 6
    region: str | None = None
    """The DLQ's region (:attr:`DlqTarget.region`), as ``Context.broker_of`` picks it."""
    ledger: str | None = None
    """The ledger's URI; None: the run has no ledger (a dry run without one)."""
    receive_log: bool = True
    rebuild: Callable[[Any], Any] | None = None
    broker_url: str | None = None
    """The broker's URL (None: SQS), as the parent opened it."""

    @classmethod
    def of(cls, aws: AwsSettings, **kwargs: Any) -> Wiring:
        return cls(
            endpoint_url=aws.endpoint_url,
            aws_region=aws.region,
            profile=aws.profile,
            max_attempts=aws.max_attempts,
            **kwargs,
        )

    def aws(self) -> AwsSettings:
        return AwsSettings(
            self.endpoint_url, self.aws_region, self.profile, max_attempts=self.max_attempts
        )


@dataclass(slots=True)
class ChildRun:
    """A child's side of the run, once built: what its job runs with."""

    wiring: Wiring
    shares: RunShares
    stop: threading.Event
    observer: RunObserver[Any]
    aws: AwsSettings = field(init=False)

    def __post_init__(self) -> None:
        self.aws = self.wiring.aws()

    def broker(self) -> Broker:
        """The broker in the DLQ's region: what the child's engine sends and receives with."""
        return open_broker(self.wiring.broker_url, aws=self.aws, region=self.wiring.region)

    def rebuilt(self, options: Any) -> Any:
        """``options`` with what did not cross (Wiring.rebuild) made again in the child."""
        return self.wiring.rebuild(options) if self.wiring.rebuild else options

    @contextlib.contextmanager
    def ledger(self) -> Iterator[Ledger | None]:
        ledger = (
            open_ledger(self.wiring.ledger, client_factory=self.aws.client)
            if self.wiring.ledger
            else None
        )
        try:
            yield ledger
        finally:
            if ledger is not None:
                ledger.close()

    @contextlib.contextmanager
    def receive_log(self) -> Iterator[ReceiveLog | None]:
        if not self.wiring.receive_log:
            yield None
            return
        with ReceiveLog.open_default() as log:
            yield log


class Job(Protocol):
    """One child's work: runs in the child, returns its result and its filters' sightings."""

    def run(self, child: ChildRun) -> tuple[Any, Sightings | None]: ...


@dataclass(frozen=True, slots=True)
class MoveJob:
    target: DlqTarget
    options: MoveOptions
    record: RunRecord

    def run(self, child: ChildRun) -> tuple[MoveResult, Sightings | None]:
        options = child.rebuilt(self.options)
        with child.ledger() as ledger, child.receive_log() as receive_log:
            engine = MoveEngine(
                self.target,
                ledger,
                options,
                broker_factory=child.broker,
                observer=child.observer,
                stop=child.stop,
                record=self.record,
                receive_log=receive_log,
                shares=child.shares,
            )
            return _run_to_the_end(engine), engine.sightings


def _run_to_the_end(engine: MoveEngine) -> MoveResult:
    """The engine's result, however its run ends: on a second Ctrl-C (the parent's
    ``abort``) the engine gives back what it holds and ends its run, and what it did so far
    is its parent's to count and record (issue 22), as one process records it."""
    try:
        return engine.run()
    except KeyboardInterrupt:
        engine.result.interrupted = True
        return engine.result


# -- the child process ------------------------------------------------------------------------


class _ParentLink(RunObserver[Any]):
    """The child's end of its two pipes: the parent's words in (a thread listens), reports
    out (progress, plan items, the result), one at a time."""

    def __init__(
        self, commands: Connection, reports: Connection, progress: Callable[[Any], tuple[int, ...]]
    ) -> None:
        self.stop = threading.Event()
        self.orphaned = threading.Event()
        """The parent is gone."""
        self._reports = reports
        self._progress = progress
        self._lock = threading.Lock()
        self._last = 0.0
        threading.Thread(
            target=self._listen, args=(commands,), name="redrive-parent", daemon=True
        ).start()

    def _listen(self, commands: Connection) -> None:
        while True:
            try:
                word = commands.recv()
            except (EOFError, OSError):
                # The parent is gone (killed): stop as on Ctrl-C rather than run unwatched.
                self.orphaned.set()
                self.stop.set()
                return
            self.stop.set()
            if word == "abort":
                _thread.interrupt_main(ABORT_SIGNAL)
                return

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock, contextlib.suppress(OSError):  # a parent gone hears nothing
            self._reports.send(message)

    def on_progress(self, result: Any) -> None:
        now = time.monotonic()
        if now - self._last < PROGRESS_EVERY:
            return
        self._last = now
        self.send(("progress", self._progress(result)))

    def on_plan(self, item: PlanItem) -> None:
        self.send(("plan", item))

    def on_problem(self, problem: str) -> None:
        self.send(("problem", problem))


def _aborted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _child_main(
    number: int,
    job: Job,
    wiring: Wiring,
    shares: tuple[RunShares, ScanEnds],
    commands: Connection,
    reports: Connection,
    progress: Callable[[Any], tuple[int, ...]],
) -> None:
    """A child's life: run the job, send its result (or its error, in one line)."""
    # Set before the start too (the parent ignores both while it spawns); again here in
    # case a start method did not keep them.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # The parent's "abort", simulated in the main thread (interrupt_main): SIGINT cannot
    # carry it, as simulating an ignored signal does nothing.
    signal.signal(ABORT_SIGNAL, _aborted)
    link = _ParentLink(commands, reports, progress)
    common, scan_ends = shares
    mine = replace(common, scan_ended=partial(scan_ends.wait_for_all, number, link.orphaned))
    try:
        result, sightings = job.run(
            ChildRun(wiring=wiring, shares=mine, stop=link.stop, observer=link)
        )
        link.send(("result", result, sightings))
    except KeyboardInterrupt:
        link.send(("error", "aborted", "aborted by a second Ctrl-C"))
    except UsageProblem as exc:
        _partial_result(link, exc)
        link.send(("error", "usage", str(exc)))
    except RedriveError as exc:
        _partial_result(link, exc)
        link.send(("error", "error", str(exc)))
    except Exception as exc:
        link.send(("error", "error", f"{type(exc).__name__}: {exc}"))
    finally:
        reports.close()


def _partial_result(link: _ParentLink, exc: RedriveError) -> None:
    """What a child an error stopped had done by then, for the run's summary (before the
    error, so that the parent counts it: its sends are in the ledger either way)."""
    if exc.partial is not None:
        with contextlib.suppress(Exception):  # the error is what must get through
            link.send(("result", exc.partial, None))


# -- the parent -------------------------------------------------------------------------------


@dataclass(slots=True)
class ChildStatus:
    """How one child ended, as the result reports it."""

    number: int
    run_id: str | None
    pid: int | None
    outcome: str = "running"
    """completed, interrupted, failed (an error), or died (killed, or ended without a
    result)."""
    exit_code: int | None = None
    error: str | None = None
    in_doubt: int = 0
    """Keys it claimed and never confirmed sent (a child that died): in doubt."""
    moved: int = 0
    """What the ledger records it sent before it died."""
    claims: bool = True
    """Whether its run claims keys (a move); a purge's or archive's claims nothing."""

    @property
    def died(self) -> bool:
        return self.outcome == "died"

    @property
    def how(self) -> str:
        code = self.exit_code
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(-code).name}"
            return f"killed by signal {-code}"
        return f"exited {code} without a result" if self.died else self.outcome

    def describe(self) -> str:
        who = f"process {self.number} (pid {self.pid}" + (
            f", run {self.run_id})" if self.run_id else ")"
        )
        if self.died:
            if not self.run_id:
                left = "a dry run: nothing changed"
            elif not self.claims:
                left = "every message it took is in its archive, in the DLQ, or both"
            else:
                left = (
                    f"{self.in_doubt} message(s) in doubt (claimed, send unconfirmed), "
                    f"{self.moved} moved before"
                )
            return f"{who} {self.how}: {left}"
        return f"{who} {self.outcome}" + (f": {self.error}" if self.error else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "process": self.number,
            "run_id": self.run_id,
            "pid": self.pid,
            "outcome": self.outcome,
            "exit_code": self.exit_code,
            "how": self.how,
            "error": self.error,
            "in_doubt": self.in_doubt,
            "moved": self.moved,
        }


Res = TypeVar("Res", bound=Finished)


@dataclass(slots=True)
class ProcessesResult(Generic[Res]):
    """A ``--processes`` run's merged result, with how each child ended."""

    result: Res
    processes: int
    children: list[ChildStatus]
    archives: list[str] = field(default_factory=list)
    """A purge's or archive's archives: each process wrote its own."""

    @property
    def dry_run(self) -> bool:
        return self.result.dry_run

    @property
    def interrupted(self) -> bool:
        return self.result.interrupted

    @property
    def acted(self) -> bool:
        return bool(getattr(self.result, "acted", True))

    @property
    def died(self) -> list[ChildStatus]:
        return [c for c in self.children if c.died]

    @property
    def needs_attention(self) -> bool:
        return self.result.needs_attention or bool(self.died)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.result.to_json(),
            **({"archives": self.archives} if self.archives else {}),
            "processes": self.processes,
            "children": [c.to_json() for c in self.children],
        }


@dataclass(slots=True)
class _Child:
    number: int
    run_id: str | None
    process: SpawnProcess
    commands: Connection
    reports: Connection
    progress: tuple[int, ...] = ()
    result: Any = None
    sightings: Sightings | None = None
    error: tuple[str, str] | None = None
    ended: bool = False
    told: str | None = None

    def tell(self, word: str) -> None:
        if self.told == word or self.ended:
            return
        self.told = word
        with contextlib.suppress(OSError):
            self.commands.send(word)

    def drain(self, observer: RunObserver[Any], scan_ends: ScanEnds) -> None:
        """Read what the child reported; at the end of its pipe, it has ended (and so has
        its scan, for its siblings waiting on it, whether it said so or died)."""
        try:
            while self.reports.poll():
                self._heard(self.reports.recv(), observer)
        except (EOFError, OSError):
            self.ended = True
            scan_ends.end(self.number)
            self.process.join()

    def _heard(self, message: tuple[Any, ...], observer: RunObserver[Any]) -> None:
        kind = message[0]
        if kind == "progress":
            self.progress = message[1]
        elif kind == "plan":
            observer.on_plan(message[1])
        elif kind == "problem":
            observer.on_problem(message[1])
        elif kind == "result":
            self.result, self.sightings = message[1], message[2]
        elif kind == "error":
            self.error = (message[1], message[2])

    def status(self, claims: bool) -> ChildStatus:
        code = self.process.exitcode
        # An error first: a child it stopped partway sends what it had done too.
        if self.error is not None:
            outcome = "interrupted" if self.error[0] == "aborted" else "failed"
        elif self.result is not None:
            outcome = "interrupted" if getattr(self.result, "interrupted", False) else "completed"
        else:
            outcome = "died"
        return ChildStatus(
            self.number,
            self.run_id,
            self.process.pid,
            outcome,
            code,
            self.error[1] if self.error else None,
            claims=claims,
        )


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    """SIGINT and SIGTERM ignored while a child starts, so it is born ignoring them (a
    Ctrl-C while it imports must not kill it with a traceback)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


# glibc gives each thread that allocates an arena of its own, up to 8 per core; a child's
# 2 x --workers threads then spread a long run's garbage over 16 arenas that each keep their
# high-water mark. Two arenas held a -w16 child at 100,000 messages to 81 MB peak instead of
# 102-117 MB, with no CPU cost seen (bench/README.md, issue 17). A value the user set wins.
_CHILD_ARENAS = "2"


@contextlib.contextmanager
def _allocator_bounded() -> Iterator[None]:
    """MALLOC_ARENA_MAX set for the children spawned inside (a spawned child reads the
    parent's environment when it starts; the parent's own allocator is already set up)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        yield
        return
    os.environ["MALLOC_ARENA_MAX"] = _CHILD_ARENAS
    try:
        yield
    finally:
        os.environ.pop("MALLOC_ARENA_MAX", None)


class Supervisor:
    """Starts the children, relays their reports, tells them to stop, notices deaths."""

    def __init__(
        self,
        context: SpawnContext,
        *,
        observer: RunObserver[Any],
        stop: threading.Event,
        progress: Callable[[Sequence[tuple[int, ...]]], Any],
        heartbeat: Callable[[], None],
        processes: int,
        children: list[_Child] | None = None,
    ) -> None:
        self.context = context
        self.scan_ends = ScanEnds(processes, context)
        self.observer = observer
        self.stop = stop
        self._progress = progress
        self._heartbeat = heartbeat
        self.children: list[_Child] = children if children is not None else []
        """The children as they start (``children``: the caller's list, filled in)."""

    def start(
        self,
        jobs: Sequence[tuple[Job, str | None]],
        wiring: Wiring,
        shares: RunShares,
        progress_of: Callable[[Any], tuple[int, ...]],
    ) -> None:
        for number, (job, run_id) in enumerate(jobs, start=1):
            commands_in, commands_out = self.context.Pipe(duplex=False)
            reports_in, reports_out = self.context.Pipe(duplex=False)
            process = self.context.Process(
                target=_child_main,
                args=(
                    number,
                    job,
                    wiring,
                    (shares, self.scan_ends),
                    commands_in,
                    reports_out,
                    progress_of,
                ),
                name=f"redrive-process-{number}",
            )
            with _signals_ignored(), _allocator_bounded():
                process.start()
            # Only the child keeps its ends: the parent's death closes the child's commands
            # pipe, and the child's death ends the parent's reports pipe.
            commands_in.close()
            reports_out.close()
            self.children.append(_Child(number, run_id, process, commands_out, reports_in))

    def supervise(self) -> None:
        """Until every child has ended. A child that ends without its result, or with an
        error, stops its siblings: they finish what is in flight and end."""
        shown = 0.0
        try:
            while live := [c for c in self.children if not c.ended]:
                if self.stop.is_set() or any(
                    c.ended and (c.result is None or c.error is not None) for c in self.children
                ):
                    for child in live:
                        child.tell("stop")
                wait([c.reports for c in live], timeout=PROGRESS_EVERY)
                for child in live:
                    child.drain(self.observer, self.scan_ends)
                self._heartbeat()
                if time.monotonic() - shown >= PROGRESS_EVERY:
                    shown = time.monotonic()
                    self.observer.on_progress(
                        self._progress([c.progress for c in self.children if c.progress])
                    )
        except KeyboardInterrupt:
            self.abort()
            raise

    def abort(self) -> None:
        """A second Ctrl-C: each child aborts as one process does (gives back what it holds,
        ends its run as interrupted); wait a while for them, not for ever."""
        for child in self.children:
            child.tell("abort")
        deadline = time.monotonic() + ABORT_WAIT
        # Reading their reports as they end: their results (what they did, for the run's
        # record) must not sit in a full pipe. A third Ctrl-C: wait no more.
        with contextlib.suppress(KeyboardInterrupt):
            while live := [c for c in self.children if not c.ended]:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                wait([c.reports for c in live], timeout=min(left, PROGRESS_EVERY))
                for child in live:
                    child.drain(self.observer, self.scan_ends)

    def close(self) -> None:
        for child in self.children:
            child.commands.close()
            child.reports.close()
            if child.process.is_alive():
                child.process.join(1.0)


def check_processes(processes: int) -> None:
    if not 1 <= processes <= MAX_PROCESSES:
        raise UsageProblem(f"--processes must be from 1 to {MAX_PROCESSES}, not {processes}")


def check_picklable(what: object, hint: str) -> None:
    """What crosses to a child must pickle: say what does not, before anything starts."""
    try:
        pickle.dumps(what)
    except Exception as exc:
        raise UsageProblem(f"--processes cannot hand {hint} to its processes ({exc})") from exc


def first_error(children: Sequence[_Child]) -> RedriveError | None:
    for child in children:
        if child.error is not None and child.error[0] in ("usage", "error"):
            kind, message = child.error
            return (UsageProblem if kind == "usage" else RedriveError)(message)
    return None


@dataclass(slots=True)
class Left:
    """What a child that ended without its result left in the ledger."""

    in_doubt: list[Listed] = field(default_factory=list)
    """Its keys still claimed: claimed, send unconfirmed."""
    sent: list[Entry] = field(default_factory=list)
    """Its keys sent (or sent and their DLQ copy deleted)."""


def left_by(ledger: Ledger | None, status: ChildStatus) -> Left:
    """What a dead child left: its keys still claimed (in doubt, listed with the task id
    their key names) and the ones it sent, both counted on ``status``."""
    left = Left()
    if ledger is None or status.run_id is None:
        return left
    for entry in ledger.keys_for_run(status.run_id):
        if entry.state == KeyState.CLAIMED:
            left.in_doubt.append(
                Listed(
                    entry.task,
                    task_id_of_key(entry.key),
                    entry.message_id,
                    entry.key,
                    f"claimed by process {status.number} (run {status.run_id}), which was "
                    f"{status.how} before SQS confirmed the send",
                )
            )
        elif entry.state in (KeyState.SENT, KeyState.DONE):
            left.sent.append(entry)
    # Set, not added: the run's end may count again what a merge counted.
    status.in_doubt, status.moved = len(left.in_doubt), len(left.sent)
    return left


# -- one run in processes ----------------------------------------------------------------------


@dataclass(slots=True)
class _Spread(Generic[R]):
    """How one kind of run goes in processes: its parent's record, its children's jobs,
    their progress and their merge."""

    ledger: Ledger | None
    execute: bool
    command: str
    info: Mapping[str, Any]
    lease: float
    limit: int | None
    rate: float | None
    job: Callable[[int, str | None, str | None], Job]
    """(process number, its run id, the parent's run id) -> its job."""
    progress_of: Callable[[Any], tuple[int, ...]]
    """In the child: the counts its progress report carries."""
    progress: Callable[[Sequence[tuple[int, ...]], str | None], Any]
    """In the parent: a result to show from the children's reports (what the progress line
    reads, which for a replay is its engine's result)."""
    merge: Callable[[Sequence[_Child], Sequence[ChildStatus], str | None], R]
    counts: Callable[[R], Mapping[str, int]]
    claims: bool = True
    """Whether its children claim keys in the ledger (a move does; a purge, an archive and
    an inspect do not)."""


def _run_spread(
    spread: _Spread[R],
    *,
    processes: int,
    wiring: Wiring,
    observer: RunObserver[Any],
    stop: threading.Event,
    done: Callable[[R, list[ChildStatus]], T],
) -> T:
    """The run in its processes; ``done`` makes the command's result of the merged one and
    how each child ended. A child's error ends the run with that error, carrying what all
    of them had done by then (``partial``)."""
    context = multiprocessing.get_context("spawn")
    merged: list[R] = []
    statuses: list[ChildStatus] = []
    children: list[_Child] = []
    life = _spread_lifecycle(spread, processes, stop, (merged, statuses, children))
    jobs = _child_jobs(spread, processes, life.run_id)
    with tempfile.TemporaryDirectory(prefix="redrive-processes-") as scratch:
        shares = make_shares(
            context,
            limit=spread.limit,
            rate=spread.rate,
            scratch=Path(scratch),
            plans=not spread.execute,
        )
        with life:
            supervisor = Supervisor(
                context,
                observer=observer,
                stop=stop,
                progress=lambda snapshots: spread.progress(snapshots, life.run_id),
                heartbeat=life.heartbeat,
                processes=processes,
                children=children,
            )
            try:
                supervisor.start(jobs, wiring, shares, spread.progress_of)
                supervisor.supervise()
            finally:
                supervisor.close()
                # However the run ends (a second Ctrl-C too): its record names every child.
                statuses.extend(c.status(spread.claims) for c in children)
            error = first_error(children)
            if error is not None:
                with contextlib.suppress(Exception):  # the error is what must get through
                    merged.append(spread.merge(children, statuses, life.run_id))
                    error.partial = done(merged[0], statuses)
                raise error
            merged.append(spread.merge(children, statuses, life.run_id))
            life.end(_spread_outcome(statuses, stop))
    return done(merged[0], statuses)


def _spread_lifecycle(
    spread: _Spread[R],
    processes: int,
    stop: threading.Event,
    ends: tuple[list[R], list[ChildStatus], list[_Child]],
) -> RunLifecycle:
    """The parent's run: its counts are the merged result's, its end names every child
    (``ends``: the merged result, the children's statuses and the children, filled in as
    they end). A run that ends before its result is merged (a second Ctrl-C, an error)
    records the children's counts all the same: merged from what they reported and, for
    those that could not report, from the ledger (issue 22)."""
    merged, statuses, children = ends

    def counts() -> Mapping[str, int]:
        if merged:
            return spread.counts(merged[0])
        with contextlib.suppress(Exception):
            known = statuses or [c.status(spread.claims) for c in children]
            return spread.counts(spread.merge(children, known, None))
        return {}

    return RunLifecycle(
        spread.ledger,
        execute=spread.execute,
        command=spread.command,
        info={**spread.info, "processes": processes},
        lease=spread.lease,
        stop=stop,
        counts=counts,
        end_info=lambda: {"children": [s.to_json() for s in statuses]},
    )


def _child_jobs(
    spread: _Spread[R], processes: int, parent: str | None
) -> list[tuple[Job, str | None]]:
    """Each child's job and run id (the parent's, numbered)."""
    jobs: list[tuple[Job, str | None]] = []
    for number in range(1, processes + 1):
        run_id = f"{parent}.{number}" if parent else None
        jobs.append((spread.job(number, run_id, parent), run_id))
    return jobs


def _spread_outcome(statuses: Sequence[ChildStatus], stop: threading.Event) -> Outcome:
    if any(s.died for s in statuses):
        return "failed"
    return "interrupted" if stop.is_set() else "completed"


# -- move ------------------------------------------------------------------------------------


def _move_progress(result: MoveResult) -> tuple[int, ...]:
    return (result.scanned, result.matched, result.moved, result.depth_before or 0)


def move_in_processes(
    target: DlqTarget,
    ledger: Ledger | None,
    options: MoveOptions,
    *,
    processes: int,
    wiring: Wiring,
    observer: RunObserver[MoveResult] = NULL_OBSERVER,
    stop: threading.Event | None = None,
    record: RunRecord | None = None,
) -> ProcessesResult[MoveResult]:
    """``move`` (or ``apply`` of a move plan) in ``processes`` processes (see the module)."""
    check_processes(processes)
    if options.execute and ledger is None:
        raise UsageProblem("an executed move needs a ledger")
    stop = stop or threading.Event()
    record = record or RunRecord("move")
    crossing = _crossing(options, wiring)

    def job(number: int, run_id: str | None, parent: str | None) -> Job:
        return MoveJob(target, crossing, _child_record(record, number, run_id, parent))

    spread = _move_spread(
        _MoveRun(target, ledger, options, record, stop),
        {"target": target.label, "dlq": target.dlq.url},
        job,
        move_of=lambda result: result if isinstance(result, MoveResult) else None,
        wrap=lambda result, children: result,
        unwrap=lambda result: result,
    )
    return _run_spread(
        spread,
        processes=processes,
        wiring=wiring,
        observer=observer,
        stop=stop,
        done=lambda result, statuses: ProcessesResult(result, processes, statuses),
    )


def _child_record(
    record: RunRecord, number: int, run_id: str | None, parent: str | None
) -> RunRecord:
    """A child's own record of a move-like run: the parent's, naming the parent and its
    number."""
    return RunRecord(record.command, {**record.info, "parent": parent, "process": number}, run_id)


def _crossing(options: MoveOptions, wiring: Wiring) -> MoveOptions:
    """The options as they cross to the children: the Celery app and its result backend do
    not (each child opens its own, Wiring.rebuild); the parent's serve the checks it made."""
    crossing = replace(options, celery=None, results=None) if wiring.rebuild else options
    check_picklable(crossing, "these options")
    return crossing


@dataclass(frozen=True, slots=True)
class _MoveRun:
    """A move-like run (move, apply of a move plan, replay) as its parent sees it."""

    target: DlqTarget
    ledger: Ledger | None
    options: MoveOptions
    record: RunRecord
    stop: threading.Event

    def blank(self, run_id: str | None) -> MoveResult:
        return MoveResult(
            dry_run=not self.options.execute,
            target=self.target.label,
            dlq=self.target.dlq.name,
            run_id=run_id,
            ledger=self.ledger.location if self.ledger is not None else None,
        )

    def progress(self, snapshots: Sequence[tuple[int, ...]], run_id: str | None) -> MoveResult:
        shown = self.blank(run_id)
        shown.scanned = sum(s[0] for s in snapshots)
        shown.matched = sum(s[1] for s in snapshots)
        shown.moved = sum(s[2] for s in snapshots)
        shown.depth_before = max((s[3] for s in snapshots), default=None) or None
        return shown


def _move_spread(
    run: _MoveRun,
    info: Mapping[str, Any],
    job: Callable[[int, str | None, str | None], Job],
    *,
    move_of: Callable[[Any], MoveResult | None],
    wrap: Callable[[MoveResult, Sequence[_Child]], R],
    unwrap: Callable[[R], MoveResult],
) -> _Spread[R]:
    """How a move-like run goes in processes: ``move_of`` finds the engine's result in a
    child's, ``wrap`` makes the command's result of the merged one (``unwrap``: back)."""
    started = time.monotonic()
    options = run.options

    def merge(children: Sequence[_Child], statuses: Sequence[ChildStatus], run_id: str | None) -> R:
        parts = [move_of(c.result) for c in children]
        result = _merged_moves(run.blank(run_id), children, parts, statuses, run.ledger, options)
        result.seconds = time.monotonic() - started
        # Children stop when told: on the operator's Ctrl-C (interrupted), or because a
        # sibling died (then the run needs attention, exit 3, not 130).
        result.interrupted = run.stop.is_set()
        return wrap(result, children)

    return _Spread(
        ledger=run.ledger,
        execute=options.execute,
        command=run.record.command,
        info={**info, "filters": options.selection.describe(), **run.record.info},
        lease=options.lease,
        limit=options.selection.limit,
        rate=options.rate,
        job=job,
        progress_of=_move_progress,
        progress=run.progress,
        merge=merge,
        counts=lambda result: unwrap(result).run_counts(),
    )


def _merged_moves(
    template: MoveResult,
    children: Sequence[_Child],
    results: Sequence[MoveResult | None],
    statuses: Sequence[ChildStatus],
    ledger: Ledger | None,
    options: MoveOptions,
) -> MoveResult:
    parts = [r for r in results if r is not None]
    sightings = merge_sightings(options.selection, [c.sightings for c in children])
    result = merge_move_results(template, parts, sightings)
    for child, part, status in zip(children, results, statuses, strict=True):
        if part is None:
            _add_left(result, child.progress, status, left_by(ledger, status))
    return result


def _add_left(
    result: MoveResult, progress: tuple[int, ...], status: ChildStatus, left: Left
) -> None:
    """A child that ended without its result (it died), counted from the ledger: its sends
    (moved, per task), its claims (in doubt, listed); matched and scanned at least that, and
    at least what it last reported."""
    for entry in left.sent:
        counts = result.task(entry.task)
        counts.matched += 1
        counts.moved += 1
        counts.targets[entry.target.rsplit("/", 1)[-1]] += 1
    result.moved += status.moved
    result.in_doubt += status.in_doubt
    if status.died:
        result.died_in_doubt += status.in_doubt
    scanned, matched = progress[:2] if progress else (0, 0)
    matched = max(matched, status.moved + status.in_doubt)
    result.matched += matched
    result.scanned += max(scanned, matched)
    for item in left.in_doubt:
        result.skipped[IN_DOUBT] += 1
        result.task(item.task).matched += 1
        result.task(item.task).skipped[IN_DOUBT] += 1
        if len(result.in_doubt_messages) < MAX_LISTED:
            result.in_doubt_messages.append(item)


# -- purge and archive --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PurgeJob:
    target: DlqTarget
    options: PurgeOptions
    command: str
    record: Mapping[str, Any] | None
    run_id: str | None

    def run(self, child: ChildRun) -> tuple[PurgeResult, Sightings | None]:
        seen: list[Sightings | None] = []
        with child.ledger() as ledger, child.receive_log() as receive_log:
            result = run_purge(
                self.target,
                self.options,
                broker_factory=child.broker,
                ledger=ledger,
                command=self.command,
                record=self.record,
                s3_client_factory=lambda: child.aws.client("s3"),
                observer=child.observer,
                stop=child.stop,
                receive_log=receive_log,
                run_id=self.run_id,
                shares=child.shares,
                sightings=seen.append,
            )
        return result, seen[0] if seen else None


def _purge_progress(result: PurgeResult) -> tuple[int, ...]:
    return (
        result.scanned,
        result.matched,
        result.archived,
        result.purged,
        result.depth_before or 0,
    )


def purge_in_processes(
    target: DlqTarget,
    options: PurgeOptions,
    *,
    processes: int,
    wiring: Wiring,
    ledger: Ledger | None = None,
    command: str = "purge",
    record: Mapping[str, Any] | None = None,
    observer: RunObserver[PurgeResult] = NULL_OBSERVER,
    stop: threading.Event | None = None,
) -> ProcessesResult[PurgeResult]:
    """``purge`` or ``archive`` (or ``apply`` of a purge plan) in ``processes`` processes,
    each archiving to its own file (:func:`archive_part`) before it deletes."""
    check_processes(processes)
    check_picklable(options, "these options")
    stop = stop or threading.Event()
    where = archive_location(target, options)
    if where and options.archive and "://" not in where:
        # Each process's archive must be writable before any of them deletes anything: one
        # refused later would leave the run half done. The name given must be free too: it
        # stands for the parts (replay takes it), not for an earlier archive of that name.
        check_archive_path(where)
        for number in range(1, processes + 1):
            check_archive_path(archive_part(where, number))
    run = _PurgeRun(target, options, stop, where)

    def job(number: int, run_id: str | None, parent: str | None) -> Job:
        mine = replace(options, archive_to=archive_part(where, number) if where else None)
        info = {**(record or {}), "parent": parent, "process": number}
        # An archive without a ledger still names its run in its records: the child's own.
        return PurgeJob(target, mine, command, info, run_id)

    spread = _Spread(
        ledger=ledger,
        execute=options.execute,
        command=command,
        info={**(record or {}), "archive": absolute_location(where), "dlq": target.dlq.url},
        lease=options.lease,
        limit=options.selection.limit,
        rate=None,
        job=job,
        progress_of=_purge_progress,
        progress=run.progress,
        merge=run.merge,
        counts=PurgeResult.run_counts,
        claims=False,
    )
    return _run_spread(
        spread,
        processes=processes,
        wiring=wiring,
        observer=observer,
        stop=stop,
        done=lambda result, statuses: ProcessesResult(
            result, processes, statuses, archives=run.archives
        ),
    )


@dataclass(slots=True)
class _PurgeRun:
    """A purge or archive as its parent sees it: its progress and its merged result."""

    target: DlqTarget
    options: PurgeOptions
    stop: threading.Event
    where: str | None
    """The run's archive location (each process's is beside it: :func:`archive_part`)."""
    started: float = field(default_factory=time.monotonic)
    archives: list[str] = field(default_factory=list)
    """The children's archives, as they reported them (none for one that archived none)."""

    def blank(self, run_id: str | None, archive: str | None = None) -> PurgeResult:
        return PurgeResult(
            dry_run=not self.options.execute,
            target=self.target.label,
            dlq=self.target.dlq.name,
            archive=archive,
            command="purge" if self.options.delete else "archive",
            run_id=run_id,
        )

    def progress(self, snapshots: Sequence[tuple[int, ...]], run_id: str | None) -> PurgeResult:
        shown = self.blank(run_id)
        shown.scanned = sum(s[0] for s in snapshots)
        shown.matched = sum(s[1] for s in snapshots)
        shown.archived = sum(s[2] for s in snapshots)
        shown.purged = sum(s[3] for s in snapshots)
        shown.depth_before = max((s[4] for s in snapshots), default=None) or None
        return shown

    def merge(
        self, children: Sequence[_Child], statuses: Sequence[ChildStatus], run_id: str | None
    ) -> PurgeResult:
        parts = [c.result for c in children if isinstance(c.result, PurgeResult)]
        sightings = merge_sightings(self.options.selection, [c.sightings for c in children])
        archives = [p.archive for p in parts if p.archive]
        result = merge_purge_results(self.blank(run_id, None), parts, sightings)
        for child, status in zip(children, statuses, strict=True):
            if isinstance(child.result, PurgeResult):
                continue
            left = archive_part(self.where, status.number) if self.where else None
            if left and ("://" in left or Path(left).expanduser().exists()):
                # It ended before it could say (died, or aborted by a second Ctrl-C): what
                # it archived is there all the same.
                archives.append(left)
            if child.progress:
                # What it archived and deleted before it died is in its archive and gone
                # from the DLQ: counted as it last reported.
                scanned, matched, archived, purged, _ = child.progress
                result.scanned += scanned
                result.matched += matched
                result.archived += archived
                result.purged += purged
        self.archives[:] = archives  # set, not added: the run's end may merge again
        if archives and self.where:
            # The name given stands for every part (replay takes it); each is named too.
            result.archive, result.parts = self.where, list(archives)
        result.seconds = time.monotonic() - self.started
        result.interrupted = self.stop.is_set()
        return result


# -- replay ------------------------------------------------------------------------------------


def share_of(record: ArchiveRecord, processes: int) -> int:
    """Which process (0-based) replays a record: by its task id (the body's, else its
    MessageId), so that every copy of a task is in one process's share and is settled
    there as one process settles it (a duplicate, never a busy claim of a sibling)."""
    task_id = decode(record.body).task_id
    return digest(task_id or record.message_id) % processes


@dataclass(frozen=True, slots=True)
class ReplayJob:
    source: str
    options: MoveOptions
    record: RunRecord
    allow_partial: bool
    number: int
    processes: int

    def run(self, child: ChildRun) -> tuple[ReplayResult, Sightings | None]:
        options = child.rebuilt(self.options)
        reader = ArchiveReader(
            self.source,
            s3_client_factory=lambda: child.aws.client("s3"),
            on_problem=lambda problem: None,  # the parent's check reported them
            skip_damage=self.allow_partial,
        )
        mine = (r for r in reader if share_of(r, self.processes) == self.number - 1)
        archive = ArchiveSource(mine, child.stop)
        with child.ledger() as ledger:
            engine = MoveEngine(
                archive_target(self.source),
                ledger,
                options,
                broker_factory=child.broker,
                observer=child.observer,
                stop=child.stop,
                source=archive,
                record=self.record,
                shares=child.shares,
            )
            try:
                result = _run_to_the_end(engine)
            except RedriveError as exc:
                if isinstance(exc.partial, MoveResult):
                    exc.partial = ReplayResult(exc.partial, archive.damage or reader.report())
                raise
        return ReplayResult(result, archive.damage or reader.report()), engine.sightings


def replay_in_processes(
    source: str,
    to: QueueRef | None,
    ledger: Ledger | None,
    options: MoveOptions,
    *,
    processes: int,
    wiring: Wiring,
    s3_client_factory: Callable[[], Any] | None = None,
    observer: RunObserver[MoveResult] = NULL_OBSERVER,
    stop: threading.Event | None = None,
    record: RunRecord | None = None,
    allow_partial: bool = False,
) -> ProcessesResult[ReplayResult]:
    """``replay`` in ``processes`` processes: the parent checks the archive whole (as one
    process does, before anything is sent), then each child replays its share of it
    (:func:`share_of`)."""
    check_processes(processes)
    if options.execute and ledger is None:
        raise UsageProblem("an executed replay needs a ledger")
    stop = stop or threading.Event()
    record = record or RunRecord("replay")
    check = check_whole_archive(source, s3_client_factory, observer, stop, allow_partial)
    if check is None:
        return ProcessesResult(stopped_replay(source, options), processes, [])
    options = replace(options, to=to)
    crossing = _crossing(options, wiring)

    def job(number: int, run_id: str | None, parent: str | None) -> Job:
        child_record = _child_record(record, number, run_id, parent)
        return ReplayJob(source, crossing, child_record, allow_partial, number, processes)

    def wrap(result: MoveResult, children: Sequence[_Child]) -> ReplayResult:
        found = (c.result.damage for c in children if isinstance(c.result, ReplayResult))
        return ReplayResult(result, check.damage or next((d for d in found if d), None))

    spread = _move_spread(
        _MoveRun(archive_target(source), ledger, options, record, stop),
        {"target": archive_label(source), "dlq": source},
        job,
        move_of=lambda result: result.move if isinstance(result, ReplayResult) else None,
        wrap=wrap,
        unwrap=lambda result: result.move,
    )
    return _run_spread(
        spread,
        processes=processes,
        wiring=wiring,
        observer=observer,
        stop=stop,
        done=lambda result, statuses: ProcessesResult(result, processes, statuses),
    )


# -- inspect -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InspectScan:
    """What one inspect scan reads: inspect_dlq's options, the same in every process
    (``now`` too, so expiry and ages agree) but ``limit``, split between them."""

    limit: int | None = None
    show_args: bool = False
    workers: int = 1
    max_redrives: int = DEFAULT_MAX_REDRIVES
    now: float = 0.0
    lease: int = 30
    focus: Focus | None = None
    group_by: str | None = None
    counts: tuple[int, int] | None = None
    """SQS's depth and in-flight count, as the parent read them (the children read none)."""


def limit_share(limit: int | None, processes: int, number: int) -> int | None:
    """Process ``number``'s part of an inspect's ``--limit``: the parts add up to it."""
    if limit is None:
        return None
    return limit // processes + (1 if number <= limit % processes else 0)


@dataclass(frozen=True, slots=True)
class InspectJob:
    target: DlqTarget
    scan: InspectScan

    def run(self, child: ChildRun) -> tuple[InspectResult, Sightings | None]:
        results = child.rebuilt(None)
        observer = child.observer
        try:
            with child.receive_log() as receive_log:
                return inspect_dlq(
                    self.target,
                    child.broker,
                    limit=self.scan.limit,
                    show_args=self.scan.show_args,
                    workers=self.scan.workers,
                    stop=child.stop,
                    on_progress=observer.on_progress,
                    max_redrives=self.scan.max_redrives,
                    now=self.scan.now,
                    lease=self.scan.lease,
                    receive_log=receive_log,
                    focus=self.scan.focus,
                    results=results,
                    group_by=self.scan.group_by,
                    scan_ended=child.shares.scan_ended,
                    counts=self.scan.counts,
                ), None
        finally:
            if results is not None:
                results.close()


def _received(n: int) -> tuple[int, ...]:
    return (n,)


def inspect_in_processes(
    target: DlqTarget,
    scan: InspectScan,
    *,
    processes: int,
    wiring: Wiring,
    broker: Broker,
    stop: threading.Event | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_depth: Callable[[int], None] | None = None,
) -> InspectResult:
    """``inspect`` in ``processes`` processes: each scans part of the DLQ, holding what it
    received until every one's scan has ended; the groups merged into one inspect. A
    process that dies makes the inspect an error (what it counted is lost)."""
    check_processes(processes)
    check_picklable(scan, "these options")
    stop = stop or threading.Event()
    started = time.monotonic()
    depth, hidden = inspect_counts(broker, target.dlq.url)
    if on_depth is not None:
        on_depth(depth)

    def job(number: int, run_id: str | None, parent: str | None) -> Job:
        limit = limit_share(scan.limit, processes, number)
        share = replace(scan, limit=limit, counts=(depth, hidden))
        return InspectJob(target, share)

    merge = _inspect_merger(depth, hidden, started, stop)
    spread: _Spread[InspectResult] = _Spread(
        ledger=None,
        execute=False,
        command="inspect",
        info={},
        lease=scan.lease,
        limit=None,
        rate=None,
        job=job,
        progress_of=_received,
        progress=lambda snapshots, run_id: sum(s[0] for s in snapshots),
        merge=merge,
        counts=lambda result: {},
        claims=False,
    )
    return _run_spread(
        spread,
        processes=processes,
        wiring=wiring,
        observer=_Received(on_progress),
        stop=stop,
        # Each process counted up to its share of the limit: the note names the one given.
        done=lambda result, statuses: replace(result, limit=scan.limit),
    )


class _Received(RunObserver[Any]):
    """Hands the children's messages received so far to ``on_progress``."""

    def __init__(self, on_progress: Callable[[int], None] | None) -> None:
        self._on_progress = on_progress

    def on_progress(self, result: Any) -> None:
        if self._on_progress is not None:
            self._on_progress(result)


def _inspect_merger(
    depth: int, hidden: int, started: float, stop: threading.Event
) -> Callable[[Sequence[_Child], Sequence[ChildStatus], str | None], InspectResult]:
    """The inspect the children's groups merge into; a dead child makes it an error."""

    def merge(
        children: Sequence[_Child], statuses: Sequence[ChildStatus], run_id: str | None
    ) -> InspectResult:
        dead = [s for s in statuses if s.died]
        if dead:
            raise RedriveError(
                f"{dead[0].describe()}: the inspect is incomplete (what it counted is lost); "
                "run it again"
            )
        parts = [c.result for c in children if isinstance(c.result, InspectResult)]
        merged: InspectResult = merge_inspect_results(
            parts, depth_before=depth, hidden_before=hidden, seconds=time.monotonic() - started
        )
        merged.interrupted = merged.interrupted or stop.is_set()
        return merged

    return merge
