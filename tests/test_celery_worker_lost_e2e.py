"""Issue 37, 5: what ``check --celery`` says of a task whose worker process dies is what the
installed Celery does. A real prefork worker (one pool child) runs a task that SIGKILLs its
own pool child on its first run (on every run, for the poison case); where the task goes
then (the DLQ, the queue again, nowhere) must be what ``worker_lost_fate`` (the audit's model
of ``Request.on_failure``) predicts for those settings, on RabbitMQ and on SQS (moto).

No timing decides an outcome: each worker runs until what the fate predicts is seen (the
bound is for a hang), and what is left where is read once it has stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from celery_worker import celery_worker
from conftest import MotoServer, make_family

from redrive.celery.settings_audit import (
    TaskSettings,
    WorkerLost,
    task_settings,
    timeout_fate,
    worker_lost_fate,
)
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

TASK = "apps.payments.tasks.capture_payment"

APP = textwrap.dedent(
    """
    import json
    import os
    import signal
    import time

    from celery import Celery
    from kombu import Exchange, Queue

    QUEUE = os.environ["E2E_QUEUE"]
    SETTINGS = json.loads(os.environ["E2E_SETTINGS"])

    app = Celery("lost", broker=os.environ["E2E_BROKER"])
    app.conf.update(
        task_default_queue=QUEUE,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        worker_enable_remote_control=False,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
        **SETTINGS,
    )
    if "E2E_QUEUE_URL" in os.environ:
        app.conf.broker_transport_options = {
            "region": "us-east-1",
            "is_secure": False,
            "predefined_queues": {QUEUE: {
                "url": os.environ["E2E_QUEUE_URL"],
                "access_key_id": "sandbox",
                "secret_access_key": "sandbox",
            }},
            "wait_time_seconds": 1,
            "polling_interval": 0.2,
            "visibility_timeout": 2,
        }
    else:
        app.conf.task_queues = [
            Queue(QUEUE, Exchange(QUEUE, type="direct"), routing_key=QUEUE,
                  queue_arguments=json.loads(os.environ["E2E_QUEUE_ARGUMENTS"]), durable=True)
        ]


    def record(task_id, outcome):
        line = f"{task_id} {outcome}\\n".encode()
        fd = os.open(os.environ["E2E_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


    @app.task(bind=True, name="apps.payments.tasks.capture_payment")
    def capture_payment(self, order_id):
        marker = os.path.join(os.environ["E2E_DIR"], f"died-{self.request.id}")
        if os.environ.get("E2E_DIE_ALWAYS") == "1" or not os.path.exists(marker):
            open(marker, "w").close()
            if os.environ.get("E2E_OVERRUN") == "1":
                record(self.request.id, "overran")
                time.sleep(120)  # task body: past its time limits, Celery ends the run
            record(self.request.id, "died")
            os.kill(os.getpid(), signal.SIGKILL)  # this pool child, mid-task
        record(self.request.id, "ok")


    if __name__ == "__main__":
        print(capture_payment.apply_async([2001]).id)
    """
)

# (task_acks_on_failure_or_timeout, task_reject_on_worker_lost) -> what Celery does.
CASES: dict[str, tuple[dict[str, Any], WorkerLost]] = {
    # The configuration: check --celery told its user to set reject_on_worker_lost.
    "rejected": ({"task_acks_on_failure_or_timeout": False}, "rejected"),
    "requeued": (
        {"task_acks_on_failure_or_timeout": False, "task_reject_on_worker_lost": True},
        "requeued",
    ),
    "acknowledged": ({"task_acks_on_failure_or_timeout": True}, "acknowledged"),
}


def predicted(
    settings: dict[str, Any], fate: Callable[[TaskSettings], WorkerLost | None] = worker_lost_fate
) -> WorkerLost | None:
    """The audit's fate for a task bound with these settings (as the worker's app binds it)."""
    from celery import Celery

    app = Celery("predicted", set_as_current=False)
    app.conf.update(task_acks_late=True, **settings)

    def capture_payment(order_id: int) -> None:
        return None

    app.task(name=TASK, shared=False)(capture_payment)
    (task,) = task_settings(app)
    return fate(task)


def runs(path: Path) -> Counter[str]:
    """outcome -> how many runs ended so."""
    if not path.exists():
        return Counter()
    return Counter(line.split(" ", 1)[1] for line in path.read_text().splitlines())


def produce(env: dict[str, str], tmp_path: Path) -> str:
    produced = subprocess.run(
        [sys.executable, str(tmp_path / "lost_app.py")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert produced.returncode == 0, produced.stderr
    return produced.stdout.strip()


def run_worker(env: dict[str, str], tmp_path: Path, queue: str, until: Callable[[], bool]) -> str:
    """A prefork worker (one child) until ``until()``; then a warm shutdown (a child dying
    as it stops may leave it to be killed). Its log."""
    log = tmp_path / "worker.log"
    with celery_worker(
        "lost_app", queue, cwd=tmp_path, env=env, log=log, name="lost@lo", pool="prefork"
    ) as worker:
        worker.wait_for(until, "the lost child handled")
        worker.stop_warm(timeout=60)
    return log.read_text()


def worker_lost_handled(tmp_path: Path) -> bool:
    """The worker's main process has handled its child's death (Request.on_failure)."""
    log = tmp_path / "worker.log"
    return log.exists() and "WorkerLostError" in log.read_text()


def base_env(tmp_path: Path, settings: dict[str, Any], queue: str) -> dict[str, str]:
    (tmp_path / "lost_app.py").write_text(APP)
    return {
        **os.environ,
        "PYTHONPATH": str(tmp_path),
        "E2E_QUEUE": queue,
        "E2E_SETTINGS": json.dumps({"task_acks_late": True, **settings}),
        "E2E_RUNS": str(tmp_path / "runs.txt"),
        "E2E_DIR": str(tmp_path),
    }


def rabbit_depth(vhost: Vhost, queue: str) -> int:
    connection = open_connection(vhost.amqp_url)
    try:
        return queue_depth(raw_channel(connection), queue)
    finally:
        connection.close()


def rabbit_checkout(
    vhost: Vhost, tmp_path: Path, settings: dict[str, Any], **extra: str
) -> tuple[RabbitFamily, dict[str, str]]:
    """The checkout family declared on ``vhost`` as a Celery worker declares it, and the
    environment of its app and producer (``extra``: more variables)."""
    families = rabbit_families()
    family = next(f for f in families if f.name == "checkout")
    connection = open_connection(vhost.amqp_url)
    declare_layout(raw_channel(connection), families)
    connection.close()
    env = {
        **base_env(tmp_path, settings, family.queue),
        "E2E_BROKER": vhost.amqp_url,
        "E2E_QUEUE_ARGUMENTS": json.dumps(family.queue_arguments()),
        **extra,
    }
    return family, env


@pytest.mark.parametrize("case", list(CASES))
def test_a_dead_pool_childs_task_goes_where_the_audit_says_on_rabbitmq(
    case: str, rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    settings, fate = CASES[case]
    assert predicted(settings) == fate
    family, env = rabbit_checkout(rabbitmq_vhost, tmp_path, settings)
    produce(env, tmp_path)
    runs_file = tmp_path / "runs.txt"
    seen = {
        "rejected": lambda: rabbit_depth(rabbitmq_vhost, family.dlq) == 1,
        "requeued": lambda: runs(runs_file)["ok"] == 1,
        "acknowledged": lambda: worker_lost_handled(tmp_path),
    }[fate]
    log = run_worker(env, tmp_path, family.queue, seen)
    assert "WorkerLostError" in log, log[-3000:]
    left = (rabbit_depth(rabbitmq_vhost, family.queue), rabbit_depth(rabbitmq_vhost, family.dlq))
    expected = {
        "rejected": (Counter({"died": 1}), (0, 1)),  # dead-lettered: in the DLQ
        "requeued": (Counter({"died": 1, "ok": 1}), (0, 0)),  # ran again, never in the DLQ
        "acknowledged": (Counter({"died": 1}), (0, 0)),  # lost
    }[fate]
    assert (runs(runs_file), left) == expected, log[-3000:]


def test_a_task_that_always_kills_its_worker_loops_on_a_classic_queue_when_requeued(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """task_reject_on_worker_lost (what check --celery used to ask for): a poison task is
    delivered again and again on a classic queue, and never reaches the DLQ."""
    settings, _ = CASES["requeued"]
    family, env = rabbit_checkout(rabbitmq_vhost, tmp_path, settings, E2E_DIE_ALWAYS="1")
    produce(env, tmp_path)
    runs_file = tmp_path / "runs.txt"
    run_worker(env, tmp_path, family.queue, lambda: runs(runs_file)["died"] >= 4)
    assert rabbit_depth(rabbitmq_vhost, family.dlq) == 0
    assert rabbit_depth(rabbitmq_vhost, family.queue) == 1


@pytest.mark.parametrize("case", list(CASES))
def test_a_dead_pool_childs_task_goes_where_the_audit_says_on_sqs(
    case: str, server: MotoServer, tmp_path: Path
) -> None:
    """On SQS, kombu leaves a rejected task and a requeued one alike for SQS to deliver again
    after the visibility timeout (2 s here) and dead-letter past maxReceiveCount (1 here):
    task_reject_on_worker_lost changes nothing there, so the audit says nothing of it."""
    settings, fate = CASES[case]
    assert predicted(settings) == fate
    family = make_family(server.client(), "onion-checkout", max_receive=1)
    port = server.endpoint_url.rsplit(":", 1)[1]
    env = {
        **base_env(tmp_path, settings, "onion-checkout"),
        **{k: v for k, v in server.env().items() if not k.startswith("AWS_ENDPOINT")},
        "E2E_BROKER": f"sqs://sandbox:sandbox@127.0.0.1:{port}",
        "E2E_QUEUE_URL": family.queue_url,
    }
    env.pop("AWS_ENDPOINT_URL", None)
    produce(env, tmp_path)
    runs_file = tmp_path / "runs.txt"
    seen = {
        "rejected": lambda: family.depth() == (1, 0),
        # kombu's SQS transport sends no copy: the message is left for SQS, as a rejected one.
        "requeued": lambda: family.depth() == (1, 0),
        "acknowledged": lambda: (
            worker_lost_handled(tmp_path) and family.depth(family.queue_url) == (0, 0)
        ),
    }[fate]
    log = run_worker(env, tmp_path, "onion-checkout", seen)
    assert "WorkerLostError" in log, log[-3000:]
    left = (family.depth(family.queue_url), family.depth())
    expected = {
        "rejected": (Counter({"died": 1}), ((0, 0), (1, 0))),
        "requeued": (Counter({"died": 1}), ((0, 0), (1, 0))),
        "acknowledged": (Counter({"died": 1}), ((0, 0), (0, 0))),
    }[fate]
    assert (runs(runs_file), left) == expected, log[-3000:]


# A run past its time limits (the first run only sleeps past them; the next returns).
OVERRUNS: dict[str, tuple[dict[str, Any], WorkerLost]] = {
    # acks_on_timeout False: Request.on_timeout rejects with requeue.
    "hard limit": ({"task_acks_on_failure_or_timeout": False, "task_time_limit": 1}, "requeued"),
    # SoftTimeLimitExceeded first: a failure, rejected without requeue (into the DLQ).
    "soft limit first": (
        {
            "task_acks_on_failure_or_timeout": False,
            "task_soft_time_limit": 1,
            "task_time_limit": 30,
        },
        "rejected",
    ),
    # check --celery's advice for failures alone leaves acks_on_timeout at its default (True).
    "hard limit, failures alone not acked": (
        {"task_acks_on_failure": False, "task_time_limit": 1},
        "acknowledged",
    ),
}


@pytest.mark.parametrize("case", list(OVERRUNS))
def test_an_overrunning_task_goes_where_the_audit_says_on_rabbitmq(
    case: str, rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    settings, fate = OVERRUNS[case]
    assert predicted(settings, timeout_fate) == fate
    family, env = rabbit_checkout(rabbitmq_vhost, tmp_path, settings, E2E_OVERRUN="1")
    produce(env, tmp_path)
    runs_file = tmp_path / "runs.txt"
    log_file = tmp_path / "worker.log"
    seen = {
        "rejected": lambda: rabbit_depth(rabbitmq_vhost, family.dlq) == 1,
        "requeued": lambda: runs(runs_file)["ok"] == 1,
        # The pool child is killed once Request.on_timeout has acknowledged it.
        "acknowledged": lambda: (
            log_file.exists() and "exited with 'signal 9" in log_file.read_text()
        ),
    }[fate]
    log = run_worker(env, tmp_path, family.queue, seen)
    left = (rabbit_depth(rabbitmq_vhost, family.queue), rabbit_depth(rabbitmq_vhost, family.dlq))
    expected = {
        "rejected": (Counter({"overran": 1}), (0, 1)),
        "requeued": (Counter({"overran": 1, "ok": 1}), (0, 0)),
        "acknowledged": (Counter({"overran": 1}), (0, 0)),
    }[fate]
    assert (runs(runs_file), left) == expected, log[-3000:]
