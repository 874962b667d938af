"""The sandbox's Celery result database: SQLAlchemy on SQLite, in Celery's own table and
format, with a record for the seeded DLQ messages that tells each one's story, so that
``redrive inspect`` and ``report`` with ``--result-backend`` say why they failed.

- the deploy blip: most runs STARTED with nothing after (the worker was SIGKILLed), some
  ``WorkerLostError`` (a prefork child killed), a few no record;
- the outage: FAILURE with the task's own connection error;
- poison: FAILURE with the task's own bad-data error;
- one message per DLQ whose task already succeeded (a copy redelivered while its first run
  was still going): ``move`` skips it as ``already-succeeded``.

It needs Celery and SQLAlchemy (the ``celery`` extra); without them the sandbox has none.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from redrive.config import Layout
from redrive.messages import decode
from redrive.sandbox.seeding import SampleMessage, sample_dlq

# Task name -> (exception type, module, message) its outage or poison story fails with.
_FAILURES: dict[str, tuple[str, str, str]] = {
    "apps.payments.tasks.capture_payment": (
        "ConnectionError",
        "builtins",
        "payment gateway timed out after 30 s",
    ),
    "apps.payments.tasks.refund": ("KeyError", "builtins", "'original_charge_id'"),
    "apps.notifications.tasks.send_email": (
        "SMTPServerDisconnected",
        "smtplib",
        "Connection unexpectedly closed",
    ),
    "apps.reports.tasks.export_csv": (
        "ValueError",
        "builtins",
        "column 'created_at' is not in the export",
    ),
    "apps.engagements.tasks.save_progress_quiz": (
        "OperationalError",
        "psycopg2",
        "could not connect to server: Connection refused",
    ),
}
_DEFAULT_FAILURE = ("RuntimeError", "builtins", "the task failed")
_WORKER_LOST = (
    "WorkerLostError",
    "billiard.exceptions",
    "Worker exited prematurely: signal 9 (SIGKILL) Job: 12.",
)


def write_results(path: Path, layout: Layout, *, per_family: int, seed: int) -> str | None:
    """Write the result database for what ``seed(layout, per_family=..., seed=...)`` put
    in the DLQs (the same task ids); returns its ``--result-backend`` URL, or None when
    Celery or SQLAlchemy is not installed."""
    try:
        from celery import Celery
        from sqlalchemy import create_engine
    except ImportError:
        return None
    url = f"db+sqlite:///{path}"
    app = Celery("redrive-sandbox", backend=url, set_as_current=False)
    try:
        backend = app.backend
        table = backend.task_cls.__table__
        engine = create_engine(f"sqlite:///{path}")
        table.metadata.create_all(engine)
        rows = [
            row
            for family in layout.families
            for row in _rows(backend, sample_dlq(family.name, per_family, seed=seed), seed)
        ]
        if rows:
            with engine.begin() as connection:
                connection.execute(table.insert(), rows)
        engine.dispose()
    finally:
        app.close()
    return url


def _rows(backend: Any, messages: Sequence[SampleMessage], seed: int) -> Iterator[dict[str, Any]]:
    rng = random.Random(f"redrive-sandbox-results:{seed}")
    decoded = [(m, decode(m.body)) for m in messages]
    # The task that already succeeded is not the DLQ's biggest task: one a filtered move of
    # the others (the runbooks' `--task 'apps.payments.*'`) meets.
    biggest = Counter(i.task for _, i in decoded if i.task_id).most_common(1)
    succeeded = False
    for message, info in decoded:
        if not info.task_id:
            continue
        if not succeeded and message.story == "blip" and [info.task] != [t for t, _ in biggest]:
            # Its first copy succeeded; this one was redelivered while that run went on.
            succeeded = True
            yield _row(backend, info.task_id, "SUCCESS", None, message.sent_at, minutes=3)
            continue
        state, exception = _story_record(message.story, info.task, rng)
        if state is not None:
            yield _row(backend, info.task_id, state, exception, message.sent_at, minutes=1)


def _story_record(
    story: str, task: str, rng: random.Random
) -> tuple[str | None, tuple[str, str, str] | None]:
    if story == "blip":
        roll = rng.random()
        if roll < 0.1:
            return None, None  # no record: the worker died before it started
        if roll < 0.3:
            return "FAILURE", _WORKER_LOST
        return "STARTED", None
    return "FAILURE", _FAILURES.get(task, _DEFAULT_FAILURE)


def _column_pickles(backend: Any) -> bool:
    """Whether the installed Celery's ``result`` column is SQLAlchemy's PickleType (5.5
    included), which stores the value itself, where later ones store the serializer's bytes."""
    from sqlalchemy import PickleType

    return isinstance(backend.task_cls.__table__.c.result.type, PickleType)


def _row(
    backend: Any,
    task_id: str,
    state: str,
    exception: tuple[str, str, str] | None,
    sent_at: datetime,
    *,
    minutes: int,
) -> dict[str, Any]:
    if exception is not None:
        name, module, text = exception
        result: Any = {"exc_type": name, "exc_module": module, "exc_message": [text]}
    elif state == "STARTED":
        result = {"pid": 4242, "hostname": "celery@worker-7f9c"}
    else:
        result = None
    if _column_pickles(backend):
        payload: Any = result  # Celery before celery/celery#3025's fix: the value, pickled
    else:
        payload = backend.encode(result)
        payload = payload.encode() if isinstance(payload, str) else payload
    done = (sent_at + timedelta(minutes=minutes)).astimezone(UTC).replace(tzinfo=None)
    return {
        "task_id": task_id,
        "status": state,
        "result": payload,
        "date_done": None if state == "STARTED" else done,
        "traceback": "Traceback (most recent call last):\n  ...\n" if exception else None,
    }
