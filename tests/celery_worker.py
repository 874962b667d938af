"""A real Celery worker for the end-to-end tests: one way to start it, one way to stop it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def start_celery_worker(
    app: str, queues: str, *, cwd: Path, env: dict[str, str], log: Path, name: str | None = None
) -> subprocess.Popen[bytes]:
    """``celery -A app worker`` on the solo pool, consuming ``queues`` (comma separated), its
    output in ``log``. Heartbeats, mingle and gossip are off: one worker, nothing to meet."""
    command = [
        *(sys.executable, "-m", "celery", "-A", app, "worker", "--pool", "solo"),
        *("-Q", queues, "--loglevel", "INFO"),
        *(("-n", name) if name else ()),
        *("--without-heartbeat", "--without-mingle", "--without-gossip"),
    ]
    with log.open("wb") as out:
        return subprocess.Popen(
            command,
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def kill_if_running(worker: subprocess.Popen[bytes]) -> None:
    """The test's ``finally``: a worker the test did not stop warm is killed."""
    if worker.poll() is None:
        worker.kill()
        worker.wait(10)
