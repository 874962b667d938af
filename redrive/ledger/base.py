"""The idempotency ledger: what redrive has claimed, sent and deleted, per task run.

A key is written *before* each step of a move (see "Moving a message without losing or
doubling it" in the design)::

    (none) --claim--> CLAIMED --send ok--> SENT --delete ok--> DONE
                        |   \\--send failed: release, key back to (none)
                        \\--owner died (in doubt): takeover then resend, or SKIPPED

Every transition is conditional on the state (and owner) it starts from, so two processes
racing on one key cannot both win it. :class:`Ledger` is backend-neutral;
:class:`redrive.ledger.sqlite.SqliteLedger` is the one-machine backend (several processes may
share its file); :class:`redrive.ledger.dynamodb.DynamoDbLedger` and
:class:`redrive.ledger.postgres.PostgresLedger` are shared across machines.
:func:`redrive.ledger.open_ledger` turns a URI into a backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Any, Protocol, Self

from redrive.errors import LedgerError

MAX_KEY_LENGTH = 128
KEY_PAGE = 500
"""Keys :meth:`Ledger.iter_keys` reads per page: its memory, however many keys match."""
RUN_OUTCOMES = frozenset({"completed", "interrupted", "failed"})


class KeyState(StrEnum):
    CLAIMED = "claimed"
    SENT = "sent"
    DONE = "done"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class Entry:
    """One key's row: the state of one task run's redrive."""

    key: str
    state: KeyState
    run_id: str  # the run that claimed it (or took it over, or resolved it as skipped)
    task: str
    message_id: str  # the DLQ MessageId that was claimed
    target: str  # queue URL it was/is sent to
    sent_message_id: str | None  # MessageId SQS returned for the copy we sent
    updated_at: float  # unix time of the last transition
    sent_at: float | None = None  # unix time of the SENT transition (None: not sent, or a
    # ledger of schema 2 or older recorded it)


@dataclass(frozen=True, slots=True)
class Claim:
    """One key to claim, with what the ledger should remember about it."""

    key: str
    task: str
    message_id: str
    target: str


def claimed_entry(claim: Claim, run_id: str, now: float) -> Entry:
    """The entry a claim by ``run_id`` at ``now`` makes: CLAIMED, nothing sent yet."""
    return Entry(
        key=claim.key,
        state=KeyState.CLAIMED,
        run_id=run_id,
        task=claim.task,
        message_id=claim.message_id,
        target=claim.target,
        sent_message_id=None,
        updated_at=now,
    )


@dataclass(frozen=True, slots=True)
class ClaimResult(Mapping[str, Entry]):
    """What :meth:`Ledger.claim_many` returns.

    It is a mapping of *every* requested key to its entry as it stands after the call, plus
    ``won``: the keys this call inserted, which the caller (and nobody else) must now send.

    For a key not in ``won``:

    - ``entry.run_id == run_id`` and state CLAIMED: already this run's (claimed by an earlier
      call, or by an earlier claim of the same key in this batch: a duplicate copy of one
      task; ``entry.message_id`` says which copy holds the claim);
    - state SENT or DONE: already sent: this copy is a duplicate, delete it;
    - state CLAIMED by another run: another run is sending it, or died doing so (in doubt);
    - state SKIPPED: an operator resolved it as not to be resent.
    """

    entries: Mapping[str, Entry]
    won: frozenset[str] = field(default_factory=frozenset)

    def __getitem__(self, key: str) -> Entry:
        return self.entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


@dataclass(frozen=True, slots=True)
class RunInfo:
    """One run of a redrive command, as recorded in the ledger."""

    run_id: str
    command: str
    started_at: float
    heartbeat_at: float
    lease_until: float  # the run promised to heartbeat again before this time
    ended_at: float | None
    outcome: str | None  # one of RUN_OUTCOMES once ended
    info: dict[str, Any]
    counts: dict[str, int]

    def is_live(self, *, now: float, stale_after: float) -> bool:
        """Not ended, and either heartbeating recently or still inside its promised lease.

        The lease counts too because a run whose lease has not run out may still be between
        a claim and its send; calling it dead early is what would let a resend double a task.
        """
        if self.ended_at is not None:
            return False
        return self.heartbeat_at > now - stale_after or self.lease_until > now


class Ledger(Protocol):
    """What the move engine needs from a ledger backend (SQLite, or DynamoDB in
    :mod:`redrive.ledger.dynamodb`).

    Every ``*_many`` method is one transaction (or one batch of conditional writes) per call
    (a transaction the SQLite backend may share with other threads' calls: group commit; a
    call is still all or nothing); when it returns, its writes are durable. Transitions that
    do not apply (wrong state, wrong owner, absent key) are skipped silently: the caller
    reads back with :meth:`get_many` when it needs to know. The two that resolve another
    run's claims (:meth:`takeover_many`, :meth:`mark_skipped_many`) return the keys they
    changed: a leased owner's claims they refuse, and a caller reports only what was done.
    """

    location: str  # human-readable, e.g. "sqlite:///home/u/.local/state/redrive/ledger.sqlite3"
    legacy_keys: bool
    """Whether the ledger may hold keys of the form before keys named the publish
    (:func:`redrive.keys.legacy_key_for`): the engine then looks those up too."""

    warnings: tuple[str, ...] = ()
    """What opening it found that the user should know, one line each (a PostgreSQL
    server streaming to asynchronous standbys); the CLI shows them, the core never prints."""

    @property
    def uri(self) -> str:
        """The URI that opens this ledger again (another process of ``--processes``). It
        may hold a password: print :attr:`location`, never this."""
        return self.location

    def start_run(self, run_id: str, *, command: str, info: Mapping[str, Any]) -> None: ...

    def heartbeat(self, run_id: str, *, lease_until: float) -> None: ...

    def end_run(
        self,
        run_id: str,
        *,
        outcome: str,
        counts: Mapping[str, int],
        info: Mapping[str, Any] | None = None,
    ) -> None:
        """Record how the run ended, adding ``info`` to what it recorded at its start (what
        only its end knows, such as the messages a purge deleted). Ending an ended run keeps
        the first outcome: shutdown paths may end a run twice, and the first word is the
        true one.

        A ValueError for an outcome not in RUN_OUTCOMES (see :func:`check_outcome`).
        """
        ...

    def run(self, run_id: str) -> RunInfo | None: ...

    def runs(self, since: float | None = None) -> list[RunInfo]: ...

    def live_runs(self, *, stale_after: float) -> list[RunInfo]: ...

    def is_live(self, run_id: str, *, stale_after: float) -> bool: ...

    def get_many(self, keys: Sequence[str]) -> dict[str, Entry]: ...

    def keys_for_run(self, run_id: str) -> list[Entry]: ...

    def iter_keys(
        self, state: KeyState, *, run_id: str | None = None, page_size: int = KEY_PAGE
    ) -> Iterator[Entry]:
        """Every key in ``state`` (only ``run_id``'s, when given), read ``page_size`` at a
        time: a listing of any length in bounded memory. Each page is read when the one
        before has been consumed, as the ledger stands then: a key that changes meanwhile
        may be listed in its old state, or not at all. The order is the backend's (SQLite:
        the order of the claims; DynamoDB: the table's).

        A ValueError for a ``page_size`` below 1 (see :func:`check_page_size`)."""
        ...

    def claim_many(self, run_id: str, claims: Sequence[Claim]) -> ClaimResult: ...

    def takeover_many(self, run_id: str, keys_and_old_runs: Sequence[tuple[str, str]]) -> set[str]:
        """Each key still CLAIMED by its named old run, whose lease has run out, -> claimed by
        ``run_id``. Returns the keys taken: only those may be resent."""
        ...

    def mark_sent_many(self, run_id: str, sent: Mapping[str, str]) -> None: ...

    def release_many(self, run_id: str, keys: Sequence[str]) -> None: ...

    def mark_done_many(self, run_id: str, keys: Sequence[str]) -> None: ...

    def mark_skipped_many(self, run_id: str, keys: Sequence[str]) -> set[str]:
        """Each key CLAIMED by another run, whose lease has run out, -> SKIPPED, owned by
        ``run_id``. Returns the keys marked: only those are resolved."""
        ...

    def close(self) -> None: ...

    # Backends subclass this protocol, and share its use as a context manager that closes.
    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def check_outcome(outcome: str) -> None:
    if outcome not in RUN_OUTCOMES:
        raise ValueError(f"outcome must be one of {sorted(RUN_OUTCOMES)}, got {outcome!r}")


def run_not_open(run_id: str, location: str) -> LedgerError:
    """The error for a heartbeat of a run that never started or has ended."""
    return LedgerError(
        f"run {run_id} is not open in ledger {location} (never started or "
        "already ended); stop and start a new run"
    )


def ledger_closed(location: str) -> LedgerError:
    """The error for a call on a ledger object after its close()."""
    return LedgerError(f"ledger {location} is closed; open it again")


def check_page_size(page_size: int) -> None:
    if page_size < 1:
        raise ValueError(f"a page holds at least one key, not {page_size}")


def keyset_pages(
    read_page: Callable[[int], Sequence[Sequence[Any]]],
    size: int,
    entry: Callable[[Sequence[Any]], Entry],
) -> Iterator[Entry]:
    """Entries read ``size`` rows a page along an increasing row id: ``read_page(after)``
    gives the rows (the id first, then the entry's columns) whose id is above ``after``, in
    id order. Each page is its own read, so a reader slow to consume holds nothing open."""
    after = 0
    while True:
        rows = read_page(after)
        for row in rows:
            yield entry(row[1:])
        if len(rows) < size:
            return
        after = rows[-1][0]


def check_key(key: str) -> None:
    if not key or len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"ledger keys must be 1..{MAX_KEY_LENGTH} characters, got {key!r}")
