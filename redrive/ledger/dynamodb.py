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
what it won before raising, so those keys are not left in doubt. Writes botocore retries
after a lost answer are recognised: a claim or start_run by the token it wrote, a
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

import concurrent.futures
import contextlib
import json
import math
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar

import botocore.exceptions

from redrive.aws.errors import ACCESS_CODES, IAM_ACTION, aws_errors, error_code
from redrive.aws.session import AwsSettings
from redrive.errors import AwsError, LedgerError
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
    ledger_closed,
    run_not_open,
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
]

# Longer than SQS's 14-day maximum retention: a key must outlive every copy of its task.
TTL_SECONDS = 30 * 86_400
TTL_ATTRIBUTE = "expires_at"
KEYS_BY_RUN = "keys_by_run"
RUNS_BY_START = "runs_by_start"

_KEY_PREFIX = "key#"
_RUN_PREFIX = "run#"
_RUN_KIND = "run"
_BATCH_GET_MAX = 100  # DynamoDB's limit for one BatchGetItem
# One engine batch is 10 keys, and --workers threads share the ledger: its write pool is as
# wide as the client's connection pool (redrive's clients: 20; boto3's default: 10), so
# that two workers' batches write at once instead of queueing behind one pool of 10. The
# ledger's calls in flight (the pool's and its callers' own) are bounded by that size too:
# one more would open a connection that urllib3 discards after, with a warning on stderr.
_MIN_POOL_SIZE = 10
_MAX_POOL_SIZE = 64
# TransactionConflict: another transaction held the item; the write was not applied.
_CONFLICT_ATTEMPTS = 5
_UNPROCESSED_ATTEMPTS = 10
_TABLE_NAME = re.compile(r"[A-Za-z0-9_.-]{3,255}")
# The owner run of a key has no lease running: gone, ended, or past its promised time.
_OWNER_NOT_LEASED = (
    "attribute_not_exists(pk) OR attribute_exists(#ended_at) OR #lease_until <= :now"
)

_T = TypeVar("_T")
_R = TypeVar("_R")

Item = dict[str, Any]


# --------------------------------------------------------------------------- values


def _s(value: str) -> dict[str, str]:
    return {"S": value}


def _n(value: float) -> dict[str, str]:
    if not math.isfinite(value):
        raise ValueError(f"the ledger stores finite times only, got {value!r}")
    # repr round-trips a float exactly; "f" keeps DynamoDB away from exponent notation.
    return {"N": format(Decimal(repr(float(value))), "f")}


def _num(item: Item, name: str) -> float:
    return float(item[name]["N"])


def _opt_str(item: Item, name: str) -> str | None:
    value = item.get(name)
    return None if value is None else str(value["S"])


def _key_pk(key: str) -> dict[str, dict[str, str]]:
    return {"pk": _s(_KEY_PREFIX + key)}


def _run_pk(run_id: str) -> dict[str, dict[str, str]]:
    return {"pk": _s(_RUN_PREFIX + run_id)}


def _names(*names: str) -> dict[str, str]:
    # Every attribute goes through a placeholder: "state", "key" and others are reserved words.
    return {f"#{name}": name for name in names}


def _entry(item: Item) -> Entry:
    return Entry(
        key=item["key"]["S"],
        state=KeyState(item["state"]["S"]),
        run_id=item["run_id"]["S"],
        task=item["task"]["S"],
        message_id=item["message_id"]["S"],
        target=item["target"]["S"],
        sent_message_id=_opt_str(item, "sent_message_id"),
        updated_at=_num(item, "updated_at"),
        sent_at=_num(item, "sent_at") if "sent_at" in item else None,
    )


def _run_info(item: Item) -> RunInfo:
    ended = item.get("ended_at")
    return RunInfo(
        run_id=item["pk"]["S"].removeprefix(_RUN_PREFIX),
        command=item["command"]["S"],
        started_at=_num(item, "started_at"),
        heartbeat_at=_num(item, "heartbeat_at"),
        lease_until=_num(item, "lease_until"),
        ended_at=None if ended is None else float(ended["N"]),
        outcome=_opt_str(item, "outcome"),
        info=json.loads(item["info"]["S"]),
        counts=json.loads(item["counts"]["S"]),
    )


