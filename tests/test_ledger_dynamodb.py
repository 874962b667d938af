"""The DynamoDB ledger.

What is DynamoDB's own: the table, TTL, errors, retried writes, two processes sharing one
table on a moto server, and moves (the contract both backends keep is test_ledger_contract.py).

DynamoDB is moto's: in-process ``mock_aws``, or a moto server on 127.0.0.1 serving one
request at a time where separate processes share a table (so a double could only be ours).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config
from conftest import REGION, Cli, Family, MotoServer, start_moto_server
from moto import mock_aws
from test_ledger_contract import Clock, claims, one_line, state

from redrive.broker.sqs import SqsBroker
from redrive.broker.sqs.queues import resolve_family
from redrive.config import built_in_layout
from redrive.errors import LedgerError
from redrive.ledger import Claim, KeyState, open_ledger
from redrive.ledger.dynamodb import (
    KEYS_BY_RUN,
    RUNS_BY_START,
    TTL_ATTRIBUTE,
    TTL_SECONDS,
    DynamoDbLedger,
    init_table,
    ttl_needs_switching_on,
)
from redrive.messages import decode
from redrive.operations.move import MoveEngine, MoveOptions
from redrive.sandbox.encoder import encode

REPO_ROOT = Path(__file__).resolve().parents[1]
TABLE = "redrive-ledger"
TASK = "apps.payments.tasks.refund"


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture
def dynamodb(aws_env: None) -> Iterator[Any]:
    """A DynamoDB client on in-process moto, with the ledger table created."""
    with mock_aws():
        client = boto3.client("dynamodb", region_name=REGION)
        init_table(client, TABLE)
        yield client


# ----------------------------------------------------------------------------- the table


def test_init_table_creates_an_on_demand_table_with_ttl_and_is_idempotent(
    aws_env: None,
) -> None:
    with mock_aws():
        client = boto3.client("dynamodb", region_name=REGION)
        assert init_table(client, TABLE).startswith(f"created the DynamoDB ledger table {TABLE}")
        table = client.describe_table(TableName=TABLE)["Table"]
        assert table["TableStatus"] == "ACTIVE"
        assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
        assert table["KeySchema"] == [{"AttributeName": "pk", "KeyType": "HASH"}]
        assert {i["IndexName"] for i in table["GlobalSecondaryIndexes"]} == {
            KEYS_BY_RUN,
            RUNS_BY_START,
        }
        ttl = client.describe_time_to_live(TableName=TABLE)["TimeToLiveDescription"]
        assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", TTL_ATTRIBUTE)

        again = init_table(client, TABLE)
        assert again.startswith(f"the DynamoDB ledger table {TABLE} is ready")

        # An existing ledger table whose TTL was never switched on gets it.
        client.create_table(
            TableName="no-ttl", BillingMode="PAY_PER_REQUEST", **_schema_of(client, TABLE)
        )
        assert "is ready" in init_table(client, "no-ttl")
        ttl = client.describe_time_to_live(TableName="no-ttl")["TimeToLiveDescription"]
        assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", TTL_ATTRIBUTE)


@pytest.mark.parametrize(
    ("ttl", "needed"),
    [
        ({}, True),
        ({"TimeToLiveStatus": "DISABLED"}, True),
        ({"TimeToLiveStatus": "ENABLED", "AttributeName": TTL_ATTRIBUTE}, False),
        ({"TimeToLiveStatus": "ENABLING", "AttributeName": TTL_ATTRIBUTE}, False),
        ({"TimeToLiveStatus": "ENABLING"}, False),
    ],
)
def test_whether_ttl_needs_switching_on(ttl: dict[str, str], needed: bool) -> None:
    assert ttl_needs_switching_on(TABLE, ttl) is needed


def test_ttl_by_another_attribute_or_being_switched_off_is_refused() -> None:
    with pytest.raises(LedgerError, match="expires items by 'gone_at'") as e:
        ttl_needs_switching_on(TABLE, {"TimeToLiveStatus": "ENABLING", "AttributeName": "gone_at"})
    one_line(e)
    with pytest.raises(LedgerError, match="is being switched off; wait an hour") as e:
        ttl_needs_switching_on(TABLE, {"TimeToLiveStatus": "DISABLING"})
    one_line(e)


def _schema_of(client: Any, table: str) -> dict[str, Any]:
    desc = client.describe_table(TableName=table)["Table"]
    return {
        "AttributeDefinitions": desc["AttributeDefinitions"],
        "KeySchema": desc["KeySchema"],
        "GlobalSecondaryIndexes": [
            {k: i[k] for k in ("IndexName", "KeySchema", "Projection")}
            for i in desc["GlobalSecondaryIndexes"]
        ],
    }


def test_a_foreign_table_is_refused(dynamodb: Any) -> None:
    dynamodb.create_table(
        TableName="orders",
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
    )
    with pytest.raises(LedgerError, match="exists but is not a redrive ledger") as e:
        init_table(dynamodb, "orders")
    assert "single string partition key named pk" in one_line(e)
    with pytest.raises(LedgerError, match="not a redrive ledger") as e:
        DynamoDbLedger("orders", dynamodb)
    assert "redrive ledger init dynamodb://NEW-TABLE" in one_line(e)

    # The right key, but no indexes: listing runs could not work.
    dynamodb.create_table(
        TableName="bare",
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
    )
    with pytest.raises(LedgerError, match=f"lacks the global secondary index {KEYS_BY_RUN}"):
        DynamoDbLedger("bare", dynamodb)

    # A ledger-shaped table that expires items by another attribute belongs to someone else.
    dynamodb.create_table(
        TableName="other-ttl", BillingMode="PAY_PER_REQUEST", **_schema_of(dynamodb, TABLE)
    )
    dynamodb.update_time_to_live(
        TableName="other-ttl",
        TimeToLiveSpecification={"Enabled": True, "AttributeName": "gone_at"},
    )
    with pytest.raises(LedgerError, match="expires items by 'gone_at'") as e:
        init_table(dynamodb, "other-ttl")
    one_line(e)


def test_every_write_sets_the_ttl_30_days_ahead(dynamodb: Any) -> None:
    clock = Clock(1_800_000_000.5)
    led = DynamoDbLedger(TABLE, dynamodb, clock=clock)

    def expires(pk: str) -> int:
        item = dynamodb.get_item(TableName=TABLE, Key={"pk": {"S": pk}})["Item"]
        return int(item[TTL_ATTRIBUTE]["N"])

    assert TTL_SECONDS > 14 * 86_400  # longer than any DLQ keeps a message
    led.start_run("A", command="move", info={})
    led.claim_many("A", claims("k"))
    assert expires("run#A") == expires("key#k") == int(clock.now + TTL_SECONDS)

    for step in (
        lambda: led.heartbeat("A", lease_until=clock.now + 30),
        lambda: led.mark_sent_many("A", {"k": "sqs-1"}),
        lambda: led.mark_done_many("A", ["k"]),
        lambda: led.end_run("A", outcome="completed", counts={}),
    ):
        clock.now += 3600
        step()
        assert max(expires("run#A"), expires("key#k")) == int(clock.now + TTL_SECONDS)
    assert expires("key#k") == int(clock.now - 3600 + TTL_SECONDS)  # end_run: the run only


def test_times_and_texts_round_trip_exactly(dynamodb: Any) -> None:
    clock = Clock(1_786_543_210.123_456_7)
    led = DynamoDbLedger(TABLE, dynamodb, clock=clock)
    led.start_run("A", command="redrive move checkout --task 'x*'", info={"n": [1, "ü"]})
    led.heartbeat("A", lease_until=1e12 + 0.1)
    odd = "K#ey with spaces, ünïcode & a # sign"
    led.claim_many("A", [Claim(odd, "t", "", "https://q/x")])
    entry = led.get_many([odd])[odd]
    assert (entry.updated_at, entry.message_id, entry.target) == (clock.now, "", "https://q/x")
    run = led.run("A")
    assert run is not None
    assert (run.started_at, run.lease_until, run.info) == (clock.now, 1e12 + 0.1, {"n": [1, "ü"]})
    assert [e.key for e in led.keys_for_run("A")] == [odd]


def test_a_key_an_earlier_redrive_wrote_reads_without_a_send_time(dynamodb: Any) -> None:
    # Items of a redrive that did not record sent_at (nor named the publish in its keys).
    dynamodb.put_item(
        TableName=TABLE,
        Item={
            "pk": {"S": "key#celery:t-1:r0:g0:0a1b2c3d"},
            "key": {"S": "celery:t-1:r0:g0:0a1b2c3d"},
            "state": {"S": "done"},
            "run_id": {"S": "old-run"},
            "task": {"S": TASK},
            "message_id": {"S": "m-1"},
            "target": {"S": "https://q/x"},
            "sent_message_id": {"S": "s-1"},
            "updated_at": {"N": "1000.5"},
            TTL_ATTRIBUTE: {"N": "9999999999"},
        },
    )
    with DynamoDbLedger(TABLE, dynamodb) as led:
        assert led.legacy_keys  # a table does not say which redrive wrote its keys
        entry = led.get_many(["celery:t-1:r0:g0:0a1b2c3d"])["celery:t-1:r0:g0:0a1b2c3d"]
        assert (entry.state, entry.sent_message_id, entry.updated_at, entry.sent_at) == (
            KeyState.DONE,
            "s-1",
            1000.5,
            None,
        )


# ----------------------------------------------------------------------------- opening, errors


def test_open_ledger_dynamodb_uri(dynamodb: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    with closing(open_ledger(f"dynamodb://{TABLE}")) as led:
        assert isinstance(led, DynamoDbLedger)
        assert led.location == f"dynamodb://{TABLE}"
        led.start_run("A", command="move", info={})

    asked: list[str] = []

    def factory(service: str) -> Any:
        asked.append(service)
        return boto3.client(service, region_name=REGION)

    monkeypatch.setenv("REDRIVE_LEDGER", f"DynamoDB://{TABLE}")
    with closing(open_ledger(None, client_factory=factory)) as led:
        assert led.run("A") is not None  # the same table
    assert asked == ["dynamodb"]


@pytest.mark.parametrize(
    ("uri", "match"),
    [
        ("dynamodb://", "names no table"),
        ("dynamodb://a/b", "'a/b' .* is not a DynamoDB table name"),
        ("dynamodb://xy", "is not a DynamoDB table name"),
    ],
)
def test_open_ledger_refuses_bad_table_names(uri: str, match: str) -> None:
    with pytest.raises(LedgerError, match=match) as e:
        open_ledger(uri)
    one_line(e)


def test_missing_table_says_how_to_create_it(aws_env: None) -> None:
    with mock_aws(), pytest.raises(LedgerError, match="does not exist in region us-east-1") as e:
        open_ledger("dynamodb://team-ledger")
    assert "`redrive ledger init dynamodb://team-ledger`" in one_line(e)


class Proxy:
    """A boto3 client with some operations replaced."""

    def __init__(self, client: Any, **operations: Callable[..., Any]) -> None:
        self._client = client
        self._operations = operations

    def __getattr__(self, name: str) -> Any:
        if name in self._operations:
            return self._operations[name]
        return getattr(self._client, name)


def client_error(code: str, operation: str) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": f"{code} for a test"}}, operation
    )


def test_access_denied_names_the_dynamodb_action(dynamodb: Any) -> None:
    def denied(operation: str) -> Callable[..., Any]:
        def call(**kwargs: Any) -> Any:
            raise client_error("AccessDeniedException", operation)

        return call

    with pytest.raises(LedgerError, match="may not dynamodb:DescribeTable on the ledger") as e:
        DynamoDbLedger(TABLE, Proxy(dynamodb, describe_table=denied("DescribeTable")))
    one_line(e)

    led = DynamoDbLedger(TABLE, Proxy(dynamodb, put_item=denied("PutItem")))
    with pytest.raises(LedgerError, match="may not dynamodb:PutItem on the ledger table") as e:
        led.claim_many("A", claims("k1", "k2"))
    one_line(e)
    with pytest.raises(LedgerError, match="dynamodb:PutItem"):
        led.start_run("A", command="move", info={})


def test_no_credentials_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # nothing may look beyond loopback
    # A session of its own: boto3's default session keeps credentials other tests resolved.
    client = boto3.Session().client(
        "dynamodb", region_name=REGION, endpoint_url="http://127.0.0.1:9"
    )
    with pytest.raises(LedgerError, match="no AWS credentials found") as e:
        DynamoDbLedger(TABLE, client)
    one_line(e)


def test_a_claim_retried_after_a_lost_answer_is_still_won(dynamodb: Any) -> None:
    """botocore resends a write whose answer timed out; the resent claim finds the first one
    (its own) and must not call it someone else's, which would leave the key in doubt."""

    def put_twice(**kwargs: Any) -> Any:
        dynamodb.put_item(**kwargs)  # applied, but its answer is "lost"
        return dynamodb.put_item(**kwargs)

    led = DynamoDbLedger(TABLE, Proxy(dynamodb, put_item=put_twice))
    led.start_run("A", command="move", info={})  # the run's own put, retried, is fine too
    assert led.claim_many("A", claims("k1", "k2")).won == {"k1", "k2"}
    again = led.claim_many("A", claims("k1"))  # a later call of the same run: not won
    assert again.won == frozenset() and again["k1"].run_id == "A"


