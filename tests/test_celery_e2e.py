"""End to end with real Celery: DLQs filled by a real Celery 5.x producer, drained by
``redrive`` (a subprocess), and the result run by a real ``celery worker`` (a subprocess,
solo pool), all against a moto server on 127.0.0.1.

What is real here: the producer (Celery's ``apply_async`` through kombu's SQS transport,
task protocols 1 and 2), the worker (``celery worker`` consuming through kombu's SQS
transport, on pycurl or urllib3 as the installed kombu has it), and the ``redrive`` command.
What is simulated: SQS itself (moto) and the failures that dead-letter the tasks (receiving
each message more than maxReceiveCount times with boto3, which is what SQS counts).

Done when: ``move --execute`` of one task sends each of its messages once, byte-identical; a
real worker then runs each task exactly once; ``purge`` of one task with ``--execute``
empties exactly that task's messages; the archive holds each one byte-identical; replaying
the archive to the source queue lets a real worker run each task exactly once; replaying
again sends nothing.
"""

from __future__ import annotations

import base64
import gzip
import json
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from celery_worker import run_worker_until

pytest.importorskip("celery", minversion="5.0")
pytest.importorskip("kombu.transport.SQS")

from conftest import Family, MotoServer, make_family

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "onion-checkout"
CAPTURE = "apps.payments.tasks.capture_payment"
REFUND = "apps.payments.tasks.refund"
IBFT = "apps.webhooks.tasks.save_checkout_ibft"

# The Celery app of both the producer and the worker, written to a temporary directory.
# The tasks append "name id" to a file: how the test counts executions.
APP = textwrap.dedent(
    '''
    """A Celery app on the local SQS: ``celery -A e2e_app worker``, or run as a script to
    publish tasks (prints one JSON object a line: task, id, protocol)."""

    import json
    import os
    import sys

    from celery import Celery

    QUEUE = os.environ["E2E_QUEUE"]
    TRANSPORT = {
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
        "visibility_timeout": 60,
    }


    def make_app(protocol=2):
        app = Celery("e2e", broker=os.environ["E2E_BROKER"])
        app.conf.update(
            broker_transport_options=TRANSPORT,
            task_default_queue=QUEUE,
            task_protocol=protocol,
            broker_connection_retry_on_startup=True,
            worker_prefetch_multiplier=1,
            worker_hijack_root_logger=False,
            task_ignore_result=True,
        )

        def record(task):
            line = f"{task.name} {task.request.id}\\n".encode()
            fd = os.open(os.environ["E2E_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)

        @app.task(bind=True, name="apps.payments.tasks.capture_payment")
        def capture_payment(self, order_id, amount_cents=0, currency="USD"):
            record(self)

        @app.task(bind=True, name="apps.payments.tasks.refund")
        def refund(self, order_id, reason=""):
            record(self)

        @app.task(bind=True, name="apps.webhooks.tasks.save_checkout_ibft")
        def save_checkout_ibft(self, order_id, payload=None):
            record(self)

        return app


    app = make_app()


    def publish(plan):
        """plan: [[task name, protocol, how many], ...]"""
        apps = {1: make_app(1), 2: make_app(2)}
        try:
            for name, protocol, many in plan:
                task = apps[protocol].tasks[name]
                for i in range(many):
                    if name.endswith("refund"):
                        args, kwargs = [1000 + i], {"reason": "Zoë ✓ duplicate"}
                    elif name.endswith("capture_payment"):
                        args, kwargs = [2000 + i], {"amount_cents": 1234 + i, "currency": "USD"}
                    else:
                        args, kwargs = [3000 + i], {"payload": {"reference": f"IBFT-{i:06d}"}}
                    result = task.apply_async(args, kwargs, queue=QUEUE)
                    print(json.dumps({"task": name, "id": result.id, "protocol": protocol}))
        finally:
            for one in apps.values():
                one.close()


    if __name__ == "__main__":
        publish(json.loads(sys.argv[1]))
    '''
)

PLAN: list[tuple[str, int, int]] = [  # task, protocol, how many
    (CAPTURE, 2, 6),
    (CAPTURE, 1, 3),
    (REFUND, 2, 4),
    (REFUND, 1, 2),
    (IBFT, 2, 3),
    (IBFT, 1, 1),
]


