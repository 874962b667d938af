"""The ledger's contract, written once and run on every backend: SQLite, DynamoDB on moto
in-process, and PostgreSQL on the run's private server (a database of each test's own).
Every backend must pass each test here; what is one backend's own (files and schema
upgrades; the table, TTL, retries and throttling; the URL, its schema versions and its
durability check) stays in test_ledger.py, test_ledger_dynamodb.py and
test_ledger_postgres.py, which take this module's helpers (Clock, claims, state, one_line).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import boto3
import pytest
from conftest import REGION
from moto import mock_aws

from redrive.errors import LedgerError
from redrive.ledger import (
    MAX_KEY_LENGTH,
    Claim,
    ClaimResult,
    Entry,
    KeyState,
    Ledger,
    SqliteLedger,
)
from redrive.ledger.dynamodb import DynamoDbLedger, init_table
from redrive.ledger.postgres import PostgresLedger
from redrive.ledger.postgres_setup import init_schema
from redrive.ledger.postgres_writes import PgConnector

Q = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"
TABLE = "redrive-ledger"


class Clock:
    """A hand-wound clock, so liveness tests do not sleep."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def claims(*keys: str, message_prefix: str = "m-") -> list[Claim]:
    return [
        Claim(key=k, task="app.tasks.charge", message_id=message_prefix + k, target=Q) for k in keys
    ]


def state(led: Ledger, key: str) -> tuple[KeyState, str] | None:
    entry = led.get_many([key]).get(key)
    return None if entry is None else (entry.state, entry.run_id)


def one_line(e: pytest.ExceptionInfo[LedgerError]) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.fixture
def clock() -> Clock:
    return Clock()


# "sqlite" groups concurrent writes (the default); "sqlite-plain" is one transaction per call;
# "postgres" and "postgres-plain" alike.
@pytest.fixture(
    params=[
        "sqlite",
        "sqlite-plain",
        "dynamodb",
        pytest.param("postgres", marks=pytest.mark.e2e),
        pytest.param("postgres-plain", marks=pytest.mark.e2e),
    ]
)
def new_ledger(
    request: pytest.FixtureRequest, tmp_path: Path, clock: Clock
) -> Iterator[Callable[[], Ledger]]:
    """Opens the backend's ledger: each call a new object on the same file, table or
    database."""
    with ExitStack() as stack:
        if request.param.startswith("postgres"):
            url = request.getfixturevalue("postgres_url")
            init_schema(PgConnector(url, url))
            grouped_pg = request.param == "postgres"

            def make() -> Ledger:
                return stack.enter_context(
                    PostgresLedger(url, clock=clock, group_commit=grouped_pg)
                )

        elif request.param == "dynamodb":
            stack.enter_context(mock_aws())
            client = boto3.client("dynamodb", region_name=REGION)
            init_table(client, TABLE)

            def make() -> Ledger:
                return stack.enter_context(DynamoDbLedger(TABLE, client, clock=clock))

        else:
            grouped = request.param == "sqlite"

            def make() -> Ledger:
                return stack.enter_context(
                    SqliteLedger(tmp_path / "l.sqlite3", clock=clock, group_commit=grouped)
                )

        yield make


@pytest.fixture
def ledger(new_ledger: Callable[[], Ledger]) -> Ledger:
    led = new_ledger()
    for run_id in ("A", "B", "C"):
        led.start_run(run_id, command="move", info={})
    return led


# ----------------------------------------------------------------------------- claims and keys


def test_claim_absent_keys_wins_them_all(ledger: Ledger, clock: Clock) -> None:
    result = ledger.claim_many("A", claims("k1", "k2"))

    assert isinstance(result, ClaimResult)
    assert result.won == {"k1", "k2"}
    assert list(result) == ["k1", "k2"]
    assert result["k1"] == Entry(
        key="k1",
        state=KeyState.CLAIMED,
        run_id="A",
        task="app.tasks.charge",
        message_id="m-k1",
        target=Q,
        sent_message_id=None,
        updated_at=clock.now,
    )


