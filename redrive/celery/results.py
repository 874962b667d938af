"""Celery's result backend, read-only: what became of each dead-lettered task id.

The backend is opened through Celery's own backend classes (``app.backend`` of an app whose
``result_backend`` is the URL), so every backend Celery supports is read the way Celery
reads it. redrive never writes, forgets or expires a result: it reads records and nothing
else. Lookups are one round trip per batch of task ids: ``mget`` on a key-value backend
(one MGET on Redis), one ``IN`` query on the database backend; a backend with neither is
read one id at a time (Celery offers nothing else there), which :attr:`batched` says.

Celery's ``get_many`` is not used: it waits until each id reaches a ready state, and a DLQ
is full of ids that never will. Nor is the database backend's own session: it creates the
tables (and adds missing columns) on first use, which a reader must never do; redrive opens
the same database with the backend's own table model and, for SQLite, read-only.

Celery itself is imported only by :func:`open_results`: redrive works without it.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import queue
import sqlite3
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from redrive.celery.streams import users_code
from redrive.errors import ResultBackendError

PENDING = "PENDING"
STARTED = "STARTED"
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
RETRY = "RETRY"
UNREADABLE = "UNREADABLE"
"""A record that exists but cannot be decoded (a serializer redrive does not accept)."""
EXCEPTION_STATES = frozenset({FAILURE, RETRY, "REVOKED"})
WORKER_LOST = "WorkerLostError"
WORKER_DIED = "worker died while running it"
ALREADY_SUCCEEDED = "already-succeeded"
"""The skip reason of a message whose task id's record is SUCCESS."""

# Long enough for a backend across a network, short enough that a hung one is said at once.
DEFAULT_TIMEOUT = 5.0
SAMPLE_CHARS = 120


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """What the backend holds for one task id (``PENDING``: no record at all)."""

    state: str
    exception: str | None = None
    """The exception's type name, for FAILURE and RETRY (and REVOKED) records."""
    message: str | None = None
    """The first line of the exception's message, truncated: it may hold personal data."""
    date_done: float | None = None
    """When a ready state (SUCCESS, FAILURE, REVOKED) was recorded; STARTED and RETRY have none."""

    @property
    def worker_died(self) -> bool:
        """STARTED with nothing after it (a worker killed as a whole, e.g. a deploy's
        SIGKILL), or a prefork child killed under it (``WorkerLostError``)."""
        return self.state == STARTED or self.exception == WORKER_LOST


NO_RECORD = TaskRecord(PENDING)


class ResultLookup(Protocol):
    """Records for a batch of task ids, in one round trip where the backend allows."""

    location: str
    """The backend's URL with any password masked: what messages name."""
    batched: bool

    def records(self, task_ids: Sequence[str]) -> dict[str, TaskRecord]:
        """A record for every id asked (``NO_RECORD`` when there is none); raises
        :class:`ResultBackendError` when the backend cannot answer."""
        ...

    def close(self) -> None: ...


def open_results(
    url: str, *, timeout: float = DEFAULT_TIMEOUT, probe: bool = True, background: bool = False
) -> ResultLookup:
    """Open the result backend at ``url`` read-only and, with ``probe``, check that it
    answers (one lookup of an id no task has). ``background`` (no probe): open it on a
    thread of its own (importing Celery and the backend's client takes a second on a busy
    machine) while the caller starts its scan; the first lookup waits for it, and any error
    opening it is that lookup's."""
    if background:
        return _OpeningLookup(url, timeout)
    path = plain_sqlite_path(url)
    if path is not None:
        lookup: ResultLookup = SqliteResults(
            url, path, timeout, lambda: open_with_celery(url, timeout, probe=False)
        )
        if probe:
            lookup.records(["redrive-probe-" + str(int(time.time()))])
        return lookup
    return open_with_celery(url, timeout, probe)


