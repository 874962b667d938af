"""Carrying out a decided batch of an executed run, a step at a time (each a point a crash may
hit): per send batch, after the rate's wait, claim its keys in the ledger, send it, record what
was sent and give back what was refused; then delete the DLQ copies of what was sent and record
those keys as done. What is neither sent nor refused stays claimed: in doubt (at most the send
batch in flight when a run is killed)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from redrive.broker.base import Broker, Delivery, SendEntry
from redrive.ledger import Claim, Entry, KeyState, Ledger
from redrive.operations.move.candidate import Candidate, DecidedBatch
from redrive.operations.move.copies import copy_of
from redrive.operations.move.options import MessageSource, MoveOptions
from redrive.operations.move.result import (
    ClaimOutcome,
    DeleteOutcome,
    MoveResult,
    MoveTally,
    SendOutcome,
    listed_for,
)
from redrive.operations.move.send import Sender
from redrive.operations.verdict import BUSY, LEASE_LIVE, RESOLVED_SKIP, lease_live
from redrive.runs.observer import RunObserver
from redrive.runs.shared import LimitLike

UNCONFIRMED = "the broker confirmed neither success nor failure of its send"
"""What the result says of a send the broker's answer left unconfirmed."""


class Executor:
    """Claims, sends, records and deletes the run's decided batches, one at a time per
    worker; thread-safe (the ledger and the tally are)."""

    def __init__(
        self,
        ledger: Ledger | None,
        run_id: str | None,
        options: MoveOptions,
        *,
        scan: MessageSource,
        dlq_url: str,
        tally: MoveTally,
        limit: LimitLike,
        sender: Sender,
        observer: RunObserver[MoveResult],
        heartbeat: Callable[[], None],
    ) -> None:
        """``heartbeat``: tell the ledger the run lives (its claims are not in doubt)."""
        self.ledger = ledger
        self.run_id = run_id
        self.options = options
        self._scan = scan
        self._dlq_url = dlq_url
        self._tally = tally
        self._limit = limit
        self._sender = sender
        self._observer = observer
        self._heartbeat = heartbeat

    def execute(self, broker: Broker, decided: DecidedBatch) -> list[Delivery]:
        """Claim, send, record and delete what was decided; return the messages to keep
        hidden until the scan ends."""
        if not self.options.execute:
            return decided.keep
        self._resolve(decided)
        sent = SendOutcome()
        # Claimed a send batch at a time, each just before it goes (after --rate's wait):
        # a run killed mid-batch leaves in doubt at most the one batch being sent.
        takeover_of = {id(c): old for c, old in decided.takeovers}
        rate = self.options.rate
        chunks = self._sender.chunks(
            [*decided.to_send, *(c for c, _ in decided.takeovers)],
            slice_size=None if rate is None else max(1, int(rate)),
        )
        for chunk in chunks or [[]]:
            self._send_chunk(broker, decided, chunk, takeover_of, sent)
        self._settle(sent, decided)
        deleted = self._delete(broker, self._deletable(sent, decided))
        decided.keep.extend(deleted.kept)
        self._observer.on_step("deleted")
        if deleted.done:
            assert self.ledger is not None and self.run_id is not None
            self.ledger.mark_done_many(self.run_id, sorted(deleted.done))
        return decided.keep

    def _send_chunk(
        self,
        broker: Broker,
        decided: DecidedBatch,
        chunk: Sequence[tuple[Candidate, SendEntry]],
        takeover_of: Mapping[int, str],
        total: SendOutcome,
    ) -> None:
        """Pace, claim, send and record one send batch; add what the send did to ``total``."""
        self._sender.pace(len(chunk))
        claimed = self._claim([c for c, _ in chunk], takeover_of, decided)
        self._heartbeat()
        self._observer.on_step("claimed")
        self._extend_if_slow(broker, decided.batch, decided.received_at)
        mine = {id(c) for c in claimed.claimed}
        sent = self._sender.send(broker, [(c, e) for c, e in chunk if id(c) in mine])
        self._observer.on_step("sent")
        self._record(sent)
        self._observer.on_step("recorded")
        total.sent.extend(sent.sent)
        total.refused.extend(sent.refused)
        total.unconfirmed.extend(sent.unconfirmed)

    # -- claim ---------------------------------------------------------------------------

    def _resolve(self, decided: DecidedBatch) -> None:
        """Act on the in-doubt keys the operator's --in-doubt resolves without a send:
        adopt the ones proven delivered, mark the ones to skip."""
        if decided.proven:
            decided.duplicates = self._adopt_delivered(
                decided.proven, decided.duplicates, decided.keep
            )
        if decided.resolve_skip:
            self._resolve_skips(decided.resolve_skip)

    def _claim(
        self,
        cands: Sequence[Candidate],
        takeover_of: Mapping[int, str],
        decided: DecidedBatch,
    ) -> ClaimOutcome:
        """Claim the keys of one send batch (taking over the in-doubt ones to resend):
        durable before any of it is sent."""
        outcome = ClaimOutcome()
        new = [c for c in cands if id(c) not in takeover_of]
        over = [(c, takeover_of[id(c)]) for c in cands if id(c) in takeover_of]
        if new:
            self._claim_new(new, decided, outcome)
        if over:
            self._take_over(over, decided, outcome)
        return outcome

    def _claim_new(
        self, cands: Sequence[Candidate], decided: DecidedBatch, outcome: ClaimOutcome
    ) -> None:
        assert self.ledger is not None and self.run_id is not None
        won = self.ledger.claim_many(
            self.run_id,
            [Claim(c.key, c.info.task, c.message.message_id, c.target.url) for c in cands],
        )
        for cand in cands:
            if cand.key in won.won:
                outcome.claimed.append(cand)
            else:
                # Another run claimed it between our read and our claim.
                outcome.lost.append(cand)
                self._lost_race(cand, won[cand.key], decided)

    def _adopt_delivered(
        self,
        proven: Sequence[tuple[Candidate, str]],
        duplicates: list[tuple[Candidate, str]],
        keep: list[Delivery],
    ) -> list[tuple[Candidate, str]]:
        """--in-doubt auto: take over the keys the result backend proved delivered and
        record them SENT (by the dead run's copy), so their DLQ copies are deleted as
        duplicates and the keys end DONE. A key another run took meanwhile stays held."""
        assert self.ledger is not None and self.run_id is not None
        taken = self.ledger.takeover_many(self.run_id, [(c.key, run) for c, run in proven])
        self.ledger.mark_sent_many(self.run_id, {key: "" for key in taken})
        untaken = [(c, run) for c, run in proven if c.key not in taken]
        keep.extend(c.message for c, _ in untaken)
        self._not_resolved(untaken)
        untaken_ids = {id(c) for c, _ in untaken}
        return [(c, k) for c, k in duplicates if id(c) not in untaken_ids]

    def _resolve_skips(self, resolve_skip: Sequence[tuple[Candidate, str]]) -> None:
        """--in-doubt skip: mark the keys skipped. Only those the ledger marked are counted
        as resolved; the others (already kept) are counted as the ledger has them."""
        assert self.ledger is not None and self.run_id is not None
        marked = self.ledger.mark_skipped_many(self.run_id, [c.key for c, _ in resolve_skip])
        for cand, _ in resolve_skip:
            if cand.key in marked:
                self._tally.skipped(cand.info, RESOLVED_SKIP)
        self._not_resolved([(c, old) for c, old in resolve_skip if c.key not in marked])

    def _not_resolved(self, pairs: Sequence[tuple[Candidate, str]]) -> None:
        """Count in-doubt copies (kept, each with the run that claimed its key) whose key the
        ledger did not resolve: still that run's claim, in doubt while its lease runs; skipped
        by another run meanwhile; or changed otherwise (busy: the next run decides)."""
        if not pairs:
            return
        assert self.ledger is not None
        entries = self.ledger.get_many([c.key for c, _ in pairs])
        for cand, old in pairs:
            entry = entries.get(cand.key)
            if entry is not None and entry.state is KeyState.SKIPPED:
                self._tally.skipped(cand.info, RESOLVED_SKIP)
            elif entry is not None and entry.state is KeyState.CLAIMED and entry.run_id == old:
                self._still_leased(cand, old)
            else:
                self._tally.skipped(cand.info, BUSY)

    def _still_leased(self, cand: Candidate, old: str) -> None:
        """Count a copy in doubt because the ledger left its key ``old``'s claim: the lease of
        that run (dead to this one) has not run out."""
        assert self.ledger is not None
        run = self.ledger.run(old)
        until = run.lease_until if run is not None and run.ended_at is None else None
        self._tally.in_doubt(listed_for(cand, lease_live(old, until)), LEASE_LIVE)

    def _take_over(
        self,
        takeovers: Sequence[tuple[Candidate, str]],
        decided: DecidedBatch,
        outcome: ClaimOutcome,
    ) -> None:
        assert self.ledger is not None and self.run_id is not None
        taken = self.ledger.takeover_many(self.run_id, [(c.key, old) for c, old in takeovers])
        lost = [c for c, _ in takeovers if c.key not in taken]
        # Decided on before an earlier batch of this run went through, a takeover may find
        # that batch sent another copy of the key since: then this one is a duplicate.
        now_entries = self.ledger.get_many([c.key for c in lost]) if lost else {}
        for cand, old in takeovers:
            if cand.key in taken:
                outcome.claimed.append(cand)
                continue
            outcome.lost.append(cand)
            entry = now_entries.get(cand.key)
            if entry is not None and entry.state is KeyState.CLAIMED and entry.run_id == old:
                self._leased_takeover(cand, old, decided)
            elif entry is not None:
                self._lost_race(cand, entry, decided)
            else:
                self._busy(cand, decided.followers.pop(cand.key, []), decided)

    def _leased_takeover(self, cand: Candidate, old: str, decided: DecidedBatch) -> None:
        """A takeover the ledger refused, the key still ``old``'s claim (its lease runs): not
        sent, kept; it and the further copies of its key are in doubt."""
        more = decided.followers.pop(cand.key, [])
        self._limit.give_back()  # taken as a send when decided; it is not one
        self._still_leased(cand, old)
        for follower in more:
            self._tally.matched(follower.info)
            self._still_leased(follower, old)
        decided.keep.append(cand.message)
        decided.keep.extend(f.message for f in more)

    def _lost_race(self, cand: Candidate, entry: Entry, decided: DecidedBatch) -> None:
        more = decided.followers.pop(cand.key, [])
        self._limit.give_back()  # taken as a send when decided; it is not one
        if entry.state in (KeyState.SENT, KeyState.DONE) and copy_of(cand, entry):
            decided.duplicates.append((cand, entry.key))
            decided.duplicates.extend((f, entry.key) for f in more)
            for f in more:
                self._tally.matched(f.info)
            return
        # Claimed by a live run, or sent for a message this one may not be a copy of:
        # the next run decides, with that key's entry in hand.
        self._busy(cand, more, decided)

    def _busy(self, cand: Candidate, more: Sequence[Candidate], decided: DecidedBatch) -> None:
        """Kept for the next run, with the further copies of its key: each counted busy (a
        follower is counted once its first copy's fate is known; uncounted, the summary's
        rows fell short of the messages it left in the DLQ)."""
        self._tally.skipped(cand.info, BUSY)
        for follower in more:
            self._tally.matched(follower.info)
            self._tally.skipped(follower.info, BUSY)
        decided.keep.append(cand.message)
        decided.keep.extend(f.message for f in more)

    def _extend_if_slow(
        self, broker: Broker, batch: Sequence[Delivery], received_at: float
    ) -> None:
        # Past half the lease, another receiver could get these messages: extend it. Safety
        # does not depend on this (the ledger does), but it saves needless "busy" skips.
        if time.monotonic() - received_at > self.options.lease / 2:
            self._scan.extend(broker, batch, self.options.lease)

    # -- after the send ------------------------------------------------------------------

    def _record(self, sent: SendOutcome) -> None:
        """Record the confirmed sends; give back the claims of the refused ones (the
        unconfirmed stay claimed: in doubt)."""
        assert self.ledger is not None and self.run_id is not None
        if sent.sent:
            self.ledger.mark_sent_many(self.run_id, {c.key: mid for c, mid in sent.sent})
        if sent.refused:
            self.ledger.release_many(self.run_id, [c.key for c, _ in sent.refused])

    def _settle(self, sent: SendOutcome, decided: DecidedBatch) -> None:
        """Count what the send did; keep what was not sent (with its followers) hidden. A
        follower (a further copy of the key in the batch) shares its first copy's fate:
        failed with a refused one, in doubt with an unconfirmed one."""
        self._tally.sent(sent)
        for cand, error in sent.refused:
            for follower in decided.keep_with_followers(cand):
                self._tally.refused_follower(follower, error)
        for cand in sent.unconfirmed:
            self._tally.in_doubt(listed_for(cand, UNCONFIRMED), own=True)
            for follower in decided.keep_with_followers(cand):
                self._tally.matched(follower.info)
                self._tally.in_doubt(listed_for(follower, UNCONFIRMED), own=True)

    def _deletable(self, sent: SendOutcome, decided: DecidedBatch) -> list[tuple[Delivery, str]]:
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

    def _delete(self, broker: Broker, deletable: Sequence[tuple[Delivery, str]]) -> DeleteOutcome:
        """Delete DLQ copies: the keys whose copies are all gone, and what stays."""
        if not self._scan.deletes:
            # An archive being replayed: there is no copy to delete.
            return DeleteOutcome(done={key for _, key in deletable})
        done: set[str] = set()
        failed_keys: set[str] = set()
        not_deleted: list[Delivery] = []
        # The broker's batch (SQS: 10; RabbitMQ: 100, one multiple ack where the tags allow).
        size = broker.capabilities.batch_size
        for start in range(0, len(deletable), size):
            chunk = deletable[start : start + size]
            result = broker.ack(self._dlq_url, {str(i): m.tag for i, (m, _) in enumerate(chunk)})
            self._scan.forget([m for i, (m, _) in enumerate(chunk) if str(i) in result.ok])
            for i, (message, key) in enumerate(chunk):
                if str(i) in result.ok:
                    done.add(key)
                else:
                    # Stays SENT: the next run finds the copy and only deletes it.
                    failed_keys.add(key)
                    not_deleted.append(message)
        return DeleteOutcome(done - failed_keys, not_deleted)