def test_a_failed_claim_gives_back_what_the_batch_won(dynamodb: Any) -> None:
    def flaky_put(**kwargs: Any) -> Any:
        if kwargs["Item"]["pk"]["S"] == "key#bad":
            raise client_error("InternalServerError", "PutItem")
        return dynamodb.put_item(**kwargs)

    led = DynamoDbLedger(TABLE, Proxy(dynamodb, put_item=flaky_put))
    led.start_run("A", command="move", info={})
    with pytest.raises(LedgerError, match=r"PutItem on ledger table .* InternalServerError"):
        led.claim_many("A", claims("k1", "bad", "k2"))
    assert led.get_many(["k1", "bad", "k2"]) == {}  # nothing left claimed, so nothing in doubt


def test_a_write_that_meets_a_transaction_is_retried(dynamodb: Any) -> None:
    conflicts = iter([True, True, False])

    def update(**kwargs: Any) -> Any:
        if next(conflicts, False):
            raise client_error("TransactionConflictException", "UpdateItem")
        return dynamodb.update_item(**kwargs)

    led = DynamoDbLedger(TABLE, Proxy(dynamodb, update_item=update))
    led.start_run("A", command="move", info={})
    led.heartbeat("A", lease_until=2e9)
    run = led.run("A")
    assert run is not None and run.lease_until == 2e9