def open_with_celery(url: str, timeout: float, probe: bool) -> ResultLookup:
    """The backend at ``url`` through Celery's own class for it (:func:`open_results` does
    so for every URL but a plain SQLite file's)."""
    try:
        from celery import Celery
        from kombu.utils.url import maybe_sanitize_url
    except ImportError:
        raise ResultBackendError(
            "--result-backend needs Celery: pip install 'redrive[celery]'"
        ) from None
    location = str(maybe_sanitize_url(url))
    if url.split("://", 1)[0] in ("rpc", "disabled", ""):
        # rpc:// results are messages to the publisher: reading them would take them.
        raise ResultBackendError(
            f"{location or repr(url)} keeps no records redrive can read without changing "
            "them: give the URL of a backend that stores results (redis://, db+..., s3://...)"
        )
    app = Celery("redrive-results", set_as_current=False)
    app.conf.update(
        result_backend=url,
        redis_socket_timeout=timeout,
        redis_socket_connect_timeout=timeout,
        redis_retry_on_timeout=False,
        result_backend_always_retry=False,
        database_create_tables_at_setup=False,
    )
    return _lookup_for(app, url, location, timeout, probe)


def open_app_results(
    app: Any, spec: str, *, timeout: float = DEFAULT_TIMEOUT, probe: bool = True
) -> ResultLookup | None:
    """The result backend of the user's Celery app (``--celery-app``), with the app's own
    settings (table names, transport options...), read-only as :func:`open_results` reads;
    None when the app keeps no results. Redis timeouts the app leaves unset get redrive's."""
    from kombu.utils.url import maybe_sanitize_url

    with users_code():
        url = app.conf.result_backend
        if not url or not isinstance(url, str) or url.split("://", 1)[0] in ("rpc", "disabled"):
            return None
        # This process's copy of the app: never create tables, never hang on a dead Redis.
        app.conf.database_create_tables_at_setup = False
        for key in ("redis_socket_timeout", "redis_socket_connect_timeout"):
            if app.conf.get(key) is None:
                app.conf[key] = timeout
    location = f"{maybe_sanitize_url(url)} (the result backend of {spec})"
    return _lookup_for(app, url, location, timeout, probe)


def _lookup_for(app: Any, url: str, location: str, timeout: float, probe: bool) -> ResultLookup:
    try:
        with users_code():  # a backend class may be the project's own
            backend = app.backend
    except Exception as exc:
        raise ResultBackendError(
            f"cannot open the result backend {location}: {_why_not(url, exc)} "
            "(check --result-backend / REDRIVE_RESULT_BACKEND)"
        ) from None
    lookup: ResultLookup
    if any(cls.__name__ == "DatabaseBackend" for cls in type(backend).__mro__):
        lookup = _DatabaseLookup(backend, location, timeout)
    elif _has_mget(backend):
        lookup = _KeyValueLookup(backend, location)
    else:
        lookup = _OneByOneLookup(backend, location)
    if probe:
        lookup.records(["redrive-probe-" + str(int(time.time()))])
    return lookup


class _OpeningLookup:
    """A lookup being opened on a thread of its own (``open_results(background=True)``)."""

    batched = True

    def __init__(self, url: str, timeout: float) -> None:
        self.location = _masked(url)
        self._opened: list[ResultLookup | ResultBackendError] = []

        def run() -> None:
            try:
                self._opened.append(open_results(url, timeout=timeout, probe=False))
            except ResultBackendError as exc:
                self._opened.append(exc)
            except Exception as exc:  # said as the backend's problem, never a traceback
                self._opened.append(
                    ResultBackendError(f"cannot open the result backend: {_one_line(exc)}")
                )

        self._thread = threading.Thread(target=run, name="redrive-results-open", daemon=True)
        self._thread.start()

    def _lookup(self) -> ResultLookup:
        self._thread.join()
        opened = self._opened[0]
        if isinstance(opened, ResultBackendError):
            raise opened
        return opened

    def records(self, task_ids: Sequence[str]) -> dict[str, TaskRecord]:
        return self._lookup().records(task_ids)

    def close(self) -> None:
        self._thread.join()
        if self._opened and not isinstance(self._opened[0], ResultBackendError):
            self._opened[0].close()


def _masked(url: str) -> str:
    try:
        from kombu.utils.url import maybe_sanitize_url
    except ImportError:
        return url.split("@", 1)[-1] if "@" in url else url
    return str(maybe_sanitize_url(url))


