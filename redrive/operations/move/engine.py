"""The move engine: one run's life (its ledger record, its scan, its workers' pipelines, its
end), wiring the parts that decide (:mod:`.decide`) and carry out (:mod:`.execute`) each batch.

Per batch of received messages (every step is a point a crash may hit; see the tests), as
:data:`STEPS` names the points between them: receive, decide, claim, send, record, delete
(:mod:`redrive.operations.move`); claim, send and record once per send batch of it."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from redrive.broker.base import Broker, Capabilities, Delivery, DlqTarget
from redrive.dlq.receive_log import ReceiveLog
from redrive.dlq.scan import DlqScan, run_pipelines
from redrive.errors import RedriveError, UsageProblem
from redrive.ledger import Ledger
from redrive.messages import TaskInfo
from redrive.operations.limit import Limit
from redrive.operations.move.candidate import DecidedBatch
from redrive.operations.move.copies import KeySettler
from redrive.operations.move.decide import Decider, PlannedKeys
from redrive.operations.move.execute import Executor
from redrive.operations.move.options import MessageSource, MoveOptions
from redrive.operations.move.owners import ClaimOwners
from redrive.operations.move.repair_step import RepairStep
from redrive.operations.move.result import MoveResult, MoveTally
from redrive.operations.move.routing import Router, source_name
from redrive.operations.move.send import Sender
from redrive.operations.move.stages import OVERLAP_SAMPLE, Prefetch, overlap_pays
from redrive.operations.move.stopped import count_stopped
from redrive.operations.seen import SeenByFilters
from redrive.operations.verdict import BUSY
from redrive.operations.waiting import BlockedClock
from redrive.rate import RateLimiter
from redrive.runs.lifecycle import Outcome, RunLifecycle, RunRecord, run_is_live
from redrive.runs.observer import NULL_OBSERVER, RunObserver
from redrive.runs.shared import LimitLike, PlannedLike, RateLike, RunShares
from redrive.selection import Sightings

# Names of the points between steps, where tests inject crashes.
STEPS = ("received", "claimed", "sent", "recorded", "deleted")
REPAIR_STEPS = ("received", "archived", "claimed", "sent", "recorded", "deleted")
"""The points of a move with edits: its originals are archived before anything is claimed."""


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
        repair: RepairStep | None = None,
    ) -> None:
        """``source``: where the messages come from (default: a scan of the target's DLQ);
        ``record``: what the run's ledger record says of it (its command line, who, what);
        ``receive_log``: where the DLQ scan counts redrive's own receives; ``shares``: the
        limit, rate and dry-run keys this run shares with other processes (``--processes``,
        redrive.runs.shared), else its own; ``repair``: the run's edits and the archive
        of its originals (issue 26), which ``options.repair`` asks for."""
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
        self._repair = repair
        if options.repair is not None and repair is None:
            raise UsageProblem("a move with edits needs its repair step")
        self.result = self._empty_result()
        self.result.repair = repair.report if repair is not None else None
        self._tally = MoveTally(
            self.result,
            SeenByFilters(options.selection),
            lambda message: source_name(target, options.to, message),
        )
        self._wire_shares(shares)
        self._decider = self._wire_decider()
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
        self._planned: PlannedLike = shares.planned if shares else PlannedKeys()
        self._rate: RateLike = shares.rate if shares else RateLimiter(self.options.rate)

    def _wire_decider(self) -> Decider:
        """What decides the run's batches: its routes, the claims' owners, the keys."""
        owners = self._owners = ClaimOwners(self.ledger, self.run_id, self._parent, self.now)
        return Decider(
            self.target,
            self.options,
            tally=self._tally,
            limit=self._limit,
            planned=self._planned,
            router=Router(self.target, self.options, self._tally, archived=self.source is not None),
            owners=owners,
            settler=KeySettler(self.ledger, self.options, owners, self._planned),
            observer=self.observer,
            clock=self.now,
            namespace=lambda: self._limits.key_namespace,
            legacy=self.ledger is not None and self.ledger.legacy_keys,
            gate_reasons=self._gate_reasons,
            repair=self._repair,
        )

    def _wire_executor(self, scan: MessageSource) -> Executor:
        """What carries out the run's batches from ``scan`` (once the broker's limits are known)."""
        sender = Sender(
            self.ledger,
            self.run_id,
            dlq_name=self.target.dlq.name,
            limits=self._limits,
            rate=self._rate,
        )
        return Executor(
            self.ledger,
            self.run_id,
            self.options,
            scan=scan,
            dlq_url=self.target.dlq.url,
            tally=self._tally,
            limit=self._limit,
            sender=sender,
            observer=self.observer,
            heartbeat=self._life.heartbeat,
        )

    @property
    def sightings(self) -> Sightings | None:
        """What the run's --task and --message-id filters saw (merged across processes)."""
        return self._tally.seen.sightings()

    # -- the run -------------------------------------------------------------------------

    def run(self) -> MoveResult:
        started = time.monotonic()
        broker = self.broker_factory()
        self._know(broker)
        scan = self.source if self.source is not None else self._dlq_scan(broker)
        self._scan = scan
        self._executor = self._wire_executor(scan)
        with self._life:
            try:
                try:
                    run_pipelines(
                        self._work, broker, self.broker_factory, self.options.workers, self.stop
                    )
                except (Exception, KeyboardInterrupt) as exc:
                    self._end_on_error(exc, scan, started)
                    raise
                outcome: Outcome = "interrupted" if self.stop.is_set() else "completed"
                self._finish(broker, scan, outcome, started)
            finally:
                scan.close()
        return self.result

    @property
    def _archives_originals(self) -> bool:
        repair = self.options.repair
        return self.options.execute and repair is not None and repair.archive_to is not None

    def _dlq_scan(self, broker: Broker) -> DlqScan:
        # What the run skips stays hidden until its end, renewed while it lives: a killed
        # run's messages come back within about --lease (see redrive.dlq.scan).
        depth = broker.counts(self.target.dlq.url).ready
        self.result.depth_before = depth
        return DlqScan(
            url=self.target.dlq.url,
            lease=self.options.lease,
            stop=self.stop,
            broker_factory=self.broker_factory,
            receive_log=self.receive_log,
            # Only a --where on them reads redrive's own receives (a move shows none), and an
            # edited move's archive of the originals, which keeps them as purge's does.
            receive_counts=self.options.selection.reads("consumer_receives")
            or self._archives_originals,
        )

    def _end_on_error(
        self, exc: Exception | KeyboardInterrupt, scan: MessageSource, started: float
    ) -> None:
        """Give back what is held and end the run as failed (the caller raises ``exc``). A
        real crash (SIGKILL) never gets here, nor do the simulated ones in the tests (a
        BaseException subclass): then leases run out by themselves and the ledger keeps what
        was claimed."""
        if isinstance(exc, RedriveError):
            self.result.error = str(exc)
        # A second Ctrl-C is an interruption the operator asked for.
        how: Outcome = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        with contextlib.suppress(Exception):
            self._finish(self.broker_factory(), scan, how, started)
        if isinstance(exc, RedriveError):
            # What it had done by then (the ledger's audit has the same counts).
            exc.partial = self.result

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
        if self.ledger is not None and (
            result.still_hidden or result.in_doubt or result.skipped[BUSY]
        ):
            self._others(self.ledger, result)
        self._life.end(outcome)

    def _others(self, ledger: Ledger, result: MoveResult) -> None:
        """What the other runs of this DLQ that have not ended leave to a rerun: the live
        ones their own work, the stopped ones (killed, crashed) what their leases hold."""
        now = self.now()
        runs = [r for r in ledger.runs(since=now - 86_400) if r.run_id != self.run_id]
        leases = [r.lease_until for r in runs if r.lease_until > now]
        result.hidden_until = max(leases) if leases and result.still_hidden else None
        for run in runs:
            if run.ended_at is not None or self._owners.of_this_command(run.run_id):
                continue
            if (run.info or {}).get("dlq") != self.target.dlq.url:
                continue
            if run_is_live(run, now):
                result.live_runs.append(run.run_id)
            elif run.lease_until > now:
                result.stopped_leases[run.run_id] = run.lease_until

    # -- a worker ------------------------------------------------------------------------

    def _work(self, broker: Broker) -> None:
        # A FIFO queue hands out nothing more of a message group while a batch of it is in
        # flight: a receive ahead would come back empty and end the scan early.
        if not self.options.pipelined or (self._scan.deletes and self.target.dlq.fifo):
            while (decided := self._receive_and_decide(broker)) is not None:
                self._complete(broker, decided)
            return
        if self.options.pipelined == "auto" and not self._one_stage_until_overlap_pays(broker):
            return
        self._two_stages(broker)

    def _two_stages(self, broker: Broker) -> None:
        # Two stages: a helper thread receives and decides batch k+1 while this one claims,
        # sends and deletes batch k. Claims stay in this thread, in batch order, so a crash
        # still leaves at most one batch in doubt; what the helper overlaps is the waiting
        # (SQS's answers, the ledger's disk flush, SQLite's own work outside the GIL).
        ahead = Prefetch(lambda: self._receive_and_decide(broker))
        try:
            while (decided := ahead.get()) is not None:
                self._complete(broker, decided)
        except (Exception, KeyboardInterrupt) as exc:
            # Batches received but never worked on: counted as not sent, and held like the
            # rest, so that the run's end gives them back at once instead of after their
            # lease.
            with contextlib.suppress(Exception):
                for left in ahead.close():
                    self._count_stopped(left, set())
                    if isinstance(exc, Exception):
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

    def _receive_and_decide(self, broker: Broker) -> DecidedBatch | None:
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
        if self._limit.reached or self.result.stopped_by_returns:
            # Enough moved, or enough came back failed (operations.move.returns).
            self._scan.stop_receiving()
        return decided

    def _complete(self, broker: Broker, decided: DecidedBatch) -> None:
        self._tally.watch()
        try:
            keep = self._execute(broker, decided)
        except KeyboardInterrupt:
            self._count_stopped(decided, self._tally.watched())
            raise
        except Exception:
            self._count_stopped(decided, self._tally.watched())
            # Stopped mid-batch (the ledger, SQS): hold the batch like the rest, so that the
            # run's end gives back at once what it did not delete (the ledger knows what it
            # sent or claimed), instead of after its lease.
            with contextlib.suppress(Exception):
                self._scan.keep(broker, decided.batch)
            raise
        self._tally.watched()
        self._scan.keep(broker, keep)
        if self.observer.wants_progress:
            self.observer.on_progress(self._tally.snapshot())

    def _count_stopped(self, decided: DecidedBatch, counted: set[object]) -> None:
        """A batch the run stopped in: what it had not counted, counted as the ledger has it
        (redrive.operations.move.stopped). A dry run stops in none (it counts as it decides)."""
        if not self.options.execute:
            return
        with contextlib.suppress(Exception):
            count_stopped(
                decided, counted, ledger=self.ledger, run_id=self.run_id, tally=self._tally
            )

    # -- one batch: the hooks a subclass (or a bench's timer) may wrap -------------------

    def _gate_reasons(self, decoded: Sequence[tuple[Delivery, TaskInfo]]) -> Mapping[str, str]:
        """Gates' reasons to skip messages of a batch (MessageId -> reason, e.g. a task whose
        result says it succeeded), asked once per received batch: none yet."""
        return {}

    def _decide(
        self, broker: Broker, batch: Sequence[Delivery], received_at: float
    ) -> DecidedBatch:
        """Decode a batch and decide each message's fate from the ledger as it stands; a
        dry run ends here."""
        self._know(broker)
        return self._decider.decide(broker, batch, received_at)

    def _execute(self, broker: Broker, decided: DecidedBatch) -> list[Delivery]:
        """Claim, send, record and delete what was decided; return the messages to keep
        hidden until the scan ends."""
        if self._repair is not None and self.options.execute:
            # The originals first: durable before a key is claimed or an edited copy sent.
            run_id = self.run_id or ""
            self._repair.archive(
                broker, decided, run_id=run_id, dlq=self.target.dlq.url, clock=self.now
            )
            self.observer.on_step("archived")
        return self._executor.execute(broker, decided)

    def _counts(self) -> dict[str, int]:
        return self.result.run_counts()