def test_claim_of_existing_key_returns_it_and_is_not_won(ledger: Ledger) -> None:
    ledger.claim_many("A", claims("k1"))

    other = ledger.claim_many("B", claims("k1", "k2", message_prefix="other-"))
    assert other.won == {"k2"}
    assert other["k1"].run_id == "A"
    assert other["k1"].message_id == "m-k1"  # the first claim's details are kept

    again = ledger.claim_many("A", claims("k1"))  # "already mine", not "won now"
    assert again.won == frozenset()
    assert (again["k1"].state, again["k1"].run_id) == (KeyState.CLAIMED, "A")


def test_claim_of_sent_or_done_key_is_not_won(ledger: Ledger) -> None:
    ledger.claim_many("A", claims("s", "d"))
    ledger.mark_sent_many("A", {"s": "sqs-1", "d": "sqs-2"})
    ledger.mark_done_many("A", ["d"])

    result = ledger.claim_many("B", claims("s", "d"))
    assert result.won == frozenset()
    assert result["s"].state is KeyState.SENT
    assert result["d"].state is KeyState.DONE


def test_duplicate_key_in_one_batch_first_copy_wins(ledger: Ledger) -> None:
    batch = [Claim("k", "t", "copy-1", Q), Claim("k", "t", "copy-2", Q)]
    result = ledger.claim_many("A", batch)
    assert result.won == {"k"}
    assert len(result) == 1
    assert result["k"].message_id == "copy-1"


def test_claim_result_is_a_mapping_and_empty_batch_is_fine(ledger: Ledger) -> None:
    empty = ledger.claim_many("A", [])
    assert isinstance(empty, Mapping)
    assert dict(empty) == {}
    assert empty.won == frozenset()


def test_key_length_is_checked(ledger: Ledger) -> None:
    ledger.claim_many("A", claims("x" * MAX_KEY_LENGTH))
    with pytest.raises(ValueError, match=r"1\.\.128"):
        ledger.claim_many("A", claims("y" * (MAX_KEY_LENGTH + 1)))
    with pytest.raises(ValueError):
        ledger.claim_many("A", claims(""))


def test_get_many_leaves_out_absent_keys_and_handles_many(ledger: Ledger) -> None:
    keys = [f"k{i}" for i in range(1200)]  # more than one IN (...) chunk
    result = ledger.claim_many("A", claims(*keys))
    assert len(result.won) == 1200
    got = ledger.get_many([*keys, "nope"])
    assert list(got) == keys
    assert ledger.get_many([]) == {}


def test_mark_sent_only_by_the_owner_of_a_claim(ledger: Ledger, clock: Clock) -> None:
    ledger.claim_many("A", claims("k1", "k2"))
    clock.now += 5

    ledger.mark_sent_many("B", {"k1": "sqs-B"})
    assert state(ledger, "k1") == (KeyState.CLAIMED, "A")

    ledger.mark_sent_many("A", {"k1": "sqs-A", "absent": "sqs-X"})
    entry = ledger.get_many(["k1"])["k1"]
    assert (entry.state, entry.sent_message_id, entry.updated_at) == (
        KeyState.SENT,
        "sqs-A",
        clock.now,
    )
    assert ledger.get_many(["absent"]) == {}

    ledger.mark_sent_many("A", {"k1": "sqs-again"})  # SENT is not CLAIMED: unchanged
    assert ledger.get_many(["k1"])["k1"].sent_message_id == "sqs-A"
    assert state(ledger, "k2") == (KeyState.CLAIMED, "A")


def test_the_time_of_the_send_is_kept_when_the_key_is_done(ledger: Ledger, clock: Clock) -> None:
    # What tells a copy from the same bytes sent again later (redrive.keys.copy_verdict).
    ledger.claim_many("A", claims("k1"))
    assert ledger.get_many(["k1"])["k1"].sent_at is None
    clock.now += 5
    ledger.mark_sent_many("A", {"k1": "sqs-1"})
    sent_at = clock.now
    clock.now += 3600
    ledger.mark_done_many("B", ["k1"])
    entry = ledger.get_many(["k1"])["k1"]
    assert (entry.state, entry.sent_at, entry.updated_at) == (KeyState.DONE, sent_at, clock.now)


