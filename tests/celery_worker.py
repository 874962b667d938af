"""A real Celery worker for the end-to-end tests: one way to start it, wait on it while it
lives, and stop it (:func:`celery_worker`, :func:`run_worker_until`)."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class RunningWorker:
    """A worker started by :func:`celery_worker`: its process and its log."""

    process: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def wait_for(
        self, done: Callable[[], object], what: str, *, timeout: float = 120.0, every: float = 0.2
    ) -> None:
        """Until ``done()``; the worker dying first fails the test with its log. The bound
        is for a hang, not a pace."""
        deadline = time.monotonic() + timeout
        while not done():
            assert self.process.poll() is None, self.tail()
            assert time.monotonic() < deadline, (what, self.tail())
            time.sleep(every)

    def ready(self) -> None:
        """Until the worker says it is ready (it has declared what it consumes from)."""
        self.wait_for(lambda: " ready." in self.log.read_text(errors="replace"), "ready")

    def stop_warm(self, timeout: float = 30.0) -> int:
        """A warm shutdown (SIGTERM: the task in hand finishes); its exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def ended(self, timeout: float = 120.0) -> int:
        """The exit code of a worker that ends by itself (a task that kills it)."""
        return self.process.wait(timeout)


@contextlib.contextmanager
def celery_worker(
    app: str,
    queues: str,
    *,
    cwd: Path,
    env: dict[str, str],
    log: Path,
    name: str | None = None,
    pool: str = "solo",
) -> Iterator[RunningWorker]:
    """A real worker (:func:`start_celery_worker`) for the ``with`` block, killed at its end
    unless the block stopped it."""
    process = start_celery_worker(app, queues, cwd=cwd, env=env, log=log, name=name, pool=pool)
    try:
        yield RunningWorker(process, log)
    finally:
        kill_if_running(process)


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
    warm shutdown that must exit 0; its log."""
    with celery_worker(app, queues, cwd=cwd, env=env, log=log, name=name) as worker:
        worker.wait_for(done, what, timeout=timeout)
        assert worker.stop_warm() == 0, worker.tail()
    return log.read_text()
