"""Deciding each received message's fate: selected or not, gated, expired, routed, keyed, and
then (from the ledger as it stands) sent, followed, a duplicate, taken over, in doubt or held
(:mod:`redrive.operations.verdict` says which). A dry run ends here: what it would do is
planned (:class:`PlannedKeys`) and counted, and nothing changes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from redrive import attributes
from redrive.broker.base import Broker, Delivery, DlqTarget, QueueRef
from redrive.celery.knowledge import skip_reason
from redrive.celery.results import ALREADY_SUCCEEDED, delivered_after_claim, succeeded_ids
from redrive.dlq.scan import digest
from redrive.ledger import Entry, KeyState
from redrive.messages import TaskInfo, decode
from redrive.operations.move.candidate import Candidate, DecidedBatch, candidate_for
from redrive.operations.move.copies import KeySettler
from redrive.operations.move.options import MoveOptions, decision_options
from redrive.operations.move.owners import ClaimOwners
from redrive.operations.move.repair_step import RepairStep, planned_digests
from redrive.operations.move.result import MoveResult, MoveTally
from redrive.operations.move.returns import died_after
from redrive.operations.move.routing import Router, routed_from
from redrive.operations.plan import CHANGED_SINCE_PLAN, changed_since_plan, message_digest
from redrive.operations.verdict import (
    EntryFacts,
    Fate,
    MessageFacts,
    RunFacts,
    Verdict,
    decide,
    screen,
)
from redrive.runs.observer import PlanItem, RunObserver
from redrive.runs.shared import LimitLike, PlannedLike

GateReasons = Callable[[Sequence[tuple[Delivery, TaskInfo]]], Mapping[str, str]]
"""Gates' reasons to skip messages of a batch: MessageId -> reason, asked once per batch."""


class PlannedKeys:
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


