"""What the move engine does with one received message: a pure decision from what is known
of the message, its key's ledger entry, the run and the options. Nothing here reads SQS or
the ledger; the engine gathers the facts, :func:`decide` sorts the message, the engine acts.

The order of the checks is the order of precedence: a gate's reason first (a task no
worker registers); a message both expired and poison is counted as expired; one whose key
was sent is a duplicate however often it was redriven; a held ambiguous copy is held before
anything else is asked of its key.

Features slot in as facts: a per-message skip reason from a gate (:attr:`MessageFacts.gate`,
e.g. a task the Celery app does not register, or one whose result says it succeeded), a
per-task route (the engine's ``Router.route``: ``routed``), a content predicate (inside
:meth:`redrive.selection.Selection.matches`: ``selected``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime

from redrive.ledger import KeyState

# Reasons a selected message is not sent; the keys of MoveResult.skipped.
EXPIRED = "expired"
POISON = "poison"
IN_DOUBT = "in-doubt"
BUSY = "claimed-by-another-run"
RESOLVED_SKIP = "in-doubt-resolved-skip"
LEASE_LIVE = "in-doubt-lease-live"
"""In doubt, though the operator asked to resolve it: its claimant stopped, but the ledger
lease it took has not run out, and the ledger resolves nothing of a leased run's."""
STOPPED = "not-sent-run-stopped"
"""Decided on, never sent nor deleted: the run stopped (an error, an abort) before it got to
them. They stay in the DLQ (or the archive), for the next run."""
UNRECORDED = "not-recorded-process-died"
"""Matched by a ``--processes`` child that died before it reported what it did with them:
the ledger holds no claim of them, so it sent none. Each is still in the DLQ (or, a copy of
a task sent before, deleted)."""
UNRECORDED_ROW = "(a process died: tasks not recorded)"
"""The task row that counts them (their tasks died with the process)."""
NO_TARGET = "no-target"
NOT_CELERY = "not-celery"
AMBIGUOUS = "ambiguous-copy"
CAME_BACK = "came-back"
"""This run's own copy, dead-lettered back while the run went on: a task it moved failed
again. Never sent twice by one run: left in the DLQ for the next one."""
DIED_DURING_RUN = "died-during-run"
"""Dead-lettered after the run began (by the broker's times): the next run's to take."""


class Fate(enum.Enum):
    NOT_SELECTED = "not-selected"
    """The filters leave it out: kept, not counted."""
    EXPIRED = "expired"
    """Its Celery ``expires`` passed (without --include-expired)."""
    NO_TARGET = "no-target"
    """No single queue to send it to."""
    NOT_CELERY = "not-celery"
    """Not a Celery task, and its target is a Celery queue (without --include-unknown)."""
    GATED = "gated"
    """A gate gave a reason to skip it (the reason is the verdict's detail)."""
    AMBIGUOUS = "ambiguous"
    """It shares a key with a message sent, and nothing tells a copy from a second publish."""
    FOLLOWER = "follower"
    """A further copy of a key an earlier message of this batch decides: it follows that one."""
    PLANNED_DUPLICATE = "planned-duplicate"
    """A dry run: a copy of a key this run would already send."""
    DUPLICATE = "duplicate"
    """Its key was sent: the copy is deleted, nothing sent."""
    POISON = "poison"
    """Redriven --max-redrives times already."""
    LIMIT_REACHED = "limit-reached"
    """--limit messages are on their way: kept, not counted."""
    SEND = "send"
    """Claim its key and send it."""
    RESOLVED_SKIP = "resolved-skip"
    """An operator resolved its in-doubt key as skip (--in-doubt skip, earlier)."""
    BUSY = "busy"
    """Its key is claimed by a live run."""
    TAKEOVER = "takeover"
    """Its key is in doubt and --in-doubt resend: take the claim over and send."""
    RESOLVE_SKIP = "resolve-skip"
    """Its key is in doubt and --in-doubt skip: mark the key skipped."""
    PROVEN = "proven"
    """Its key is in doubt and --in-doubt auto, and the result backend proves the dead run's
    copy delivered: the key is taken over as sent, this copy deleted as a duplicate."""
    IN_DOUBT = "in-doubt"
    """Its key was claimed by a run that ended before confirming the send: held, reported."""
    CAME_BACK = "came-back"
    """This run's own copy come back (failed again): left in the DLQ for the next run."""
    DIED_DURING_RUN = "died-during-run"
    """It died after the run began: left in the DLQ for the next run."""
    LEASED = "leased"
    """Its key is in doubt and --in-doubt would resolve it, but the claimant's ledger lease
    has not run out: the ledger refuses to, so it is held and reported in doubt."""


