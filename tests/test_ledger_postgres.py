"""The PostgreSQL ledger's own: its URL and passwords, its versioned schema (``ledger
init``), the durability check at open, a connection lost mid-commit (in doubt), hosts racing
for one key, and copies from other ledgers (``ledger copy``). The contract every backend
keeps is test_ledger_contract.py; the server is the run's private one (tests/conftest.py).
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import Cli, Family, schema_url
from postgres_server import PostgresServer
from test_ledger_before_seam import FIXTURE, SameMessages
from test_ledger_contract import Clock, claims, one_line, state

from redrive.broker import resolve_target
from redrive.config import built_in_layout, parse_config
from redrive.errors import LedgerError
from redrive.ledger import KeyState, SqliteLedger, init_postgres, open_ledger
from redrive.ledger.copy import copy_ledger
from redrive.ledger.postgres import PostgresLedger
from redrive.ledger.postgres_schema import (
    SCHEMA_VERSION,
    Durability,
    durability_verdict,
    mask_url,
    scrub,
)
from redrive.operations.move import MoveEngine, MoveOptions

pytestmark = pytest.mark.e2e  # the run's PostgreSQL server

SECRET = "s3cr3t-pw"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def url(postgres_url: str) -> str:
    """This test's schema, the ledger created in it."""
    init_postgres(postgres_url)
    return postgres_url


def with_password(url: str) -> str:
    """The same URL with a password (the test server trusts loopback: any is let in)."""
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@", 1)


# ----------------------------------------------------------------------------- the URL


def test_the_password_is_masked_in_the_url_and_in_a_driver_message() -> None:
    url = f"postgresql://redrive:{SECRET}@db.internal:5432/ops?sslmode=verify-full"
    assert mask_url(url) == "postgresql://redrive:***@db.internal:5432/ops?sslmode=verify-full"
    query = f"postgresql://db/ops?user=redrive&password={SECRET}&sslmode=require"
    assert SECRET not in mask_url(query)
    assert "sslmode=require" in mask_url(query)
    assert mask_url("postgresql://redrive@db/ops") == "postgresql://redrive@db/ops"
    assert (
        scrub(f'FATAL: password "{SECRET}"\n  DETAIL: no', url)
        == 'FATAL: password "***" DETAIL: no'
    )


def test_no_message_of_a_ledger_with_a_password_shows_it(
    postgres_server: PostgresServer, postgres_schema: str, cli: Cli
) -> None:
    url = with_password(schema_url(postgres_server, postgres_schema))
    missing = cli("audit", "--ledger", url)
    assert missing.exit_code == 1
    assert "no redrive ledger in postgresql://postgres:***@" in missing.output
    made = cli.ok("ledger", "init", url)
    assert "schema 1 created" in made.output
    off = with_password(schema_url(postgres_server, postgres_schema, "synchronous_commit=off"))
    refused = cli("audit", "--ledger", off)
    assert "synchronous_commit is off" in refused.output and refused.exit_code == 1
    closed = url.replace(f":{postgres_server.port}/", ":1/")
    unreachable = cli("audit", "--ledger", closed)
    with pytest.raises(LedgerError) as e:
        open_ledger(closed)
    for result in (missing, made, refused, unreachable):
        assert SECRET not in result.output
    assert SECRET not in str(e.value) and "***" in one_line(e)
    assert "Traceback" not in unreachable.output and unreachable.exit_code == 1
    with closing(open_ledger(url)) as led:
        assert SECRET not in led.location and led.uri == url


# ----------------------------------------------------------------------------- the schema


def test_open_refuses_a_database_without_a_ledger_then_init_makes_it(postgres_url: str) -> None:
    with pytest.raises(LedgerError, match=r"no redrive ledger in .*ledger init") as e:
        PostgresLedger(postgres_url)
    one_line(e)
    assert "schema 1 created" in init_postgres(postgres_url)
    assert "schema 1, kept" in init_postgres(postgres_url)  # again: nothing changes
    with PostgresLedger(postgres_url) as led:
        led.start_run("A", command="move", info={})
        assert led.claim_many("A", claims("k")).won == {"k"}
    init_postgres(postgres_url)
    with PostgresLedger(postgres_url) as led:
        assert state(led, "k") == (KeyState.CLAIMED, "A")  # init keeps what is there


