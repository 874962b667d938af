"""A real Celery worker runs repaired tasks with their new arguments.

A real Celery 5.x producer (kombu's SQS transport, protocols 1 and 2) publishes tasks a
handler now rejects (a kwarg renamed since, a currency written wrong) and one whose
``expires`` has passed (a worker would discard it); redrive.repair edits each body; the test
sends the repaired bodies to a queue with boto3 (the engine's part is not built yet); a real
``celery worker`` (solo pool) runs each once, with the edited arguments, all against a moto
server on 127.0.0.1.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from celery_worker import run_worker_until

pytest.importorskip("celery", minversion="5.0")
pytest.importorskip("kombu.transport.SQS")

from conftest import MotoServer

from redrive.messages import decode
from redrive.repair import edits_from_options, repair

pytestmark = pytest.mark.e2e

CAPTURE = "apps.payments.tasks.capture_payment"

APP = textwrap.dedent(
    '''
    """The Celery app of the producer and the worker (run as a script: it publishes)."""

    import json
    import os
    import sys
    from datetime import datetime, timedelta, timezone

    from celery import Celery

    TRANSPORT = {
        "region": "us-east-1",
        "is_secure": False,
        "predefined_queues": {
            name: {"url": url, "access_key_id": "sandbox", "secret_access_key": "sandbox"}
            for name, url in json.loads(os.environ["E2E_QUEUES"]).items()
        },
        "wait_time_seconds": 1,
        "polling_interval": 0.2,
        "visibility_timeout": 60,
    }


    def make_app(protocol=2, tasks=True):
        app = Celery("repair_e2e", broker=os.environ["E2E_BROKER"], set_as_current=tasks)
        app.conf.update(
            broker_transport_options=TRANSPORT,
            task_protocol=protocol,
            broker_connection_retry_on_startup=True,
            worker_prefetch_multiplier=1,
            worker_hijack_root_logger=False,
            task_ignore_result=True,
        )
        if not tasks:
            return app

        # The handler as deployed now: amount_cents (it was amount), currency in capitals.
        @app.task(bind=True, name="apps.payments.tasks.capture_payment")
        def capture_payment(self, order_id, amount_cents, currency="USD"):
            if currency != currency.upper():
                raise ValueError(f"bad currency {currency!r}")
            line = json.dumps(
                {
                    "id": self.request.id,
                    "args": list(self.request.args),
                    "kwargs": self.request.kwargs,
                }
            )
            fd = os.open(os.environ["E2E_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (line + "\\n").encode())
            finally:
                os.close(fd)

        return app


    app = make_app()


    def publish(queue):
        past = datetime.now(timezone.utc) - timedelta(hours=1)
        sent = []
        name = "apps.payments.tasks.capture_payment"
        for protocol in (1, 2):
            # A producer of its own (by name, as another service sends it).
            producer = make_app(protocol, tasks=False)
            try:
                # Written before the deploy: the old kwarg name, the currency in lower case.
                old = producer.send_task(
                    name, [100 + protocol], {"amount": 1234, "currency": "usd"}, queue=queue
                )
                # Right arguments, but it sat in the DLQ past its expiry.
                late = producer.send_task(
                    name, [200 + protocol], {"amount_cents": 99, "currency": "EUR"},
                    queue=queue, expires=past,
                )
                sent += [(old.id, protocol, "old"), (late.id, protocol, "late")]
            finally:
                producer.close()
        print(json.dumps(sent))


    if __name__ == "__main__":
        publish(sys.argv[1])
    '''
)


def _queues(server: MotoServer) -> tuple[str, str]:
    client = server.client()
    return (
        client.create_queue(QueueName="repair-dlq")["QueueUrl"],
        client.create_queue(QueueName="repair-work")["QueueUrl"],
    )


def _env(server: MotoServer, tmp_path: Path, dlq: str, work: str) -> tuple[dict[str, str], Path]:
    """The producer's and worker's environment (the moto server as the broker, the app on
    PYTHONPATH), and the file each run of the task is written to."""
    (tmp_path / "repair_e2e.py").write_text(APP)
    runs_file = tmp_path / "runs.jsonl"
    port = server.endpoint_url.rsplit(":", 1)[1]
    env = {
        **{k: v for k, v in server.env().items() if not k.startswith("AWS_ENDPOINT")},
        "PYTHONPATH": str(tmp_path),
        "E2E_BROKER": f"sqs://sandbox:sandbox@127.0.0.1:{port}",
        "E2E_QUEUES": json.dumps({"repair-dlq": dlq, "repair-work": work}),
        "E2E_RUNS": str(runs_file),
    }
    return env, runs_file


def _publish(env: dict[str, str], tmp_path: Path) -> dict[str, tuple[int, str]]:
    """Task id -> (protocol, "old" or "late"), for each task the producer sent."""
    produced = subprocess.run(
        [sys.executable, str(tmp_path / "repair_e2e.py"), "repair-dlq"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert produced.returncode == 0, produced.stderr
    return {task_id: (protocol, kind) for task_id, protocol, kind in json.loads(produced.stdout)}


def _receive_all(client: Any, url: str, expected: int) -> list[dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 60
    while len(found) < expected:
        assert time.monotonic() < deadline, f"only {len(found)} of {expected} messages"
        for message in client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=120
        ).get("Messages", []):
            found[message["MessageId"]] = message
    return list(found.values())


def _runs(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_a_real_worker_runs_each_repaired_task_once_with_its_new_arguments(
    server: MotoServer, tmp_path: Path
) -> None:
    client, dlq, work = server.client(), *_queues(server)
    env, runs_file = _env(server, tmp_path, dlq, work)
    # A real Celery producer publishes, protocols 1 and 2.
    sent = _publish(env, tmp_path)

    # -- one set of edits over the whole selection, as `move` will apply it -------------------
    edits = edits_from_options(
        renames=["kwargs.amount=kwargs.amount_cents"],
        sets=['kwargs.currency="USD"'],
        clear_expires=True,
    )
    now = datetime.now(UTC)
    expected: dict[str, dict[str, Any]] = {}
    for message in _receive_all(client, dlq, len(sent)):
        info = decode(message["Body"])
        assert info.task == CAPTURE
        protocol, kind = sent[str(info.task_id)]
        assert info.protocol == protocol
        assert info.is_expired(now) is (kind == "late")
        done = repair(message["Body"], edits)
        statuses = [outcome.status for outcome in done.outcomes]
        if kind == "old":
            assert statuses == ["changed", "changed", "unchanged"]
        else:
            assert statuses == ["missing", "changed", "changed"]
        assert not decode(done.body).is_expired(now)
        expected[str(info.task_id)] = {"args": done.after.args, "kwargs": done.after.kwargs}
        client.send_message(QueueUrl=work, MessageBody=done.body)
        client.delete_message(QueueUrl=dlq, ReceiptHandle=message["ReceiptHandle"])
    assert expected[next(i for i, s in sent.items() if s == (2, "old"))]["kwargs"] == {
        "amount_cents": 1234,
        "currency": "USD",
    }

    # -- a real worker runs each repaired task once, with the new arguments -------------------
    log = tmp_path / "worker.log"
    # Nothing in flight or waiting once all ran: a duplicate would have run by then.
    run_worker_until(
        "repair_e2e", "repair-work", cwd=tmp_path, env=env, log=log, name="repair@localhost",
        done=lambda: len(_runs(runs_file)) >= len(sent) and _depth(client, work) == (0, 0),
        what="the worker ran the repaired tasks and the work queue emptied", timeout=180,
    )  # fmt: skip
    ran = {run["id"]: {"args": run["args"], "kwargs": run["kwargs"]} for run in _runs(runs_file)}
    assert len(_runs(runs_file)) == len(sent), log.read_text()[-3000:]
    assert ran == expected, log.read_text()[-3000:]
    text = log.read_text()
    assert "revoked" not in text.lower() and "Traceback" not in text


def _depth(client: Any, url: str) -> tuple[int, int]:
    got = client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return (
        int(got["ApproximateNumberOfMessages"]),
        int(got["ApproximateNumberOfMessagesNotVisible"]),
    )


def test_the_same_tasks_unrepaired_are_not_run_as_meant(server: MotoServer, tmp_path: Path) -> None:
    """The control: sent back unedited, the old kwarg fails and the expired task is discarded
    as revoked (so the test above shows the repair, not a lenient worker)."""
    client, dlq, work = server.client(), *_queues(server)
    env, runs_file = _env(server, tmp_path, dlq, work)
    sent = _publish(env, tmp_path)
    for message in _receive_all(client, dlq, len(sent)):
        client.send_message(QueueUrl=work, MessageBody=message["Body"])
    log = tmp_path / "worker.log"

    def handled() -> bool:
        text = log.read_text().lower() if log.exists() else ""
        return text.count("typeerror") >= 2 and text.count("discarding revoked task") >= 2

    run_worker_until(
        "repair_e2e", "repair-work", cwd=tmp_path, env=env, log=log, name="control@localhost",
        done=handled, what="the worker failed or discarded every task",
    )  # fmt: skip
    assert _runs(runs_file) == [], "no task ran as meant"
    text = log.read_text()
    assert text.count("TypeError") >= 2, text[-3000:]  # the old kwarg, both protocols
