"""Resolving in-doubt keys one by one (``redrive ledger resolve``; the web console calls the
same core): gather what redrive can know of each without harm, show what it found and what it
would do, and, executed, do only that.

The evidence is the ledger's (the claim, and the audit of the run that made it: how it
ended, its lease) and, when given, Celery's result backend's record of the task. Nothing
here looks into a target queue: an SQS receive hides the message and raises its receive
count, a RabbitMQ get counts toward a quorum queue's delivery limit.

What it does with a key (:func:`resolution_for`, a pure decision):

- a record dated after the claim proves a worker received the send: the key is recorded
  SENT (the next move deletes its DLQ copy as a duplicate), never resent;
- the claimant's lease still runs: nothing (the ledger resolves none of its claims before);
- otherwise nothing proves either way (no backend, a task that keeps no result, no record,
  or one from before the claim): it is left to the operator, who names the keys to resend
  (their claims released, so the next move sends them) or to skip (SKIPPED, kept in the DLQ).
"""

from __future__ import annotations

import enum
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from redrive.celery.results import (
    CLOCK_MARGIN,
    PENDING,
    ResultLookup,
    TaskRecord,
    proves_delivered,
)
from redrive.errors import UsageProblem
from redrive.keys import task_id_of_key
from redrive.ledger import Entry, KeyState, Ledger, RunInfo
from redrive.runs.lifecycle import RunLifecycle, run_is_live

PAGE = 100
"""Keys looked up in the result backend in one round trip."""


class Action(enum.Enum):
    RECORD_SENT = "record-sent"
    """Proven delivered: recorded SENT; the next move deletes the DLQ copy as a duplicate."""
    RESEND = "resend"
    """The operator's choice: the claim is released; the next move sends the message."""
    SKIP = "skip"
    """The operator's choice: SKIPPED; the message stays in the DLQ, never sent."""
    LEAVE = "leave"
    """Nothing proves it either way and no choice was made: left in doubt."""
    WAIT = "wait"
    """The claimant's ledger lease still runs: nothing can be resolved before it ends."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """What redrive found of one in-doubt key without harm."""

    entry: Entry
    run: RunInfo | None
    """The audit trail's record of the run that claimed it (None: gone from the ledger)."""
    backend: str | None
    """The result backend asked (its masked location); None: none was given."""
    record: TaskRecord | None
    """The backend's record of the task (None: not asked)."""
    ignores_result: bool = False
    """The Celery app says the task keeps no result: no record proves anything."""

    @property
    def task_id(self) -> str | None:
        return task_id_of_key(self.entry.key)


@dataclass(slots=True)
class Resolution:
    """One in-doubt key: what was found, what is (or would be) done, and whether it was."""

    evidence: Evidence
    found: str
    action: Action
    why: str
    done: bool = False

    def to_json(self) -> dict[str, Any]:
        entry, record = self.evidence.entry, self.evidence.record
        return {
            "message_id": entry.message_id,
            "task": entry.task,
            "task_id": self.evidence.task_id,
            "key": entry.key,
            "target": entry.target,
            "run_id": entry.run_id,
            "claimed_at": _iso(entry.updated_at),
            "result_state": record.state if record is not None else None,
            "result_date_done": _iso(record.date_done) if record is not None else None,
            "found": self.found,
            "action": self.action.value,
            "why": self.why,
            "done": self.done,
        }


@dataclass(frozen=True, slots=True)
class Choices:
    """The operator's explicit choices, by task id, DLQ message id or key."""

    resend: frozenset[str] = frozenset()
    skip: frozenset[str] = frozenset()

    def of(self, evidence: Evidence) -> Action | None:
        names = {evidence.entry.key, evidence.entry.message_id, evidence.task_id}
        if names & self.resend:
            return Action.RESEND
        if names & self.skip:
            return Action.SKIP
        return None