class InFlight:
    """A before-send hook: counts the client's calls in flight; the first ``hold`` PutItems
    wait until that many are in flight at once (or time out, which breaks the barrier)."""

    def __init__(self, hold: int) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = self.puts = 0
        self.hold = threading.Barrier(hold, timeout=60)
        self.release = threading.Event()

    def __call__(self, event_name: str, **_: Any) -> None:
        put = event_name.endswith(".PutItem")  # before-send.dynamodb.PutItem
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            self.puts += put
            held = put and self.puts <= self.hold.parties
        try:
            if held:
                self.hold.wait()
                self.release.wait(10)
        finally:
            with self.lock:
                self.now -= 1


def test_the_writes_of_two_workers_batches_run_at_once_within_the_connection_pool(
    aws_env: None,
) -> None:
    """As wide as the client's connection pool (redrive's clients have 20), not 10: two
    workers' claims of 10 keys go out together; and never more calls in flight than the
    pool has connections, the callers' own reads included."""
    with mock_aws():
        client = boto3.client(
            "dynamodb", region_name=REGION, config=Config(max_pool_connections=20)
        )
        init_table(client, TABLE)
        led = DynamoDbLedger(TABLE, client)
        led.start_run("A", command="move", info={})
        in_flight = InFlight(hold=20)
        client.meta.events.register_first("before-send", in_flight)
        results: list[Any] = []

        def claim(keys: list[str]) -> None:
            results.append(led.claim_many("A", claims(*keys)))

        workers = [
            threading.Thread(target=claim, args=([f"w{w}-{i}" for i in range(10)],))
            for w in range(2)
        ]
        for t in workers:
            t.start()
        # all 20 PutItems are in flight together (the barrier let them through) ...
        deadline = time.monotonic() + 60
        while in_flight.now < 20 and not in_flight.hold.broken:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert not in_flight.hold.broken
        # ... so a read now waits for a connection instead of opening a 21st
        reader = threading.Thread(target=led.get_many, args=(["w0-0"],))
        reader.start()
        time.sleep(0.2)
        assert in_flight.now == 20
        in_flight.release.set()
        for t in [*workers, reader]:
            t.join(10)
        assert [len(r.won) for r in results] == [10, 10]
        assert in_flight.peak == 20
        led.close()


