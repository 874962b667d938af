"""Sending the claimed messages back: one send entry per message (stamped with redrive's marks
where they fit), batches per target within the broker's limits, and each entry's fate (sent,
refused, or unconfirmed: in doubt)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import replace

from redrive import attributes
from redrive.broker.base import Broker, Capabilities, SendEntry, split_batches
from redrive.errors import NotSent
from redrive.ledger import Ledger
from redrive.operations.move.candidate import Candidate
from redrive.operations.move.result import SendOutcome
from redrive.runs.shared import RateLike


class Sender:
    """Sends a batch's claimed candidates at the run's rate; thread-safe (no state of its own
    beyond the run's)."""

    def __init__(
        self,
        ledger: Ledger | None,
        run_id: str | None,
        *,
        dlq_name: str,
        limits: Capabilities,
        rate: RateLike,
    ) -> None:
        """``dlq_name``: the DLQ the messages came from (stamped on each copy)."""
        self.ledger = ledger
        self.run_id = run_id
        self._dlq_name = dlq_name
        self._limits = limits
        self._rate = rate

    def chunks(
        self, cands: Sequence[Candidate], *, slice_size: int | None = None
    ) -> list[list[tuple[Candidate, SendEntry]]]:
        """The send batches of ``cands``, each with its entries: per target, within the
        broker's limits and at most ``slice_size`` (a rate's one-second slice). The executor
        claims each batch just before it goes, so that a run killed before a send leaves
        nothing of it in doubt."""
        limits = self._limits
        if slice_size is not None and slice_size < limits.batch_size:
            limits = replace(limits, batch_size=max(1, slice_size))
        by_target: dict[str, list[Candidate]] = {}
        for cand in cands:
            by_target.setdefault(cand.target.url, []).append(cand)
        chunks: list[list[tuple[Candidate, SendEntry]]] = []
        for group in by_target.values():
            by_id = {str(i): c for i, c in enumerate(group)}
            entries = [self.entry(entry_id, c) for entry_id, c in by_id.items()]
            chunks.extend(
                [(by_id[e.id], e) for e in chunk] for chunk in split_batches(entries, limits)
            )
        return chunks

    def pace(self, n: int) -> None:
        """Wait until ``n`` messages may go at the run's rate: before their claims, so that
        the wait leaves nothing claimed and unsent."""
        self._rate.acquire(n)

    def send(self, broker: Broker, claimed: Sequence[tuple[Candidate, SendEntry]]) -> SendOutcome:
        """Send claimed messages (one of :meth:`chunks`, or part of one): what the broker
        confirmed, refused, or left unconfirmed.

        An entry SQS named in neither list of its response may have been queued: its claim
        is kept (in doubt for the next run), never released to be resent blindly. A send
        that raised keeps its request's claims (in doubt), unless it raised
        :class:`~redrive.errors.NotSent` (no connection was made): those are released.
        """
        outcome = SendOutcome()
        sent, failed, doubtful = outcome.sent, outcome.refused, outcome.unconfirmed
        by_target: dict[str, list[tuple[Candidate, SendEntry]]] = {}
        for cand, entry in claimed:
            by_target.setdefault(cand.target.url, []).append((cand, entry))
        for url, pairs in by_target.items():
            by_id = {entry.id: cand for cand, entry in pairs}
            for chunk in split_batches([entry for _, entry in pairs], self._limits):
                try:
                    result = broker.send(url, chunk)
                except NotSent:
                    # No connection was made: no byte of this request left, so its claims
                    # are released with the untried ones (only earlier unconfirmed ones stay).
                    self._settle_before_error(
                        [c for c, _ in claimed], sent, failed, {c.key for c in doubtful}
                    )
                    raise
                except Exception:
                    # Earlier unconfirmed entries stay claimed, like the request in flight.
                    self._settle_before_error(
                        [c for c, _ in claimed],
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
        claimed: Sequence[Candidate],
        sent: Sequence[tuple[Candidate, str]],
        failed: Sequence[tuple[Candidate, str]],
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

    def entry(self, entry_id: str, cand: Candidate) -> SendEntry:
        """The candidate's send entry: stamped (its generation, key and DLQ), unless the
        stamp alone would make it too big to send."""
        message = cand.message
        fifo = cand.target.fifo
        entry = SendEntry(
            id=entry_id,
            body=message.body if cand.body is None else cand.body,
            headers=attributes.stamped(
                message.headers,
                count=cand.generation + 1,
                key=cand.key,
                dlq=self._dlq_name,
                room=self._limits.max_message_attributes,
            ),
            group_id=(message.group_id or "default") if fifo else None,
            # A FIFO queue drops a resend with the same deduplication id (SQS: for 5 minutes).
            deduplication_id=cand.key if fifo else None,
            # Unedited: the broker may send its own form of the message as received.
            native=message.native if cand.body is None else None,
        )
        limits = self._limits.message_size_limits
        if entry.size() <= limits[0]:
            return entry
        bare = replace(entry, headers=attributes.originals(message.headers))
        if any(bare.size() <= limit < entry.size() for limit in limits):
            # A broker counts attributes in a message's size: our stamp must never be what makes
            # a message too big to send. Unstamped, a return is still recognised (by the
            # MessageId the ledger recorded for the send).
            return bare
        return entry
