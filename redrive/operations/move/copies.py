"""Which key each candidate has, read against the ledger: a message that is this run's own copy
come back is left for the next run (one run never sends a task twice), one an earlier run's
copy come back moves on a generation, a key of the legacy form is adopted when it is the message's
own, a second publish gets a key of its own, and one that may be either a copy or a second
publish is held (:func:`redrive.keys.copy_verdict`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from redrive import attributes
from redrive.durations import iso_utc
from redrive.keys import Verdict as CopyVerdict
from redrive.keys import copy_verdict
from redrive.ledger import Entry, KeyState, Ledger
from redrive.operations.move.candidate import Candidate
from redrive.operations.move.options import MoveOptions
from redrive.operations.move.owners import ClaimOwners
from redrive.operations.verdict import Fate
from redrive.runs.shared import PlannedLike


class KeySettler:
    """Settles the candidates' keys and reads their ledger entries (one batch at a time)."""

    def __init__(
        self,
        ledger: Ledger | None,
        options: MoveOptions,
        owners: ClaimOwners,
        planned: PlannedLike,
    ) -> None:
        self.ledger = ledger
        self.options = options
        self._owners = owners
        self._planned = planned

    def entries_for(self, candidates: Sequence[Candidate]) -> dict[str, Entry]:
        """Ledger entries of the candidates' keys, after settling which key each has: a
        message that is this run's own copy come back is left (``Candidate.left``), one an
        earlier run's moves on a generation, one whose key belongs to another invocation
        gets a key of its own, one that may be either is held (:meth:`_tell_copies_apart`)."""
        if not candidates:
            return {}
        if self.ledger is None:
            self._tell_copies_apart(_taken(candidates), {})
            return {}
        wanted = [c.key for c in candidates] + [c.legacy_key for c in candidates if c.legacy_key]
        wanted += [k for c in candidates if (k := sent_under(c)) is not None]
        entries = self.ledger.get_many(list(dict.fromkeys(wanted)))
        self._leave_own_returns(candidates, entries)
        self._follow_returns([c for c in candidates if c.left is not Fate.CAME_BACK], entries)
        taken = _taken(candidates)
        self._adopt_legacy_keys(taken, entries)
        rekeyed = self._tell_copies_apart(taken, entries)
        if rekeyed:
            entries.update(self.ledger.get_many([c.key for c in rekeyed]))
        return entries

    def _leave_own_returns(
        self, candidates: Sequence[Candidate], entries: Mapping[str, Entry]
    ) -> None:
        """A copy stamped with the key it was sent under, a key this run (or a process of
        it) claimed: this run's own send, dead-lettered back while the run goes on. Its new
        death gives it a new key, but sending it again would run the task twice from one
        command: it is left for the next run."""
        for cand in candidates:
            key = sent_under(cand)
            entry = entries.get(key) if key is not None else None
            if entry is not None and self._this_runs(entry):
                cand.left = Fate.CAME_BACK

    def _this_runs(self, entry: Entry) -> bool:
        """Whether this run (or a process of it) claimed or sent the entry's key."""
        return entry.state in (KeyState.CLAIMED, KeyState.SENT, KeyState.DONE) and (
            self._owners.of_this_run(entry.run_id)
        )

    def _follow_returns(self, candidates: Sequence[Candidate], entries: dict[str, Entry]) -> None:
        """A message whose MessageId is the one SQS gave redrive's own copy came back to the
        DLQ (failed again): it is not a duplicate, whatever its key says. An earlier run's
        copy moves on a generation; this run's own is left for the next run."""
        assert self.ledger is not None
        suspects = [c for c in candidates if _sent_by_redrive(c, entries)]
        if not suspects:
            return
        chains = [self._chain(c) for c in suspects]
        found = self.ledger.get_many([key for chain in chains for keys in chain for key in keys])
        for cand, chain in zip(suspects, chains, strict=True):
            sent = _move_on_if_returned(cand, chain, found)
            if sent is not None and self._this_runs(sent):
                cand.left = Fate.CAME_BACK
        entries.update(found)
        missing = [
            k for c in suspects for k in (c.key, c.legacy_key) if k is not None and k not in entries
        ]
        if missing:
            entries.update(self.ledger.get_many(missing))

    def _chain(self, cand: Candidate) -> list[list[str]]:
        """Per generation from the candidate's own on, the keys it would have there."""
        first = cand.generation
        return [cand.keys_at(g) for g in range(first, first + self.options.max_redrives + 1)]

    def _adopt_legacy_keys(
        self, candidates: Sequence[Candidate], entries: Mapping[str, Entry]
    ) -> None:
        """A key of the legacy form (it does not name the publish) decides as it did before
        when it is this very message's. One held for another message with the same task id
        may be a copy of it or a second publish: only an enqueue time after that message was
        sent tells (a second publish); otherwise the candidate is held."""
        for cand in candidates:
            if cand.legacy_key is None or cand.key in entries:
                continue
            old = entries.get(cand.legacy_key)
            if old is None:
                continue
            if old.message_id == cand.message.message_id:
                cand.key = cand.legacy_key
                continue
            sent = old.state in (KeyState.SENT, KeyState.DONE)
            verdict = copy_verdict(
                same_message=False,
                tagged=False,  # the legacy key says nothing of the publish
                enqueued_at=cand.message.enqueued_at,
                first_sent_at=sent_at(old) if sent else None,
            )
            if verdict is CopyVerdict.AMBIGUOUS and self.options.ambiguous == "hold":
                cand.held = _held_by_legacy_key(old, sent)
            # Otherwise its own key (the new form) decides: the legacy one was another's.

    def _tell_copies_apart(
        self, candidates: Sequence[Candidate], entries: Mapping[str, Entry]
    ) -> list[Candidate]:
        """For each candidate whose key another message holds (sent, claimed earlier in this
        run, or earlier in this batch or dry run), whether it is a copy of that message: a
        second publish is re-keyed by its own MessageId, an ambiguous one held (re-keyed with
        ``--ambiguous move``). Returns the re-keyed candidates."""
        rekeyed: list[Candidate] = []
        first_of: dict[str, Candidate] = {}
        for cand in candidates:
            if cand.held is not None:
                continue
            other, when = self._other_holder(cand, entries.get(cand.key), first_of)
            if other is not None:
                verdict = copy_verdict(
                    same_message=other == cand.message.message_id,
                    tagged=cand.tagged,
                    enqueued_at=cand.message.enqueued_at,
                    first_sent_at=when,
                )
                if verdict is CopyVerdict.AMBIGUOUS and self.options.ambiguous == "hold":
                    cand.held = _held_as_ambiguous(other, when)
                elif verdict in (CopyVerdict.AMBIGUOUS, CopyVerdict.SECOND_PUBLISH):
                    cand.rekey(by_message=True)
                    rekeyed.append(cand)
            first_of.setdefault(cand.key, cand)
        return rekeyed

    def _other_holder(
        self, cand: Candidate, entry: Entry | None, first_of: Mapping[str, Candidate]
    ) -> tuple[str | None, float | None]:
        """(MessageId, when sent) of the message that holds the candidate's key before it:
        one sent, an earlier copy in this batch, one an earlier batch of this run claimed,
        or ("", None) for one planned earlier in this dry run; (None, None) for none (or a
        key claimed by another run, or skipped: those decide as they always did)."""
        if entry is not None and entry.state in (KeyState.SENT, KeyState.DONE):
            return entry.message_id, sent_at(entry)
        if (first := first_of.get(cand.key)) is not None:
            return first.message.message_id, None
        if entry is not None:
            if entry.state == KeyState.CLAIMED and (
                entry.run_id == self._owners.run_id or self._owners.sibling(entry.run_id)
            ):
                return entry.message_id, None
            return None, None
        if cand.key in self._planned:
            return "", None  # the scan never hands out one message twice: another one
        return None, None


