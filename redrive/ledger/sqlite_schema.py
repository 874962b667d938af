"""The SQLite ledger's schema, and the upgrade of a file an older redrive wrote."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from redrive.errors import LedgerError

SCHEMA_VERSION = 3

# Keys are random (hashes, task ids): in a table ordered by key each batch's rows land on
# ~10 different pages, and its SENT and DONE updates rewrite all of them. Rows ordered by
# rowid sit together in claim order, so those updates touch a page or two; only the key
# index takes random inserts (schema 1 was keyed by key: ~30 % more ledger CPU per batch).
_KEYS_TABLE = """
CREATE TABLE keys (
    id              INTEGER PRIMARY KEY,
    key             TEXT NOT NULL UNIQUE,
    state           TEXT NOT NULL CHECK (state IN ('claimed', 'sent', 'done', 'skipped')),
    run_id          TEXT NOT NULL,
    task            TEXT NOT NULL,
    message_id      TEXT NOT NULL,
    target          TEXT NOT NULL,
    sent_message_id TEXT,
    updated_at      REAL NOT NULL,
    sent_at         REAL
)"""
_SCHEMA = f"""{_KEYS_TABLE};
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
CREATE TABLE meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
"""
# A ledger upgraded from schema 2 or older with keys in it: those keys have the legacy form.
LEGACY_KEYS = "legacy_keys"

_SCHEMA_2_KEY_COLUMNS = "key, state, run_id, task, message_id, target, sent_message_id, updated_at"


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Bring the file at ``path`` to SCHEMA_VERSION, inside the caller's write transaction:
    create the schema in an empty file, upgrade an older one, refuse anything else."""
    # Re-read under the write lock: another process may have created the schema meanwhile.
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == SCHEMA_VERSION:
        return
    if version > SCHEMA_VERSION:
        raise LedgerError(
            f"ledger {path} was written by a newer redrive (schema {version}, this "
            f"one knows {SCHEMA_VERSION}); upgrade redrive or use another ledger path"
        )
    if version == 1:
        _from_schema_1(conn)
        return
    if version == 2:
        _to_schema_3(conn, has_sent_at=False)
        return
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master")]
    if tables:
        raise LedgerError(
            f"{path} is a SQLite database but not a redrive ledger; "
            "move it aside or choose another ledger path"
        )
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")


def _from_schema_1(conn: sqlite3.Connection) -> None:
    # Schema 1 differs from 2 only in how keys are stored; copy them over, oldest first.
    conn.execute("DROP INDEX keys_by_run")
    conn.execute("ALTER TABLE keys RENAME TO keys_schema_1")
    conn.execute(_KEYS_TABLE)
    conn.execute(
        f"INSERT INTO keys ({_SCHEMA_2_KEY_COLUMNS}) SELECT {_SCHEMA_2_KEY_COLUMNS}"
        " FROM keys_schema_1 ORDER BY updated_at, key"
    )
    conn.execute("DROP TABLE keys_schema_1")
    conn.execute("CREATE INDEX keys_by_run ON keys (run_id)")
    _to_schema_3(conn, has_sent_at=True)


def _to_schema_3(conn: sqlite3.Connection, *, has_sent_at: bool) -> None:
    """Schema 3 adds when each key was sent, and remembers that the keys already there
    have the legacy form (they did not name the publish), so the engine looks them up."""
    if not has_sent_at:
        conn.execute("ALTER TABLE keys ADD COLUMN sent_at REAL")
    conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID")
    if conn.execute("SELECT 1 FROM keys LIMIT 1").fetchone() is not None:
        conn.execute("INSERT INTO meta (name, value) VALUES (?, '1')", (LEGACY_KEYS,))
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
