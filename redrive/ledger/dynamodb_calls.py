"""The DynamoDB ledger's calls of its table: a conditional write whose condition did not
hold is :class:`ConditionFailed`, a transaction that lost to another is tried again, every
other failure is a one-line LedgerError; the writes of a batch go out side by side in a
pool of threads shared by the ledger's callers."""

from __future__ import annotations

import concurrent.futures
import contextlib
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from redrive.aws.dynamodb import (
    ConditionFailed,
    TransactionConflict,
    client_region,
    operation,
    pool_connections,
    write_errors,
)
from redrive.errors import LedgerError
from redrive.ledger.base import ledger_closed
from redrive.ledger.dynamodb_items import Item

__all__ = ["CONFLICT_ATTEMPTS", "ConditionFailed", "TableCalls"]

_BATCH_GET_MAX = 100  # DynamoDB's limit for one BatchGetItem
# One engine batch is 10 keys, and --workers threads share the ledger: its write pool is as
# wide as the client's connection pool (redrive's clients: 20; boto3's default: 10), so
# that two workers' batches write at once instead of queueing behind one pool of 10. The
# ledger's calls in flight (the pool's and its callers' own) are bounded by that size too:
# one more would open a connection that urllib3 discards after, with a warning on stderr.
_MIN_POOL_SIZE = 10
_MAX_POOL_SIZE = 64
# TransactionConflict: another transaction held the item; the write was not applied.
CONFLICT_ATTEMPTS = 5
_UNPROCESSED_ATTEMPTS = 10

_T = TypeVar("_T")
_R = TypeVar("_R")


def _pool_size_for(client: Any) -> int:
    return max(_MIN_POOL_SIZE, min(_MAX_POOL_SIZE, pool_connections(client)))


class TableCalls:
    """The calls of one ledger table through one AWS client (thread-safe), and the pool of
    threads (``write_threads``, default: as many as the client's connection pool holds)
    that runs a batch's writes side by side, for any number of callers."""

    def __init__(
        self,
        table: str,
        client: Any,
        *,
        location: str,
        close_client: bool = False,
        write_threads: int | None = None,
    ) -> None:
        self.table = table
        self.location = location
        self._client = client
        self._close_client = close_client
        self._region = client_region(client)
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_size = write_threads or _pool_size_for(client)
        # Threads beyond the connections wait here rather than open connections urllib3 drops.
        self._in_flight = threading.BoundedSemaphore(pool_connections(client))
        self._closed = False

    def call(self, action: str, **kwargs: Any) -> dict[str, Any]:
        """One DynamoDB call. A condition that did not hold raises :class:`ConditionFailed`;
        every other failure a one-line LedgerError."""
        if self._closed:
            raise ledger_closed(self.location)
        method = operation(self._client, action)
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            last = attempt == CONFLICT_ATTEMPTS
            try:
                with write_errors(action, self.table, self._region, last_attempt=last):
                    with self._in_flight:
                        response: dict[str, Any] = method(**kwargs)
                    return response
            except TransactionConflict:
                pass
            time.sleep(0.02 * 2**attempt * (0.5 + random.random() / 2))
        raise AssertionError("unreachable")

    def each(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R | Exception]:
        """``fn`` on every item, side by side; an item's exception is its result, so the
        caller learns what the others did before deciding how to fail."""
        if len(items) <= 1:
            return [self._attempt(fn, item) for item in items]
        pool = self._executor()
        futures = [pool.submit(self._attempt, fn, item) for item in items]
        return [f.result() for f in futures]

    def each_or_raise(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        out: list[_R] = []
        for result in self.each(fn, items):
            if isinstance(result, Exception):
                raise result
            out.append(result)
        return out

    def put_new(self, item: Item) -> None:
        """Put an item whose key must not exist yet; a refusal (:class:`ConditionFailed`)
        carries the item that holds the key."""
        self.call(
            "PutItem",
            TableName=self.table,
            Item=item,
            ConditionExpression="attribute_not_exists(pk)",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )

    def write_silently(self, action: str, **kwargs: Any) -> bool:
        """A conditional write whose refusal is no error: True if it was applied."""
        try:
            self.call(action, TableName=self.table, **kwargs)
        except ConditionFailed:
            return False
        return True

    def get_item(self, pk: dict[str, dict[str, str]]) -> Item | None:
        response = self.call("GetItem", TableName=self.table, Key=pk, ConsistentRead=True)
        item: Item | None = response.get("Item")
        return item

    def batch_get(self, pks: Sequence[str]) -> dict[str, Item]:
        unique = list(dict.fromkeys(pks))
        chunks = [unique[i : i + _BATCH_GET_MAX] for i in range(0, len(unique), _BATCH_GET_MAX)]
        found: dict[str, Item] = {}
        for part in self.each_or_raise(self._get_chunk, chunks):
            found.update(part)
        return found

    def query_pks(self, **kwargs: Any) -> list[str]:
        pks: list[str] = []
        start: dict[str, Any] | None = None
        while True:
            extra = {"ExclusiveStartKey": start} if start else {}
            response = self.call("Query", TableName=self.table, **kwargs, **extra)
            pks.extend(item["pk"]["S"] for item in response.get("Items", []))
            start = response.get("LastEvaluatedKey")
            if not start:
                return pks

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        if self._close_client:
            with contextlib.suppress(Exception):
                self._client.close()

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._closed:
                raise ledger_closed(self.location)
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self._pool_size, thread_name_prefix="redrive-ledger"
                )
            return self._pool

    @staticmethod
    def _attempt(fn: Callable[[_T], _R], item: _T) -> _R | Exception:
        try:
            return fn(item)
        except Exception as exc:
            return exc

    def _get_chunk(self, pks: Sequence[str]) -> dict[str, Item]:
        found: dict[str, Item] = {}
        request: dict[str, Any] = {
            self.table: {"Keys": [{"pk": {"S": pk}} for pk in pks], "ConsistentRead": True}
        }
        for attempt in range(1, _UNPROCESSED_ATTEMPTS + 1):
            response = self.call("BatchGetItem", RequestItems=request)
            for item in response.get("Responses", {}).get(self.table, []):
                found[item["pk"]["S"]] = item
            unprocessed = response.get("UnprocessedKeys", {}).get(self.table)
            if not unprocessed or not unprocessed.get("Keys"):
                return found
            request = {self.table: {"Keys": unprocessed["Keys"], "ConsistentRead": True}}
            time.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + random.random() / 2))
        raise LedgerError(
            f"DynamoDB kept throttling reads of the ledger table {self.table}; wait a minute "
            "and rerun, with fewer --workers"
        )
