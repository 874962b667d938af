"""Issue 13, end to end with real Celery: a DLQ filled before a queue split drains into the
queues its tasks route to now, and a real worker consuming those queues runs each moved task
exactly once; a task the app no longer registers stays in the DLQ with its reason.

A real Celery producer publishes checkout, progress and default tasks to the default queue
``onion`` (as before the split) and one task by a name the app no longer registers; failing
receives dead-letter them (as SQS counts). ``redrive --celery-app e2e_split:app move
default`` (a subprocess, from the project's directory as ``celery -A`` runs) routes them with
the app's own router; a real ``celery worker`` then consumes ``onion``, ``onion-checkout`` and
``onion-progress``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest
from celery_worker import run_worker_until

pytest.importorskip("celery", minversion="5.0")
pytest.importorskip("kombu.transport.SQS")

from conftest import MotoServer, make_family
from test_celery_e2e import dead_letter_as_sqs_does, peek, runs

pytestmark = pytest.mark.e2e

IBFT = "apps.webhooks.tasks.save_checkout_ibft"
LESSON = "apps.engagements.tasks.save_progress_lesson"
ACTIVATE = "apps.users.tasks.activate_user"
DELETED = "apps.inventory.tasks.resync_stock"

APP = textwrap.dedent(
    '''
    """The app after the onion split; run as a script it publishes as the app did before
    it (everything to `onion`), plus one task by a name the app no longer has."""

    import json
    import os
    import sys

    from celery import Celery

    URLS = json.loads(os.environ["E2E_URLS"])
    app = Celery("onion", broker=os.environ["E2E_BROKER"], set_as_current=False)
    app.conf.update(
        broker_transport_options={
            "region": "us-east-1",
            "is_secure": False,
            "predefined_queues": {
                name: {"url": url, "access_key_id": "sandbox", "secret_access_key": "sandbox"}
                for name, url in URLS.items()
            },
            "wait_time_seconds": 1,
            "polling_interval": 0.2,
            "visibility_timeout": 60,
        },
        task_default_queue="onion",
        task_routes={
            "apps.webhooks.tasks.save_checkout_ibft": {"queue": "onion-checkout"},
            "apps.engagements.tasks.save_progress_*": {"queue": "onion-progress"},
        },
        broker_connection_retry_on_startup=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        task_ignore_result=True,
    )


    def record(task):
        line = f"{task.name} {task.request.id}\\n"
        fd = os.open(os.environ["E2E_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


    @app.task(bind=True, name="apps.webhooks.tasks.save_checkout_ibft", shared=False)
    def ibft(self, order_id):
        record(self)


    @app.task(bind=True, name="apps.engagements.tasks.save_progress_lesson", shared=False)
    def lesson(self, user_id, lesson):
        record(self)


    @app.task(bind=True, name="apps.users.tasks.activate_user", shared=False)
    def activate(self, user_id):
        record(self)


    if __name__ == "__main__":
        try:
            for name, many in json.loads(sys.argv[1]):
                for i in range(many):
                    args = [i, f"lesson-{i}"] if "progress" in name else [i]
                    result = app.send_task(name, args, queue="onion")  # before the split
                    print(json.dumps({"task": name, "id": result.id}))
        finally:
            app.close()
    '''
)

PLAN = [(IBFT, 4), (LESSON, 5), (ACTIVATE, 3), (DELETED, 2)]


def test_a_dlq_filled_before_the_split_drains_where_tasks_route_and_runs_once(
    server: MotoServer, tmp_path: Path
) -> None:
    client = server.client()
    default = make_family(client, "onion")
    checkout = make_family(client, "onion-checkout")
    progress = make_family(client, "onion-progress")
    (tmp_path / "e2e_split.py").write_text(APP)
    runs_file = tmp_path / "runs.txt"
    port = server.endpoint_url.rsplit(":", 1)[1]
    urls = {"onion": default.queue_url, "onion-checkout": checkout.queue_url}
    urls["onion-progress"] = progress.queue_url
    env = {
        **{k: v for k, v in server.env().items() if not k.startswith("AWS_ENDPOINT")},
        "PYTHONPATH": str(tmp_path),
        "E2E_BROKER": f"sqs://sandbox:sandbox@127.0.0.1:{port}",
        "E2E_URLS": json.dumps(urls),
        "E2E_RUNS": str(runs_file),
    }
    produced = subprocess.run(
        [sys.executable, "e2e_split.py", json.dumps(PLAN)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert produced.returncode == 0, produced.stderr
    published = [json.loads(line) for line in produced.stdout.splitlines()]
    ids = {name: {p["id"] for p in published if p["task"] == name} for name, _ in PLAN}
    dead_letter_as_sqs_does(default, len(published))

    def redrive(*args: str) -> dict[str, object]:
        # Without PYTHONPATH: the app is found in the current directory, as celery -A does.
        done = subprocess.run(
            [sys.executable, "-m", "redrive", "--celery-app", "e2e_split:app", *args, "--json"],
            env={**server.env(), **{k: v for k, v in env.items() if k.startswith("E2E_")}},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
        result: dict[str, object] = json.loads(done.stdout)
        return result

    seen = redrive("inspect", "default")
    groups = {g["task"]: g for g in seen["groups"]}  # type: ignore[attr-defined]
    assert groups[IBFT]["routes_to"] == "onion-checkout"
    assert groups[LESSON]["routes_to"] == "onion-progress"
    assert groups[DELETED]["unregistered"] == 2

    moved = redrive("move", "default", "--execute", "--yes")
    assert moved["moved"] == 12 and moved["failed"] == 0 and moved["in_doubt"] == 0, moved
    assert moved["skipped_by_reason"] == {"unregistered": 2}
    tasks = moved["tasks"]
    assert tasks[IBFT]["targets"] == {"onion-checkout": 4}  # type: ignore[index]
    assert tasks[LESSON]["targets"] == {"onion-progress": 5}  # type: ignore[index]
    assert tasks[ACTIVATE]["targets"] == {"onion": 3}  # type: ignore[index]
    assert len(peek(checkout, checkout.queue_url)) == 4
    assert len(peek(progress, progress.queue_url)) == 5
    assert len(peek(default, default.queue_url)) == 3
    assert default.depth() == (2, 0), "the unregistered task stays in the DLQ"

    # Counted once the queues are drained and the worker has stopped: no execution can come
    # after the count, however late a duplicate would be.
    routed = (default, checkout, progress)

    def drained() -> bool:
        return all(f.depth(f.queue_url) == (0, 0) for f in routed)

    worker_log = run_worker_until(
        "e2e_split",
        "onion,onion-checkout,onion-progress",
        cwd=tmp_path,
        env=env,
        log=tmp_path / "worker.log",
        name="split@localhost",
        done=lambda: sum(runs(runs_file).values()) >= 12 and drained(),
        what="the routed queues drained",
    )
    executed = runs(runs_file)
    assert drained(), "the stopped worker left a task to run"
    expected = {(name, i): 1 for name in (IBFT, LESSON, ACTIVATE) for i in ids[name]}
    assert executed == Counter(expected), worker_log[-3000:]
    assert worker_log.count("] succeeded in ") == 12
    assert "Traceback" not in worker_log and "unregistered" not in worker_log
    assert default.depth() == (2, 0)