def test_release_forgets_own_claims_only(ledger: Ledger) -> None:
    ledger.claim_many("A", claims("k1", "k2", "k3"))
    ledger.mark_sent_many("A", {"k3": "sqs-3"})

    ledger.release_many("B", ["k1"])
    assert state(ledger, "k1") == (KeyState.CLAIMED, "A")

    ledger.release_many("A", ["k1", "k3", "absent"])
    assert state(ledger, "k1") is None
    assert state(ledger, "k3") == (KeyState.SENT, "A")  # sent is never released

    assert ledger.claim_many("B", claims("k1")).won == {"k1"}  # back to none: claimable


def test_mark_done_from_sent_by_any_run(ledger: Ledger) -> None:
    ledger.claim_many("A", claims("k1", "k2"))
    ledger.mark_sent_many("A", {"k1": "sqs-1"})

    ledger.mark_done_many("B", ["k1", "k2", "absent"])
    done = ledger.get_many(["k1"])["k1"]
    assert (done.state, done.run_id, done.sent_message_id) == (KeyState.DONE, "A", "sqs-1")
    assert state(ledger, "k2") == (KeyState.CLAIMED, "A")  # never sent: not done

    ledger.mark_done_many("A", ["k1"])  # idempotent
    assert state(ledger, "k1") == (KeyState.DONE, "A")


def test_takeover_only_from_the_named_dead_run(ledger: Ledger, clock: Clock) -> None:
    ledger.claim_many("A", claims("k1", "k2", "k3", "k4"))
    ledger.mark_sent_many("A", {"k4": "sqs-4"})

    taken = ledger.takeover_many("C", [("k1", "B"), ("k2", "A"), ("k4", "A"), ("absent", "A")])
    assert taken == {"k2"}
    assert state(ledger, "k1") == (KeyState.CLAIMED, "A")  # wrong old run named
    assert state(ledger, "k2") == (KeyState.CLAIMED, "C")
    assert state(ledger, "k4") == (KeyState.SENT, "A")  # sent is not in doubt

    assert ledger.takeover_many("B", [("k2", "A")]) == set()  # A no longer owns it
    assert ledger.takeover_many("C", [("k2", "C")]) == set()  # nothing to take from oneself

    ledger.mark_sent_many("C", {"k2": "sqs-2"})  # the new owner may now send
    assert state(ledger, "k2") == (KeyState.SENT, "C")


def test_takeover_and_skip_refused_while_owner_lease_runs(ledger: Ledger, clock: Clock) -> None:
    """Inside a live lease neither changes a key, and each says so (the empty set); once the
    lease is over (the clock wound past it, no sleep) both act, and say which keys."""
    ledger.claim_many("A", claims("k1", "k2"))
    ledger.heartbeat("A", lease_until=clock.now + 60)

    assert ledger.takeover_many("B", [("k1", "A")]) == set()
    assert ledger.mark_skipped_many("B", ["k2"]) == set()
    assert state(ledger, "k1") == state(ledger, "k2") == (KeyState.CLAIMED, "A")

    clock.now += 59  # still inside it
    assert ledger.takeover_many("B", [("k1", "A")]) == set()
    assert ledger.mark_skipped_many("B", ["k2", "k2"]) == set()
    assert state(ledger, "k1") == state(ledger, "k2") == (KeyState.CLAIMED, "A")

    clock.now += 2
    assert ledger.takeover_many("B", [("k1", "A")]) == {"k1"}
    assert ledger.mark_skipped_many("B", ["k2", "k2"]) == {"k2"}
    assert state(ledger, "k1") == (KeyState.CLAIMED, "B")
    assert state(ledger, "k2") == (KeyState.SKIPPED, "B")
    assert ledger.mark_skipped_many("C", ["k2"]) == set()  # skipped already: not marked again