class Decider:
    """Decides the run's batches, each as a whole, from what the run knows so far: its
    filters, routes, the ledger's entries and what it has planned. Thread-safe."""

    def __init__(
        self,
        target: DlqTarget,
        options: MoveOptions,
        *,
        tally: MoveTally,
        limit: LimitLike,
        planned: PlannedLike,
        router: Router,
        owners: ClaimOwners,
        settler: KeySettler,
        observer: RunObserver[MoveResult],
        clock: Callable[[], float],
        namespace: Callable[[], str],
        legacy: bool,
        gate_reasons: GateReasons,
        repair: RepairStep | None = None,
    ) -> None:
        """``namespace``: the broker's key namespace (known once the run uses a broker);
        ``legacy``: the ledger may hold keys of the earlier form; ``repair``: the run's edits
        (issue 26)."""
        self.target = target
        self.options = options
        self._tally = tally
        self._limit = limit
        self._planned = planned
        self._router = router
        self._owners = owners
        self._settler = settler
        self._observer = observer
        self._now = clock
        self._namespace = namespace
        self._legacy = legacy
        self._gate_reasons = gate_reasons
        self._repair = repair
        self._options = decision_options(options)
        run_id = owners.run_id
        self._run_open, self._run_full = RunFacts(run_id), RunFacts(run_id, True)
        self._began: float | None = None
        self._began_lock = threading.Lock()

    def began(self) -> float:
        """When the run began deciding: what died after it is the next run's. The later of
        the run's clock and the wall clock's (broker times are the wall clock's; a run's
        clock may be set back, as a test's is): only what died after both is left."""
        with self._began_lock:
            if self._began is None:
                self._began = max(self._now(), time.time())
            return self._began

    def decide(self, broker: Broker, batch: Sequence[Delivery], received_at: float) -> DecidedBatch:
        """Decode a batch and decide each message's fate from the ledger as it stands; a
        dry run ends here."""
        decided = DecidedBatch(batch, received_at, keep=[])
        candidates = self._select(broker, batch, decided.keep)
        entries = self._settler.entries_for(candidates)
        if self.options.execute:  # what came back so far may stop the run before this batch
            self._tally.check_returns(self.options.stop_after_returns, self._dlq_ready(broker))
        live_owners = self._owners.live_others(entries.values())
        # redrive.celery.results: which in-doubt tasks the result backend proves delivered.
        delivered = (
            delivered_after_claim(self.options.results, candidates, entries, self._owners.run_id)
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
        else:
            self._tally.check_returns(self.options.stop_after_returns, None)
        return decided

    def _dlq_ready(self, broker: Broker) -> int | None:
        """The DLQ's exact count of waiting messages, where the run drains a DLQ, may stop
        for what comes back, and the broker counts exactly (None otherwise)."""
        if self.options.stop_after_returns.off or self._tally.result.depth_before is None:
            return None
        return broker.exact_ready(self.target.dlq.url)

    # -- what needs no key ---------------------------------------------------------------

    def _select(
        self, broker: Broker, batch: Sequence[Delivery], keep: list[Delivery]
    ) -> list[Candidate]:
        """The batch's selected messages that may be sent, with their keys; the others go
        to ``keep`` (counted as skipped when selected)."""
        candidates: list[Candidate] = []
        began = self.began()
        now = self._now()
        now_dt = datetime.fromtimestamp(now, UTC)
        decoded = [(message, decode(message.body, message.parsed)) for message in batch]
        self._tally.seen.add(decoded)
        gates = self._gate_reasons(decoded)
        succeeded = self._succeeded(decoded)
        bodies: dict[str, str] = {}
        for message, info in decoded:
            gate = gates.get(message.message_id)
            done = info.task_id in succeeded
            facts, route = self._message_facts(
                broker, message, info, (now, now_dt), gate, done, bodies
            )
            screened = screen(facts, self._options)
            if screened is not None or route is None:
                self._tally.decided(info, screened or Verdict(Fate.NO_TARGET))
                keep.append(message)
                continue
            cand = candidate_for(
                message, info, facts.generation, route, self._namespace(), legacy=self._legacy
            )
            cand.body = bodies.get(message.message_id)
            if died_after(message, began, now):
                cand.left = Fate.DIED_DURING_RUN
            candidates.append(cand)
        return candidates

    def _succeeded(self, decoded: Sequence[tuple[Delivery, TaskInfo]]) -> set[str]:
        """redrive.celery.results: the batch's task ids whose result says they succeeded (one
        lookup per batch; a backend that cannot answer stops the run here, before this batch
        is claimed or sent)."""
        return succeeded_ids(
            None if self.options.include_succeeded else self.options.results,
            (info.task_id for _, info in decoded),
        )

    def _message_facts(
        self,
        broker: Broker,
        message: Delivery,
        info: TaskInfo,
        now: tuple[float, datetime],
        gate: str | None,
        succeeded: bool,
        bodies: dict[str, str],
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
        if changed_since_plan(self.options.planned_digests, message):
            # Not what was reviewed: left, whatever else would be said of it.
            if self._repair is not None:
                self._repair.left_changed(message, info)
            return MessageFacts(gate=CHANGED_SINCE_PLAN), None
        # redrive.celery: a task no worker registers would be dropped.
        if (gate := gate or skip_reason(self.options.celery, info)) is not None:
            return MessageFacts(gate=gate), None
        cleared = False
        if self._repair is not None:  # issue 26: the edits decide before expiry
            left, bodies[message.message_id] = self._repair.check(broker, message, info)
            if left is not None:
                return MessageFacts(gate=left), None
            cleared = self._repair.clears_expires  # and its expires is gone
        if not self.options.include_expired and not cleared and info.is_expired(now[1]):
            return MessageFacts(expired=True), None
        if succeeded:  # redrive.celery.results: the result backend says it succeeded
            return MessageFacts(late_gate=ALREADY_SUCCEEDED), None
        route = self._router.route(broker, message, info.task)
        facts = MessageFacts(
            routed=route is not None,
            celery=info.is_celery,
            generation=attributes.redrive_count(message.headers),
        )
        return facts, route

    # -- what the key's entry decides ----------------------------------------------------

    def _verdict(
        self,
        cand: Candidate,
        entry: Entry | None,
        known_of: tuple[set[str], set[str]],
        decided: DecidedBatch,
    ) -> Verdict:
        """The candidate's verdict; one that would send takes one of --limit's messages."""
        facts = MessageFacts(
            generation=cand.generation,
            held=cand.held,
            left=cand.left,
            in_batch=cand.key in decided.followers,
            planned=entry is None and cand.key in self._planned,
        )
        live_owners, delivered = known_of
        known = self._entry_facts(entry, live_owners, cand.key in delivered)
        options = self._options
        # Stopped for what came back: nothing more is sent, as once --limit is reached.
        full = self._limit.reached or self._tally.result.stopped_by_returns is not None
        run = self._run_full if full else self._run_open
        verdict = decide(facts, known, run, options)
        if verdict.sends and not self._limit.take():
            # Another worker took the last one meanwhile.
            verdict = decide(facts, known, self._run_full, options)
        return verdict

    def _entry_facts(
        self, entry: Entry | None, live_owners: set[str], delivered: bool
    ) -> EntryFacts | None:
        if entry is None:
            return None
        owner = self._owners.decided_as(entry.run_id, live_owners)
        live = entry.run_id in live_owners
        return EntryFacts(
            entry.state,
            owner,
            owner_live=live,
            delivered=delivered,
            leased_until=self._leased_until(entry, owner, live),
        )

    def _leased_until(self, entry: Entry, owner: str, live: bool) -> float | None:
        """The lease of a dead claimant an --in-doubt policy would resolve: the ledger
        refuses to while it runs, so the decision must know (None: not asked, or over)."""
        if self.options.in_doubt == "hold" or live or entry.state != KeyState.CLAIMED:
            return None
        if owner == self._owners.run_id:
            return None
        return self._owners.leased_until(entry.run_id)

    # -- a dry run -----------------------------------------------------------------------

    def _plan_only(self, decided: DecidedBatch) -> None:
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

    def _to_plan(self, cand: Candidate, action: str) -> None:
        self._observer.on_plan(
            PlanItem(
                message_id=cand.message.message_id,
                task=cand.info.task,
                task_id=cand.info.task_id,
                key=cand.key,
                target=cand.target.url,
                action=action,
                routed_from=routed_from(self._router.source_name(cand.message), cand.target.name),
                digest=message_digest(cand.message),
                **planned_digests(cand),
            )
        )

    def _lost_planned_race(self, cand: Candidate, decided: DecidedBatch) -> None:
        """A dry run's claim lost: another worker or process planned the same task between
        this one's decision and its plan, as a real run's claim_many would have found it
        claimed. This copy and its followers are then duplicates, as the real run's are."""
        more = decided.followers.pop(cand.key, [])
        self._limit.give_back()  # taken as a send when decided; it is not one
        decided.duplicates.append((cand, cand.key))
        decided.duplicates.extend((f, cand.key) for f in more)
        for f in more:
            self._tally.matched(f.info)