def _why_not(url: str, exc: BaseException) -> str:
    from celery.app.backends import BACKEND_ALIASES

    scheme = url.split("://", 1)[0].split("+", 1)[0] if "://" in url else url
    if isinstance(exc, ImportError) and scheme not in BACKEND_ALIASES:
        known = ", ".join(sorted(BACKEND_ALIASES))
        return f"Celery has no result backend {scheme!r} (it knows {known})"
    return _one_line(exc)


def _has_mget(backend: Any) -> bool:
    try:
        from celery.backends.base import BaseKeyValueStoreBackend
    except ImportError:  # pragma: no cover - Celery without the class
        return False
    return (
        isinstance(backend, BaseKeyValueStoreBackend)
        and type(backend).mget is not BaseKeyValueStoreBackend.mget
    )


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def unreadable(location: str, exc: BaseException) -> ResultBackendError:
    return ResultBackendError(
        f"the result backend {location} did not answer: {_one_line(exc)} "
        "(is it up and reachable? check --result-backend)"
    )


class _KeyValueLookup:
    """Redis and the other key-value backends: one ``mget`` per batch."""

    batched = True

    def __init__(self, backend: Any, location: str) -> None:
        self.backend = backend
        self.location = location

    def records(self, task_ids: Sequence[str]) -> dict[str, TaskRecord]:
        ids = list(dict.fromkeys(i for i in task_ids if i))
        if not ids:
            return {}
        with users_code():  # the backend's client, serializers... may be the project's own
            keys = [self.backend.get_key_for_task(i) for i in ids]
            try:
                values = self.backend.mget(keys)
            except Exception as exc:
                raise unreadable(self.location, exc) from None
            if isinstance(values, Mapping):
                by_key = {self.backend.key_t(k): v for k, v in values.items()}
                values = [by_key.get(self.backend.key_t(k)) for k in keys]
            return {i: self._record(v) for i, v in zip(ids, values, strict=True)}

    def _record(self, value: Any) -> TaskRecord:
        if value is None:
            return NO_RECORD
        try:
            meta = decode_stored(self.backend, value, self.backend.decode)
        except Exception as exc:
            return TaskRecord(UNREADABLE, exception=type(exc).__name__)
        return record_from_meta(meta)

    def close(self) -> None:
        _close_backend(self.backend)