def test_skip_marks_only_the_keys_whose_owner_lease_is_over(ledger: Ledger, clock: Clock) -> None:
    """One call over keys of a dead run and of a leased one: only the dead run's are marked,
    and only they are in the answer."""
    for run_id in ("dead", "leased"):
        ledger.start_run(run_id, command="move", info={})
    ledger.claim_many("dead", claims("d1", "d2"))
    ledger.claim_many("leased", claims("l1"))
    ledger.heartbeat("leased", lease_until=clock.now + 300)
    clock.now += 1  # the dead run's lease (its start) is over

    assert ledger.mark_skipped_many("C", ["d1", "l1", "d2"]) == {"d1", "d2"}
    assert state(ledger, "d1") == state(ledger, "d2") == (KeyState.SKIPPED, "C")
    assert state(ledger, "l1") == (KeyState.CLAIMED, "leased")


def test_mark_skipped_resolves_claims_of_dead_runs(ledger: Ledger) -> None:
    ledger.claim_many("A", claims("k1", "k2"))
    ledger.claim_many("C", claims("mine"))
    ledger.mark_sent_many("A", {"k2": "sqs-2"})

    assert ledger.mark_skipped_many("C", ["k1", "k2", "mine", "absent"]) == {"k1"}
    assert state(ledger, "k1") == (KeyState.SKIPPED, "C")  # the run that decided owns it
    assert state(ledger, "k2") == (KeyState.SENT, "A")
    assert state(ledger, "mine") == (KeyState.CLAIMED, "C")  # own claim is not in doubt
    assert ledger.claim_many("B", claims("k1")).won == frozenset()

    # A run that ended (even without a lease running out) is dead.
    ledger.claim_many("B", claims("k3"))
    ledger.heartbeat("B", lease_until=1e12)
    ledger.end_run("B", outcome="failed", counts={})
    assert ledger.mark_skipped_many("C", ["k3"]) == {"k3"}
    assert state(ledger, "k3") == (KeyState.SKIPPED, "C")


def test_keys_for_run(ledger: Ledger, clock: Clock) -> None:
    ledger.claim_many("A", claims("a2", "a1"))
    clock.now += 1
    ledger.mark_sent_many("A", {"a2": "sqs"})
    ledger.claim_many("B", claims("b1"))

    assert [(e.key, e.state) for e in ledger.keys_for_run("A")] == [
        ("a1", KeyState.CLAIMED),
        ("a2", KeyState.SENT),
    ]
    assert [e.key for e in ledger.keys_for_run("B")] == ["b1"]
    assert ledger.keys_for_run("nobody") == []


def test_iter_keys_lists_every_key_in_a_state_page_by_page(ledger: Ledger) -> None:
    """Issue 22: 250 claimed keys (more than a move's summary lists) all come back, pages of
    7 at a time, of every run or of one; other states and runs stay out."""
    a_keys = [f"a{i:03}" for i in range(250)]
    for start in range(0, len(a_keys), 50):
        ledger.claim_many("A", claims(*a_keys[start : start + 50]))
    ledger.mark_sent_many("A", {k: "sqs" for k in a_keys[:10]})
    ledger.mark_done_many("A", a_keys[:5])
    ledger.claim_many("B", claims("b1", "b2"))
    claimed_a = set(a_keys[10:])

    every = list(ledger.iter_keys(KeyState.CLAIMED, page_size=7))
    assert len(every) == len({e.key for e in every}) == 242, "each key once"
    assert {e.key for e in every} == claimed_a | {"b1", "b2"}
    assert all(e.state is KeyState.CLAIMED and e.message_id == "m-" + e.key for e in every)

    of_a = list(ledger.iter_keys(KeyState.CLAIMED, run_id="A", page_size=7))
    assert sorted(e.key for e in of_a) == sorted(claimed_a)
    assert {e.key for e in ledger.iter_keys(KeyState.SENT)} == set(a_keys[5:10])
    assert {e.key for e in ledger.iter_keys(KeyState.DONE, run_id="A")} == set(a_keys[:5])
    assert list(ledger.iter_keys(KeyState.CLAIMED, run_id="nobody")) == []
    assert list(ledger.iter_keys(KeyState.SKIPPED, page_size=1)) == []
    with pytest.raises(ValueError, match="at least one"):
        ledger.iter_keys(KeyState.CLAIMED, page_size=0)


