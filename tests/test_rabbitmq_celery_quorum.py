"""Celery's own RabbitMQ 4.x shapes, with a real Celery worker on the 4.0.5 node (issue 39):
a quorum source queue, as Celery 5.5+ runs one (``worker_detect_quorum_queues``: no global
QoS; a countdown goes through native delayed delivery's ``celery_delayed_*`` quorum queues,
whose TTLs dead-letter it with reason ``expired`` on its way to the queue); a task failing
there is dead-lettered (``rejected``), and one run past its hard time limit with
``task_acks_on_failure_or_timeout = False`` is requeued, each time counting toward the
queue's delivery limit, until the broker dead-letters it (``delivery_limit``).

redrive groups them by what they died of where they ran (never by a delayed-delivery hop),
``check`` says nothing of Celery's own delayed-delivery queues, and a move puts each back
once: a fixed worker runs each task exactly once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from celery_worker import celery_worker, run_worker_until
from test_rabbitmq_celery_e2e import depth, runs
from test_rabbitmq_e2e import drain, ok_json, redrive

from redrive.sandbox.rabbitmq_layout import (
    declare_layout,
    open_connection,
    rabbit_families,
    raw_channel,
)
from redrive.sandbox.rabbitmq_node import Vhost

pytest.importorskip("celery", minversion="5.5")

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
# The layout's (check's expectation): the overrunning task is requeued 5 times, then dead-lettered.
DELIVERY_LIMIT = 5

APP = textwrap.dedent(
    """
    import json
    import os
    import sys
    import time

    from celery import Celery
    from kombu import Exchange, Queue

    QUEUE = os.environ["E2E_QUEUE"]
    ARGUMENTS = json.loads(os.environ["E2E_QUEUE_ARGUMENTS"])

    app = Celery("quorum", broker=os.environ["E2E_BROKER"])
    app.conf.update(
        # A topic exchange: native delayed delivery routes a countdown back through it.
        task_queues=[
            Queue(QUEUE, Exchange(QUEUE, type="topic"), routing_key=QUEUE,
                  queue_arguments=ARGUMENTS, durable=True)
        ],
        task_default_queue=QUEUE,
        task_default_exchange=QUEUE,
        task_default_exchange_type="topic",
        task_default_routing_key=QUEUE,
        task_acks_late=True,
        task_acks_on_failure_or_timeout=False,
        task_reject_on_worker_lost=False,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        worker_enable_remote_control=False,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
        # The producer exits right after its last publish: a quorum queue's publish that the
        # broker has not confirmed when the connection goes can be lost (once, on a loaded
        # machine, the third task never came); with confirms each apply_async waits for it.
        broker_transport_options={"confirm_publish": True},
    )


    def record(task, outcome):
        line = f"{task.request.id} {outcome}\\n".encode()
        fd = os.open(os.environ["E2E_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


    @app.task(bind=True, name="apps.payments.tasks.capture_payment")
    def capture_payment(self, order_id):
        if os.environ.get("E2E_FIXED") == "1":
            return record(self, "ok")
        record(self, "failed")
        raise ValueError(f"order {order_id}: the bug")


    @app.task(bind=True, name="apps.reports.tasks.export_csv", time_limit=1)
    def export_csv(self, report_id):
        if os.environ.get("E2E_FIXED") == "1":
            return record(self, "ok")
        record(self, "overran")
        time.sleep(30)  # task body: killed at its hard time limit


    if __name__ == "__main__":
        ids = {
            "now": capture_payment.apply_async([1]).id,
            "countdown": capture_payment.apply_async([2], countdown=1).id,
            "overrun": export_csv.apply_async([3]).id,
        }
        print(json.dumps(ids))
    """
)


def app_env(vhost: Vhost, tmp_path: Path, queue: str, arguments: dict[str, Any]) -> dict[str, str]:
    (tmp_path / "quorum_app.py").write_text(APP)
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT / "tests"), str(ROOT)]),
        "E2E_BROKER": vhost.amqp_url,
        "E2E_QUEUE": queue,
        "E2E_QUEUE_ARGUMENTS": json.dumps(arguments),
        "E2E_RUNS": str(tmp_path / "runs.txt"),
    }


def redrive_app(vhost: Vhost, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """redrive with the test's Celery app importable (``--celery-app quorum_app:app``)."""
    return subprocess.run(
        [sys.executable, "-m", "redrive", "--broker", vhost.amqp_url, "--rabbitmq-api",
         vhost.api_url, "--celery-app", "quorum_app:app", *args],
        env={**env, "REDRIVE_STATE_DIR": env["E2E_RUNS"] + ".state"}, cwd=ROOT,
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def deaths(vhost: Vhost, queue: str) -> dict[str, list[tuple[str, str]]]:
    """Each message's task id -> its x-death (queue, reason) entries, newest first."""
    found = {}
    for message in drain(vhost, queue):
        headers = message.properties["application_headers"]
        entries = [(str(d["queue"]), str(d["reason"])) for d in headers["x-death"]]
        found[str(headers["id"])] = entries
    return found


def test_celerys_quorum_shapes_on_4_0_grouped_checked_and_moved(
    rabbitmq4_vhost: Vhost, tmp_path: Path
) -> None:
    vhost = rabbitmq4_vhost
    families = rabbit_families(
        queue_type="quorum", dlq_type="classic", delivery_limit=DELIVERY_LIMIT
    )
    family = next(f for f in families if f.name == "checkout")
    connection = open_connection(vhost.amqp_url)
    declare_layout(raw_channel(connection), [family])
    connection.close()
    env = app_env(vhost, tmp_path, family.queue, family.queue_arguments())
    log = tmp_path / "worker.log"
    with celery_worker(
        "quorum_app", family.queue, cwd=tmp_path, env=env, log=log, name="q@lo", pool="prefork"
    ) as worker:
        # Native delayed delivery's queues are the worker's to declare, before a countdown.
        worker.ready()
        produced = subprocess.run(
            [sys.executable, str(tmp_path / "quorum_app.py")],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert produced.returncode == 0, produced.stderr
        ids = json.loads(produced.stdout)
        worker.wait_for(lambda: depth(vhost, family.dlq) >= 3, "three dead-lettered")
    worker_log = log.read_text()
    assert "Global QoS is disabled" in worker_log  # worker_detect_quorum_queues saw it
    assert runs(Path(env["E2E_RUNS"])) == Counter(
        {
            (ids["now"], "failed"): 1,
            (ids["countdown"], "failed"): 1,
            (ids["overrun"], "overran"): DELIVERY_LIMIT + 1,
        }
    )
    # The broker's facts: the countdown's way through celery_delayed_0 (expired) is in its
    # x-death, its first death; the overrun's requeues ended at the delivery limit.
    assert deaths(vhost, family.dlq) == {
        ids["now"]: [("onion-checkout", "rejected")],
        ids["countdown"]: [("onion-checkout", "rejected"), ("celery_delayed_0", "expired")],
        ids["overrun"]: [("onion-checkout", "delivery_limit")],
    }

    # Grouped by what each died of where it ran: never by a delayed-delivery hop.
    groups = {
        g["task"]: g for g in ok_json(redrive(vhost, "inspect", "checkout", "--json"))["groups"]
    }
    payments, reports = (
        groups["apps.payments.tasks.capture_payment"],
        groups["apps.reports.tasks.export_csv"],
    )
    assert (payments["death_reasons"], payments["died_in"]) == (
        {"rejected": 2},
        {"onion-checkout": 2},
    )
    assert (reports["death_reasons"], reports["died_in"]) == (
        {"delivery_limit": 1},
        {"onion-checkout": 1},
    )
    assert reports["max_consumer_receives"] == DELIVERY_LIMIT + 1  # the runs it died after
    assert payments["expired"] == reports["expired"] == 0  # a delayed hop is not an expiry

    # check --celery says what the worker did with the overrun (requeued, then dead-lettered
    # past the quorum queue's limit), and nothing of Celery's own celery_delayed_* queues.
    checked = redrive_app(vhost, env, "check", "--celery")
    said = " ".join(checked.stdout.split())
    assert "celery_delayed" not in said, said
    overrun = next(line for line in said.split(" - app quorum_app:app ") if "export_csv)" in line)
    assert "is requeued (task_acks_on_failure_or_timeout = False)" in overrun or (
        "is requeued (task_acks_on_timeout = False)" in overrun
    ), overrun
    assert "a quorum queue dead-letters it past its x-delivery-limit" in overrun, overrun

    # Moved back once each; the task fixed, a worker runs each exactly once.
    moved = ok_json(redrive_app(vhost, env, "move", "checkout", "--execute", "--yes", "--json"))
    assert moved["moved"] == 3, moved
    runs_file = Path(env["E2E_RUNS"])

    def all_ran() -> bool:
        ok = sum(n for (_, outcome), n in runs(runs_file).items() if outcome == "ok")
        return ok >= 3 and depth(vhost, family.queue) == 0

    run_worker_until(
        "quorum_app", family.queue, cwd=tmp_path, env={**env, "E2E_FIXED": "1"},
        log=tmp_path / "fixed.log", name="fixed@lo", done=all_ran, what="fixed",
    )  # fmt: skip
    ran = Counter({key: n for key, n in runs(runs_file).items() if key[1] == "ok"})
    assert ran == Counter({(i, "ok"): 1 for i in ids.values()})
    assert depth(vhost, family.dlq) == 0 and depth(vhost, family.queue) == 0