def test_takeover_is_refused_when_the_owner_heartbeats_first(dynamodb: Any) -> None:
    """The lease check and the takeover are one transaction: a heartbeat landing between
    the taker's decision and its write makes the write fail, not steal a live run's key."""
    clock = Clock()
    led = DynamoDbLedger(TABLE, dynamodb, clock=clock)
    for run_id in ("A", "B"):
        led.start_run(run_id, command="move", info={})
    led.claim_many("A", claims("k1", "k2"))
    clock.now += 200
    assert not led.is_live("A", stale_after=120)  # B concludes A is dead ...
    led.heartbeat("A", lease_until=clock.now + 30)  # ... but A was only slow
    assert led.takeover_many("B", [("k1", "A")]) == set()
    assert led.mark_skipped_many("B", ["k2"]) == set()
    assert state(led, "k1") == state(led, "k2") == (KeyState.CLAIMED, "A")


# ----------------------------------------------------------------------------- two processes

_CLAIMER = textwrap.dedent(
    """
    import json, random, sys, time
    from redrive.ledger import Claim, open_ledger

    table, run_id = sys.argv[1], sys.argv[2]
    led = open_ledger("dynamodb://" + table)  # endpoint and region from the environment
    print("ready", flush=True)
    sys.stdin.readline()
    led.start_run(run_id, command="move", info={})
    keys = [f"task-{i}" for i in range(200)]
    batches = [keys[i : i + 10] for i in range(0, 200, 10)]
    random.Random(run_id).shuffle(batches)  # each worker its own order, the same every run
    won = []
    for batch in batches:
        result = led.claim_many(run_id, [Claim(k, "t", "m-" + k, "q") for k in batch])
        mine = sorted(result.won)
        assert all(result[k].run_id != run_id for k in batch if k not in result.won)
        # what the engine does next: send, then delete, each recorded
        led.mark_sent_many(run_id, {k: "sqs-" + run_id for k in mine})
        led.heartbeat(run_id, lease_until=time.time() + 30)
        led.mark_done_many(run_id, mine)
        won += mine
    led.end_run(run_id, outcome="completed", counts={"moved": len(won)})
    led.close()
    print(json.dumps(won), flush=True)
    """
)