# The reason each skipping fate is counted under in MoveResult.skipped.
_SKIP_REASONS = {
    Fate.EXPIRED: EXPIRED,
    Fate.NO_TARGET: NO_TARGET,
    Fate.NOT_CELERY: NOT_CELERY,
    Fate.AMBIGUOUS: AMBIGUOUS,
    Fate.POISON: POISON,
    Fate.RESOLVED_SKIP: RESOLVED_SKIP,
    Fate.RESOLVE_SKIP: RESOLVED_SKIP,
    Fate.BUSY: BUSY,
    Fate.IN_DOUBT: IN_DOUBT,
    Fate.LEASED: LEASE_LIVE,
    Fate.CAME_BACK: CAME_BACK,
    Fate.DIED_DURING_RUN: DIED_DURING_RUN,
}
# Fates not counted as matched when decided (a follower is counted once its first copy
# has gone through, as a duplicate or with it).
_UNCOUNTED = frozenset({Fate.NOT_SELECTED, Fate.LIMIT_REACHED, Fate.FOLLOWER})


@dataclass(frozen=True, slots=True)
class Verdict:
    fate: Fate
    detail: str = ""

    @property
    def skip_reason(self) -> str | None:
        """What MoveResult.skipped counts it under; None when it is not a skip."""
        if self.fate is Fate.GATED:
            return self.detail
        return _SKIP_REASONS.get(self.fate)

    @property
    def matched(self) -> bool:
        """Whether it counts as matched as soon as it is decided."""
        return self.fate not in _UNCOUNTED

    @property
    def sends(self) -> bool:
        """Whether it takes one of --limit's messages."""
        return self.fate in (Fate.SEND, Fate.TAKEOVER)


_PLAIN = {fate: Verdict(fate) for fate in Fate}
"""The verdicts without detail, made once (a decision per message is on the hot path)."""


@dataclass(slots=True)  # not frozen: a frozen one costs 4x to make, per message
class MessageFacts:
    """What is known of one message before its key is looked up."""

    selected: bool = True
    expired: bool = False
    routed: bool = True
    """Whether it has a queue to go to."""
    celery: bool = True
    gate: str | None = None
    """Why a gate says to skip it (a per-message reason; None: no objection)."""
    late_gate: str | None = None
    """A gate's reason that yields to expiry (a task whose result says it succeeded)."""
    generation: int = 0
    """How often redrive sent it before (its redrive-count)."""
    held: str | None = None
    """Why it is held as an ambiguous copy (set once its key is settled)."""
    left: Fate | None = None
    """CAME_BACK or DIED_DURING_RUN: what this run found it to be before its key decides."""
    in_batch: bool = False
    """An earlier message of this batch has its key."""
    planned: bool = False
    """A dry run: an earlier message of this run would send its key."""


@dataclass(slots=True)  # not frozen: a frozen one costs 4x to make, per message
class EntryFacts:
    """The ledger's entry for the message's key, and whether its claimant lives."""

    state: KeyState
    run_id: str
    owner_live: bool = False
    """Whether ``run_id`` (another run, holding a claim) may still be sending it."""
    delivered: bool = False
    """Whether the result backend proves the claimant's copy delivered (--in-doubt auto)."""
    leased_until: float | None = None
    """When the claimant's ledger lease runs out, if it has not yet (None: it has, or the
    claimant ended): until then the ledger neither takes its claims over nor skips them."""


@dataclass(slots=True)  # not frozen: a frozen one costs 4x to make, per message
class RunFacts:
    run_id: str | None
    limit_reached: bool = False


@dataclass(frozen=True, slots=True)
class DecisionOptions:
    """The options a decision depends on (from MoveOptions)."""

    include_expired: bool = False
    include_unknown: bool = False
    to_celery: bool = True
    """Whether the messages go to a queue Celery workers consume."""
    max_redrives: int = 3
    in_doubt: str = "hold"


