"""A real Celery worker for the end-to-end tests: one way to start it, one way to stop it."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def start_celery_worker(
    app: str,
    queues: str,
    *,
    cwd: Path,
    env: dict[str, str],
    log: Path,
    name: str | None = None,
    pool: str = "solo",
) -> subprocess.Popen[bytes]:
    """``celery -A app worker`` on the solo pool (or ``pool``: ``prefork`` runs one pool
    child, for a test that kills it), consuming ``queues`` (comma separated), its output in
    ``log``. Heartbeats, mingle and gossip are off: one worker, nothing to meet."""
    command = [
        *(sys.executable, "-m", "celery", "-A", app, "worker", "--pool", pool),
        *(("--concurrency", "1") if pool == "prefork" else ()),
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


def run_worker_until(
    app: str,
    queues: str,
    *,
    cwd: Path,
    env: dict[str, str],
    log: Path,
    name: str,
    done: Callable[[], object],
    what: str,
    timeout: float = 120.0,
) -> str:
    """A real worker until ``done()`` (it dying first fails the test with its log), then a
    warm shutdown that must exit 0; its log. The bound is for a hang, not a pace."""
    worker = start_celery_worker(app, queues, cwd=cwd, env=env, log=log, name=name)
    try:
        deadline = time.monotonic() + timeout
        while not done():
            assert worker.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, (what, log.read_text()[-3000:])
            time.sleep(0.2)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log.read_text()[-3000:]
    finally:
        kill_if_running(worker)
    return log.read_text()
