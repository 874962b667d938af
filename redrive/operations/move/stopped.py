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


def _uncounted_followers(decided: DecidedBatch, counted: set[object]) -> dict[str, list[Candidate]]:
    """Key -> the further copies of it in the batch (they follow its first copy, counted
    only once that one's fate is known) that nothing counted before the run stopped."""
    found: dict[str, list[Candidate]] = {}
    for key, followers in decided.followers.items():
        left = [
            f
            for f in followers
            if id(f.info) not in counted and f.message.message_id not in counted
        ]
        if left:
            found[key] = left
    return found


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
    claim may stand). A further copy of a key in the batch (a follower) is matched now and
    shares its key's fate: in doubt with it, else not sent (beside a first copy sent, it is
    a duplicate the next run deletes)."""
    pending = list(_uncounted(decided, counted))
    followers = _uncounted_followers(decided, counted)
    if not pending and not followers:
        return
    entries = _entries(ledger, [*(c.key for c, _ in pending), *followers])
    known = entries is not None
    entries = entries or {}
    for cand, sending in pending:
        fate = _fate(entries.get(cand.key), sending, run_id, known=known)
        if fate == IN_DOUBT:
            detail = STOPPED_IN_DOUBT if sending else STILL_CLAIMED
            # This run's own claim when it was to send it; an earlier run's otherwise.
            tally.in_doubt(listed_for(cand, detail), IN_DOUBT, own=sending)
        elif fate == "moved":
            tally.moved(cand)
        else:
            tally.skipped(cand.info, fate)
    for key, more in followers.items():
        in_doubt = _fate(entries.get(key), True, run_id, known=known) == IN_DOUBT
        for follower in more:
            tally.matched(follower.info)
            if in_doubt:
                tally.in_doubt(listed_for(follower, STOPPED_IN_DOUBT), IN_DOUBT, own=True)
            else:
                tally.skipped(follower.info, STOPPED)


def _entries(ledger: Ledger | None, keys: list[str]) -> dict[str, Entry] | None:
    """The keys' entries as the ledger has them; None when there is no ledger to ask, or it
    cannot answer (the fates are then what an unknown entry's are)."""
    if ledger is None:
        return None
    try:
        return ledger.get_many(list(dict.fromkeys(keys)))
    except Exception:
        return None


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
