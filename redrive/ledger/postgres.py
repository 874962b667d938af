"""The ledger in a PostgreSQL database, shared by operators on any number of machines.

``postgresql://USER:PASSWORD@HOST:PORT/DATABASE`` (or ``postgres://``), as libpq reads it:
``?sslmode=verify-full&sslrootcert=...`` for TLS, ``?options=-csearch_path%3Dredrive`` for
a schema of its own. ``redrive ledger init URL`` creates the tables (:mod:`.postgres_schema`);
runs only read and write rows (SELECT, INSERT, UPDATE, DELETE on the ``redrive_*`` tables).

Safety, as SQLite's and DynamoDB's:

- every write is one transaction, committed before the call returns, on a session whose
  ``synchronous_commit`` is checked at open (:func:`durability_verdict`): a claim is
  durable before its send;
- a claim is ``INSERT ... ON CONFLICT (key) DO NOTHING``: two hosts claiming one key meet in
  its unique index, the second waits for the first's commit and loses (never a read, then a
  write); the keys of a batch are inserted in sorted order, so two batches cannot deadlock;
- every transition is an UPDATE conditional on the row's state and owner; takeover and skip
  also on the owner's lease, read in the same statement;
- a connection lost while COMMIT was under way is in doubt, said so, never assumed.

Thread safety as SQLite's: writes are group-committed (:mod:`.group_commit`) on one
connection, reads have another.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from redrive.errors import LedgerError
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
    claimed_entry,
    keyset_pages,
    ledger_closed,
    run_not_open,
)
from redrive.ledger.postgres_schema import LEGACY_KEYS, mask_url
from redrive.ledger.postgres_setup import open_checked
from redrive.ledger.postgres_writes import PgConnector, PgReads, PgWrites

_KEY_COLUMNS = "key, state, run_id, task, message_id, target, sent_message_id, updated_at, sent_at"
_RUN_COLUMNS = (
    "run_id, command, started_at, heartbeat_at, lease_until, ended_at, outcome, info, counts"
)
# As SQLite's: a run inside its lease may be between a claim and its send, so the ledger
# itself refuses to hand its keys to anyone else until the lease ends.
_OWNER_NOT_LEASED = """NOT EXISTS (
    SELECT 1 FROM redrive_runs r
    WHERE r.run_id = redrive_keys.run_id AND r.ended_at IS NULL AND r.lease_until > %(now)s
)"""
# A claim that found its key taken reads the holder's row; one released in between (gone
# by the read) is claimed again, this many times at most.
_CLAIM_ROUNDS = 10


def _entry(row: Sequence[Any]) -> Entry:
    key, state, run_id, task, message_id, target, sent_message_id, updated_at, sent_at = row
    return Entry(
        key=key,
        state=KeyState(state),
        run_id=run_id,
        task=task,
        message_id=message_id,
        target=target,
        sent_message_id=sent_message_id,
        updated_at=updated_at,
        sent_at=sent_at,
    )


def _run_info(row: Sequence[Any]) -> RunInfo:
    run_id, command, started_at, heartbeat_at, lease_until, ended_at, outcome, info, counts = row
    return RunInfo(
        run_id=run_id,
        command=command,
        started_at=started_at,
        heartbeat_at=heartbeat_at,
        lease_until=lease_until,
        ended_at=ended_at,
        outcome=outcome,
        info=json.loads(info),
        counts=json.loads(counts),
    )


def _select_keys(conn: Any, keys: Sequence[str]) -> dict[str, Entry]:
    rows = conn.execute(
        f"SELECT {_KEY_COLUMNS} FROM redrive_keys WHERE key = ANY(%s)", (list(keys),)
    ).fetchall()
    return {row[0]: _entry(row) for row in rows}


class PostgresLedger(Ledger):
    """The ledger in the ``redrive_*`` tables of one PostgreSQL database (module docstring).

    ``location`` is the URL with its password masked (every message says it); ``uri`` is
    the URL itself, for the processes of ``--processes`` to open it again."""

    warnings: tuple[str, ...]

    def __init__(
        self,
        url: str,
        *,
        clock: Callable[[], float] = time.time,
        group_commit: bool = True,
    ) -> None:
        self._url = url
        self.location = mask_url(url)
        self._clock = clock
        connector = PgConnector(url, self.location)
        meta, self.warnings = open_checked(connector)
        self.legacy_keys = meta.get(LEGACY_KEYS) == "1"
        self._reads = PgReads(connector)
        self._writes = PgWrites(connector, group_commit=group_commit)

    @property
    def uri(self) -> str:
        return self._url

    def close(self) -> None:
        self._writes.close()
        self._reads.close()

    def __repr__(self) -> str:
        return f"PostgresLedger({self.location!r})"

    def group_stats(self) -> dict[str, int] | None:
        group = self._writes.group
        return None if group is None else {"groups": group.groups, "requests": group.requests}

    # ----------------------------------------------------------------- runs

    def start_run(self, run_id: str, *, command: str, info: Mapping[str, Any]) -> None:
        now = self._clock()
        info_json = json.dumps(dict(info), sort_keys=True, default=str)

        def apply(conn: Any) -> None:
            cur = conn.execute(
                "INSERT INTO redrive_runs (run_id, command, started_at, heartbeat_at,"
                " lease_until, info, counts) VALUES (%s, %s, %s, %s, %s, %s, '{}')"
                " ON CONFLICT (run_id) DO NOTHING",
                (run_id, command, now, now, now, info_json),
            )
            if cur.rowcount != 1:
                raise LedgerError(
                    f"run {run_id} already exists in ledger {self.location}; "
                    "start the run again with a new run id"
                )

        self._writes.submit("start run", apply)

    def heartbeat(self, run_id: str, *, lease_until: float) -> None:
        now = self._clock()

        def apply(conn: Any) -> None:
            cur = conn.execute(
                "UPDATE redrive_runs SET heartbeat_at = %s, lease_until = %s"
                " WHERE run_id = %s AND ended_at IS NULL",
                (now, lease_until, run_id),
            )
            if cur.rowcount != 1:
                raise run_not_open(run_id, self.location)

        self._writes.submit("heartbeat", apply)

    def end_run(
        self,
        run_id: str,
        *,
        outcome: str,
        counts: Mapping[str, int],
        info: Mapping[str, Any] | None = None,
    ) -> None:
        check_outcome(outcome)
        counts_json = json.dumps(dict(counts), sort_keys=True)
        extra = dict(info) if info else None
        now = self._clock()

        def apply(conn: Any) -> None:
            row = conn.execute(
                "SELECT info, ended_at FROM redrive_runs WHERE run_id = %s FOR UPDATE", (run_id,)
            ).fetchone()
            if row is None:
                raise LedgerError(
                    f"run {run_id} is not in ledger {self.location}; "
                    "it was never started there (check the ledger URL)"
                )
            if row[1] is not None:
                return  # the first ending stands
            info_json = (
                json.dumps({**json.loads(row[0]), **extra}, sort_keys=True, default=str)
                if extra
                else row[0]
            )
            conn.execute(
                "UPDATE redrive_runs SET ended_at = %s, outcome = %s, counts = %s, info = %s"
                " WHERE run_id = %s AND ended_at IS NULL",
                (now, outcome, counts_json, info_json, run_id),
            )

        self._writes.submit("end run", apply)

    def run(self, run_id: str) -> RunInfo | None:
        rows = self._reads.fetch(
            "read run", f"SELECT {_RUN_COLUMNS} FROM redrive_runs WHERE run_id = %s", (run_id,)
        )
        return _run_info(rows[0]) if rows else None

    def runs(self, since: float | None = None) -> list[RunInfo]:
        """Runs started at or after ``since`` (all when None), oldest first."""
        rows = self._reads.fetch(
            "list runs",
            f"SELECT {_RUN_COLUMNS} FROM redrive_runs WHERE started_at >= %s"
            " ORDER BY started_at, run_id",
            (float("-inf") if since is None else since,),
        )
        return [_run_info(r) for r in rows]

    def live_runs(self, *, stale_after: float) -> list[RunInfo]:
        now = self._clock()
        rows = self._reads.fetch(
            "list live runs",
            f"SELECT {_RUN_COLUMNS} FROM redrive_runs WHERE ended_at IS NULL"
            " AND (heartbeat_at > %s OR lease_until > %s) ORDER BY started_at, run_id",
            (now - stale_after, now),
        )
        return [_run_info(r) for r in rows]

    def is_live(self, run_id: str, *, stale_after: float) -> bool:
        info = self.run(run_id)
        return info is not None and info.is_live(now=self._clock(), stale_after=stale_after)

    # ----------------------------------------------------------------- keys

    def get_many(self, keys: Sequence[str]) -> dict[str, Entry]:
        """Entries for those of ``keys`` the ledger has, in the order of ``keys``."""
        unique = list(dict.fromkeys(keys))
        if not unique:
            return {}
        rows = self._reads.fetch(
            "read keys",
            f"SELECT {_KEY_COLUMNS} FROM redrive_keys WHERE key = ANY(%s)",
            (unique,),
        )
        found = {row[0]: _entry(row) for row in rows}
        return {k: found[k] for k in unique if k in found}

    def keys_for_run(self, run_id: str) -> list[Entry]:
        rows = self._reads.fetch(
            "read keys of run",
            f"SELECT {_KEY_COLUMNS} FROM redrive_keys WHERE run_id = %s ORDER BY updated_at, key",
            (run_id,),
        )
        return [_entry(r) for r in rows]

    def iter_keys(
        self, state: KeyState, *, run_id: str | None = None, page_size: int = KEY_PAGE
    ) -> Iterator[Entry]:
        """Keys in ``state`` (of ``run_id`` only, when given), in the order of their claims,
        ``page_size`` rows per read."""
        check_page_size(page_size)
        return self._key_pages(KeyState(state), run_id, page_size)

    def _key_pages(self, state: KeyState, run_id: str | None, size: int) -> Iterator[Entry]:
        where = "state = %s AND id > %s" + (" AND run_id = %s" if run_id is not None else "")
        query = f"SELECT id, {_KEY_COLUMNS} FROM redrive_keys WHERE {where} ORDER BY id LIMIT %s"

        def page(after: int) -> list[Any]:
            params = (str(state), after, *(() if run_id is None else (run_id,)), size)
            return self._reads.fetch("list keys", query, params)

        return keyset_pages(page, size, _entry)

    def claim_many(self, run_id: str, claims: Sequence[Claim]) -> ClaimResult:
        """Claim each absent key for ``run_id`` (the first claim of a key twice in
        ``claims`` wins); see :class:`ClaimResult` for the answer."""
        for claim in claims:
            check_key(claim.key)
        now = self._clock()
        first: dict[str, Claim] = {}
        for claim in claims:
            first.setdefault(claim.key, claim)

        def apply(conn: Any) -> ClaimResult:
            won: dict[str, Entry] = {}
            present: dict[str, Entry] = {}
            todo = sorted(first)  # one order for every batch: no two wait on each other
            for _ in range(_CLAIM_ROUNDS):
                won.update(_insert_claims(conn, run_id, [first[k] for k in todo], now))
                lost = [k for k in todo if k not in won]
                present.update(_select_keys(conn, lost))
                todo = [k for k in lost if k not in present]
                if not todo:
                    break
            else:
                raise LedgerError(
                    f"ledger {self.location}: keys were claimed and released again "
                    f"{_CLAIM_ROUNDS} times while this run claimed them; retry"
                )
            entries = {k: present.get(k) or won[k] for k in first}
            return ClaimResult(entries=entries, won=frozenset(won))

        return self._writes.submit("claim keys", apply)

    def takeover_many(self, run_id: str, keys_and_old_runs: Sequence[tuple[str, str]]) -> set[str]:
        """Each key still CLAIMED by its named old run, whose lease has run out, -> claimed
        by ``run_id``; returns the keys taken."""
        now = self._clock()
        pairs = sorted({(k, old) for k, old in keys_and_old_runs if old != run_id})

        def apply(conn: Any) -> set[str]:
            if not pairs:
                return set()
            rows = conn.execute(
                "UPDATE redrive_keys SET run_id = %(run)s, updated_at = %(now)s"
                " FROM unnest(%(keys)s::text[], %(olds)s::text[]) AS p(key, old)"
                " WHERE redrive_keys.key = p.key AND redrive_keys.run_id = p.old"
                f" AND redrive_keys.state = 'claimed' AND {_OWNER_NOT_LEASED}"
                " RETURNING redrive_keys.key",
                {
                    "run": run_id,
                    "now": now,
                    "keys": [k for k, _ in pairs],
                    "olds": [o for _, o in pairs],
                },
            ).fetchall()
            return {r[0] for r in rows}

        return self._writes.submit("take over keys", apply)

    def mark_sent_many(self, run_id: str, sent: Mapping[str, str]) -> None:
        """CLAIMED by ``run_id`` -> SENT, recording the id the broker gave the copy."""
        now = self._clock()
        pairs = sorted(sent.items())
        self._update(
            "mark keys sent",
            "UPDATE redrive_keys SET state = 'sent', sent_message_id = p.sent,"
            " updated_at = %(now)s, sent_at = %(now)s"
            " FROM unnest(%(keys)s::text[], %(sents)s::text[]) AS p(key, sent)"
            " WHERE redrive_keys.key = p.key AND state = 'claimed' AND run_id = %(run)s",
            {
                "now": now,
                "run": run_id,
                "keys": [k for k, _ in pairs],
                "sents": [s for _, s in pairs],
            },
            bool(pairs),
            flush=False,
        )

    def release_many(self, run_id: str, keys: Sequence[str]) -> None:
        """The send failed: forget keys still CLAIMED by ``run_id``."""
        unique = sorted(set(keys))
        self._update(
            "release keys",
            "DELETE FROM redrive_keys WHERE key = ANY(%(keys)s) AND state = 'claimed'"
            " AND run_id = %(run)s",
            {"keys": unique, "run": run_id},
            bool(unique),
            flush=True,
        )

    def mark_done_many(self, run_id: str, keys: Sequence[str]) -> None:
        """SENT -> DONE, by any run; the owner stays the run that sent."""
        unique = sorted(set(keys))
        self._update(
            "mark keys done",
            "UPDATE redrive_keys SET state = 'done', updated_at = %(now)s"
            " WHERE key = ANY(%(keys)s) AND state = 'sent'",
            {"keys": unique, "now": self._clock()},
            bool(unique),
            flush=False,
        )

    def mark_skipped_many(self, run_id: str, keys: Sequence[str]) -> set[str]:
        """CLAIMED by another run whose lease has run out -> SKIPPED, owned by ``run_id``;
        returns the keys marked."""
        now = self._clock()
        unique = sorted(set(keys))

        def apply(conn: Any) -> set[str]:
            if not unique:
                return set()
            rows = conn.execute(
                "UPDATE redrive_keys SET state = 'skipped', run_id = %(run)s,"
                " updated_at = %(now)s WHERE key = ANY(%(keys)s) AND state = 'claimed'"
                f" AND run_id <> %(run)s AND {_OWNER_NOT_LEASED} RETURNING key",
                {"run": run_id, "now": now, "keys": unique},
            ).fetchall()
            return {r[0] for r in rows}

        return self._writes.submit("mark keys skipped", apply)

    # ----------------------------------------------------------------- copies

    def load_runs(self, runs: Sequence[RunInfo]) -> int:
        """Insert each run absent here, as it stands (a copy); the number inserted."""
        rows = [
            (
                r.run_id,
                r.command,
                r.started_at,
                r.heartbeat_at,
                r.lease_until,
                r.ended_at,
                r.outcome,
                json.dumps(r.info, sort_keys=True, default=str),
                json.dumps(r.counts, sort_keys=True),
            )
            for r in runs
        ]

        def apply(conn: Any) -> int:
            inserted = 0
            with conn.cursor() as cur:
                for row in rows:
                    cur.execute(
                        f"INSERT INTO redrive_runs ({_RUN_COLUMNS}) VALUES"
                        " (%s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING",
                        row,
                    )
                    inserted += cur.rowcount
            return inserted

        return self._writes.submit("copy runs", apply)

    def load_entries(self, entries: Sequence[Entry], *, legacy_keys: bool) -> int:
        """Insert each key absent here, as it stands (a copy); the number inserted."""
        columns = [list(c) for c in zip(*[_entry_row(e) for e in entries], strict=True)]

        def apply(conn: Any) -> int:
            if legacy_keys:
                conn.execute(
                    "INSERT INTO redrive_meta (name, value) VALUES (%s, '1')"
                    " ON CONFLICT (name) DO NOTHING",
                    (LEGACY_KEYS,),
                )
            if not entries:
                return 0
            rows = conn.execute(
                f"INSERT INTO redrive_keys ({_KEY_COLUMNS}) SELECT * FROM unnest("
                "%s::text[], %s::text[], %s::text[], %s::text[], %s::text[], %s::text[],"
                " %s::text[], %s::float8[], %s::float8[]) ON CONFLICT (key) DO NOTHING"
                " RETURNING key",
                columns,
            ).fetchall()
            return len(rows)

        inserted = self._writes.submit("copy keys", apply)
        self.legacy_keys = self.legacy_keys or legacy_keys
        return inserted

    def _update(
        self, what: str, sql: str, params: Mapping[str, Any], any_rows: bool, *, flush: bool
    ) -> None:
        if not any_rows:
            if self._writes.closed:
                raise ledger_closed(self.location)
            return
        self._writes.submit(what, lambda conn: conn.execute(sql, params).close(), flush=flush)


def _entry_row(e: Entry) -> tuple[Any, ...]:
    return (
        e.key,
        str(e.state),
        e.run_id,
        e.task,
        e.message_id,
        e.target,
        e.sent_message_id,
        e.updated_at,
        e.sent_at,
    )


def _insert_claims(conn: Any, run_id: str, batch: Sequence[Claim], now: float) -> dict[str, Entry]:
    """Insert ``batch`` (sorted by key) where absent; the entries this inserted."""
    if not batch:
        return {}
    rows = conn.execute(
        "INSERT INTO redrive_keys (key, state, run_id, task, message_id, target, updated_at)"
        " SELECT k, 'claimed', %(run)s, t, m, g, %(now)s"
        " FROM unnest(%(keys)s::text[], %(tasks)s::text[], %(mids)s::text[], %(targets)s::text[])"
        " WITH ORDINALITY AS c(k, t, m, g, n) ORDER BY n"
        " ON CONFLICT (key) DO NOTHING RETURNING key",
        {
            "run": run_id,
            "now": now,
            "keys": [c.key for c in batch],
            "tasks": [c.task for c in batch],
            "mids": [c.message_id for c in batch],
            "targets": [c.target for c in batch],
        },
    ).fetchall()
    inserted = {r[0] for r in rows}
    return {c.key: claimed_entry(c, run_id, now) for c in batch if c.key in inserted}