def peek(family: Family, url: str) -> dict[str, dict[str, Any]]:
    """Every message of a queue by MessageId, left in it (received, then made visible)."""
    found: dict[str, dict[str, Any]] = {}
    handles: list[str] = []
    for _ in range(100):
        got = family.client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=60,
            MessageAttributeNames=["All"],
        ).get("Messages", [])
        if not got:
            break
        for message in got:
            found[message["MessageId"]] = message
            handles.append(message["ReceiptHandle"])
    for start in range(0, len(handles), 10):
        family.client.change_message_visibility_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0}
                for i, h in enumerate(handles[start : start + 10])
            ],
        )
    return found


def dead_letter_as_sqs_does(family: Family, expected: int) -> dict[str, dict[str, Any]]:
    """Receive every message of the source queue more than maxReceiveCount (5) times without
    deleting it, as failing workers would, until SQS (moto) has moved each one to the DLQ.
    Returns each message as the producer sent it (first receive), by MessageId."""
    first_seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + 120
    for _ in range(500):
        got = family.client.receive_message(
            QueueUrl=family.queue_url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=0,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        ).get("Messages", [])
        for message in got:
            first_seen.setdefault(message["MessageId"], message)
        if not got and family.depth(family.queue_url) == (0, 0):
            break
        assert time.monotonic() < deadline, "dead-lettering took too long"
    assert len(first_seen) == expected
    assert family.depth() == (expected, 0), "every message reached the DLQ"
    return first_seen


def redrive(server: MotoServer, *args: str, code: int = 0) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-m", "redrive", *args, "--json"],
        env=server.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def runs(path: Path) -> Counter[tuple[str, str]]:
    """(task name, task id) -> how many times a worker ran it."""
    executed: Counter[tuple[str, str]] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            name, task_id = line.split(" ", 1)
            executed[name, task_id] += 1
    return executed


def e2e_env(server: MotoServer, family: Family, tmp_path: Path, runs_file: Path) -> dict[str, str]:
    """The environment of the e2e app's producer and worker: the moto server as the broker
    (not as AWS_ENDPOINT_URL, which kombu does not read), the app on PYTHONPATH."""
    port = server.endpoint_url.rsplit(":", 1)[1]
    return {
        **{k: v for k, v in server.env().items() if not k.startswith("AWS_ENDPOINT")},
        "PYTHONPATH": str(tmp_path),
        "E2E_BROKER": f"sqs://sandbox:sandbox@127.0.0.1:{port}",
        "E2E_QUEUE": QUEUE,
        "E2E_QUEUE_URL": family.queue_url,
        "E2E_RUNS": str(runs_file),
    }