@pytest.mark.parametrize("run_id", [None, "A"])
def test_iter_keys_reads_one_page_at_a_time(ledger: Ledger, run_id: str | None) -> None:
    """Bounded memory: the listing reads a page only when the one before is consumed, so
    keys released after the first item came back are not listed; at most the first page
    (already read) is."""
    keys = [f"k{i:02}" for i in range(40)]
    ledger.claim_many("A", claims(*keys))
    listing = ledger.iter_keys(KeyState.CLAIMED, run_id=run_id, page_size=5)
    first = next(listing)
    ledger.release_many("A", keys)
    rest = list(listing)
    assert first.key in keys
    assert 1 + len(rest) <= 5


# ----------------------------------------------------------------------------- runs and sharing


def test_run_lifecycle(new_ledger: Callable[[], Ledger], clock: Clock, tmp_path: Path) -> None:
    led = new_ledger()
    assert led.run("r1") is None
    led.start_run("r1", command="move", info={"dlq": "orders-dlq", "path": tmp_path})
    with pytest.raises(LedgerError, match="r1 already exists") as e:
        led.start_run("r1", command="move", info={})
    one_line(e)

    info = led.run("r1")
    assert info is not None
    assert (info.command, info.started_at, info.heartbeat_at) == ("move", clock.now, clock.now)
    assert info.info == {"dlq": "orders-dlq", "path": str(tmp_path)}
    assert (info.ended_at, info.outcome, info.counts) == (None, None, {})

    clock.now += 10
    led.heartbeat("r1", lease_until=clock.now + 30.25)
    info = led.run("r1")
    assert info is not None
    assert (info.heartbeat_at, info.lease_until) == (clock.now, clock.now + 30.25)

    with pytest.raises(ValueError, match="outcome"):
        led.end_run("r1", outcome="great", counts={})
    led.end_run("r1", outcome="completed", counts={"moved": 3, "skipped": 1})
    led.end_run("r1", outcome="failed", counts={})  # the first ending stands
    info = led.run("r1")
    assert info is not None
    assert (info.ended_at, info.outcome, info.counts) == (
        clock.now,
        "completed",
        {"moved": 3, "skipped": 1},
    )

    with pytest.raises(LedgerError, match="not open") as e:
        led.heartbeat("r1", lease_until=clock.now + 30)
    one_line(e)
    with pytest.raises(LedgerError, match="not open"):
        led.heartbeat("never", lease_until=clock.now + 30)
    with pytest.raises(LedgerError, match="never started"):
        led.end_run("never", outcome="completed", counts={})


def test_end_run_adds_what_only_the_end_knows_to_the_info(
    new_ledger: Callable[[], Ledger], clock: Clock
) -> None:
    led = new_ledger()
    led.start_run("p1", command="purge", info={"target": "checkout", "archive": "/a.jsonl"})
    deleted = [["m-1", "apps.t", "id-1"], ["m-2", "(unknown)", None]]
    led.end_run("p1", outcome="completed", counts={"purged": 2}, info={"deleted": deleted})
    # A second ending changes neither the outcome nor the info.
    led.end_run("p1", outcome="failed", counts={}, info={"deleted": []})
    run = new_ledger().run("p1")
    assert run is not None and run.outcome == "completed" and run.counts == {"purged": 2}
    assert run.info == {"target": "checkout", "archive": "/a.jsonl", "deleted": deleted}
    # Without info, the start's record stays as it was.
    led.start_run("p2", command="move", info={"target": "x"})
    led.end_run("p2", outcome="interrupted", counts={})
    assert led.run("p2").info == {"target": "x"}  # type: ignore[union-attr]
    with pytest.raises(LedgerError, match="never started"):
        led.end_run("never", outcome="completed", counts={}, info={"deleted": []})