def test_a_newer_schema_is_refused_and_an_older_one_upgraded(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE redrive_schema_version SET version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(LedgerError, match="newer redrive") as e:
        PostgresLedger(url)
    one_line(e)
    with pytest.raises(LedgerError, match="newer redrive"):
        init_postgres(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE redrive_schema_version SET version = 0")
    with pytest.raises(LedgerError, match=r"has schema 0.*ledger init") as e:
        PostgresLedger(url)
    one_line(e)


def test_two_inits_at_once_both_succeed(postgres_url: str) -> None:
    answers: list[str] = []
    threads = [
        threading.Thread(target=lambda: answers.append(init_postgres(postgres_url)))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(a.rpartition("(")[2] for a in answers) == [
        "schema 1 created)",
        "schema 1, kept)",
        "schema 1, kept)",
    ]


# ----------------------------------------------------------------------------- durability


def test_synchronous_commit_off_is_refused_at_open(
    postgres_server: PostgresServer, postgres_schema: str, url: str
) -> None:
    off = schema_url(postgres_server, postgres_schema, "synchronous_commit=off")
    with pytest.raises(LedgerError, match="synchronous_commit is off") as e:
        PostgresLedger(off)
    one_line(e)
    local = schema_url(postgres_server, postgres_schema, "synchronous_commit=local")
    with PostgresLedger(local) as led:  # local without a standby: as durable as on
        assert led.warnings == ()


@pytest.mark.parametrize(
    ("setting", "names", "standbys", "refused", "warned"),
    [
        ("on", "", 0, False, False),
        ("on", "", None, False, False),  # pg_stat_replication not readable: settings decide
        ("off", "", 0, True, False),
        ("OFF", "s1", 1, True, False),
        ("local", "", 0, False, False),
        ("local", "FIRST 1 (s1)", 1, True, False),
        ("on", "", 2, False, True),  # asynchronous standbys: a failover could lose claims
        ("remote_write", "", 1, False, True),
        ("on", "s1", 1, False, False),
        ("remote_apply", "ANY 1 (s1, s2)", 2, False, False),
    ],
)
def test_the_durability_verdict(
    setting: str, names: str, standbys: int | None, refused: bool, warned: bool
) -> None:
    refusal, warning = durability_verdict(Durability(setting, names, standbys), "L")
    assert (refusal is not None, warning is not None) == (refused, warned)
    for line in (refusal, warning):
        assert line is None or ("\n" not in line and line.startswith("ledger L"))


# ----------------------------------------------------------------------------- lost connections


def _terminate(conn: psycopg.Connection[Any]) -> None:
    """End ``conn``'s server process from another session, as a failover or a network cut
    does: the next thing it sends fails."""
    pid = conn.info.backend_pid
    with psycopg.connect(conn.info.dsn + " password=x", autocommit=True) as other:
        other.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.fixture
def cut_at_commit(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The next COMMIT of a ledger's write connection goes out on a connection whose server
    process was just ended: the caller cannot know whether it committed."""
    cuts: list[int] = []
    commit = psycopg.Connection.commit

    def cut_then_commit(self: psycopg.Connection[Any]) -> None:
        if not cuts:
            cuts.append(self.info.backend_pid)
            _terminate(self)
        commit(self)

    monkeypatch.setattr(psycopg.Connection, "commit", cut_then_commit)
    yield cuts


def test_a_connection_lost_while_committing_a_claim_is_in_doubt(
    url: str, cut_at_commit: list[int]
) -> None:
    led = PostgresLedger(url, group_commit=False)
    cut_at_commit.append(0)  # not the start's commit
    led.start_run("A", command="move", info={})
    cut_at_commit.clear()
    with pytest.raises(LedgerError, match=r"lost while committing claim keys.*in doubt") as e:
        led.claim_many("A", claims("k1", "k2"))
    one_line(e)
    assert cut_at_commit
    # Never assumed either way: the ledger reconnects, and what the server kept stands
    # (here the server ended the transaction before its COMMIT: the keys are free).
    assert led.get_many(["k1", "k2"]) == {}
    assert led.claim_many("A", claims("k1")).won == {"k1"}
    led.close()


def test_a_connection_lost_before_the_commit_committed_nothing(url: str) -> None:
    with PostgresLedger(url) as led:
        led.start_run("A", command="move", info={})

        def lose_it(conn: psycopg.Connection[Any]) -> None:
            conn.execute("INSERT INTO redrive_meta (name, value) VALUES ('x', 'y')")
            _terminate(conn)
            conn.execute("SELECT 1")

        with pytest.raises(LedgerError, match="nothing of it was committed") as e:
            led._writes.submit("a write", lose_it)
        one_line(e)
        assert led.claim_many("A", claims("k")).won == {"k"}  # the next write reconnects
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM redrive_meta").fetchone() == (0,)


# ----------------------------------------------------------------------------- hosts racing


def test_hosts_claiming_the_same_keys_in_any_order_each_key_won_once(url: str) -> None:
    """Six ledger objects (six connections, as six hosts), each claiming the same 300 keys
    in its own order and batches: every key won exactly once, and no deadlock surfaces."""
    keys = [f"k{i:03}" for i in range(300)]
    won: dict[str, list[str]] = {}
    errors: list[BaseException] = []

    def host(n: int) -> None:
        import random

        order = keys[:]
        random.Random(n).shuffle(order)  # seeded: the same orders every run
        try:
            with PostgresLedger(url) as led:
                led.start_run(f"h{n}", command="move", info={})
                mine: list[str] = []
                for i in range(0, len(order), 25):
                    mine += led.claim_many(f"h{n}", claims(*order[i : i + 25])).won
                won[f"h{n}"] = mine
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=host, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    every = [k for ks in won.values() for k in ks]
    assert sorted(every) == keys


# ----------------------------------------------------------------------------- copies


def test_a_sqlite_ledger_copied_into_postgres_still_guards_every_key(
    url: str, tmp_path: Path, clock: Clock, cli: Cli
) -> None:
    source = tmp_path / "l.sqlite3"
    with SqliteLedger(source, clock=clock) as led:
        for run_id in ("A", "B"):
            led.start_run(run_id, command="move", info={"who": run_id})
        led.claim_many("A", claims(*(f"a{i}" for i in range(1200))))
        led.mark_sent_many("A", {f"a{i}": f"sqs-{i}" for i in range(600)})
        led.mark_done_many("A", [f"a{i}" for i in range(300)])
        led.claim_many("B", claims("b1", "b2"))
        led.mark_skipped_many("A", ["b2"])
        led.end_run("A", outcome="completed", counts={"moved": 600})
        led.end_run("B", outcome="failed", counts={})
        before = {e.key: e for s in KeyState for e in led.iter_keys(s)}
        runs = led.runs()
    copied = cli.ok("ledger", "copy", str(source), url)
    assert "copied 1202 keys and 2 runs" in copied.output
    with PostgresLedger(url, clock=clock) as led:
        assert {e.key: e for s in KeyState for e in led.iter_keys(s)} == before
        assert led.runs() == runs
        led.start_run("C", command="move", info={})
        assert led.claim_many("C", claims(*before)).won == frozenset()  # every key guarded
        assert list(led.iter_keys(KeyState.CLAIMED, run_id="B")) == [before["b1"]]
    again = cli.ok("ledger", "copy", str(source), url)
    assert "copied 0 keys and 0 runs" in again.output and "kept as they were" in again.output


def test_a_copy_keeps_that_the_keys_may_have_the_legacy_form(url: str, tmp_path: Path) -> None:
    with SqliteLedger(tmp_path / "l.sqlite3") as src, PostgresLedger(url) as dst:
        src.load_entries([], legacy_keys=True)  # as an upgrade from schema 2 records it
        assert not dst.legacy_keys
        copy_ledger(src, dst)
        assert dst.legacy_keys
    with PostgresLedger(url) as again:
        assert again.legacy_keys


def test_copy_is_refused_while_a_run_is_live_on_the_source(url: str, tmp_path: Path) -> None:
    with SqliteLedger(tmp_path / "l.sqlite3") as src, PostgresLedger(url) as dst:
        src.start_run("live", command="move", info={})
        with pytest.raises(LedgerError, match="run live is live") as e:
            copy_ledger(src, dst)
        one_line(e)
        assert dst.runs() == []


def test_postgres_copied_into_sqlite(url: str, tmp_path: Path, clock: Clock) -> None:
    with PostgresLedger(url, clock=clock) as led:
        led.start_run("A", command="move", info={})
        led.claim_many("A", claims("k1", "k2"))
        led.mark_sent_many("A", {"k1": "x"})
        led.end_run("A", outcome="interrupted", counts={})
        with SqliteLedger(tmp_path / "copy.sqlite3", clock=clock) as dst:
            result = copy_ledger(led, dst)
            assert (result.keys_copied, result.runs_copied) == (2, 1)
            assert state(dst, "k1") == (KeyState.SENT, "A")
            assert state(dst, "k2") == (KeyState.CLAIMED, "A")  # in doubt, as it was


def test_a_ledger_from_before_the_seam_copied_into_postgres_still_prevents_a_resend(
    url: str, family: Family, tmp_path: Path, cli: Cli
) -> None:
    """test_ledger_before_seam.py's ledger, copied: its legacy keys (and the flag that
    makes the engine look them up) come along, so the same messages are not sent again."""
    messages = json.loads((FIXTURE / "messages.json").read_text())
    shutil.copy(FIXTURE / "ledger.sqlite3", tmp_path / "ledger.sqlite3")
    cli.ok("ledger", "copy", str(tmp_path / "ledger.sqlite3"), url)
    for message in messages:
        family.send_to_dlq(message["body"])
    broker = SameMessages(family.client, {m["body"]: m["message_id"] for m in messages})
    target = resolve_target(built_in_layout({}), "checkout", lambda region: broker)
    with PostgresLedger(url) as ledger:
        result = MoveEngine(
            target,
            ledger,
            MoveOptions(execute=True, include_unknown=True),
            broker_factory=lambda: broker,
        ).run()
    assert (result.moved, result.in_doubt, result.failed) == (0, 0, 0)
    assert family.depth(family.queue_url) == (0, 0)  # nothing sent again
    assert family.depth() == (0, 0)


# ----------------------------------------------------------------------------- the config


def test_the_config_names_the_ledger_of_any_kind(url: str, tmp_path: Path, cli: Cli) -> None:
    layout = parse_config(
        {"families": {"f": {"queue": "q"}}, "ledger": {"url": url}}, "redrive.toml"
    )
    assert layout.ledger_url == url
    with PostgresLedger(url) as led:
        led.start_run("from-config", command="move", info={})
    config = tmp_path / "redrive.toml"
    config.write_text(f'[families.f]\nqueue = "q"\n\n[ledger]\nurl = "{url}"\n')
    listed = cli.ok("--config", str(config), "audit", "--json")
    assert [r["run_id"] for r in json.loads(listed.stdout)["runs"]] == ["from-config"]
    # --ledger (or REDRIVE_LEDGER) still wins over the config.
    other = cli.ok("--config", str(config), "audit", "--ledger", str(tmp_path / "x.sqlite3"))
    assert "no runs" in other.output


def test_a_server_streaming_to_asynchronous_standbys_is_a_warning_on_every_open(
    url: str, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the server says of its standbys, as a primary with two asynchronous ones would
    (pg_stat_replication's rows; this test server has none): every command that opens
    the ledger says so on stderr, once, and still runs."""
    from redrive.ledger import postgres_setup

    def two_async_standbys(conn: Any) -> Durability:
        return Durability("on", "", 2)

    monkeypatch.setattr(postgres_setup, "read_durability", two_async_standbys)
    listed = cli.ok("audit", "--ledger", url)
    assert listed.stderr.count("warning: ") == 1
    assert "2 asynchronous standby(s): a failover to one could lose" in listed.stderr
    assert "no runs recorded" in listed.stdout


# What docs/ledgers.md tells a DBA to grant the role redrive runs as (after `ledger init`
# as the tables' owner).
RUN_GRANTS = """
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON redrive_keys, redrive_runs TO {role};
GRANT SELECT, INSERT ON redrive_meta TO {role};
GRANT SELECT ON redrive_schema_version TO {role};
"""


def test_a_role_with_only_the_documented_grants_runs_but_cannot_init(
    postgres_server: PostgresServer, postgres_schema: str, url: str, clock: Clock
) -> None:
    role = f"r_{postgres_schema}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN')
        for statement in RUN_GRANTS.format(schema=postgres_schema, role=f'"{role}"').split(";"):
            if statement.strip():
                conn.execute(statement)
    as_role = schema_url(postgres_server, postgres_schema).replace(
        "postgresql://postgres@", f"postgresql://{role}@"
    )
    try:
        with PostgresLedger(as_role, clock=clock) as led:
            led.start_run("A", command="move", info={})
            assert led.claim_many("A", claims("k1", "k2")).won == {"k1", "k2"}
            led.mark_sent_many("A", {"k1": "x"})
            led.mark_done_many("A", ["k1"])
            led.release_many("A", ["k2"])
            led.heartbeat("A", lease_until=clock.now + 30)
            led.end_run("A", outcome="completed", counts={})
            led.start_run("B", command="move", info={})
            led.claim_many("B", claims("k3"))
            clock.now += 60
            assert led.mark_skipped_many("C", ["k3"]) == {"k3"}
            assert [e.key for e in led.iter_keys(KeyState.DONE)] == ["k1"]
            led.load_entries([], legacy_keys=True)  # a copy's destination
        # Where it may not create (PostgreSQL 15's public schema, for a role not its owner).
        public = schema_url(postgres_server, "public").replace(
            "postgresql://postgres@", f"postgresql://{role}@"
        )
        with pytest.raises(LedgerError, match=r"permission denied.*needs CREATE") as e:
            init_postgres(public)
        one_line(e)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')


def test_sessions_find_out_when_a_host_is_cut_off(url: str) -> None:
    """What bounds a partition's wait (without them, Linux waits two hours to call a silent
    connection dead): keepalives and tcp_user_timeout on every connection unless the URL
    sets its own, and the server ends a lost host's open transaction after a minute."""
    with PostgresLedger(url) as led:
        led.start_run("A", command="move", info={})
        conn = led._writes._conn
        assert conn is not None
        assert conn.info.get_parameters().get("application_name") == "redrive"
        assert "keepalives_idle=10" in conn.info.dsn and "tcp_user_timeout=30000" in conn.info.dsn
        shown = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        conn.rollback()
        assert shown == ("1min",)
    with PostgresLedger(url + "&keepalives_idle=3") as led:
        led.start_run("B", command="move", info={})
        assert led._writes._conn is not None
        assert "keepalives_idle=3" in led._writes._conn.info.dsn


def test_in_doubt_lists_a_dead_runs_claims_and_the_command_line_keeps_no_password(
    url: str, cli: Cli, family: Family
) -> None:
    an_hour_ago = time.time() - 3600  # the run died then: its lease is long over
    with PostgresLedger(url, clock=lambda: an_hour_ago) as led:
        led.start_run("dead", command="move", info={})
        led.claim_many("dead", claims("celery:t-1:0", "celery:t-2:0"))
    listed = cli("ledger", "in-doubt", "--ledger", url, "--json")
    assert listed.exit_code == 3
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [(r["key"], r["run_id"]) for r in rows] == [
        ("celery:t-1:0", "dead"),
        ("celery:t-2:0", "dead"),
    ]
    # A password given in the query (libpq takes one there too) is masked in the run's
    # record of its command line, as one in the user part is.
    queried = url + f"&password={SECRET}"
    family.send_to_dlq("not a celery task")
    moved = cli.ok(
        "move", "checkout", "--execute", "--yes", "--include-unknown", "--ledger", queried
    )
    assert SECRET not in moved.output

    with PostgresLedger(url) as led:
        run = next(r for r in led.runs() if r.run_id != "dead")
    assert SECRET not in json.dumps(run.info) and "password=***" in json.dumps(run.info)


def test_only_sent_and_done_are_committed_without_waiting_for_the_disk(url: str) -> None:
    """As SQLite's path: a claim (and a release, a takeover, a skip, a run's records) is on
    disk before the call returns; SENT and DONE need not be (lost, SENT reads as CLAIMED:
    in doubt, held; DONE has nothing left to do), and a group holding any flushed request
    is flushed whole."""
    show = "SHOW synchronous_commit"
    with PostgresLedger(url, group_commit=False) as led:
        assert led._writes.submit("x", lambda c: c.execute(show).fetchone()[0]) == "on"
        unflushed = led._writes.submit("x", lambda c: c.execute(show).fetchone()[0], flush=False)
        assert unflushed == "off"
        statements: list[str] = []
        real = psycopg.Connection.execute

        def record(self: psycopg.Connection[Any], query: Any, *args: Any, **kw: Any) -> Any:
            statements.append(str(query))
            return real(self, query, *args, **kw)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(psycopg.Connection, "execute", record)
            led.start_run("A", command="move", info={})
            led.claim_many("A", claims("k"))
            led.mark_sent_many("A", {"k": "s"})
            led.mark_done_many("A", ["k"])
        unflushed_ones = [q for q in statements if q == "SET LOCAL synchronous_commit = off"]
        assert len(unflushed_ones) == 2, statements  # mark sent, mark done: nothing else