def produce(
    env: dict[str, str], tmp_path: Path, plan: list[tuple[str, int, int]]
) -> list[dict[str, Any]]:
    """A real Celery producer publishes ``plan`` (task, protocol, how many); what it sent."""
    produced = subprocess.run(
        [sys.executable, str(tmp_path / "e2e_app.py"), json.dumps(plan)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert produced.returncode == 0, produced.stderr
    return [json.loads(line) for line in produced.stdout.splitlines()]


def test_real_celery_producer_redrive_and_real_worker(server: MotoServer, tmp_path: Path) -> None:
    family = make_family(server.client(), QUEUE)
    (tmp_path / "e2e_app.py").write_text(APP)
    runs_file = tmp_path / "runs.txt"
    env = e2e_env(server, family, tmp_path, runs_file)

    # -- a real Celery producer publishes protocol 1 and 2 tasks ----------------------------
    published = produce(env, tmp_path, PLAN)
    assert len(published) == sum(n for _, _, n in PLAN)
    task_of = {p["id"]: p["task"] for p in published}
    ids = {name: {p["id"] for p in published if p["task"] == name} for name in task_of.values()}

    # -- failing workers: each message received > 5 times, so SQS moves it to the DLQ -------
    original = dead_letter_as_sqs_does(family, len(published))
    body_of_task: dict[str, dict[str, Any]] = {}
    protocols: Counter[int] = Counter()
    for message in original.values():
        # Celery's own envelope (base64 JSON, kombu's default): read the task id from it.
        envelope = json.loads(base64.b64decode(message["Body"]))
        # Protocol 2 names the task in headers; protocol 1 only in the (base64) inner body.
        if "task" in envelope["headers"]:
            protocols[2] += 1
            task_id = envelope["headers"]["id"]
        else:
            protocols[1] += 1
            task_id = json.loads(base64.b64decode(envelope["body"]))["id"]
        body_of_task[task_id] = message
    assert set(body_of_task) == set(task_of), "every published task is in the DLQ"
    assert protocols == {1: 6, 2: 13}
    in_dlq = peek(family, family.dlq_url)
    assert {m: in_dlq[m]["Body"] for m in in_dlq} == {m: original[m]["Body"] for m in original}

    # -- inspect: exact counts per task, protocols 1 and 2; twice; the DLQ left as it was ----
    expected = dict(Counter(task_of.values()))
    for _ in range(2):
        report = redrive(server, "inspect", "checkout")
        assert report["total"] == len(published)
        assert {g["task"]: g["count"] for g in report["groups"]} == expected
        assert family.depth() == (len(published), 0)

    ledger = tmp_path / "ledger.sqlite3"

    # -- move one task: each of its messages once, byte-identical -------------------------------
    moved = redrive(
        server, "move", "checkout", "--task", CAPTURE, "--execute", "--yes", "--ledger", str(ledger)
    )
    assert moved["moved"] == 9 and moved["failed"] == 0 and moved["in_doubt"] == 0
    in_queue = peek(family, family.queue_url)
    assert sorted(m["Body"] for m in in_queue.values()) == sorted(
        body_of_task[i]["Body"] for i in ids[CAPTURE]
    )
    for message in in_queue.values():
        ours = set(message.get("MessageAttributes", {}))
        assert ours <= {"redrive-count", "redrive-key", "redrive-dlq"}, "nothing else added"
    assert family.depth() == (10, 0), "the other tasks stay in the DLQ"

    # -- purge one task: exactly its messages go, into an archive, byte-identical ----------------
    archive = tmp_path / "refund.jsonl.gz"
    purged = redrive(
        server,
        "purge",
        "checkout",
        "--task",
        REFUND,
        "--archive",
        str(archive),
        "--execute",
        "--yes",
    )
    assert purged["archived"] == 6 and purged["purged"] == 6 and purged["failed"] == 0
    left = peek(family, family.dlq_url)
    assert sorted(m["Body"] for m in left.values()) == sorted(
        body_of_task[i]["Body"] for i in ids[IBFT]
    )
    with gzip.open(archive, "rt", encoding="ascii") as lines:
        records = [json.loads(line) for line in lines]
    assert sorted(r["body"] for r in records) == sorted(
        body_of_task[i]["Body"] for i in ids[REFUND]
    )
    for record in records:
        assert record["body"] == original[record["message_id"]]["Body"]
        assert record["task"] == REFUND and record["task_id"] in ids[REFUND]

    # -- replay the archive to the source queue; replaying again sends nothing -------------------
    replayed = redrive(
        server, "replay", str(archive), "--to", QUEUE, "--execute", "--yes", "--ledger", str(ledger)
    )
    assert replayed["replayed"] == 6 and replayed["failed"] == 0
    in_queue = peek(family, family.queue_url)
    assert sorted(m["Body"] for m in in_queue.values()) == sorted(
        body_of_task[i]["Body"] for i in ids[CAPTURE] | ids[REFUND]
    )
    again = redrive(
        server, "replay", str(archive), "--to", QUEUE, "--execute", "--yes", "--ledger", str(ledger)
    )
    assert again["replayed"] == 0 and again["already_sent"] == 6
    assert family.depth(family.queue_url) == (15, 0), "the second replay sent nothing"

    # -- a real Celery worker runs each task exactly once --------------------------------------
    # Counted once the queue is drained (nothing visible, nothing in flight) and the worker
    # has stopped: no execution can come after the count, however late a duplicate would be.
    worker_log = run_worker_until(
        "e2e_app",
        QUEUE,
        cwd=tmp_path,
        env=env,
        log=tmp_path / "worker.log",
        name="e2e@localhost",
        done=lambda: (
            sum(runs(runs_file).values()) >= 15 and family.depth(family.queue_url) == (0, 0)
        ),
        what="the worker ran the moved and replayed tasks",
    )
    executed = runs(runs_file)
    assert family.depth(family.queue_url) == (0, 0), "the stopped worker left a task to run"
    expected = {(CAPTURE, i): 1 for i in ids[CAPTURE]} | {(REFUND, i): 1 for i in ids[REFUND]}
    assert executed == Counter(expected), worker_log[-3000:]
    assert family.depth() == (4, 0), "the task neither moved nor purged is still in the DLQ"
    assert worker_log.count("] succeeded in ") == 15
    assert "Traceback" not in worker_log and "unregistered" not in worker_log
