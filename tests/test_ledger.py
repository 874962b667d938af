from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing
from pathlib import Path

import pytest
from moto import mock_aws

from redrive.errors import LedgerError
from redrive.ledger import (
    MAX_KEY_LENGTH,
    SCHEMA_VERSION,
    Claim,
    ClaimResult,
    Entry,
    KeyState,
    Ledger,
    SqliteLedger,
    default_ledger_path,
    open_ledger,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
Q = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"


class Clock:
    """A hand-wound clock, so liveness tests do not sleep."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ledger(tmp_path: Path, clock: Clock) -> Iterator[SqliteLedger]:
    with SqliteLedger(tmp_path / "ledger.sqlite3", clock=clock) as led:
        for run_id in ("A", "B", "C"):
            led.start_run(run_id, command="move", info={})
        yield led


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


# ----------------------------------------------------------------------------- claims


def test_claim_absent_keys_wins_them_all(ledger: SqliteLedger, clock: Clock) -> None:
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


def test_claim_of_existing_key_returns_it_and_is_not_won(ledger: SqliteLedger) -> None:
    ledger.claim_many("A", claims("k1"))

    other = ledger.claim_many("B", claims("k1", "k2", message_prefix="other-"))
    assert other.won == {"k2"}
    assert other["k1"].run_id == "A"
    assert other["k1"].message_id == "m-k1"  # the first claim's details are kept

    again = ledger.claim_many("A", claims("k1"))  # "already mine", not "won now"
    assert again.won == frozenset()
    assert (again["k1"].state, again["k1"].run_id) == (KeyState.CLAIMED, "A")


def test_claim_of_sent_or_done_key_is_not_won(ledger: SqliteLedger) -> None:
    ledger.claim_many("A", claims("s", "d"))
    ledger.mark_sent_many("A", {"s": "sqs-1", "d": "sqs-2"})
    ledger.mark_done_many("A", ["d"])

    result = ledger.claim_many("B", claims("s", "d"))
    assert result.won == frozenset()
    assert result["s"].state is KeyState.SENT
    assert result["d"].state is KeyState.DONE


def test_duplicate_key_in_one_batch_first_copy_wins(ledger: SqliteLedger) -> None:
    batch = [Claim("k", "t", "copy-1", Q), Claim("k", "t", "copy-2", Q)]
    result = ledger.claim_many("A", batch)
    assert result.won == {"k"}
    assert len(result) == 1
    assert result["k"].message_id == "copy-1"


def test_claim_result_is_a_mapping_and_empty_batch_is_fine(ledger: SqliteLedger) -> None:
    empty = ledger.claim_many("A", [])
    assert isinstance(empty, Mapping)
    assert dict(empty) == {}
    assert empty.won == frozenset()


def test_key_length_is_checked(ledger: SqliteLedger) -> None:
    ledger.claim_many("A", claims("x" * MAX_KEY_LENGTH))
    with pytest.raises(ValueError, match=r"1\.\.128"):
        ledger.claim_many("A", claims("y" * (MAX_KEY_LENGTH + 1)))
    with pytest.raises(ValueError):
        ledger.claim_many("A", claims(""))


def test_get_many_leaves_out_absent_keys_and_handles_many(ledger: SqliteLedger) -> None:
    keys = [f"k{i}" for i in range(1200)]  # more than one IN (...) chunk
    result = ledger.claim_many("A", claims(*keys))
    assert len(result.won) == 1200
    got = ledger.get_many([*keys, "nope"])
    assert list(got) == keys
    assert ledger.get_many([]) == {}


# ----------------------------------------------------------------------------- transitions


def test_mark_sent_only_by_the_owner_of_a_claim(ledger: SqliteLedger, clock: Clock) -> None:
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


def test_the_time_of_the_send_is_kept_when_the_key_is_done(
    ledger: SqliteLedger, clock: Clock
) -> None:
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


def test_release_forgets_own_claims_only(ledger: SqliteLedger) -> None:
    ledger.claim_many("A", claims("k1", "k2", "k3"))
    ledger.mark_sent_many("A", {"k3": "sqs-3"})

    ledger.release_many("B", ["k1"])
    assert state(ledger, "k1") == (KeyState.CLAIMED, "A")

    ledger.release_many("A", ["k1", "k3", "absent"])
    assert state(ledger, "k1") is None
    assert state(ledger, "k3") == (KeyState.SENT, "A")  # sent is never released

    assert ledger.claim_many("B", claims("k1")).won == {"k1"}  # back to none: claimable


def test_mark_done_from_sent_by_any_run(ledger: SqliteLedger) -> None:
    ledger.claim_many("A", claims("k1", "k2"))
    ledger.mark_sent_many("A", {"k1": "sqs-1"})

    ledger.mark_done_many("B", ["k1", "k2", "absent"])
    done = ledger.get_many(["k1"])["k1"]
    assert (done.state, done.run_id, done.sent_message_id) == (KeyState.DONE, "A", "sqs-1")
    assert state(ledger, "k2") == (KeyState.CLAIMED, "A")  # never sent: not done

    ledger.mark_done_many("A", ["k1"])  # idempotent
    assert state(ledger, "k1") == (KeyState.DONE, "A")


def test_takeover_only_from_the_named_dead_run(ledger: SqliteLedger, clock: Clock) -> None:
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


def test_takeover_and_skip_refused_while_owner_lease_runs(
    ledger: SqliteLedger, clock: Clock
) -> None:
    ledger.claim_many("A", claims("k1", "k2"))
    ledger.heartbeat("A", lease_until=clock.now + 60)

    assert ledger.takeover_many("B", [("k1", "A")]) == set()
    ledger.mark_skipped_many("B", ["k2"])
    assert state(ledger, "k2") == (KeyState.CLAIMED, "A")

    clock.now += 61
    assert ledger.takeover_many("B", [("k1", "A")]) == {"k1"}


def test_mark_skipped_resolves_claims_of_dead_runs(ledger: SqliteLedger) -> None:
    ledger.claim_many("A", claims("k1", "k2"))
    ledger.claim_many("C", claims("mine"))
    ledger.mark_sent_many("A", {"k2": "sqs-2"})

    ledger.mark_skipped_many("C", ["k1", "k2", "mine", "absent"])
    assert state(ledger, "k1") == (KeyState.SKIPPED, "C")  # the run that decided owns it
    assert state(ledger, "k2") == (KeyState.SENT, "A")
    assert state(ledger, "mine") == (KeyState.CLAIMED, "C")  # own claim is not in doubt
    assert ledger.claim_many("B", claims("k1")).won == frozenset()

    # A run that ended (even without a lease running out) is dead.
    ledger.claim_many("B", claims("k3"))
    ledger.heartbeat("B", lease_until=1e12)
    ledger.end_run("B", outcome="failed", counts={})
    ledger.mark_skipped_many("C", ["k3"])
    assert state(ledger, "k3") == (KeyState.SKIPPED, "C")


def test_keys_for_run(ledger: SqliteLedger, clock: Clock) -> None:
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


# ----------------------------------------------------------------------------- runs


def test_runs_since(tmp_path: Path, clock: Clock) -> None:
    with SqliteLedger(tmp_path / "l.sqlite3", clock=clock) as led:
        for run_id in ("r1", "r2", "r3"):
            led.start_run(run_id, command="move", info={})
            clock.now += 100
        assert [r.run_id for r in led.runs()] == ["r1", "r2", "r3"]
        assert [r.run_id for r in led.runs(since=clock.now - 200)] == ["r2", "r3"]
        assert led.runs(since=clock.now) == []


# ----------------------------------------------------------------------------- files


def test_new_file_and_dirs_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    tmp_path.chmod(0o755)
    try:
        path = tmp_path / "a" / "b" / "ledger.sqlite3"
        with SqliteLedger(path) as led:
            led.start_run("r", command="move", info={})  # makes the -wal and -shm files
            for p in path.parent.iterdir():
                assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o700
        assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755  # not ours: left alone
    finally:
        os.umask(old)


def test_sqlite_settings(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    with SqliteLedger(path) as led:
        conn = led._conn
        assert conn is not None
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert led.location == f"sqlite://{path}"
    with SqliteLedger(path) as again:  # reopening keeps the data and the schema
        assert again.runs() == []


def test_reopen_keeps_entries(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    with SqliteLedger(path) as led:
        led.claim_many("A", claims("k"))
    with SqliteLedger(path) as led:
        assert state(led, "k") == (KeyState.CLAIMED, "A")


def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"these are my notes, not a database\n" * 200)
    with pytest.raises(LedgerError, match="not a SQLite database") as e:
        SqliteLedger(path)
    assert str(path) in one_line(e)


def test_foreign_sqlite_database(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.commit()
    with pytest.raises(LedgerError, match="not a redrive ledger") as e:
        SqliteLedger(path)
    assert str(path) in one_line(e)


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    SqliteLedger(path).close()
    with closing(sqlite3.connect(path)) as conn:
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(LedgerError, match="newer redrive") as e:
        SqliteLedger(path)
    one_line(e)


def test_unusable_paths(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="is a directory") as e:
        SqliteLedger(tmp_path)
    one_line(e)

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(LedgerError, match="cannot create or open") as e:
        SqliteLedger(blocker / "ledger.sqlite3")
    assert str(blocker) in one_line(e)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    SqliteLedger(path).close()
    path.chmod(0o400)
    with pytest.raises(LedgerError, match="writable") as e:
        SqliteLedger(path)
    one_line(e)


# ----------------------------------------------------------------------------- open_ledger


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for var in ("REDRIVE_LEDGER", "REDRIVE_STATE_DIR", "XDG_STATE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_default_ledger_path(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert default_ledger_path() == home / ".local/state/redrive/ledger.sqlite3"
    clean_env.setenv("XDG_STATE_HOME", "relative/is/ignored")
    assert default_ledger_path() == home / ".local/state/redrive/ledger.sqlite3"
    clean_env.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_ledger_path() == tmp_path / "xdg/redrive/ledger.sqlite3"
    clean_env.setenv("REDRIVE_STATE_DIR", str(tmp_path / "st"))
    assert default_ledger_path() == tmp_path / "st/ledger.sqlite3"


def test_open_ledger_default_and_env(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with closing(open_ledger(None)) as led:
        assert led.location == f"sqlite://{tmp_path}/home/.local/state/redrive/ledger.sqlite3"
    clean_env.setenv("REDRIVE_LEDGER", str(tmp_path / "env.sqlite3"))
    with closing(open_ledger(None)) as led:
        assert led.location == f"sqlite://{tmp_path}/env.sqlite3"
    clean_env.setenv("REDRIVE_LEDGER", "dynamodb://team-ledger")
    with mock_aws(), pytest.raises(LedgerError, match="ledger init dynamodb://team-ledger"):
        open_ledger(None)  # the DynamoDB ledger, whose table does not exist yet


def test_open_ledger_uri_forms(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.chdir(tmp_path)
    cases = {
        str(tmp_path / "plain.sqlite3"): tmp_path / "plain.sqlite3",
        "relative.sqlite3": tmp_path / "relative.sqlite3",
        f"sqlite://{tmp_path}/abs.sqlite3": tmp_path / "abs.sqlite3",
        "sqlite://sub/rel.sqlite3": tmp_path / "sub/rel.sqlite3",
        "SQLite://upper.sqlite3": tmp_path / "upper.sqlite3",
        "~/tilde.sqlite3": tmp_path / "home/tilde.sqlite3",
    }
    for uri, path in cases.items():
        with closing(open_ledger(uri)) as led:
            assert isinstance(led, SqliteLedger)
            assert led.location == f"sqlite://{path}", uri
        assert path.is_file()


@pytest.mark.parametrize(
    ("uri", "match"),
    [
        ("dynamodb://", "names no table"),
        ("postgres://db/ledger", "unknown ledger URI 'postgres://db/ledger'"),
        ("sqlite://", "names no file"),
        ("", "empty"),
    ],
)
def test_open_ledger_refusals(uri: str, match: str) -> None:
    with pytest.raises(LedgerError, match=match) as e:
        open_ledger(uri)
    msg = one_line(e)
    if "unknown" in match:
        assert "sqlite:///" in msg
        assert "dynamodb://TABLE" in msg


# ----------------------------------------------------------------------------- concurrency


_WORKER = textwrap.dedent(
    """
    import json, random, sys, time
    from pathlib import Path
    from redrive.ledger import Claim, SqliteLedger

    path, run_id = Path(sys.argv[1]), sys.argv[2]
    led = SqliteLedger(path)  # all workers create the same new file at once
    print("ready", flush=True)
    sys.stdin.readline()
    led.start_run(run_id, command="move", info={})
    keys = [f"task-{i}" for i in range(200)]
    batches = [keys[i : i + 10] for i in range(0, 200, 10)]
    random.shuffle(batches)
    won = []
    for batch in batches:
        result = led.claim_many(run_id, [Claim(k, "t", "m-" + k, "q") for k in batch])
        mine = sorted(result.won)
        # what the engine does next: send, then delete, each recorded
        led.mark_sent_many(run_id, {k: "sqs-" + run_id for k in mine})
        led.heartbeat(run_id, lease_until=time.time() + 30)
        led.mark_done_many(run_id, mine)
        won += mine
        time.sleep(0.001)  # let the others in between batches
    led.end_run(run_id, outcome="completed", counts={"moved": len(won)})
    led.close()
    print(json.dumps(won), flush=True)
    """
)


def test_processes_racing_for_the_same_keys(tmp_path: Path) -> None:
    path = tmp_path / "state" / "ledger.sqlite3"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(path), f"w{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(4)
    ]
    outputs: list[tuple[str, str, int]] = []
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready"
        for p in procs:  # start them together
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            out, err = p.communicate(timeout=60)
            outputs.append((out, err, p.returncode))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()

    won_by: dict[str, str] = {}
    for i, (out, err, rc) in enumerate(outputs):
        assert rc == 0, err
        assert "locked" not in err
        for key in json.loads(out):
            assert key not in won_by, f"{key} won by w{i} and {won_by[key]}"
            won_by[key] = f"w{i}"
    assert len(won_by) == 200

    with SqliteLedger(path) as led:
        entries = led.get_many(list(won_by))
        assert {e.state for e in entries.values()} == {KeyState.DONE}
        assert all(entries[k].run_id == run for k, run in won_by.items())
        assert all(entries[k].sent_message_id == f"sqs-{run}" for k, run in won_by.items())
        runs = led.runs()
        assert {r.outcome for r in runs} == {"completed"}
        assert sum(r.counts["moved"] for r in runs) == 200


SCHEMA_1 = """
CREATE TABLE keys (
    key             TEXT PRIMARY KEY,
    state           TEXT NOT NULL CHECK (state IN ('claimed', 'sent', 'done', 'skipped')),
    run_id          TEXT NOT NULL,
    task            TEXT NOT NULL,
    message_id      TEXT NOT NULL,
    target          TEXT NOT NULL,
    sent_message_id TEXT,
    updated_at      REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX keys_by_run ON keys (run_id);
CREATE TABLE runs (
    run_id       TEXT PRIMARY KEY,
    command      TEXT NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    lease_until  REAL NOT NULL,
    ended_at     REAL,
    outcome      TEXT,
    info         TEXT NOT NULL,
    counts       TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX runs_by_start ON runs (started_at);
"""


def test_a_schema_1_ledger_is_upgraded_in_place_keeping_every_key(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA_1)
    conn.execute(
        "INSERT INTO runs VALUES ('r-old', 'move', 1.0, 2.0, 3.0, 4.0, 'completed', '{}', '{}')"
    )
    conn.executemany(
        "INSERT INTO keys VALUES (?, ?, 'r-old', 't', ?, 'url', ?, ?)",
        [
            ("k-sent", "sent", "m1", "s1", 2.0),
            ("k-done", "done", "m2", "s2", 1.0),
            ("k-claimed", "claimed", "m3", None, 3.0),
        ],
    )
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()

    with SqliteLedger(path) as ledger:
        entries = ledger.get_many(["k-sent", "k-done", "k-claimed"])
        assert {k: (e.state, e.sent_message_id) for k, e in entries.items()} == {
            "k-sent": (KeyState.SENT, "s1"),
            "k-done": (KeyState.DONE, "s2"),
            "k-claimed": (KeyState.CLAIMED, None),
        }
        assert [e.key for e in ledger.keys_for_run("r-old")] == ["k-done", "k-sent", "k-claimed"]
        run = ledger.run("r-old")
        assert run is not None and run.outcome == "completed"
        ledger.start_run("r-new", command="move", info={})
        won = ledger.claim_many(
            "r-new", [Claim("k-sent", "t", "m9", "url"), Claim("k-new", "t", "m8", "url")]
        )
        assert won.won == frozenset({"k-new"})
        assert ledger.legacy_keys  # its keys have the form before keys named the publish
        assert ledger.get_many(["k-sent"])["k-sent"].sent_at is None  # not recorded then
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()


SCHEMA_2 = """
CREATE TABLE keys (
    id              INTEGER PRIMARY KEY,
    key             TEXT NOT NULL UNIQUE,
    state           TEXT NOT NULL CHECK (state IN ('claimed', 'sent', 'done', 'skipped')),
    run_id          TEXT NOT NULL,
    task            TEXT NOT NULL,
    message_id      TEXT NOT NULL,
    target          TEXT NOT NULL,
    sent_message_id TEXT,
    updated_at      REAL NOT NULL
);
CREATE INDEX keys_by_run ON keys (run_id);
CREATE TABLE runs (
    run_id       TEXT PRIMARY KEY,
    command      TEXT NOT NULL,
    started_at   REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    lease_until  REAL NOT NULL,
    ended_at     REAL,
    outcome      TEXT,
    info         TEXT NOT NULL,
    counts       TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX runs_by_start ON runs (started_at);
"""


def schema_2_ledger(
    path: Path, keys: Sequence[tuple[str, str, str, str, str, str, str | None, float]] = ()
) -> Path:
    """A ledger as redrive wrote it before schema 3, holding ``keys``: (key, state, run_id,
    task, message_id, target, sent_message_id, updated_at); their run has ended."""
    conn = sqlite3.connect(path)
    try:
        conn.executescript(SCHEMA_2)
        for run_id in sorted({k[2] for k in keys}):
            conn.execute(
                "INSERT INTO runs VALUES (?, 'move', 1.0, 2.0, 3.0, 4.0, 'failed', '{}', '{}')",
                (run_id,),
            )
        conn.executemany(
            "INSERT INTO keys (key, state, run_id, task, message_id, target, sent_message_id,"
            " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            keys,
        )
        conn.execute("PRAGMA user_version=2")
        conn.commit()
    finally:
        conn.close()
    return path


def test_a_schema_2_ledger_is_upgraded_in_place_and_says_it_holds_legacy_keys(
    tmp_path: Path, clock: Clock
) -> None:
    path = schema_2_ledger(
        tmp_path / "old.sqlite3",
        [
            ("k-sent", "sent", "r-old", "t", "m1", "url", "s1", 2.0),
            ("k-claimed", "claimed", "r-old", "t", "m2", "url", None, 3.0),
        ],
    )
    with SqliteLedger(path, clock=clock) as ledger:
        assert ledger.legacy_keys
        entries = ledger.get_many(["k-sent", "k-claimed"])
        assert {k: (e.state, e.sent_message_id, e.sent_at) for k, e in entries.items()} == {
            "k-sent": (KeyState.SENT, "s1", None),
            "k-claimed": (KeyState.CLAIMED, None, None),
        }
        ledger.start_run("r-new", command="move", info={})
        assert ledger.claim_many("r-new", [Claim("k-new", "t", "m3", "url")]).won == {"k-new"}
        ledger.mark_sent_many("r-new", {"k-new": "s3"})
        assert ledger.get_many(["k-new"])["k-new"].sent_at == clock.now
    with SqliteLedger(path) as again:  # the flag outlives the upgrade
        assert again.legacy_keys
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_only_ledgers_that_held_keys_before_schema_3_have_legacy_keys(tmp_path: Path) -> None:
    with SqliteLedger(tmp_path / "new.sqlite3") as new:
        assert not new.legacy_keys
    with SqliteLedger(schema_2_ledger(tmp_path / "empty.sqlite3")) as empty:
        assert not empty.legacy_keys