@dataclass(slots=True)
class ResolveTally:
    """What a resolve counts as it goes, keeping none of its resolutions (memory does not
    grow with the keys in doubt): the summary printed after them, and ``--json``'s fields
    but its messages."""

    ledger: str
    executed: bool
    in_doubt: int = 0
    """Keys looked at."""
    by_action: Counter[Action] = field(default_factory=Counter)
    left: int = 0
    """Keys still in doubt: left to the operator, waiting on a lease, or not done."""
    busy: int = 0
    """Claims of live runs (being sent now): not in doubt, not looked at."""
    unmatched: list[str] = field(default_factory=list)
    """Ids named by a choice that no in-doubt key has (known once every key was seen)."""

    def count(self, action: Action) -> int:
        return self.by_action[action]

    def add(self, page: Sequence[Resolution]) -> None:
        """Count a page of resolutions, as done (or not) by then."""
        for item in page:
            self.in_doubt += 1
            self.by_action[item.action] += 1
            still = item.action in (Action.LEAVE, Action.WAIT)
            self.left += still or (self.executed and not item.done)

    def head_json(self) -> dict[str, Any]:
        """``ledger resolve --json``'s fields before its ``messages``."""
        return {
            "ledger": self.ledger,
            "dry_run": not self.executed,
            "in_doubt": self.in_doubt,
            "by_action": {a.value: self.count(a) for a in Action if self.count(a)},
            "left_in_doubt": self.left,
            "busy": self.busy,
            "unmatched": self.unmatched,
        }


@dataclass(slots=True)
class ResolveResult:
    """Every in-doubt key looked at, in the ledger's order, and what came of each (kept
    whole: :func:`resolve_in_doubt_paged` is the form whose memory does not grow)."""

    ledger: str
    executed: bool
    resolutions: list[Resolution] = field(default_factory=list)
    busy: int = 0
    """Claims of live runs (being sent now): not in doubt, not looked at."""
    unmatched: list[str] = field(default_factory=list)
    """Ids named by a choice that no in-doubt key has."""

    def tally(self) -> ResolveTally:
        tally = ResolveTally(self.ledger, self.executed, busy=self.busy, unmatched=self.unmatched)
        tally.add(self.resolutions)
        return tally

    def count(self, action: Action) -> int:
        return sum(r.action is action for r in self.resolutions)

    @property
    def left(self) -> int:
        """Keys still in doubt: left to the operator, waiting on a lease, or not done."""
        return self.tally().left

    def to_json(self) -> dict[str, Any]:
        return {**self.tally().head_json(), "messages": [r.to_json() for r in self.resolutions]}


def resolution_for(evidence: Evidence, choice: Action | None, now: float) -> Resolution:
    """What to do with one in-doubt key, from what was found (and the operator's choice)."""
    run, entry, record = evidence.run, evidence.entry, evidence.record
    if run is not None and run.ended_at is None and run.lease_until > now:
        return Resolution(
            evidence,
            f"run {entry.run_id} stopped without ending; its ledger lease runs until "
            f"{_iso(run.lease_until)}",
            Action.WAIT,
            "the ledger resolves none of its claims before its lease ends: rerun then",
        )
    if record is not None and proves_delivered(record, entry.updated_at):
        found = f"the result backend records {record.state} at {_iso(record.date_done)}"
        why = "a worker received the send after the claim: never resent; the next move "
        why += "deletes the DLQ copy as a duplicate"
        if choice is Action.SKIP:
            return Resolution(evidence, found, Action.SKIP, "your choice (--skip)")
        return Resolution(evidence, found + ", after the claim", Action.RECORD_SENT, why)
    found = _no_proof(evidence)
    if choice is Action.RESEND:
        why = "your choice (--resend): the claim is released and the next move sends it"
        return Resolution(evidence, found, Action.RESEND, why)
    if choice is Action.SKIP:
        why = "your choice (--skip): never sent; the message stays in the DLQ"
        return Resolution(evidence, found, Action.SKIP, why)
    why = "nothing proves whether it was sent: name it with --resend (if the task may run "
    why += "twice) or --skip"
    return Resolution(evidence, found, Action.LEAVE, why)


def _no_proof(evidence: Evidence) -> str:
    """Why what was found proves nothing about the send."""
    record = evidence.record
    if evidence.backend is None:
        return "no result backend given (--result-backend): nothing tells whether it was sent"
    if evidence.ignores_result:
        return "the Celery app says the task keeps no result: its backend cannot tell"
    if evidence.task_id is None:
        return "not a Celery task: the result backend cannot tell"
    if record is None or record.state == PENDING:
        return (
            "no record in the result backend: not proof it was not sent (a worker may not "
            "have run it yet, or the record expired)"
        )
    if record.date_done is None:
        return f"the result backend records {record.state}, undated: it may predate the claim"
    return (
        f"the result backend records {record.state} at {_iso(record.date_done)}, not after "
        f"the claim (+{CLOCK_MARGIN:.0f} s): an earlier attempt's"
    )