@pytest.fixture
def serial_server(tmp_path: Path) -> Iterator[MotoServer]:
    """A moto server of our own that serves one request at a time: moto's DynamoDB does not
    lock an item between checking a condition and writing, real DynamoDB does."""
    server = start_moto_server(tmp_path / "moto.log", serial=True)
    try:
        yield server
    finally:
        server.process.terminate()
        server.process.wait(10)


def _env(server: MotoServer) -> dict[str, str]:
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {**server.env(), "PYTHONPATH": pythonpath}


@pytest.mark.e2e
def test_two_processes_claiming_the_same_keys_win_each_once(
    serial_server: MotoServer, tmp_path: Path
) -> None:
    client = serial_server.client("dynamodb")
    init_table(client, TABLE)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CLAIMER, TABLE, f"w{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(serial_server),
        )
        for i in range(2)
    ]
    outputs: list[tuple[str, str, int]] = []
    try:
        for p in procs:
            assert p.stdout is not None and p.stderr is not None
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in procs:  # start them together
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            out, err = p.communicate(timeout=120)
            outputs.append((out, err, p.returncode))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()

    won_by: dict[str, str] = {}
    for i, (out, err, rc) in enumerate(outputs):
        assert rc == 0, err
        for key in json.loads(out):
            assert key not in won_by, f"{key} won by w{i} and {won_by[key]}"
            won_by[key] = f"w{i}"
    assert len(won_by) == 200
    assert set(won_by.values()) == {"w0", "w1"}, "both processes won some keys"

    with DynamoDbLedger(TABLE, client) as led:
        entries = led.get_many(list(won_by))
        assert {e.state for e in entries.values()} == {KeyState.DONE}
        assert all(entries[k].run_id == run for k, run in won_by.items())
        assert all(entries[k].sent_message_id == f"sqs-{run}" for k, run in won_by.items())
        runs = led.runs()
        assert {r.outcome for r in runs} == {"completed"}
        assert sum(r.counts["moved"] for r in runs) == 200
        assert sorted(e.key for r in runs for e in led.keys_for_run(r.run_id)) == sorted(won_by)