def sent_at(entry: Entry) -> float:
    """When the ledger recorded the key's send (a ledger of schema 2 kept only the time of
    the key's last change, which is then as close as it gets)."""
    return entry.sent_at if entry.sent_at is not None else entry.updated_at


def copy_of(cand: Candidate, entry: Entry) -> bool:
    """Whether the candidate is the message ``entry`` sent, or a copy of it."""
    verdict = copy_verdict(
        same_message=entry.message_id == cand.message.message_id,
        tagged=cand.tagged,
        enqueued_at=cand.message.enqueued_at,
        first_sent_at=sent_at(entry),
    )
    return verdict in (CopyVerdict.SAME_MESSAGE, CopyVerdict.COPY)


def _sent_by_redrive(cand: Candidate, entries: Mapping[str, Entry]) -> bool:
    """Whether a key the candidate may have (its own, its legacy one) was sent by redrive: it
    may then be redrive's own copy come back."""
    return any(
        (e := entries.get(k)) is not None and e.sent_message_id is not None
        for k in (cand.key, cand.legacy_key)
        if k is not None
    )


def _move_on_if_returned(
    cand: Candidate, chain: Sequence[Sequence[str]], found: Mapping[str, Entry]
) -> Entry | None:
    """Move the candidate on past the generation whose send it is, if it is one; the
    entry of that send (None: it is none).

    An unstamped copy (no room for our attributes) always computes the key of the
    generation its count says, however often it came back: look along its later
    generations for the one whose send it is. Comparing with the first generation only
    would call a second return a duplicate of the first send, and delete it."""
    for generation, keys in enumerate(chain, start=cand.generation):
        for key in keys:
            entry = found.get(key)
            if entry is not None and entry.sent_message_id == cand.message.message_id:
                cand.generation = generation + 1
                cand.rekey()
                return entry
    return None


def sent_under(cand: Candidate) -> str | None:
    """The key redrive stamped on the copy it sent, when the candidate is one (None: not
    redrive's copy, or one sent unstamped, without room for redrive's marks)."""
    value = attributes.text_of(cand.message.headers, attributes.KEY)
    return value or None


def _taken(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates not left for the next run (their keys decide)."""
    return [c for c in candidates if c.left is None]


def _held_by_legacy_key(old: Entry, sent: bool) -> str:
    """Why a candidate is held whose legacy key another message holds."""
    done = f"sent at {iso_utc(sent_at(old))}" if sent else f"{old.state} (not sent)"
    return (
        f"same task id and retries as message {old.message_id}, {done} by run "
        f"{old.run_id} under a key of the earlier form, which does not name the "
        "publish: a copy of it or a second publish"
    )


def _held_as_ambiguous(other: str, when: float | None) -> str:
    """Why a candidate is held whose key ``other`` (a MessageId; "" when planned) holds,
    sent at ``when`` (None: not sent)."""
    return (
        f"same task id, retries and body as message {other or '(planned)'}"
        + (f", sent at {iso_utc(when)}" if when is not None else "")
        + ", and no delivery tag to tell a copy from a second publish"
    )