class _DatabaseLookup:
    """The database backend: one ``SELECT ... WHERE task_id IN (...)`` per batch, through
    an engine of redrive's own (read-only for SQLite) on the backend's own table model."""

    batched = True

    def __init__(self, backend: Any, location: str, timeout: float) -> None:
        from sqlalchemy import create_engine, select

        self.backend = backend
        self.location = location
        url = _read_only_url(backend.url, location)
        options: dict[str, Any] = {}
        if url.get_backend_name() == "sqlite":
            options["connect_args"] = {"timeout": timeout}
        try:
            self.engine = create_engine(url, **options)
        except Exception as exc:
            raise ResultBackendError(
                f"cannot open the result database {location}: {_one_line(exc)}"
            ) from None
        table = backend.task_cls.__table__
        self.table = table
        self.select = select(table.c.task_id, table.c.status, table.c.result, table.c.date_done)
        # SQLite, read by the standard library's driver on the same read-only file: a
        # third of SQLAlchemy's cost per query (one connection per thread, each SELECT its
        # own read, so nothing is held open between batches).
        self._sqlite: tuple[_SqliteFile, str] | None = None
        if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
            preparer = self.engine.dialect.identifier_preparer
            columns = ", ".join(
                preparer.quote(c) for c in ("task_id", "status", "result", "date_done")
            )
            sql = f"SELECT {columns} FROM {preparer.format_table(table)} WHERE task_id IN "
            self._sqlite = (_SqliteFile(str(url.database), timeout), sql)

    def _connection(self) -> sqlite3.Connection:
        assert self._sqlite is not None
        return self._sqlite[0].connection()

    def _rows(self, ids: list[str]) -> list[Any]:
        if self._sqlite is not None:
            return self._sqlite[0].select(self._sqlite[1], ids)
        with self.engine.connect() as connection:
            return list(connection.execute(self.select.where(self.table.c.task_id.in_(ids))))

    def records(self, task_ids: Sequence[str]) -> dict[str, TaskRecord]:
        ids = list(dict.fromkeys(i for i in task_ids if i))
        if not ids:
            return {}
        try:
            rows = self._rows(ids)
        except Exception as exc:
            if "does not exist" in str(exc):
                raise _no_table(self.location, self.table.name) from None
            raise _unreadable_rows(self.location, self.table.name, exc) from None
        found = {i: NO_RECORD for i in ids}
        with users_code():  # a serializer may be the project's own
            for task_id, status, result, date_done in rows:
                found[task_id] = self.record_of_row(status, result, date_done)
        return found

    def record_of_row(self, status: str, result: Any, date_done: Any) -> TaskRecord:
        """A row's record, its result decoded by Celery's backend (also what
        :class:`SqliteResults` asks for a row JSON cannot read)."""
        decode = self._decode_row
        try:
            value = decode_stored(self.backend, result, decode) if result is not None else None
        except Exception as exc:
            return TaskRecord(UNREADABLE, exception=type(exc).__name__)
        return record_from_meta({"status": status, "result": value, "date_done": date_done})

    def _decode_row(self, payload: Any) -> Any:
        """A ``result`` column's value as the backend's serializer wrote it, or as Celery
        before the fix of celery/celery#3025 (5.5 included) wrote every row whatever the
        serializer: SQLAlchemy's pickle of the value (which newer Celery reads back too)."""
        try:
            return self.backend.decode(payload)
        except Exception:
            if not isinstance(payload, bytes) or payload[:1] != b"\x80":
                raise
            return plain_unpickle(payload)

    def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite[0].close()
        self.engine.dispose()


# What a JSON result serializer can hand the database backend (kombu's json: dates, times,
# decimals, UUIDs), so all a legacy pickled row of one may hold besides plain values.
_PLAIN_CLASSES = {
    ("datetime", name) for name in ("datetime", "date", "time", "timedelta", "timezone")
} | {("decimal", "Decimal"), ("uuid", "UUID")}


class _PlainUnpickler(pickle.Unpickler):
    """Loads plain values only: a reader never runs code a row names."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _PLAIN_CLASSES:
            raise pickle.UnpicklingError(f"a pickled {module}.{name}, not a plain value")
        return super().find_class(module, name)


def plain_unpickle(payload: bytes) -> Any:
    return _PlainUnpickler(io.BytesIO(payload)).load()


def _read_only_url(url: str, location: str) -> Any:
    """The database URL; a SQLite file opened read-only, and never created."""
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
    except Exception as exc:
        raise ResultBackendError(f"{location} is not a database URL: {_one_line(exc)}") from None
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return parsed
    path = Path(parsed.database or "")
    if not path.is_file():
        raise ResultBackendError(
            f"the result database {path} does not exist (check --result-backend)"
        )
    return parsed.set(database=f"file:{path}?mode=ro", query={"uri": "true"})


class _OneByOneLookup:
    """A backend with no bulk read (S3, django-db...): Celery's ``get_task_meta`` per id."""

    batched = False

    def __init__(self, backend: Any, location: str) -> None:
        self.backend = backend
        self.location = location

    def records(self, task_ids: Sequence[str]) -> dict[str, TaskRecord]:
        found: dict[str, TaskRecord] = {}
        with users_code():  # a backend of the project's own, maybe
            for task_id in dict.fromkeys(i for i in task_ids if i):
                try:
                    meta = self.backend.get_task_meta(task_id)
                except Exception as exc:
                    raise unreadable(self.location, exc) from None
                found[task_id] = record_from_meta(meta)
        return found

    def close(self) -> None:
        _close_backend(self.backend)