def test_runs_since_orders_and_filters(new_ledger: Callable[[], Ledger], clock: Clock) -> None:
    led = new_ledger()
    for run_id in ("r1", "r2", "r3"):
        led.start_run(run_id, command="move", info={})
        clock.now += 100
    assert [r.run_id for r in led.runs()] == ["r1", "r2", "r3"]
    assert [r.run_id for r in led.runs(since=clock.now - 200)] == ["r2", "r3"]
    assert led.runs(since=clock.now) == []
    clock.now -= 100
    led.start_run("r0", command="move", info={})  # starts with r3: ties go by run id
    assert [r.run_id for r in led.runs(since=clock.now)] == ["r0", "r3"]
    assert [r.run_id for r in led.runs(since=float("-inf"))] == ["r1", "r2", "r0", "r3"]


def test_liveness_by_heartbeat_and_lease(new_ledger: Callable[[], Ledger], clock: Clock) -> None:
    led = new_ledger()
    led.start_run("quiet", command="move", info={})
    clock.now += 1
    led.start_run("leased", command="move", info={})
    led.start_run("ended", command="move", info={})
    led.heartbeat("leased", lease_until=clock.now + 300)
    led.end_run("ended", outcome="interrupted", counts={})

    def live() -> list[str]:
        return [r.run_id for r in led.live_runs(stale_after=60)]

    assert live() == ["quiet", "leased"]
    clock.now += 58
    assert live() == ["quiet", "leased"]
    assert led.is_live("quiet", stale_after=60)
    clock.now += 2  # 61 s since the last heartbeat: stale
    assert live() == ["leased"]  # its lease still runs
    assert not led.is_live("quiet", stale_after=60)
    assert led.is_live("quiet", stale_after=120)
    assert led.is_live("leased", stale_after=60)
    clock.now += 300
    assert live() == []
    assert not led.is_live("leased", stale_after=60)
    assert not led.is_live("ended", stale_after=1e9)
    assert not led.is_live("unknown", stale_after=1e9)


def test_two_objects_on_one_store_see_each_other(new_ledger: Callable[[], Ledger]) -> None:
    first, second = new_ledger(), new_ledger()
    first.start_run("A", command="move", info={})
    second.start_run("B", command="move", info={})
    assert first.claim_many("A", claims("k")).won == {"k"}
    assert second.claim_many("B", claims("k")).won == frozenset()
    assert state(second, "k") == (KeyState.CLAIMED, "A")
    assert {r.run_id for r in second.runs()} == {"A", "B"}


def test_one_ledger_shared_by_threads(
    new_ledger: Callable[[], Ledger], monkeypatch: pytest.MonkeyPatch
) -> None:
    # moto's in-process Table.put_item reads the current item, evaluates the condition and
    # writes, with no lock: two threads can both pass attribute_not_exists (seen once in CI:
    # a key won twice). DynamoDB evaluates a condition atomically with its write; give moto
    # that property, so that what this test checks is the ledger's own logic.
    from moto.dynamodb.models.table import Table

    atomic = threading.Lock()
    put_item = Table.put_item

    def put_item_atomically(self: Table, *args: Any, **kwargs: Any) -> Any:
        with atomic:
            return put_item(self, *args, **kwargs)

    monkeypatch.setattr(Table, "put_item", put_item_atomically)
    led = new_ledger()
    keys = [f"k{i}" for i in range(100)]
    won: dict[str, list[str]] = {}

    def worker(run_id: str) -> None:
        mine: list[str] = []
        for i in range(0, len(keys), 10):
            mine += led.claim_many(run_id, claims(*keys[i : i + 10])).won
        won[run_id] = mine

    threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    all_won = [k for ks in won.values() for k in ks]
    assert sorted(all_won) == sorted(keys)


def test_closed_ledger_refuses_work(new_ledger: Callable[[], Ledger]) -> None:
    led = new_ledger()
    led.close()
    led.close()  # idempotent
    with pytest.raises(LedgerError, match="closed"):
        led.get_many(["k"])
