"""The ledger in one DynamoDB table, shared by operators on any number of machines.

Single-table design, partition key ``pk`` (a string) and nothing else:

- ``key#<key>``: one idempotency key (state, run_id, task, message_id, target,
  sent_message_id, updated_at, sent_at, claim_token; an item written before redrive recorded
  ``sent_at`` has none, and reads as None);
- ``run#<run_id>``: one run (kind, command, started_at, heartbeat_at, lease_until, ended_at,
  outcome, info and counts as JSON, start_token).

Both kinds carry ``expires_at``, the table's TTL attribute: 30 days after the item's last
write, longer than the 14 days a DLQ can keep a message, so a key outlives every copy of its
task that could still come back.

Every state change is one conditional write of one item (``attribute_not_exists(pk)`` for a
claim, ``#state = :claimed AND #run_id = :run`` for mark_sent, ...). A batch is not a
TransactWriteItems: a transaction fails whole when one of its conditions fails, and losing
one key of ten to another operator must not lose the other nine. Nor can they be batched:
BatchWriteItem takes no conditions. The writes of a batch run side by side in a thread pool
shared by the ledger's callers (as wide as the client's connection pool, so that several
workers' batches go out together), and a refused condition is simply "not won".
Takeover and skip must also see that the owner's lease ran out, which lives on another
item: each is a two-item transaction (a ConditionCheck on the owner's run item and the
update of the key), one per key for the same reason.

Unlike SQLite's, a ``*_many`` call that fails part-way keeps the writes that succeeded: each
is a true transition on its own (a key marked SENT was sent). A failed claim_many releases
what it won before raising, so those keys are not left in doubt. Writes the AWS client
retries after a lost answer are recognised: a claim or start_run by the token it wrote, a
transaction by its ClientRequestToken.

Reads that decide anything (get_many, run, and every read-back) are strongly consistent.
Listing a run's keys and listing runs go through two sparse KEYS_ONLY global secondary
indexes, ``keys_by_run`` (run_id; on key items only) and ``runs_by_start`` (kind,
started_at; on run items only), and then re-read the items consistently. A scan would do for
runs alone, but it reads every key item too, and a busy ledger holds far more keys than
runs. Index reads are eventually consistent: a run or claim made a moment ago may be
missing from a listing (never from get_many or run). KEYS_ONLY keeps key transitions that
do not change the owner (sent, done) out of the index's writes.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import redrive.ledger.dynamodb_writes as writes
from redrive.aws.session import AwsSettings
from redrive.errors import LedgerError
from redrive.ledger.base import (
    KEY_PAGE,
    Claim,
    ClaimResult,
    Entry,
    KeyState,
    Ledger,
    RunInfo,
    check_key,
    check_outcome,
    check_page_size,
    claimed_entry,
    run_not_open,
)
from redrive.ledger.dynamodb_calls import CONFLICT_ATTEMPTS, ConditionFailed, TableCalls
from redrive.ledger.dynamodb_items import (
    KEY_PREFIX,
    RUN_KIND,
    as_n,
    as_s,
    attribute_names,
    entry_of,
    key_pk,
    optional_string,
    run_info_of,
    run_pk,
)
from redrive.ledger.dynamodb_table import (
    KEYS_BY_RUN,
    RUNS_BY_START,
    TTL_ATTRIBUTE,
    TTL_SECONDS,
    check_ledger_table,
    check_table_name,
    init_table,
    ttl_needs_switching_on,
)

__all__ = [
    "KEYS_BY_RUN",
    "RUNS_BY_START",
    "TTL_ATTRIBUTE",
    "TTL_SECONDS",
    "DynamoDbLedger",
    "check_table_name",
    "init_table",
    "open_dynamodb",
    "ttl_needs_switching_on",
]


def open_dynamodb(
    rest: str, uri: str, client_factory: Callable[[str], Any] | None = None
) -> DynamoDbLedger:
    """The ledger ``dynamodb://TABLE`` names; ``client_factory`` makes the DynamoDB client
    (default: boto3's usual settings chain with redrive's retry configuration)."""
    table = check_table_name(rest, uri)
    if client_factory is None:
        client_factory = AwsSettings().client
    client = client_factory("dynamodb")
    try:
        return DynamoDbLedger(table, client, close_client=True)
    except BaseException:
        with contextlib.suppress(Exception):
            client.close()
        raise


class DynamoDbLedger(Ledger):
    """The ledger in one DynamoDB table (see the module docstring for the design).

    Thread safety: one boto3 client (thread-safe) and a pool of threads for the writes of
    a batch (``write_threads``, default: as many as the client's connection pool holds),
    shared by every caller; any number of threads may use one object.

    Opening reads the table's description once, so a missing table or a foreign one is an
    error here rather than halfway through a run.
    """

    def __init__(
        self,
        table: str,
        client: Any,
        *,
        clock: Callable[[], float] = time.time,
        ttl: float = TTL_SECONDS,
        close_client: bool = False,
        write_threads: int | None = None,
    ) -> None:
        self.table = check_table_name(table)
        self.location = f"dynamodb://{table}"
        # A table does not say which redrive wrote its keys; keys expire after TTL_SECONDS,
        # so the lookups of legacy keys find nothing a month after an upgrade (and cost one
        # more item per message of a BatchGetItem that is made anyway).
        self.legacy_keys = True
        self._clock = clock
        self._ttl = ttl
        self._calls = TableCalls(
            self.table,
            client,
            location=self.location,
            close_client=close_client,
            write_threads=write_threads,
        )
        check_ledger_table(
            self.table, self._calls.call("DescribeTable", TableName=self.table)["Table"]
        )

    def close(self) -> None:
        self._calls.close()

    # ----------------------------------------------------------------- copies

    def load_runs(self, runs: Sequence[RunInfo]) -> int:
        """Put each run absent here, as it stands (a copy); the number put."""
        now = self._clock()
        items = [writes.copied_run_item(r, now=now, ttl=self._ttl) for r in runs]
        return sum(self._calls.each_or_raise(self._put_if_absent, items))

    def load_entries(self, entries: Sequence[Entry], *, legacy_keys: bool) -> int:
        """Put each key absent here, as it stands (a copy); the number put. (A table
        always looks up keys of the legacy form: ``legacy_keys`` changes nothing.)"""
        now = self._clock()
        items = [writes.copied_entry_item(e, now=now, ttl=self._ttl) for e in entries]
        return sum(self._calls.each_or_raise(self._put_if_absent, items))

    def _put_if_absent(self, item: dict[str, Any]) -> bool:
        try:
            self._calls.put_new(item)
        except ConditionFailed:
            return False
        return True

    def __repr__(self) -> str:
        return f"DynamoDbLedger({self.location!r})"

    # ----------------------------------------------------------------- runs

    def start_run(self, run_id: str, *, command: str, info: Mapping[str, Any]) -> None:
        now = self._clock()
        token = uuid.uuid4().hex
        item = writes.run_item(
            run_id, command=command, info=info, now=now, token=token, ttl=self._ttl
        )
        try:
            self._calls.put_new(item)
        except ConditionFailed as refused:
            # Our own put, retried by the AWS client after its answer was lost, finds itself.
            if refused.item is not None and optional_string(refused.item, "start_token") == token:
                return
            raise LedgerError(
                f"run {run_id} already exists in ledger {self.location}; "
                "start the run again with a new run id"
            ) from None

    def heartbeat(self, run_id: str, *, lease_until: float) -> None:
        now = self._clock()
        applied = self._calls.write_silently(
            "UpdateItem",
            **writes.heartbeat_update(run_id, lease_until=lease_until, now=now, ttl=self._ttl),
        )
        if not applied:
            raise run_not_open(run_id, self.location)

    def end_run(
        self,
        run_id: str,
        *,
        outcome: str,
        counts: Mapping[str, int],
        info: Mapping[str, Any] | None = None,
    ) -> None:
        check_outcome(outcome)
        now = self._clock()
        update = writes.end_run_update(
            run_id, outcome=outcome, counts=counts, now=now, ttl=self._ttl
        )
        item = self._calls.get_item(run_pk(run_id)) if info else None
        if item is not None and info:
            # Only the run itself writes its info, so reading it first races with no one.
            update = writes.with_info(update, {**json.loads(item["info"]["S"]), **info})
        applied = self._calls.write_silently("UpdateItem", **update)
        if not applied and self._calls.get_item(run_pk(run_id)) is None:
            raise LedgerError(
                f"run {run_id} is not in ledger {self.location}; "
                "it was never started there (check the ledger URI)"
            )

    def run(self, run_id: str) -> RunInfo | None:
        item = self._calls.get_item(run_pk(run_id))
        return None if item is None else run_info_of(item)

    def runs(self, since: float | None = None) -> list[RunInfo]:
        """Runs started at or after ``since`` (all when None), oldest first."""
        if since is not None and not math.isfinite(since):
            if since > 0 or math.isnan(since):
                return []
            since = None
        # DynamoDB refuses placeholders an expression does not use.
        condition = "#kind = :run"
        names = attribute_names("kind")
        values: dict[str, Any] = {":run": as_s(RUN_KIND)}
        if since is not None:
            condition += " AND #started_at >= :since"
            names.update(attribute_names("started_at"))
            values[":since"] = as_n(since)
        pks = self._calls.query_pks(
            IndexName=RUNS_BY_START,
            KeyConditionExpression=condition,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )
        items = self._calls.batch_get(pks)
        infos = [run_info_of(items[pk]) for pk in pks if pk in items]
        if since is not None:
            infos = [r for r in infos if r.started_at >= since]
        return sorted(infos, key=lambda r: (r.started_at, r.run_id))

    def live_runs(self, *, stale_after: float) -> list[RunInfo]:
        """Runs not ended that heartbeated within ``stale_after`` seconds or whose lease has
        not run out (see :meth:`RunInfo.is_live`), oldest first."""
        now = self._clock()
        return [r for r in self.runs() if r.is_live(now=now, stale_after=stale_after)]

    def is_live(self, run_id: str, *, stale_after: float) -> bool:
        """False for a run that ended, went stale, or is unknown to this ledger."""
        info = self.run(run_id)
        return info is not None and info.is_live(now=self._clock(), stale_after=stale_after)

    # ----------------------------------------------------------------- keys

    def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        """Entries for those of ``keys`` the ledger has, in the order of ``keys``."""
        unique = list(dict.fromkeys(keys))
        items = self._calls.batch_get([KEY_PREFIX + k for k in unique])
        return {k: entry_of(items[KEY_PREFIX + k]) for k in unique if KEY_PREFIX + k in items}

    def keys_for_run(self, run_id: str) -> list[Entry]:
        """Entries whose owner is ``run_id``, in the order they were last changed."""
        pks = self._calls.query_pks(
            IndexName=KEYS_BY_RUN,
            KeyConditionExpression="#run_id = :run",
            ExpressionAttributeNames=attribute_names("run_id"),
            ExpressionAttributeValues={":run": as_s(run_id)},
        )
        items = self._calls.batch_get(pks)
        # The index may lag an owner change; the consistent re-read has the last word.
        entries = [entry_of(items[pk]) for pk in pks if pk in items]
        return sorted(
            (e for e in entries if e.run_id == run_id), key=lambda e: (e.updated_at, e.key)
        )

    def iter_keys(
        self, state: KeyState, *, run_id: str | None = None, page_size: int = KEY_PAGE
    ) -> Iterator[Entry]:
        """Keys in ``state``, a page of ``page_size`` items at a time: of one run, a Query of
        its index then a consistent read of that page's items; of every run, a consistent
        Scan of the table (it reads every item, keys and runs alike: no index names a
        state)."""
        check_page_size(page_size)
        state = KeyState(state)
        if run_id is None:
            return self._scanned_keys(state, page_size)
        return self._run_keys(state, run_id, page_size)

    def _scanned_keys(self, state: KeyState, size: int) -> Iterator[Entry]:
        start: dict[str, Any] | None = None
        while True:
            extra = {"ExclusiveStartKey": start} if start else {}
            # Limit bounds the items a page reads; the filter then keeps this state's keys.
            response = self._calls.call(
                "Scan",
                TableName=self.table,
                Limit=size,
                ConsistentRead=True,
                FilterExpression="begins_with(#pk, :prefix) AND #state = :state",
                ExpressionAttributeNames=attribute_names("pk", "state"),
                ExpressionAttributeValues={":prefix": as_s(KEY_PREFIX), ":state": as_s(state)},
                **extra,
            )
            for item in response.get("Items", []):
                yield entry_of(item)
            start = response.get("LastEvaluatedKey")
            if not start:
                return

    def _run_keys(self, state: KeyState, run_id: str, size: int) -> Iterator[Entry]:
        start: dict[str, Any] | None = None
        while True:
            extra = {"ExclusiveStartKey": start} if start else {}
            response = self._calls.call(
                "Query",
                TableName=self.table,
                IndexName=KEYS_BY_RUN,
                KeyConditionExpression="#run_id = :run",
                ExpressionAttributeNames=attribute_names("run_id"),
                ExpressionAttributeValues={":run": as_s(run_id)},
                Limit=size,
                **extra,
            )
            pks = [item["pk"]["S"] for item in response.get("Items", [])]
            items = self._calls.batch_get(pks)
            for pk in pks:
                # The index may lag an owner change; the consistent re-read has the last word.
                entry = entry_of(items[pk]) if pk in items else None
                if entry is not None and entry.state == state and entry.run_id == run_id:
                    yield entry
            start = response.get("LastEvaluatedKey")
            if not start:
                return

    def claim_many(self, run_id: str, claims: Sequence[Claim]) -> ClaimResult:
        """Claim each absent key for ``run_id``; see :class:`ClaimResult` for the answer.

        If a key appears twice in ``claims`` (two copies of one task in a batch) the first
        claim wins and the second reports the key as already this run's. If a claim fails
        with an error, the keys this call won are released (as far as the ledger lets us)
        before the error is raised, so they are not left in doubt.
        """
        for claim in claims:
            check_key(claim.key)
        first: dict[str, Claim] = {}
        for claim in claims:
            first.setdefault(claim.key, claim)
        if not first:
            return ClaimResult(entries={})
        now = self._clock()
        token = uuid.uuid4().hex  # marks this call's puts, to recognise them when retried

        def claim_one(claim: Claim) -> tuple[Entry, bool]:
            return self._claim_one(run_id, claim, now, token)

        results = self._calls.each(claim_one, list(first.values()))
        won = [r[0].key for r in results if not isinstance(r, Exception) and r[1]]
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            with contextlib.suppress(Exception):
                self.release_many(run_id, won)
            raise errors[0]
        entries = {r[0].key: r[0] for r in results if not isinstance(r, Exception)}
        return ClaimResult(entries=entries, won=frozenset(won))

    def _claim_one(self, run_id: str, claim: Claim, now: float, token: str) -> tuple[Entry, bool]:
        mine = claimed_entry(claim, run_id, now)
        item = writes.claim_item(run_id, claim, now=now, token=token, ttl=self._ttl)
        # Every answer needs the entry that holds the key; when the holder releases it
        # between our put and our read, the key is absent again and we try once more.
        for _ in range(CONFLICT_ATTEMPTS):
            try:
                self._calls.put_new(item)
                return mine, True
            except ConditionFailed as refused:
                held = refused.item or self._calls.get_item(key_pk(claim.key))
            if held is not None:
                if optional_string(held, "claim_token") == token:
                    return entry_of(held), True  # our put, retried after a lost answer
                return entry_of(held), False
        raise LedgerError(
            f"key {claim.key} kept being claimed and released by other runs in ledger "
            f"{self.location}; rerun"
        )

    def takeover_many(self, run_id: str, keys_and_old_runs: Sequence[tuple[str, str]]) -> set[str]:
        """For an in-doubt resend: move each key still CLAIMED by its named (dead) old run to
        ``run_id``. Returns the keys taken. A key whose owner changed, moved on from CLAIMED,
        or whose owner's lease has not run out yet is not taken."""
        now = self._clock()
        pairs: dict[str, str] = {}
        for key, old_run in keys_and_old_runs:
            if old_run != run_id:
                pairs.setdefault(key, old_run)

        def take(pair: tuple[str, str]) -> bool:
            key, old_run = pair
            return self._transact(
                writes.takeover_transaction(
                    self.table, key, old_run, run_id, now=now, ttl=self._ttl
                )
            )

        # One at a time: takeovers are rare (in-doubt resends only), and moto's in-process
        # TransactWriteItems is not safe to run concurrently (a rollback restores a snapshot
        # taken before another thread's transaction).
        results = [take(pair) for pair in pairs.items()]
        return {key for key, taken in zip(pairs, results, strict=True) if taken}

    def _transact(self, items: list[dict[str, Any]]) -> bool:
        """One two-item transaction (:mod:`redrive.ledger.dynamodb_writes`): True if it was
        applied, False if a condition did not hold."""
        try:
            # Retried by the AWS client with the same ClientRequestToken: applied at most once.
            self._calls.call("TransactWriteItems", TransactItems=items)
        except ConditionFailed:
            return False
        return True

    def mark_sent_many(self, run_id: str, sent: Mapping[str, str]) -> None:
        """CLAIMED by ``run_id`` -> SENT, recording the MessageId SQS gave the copy."""
        now = self._clock()

        def mark(pair: tuple[str, str]) -> bool:
            key, sent_id = pair
            return self._calls.write_silently(
                "UpdateItem",
                **writes.mark_sent_update(key, run_id, sent_id, now=now, ttl=self._ttl),
            )

        self._calls.each_or_raise(mark, list(sent.items()))

    def release_many(self, run_id: str, keys: Sequence[str]) -> None:
        """The send failed: forget keys still CLAIMED by ``run_id``, so they can be claimed
        again."""

        def release(key: str) -> bool:
            return self._calls.write_silently("DeleteItem", **writes.release_delete(key, run_id))

        self._calls.each_or_raise(release, list(dict.fromkeys(keys)))

    def mark_done_many(self, run_id: str, keys: Sequence[str]) -> None:
        """SENT -> DONE once the DLQ copy is deleted. Any run may do it (a later run deletes
        what an earlier one sent but could not delete); the owner stays the run that sent,
        because that is who the audit must name."""
        now = self._clock()

        def done(key: str) -> bool:
            return self._calls.write_silently(
                "UpdateItem", **writes.mark_done_update(key, now=now, ttl=self._ttl)
            )

        self._calls.each_or_raise(done, list(dict.fromkeys(keys)))

    def mark_skipped_many(self, run_id: str, keys: Sequence[str]) -> set[str]:
        """In-doubt resolved as skip: CLAIMED by another run, whose lease has run out ->
        SKIPPED, owned by ``run_id`` (the run that decided). Returns the keys marked; a key
        whose owner's lease has not run out yet (or that is not another run's claim) is left
        as it is.

        The owner is read first (the lease to check is on its run item); a key whose owner
        changes between that read and the write is left alone, as if the change came first.
        """
        now = self._clock()
        current = self.get_many(keys)
        owners = [
            (key, entry.run_id)
            for key, entry in current.items()
            if entry.state is KeyState.CLAIMED and entry.run_id != run_id
        ]
        # Transactions, one at a time (see takeover_many).
        return {
            key
            for key, owner in owners
            if self._transact(
                writes.skip_transaction(self.table, key, owner, run_id, now=now, ttl=self._ttl)
            )
        }
