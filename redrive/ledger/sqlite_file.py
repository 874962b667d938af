"""The SQLite ledger's file: creating it, connecting to it, setting it up, and saying
SQLite's errors about it as one-line LedgerErrors."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

from redrive.errors import LedgerError
from redrive.ledger.sqlite_schema import LEGACY_KEYS, SCHEMA_VERSION, migrate
from redrive.state_dir import make_dirs

# Long enough to ride out another operator's batch and a WAL checkpoint, short enough that a
# truly stuck holder surfaces as an error instead of a silent hang.
BUSY_TIMEOUT_S = 30.0


class LedgerFile:
    """One ledger file at ``path`` (absolute): its connections, its schema, its errors."""

    def __init__(self, path: Path, *, busy_timeout: float = BUSY_TIMEOUT_S) -> None:
        self.path = path
        self.location = f"sqlite://{path}"
        self.busy_timeout = busy_timeout

    def open(self, *, writer_waits_itself: bool) -> tuple[sqlite3.Connection, bool]:
        """Create the file if need be and bring its schema up to date; return the write
        connection and whether the file holds keys of the legacy form.

        ``writer_waits_itself``: the caller retries each BEGIN IMMEDIATE itself, so the
        connection gets no busy timeout of its own.
        """
        self._create()
        conn = self.connect()
        try:
            self._prepare(conn)
            legacy_keys = self._read_legacy_flag(conn)
            if writer_waits_itself:
                # Only the writer uses this connection from here on, always first through a
                # BEGIN IMMEDIATE that it retries itself, for as long: SQLite's busy handler
                # would sleep in steps of up to 100 ms instead. Once the write lock is held
                # (WAL), no statement of the transaction waits for another.
                conn.execute("PRAGMA busy_timeout = 0")
        except sqlite3.Error as e:
            conn.close()
            raise self._open_error(e) from None
        except BaseException:
            conn.close()
            raise
        return conn, legacy_keys

    def connect(self) -> sqlite3.Connection:
        try:
            # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so the sqlite3 module
            # never opens a deferred transaction behind our back.
            return sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,  # the ledger's locks serialise use instead
            )
        except sqlite3.Error as e:
            raise self._open_error(e) from None

    @contextlib.contextmanager
    def guarded(self, conn: sqlite3.Connection, what: str) -> Iterator[None]:
        """Roll back whatever is open on failure, and say what failed as a LedgerError."""
        try:
            yield
        except BaseException as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                raise self.op_error(what, e) from e
            raise

    def op_error(self, what: str, e: sqlite3.Error) -> LedgerError:
        msg = str(e)
        if "locked" in msg or "busy" in msg:
            return LedgerError(
                f"ledger {self.location} stayed locked by another process for "
                f"{self.busy_timeout:g} s ({what}); check for a stuck redrive, then retry"
            )
        return LedgerError(
            f"ledger {self.location}: {what} failed ({msg}); check free space and "
            "permissions of the ledger file, then retry"
        )

    def _create(self) -> None:
        try:
            make_dirs(self.path.parent)
            # Created here, not by sqlite, so the mode is 0600 from the first byte; SQLite
            # gives its -wal and -shm files the same mode as the database file.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
        except IsADirectoryError:
            raise LedgerError(
                f"ledger path {self.path} is a directory; give a file path inside it"
            ) from None
        except OSError as e:
            reason = e.strerror or str(e)
            raise LedgerError(
                f"cannot create or open ledger {self.path} ({reason}); "
                "make it and its directory writable by you, or choose another ledger path"
            ) from None
        if not stat.S_ISREG(os.stat(self.path).st_mode):
            raise LedgerError(f"ledger path {self.path} is not a regular file; choose a file path")

    def _open_error(self, e: sqlite3.Error) -> LedgerError:
        msg = str(e)
        if isinstance(e, sqlite3.DatabaseError) and "not a database" in msg:
            return LedgerError(
                f"{self.path} is not a SQLite database, so not a redrive ledger; "
                "move it aside or choose another ledger path"
            )
        if "readonly" in msg or "unable to open" in msg:
            return LedgerError(
                f"cannot write ledger {self.path} ({msg}); make the file and its directory "
                "writable by you, or choose another ledger path"
            )
        if "locked" in msg or "busy" in msg:
            return LedgerError(
                f"ledger {self.path} stayed locked for {self.busy_timeout:.0f} s while opening; "
                "check for a stuck redrive process, then retry"
            )
        return LedgerError(
            f"cannot open ledger {self.path} ({msg}); move it aside or choose another ledger path"
        )

    def _prepare(self, conn: sqlite3.Connection) -> None:
        try:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if mode != "wal":
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise LedgerError(
                    f"ledger {self.path} cannot use SQLite's WAL journal (got {mode!r}); "
                    "put it on a local filesystem"
                )
            conn.execute("PRAGMA synchronous=FULL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version != SCHEMA_VERSION:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    migrate(conn, self.path)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
        except sqlite3.Error as e:
            raise self._open_error(e) from None

    def _read_legacy_flag(self, conn: sqlite3.Connection) -> bool:
        try:
            row = conn.execute("SELECT value FROM meta WHERE name = ?", (LEGACY_KEYS,)).fetchone()
        except sqlite3.Error as e:
            raise self._open_error(e) from None
        return row is not None