def decode_stored(backend: Any, payload: Any, decode: Callable[[Any], Any]) -> Any:
    """A stored record, decoded. The JSON Celery writes by default (uncompressed) is read
    with the standard library's parser, which is several times cheaper than kombu's
    registry for what redrive reads (status, exception type and message, date); every other
    serializer or a compressed payload goes through Celery's own ``decode``."""
    if backend.serializer == "json":
        raw = payload if isinstance(payload, bytes | str) else None
        if raw is not None and raw[:1] in (b"{", "{", b"[", "["):
            return json.loads(raw)
    return decode(payload)


def _close_backend(backend: Any) -> None:
    close = getattr(backend, "close", None)
    if callable(close):
        # Closing a reader's connection has nothing left to protect.
        with contextlib.suppress(Exception), users_code():
            close()


def record_from_meta(meta: Mapping[str, Any]) -> TaskRecord:
    """A record from Celery's task meta (``status``, ``result``, ``date_done``), the result
    as stored: an exception's dict (``exc_type``, ``exc_message``) or an exception."""
    state = str(meta.get("status") or PENDING)
    if state == PENDING:
        return NO_RECORD
    exception = message = None
    if state in EXCEPTION_STATES:
        exception, message = exception_of(meta.get("result"))
    return TaskRecord(state, exception, message, _timestamp(meta.get("date_done")))


def exception_of(result: Any) -> tuple[str | None, str | None]:
    """The type name and the first line (truncated) of a stored exception."""
    if isinstance(result, BaseException):
        return type(result).__name__, _first_line(str(result))
    if isinstance(result, Mapping) and result.get("exc_type"):
        raw = result.get("exc_message")
        if isinstance(raw, list | tuple):
            raw = raw[0] if len(raw) == 1 else ", ".join(str(a) for a in raw)
        return str(result["exc_type"]).rsplit(".", 1)[-1], _first_line(str(raw or ""))
    return None, None


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= SAMPLE_CHARS else line[: SAMPLE_CHARS - 1] + "…"


def _timestamp(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        moment = value
    else:
        try:
            moment = datetime.fromisoformat(str(value))
        except ValueError:
            return None
    if moment.tzinfo is None:
        # Celery stores naive UTC datetimes.
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def succeeded_ids(results: ResultLookup | None, task_ids: Iterable[str | None]) -> set[str]:
    """The task ids among ``task_ids`` whose record is SUCCESS, for the engine's skip chain
    (one lookup per batch). A record redrive cannot read might be SUCCESS: then the move
    stops rather than send it."""
    if results is None:
        return set()
    found = results.records([i for i in task_ids if i])
    unreadable = [i for i, r in found.items() if r.state == UNREADABLE]
    if unreadable:
        raise ResultBackendError(
            f"the result backend's record of task {unreadable[0]} cannot be read "
            f"({found[unreadable[0]].exception}): redrive cannot tell whether it already "
            "succeeded; --include-succeeded sends such tasks anyway"
        )
    return {i for i, r in found.items() if r.state == SUCCESS}


def exception_group(record: TaskRecord | None) -> str:
    """The value ``--group-by exception`` splits a task's messages by."""
    if record is None:
        return "-"
    if record.exception:
        return record.exception
    return f"({record.state})" if record.state != PENDING else "(no record)"


@dataclass(slots=True)
class ResultCounts:
    """What the backend says of one task group: states and exception types with counts,
    and one sample message per exception type (kept only with --show-args)."""

    states: Counter[str] = field(default_factory=Counter)
    exceptions: Counter[str] = field(default_factory=Counter)
    samples: dict[str, str] = field(default_factory=dict)
    worker_died: int = 0

    def add(self, record: TaskRecord, *, show_args: bool) -> None:
        self.states[record.state] += 1
        if record.worker_died:
            self.worker_died += 1
        if record.exception and record.state != UNREADABLE:
            self.exceptions[record.exception] += 1
            if show_args and record.exception not in self.samples and len(self.samples) < 10:
                self.samples[record.exception] = record.message or ""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "states": dict(self.states.most_common()),
            "exceptions": dict(self.exceptions.most_common()),
            "worker_died": self.worker_died,
        }
        if self.samples:
            data["exception_samples"] = dict(self.samples)
        return data


