"""A real Celery worker on RabbitMQ: its failing tasks are dead-lettered by the broker itself
(acks_late, ``task_acks_on_failure_or_timeout=False``: the worker rejects without requeue,
the source queue's DLX routes the message into the DLQ, x-death reason ``rejected``; or a
quorum queue's ``x-delivery-limit`` passed by a worker dying twice: ``delivery_limit``); then
``redrive move --execute`` puts them back and a real worker, the task now fixed, runs each
moved task exactly once. As tests/test_celery_e2e.py does on SQS. Both on RabbitMQ 3.10.8 and
4.0.5."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from celery_worker import celery_worker
from celery_worker import run_worker_until as run_celery_worker_until
from conftest import on_both_rabbitmq

from redrive.sandbox.rabbitmq_layout import (
    RabbitFamily,
    declare_layout,
    open_connection,
    queue_depth,
    rabbit_families,
    raw_channel,
)
from redrive.sandbox.rabbitmq_node import Vhost

pytest.importorskip("celery", minversion="5.0")

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
TASK = "apps.payments.tasks.capture_payment"

APP = textwrap.dedent(
    """
    import json
    import os
    import sys

    from celery import Celery
    from kombu import Exchange, Queue

    QUEUE = os.environ["E2E_QUEUE"]
    ARGUMENTS = json.loads(os.environ["E2E_QUEUE_ARGUMENTS"])

    app = Celery("e2e", broker=os.environ["E2E_BROKER"])
    app.conf.update(
        task_queues=[
            Queue(QUEUE, Exchange(QUEUE, type="direct"), routing_key=QUEUE,
                  queue_arguments=ARGUMENTS, durable=True)
        ],
        task_default_queue=QUEUE,
        task_acks_late=True,
        task_acks_on_failure_or_timeout=False,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        worker_enable_remote_control=False,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
    )


    def record(task, outcome):
        line = f"{task.request.id} {outcome}\\n".encode()
        fd = os.open(os.environ["E2E_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


    @app.task(bind=True, name="apps.payments.tasks.capture_payment")
    def capture_payment(self, order_id, amount_cents=0):
        if os.environ.get("E2E_DIE") == "1":
            record(self, "died")
            os._exit(1)  # the worker dies mid-task: the unacked message goes back
        if os.environ.get("E2E_FIXED") != "1":
            record(self, "failed")
            raise ValueError(f"order {order_id}: the bug")
        record(self, "ok")


    if __name__ == "__main__":
        for i in range(int(sys.argv[1])):
            result = capture_payment.apply_async([2000 + i], {"amount_cents": 1234 + i})
            print(result.id)
    """
)


def runs(path: Path) -> Counter[tuple[str, str]]:
    """(task id, outcome) -> how many times a worker ran it so."""
    if not path.exists():
        return Counter()
    return Counter(tuple(line.split(" ", 1)) for line in path.read_text().splitlines())  # type: ignore[misc]


def depth(vhost: Vhost, queue: str) -> int:
    connection = open_connection(vhost.amqp_url)
    try:
        return queue_depth(raw_channel(connection), queue)
    finally:
        connection.close()


def first_deaths(vhost: Vhost, queue: str) -> Counter[str]:
    """The x-first-death-reason of each message in ``queue``, left in place."""
    connection = open_connection(vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        reasons: Counter[str] = Counter()
        while (message := channel.basic_get(queue, no_ack=False)) is not None:
            headers = message.properties["application_headers"]
            reasons[str(headers["x-first-death-reason"])] += 1
        return reasons
    finally:
        connection.close()


def run_worker_until(env: dict[str, str], tmp_path: Path, queue: str, name: str, done: Any) -> str:
    """A real worker on ``queue`` until ``done()``; then a warm shutdown. Its log."""
    return run_celery_worker_until(
        "e2e_rmq_app", queue, cwd=tmp_path, env=env, log=tmp_path / f"{name}.log",
        name=f"{name}@localhost", done=done, what=name,
    )  # fmt: skip


def app_env(vhost: Vhost, tmp_path: Path, queue: str, arguments: dict[str, Any]) -> dict[str, str]:
    (tmp_path / "e2e_rmq_app.py").write_text(APP)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "tests"), str(ROOT)]),
        "E2E_BROKER": vhost.amqp_url,
        "E2E_QUEUE": queue,
        "E2E_QUEUE_ARGUMENTS": json.dumps(arguments),
        "E2E_RUNS": str(tmp_path / "runs.txt"),
    }


def produce(env: dict[str, str], tmp_path: Path, count: int) -> set[str]:
    produced = subprocess.run(
        [sys.executable, str(tmp_path / "e2e_rmq_app.py"), str(count)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert produced.returncode == 0, produced.stderr
    ids = set(produced.stdout.split())
    assert len(ids) == count
    return ids


@on_both_rabbitmq
def test_a_task_whose_worker_dies_past_the_quorum_delivery_limit_is_dead_lettered(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """x-delivery-limit 1: the worker dies twice holding the task (solo pool, acks_late);
    the second return puts the delivery count past the limit and the broker dead-letters it
    (reason delivery_limit). No timing: each worker is waited for until it has died."""
    families = rabbit_families(queue_type="quorum", dlq_type="classic", delivery_limit=1)
    family = next(f for f in families if f.name == "default")
    connection = open_connection(rabbitmq_vhost.amqp_url)
    declare_layout(raw_channel(connection), families)
    connection.close()
    env = app_env(rabbitmq_vhost, tmp_path, family.queue, family.queue_arguments())
    (task_id,) = produce(env, tmp_path, 1)
    dying = {**env, "E2E_DIE": "1"}
    for attempt in range(2):
        log = tmp_path / f"dying-{attempt}.log"
        with celery_worker(
            "e2e_rmq_app", family.queue, cwd=tmp_path, env=dying, log=log, name=f"d{attempt}@lo"
        ) as worker:
            assert worker.ended() == 1, worker.tail()
    runs_file = tmp_path / "runs.txt"
    assert runs(runs_file) == Counter({(task_id, "died"): 2})
    deadline = time.monotonic() + 60  # the broker dead-letters after the second return
    while depth(rabbitmq_vhost, family.dlq) < 1:
        assert time.monotonic() < deadline, "not dead-lettered past the delivery limit"
        time.sleep(0.1)
    assert first_deaths(rabbitmq_vhost, family.dlq) == Counter({"delivery_limit": 1})
    assert depth(rabbitmq_vhost, family.queue) == 0

    move_back(rabbitmq_vhost, tmp_path, family, 1)
    run_fixed(rabbitmq_vhost, tmp_path, env, family, {task_id})


def move_back(vhost: Vhost, tmp_path: Path, family: RabbitFamily, count: int) -> None:
    """``redrive move FAMILY --execute --yes`` as the operator runs it: all ``count`` moved."""
    moved = subprocess.run(
        [
            *(sys.executable, "-m", "redrive", "--broker", vhost.amqp_url),
            *("--rabbitmq-api", vhost.api_url),
            *("move", family.name, "--execute", "--yes", "--json"),
        ],
        env={**os.environ, "REDRIVE_STATE_DIR": str(tmp_path / "state")},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert moved.returncode == 0, (moved.stdout, moved.stderr)
    assert json.loads(moved.stdout)["moved"] == count
    assert depth(vhost, family.dlq) == 0


def run_fixed(
    vhost: Vhost, tmp_path: Path, env: dict[str, str], family: RabbitFamily, ids: set[str]
) -> None:
    """The task fixed, a real worker runs each moved task exactly once."""
    runs_file = Path(env["E2E_RUNS"])

    def all_ran() -> bool:
        ok = sum(n for (_, outcome), n in runs(runs_file).items() if outcome == "ok")
        return ok >= len(ids) and depth(vhost, family.queue) == 0

    log = run_worker_until({**env, "E2E_FIXED": "1"}, tmp_path, family.queue, "fixed", all_ran)
    assert log.count("] succeeded in ") == len(ids), log[-3000:]
    ran = Counter({key: n for key, n in runs(runs_file).items() if key[1] == "ok"})
    assert ran == Counter({(i, "ok"): 1 for i in ids})
    assert depth(vhost, family.dlq) == 0 and depth(vhost, family.queue) == 0


@on_both_rabbitmq
def test_failed_tasks_dead_lettered_by_the_broker_moved_and_run_once_by_a_real_worker(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    families = rabbit_families()
    family = next(f for f in families if f.name == "checkout")
    connection = open_connection(rabbitmq_vhost.amqp_url)
    declare_layout(raw_channel(connection), families)
    connection.close()
    env = app_env(rabbitmq_vhost, tmp_path, family.queue, family.queue_arguments())
    ids = produce(env, tmp_path, 5)

    # -- the failing task: the worker rejects it, the broker dead-letters it -------------------
    log = run_worker_until(
        env, tmp_path, family.queue, "failing", lambda: depth(rabbitmq_vhost, family.dlq) == 5
    )
    assert "ValueError" in log
    assert runs(Path(env["E2E_RUNS"])) == Counter({(i, "failed"): 1 for i in ids})
    assert depth(rabbitmq_vhost, family.queue) == 0
    assert first_deaths(rabbitmq_vhost, family.dlq) == Counter({"rejected": 5})

    move_back(rabbitmq_vhost, tmp_path, family, 5)
    run_fixed(rabbitmq_vhost, tmp_path, env, family, ids)