@dataclass(slots=True)
class Busy:
    """Claims a gathering passed over because their run is live (being sent now)."""

    claims: int = 0


def gather(
    ledger: Ledger,
    *,
    results: ResultLookup | None = None,
    ignores_result: Callable[[str], bool] = lambda task: False,
    owners: Sequence[str | None] = (None,),
    now: Callable[[], float] = time.time,
    busy: Busy | None = None,
) -> Iterator[Evidence]:
    """The evidence of every in-doubt key (of the runs ``owners`` names; None: all), a page
    at a time: the claim, its run's record, and the backend's record of the task."""
    busy = busy if busy is not None else Busy()
    runs: dict[str, RunInfo | None] = {}
    page: list[Entry] = []
    for owner in owners:
        for entry in ledger.iter_keys(KeyState.CLAIMED, run_id=owner):
            if entry.run_id not in runs:
                runs[entry.run_id] = ledger.run(entry.run_id)
            run = runs[entry.run_id]
            if run is not None and run_is_live(run, now()):
                busy.claims += 1
                continue
            page.append(entry)
            if len(page) >= PAGE:
                yield from _evidence(page, runs, results, ignores_result)
                page = []
    yield from _evidence(page, runs, results, ignores_result)


def _evidence(
    page: Sequence[Entry],
    runs: dict[str, RunInfo | None],
    results: ResultLookup | None,
    ignores_result: Callable[[str], bool],
) -> Iterator[Evidence]:
    asked = [t for e in page if (t := task_id_of_key(e.key)) and not ignores_result(e.task)]
    records = results.records(asked) if results is not None and asked else {}
    location = results.location if results is not None else None
    for entry in page:
        task_id = task_id_of_key(entry.key)
        yield Evidence(
            entry,
            runs.get(entry.run_id),
            location,
            records.get(task_id) if task_id else None,
            ignores_result=ignores_result(entry.task),
        )


def resolve_in_doubt(
    ledger: Ledger,
    choices: Choices,
    *,
    execute: bool,
    command: str = "ledger resolve",
    results: ResultLookup | None = None,
    ignores_result: Callable[[str], bool] = lambda task: False,
    owners: Sequence[str | None] = (None,),
    now: Callable[[], float] = time.time,
) -> ResolveResult:
    """Gather the evidence of every in-doubt key and decide each; executed, do what was
    decided as a run of its own (the audit trail names it as the keys' new owner). Every
    resolution is kept in the result: :func:`resolve_in_doubt_paged` keeps none."""
    resolutions: list[Resolution] = []
    tally = resolve_in_doubt_paged(
        ledger,
        choices,
        execute=execute,
        on_page=resolutions.extend,
        command=command,
        results=results,
        ignores_result=ignores_result,
        owners=owners,
        now=now,
    )
    return ResolveResult(tally.ledger, tally.executed, resolutions, tally.busy, tally.unmatched)


def resolve_in_doubt_paged(
    ledger: Ledger,
    choices: Choices,
    *,
    execute: bool,
    on_page: Callable[[Sequence[Resolution]], None],
    command: str = "ledger resolve",
    results: ResultLookup | None = None,
    ignores_result: Callable[[str], bool] = lambda task: False,
    owners: Sequence[str | None] = (None,),
    now: Callable[[], float] = time.time,
) -> ResolveTally:
    """:func:`resolve_in_doubt` a page at a time, in memory that does not grow with the
    keys in doubt: each page of at most :data:`PAGE` resolutions goes to ``on_page`` once
    done (executed) or decided (a dry run), then is let go; the tally (counts, busy claims,
    unmatched choices) comes back at the end. A page ``on_page`` got was done even if a
    later one fails."""
    busy = Busy()
    evidence = gather(
        ledger, results=results, ignores_result=ignores_result, owners=owners, now=now, busy=busy
    )
    life = RunLifecycle(ledger, execute=execute, command=command, clock=now)
    tally = ResolveTally(ledger.location, executed=life.run_id is not None)
    life.counts = lambda: {a.value: tally.count(a) for a in Action}
    with life:
        for page in resolve_pages(
            ledger, evidence, choices, run_id=life.run_id, tally=tally, now=now
        ):
            on_page(page)
        tally.busy = busy.claims
    return tally


