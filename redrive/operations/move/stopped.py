"""What a batch the run stopped in came to (issue 37): its messages decided on and not yet
counted, each counted as the ledger has it. Without this, a run an error or an abort stopped
mid-batch counted them as matched and nothing else, so its totals did not add up, and the
claims it left were in doubt in the ledger but not in its summary."""

from __future__ import annotations

from collections.abc import Iterator

from redrive.ledger import Entry, KeyState, Ledger
from redrive.operations.move.candidate import Candidate, DecidedBatch
from redrive.operations.move.result import MoveTally, listed_for
from redrive.operations.verdict import IN_DOUBT, RESOLVED_SKIP, STOPPED

STOPPED_IN_DOUBT = "claimed, then the run stopped before the broker confirmed the send"
STILL_CLAIMED = "in doubt: the run stopped before it marked the key skipped (--in-doubt skip)"


def _uncounted(decided: DecidedBatch, counted: set[object]) -> Iterator[tuple[Candidate, bool]]:
    """The batch's candidates counted as matched when decided and not counted since, each
    with whether this run was to send it (a copy's key may be this run's, sent before)."""
    seen: set[int] = set()
    sends = [*decided.to_send, *(c for c, _ in decided.takeovers)]
    others = [*(c for c, _ in decided.duplicates), *(c for c, _ in decided.resolve_skip)]
    for cands, sending in ((others, False), (sends, True)):
        for cand in cands:
            if id(cand) in seen or id(cand.info) in counted:
                continue
            seen.add(id(cand))
            if cand.message.message_id not in counted:
                yield cand, sending


def count_stopped(
    decided: DecidedBatch,
    counted: set[object],
    *,
    ledger: Ledger | None,
    run_id: str | None,
    tally: MoveTally,
) -> None:
    """Count what the batch had not counted when the run stopped in it (``counted``: what
    the tally noted meanwhile): a key this run claimed and did not confirm is in doubt, one
    it recorded sent is moved, one an in-doubt skip marked is skipped so, and the rest was
    not sent (still in the DLQ). With no ledger to ask, a key to send is in doubt (its
    claim may stand)."""
    pending = list(_uncounted(decided, counted))
    if not pending:
        return
    entries: dict[str, Entry] = {}
    if ledger is not None:
        try:
            entries = ledger.get_many([c.key for c, _ in pending])
        except Exception:
            ledger = None
    for cand, sending in pending:
        fate = _fate(entries.get(cand.key), sending, run_id, known=ledger is not None)
        if fate == IN_DOUBT:
            detail = STOPPED_IN_DOUBT if sending else STILL_CLAIMED
            # This run's own claim when it was to send it; an earlier run's otherwise.
            tally.in_doubt(listed_for(cand, detail), IN_DOUBT, own=sending)
        elif fate == "moved":
            tally.moved(cand)
        else:
            tally.skipped(cand.info, fate)


def _fate(entry: Entry | None, sending: bool, run_id: str | None, *, known: bool) -> str:
    """What an uncounted candidate came to, as its key's entry says."""
    if entry is None:
        return STOPPED if known or not sending else IN_DOUBT
    if not sending:
        # An in-doubt key this run was to mark skipped: marked, or in doubt still.
        if entry.state is KeyState.SKIPPED:
            return RESOLVED_SKIP
        return IN_DOUBT if entry.state is KeyState.CLAIMED and entry.run_id != run_id else STOPPED
    if entry.run_id != run_id:
        return STOPPED
    if entry.state is KeyState.CLAIMED:
        return IN_DOUBT
    return "moved" if entry.state in (KeyState.SENT, KeyState.DONE) else STOPPED