# ----------------------------------------------------------------------------- moves


_PUBLISHED: dict[str, str] = {}


def body(task_id: str) -> str:
    """One publish of the task: asked again, the same bytes (a copy of that publish)."""
    if task_id not in _PUBLISHED:
        _PUBLISHED[task_id] = encode(TASK, [task_id], {"note": "Zoë ✓"}, task_id=task_id)
    return _PUBLISHED[task_id]


def fill(client: Any, url: str, texts: list[str]) -> None:
    for start in range(0, len(texts), 10):
        entries = [
            {"Id": str(i), "MessageBody": text} for i, text in enumerate(texts[start : start + 10])
        ]
        assert not client.send_message_batch(QueueUrl=url, Entries=entries).get("Failed")


def arrived(family: Family) -> Counter[str | None]:
    return Counter(decode(m["Body"]).task_id for m in family.drain(family.queue_url))


def test_a_move_with_the_dynamodb_ledger_sends_each_task_once(family: Family) -> None:
    ids = [f"t-{i}" for i in range(25)]
    fill(family.client, family.dlq_url, [body(t) for t in ids] + [body(t) for t in ids[::5]])
    dynamodb = boto3.client("dynamodb", region_name=REGION)  # the family's mock_aws
    init_table(dynamodb, TABLE)
    checkout = built_in_layout({}).family("checkout")
    assert checkout is not None

    def move() -> Any:
        with DynamoDbLedger(TABLE, dynamodb) as ledger:
            return MoveEngine(
                resolve_family(SqsBroker(family.client), checkout),
                ledger,
                MoveOptions(execute=True),
                broker_factory=lambda: SqsBroker(family.client),
            ).run()

    result = move()
    assert (result.moved, result.failed, result.in_doubt) == (25, 0, 0)
    assert result.ledger == f"dynamodb://{TABLE}"
    assert arrived(family) == {t: 1 for t in ids}
    # Each duplicate copy was deleted now, or (seen before its key was sent) is left for
    # the next run, which deletes it and sends nothing.
    rerun = move()
    assert rerun.moved == 0 and result.duplicates + rerun.duplicates == 5
    assert family.depth() == (0, 0)
    assert arrived(family) == {}

    with DynamoDbLedger(TABLE, dynamodb) as ledger:
        run = ledger.run(str(result.run_id))
        assert run is not None and run.outcome == "completed" and run.counts["moved"] == 25
        entries = ledger.keys_for_run(str(result.run_id))
        assert len(entries) == 25 and {e.state for e in entries} == {KeyState.DONE}