def resolve(
    ledger: Ledger,
    evidence: Iterator[Evidence],
    choices: Choices,
    *,
    run_id: str | None,
    now: Callable[[], float] = time.time,
) -> ResolveResult:
    """Decide each key; with ``run_id`` (an executed resolve's run) do what was decided,
    a page at a time. Only what the ledger did is marked done."""
    tally = ResolveTally(ledger.location, executed=run_id is not None)
    result = ResolveResult(ledger.location, executed=run_id is not None)
    for page in resolve_pages(ledger, evidence, choices, run_id=run_id, tally=tally, now=now):
        result.resolutions += page
    result.unmatched = tally.unmatched
    return result


def resolve_pages(
    ledger: Ledger,
    evidence: Iterator[Evidence],
    choices: Choices,
    *,
    run_id: str | None,
    tally: ResolveTally,
    now: Callable[[], float] = time.time,
) -> Iterator[list[Resolution]]:
    """Decide each key, a page at a time; with ``run_id`` (an executed resolve's run) do
    what was decided before the page is yielded. Only what the ledger did is marked done.
    ``tally`` counts each page, and once the last is through names the choices no key had
    (what is kept of the names seen is only the choices', not every key's)."""
    chosen = choices.resend | choices.skip
    matched: set[str] = set()
    page: list[Resolution] = []
    for item in evidence:
        matched |= chosen & {item.entry.key, item.entry.message_id, item.task_id or ""}
        page.append(resolution_for(item, choices.of(item), now()))
        if len(page) >= PAGE:
            yield _applied(ledger, page, run_id, tally)
            page = []
    if page:
        yield _applied(ledger, page, run_id, tally)
    tally.unmatched = sorted(chosen - matched)


def _applied(
    ledger: Ledger, page: list[Resolution], run_id: str | None, tally: ResolveTally
) -> list[Resolution]:
    _apply(ledger, page, run_id)
    tally.add(page)
    return page


def _apply(ledger: Ledger, page: Sequence[Resolution], run_id: str | None) -> None:
    """Carry out a page's resolutions as the resolve's run ``run_id`` (None: a dry run)."""
    if run_id is None:
        return
    by_action: dict[Action, list[Resolution]] = {}
    for item in page:
        by_action.setdefault(item.action, []).append(item)
    taken = ledger.takeover_many(
        run_id,
        [
            (r.evidence.entry.key, r.evidence.entry.run_id)
            for action in (Action.RECORD_SENT, Action.RESEND)
            for r in by_action.get(action, [])
        ],
    )
    sent = [r for r in by_action.get(Action.RECORD_SENT, []) if r.evidence.entry.key in taken]
    if sent:
        ledger.mark_sent_many(run_id, {r.evidence.entry.key: "" for r in sent})
    resend = [r for r in by_action.get(Action.RESEND, []) if r.evidence.entry.key in taken]
    if resend:
        ledger.release_many(run_id, [r.evidence.entry.key for r in resend])
    skip = by_action.get(Action.SKIP, [])
    skipped = (
        ledger.mark_skipped_many(run_id, [r.evidence.entry.key for r in skip]) if skip else set()
    )
    for item in [*sent, *resend, *(r for r in skip if r.evidence.entry.key in skipped)]:
        item.done = True


def choices_of(resend: Collection[str], skip: Collection[str]) -> Choices:
    """The operator's choices; an id named both ways is a usage problem."""
    both = sorted(set(resend) & set(skip))
    if both:
        raise UsageProblem(f"named both to resend and to skip: {', '.join(both)}")
    return Choices(frozenset(resend), frozenset(skip))


def ignores_result_of(app: Any) -> Callable[[str], bool]:
    """Whether the Celery app's task keeps no result (``ignore_result``, per task or by
    ``task_ignore_result``): then no record of it can prove anything."""
    default = bool(getattr(app.conf, "task_ignore_result", False))

    def ignores(task: str) -> bool:
        registered = app.tasks.get(task)
        value = getattr(registered, "ignore_result", None) if registered is not None else None
        return default if value is None else bool(value)

    return ignores


def _iso(when: float | None) -> str | None:
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="seconds") if when else None