class BatchReader:
    """The lookups of one read-only scan (inspect, report): a backend that fails is said
    once (:attr:`problem`) and the scan goes on without it."""

    def __init__(self, results: ResultLookup) -> None:
        self.results = results
        self.problem: str | None = None

    def read(self, task_ids: Sequence[str | None]) -> dict[str, TaskRecord] | None:
        if self.problem is not None:
            return None
        try:
            return self.results.records([i for i in task_ids if i])
        except ResultBackendError as exc:
            self.problem = str(exc)
            return None


# How much later than redrive's claim a record must be dated to prove the task ran after it:
# the worker's clock and redrive's may differ by this much (NTP keeps them within
# milliseconds; a DLQ copy's own last failure is older than the claim by at least the
# queue's visibility timeout).
CLOCK_MARGIN = 5.0


def proves_delivered(record: TaskRecord | None, claimed_at: float) -> bool:
    """Whether ``record`` proves a worker received the task after redrive claimed its send:
    a ready record (SUCCESS, FAILURE, REVOKED) dated more than :data:`CLOCK_MARGIN` after
    the claim. Nothing else is proof: STARTED and RETRY records carry no date, and no
    record at all says nothing."""
    return (
        record is not None
        and record.date_done is not None
        and record.date_done > claimed_at + CLOCK_MARGIN
    )


def delivered_after_claim(
    results: ResultLookup | None,
    candidates: Sequence[Any],
    entries: Mapping[str, Any],
    run_id: str | None,
) -> set[str]:
    """``--in-doubt auto``: the keys, among candidates claimed by another run and never
    confirmed sent, whose task's record proves it was delivered (:func:`proves_delivered`).
    One lookup for the batch, and only when it holds such a key."""
    claimed = {
        c.key: (c.info.task_id, entries[c.key].updated_at)
        for c in candidates
        if c.info.task_id
        and (entry := entries.get(c.key)) is not None
        and entry.state.value == "claimed"
        and entry.run_id != run_id
    }
    if results is None or not claimed:
        return set()
    records = results.records([task_id for task_id, _ in claimed.values()])
    return {
        key
        for key, (task_id, claimed_at) in claimed.items()
        if proves_delivered(records.get(task_id), claimed_at)
    }


class LookupsAhead:
    """Each batch's lookup, and what is done with its records, on a thread of its own, at
    most ``depth`` batches behind the scan: the scan's receives never wait for the backend.
    Batches that wait for the thread are looked up together (up to ``coalesce`` of them in
    one round trip), so a backend slower than the scan costs fewer, larger lookups."""

    def __init__(self, reader: BatchReader, depth: int = 64, coalesce: int = 50) -> None:
        self.reader = reader
        self.coalesce = coalesce
        self._room = threading.BoundedSemaphore(depth)
        self._queue: queue.SimpleQueue[tuple[list[str], Callable[..., None]] | None] = (
            queue.SimpleQueue()
        )
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="redrive-results", daemon=True)
        self._thread.start()

    def submit(
        self,
        task_ids: Sequence[str | None],
        then: Callable[[dict[str, TaskRecord] | None], None],
    ) -> None:
        self._room.acquire()
        self._queue.put(([i for i in task_ids if i], then))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            items = [item]
            while len(items) < self.coalesce:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # seen again by the outer loop: the end
                    break
                items.append(more)
            try:
                if self._error is None:
                    records = self.reader.read([i for ids, _ in items for i in ids])
                    for _, then in items:
                        then(records)
            except BaseException as exc:  # raised in the scan's thread, by finish()
                self._error = exc
            finally:
                for _ in items:
                    self._room.release()

    def finish(self) -> None:
        """Wait for every batch submitted; an error in one is raised here."""
        self.close()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()


# -- a plain SQLite file, without Celery ----------------------------------------------------------
# The sandbox's backend (``db+sqlite:///...``) and any plain SQLite URL: what Celery's
# DatabaseBackend writes there is one ``celery_taskmeta`` row per task whose ``result`` is the
# JSON of its default serializer. _DatabaseLookup reads that table with the standard library's
# driver too, but imported Celery's backend and SQLAlchemy to learn the table and decode the
# column: 0.8 s of CPU on every command that looked a result up. A row JSON cannot read
# (another serializer, compression, an older pickled column) is decoded by Celery's own
# backend, opened then and only for it (tests/test_results.py compares the two).