def screen(message: MessageFacts, options: DecisionOptions) -> Verdict | None:
    """The decision as far as it goes before the message's key is looked up: a fate for a
    message that needs no key (left out or skipped), None for one that does."""
    if not message.selected:
        return _PLAIN[Fate.NOT_SELECTED]
    if message.gate is not None:
        # A gate's reason comes first: a task no worker registers is that, expired or not.
        return Verdict(Fate.GATED, message.gate)
    if message.expired and not options.include_expired:
        return _PLAIN[Fate.EXPIRED]
    if message.late_gate is not None:
        return Verdict(Fate.GATED, message.late_gate)
    if not message.routed:
        return _PLAIN[Fate.NO_TARGET]
    if not message.celery and not options.include_unknown and options.to_celery:
        # A Celery worker cannot decode it: it would drop it, or fail it back here.
        return _PLAIN[Fate.NOT_CELERY]
    return None


def decide(
    message: MessageFacts,
    entry: EntryFacts | None,
    run: RunFacts,
    options: DecisionOptions,
) -> Verdict:
    """One message's fate (see :class:`Fate`), from facts alone."""
    screened = screen(message, options)
    if screened is not None:
        return screened
    if message.left is not None:
        # A run never takes what it sent come back, nor what died after it began.
        return _PLAIN[message.left]
    if message.held is not None:
        return Verdict(Fate.AMBIGUOUS, message.held)
    if message.in_batch:
        return _PLAIN[Fate.FOLLOWER]
    if entry is None and message.planned:
        return _PLAIN[Fate.PLANNED_DUPLICATE]
    if entry is not None and entry.state in (KeyState.SENT, KeyState.DONE):
        return _PLAIN[Fate.DUPLICATE]
    if message.generation >= options.max_redrives:
        return _PLAIN[Fate.POISON]
    if run.limit_reached:
        return _PLAIN[Fate.LIMIT_REACHED]
    if entry is None:
        return _PLAIN[Fate.SEND]
    return _decide_claimed(entry, run, options)


def _decide_claimed(entry: EntryFacts, run: RunFacts, options: DecisionOptions) -> Verdict:
    """A key the ledger has, neither sent nor done: skipped, or claimed by some run."""
    if entry.state == KeyState.SKIPPED:
        return _PLAIN[Fate.RESOLVED_SKIP]
    if entry.run_id == run.run_id and entry.state == KeyState.CLAIMED:
        # Claimed by a batch of this run still in flight (received ahead, or in another
        # worker): the claim decides once that batch is through: sent by then, this copy
        # is a duplicate; else it is busy.
        return Verdict(Fate.SEND, "claimed earlier in this run")
    if entry.owner_live:
        return _PLAIN[Fate.BUSY]
    resolving = options.in_doubt in ("resend", "skip") or (
        options.in_doubt == "auto" and entry.delivered
    )
    if resolving and entry.leased_until is not None:
        return Verdict(Fate.LEASED, lease_live(entry.run_id, entry.leased_until))
    if options.in_doubt == "resend":
        return Verdict(Fate.TAKEOVER, entry.run_id)
    if options.in_doubt == "skip":
        return Verdict(Fate.RESOLVE_SKIP, entry.run_id)
    if options.in_doubt == "auto" and entry.delivered:
        return Verdict(Fate.PROVEN, entry.run_id)
    return Verdict(
        Fate.IN_DOUBT, f"claimed by run {entry.run_id}, which ended before confirming the send"
    )


def lease_live(run_id: str, until: float | None) -> str:
    """Why an in-doubt key the operator asked to resolve is still in doubt: the ledger lease
    of the run that claimed it (ending at ``until``, when known) has not run out."""
    when = (
        f" until {datetime.fromtimestamp(until, UTC).isoformat(timespec='seconds')}"
        if until is not None
        else ""
    )
    return (
        f"claimed by run {run_id}, which stopped before confirming the send; its ledger lease "
        f"runs{when}, and the ledger resolves none of its claims before that: rerun once the "
        f"lease is over (if run {run_id} is in fact still running, elsewhere, let it finish)"
    )