_OPERATOR = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path

    from redrive.dlq import scan
    from redrive.config import built_in_layout
    from redrive.ledger import open_ledger
    from redrive.operations.move import MoveEngine, MoveOptions
    from redrive.broker.sqs.queues import resolve_family
    from redrive.aws.session import AwsSettings
    from redrive.broker.sqs import open_sqs

    scan.RECEIVE_WAIT_SECONDS = 0  # a long poll would hold up the serial server
    table, go = sys.argv[1:3]
    settings = AwsSettings()  # endpoint and region from the environment
    target = resolve_family(open_sqs(settings), built_in_layout({}).family("checkout"))
    ledger = open_ledger("dynamodb://" + table, client_factory=settings.client)
    print("ready", flush=True)
    while not Path(go).exists():
        time.sleep(0.01)
    with ledger:
        result = MoveEngine(
            target, ledger, MoveOptions(execute=True, lease=10),
            broker_factory=lambda: open_sqs(settings),
        ).run()
    print(json.dumps(result.to_json()), flush=True)
    """
)


@pytest.mark.e2e
def test_two_operators_draining_one_dlq_send_each_task_once(
    serial_server: MotoServer, tmp_path: Path
) -> None:
    from conftest import make_family

    sqs = serial_server.client("sqs")
    dynamodb = serial_server.client("dynamodb")
    try:
        family = make_family(sqs)
        init_table(dynamodb, TABLE)
        ids = [f"t-{i}" for i in range(80)]
        fill(sqs, family.dlq_url, [body(t) for t in ids] + [body(t) for t in ids[::8]])
        go = tmp_path / "go"
        operators = [
            subprocess.Popen(
                [sys.executable, "-c", _OPERATOR, TABLE, str(go)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_env(serial_server),
                text=True,
            )
            for _ in range(2)
        ]
        results = []
        try:
            for op in operators:
                assert op.stdout is not None and op.stderr is not None
                assert op.stdout.readline().strip() == "ready", op.stderr.read()
            go.touch()
            for op in operators:
                out, err = op.communicate(timeout=120)
                assert op.returncode == 0, err
                results.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for op in operators:
                if op.poll() is None:
                    op.kill()
                    op.communicate()

        assert all(r["failed"] == 0 and r["in_doubt"] == 0 for r in results)
        assert all(r["moved"] > 0 for r in results), "both operators did part of the work"
        assert sum(r["moved"] for r in results) == len(ids)
        assert all(r["ledger"] == f"dynamodb://{TABLE}" for r in results)
        assert arrived(family) == {t: 1 for t in ids}
        # A copy one operator saw while the other held its key stays in the DLQ; it is a
        # duplicate of a sent task now: a last run deletes it and sends nothing.
        checkout = built_in_layout({}).family("checkout")
        assert checkout is not None
        with DynamoDbLedger(TABLE, dynamodb) as ledger:
            last = MoveEngine(
                resolve_family(SqsBroker(sqs), checkout),
                ledger,
                MoveOptions(execute=True),
                broker_factory=lambda: SqsBroker(sqs),
            ).run()
        assert (last.moved, last.in_doubt) == (0, 0)
        assert sum(r["duplicates_deleted"] for r in results) + last.duplicates == len(ids[::8])
        assert family.depth() == (0, 0) and arrived(family) == {}
    finally:
        sqs.close()
        dynamodb.close()
    log = (tmp_path / "moto.log").read_text(errors="replace")
    assert " 500 " not in log


# ----------------------------------------------------------------------------- the command


def test_ledger_init_command(aws_env: None, tmp_path: Path, cli: Cli) -> None:
    with mock_aws():
        created = cli("ledger", "init", "dynamodb://team-ledger")
        assert created.exit_code == 0, created.output
        assert "created the DynamoDB ledger table team-ledger" in created.stdout
        again = cli("ledger", "init", "dynamodb://team-ledger")
        assert again.exit_code == 0 and "is ready" in again.stdout

        bad = cli("ledger", "init", "dynamodb://no")
        assert bad.exit_code == 1
        assert bad.stderr.strip().count("\n") == 0 and "not a DynamoDB table name" in bad.stderr

    path = tmp_path / "new" / "ledger.sqlite3"
    made = cli("ledger", "init", str(path))
    assert made.exit_code == 0, made.output
    assert path.is_file() and str(path) in made.stdout


def test_move_command_with_a_dynamodb_ledger(family: Family, cli: Cli) -> None:
    ids = [f"t-{i}" for i in range(12)]
    fill(family.client, family.dlq_url, [body(t) for t in ids])
    assert cli("ledger", "init", f"dynamodb://{TABLE}").exit_code == 0
    move = ("move", "checkout", "--execute", "--yes", "--json", "--ledger", f"dynamodb://{TABLE}")

    first = cli(*move)
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["moved"] == 12
    assert json.loads(first.stdout)["ledger"] == f"dynamodb://{TABLE}"
    assert arrived(family) == {t: 1 for t in ids}

    dry = cli("move", "checkout", "--json", "--ledger", "dynamodb://absent-table")
    assert dry.exit_code == 1
    assert "redrive ledger init dynamodb://absent-table" in dry.stderr


def test_a_client_with_fewer_connections_than_write_threads_never_overflows_its_pool(
    aws_env: None,
) -> None:
    """The write pool keeps at least 10 threads, but the calls in flight stay within the
    client's connections (4 here): the others wait instead of opening connections urllib3
    would then throw away with a warning."""
    with mock_aws():
        client = boto3.client("dynamodb", region_name=REGION, config=Config(max_pool_connections=4))
        init_table(client, TABLE)
        led = DynamoDbLedger(TABLE, client)
        led.start_run("A", command="move", info={})
        in_flight = InFlight(hold=4)
        client.meta.events.register_first("before-send", in_flight)
        result: list[Any] = []
        worker = threading.Thread(
            target=lambda: result.append(led.claim_many("A", claims(*"abcdefghij")))
        )
        worker.start()
        deadline = time.monotonic() + 60
        while in_flight.now < 4 and not in_flight.hold.broken:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.2)
        assert in_flight.now == 4
        in_flight.release.set()
        worker.join(10)
        assert len(result[0].won) == 10
        assert in_flight.peak == 4
        led.close()


def test_a_sqlite_ledger_copied_into_dynamodb_still_guards_every_key(
    dynamodb: Any, tmp_path: Path
) -> None:
    from redrive.ledger import SqliteLedger
    from redrive.ledger.copy import copy_ledger

    clock = Clock()
    with SqliteLedger(tmp_path / "l.sqlite3", clock=clock) as src:
        src.start_run("A", command="move", info={"who": "A"})
        src.claim_many("A", claims(*(f"k{i}" for i in range(30))))
        src.mark_sent_many("A", {f"k{i}": f"sqs-{i}" for i in range(20)})
        src.mark_done_many("A", [f"k{i}" for i in range(10)])
        src.end_run("A", outcome="interrupted", counts={"moved": 20})
        before = {e.key: e for s in KeyState for e in src.iter_keys(s)}
        with DynamoDbLedger(TABLE, dynamodb, clock=clock) as dst:
            result = copy_ledger(src, dst)
            assert (result.keys_copied, result.runs_copied) == (30, 1)
            assert {e.key: e for s in KeyState for e in dst.iter_keys(s)} == before
            assert dst.runs() == src.runs()
            dst.start_run("B", command="move", info={})
            assert dst.claim_many("B", claims(*before)).won == frozenset()
            again = copy_ledger(src, dst)
            assert (again.keys_copied, again.runs_copied) == (0, 0)
