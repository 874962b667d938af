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
  :mod:`redrive.runs.shared`.

Signals: children ignore SIGINT and SIGTERM (a terminal's Ctrl-C reaches the whole process
group; each child aborting at once is what the first Ctrl-C must not do). The parent tells
them over a pipe: ``stop`` (finish the batch in flight, give back what is held) on the first
Ctrl-C, ``abort`` (a KeyboardInterrupt in the child, as a second Ctrl-C is for one process)
on the second. The same pipe closing tells a child its parent is gone (SIGKILLed): it stops
as on ``stop`` instead of running on unsupervised.

A child that dies (a signal, or an exit without its result) stops the run: its siblings are
told to stop, finish what is in flight and end; the result names the child, how it ended
and what it left in doubt (its claimed keys, from the ledger), and needs attention (exit 3).

This module is the supervisor: it spawns the children, links each to its parent, spreads
the run over them, sums their totals, answers Ctrl-C (and carries ``abort`` with SIGUSR1)
and records the run for the audit. What each child runs is its operation's own, in a module
beside it: ``move`` and ``apply`` of a move plan (:mod:`redrive.operations.move.processes`)
scan the same DLQ from every child; ``purge``, ``archive`` and ``apply`` of a purge plan
(:mod:`redrive.operations.purge.processes`) give each child an archive of its own
(:func:`archive_part`); ``replay`` (:mod:`redrive.operations.replay.processes`) checks the
archive in the parent, then each child replays its share, split by task id; ``inspect``
(:mod:`redrive.inspection.processes`) merges the children's groups. The scans end
together (``RunShares.scan_ended``): a child holds what it received until every sibling's
scan has ended, so none receives, and counts, what another gave back.
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

from redrive.allocator import ARENAS
from redrive.aws.session import AwsSettings
from redrive.broker import BrokerSettings
from redrive.broker.base import Broker
from redrive.dlq.receive_log import ReceiveLog
from redrive.dlq.scan import shared_by_workers
from redrive.errors import RedriveError, UsageProblem
from redrive.keys import task_id_of_key
from redrive.ledger import Entry, KeyState, Ledger, open_ledger
from redrive.runs.lifecycle import Finished, Outcome, RunLifecycle
from redrive.runs.listed import Listed
from redrive.runs.observer import PlanItem, RunObserver
from redrive.runs.shared import RunShares, ScanEnds, make_shares
from redrive.selection import Sightings
from redrive.signals import handlers_while

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
    broker: BrokerSettings = field(default_factory=BrokerSettings)
    """What opens the broker (opaque here: each backend's own settings), as the parent's."""

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
    _shared: Broker | None = field(default=None, init=False)
    """The broker every worker of the child shares, where that is safe."""

    def __post_init__(self) -> None:
        self.aws = self.wiring.aws()

    def broker(self) -> Broker:
        """The broker in the DLQ's region: what the child's engine sends and receives with
        (one per worker, or one they share: :func:`shared_by_workers`)."""
        if self._shared is not None:
            return self._shared
        broker = self.wiring.broker.open(self.aws, self.wiring.region)
        if shared_by_workers(broker):
            self._shared = broker
        return broker

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

    @property
    def wants_progress(self) -> bool:
        # Sent at most every PROGRESS_EVERY: the run need not copy its counts in between.
        return time.monotonic() - self._last >= PROGRESS_EVERY

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
class Child:
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
    with handlers_while(signal.SIG_IGN, (signal.SIGINT, signal.SIGTERM)):
        yield


# A child's 2 x --workers threads would spread a long run's garbage over 16 malloc arenas
# (redrive.allocator); set from its start, MALLOC_ARENA_MAX bounds its first threads too.
# Two arenas held a -w16 child at 100,000 messages to 81 MB peak instead of 102-117 MB, with
# no CPU cost seen (bench/README.md, issue 17). A value the user set wins.
_CHILD_ARENAS = str(ARENAS)


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
        children: list[Child] | None = None,
    ) -> None:
        self.context = context
        self.scan_ends = ScanEnds(processes, context)
        self.observer = observer
        self.stop = stop
        self._progress = progress
        self._heartbeat = heartbeat
        self.children: list[Child] = children if children is not None else []
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
            self.children.append(Child(number, run_id, process, commands_out, reports_in))

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


def needs_wiring(wiring: Wiring | None) -> Wiring:
    """The wiring a run in processes builds its children from (none: a caller's mistake)."""
    if wiring is None:
        raise UsageProblem("--processes needs the processes' wiring")
    return wiring


def check_picklable(what: object, hint: str) -> None:
    """What crosses to a child must pickle: say what does not, before anything starts."""
    try:
        pickle.dumps(what)
    except Exception as exc:
        raise UsageProblem(f"--processes cannot hand {hint} to its processes ({exc})") from exc


def first_error(children: Sequence[Child]) -> RedriveError | None:
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
                    f"{status.how} before the broker confirmed the send",
                )
            )
        elif entry.state in (KeyState.SENT, KeyState.DONE):
            left.sent.append(entry)
    # Set, not added: the run's end may count again what a merge counted.
    status.in_doubt, status.moved = len(left.in_doubt), len(left.sent)
    return left


# -- one run in processes ----------------------------------------------------------------------


@dataclass(slots=True)
class Spread(Generic[R]):
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
    merge: Callable[[Sequence[Child], Sequence[ChildStatus], str | None], R]
    counts: Callable[[R], Mapping[str, int]]
    claims: bool = True
    """Whether its children claim keys in the ledger (a move does; a purge, an archive and
    an inspect do not)."""


def run_spread(
    spread: Spread[R],
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
    children: list[Child] = []
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
    spread: Spread[R],
    processes: int,
    stop: threading.Event,
    ends: tuple[list[R], list[ChildStatus], list[Child]],
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
    spread: Spread[R], processes: int, parent: str | None
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
