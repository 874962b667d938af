"""End to end with real Celery, selecting by a kwarg: a real Celery producer (protocols 1
and 2) fills the DLQ, ``redrive move --where`` and ``redrive purge --where`` (subprocesses)
act on exactly the messages whose kwargs match, byte-identical, and a real ``celery worker``
runs each moved task exactly once. The app and helpers are test_celery_e2e.py's."""

from __future__ import annotations

import base64
import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from celery_worker import run_worker_until

pytest.importorskip("celery", minversion="5.0")
pytest.importorskip("kombu.transport.SQS")

from conftest import MotoServer, make_family
from test_celery_e2e import (
    APP,
    CAPTURE,
    IBFT,
    QUEUE,
    REFUND,
    dead_letter_as_sqs_does,
    e2e_env,
    peek,
    produce,
    redrive,
    runs,
)

pytestmark = pytest.mark.e2e

PLAN: list[tuple[str, int, int]] = [
    (CAPTURE, 2, 4),
    (CAPTURE, 1, 2),
    (REFUND, 2, 2),
    (IBFT, 2, 2),
    (IBFT, 1, 1),
]
# The app's capture_payment kwargs: amount_cents 1234 + i: the first two of each protocol.
CHEAP = "kwargs.amount_cents < `1236`"
FIRST_IBFT = "kwargs.payload.reference == 'IBFT-000000'"


def kwargs_of(body: str) -> dict[str, Any]:
    envelope = json.loads(base64.b64decode(body))
    inner = json.loads(base64.b64decode(envelope["body"]))
    if "task" in envelope["headers"]:
        return dict(inner[1])
    return dict(inner["kwargs"])


def task_id_of(body: str) -> str:
    envelope = json.loads(base64.b64decode(body))
    if "task" in envelope["headers"]:
        return str(envelope["headers"]["id"])
    return str(json.loads(base64.b64decode(envelope["body"]))["id"])


def test_move_and_purge_by_kwarg_with_a_real_producer_and_worker(
    server: MotoServer, tmp_path: Path
) -> None:
    family = make_family(server.client(), QUEUE)
    (tmp_path / "e2e_app.py").write_text(APP)
    runs_file = tmp_path / "runs.txt"
    env = e2e_env(server, family, tmp_path, runs_file)
    published = produce(env, tmp_path, PLAN)
    assert len(published) == 11
    original = dead_letter_as_sqs_does(family, len(published))
    cheap = {
        m for m, msg in original.items() if kwargs_of(msg["Body"]).get("amount_cents", 9999) < 1236
    }
    first_ibft = {
        m
        for m, msg in original.items()
        if kwargs_of(msg["Body"]).get("payload", {}).get("reference") == "IBFT-000000"
    }
    assert len(cheap) == 4 and len(first_ibft) == 2  # both protocols in each

    # -- group by a kwarg, then a dry run: what would move, nothing changed ------------------
    grouped = redrive(server, "inspect", "checkout", "--group-by", "kwargs.currency")
    assert {g["task"]: g["count"] for g in grouped["groups"]} == {"USD": 6, None: 5}
    dry = redrive(server, "move", "checkout", "--where", CHEAP)
    assert dry["matched"] == 4 and dry["moved"] == 4 and family.depth() == (11, 0)

    # -- move by kwarg: exactly those, byte-identical ----------------------------------------
    ledger = tmp_path / "ledger.sqlite3"
    moved = redrive(
        server, "move", "checkout", "--where", CHEAP, "--execute", "--yes", "--ledger", str(ledger)
    )
    assert (moved["matched"], moved["moved"], moved["failed"], moved["in_doubt"]) == (4, 4, 0, 0)
    in_queue = peek(family, family.queue_url)
    assert sorted(m["Body"] for m in in_queue.values()) == sorted(
        original[m]["Body"] for m in cheap
    )
    assert family.depth() == (7, 0)

    # -- purge by kwarg: exactly those, archived byte-identical ------------------------------
    archive = tmp_path / "ibft.jsonl.gz"
    purged = redrive(
        server,
        "purge",
        "checkout",
        "--where",
        FIRST_IBFT,
        "--archive",
        str(archive),
        "--execute",
        "--yes",
    )
    assert (purged["matched"], purged["archived"], purged["purged"]) == (2, 2, 2)
    with gzip.open(archive, "rt", encoding="ascii") as lines:
        records = [json.loads(line) for line in lines]
    assert {r["message_id"] for r in records} == first_ibft
    for record in records:
        assert record["body"] == original[record["message_id"]]["Body"]
    left = peek(family, family.dlq_url)
    assert set(left) == set(original) - cheap - first_ibft

    # -- a real worker runs each moved task exactly once -------------------------------------
    # Counted once the queue is drained and the worker has stopped: no execution can come
    # after the count, however late a duplicate would be.
    worker_log = run_worker_until(
        "e2e_app",
        QUEUE,
        cwd=tmp_path,
        env=env,
        log=tmp_path / "worker.log",
        name="where@localhost",
        done=lambda: (
            sum(runs(runs_file).values()) >= 4 and family.depth(family.queue_url) == (0, 0)
        ),
        what="the worker ran the moved tasks",
    )
    executed = runs(runs_file)
    assert family.depth(family.queue_url) == (0, 0), "the stopped worker left a task to run"
    expected = Counter({(CAPTURE, task_id_of(original[m]["Body"])): 1 for m in cheap})
    assert executed == expected, worker_log[-3000:]
    assert family.depth() == (5, 0), "what neither --where selected is still in the DLQ"