TABLE = "celery_taskmeta"
"""Celery's default (``database_table_names`` changes it, only in an app's own settings)."""
_SELECT = f"SELECT task_id, status, result, date_done FROM {TABLE} WHERE task_id IN "


def plain_sqlite_path(url: str) -> Path | None:
    """The file of a ``db+sqlite:///PATH`` URL with nothing else in it (no query, no
    escapes); None for any other URL, which goes to Celery's own backend."""
    prefix = "db+sqlite:///"
    if not url.startswith(prefix) or any(c in url for c in "?#%"):
        return None
    database = url[len(prefix) :]
    if database in ("", ":memory:"):
        return None
    return Path(database)


class SqliteResults:
    """One ``SELECT ... WHERE task_id IN (...)`` per batch, on the file opened read-only
    (never created), one connection per thread."""

    batched = True

    def __init__(
        self, url: str, path: Path, timeout: float, celery: Callable[[], ResultLookup]
    ) -> None:
        if not path.is_file():
            raise ResultBackendError(
                f"the result database {path} does not exist (check --result-backend)"
            )
        self.location = url
        self._file = _SqliteFile(f"file:{urllib.parse.quote(str(path))}?mode=ro", timeout)
        self._open_celery = celery
        self._celery: ResultLookup | None = None
        self._lock = threading.Lock()

    def records(self, task_ids: Sequence[str]) -> dict[str, TaskRecord]:
        ids = list(dict.fromkeys(i for i in task_ids if i))
        if not ids:
            return {}
        try:
            rows = self._file.select(_SELECT, ids)
        except sqlite3.Error as exc:
            raise _unreadable_rows(self.location, TABLE, exc) from None
        found = {i: NO_RECORD for i in ids}
        for task_id, status, result, date_done in rows:
            found[task_id] = self._record(status, result, date_done)
        return found

    def _record(self, status: str, result: Any, date_done: Any) -> TaskRecord:
        value = None
        if result is not None:
            try:
                value = json.loads(result)
            except (ValueError, TypeError):
                return self._by_celery(status, result, date_done)
        return record_from_meta({"status": status, "result": value, "date_done": date_done})

    def _by_celery(self, status: str, result: Any, date_done: Any) -> TaskRecord:
        with self._lock:
            if self._celery is None:
                self._celery = self._open_celery()
        # A db+sqlite URL is always Celery's database backend.
        assert isinstance(self._celery, _DatabaseLookup)
        return self._celery.record_of_row(status, result, date_done)

    def _connection(self) -> sqlite3.Connection:
        return self._file.connection()

    def close(self) -> None:
        self._file.close()
        with self._lock:
            if self._celery is not None:
                self._celery.close()


class _SqliteFile:
    """The standard library's driver on one SQLite database (a ``file:`` URI): a connection
    per thread, each SELECT its own read, so nothing is held open between batches."""

    def __init__(self, uri: str, timeout: float) -> None:
        self._uri = uri
        self._timeout = timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[sqlite3.Connection] = []

    def connection(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(
                self._uri, uri=True, timeout=self._timeout, check_same_thread=False
            )
            self._local.connection = connection
            with self._lock:
                self._connections.append(connection)
        return connection

    def select(self, sql: str, ids: list[str]) -> list[Any]:
        """``sql`` ending in ``WHERE task_id IN ``, for ``ids``."""
        return (
            self.connection().execute(sql + "(" + ", ".join("?" * len(ids)) + ")", ids).fetchall()
        )

    def close(self) -> None:
        with self._lock:
            for connection in self._connections:
                with contextlib.suppress(Exception):
                    connection.close()
            self._connections.clear()


def _no_table(location: str, table: str) -> ResultBackendError:
    return ResultBackendError(
        f"the result database {location} has no table {table}: is it Celery's result database?"
    )


def _unreadable_rows(location: str, table: str, exc: BaseException) -> ResultBackendError:
    if "no such table" in str(exc):
        return _no_table(location, table)
    return unreadable(location, exc)
