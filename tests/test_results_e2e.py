"""End to end: a real Celery worker on SQS (a moto server on 127.0.0.1) with a result backend
fills a DLQ the way production does, and ``redrive`` (a subprocess) says why and never
sends again what already succeeded.

The worker runs with ``task_acks_late`` on and ``task_acks_on_failure_or_timeout`` off: a
task that raises is not acked, so SQS delivers it again after its visibility timeout, and
moves it to the DLQ after ``maxReceiveCount`` receives, with a FAILURE record in Celery's
database backend (SQLite). A task whose first copy succeeded while a second copy (SQS
delivers at least once) was dead-lettered gives a SUCCESS record for a DLQ message.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from celery_worker import celery_worker

pytest.importorskip("celery")
pytest.importorskip("kombu.transport.SQS")
pytest.importorskip("sqlalchemy")

from conftest import MotoServer, make_family

from redrive.messages import decode

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "onion-checkout"
CHARGE = "apps.payments.tasks.charge"

APP = textwrap.dedent(
    """
    import os

    from celery import Celery

    QUEUE = os.environ["E2E_QUEUE"]
    app = Celery("e2e_results", broker=os.environ["E2E_BROKER"], backend=os.environ["E2E_RESULTS"])
    app.conf.update(
        broker_transport_options={
            "region": "us-east-1",
            "is_secure": False,
            "predefined_queues": {
                QUEUE: {
                    "url": os.environ["E2E_QUEUE_URL"],
                    "access_key_id": "sandbox",
                    "secret_access_key": "sandbox",
                }
            },
            "wait_time_seconds": 1,
            "polling_interval": 0.2,
        },
        task_default_queue=QUEUE,
        task_acks_late=True,
        task_acks_on_failure_or_timeout=False,
        task_track_started=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )


    @app.task(name="apps.payments.tasks.charge")
    def charge(order_id, fail=None):
        if fail == "declined":
            raise ValueError(f"card declined for order {order_id}")
        if fail == "gateway":
            raise ConnectionError("payment gateway timed out")
        return {"charged": order_id}
    """
)
JOBS = [("declined", 3), ("gateway", 2)]


def redrive(server: MotoServer, results: str, *args: str, code: int = 0) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "redrive", *args, "--json", "--result-backend", results],
        env=server.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def test_a_real_workers_records_say_why_and_a_succeeded_task_is_not_sent_again(
    server: MotoServer, tmp_path: Path
) -> None:
    family = make_family(server.client(), QUEUE, max_receive=3)
    # A failed task comes back after the queue's visibility timeout (kombu's SQS transport
    # receives with the queue's own): one second, not thirty.
    family.client.set_queue_attributes(
        QueueUrl=family.queue_url, Attributes={"VisibilityTimeout": "1"}
    )
    (tmp_path / "e2e_results.py").write_text(APP, encoding="utf-8")
    database = tmp_path / "results.sqlite3"
    port = server.endpoint_url.rsplit(":", 1)[1]
    env = {
        **{k: v for k, v in server.env().items() if not k.startswith("AWS_ENDPOINT")},
        "PYTHONPATH": str(tmp_path),
        "E2E_BROKER": f"sqs://sandbox:sandbox@127.0.0.1:{port}",
        "E2E_QUEUE": QUEUE,
        "E2E_QUEUE_URL": family.queue_url,
        "E2E_RESULTS": f"db+sqlite:///{database}",
    }
    publish = textwrap.dedent(
        """
        import json, sys
        from e2e_results import charge
        for fail, many in json.loads(sys.argv[1]):
            for i in range(many):
                charge.apply_async([f"{fail}-{i}"], {"fail": fail}, task_id=f"{fail}-{i}")
        charge.apply_async(["ok-0"], task_id="ok-0")
        """
    )
    published = subprocess.run(
        [sys.executable, "-c", publish, json.dumps(JOBS)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert published.returncode == 0, published.stderr
    # The succeeding task's message, as SQS would deliver a second copy of it (this receive
    # counts as one: maxReceiveCount 3 leaves the worker two).
    queued = family.client.receive_message(
        QueueUrl=family.queue_url, MaxNumberOfMessages=10, VisibilityTimeout=0
    )["Messages"]
    (twin,) = [m for m in queued if decode(m["Body"]).task_id == "ok-0"]

    log = tmp_path / "worker.log"
    failing = sum(n for _, n in JOBS)
    with celery_worker("e2e_results", QUEUE, cwd=tmp_path, env=env, log=log) as worker:
        worker.wait_for(lambda: family.depth() == (failing, 0), "the failures dead-lettered")
        worker.stop_warm()
    assert family.depth(family.queue_url) == (0, 0), "the successful task was acked"
    # Its second copy is dead-lettered too (its first run succeeded meanwhile).
    family.send_to_dlq(twin["Body"])
    results = f"db+sqlite:///{database}"

    inspected = redrive(server, results, "inspect", "checkout")
    (group,) = inspected["groups"]
    assert group["task"] == CHARGE and group["count"] == failing + 1
    assert group["states"] == {"FAILURE": failing, "SUCCESS": 1}
    assert group["exceptions"] == {"ValueError": 3, "ConnectionError": 2}

    dry = redrive(server, results, "move", "checkout")
    assert dry["skipped_by_reason"]["already-succeeded"] == 1
    assert dry["moved"] == failing
    ledger = str(tmp_path / "ledger.sqlite3")
    done = redrive(server, results, "move", "checkout", "--execute", "--yes", "--ledger", ledger)
    assert done["moved"] == failing and done["skipped_by_reason"]["already-succeeded"] == 1
    sent = family.drain(family.queue_url)
    assert twin["Body"] not in {m["Body"] for m in sent}
    assert len(sent) == failing
    assert family.depth() == (1, 0), "the twin stays in the DLQ"
