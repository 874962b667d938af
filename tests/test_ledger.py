"""The SQLite ledger's own: its file, schema and upgrades, opening by URI, processes racing on
one file (the contract both backends keep is test_ledger_contract.py)."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

import pytest
from moto import mock_aws
from test_ledger_contract import Clock, claims, one_line, state
from unprivileged import as_a_user, chown_to_the_user, users_dir

from redrive.errors import LedgerError
from redrive.ledger import (
    SCHEMA_VERSION,
    Claim,
    KeyState,
    SqliteLedger,
    default_ledger_path,
    open_ledger,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
Q = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"


@pytest.fixture
def clock() -> Clock:
    return Clock()


# ----------------------------------------------------------------------------- claims


# ----------------------------------------------------------------------------- transitions


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
    with SqliteLedger(path, group_commit=False) as led:
        conn = led._conn
        assert conn is not None
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30_000
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert led.location == f"sqlite://{path}"
    with SqliteLedger(path) as grouped:
        # The group writer waits for the write lock itself, as long (see test_ledger_group_commit)
        conn = grouped._conn
        assert conn is not None
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 0
        assert grouped._busy_timeout == 30.0
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


def test_read_only_file(tmp_path: Path) -> None:
    # Root ignores file permissions: as root (CI), the ledger is opened as a user.
    with users_dir(tmp_path) as home:
        path = home / "ledger.sqlite3"
        SqliteLedger(path).close()
        path.chmod(0o400)
        chown_to_the_user(path)
        with as_a_user(), pytest.raises(LedgerError, match="writable") as e:
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
        ("mysql://db/ledger", "unknown ledger URI 'mysql://db/ledger'"),
        ("mysql://u:pw@db/ledger", r"unknown ledger URI 'mysql://u:\*\*\*@db/ledger'"),
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
    random.Random(run_id).shuffle(batches)  # each worker its own order, the same every run
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


@pytest.mark.e2e
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
