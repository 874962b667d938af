"""Opening a PostgreSQL ledger: its schema checked (or created and upgraded, by ``redrive
ledger init``), and the session's durability checked before any claim relies on it."""

from __future__ import annotations

from typing import Any

from redrive.errors import LedgerError
from redrive.ledger.postgres_schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    VERSION_TABLE,
    Durability,
    durability_verdict,
    schema_problem,
)
from redrive.ledger.postgres_writes import PgConnector

# Taken by `ledger init` for its transaction, so that two inits at once do not both create
# the tables (the second would fail on "already exists" instead of finding them).
_INIT_LOCK = 0x7265647269766531  # "redrive1"


def _schema_version(conn: Any) -> int | None:
    """The ledger's schema version (None: no ledger in this database / search path)."""
    exists = conn.execute("SELECT to_regclass(%s)", (VERSION_TABLE,)).fetchone()[0]
    if exists is None:
        return None
    row = conn.execute(f"SELECT max(version) FROM {VERSION_TABLE}").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def read_durability(conn: Any) -> Durability:
    setting = conn.execute("SHOW synchronous_commit").fetchone()[0]
    names = conn.execute("SHOW synchronous_standby_names").fetchone()[0]
    try:
        standbys: int | None = conn.execute("SELECT count(*) FROM pg_stat_replication").fetchone()[
            0
        ]
    except Exception:
        standbys = None  # not readable by this role: the settings alone decide
    return Durability(str(setting), str(names or ""), standbys)


def open_checked(connector: PgConnector) -> tuple[dict[str, str], tuple[str, ...]]:
    """Check the ledger at ``connector`` for a run: its schema is this redrive's, and its
    commits are durable. Returns its meta rows and the warnings to show (one line each)."""
    import psycopg

    conn = connector.connect(autocommit=True)
    try:
        problem = schema_problem(_schema_version(conn), connector.location)
        if problem is not None:
            raise LedgerError(problem)
        refusal, warning = durability_verdict(read_durability(conn), connector.location)
        if refusal is not None:
            raise LedgerError(refusal)
        meta = dict(conn.execute("SELECT name, value FROM redrive_meta").fetchall())
    except psycopg.Error as e:
        raise LedgerError(
            f"cannot open ledger {connector.location} ({connector.said(e)}); check the role's "
            "rights on the redrive_* tables"
        ) from None
    finally:
        conn.close()
    return meta, (() if warning is None else (warning,))


def init_schema(connector: PgConnector) -> str:
    """Create the ledger's tables, or bring an older schema up to date, in one transaction;
    what was done, as one line. A newer schema is refused."""
    import psycopg

    conn = connector.connect(autocommit=False)
    try:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_INIT_LOCK,))
        found = _schema_version(conn)
        if found is not None and found > SCHEMA_VERSION:
            problem = schema_problem(found, connector.location)
            raise LedgerError(str(problem))
        start = 0 if found is None else found
        for version in range(start + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
        if start < SCHEMA_VERSION:
            conn.execute(f"DELETE FROM {VERSION_TABLE}")
            conn.execute(f"INSERT INTO {VERSION_TABLE} (version) VALUES (%s)", (SCHEMA_VERSION,))
        conn.commit()
    except psycopg.Error as e:
        raise LedgerError(
            f"cannot create ledger {connector.location} ({connector.said(e)}); the role needs "
            "CREATE on the database's schema (only for `ledger init`)"
        ) from None
    finally:
        conn.close()
    if found is None:
        return f"the ledger is ready: {connector.location} (schema {SCHEMA_VERSION} created)"
    if found < SCHEMA_VERSION:
        return (
            f"the ledger is ready: {connector.location} "
            f"(schema {found} upgraded to {SCHEMA_VERSION})"
        )
    return f"the ledger is ready: {connector.location} (schema {SCHEMA_VERSION}, kept)"