def _snake(action: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", action).lower()


def check_table_name(name: str, uri: str | None = None) -> str:
    """``name`` if DynamoDB accepts it as a table name, else a LedgerError."""
    if not name:
        raise LedgerError(f"ledger URI {uri or name!r} names no table; use dynamodb://TABLE")
    if not _TABLE_NAME.fullmatch(name):
        source = f" (in {uri!r})" if uri else ""
        raise LedgerError(
            f"{name!r}{source} is not a DynamoDB table name: 3 to 255 letters, digits, "
            "'_', '-' or '.'"
        )
    return name


def _translate(exc: Exception, action: str, table: str, region: str | None) -> LedgerError:
    """One line that says what to do, for any botocore failure of a ledger call."""
    if isinstance(exc, botocore.exceptions.ClientError):
        code = error_code(exc)
        if code == "ResourceNotFoundException":
            where = f" in region {region}" if region else ""
            return LedgerError(
                f"the DynamoDB ledger table {table} does not exist{where}: create it with "
                f"`redrive ledger init dynamodb://{table}` (or check --region / AWS_REGION)"
            )
        if code in ACCESS_CODES:
            iam = IAM_ACTION.get(action, action)
            return LedgerError(
                f"access denied: the caller may not dynamodb:{iam} on the ledger table "
                f"{table}; grant that IAM action or use another --profile"
            )
    try:
        with aws_errors(action, resource=f"ledger table {table}", service="dynamodb"):
            raise exc
    except AwsError as err:
        return LedgerError(str(err))
    except Exception:  # not a botocore error: say what it was, on one line
        pass
    return LedgerError(f"{action} on ledger table {table} failed: {' '.join(str(exc).split())}")


class _Refused(Exception):
    """A conditional write whose condition did not hold (nothing was written).

    ``item`` is the item as it stood, when DynamoDB returned it (ALL_OLD on a single write).
    """

    def __init__(self, item: Item | None) -> None:
        super().__init__("the condition did not hold")
        self.item = item


# --------------------------------------------------------------------------- the table


def _create_request(table: str) -> dict[str, Any]:
    return {
        "TableName": table,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": [
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "run_id", "AttributeType": "S"},
            {"AttributeName": "kind", "AttributeType": "S"},
            {"AttributeName": "started_at", "AttributeType": "N"},
        ],
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "GlobalSecondaryIndexes": [
            {
                "IndexName": KEYS_BY_RUN,
                "KeySchema": [{"AttributeName": "run_id", "KeyType": "HASH"}],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
            {
                "IndexName": RUNS_BY_START,
                "KeySchema": [
                    {"AttributeName": "kind", "KeyType": "HASH"},
                    {"AttributeName": "started_at", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            },
        ],
    }


def _key_schema(schema: Iterable[Mapping[str, str]]) -> list[tuple[str, str]]:
    return [(s["AttributeName"], s["KeyType"]) for s in schema]


def _schema_problems(description: Mapping[str, Any]) -> list[str]:
    """What keeps an existing table from being a redrive ledger (empty: nothing)."""
    expected = _create_request("")
    problems: list[str] = []
    if _key_schema(description.get("KeySchema", [])) != _key_schema(expected["KeySchema"]):
        problems.append("its key is not a single string partition key named pk")
    types = {a["AttributeName"]: a["AttributeType"] for a in description["AttributeDefinitions"]}
    if types.get("pk") not in (None, "S"):
        problems.append("pk is not a string")
    have = {
        index["IndexName"]: _key_schema(index["KeySchema"])
        for index in description.get("GlobalSecondaryIndexes", [])
    }
    for index in expected["GlobalSecondaryIndexes"]:
        if have.get(index["IndexName"]) != _key_schema(index["KeySchema"]):
            keys = ", ".join(s["AttributeName"] for s in index["KeySchema"])
            problems.append(f"it lacks the global secondary index {index['IndexName']} ({keys})")
    return problems


def init_table(client: Any, table: str) -> str:
    """Create the ledger table (on-demand billing, the two indexes, TTL on ``expires_at``)
    and wait until it is usable; return one line saying what was done.

    Idempotent: an existing table with the ledger's schema is fine (TTL is switched on if it
    is not); a table with another schema is a LedgerError.
    """
    check_table_name(table)
    region = getattr(getattr(client, "meta", None), "region_name", None)
    call = _translated_calls(client, table, region)
    created = _create_table(client, table, region)
    _wait_until_active(client, table, region, call)
    problems = _schema_problems(call("DescribeTable", TableName=table)["Table"])
    if problems:
        raise LedgerError(
            f"the DynamoDB table {table} exists but is not a redrive ledger "
            f"({'; '.join(problems)}); choose another table name"
        )
    ttl = call("DescribeTimeToLive", TableName=table).get("TimeToLiveDescription", {})
    if ttl_needs_switching_on(table, ttl):
        call(
            "UpdateTimeToLive",
            TableName=table,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
        )
    days = TTL_SECONDS // 86_400
    if created:
        return (
            f"created the DynamoDB ledger table {table} (on-demand billing; an entry expires "
            f"{days} days after its last change)"
        )
    return f"the DynamoDB ledger table {table} is ready (entries expire {days} days after use)"


def _translated_calls(client: Any, table: str, region: str | None) -> Callable[..., Any]:
    """Calls of the client by API action name, their errors translated."""

    def call(action: str, **kwargs: Any) -> Any:
        try:
            return getattr(client, _snake(action))(**kwargs)
        except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
            raise _translate(exc, action, table, region) from exc

    return call


def _create_table(client: Any, table: str, region: str | None) -> bool:
    """Create the table; False when it exists already (or is being made)."""
    try:
        client.create_table(**_create_request(table))
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) != "ResourceInUseException":
            raise _translate(exc, "CreateTable", table, region) from exc
        return False
    except botocore.exceptions.BotoCoreError as exc:
        raise _translate(exc, "CreateTable", table, region) from exc
    return True


def _wait_until_active(
    client: Any, table: str, region: str | None, call: Callable[..., Any]
) -> None:
    try:
        client.get_waiter("table_exists").wait(
            TableName=table, WaiterConfig={"Delay": 2, "MaxAttempts": 150}
        )
    except botocore.exceptions.WaiterError as exc:
        cause = getattr(exc, "last_response", {}) or {}
        if "Error" in cause:
            call("DescribeTable", TableName=table)  # raises the real error, translated
        raise LedgerError(
            f"the DynamoDB table {table} did not become ACTIVE within 5 minutes; "
            "check it in the console, then run `redrive ledger init` again"
        ) from exc
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as exc:
        raise _translate(exc, "DescribeTable", table, region) from exc


def ttl_needs_switching_on(table: str, ttl: Mapping[str, Any]) -> bool:
    """Whether a ledger table whose TTL is described by ``ttl`` (DescribeTimeToLive's
    TimeToLiveDescription) needs TTL switched on; a LedgerError when it expires items by
    another attribute (not ours) or TTL is being switched off."""
    status, attribute = ttl.get("TimeToLiveStatus", "DISABLED"), ttl.get("AttributeName")
    if status in ("ENABLED", "ENABLING") and attribute not in (None, TTL_ATTRIBUTE):
        raise LedgerError(
            f"the DynamoDB table {table} expires items by {attribute!r}, not by "
            f"{TTL_ATTRIBUTE!r}; choose another table name for the ledger"
        )
    if status == "DISABLING":
        raise LedgerError(
            f"TTL of the DynamoDB table {table} is being switched off; wait an hour, then "
            "run `redrive ledger init` again"
        )
    return bool(status == "DISABLED")


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


# --------------------------------------------------------------------------- the ledger


def _connections(client: Any) -> int:
    """The size of the client's HTTP connection pool (botocore's default when unknown)."""
    config = getattr(getattr(client, "meta", None), "config", None)
    connections = getattr(config, "max_pool_connections", None)
    return connections if isinstance(connections, int) and connections > 0 else 10


def _pool_size_for(client: Any) -> int:
    return max(_MIN_POOL_SIZE, min(_MAX_POOL_SIZE, _connections(client)))


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
        self._client = client
        self._clock = clock
        self._ttl = ttl
        self._close_client = close_client
        self._region: str | None = getattr(getattr(client, "meta", None), "region_name", None)
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pool_size = write_threads or _pool_size_for(client)
        # Threads beyond the connections wait here rather than open connections urllib3 drops.
        self._in_flight = threading.BoundedSemaphore(_connections(client))
        self._closed = False
        self._verify_table()

    def _verify_table(self) -> None:
        table = self._call("DescribeTable", TableName=self.table)["Table"]
        status = table.get("TableStatus", "ACTIVE")
        if status in ("CREATING", "DELETING", "ARCHIVING", "ARCHIVED"):
            raise LedgerError(
                f"the DynamoDB ledger table {self.table} is {status.lower()}; wait for it "
                f"(`redrive ledger init dynamodb://{self.table}` waits until it is ready)"
            )
        problems = _schema_problems(table)
        if problems:
            raise LedgerError(
                f"the DynamoDB table {self.table} is not a redrive ledger "
                f"({'; '.join(problems)}); create one with `redrive ledger init "
                "dynamodb://NEW-TABLE`"
            )

    # ----------------------------------------------------------------- plumbing

    def _call(self, action: str, **kwargs: Any) -> dict[str, Any]:
        """One DynamoDB call. A condition that did not hold raises :class:`_Refused`; every
        other failure a one-line LedgerError."""
        if self._closed:
            raise ledger_closed(self.location)
        method = getattr(self._client, _snake(action))
        for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
            try:
                with self._in_flight:
                    response: dict[str, Any] = method(**kwargs)
                return response
            except botocore.exceptions.ClientError as exc:
                code = error_code(exc)
                if code == "ConditionalCheckFailedException":
                    old: Item | None = exc.response.get("Item")  # type: ignore[assignment]
                    raise _Refused(old) from None
                conflict = code == "TransactionConflictException"
                if code == "TransactionCanceledException":
                    reasons = {
                        str(r.get("Code") or "None")
                        for r in exc.response.get("CancellationReasons", [])
                    }
                    if "ConditionalCheckFailed" in reasons:
                        raise _Refused(None) from None
                    conflict = reasons <= {"None", "TransactionConflict"}
                    if conflict and attempt == _CONFLICT_ATTEMPTS:
                        # Lost to concurrent writers on the same items every time: the same
                        # answer as a refused condition (the caller reads back if it cares).
                        raise _Refused(None) from None
                if not conflict or attempt == _CONFLICT_ATTEMPTS:
                    raise _translate(exc, action, self.table, self._region) from exc
            except botocore.exceptions.BotoCoreError as exc:
                raise _translate(exc, action, self.table, self._region) from exc
            time.sleep(0.02 * 2**attempt * (0.5 + random.random() / 2))
        raise AssertionError("unreachable")

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._closed:
                raise ledger_closed(self.location)
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self._pool_size, thread_name_prefix="redrive-ledger"
                )
            return self._pool

    def _each(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R | Exception]:
        """``fn`` on every item, side by side; an item's exception is its result, so the
        caller learns what the others did before deciding how to fail."""
        if len(items) <= 1:
            return [self._attempt(fn, item) for item in items]
        pool = self._executor()
        futures = [pool.submit(self._attempt, fn, item) for item in items]
        return [f.result() for f in futures]

    @staticmethod
    def _attempt(fn: Callable[[_T], _R], item: _T) -> _R | Exception:
        try:
            return fn(item)
        except Exception as exc:
            return exc

    def _each_or_raise(self, fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
        out: list[_R] = []
        for result in self._each(fn, items):
            if isinstance(result, Exception):
                raise result
            out.append(result)
        return out

    def _expiry(self, now: float) -> dict[str, str]:
        # TTL wants whole epoch seconds.
        return {"N": str(int(now + self._ttl))}

    def _put_new(self, item: Item) -> None:
        """Put an item whose key must not exist yet; a refusal (:class:`_Refused`) carries
        the item that holds the key."""
        self._call(
            "PutItem",
            TableName=self.table,
            Item=item,
            ConditionExpression="attribute_not_exists(pk)",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )

    def _write_silently(self, action: str, **kwargs: Any) -> bool:
        """A conditional write whose refusal is no error: True if it was applied."""
        try:
            self._call(action, TableName=self.table, **kwargs)
        except _Refused:
            return False
        return True

    def _get_chunk(self, pks: Sequence[str]) -> dict[str, Item]:
        found: dict[str, Item] = {}
        request: dict[str, Any] = {
            self.table: {"Keys": [{"pk": _s(pk)} for pk in pks], "ConsistentRead": True}
        }
        for attempt in range(1, _UNPROCESSED_ATTEMPTS + 1):
            response = self._call("BatchGetItem", RequestItems=request)
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

    def _batch_get(self, pks: Sequence[str]) -> dict[str, Item]:
        unique = list(dict.fromkeys(pks))
        chunks = [unique[i : i + _BATCH_GET_MAX] for i in range(0, len(unique), _BATCH_GET_MAX)]
        found: dict[str, Item] = {}
        for part in self._each_or_raise(self._get_chunk, chunks):
            found.update(part)
        return found

    def _query_pks(self, **kwargs: Any) -> list[str]:
        pks: list[str] = []
        start: dict[str, Any] | None = None
        while True:
            extra = {"ExclusiveStartKey": start} if start else {}
            response = self._call("Query", TableName=self.table, **kwargs, **extra)
            pks.extend(item["pk"]["S"] for item in response.get("Items", []))
            start = response.get("LastEvaluatedKey")
            if not start:
                return pks

    def _get_item(self, pk: dict[str, dict[str, str]]) -> Item | None:
        response = self._call("GetItem", TableName=self.table, Key=pk, ConsistentRead=True)
        item: Item | None = response.get("Item")
        return item

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

    def __repr__(self) -> str:
        return f"DynamoDbLedger({self.location!r})"

    # ----------------------------------------------------------------- runs

    def start_run(self, run_id: str, *, command: str, info: Mapping[str, Any]) -> None:
        now = self._clock()
        token = uuid.uuid4().hex
        item = {
            **_run_pk(run_id),
            "kind": _s(_RUN_KIND),
            "command": _s(command),
            "started_at": _n(now),
            "heartbeat_at": _n(now),
            "lease_until": _n(now),
            # default=str: info is descriptive; a Path or datetime in it must not crash a run.
            "info": _s(json.dumps(dict(info), sort_keys=True, default=str)),
            "counts": _s("{}"),
            "start_token": _s(token),
            TTL_ATTRIBUTE: self._expiry(now),
        }
        try:
            self._put_new(item)
        except _Refused as refused:
            # Our own put, retried by botocore after its answer was lost, finds itself.
            if refused.item is not None and _opt_str(refused.item, "start_token") == token:
                return
            raise LedgerError(
                f"run {run_id} already exists in ledger {self.location}; "
                "start the run again with a new run id"
            ) from None

    def heartbeat(self, run_id: str, *, lease_until: float) -> None:
        now = self._clock()
        applied = self._write_silently(
            "UpdateItem",
            Key=_run_pk(run_id),
            UpdateExpression=(
                "SET #heartbeat_at = :now, #lease_until = :lease, #expires_at = :exp"
            ),
            ConditionExpression="attribute_exists(pk) AND attribute_not_exists(#ended_at)",
            ExpressionAttributeNames=_names(
                "heartbeat_at", "lease_until", TTL_ATTRIBUTE, "ended_at"
            ),
            ExpressionAttributeValues={
                ":now": _n(now),
                ":lease": _n(lease_until),
                ":exp": self._expiry(now),
            },
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
        expression = (
            "SET #ended_at = :now, #outcome = :outcome, #counts = :counts, #expires_at = :exp"
        )
        names = _names("ended_at", "outcome", "counts", TTL_ATTRIBUTE)
        values = {
            ":now": _n(now),
            ":outcome": _s(outcome),
            ":counts": _s(json.dumps(dict(counts), sort_keys=True)),
            ":exp": self._expiry(now),
        }
        item = self._get_item(_run_pk(run_id)) if info else None
        if item is not None and info:
            # Only the run itself writes its info, so reading it first races with no one.
            merged = {**json.loads(item["info"]["S"]), **info}
            expression += ", #info = :info"
            names.update(_names("info"))
            values[":info"] = _s(json.dumps(merged, sort_keys=True, default=str))
        applied = self._write_silently(
            "UpdateItem",
            Key=_run_pk(run_id),
            UpdateExpression=expression,
            ConditionExpression="attribute_exists(pk) AND attribute_not_exists(#ended_at)",
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )
        if not applied and self._get_item(_run_pk(run_id)) is None:
            raise LedgerError(
                f"run {run_id} is not in ledger {self.location}; "
                "it was never started there (check the ledger URI)"
            )

    def run(self, run_id: str) -> RunInfo | None:
        item = self._get_item(_run_pk(run_id))
        return None if item is None else _run_info(item)

    def runs(self, since: float | None = None) -> list[RunInfo]:
        """Runs started at or after ``since`` (all when None), oldest first."""
        if since is not None and not math.isfinite(since):
            if since > 0 or math.isnan(since):
                return []
            since = None
        # DynamoDB refuses placeholders an expression does not use.
        condition = "#kind = :run"
        names = _names("kind")
        values: dict[str, Any] = {":run": _s(_RUN_KIND)}
        if since is not None:
            condition += " AND #started_at >= :since"
            names.update(_names("started_at"))
            values[":since"] = _n(since)
        pks = self._query_pks(
            IndexName=RUNS_BY_START,
            KeyConditionExpression=condition,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
        )
        items = self._batch_get(pks)
        infos = [_run_info(items[pk]) for pk in pks if pk in items]
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
        items = self._batch_get([_KEY_PREFIX + k for k in unique])
        return {k: _entry(items[_KEY_PREFIX + k]) for k in unique if _KEY_PREFIX + k in items}

    def keys_for_run(self, run_id: str) -> list[Entry]:
        """Entries whose owner is ``run_id``, in the order they were last changed."""
        pks = self._query_pks(
            IndexName=KEYS_BY_RUN,
            KeyConditionExpression="#run_id = :run",
            ExpressionAttributeNames=_names("run_id"),
            ExpressionAttributeValues={":run": _s(run_id)},
        )
        items = self._batch_get(pks)
        # The index may lag an owner change; the consistent re-read has the last word.
        entries = [_entry(items[pk]) for pk in pks if pk in items]
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
            response = self._call(
                "Scan",
                TableName=self.table,
                Limit=size,
                ConsistentRead=True,
                FilterExpression="begins_with(#pk, :prefix) AND #state = :state",
                ExpressionAttributeNames=_names("pk", "state"),
                ExpressionAttributeValues={":prefix": _s(_KEY_PREFIX), ":state": _s(state)},
                **extra,
            )
            for item in response.get("Items", []):
                yield _entry(item)
            start = response.get("LastEvaluatedKey")
            if not start:
                return

    def _run_keys(self, state: KeyState, run_id: str, size: int) -> Iterator[Entry]:
        start: dict[str, Any] | None = None
        while True:
            extra = {"ExclusiveStartKey": start} if start else {}
            response = self._call(
                "Query",
                TableName=self.table,
                IndexName=KEYS_BY_RUN,
                KeyConditionExpression="#run_id = :run",
                ExpressionAttributeNames=_names("run_id"),
                ExpressionAttributeValues={":run": _s(run_id)},
                Limit=size,
                **extra,
            )
            pks = [item["pk"]["S"] for item in response.get("Items", [])]
            items = self._batch_get(pks)
            for pk in pks:
                # The index may lag an owner change; the consistent re-read has the last word.
                entry = _entry(items[pk]) if pk in items else None
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

        results = self._each(claim_one, list(first.values()))
        won = [r[0].key for r in results if not isinstance(r, Exception) and r[1]]
        errors = [r for r in results if isinstance(r, Exception)]
        if errors:
            with contextlib.suppress(Exception):
                self.release_many(run_id, won)
            raise errors[0]
        entries = {r[0].key: r[0] for r in results if not isinstance(r, Exception)}
        return ClaimResult(entries=entries, won=frozenset(won))

    def _claim_one(self, run_id: str, claim: Claim, now: float, token: str) -> tuple[Entry, bool]:
        mine = Entry(
            key=claim.key,
            state=KeyState.CLAIMED,
            run_id=run_id,
            task=claim.task,
            message_id=claim.message_id,
            target=claim.target,
            sent_message_id=None,
            updated_at=now,
        )
        item = {
            **_key_pk(claim.key),
            "key": _s(claim.key),
            "state": _s(KeyState.CLAIMED.value),
            "run_id": _s(run_id),
            "task": _s(claim.task),
            "message_id": _s(claim.message_id),
            "target": _s(claim.target),
            "updated_at": _n(now),
            "claim_token": _s(token),
            TTL_ATTRIBUTE: self._expiry(now),
        }
        # Every answer needs the entry that holds the key; when the holder releases it
        # between our put and our read, the key is absent again and we try once more.
        for _ in range(_CONFLICT_ATTEMPTS):
            try:
                self._put_new(item)
                return mine, True
            except _Refused as refused:
                held = refused.item or self._get_item(_key_pk(claim.key))
            if held is not None:
                if _opt_str(held, "claim_token") == token:
                    return _entry(held), True  # our put, retried after a lost answer
                return _entry(held), False
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
            return self._transition_from_dead_owner(
                key,
                old_run,
                now,
                update="SET #run_id = :run, #updated_at = :now, #expires_at = :exp",
                names=("run_id", "updated_at", TTL_ATTRIBUTE),
                values={":run": _s(run_id)},
            )

        # One at a time: takeovers are rare (in-doubt resends only), and moto's in-process
        # TransactWriteItems is not safe to run concurrently (a rollback restores a snapshot
        # taken before another thread's transaction).
        results = [take(pair) for pair in pairs.items()]
        return {key for key, taken in zip(pairs, results, strict=True) if taken}

    def _transition_from_dead_owner(
        self,
        key: str,
        owner: str,
        now: float,
        *,
        update: str,
        names: Sequence[str],
        values: Mapping[str, Any],
    ) -> bool:
        """Apply ``update`` to a key CLAIMED by ``owner`` if and only if ``owner``'s lease
        has run out, atomically: the ConditionCheck fails if the owner heartbeats first."""
        try:
            # Retried by botocore with the same ClientRequestToken: applied at most once.
            self._call(
                "TransactWriteItems",
                TransactItems=[
                    {
                        "ConditionCheck": {
                            "TableName": self.table,
                            "Key": _run_pk(owner),
                            "ConditionExpression": _OWNER_NOT_LEASED,
                            "ExpressionAttributeNames": _names("ended_at", "lease_until"),
                            "ExpressionAttributeValues": {":now": _n(now)},
                        }
                    },
                    {
                        "Update": {
                            "TableName": self.table,
                            "Key": _key_pk(key),
                            "UpdateExpression": update,
                            "ConditionExpression": "#state = :claimed AND #run_id = :old",
                            "ExpressionAttributeNames": _names("state", "run_id", *names),
                            "ExpressionAttributeValues": {
                                ":claimed": _s(KeyState.CLAIMED.value),
                                ":old": _s(owner),
                                ":now": _n(now),
                                ":exp": self._expiry(now),
                                **values,
                            },
                        }
                    },
                ],
            )
        except _Refused:
            return False
        return True

    def mark_sent_many(self, run_id: str, sent: Mapping[str, str]) -> None:
        """CLAIMED by ``run_id`` -> SENT, recording the MessageId SQS gave the copy."""
        now = self._clock()

        def mark(pair: tuple[str, str]) -> bool:
            key, sent_id = pair
            return self._write_silently(
                "UpdateItem",
                Key=_key_pk(key),
                UpdateExpression=(
                    "SET #state = :sent, #sent_message_id = :sid, #updated_at = :now, "
                    "#sent_at = :now, #expires_at = :exp"
                ),
                ConditionExpression="#state = :claimed AND #run_id = :run",
                ExpressionAttributeNames=_names(
                    "state", "sent_message_id", "updated_at", "sent_at", TTL_ATTRIBUTE, "run_id"
                ),
                ExpressionAttributeValues={
                    ":sent": _s(KeyState.SENT.value),
                    ":sid": _s(sent_id),
                    ":now": _n(now),
                    ":exp": self._expiry(now),
                    ":claimed": _s(KeyState.CLAIMED.value),
                    ":run": _s(run_id),
                },
            )

        self._each_or_raise(mark, list(sent.items()))

    def release_many(self, run_id: str, keys: Sequence[str]) -> None:
        """The send failed: forget keys still CLAIMED by ``run_id``, so they can be claimed
        again."""

        def release(key: str) -> bool:
            return self._write_silently(
                "DeleteItem",
                Key=_key_pk(key),
                ConditionExpression="#state = :claimed AND #run_id = :run",
                ExpressionAttributeNames=_names("state", "run_id"),
                ExpressionAttributeValues={
                    ":claimed": _s(KeyState.CLAIMED.value),
                    ":run": _s(run_id),
                },
            )

        self._each_or_raise(release, list(dict.fromkeys(keys)))

    def mark_done_many(self, run_id: str, keys: Sequence[str]) -> None:
        """SENT -> DONE once the DLQ copy is deleted. Any run may do it (a later run deletes
        what an earlier one sent but could not delete); the owner stays the run that sent,
        because that is who the audit must name."""
        now = self._clock()

        def done(key: str) -> bool:
            return self._write_silently(
                "UpdateItem",
                Key=_key_pk(key),
                UpdateExpression="SET #state = :done, #updated_at = :now, #expires_at = :exp",
                ConditionExpression="#state = :sent",
                ExpressionAttributeNames=_names("state", "updated_at", TTL_ATTRIBUTE),
                ExpressionAttributeValues={
                    ":done": _s(KeyState.DONE.value),
                    ":sent": _s(KeyState.SENT.value),
                    ":now": _n(now),
                    ":exp": self._expiry(now),
                },
            )

        self._each_or_raise(done, list(dict.fromkeys(keys)))

    def mark_skipped_many(self, run_id: str, keys: Sequence[str]) -> None:
        """In-doubt resolved as skip: CLAIMED by another run, whose lease has run out ->
        SKIPPED, owned by ``run_id`` (the run that decided).

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

        def skip(pair: tuple[str, str]) -> bool:
            key, owner = pair
            return self._transition_from_dead_owner(
                key,
                owner,
                now,
                update=(
                    "SET #state = :skipped, #run_id = :run, #updated_at = :now, #expires_at = :exp"
                ),
                names=("updated_at", TTL_ATTRIBUTE),
                values={":skipped": _s(KeyState.SKIPPED.value), ":run": _s(run_id)},
            )

        for owner in owners:  # transactions, one at a time (see takeover_many)
            skip(owner)
