"""LocalStack's SQS on 127.0.0.1 for the tests: a real LocalStack, run on the host (no
Docker) from its own venv, so that a broker contract can run on moto and on LocalStack.

Named ``localstack_server``, not ``localstack``: the tests folder is on ``sys.path``, and a
module there named ``localstack`` would hide LocalStack's own package from anything that
imports it.

LocalStack 4.13.1 from ``requirements/localstack.txt``, installed by ``make localstack``
into ``.venv-localstack`` (or the python that ``REDRIVE_LOCALSTACK_PYTHON`` names). It runs
as ``python -m localstack.runtime.main``, as LocalStack's own ``make start`` does, with:

- ``GATEWAY_SERVER=hypercorn``: LocalStack's default server (twisted) listens on every
  interface whatever ``GATEWAY_LISTEN`` says; hypercorn binds 127.0.0.1 only.
- ``SQS_ENDPOINT_STRATEGY=off`` and ``LOCALSTACK_HOST=127.0.0.1:PORT``: queue URLs are
  ``http://127.0.0.1:PORT/000000000000/NAME``, moto's shape, on an address that resolves
  here (the default, ``sqs.REGION.localhost.localstack.cloud``, needs public DNS).
- ``SERVICES=sqs`` with ``EAGER_SERVICE_LOADING=1``: health says ``"sqs": "running"``
  once SQS is loaded, not at its first request.
- Nothing leaves the machine: ``DISABLE_EVENTS=1`` (no analytics),
  ``SKIP_SSL_CERT_DOWNLOAD=1`` (a self-signed certificate), ``DNS_ADDRESS=0`` (no DNS
  server on port 53), ``SQS_DISABLE_CLOUDWATCH_METRICS=1``.
- Its files stay in the test's own directory: ``HOME``, ``TMPDIR``, ``FILESYSTEM_ROOT``
  and ``LOCALSTACK_VOLUME_DIR`` (LocalStack warns that ``TMPDIR`` is deprecated: it still
  decides where its temporary folder goes).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LOCALSTACK_PYTHON = Path(
    os.environ.get("REDRIVE_LOCALSTACK_PYTHON") or REPO / ".venv-localstack" / "bin" / "python"
)
VERSION = "4.13.1"
REGION = "us-east-1"
ACCOUNT = "000000000000"
#: A bound for a hang, not a pace: it starts in about 1.5 s here, alone.
START_TIMEOUT = 120.0
# What the LocalStack process may see of this one's environment: nothing else (no AWS_*,
# no PYTHONPATH), but a faked clock (make test-clock-ahead) reaches it as any subprocess.
_PASSED_THROUGH = ("PATH", "LANG", "LC_ALL", "LD_PRELOAD", "FAKETIME")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalStackMissing(RuntimeError):
    """No LocalStack python where the tests look for it."""


@dataclass
class LocalStackServer:
    endpoint_url: str
    process: subprocess.Popen[bytes]
    log: Path
    started_in: float
    """Seconds from the process's start until SQS answered its first call."""

    def client(self, service: str = "sqs", **kwargs: Any) -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id="test",
            aws_secret_access_key="test",
            **kwargs,
        )

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"(no log at {self.log}: {exc})"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s: on hypercorn, LocalStack's shutdown sometimes
        hangs (seen: 1 of 4 under xdist, and two by hand that never went). It keeps nothing
        (PERSISTENCE=0, files in the test's temp dir), so a kill loses nothing."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


def environment(directory: Path, port: int) -> dict[str, str]:
    home, tmp, root = directory / "home", directory / "tmp", directory / "filesystem"
    for folder in (home, tmp, root):
        folder.mkdir(parents=True, exist_ok=True)
    env = {
        name: value
        for name, value in os.environ.items()
        if name in _PASSED_THROUGH or name.startswith("FAKETIME_")
    }
    env.setdefault("PATH", os.defpath)
    env.update(
        HOME=str(home),
        TMPDIR=str(tmp),
        FILESYSTEM_ROOT=str(root),
        LOCALSTACK_VOLUME_DIR=str(root / "volume"),
        GATEWAY_LISTEN=f"127.0.0.1:{port}",
        GATEWAY_SERVER="hypercorn",
        LOCALSTACK_HOST=f"127.0.0.1:{port}",
        SQS_ENDPOINT_STRATEGY="off",
        SERVICES="sqs",
        EAGER_SERVICE_LOADING="1",
        DISABLE_EVENTS="1",
        SKIP_SSL_CERT_DOWNLOAD="1",
        DNS_ADDRESS="0",
        SQS_DISABLE_CLOUDWATCH_METRICS="1",
        PERSISTENCE="0",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env


def _sqs_running(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_localstack/health", timeout=5) as response:
            health = json.load(response)
    except (OSError, ValueError):
        return False
    return bool(health.get("services", {}).get("sqs") == "running")


def _start_once(directory: Path, python: Path) -> tuple[LocalStackServer | None, Path]:
    """One try on a free port: None (and its log) if the process exited before SQS ran (its
    port taken in the meantime, say), so that the caller tries another port."""
    port = free_port()
    log = directory / f"localstack-{port}.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [str(python), "-m", "localstack.runtime.main"],
            cwd=directory,
            env=environment(directory, port),
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    started = time.monotonic()
    url = f"http://127.0.0.1:{port}"
    server = LocalStackServer(url, process, log, 0.0)
    deadline = started + START_TIMEOUT
    while not _sqs_running(url):
        if process.poll() is not None:
            return None, log
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(
                f"LocalStack's SQS was not running within {START_TIMEOUT:.0f} s "
                f"(log {log}):\n{server.log_tail()}"
            )
        time.sleep(0.05)
    # Health says running once SQS is loaded; its first call still builds what it serves
    # calls with (seconds, under load). Made here, so no test's first call pays for it.
    try:
        server.client().list_queues()
    except Exception:
        server.stop()
        raise
    server.started_in = time.monotonic() - started
    return server, log


def start_localstack(directory: Path, *, python: Path = LOCALSTACK_PYTHON) -> LocalStackServer:
    """LocalStack's SQS on 127.0.0.1 and a free port, its files under ``directory``."""
    if not python.exists():
        raise LocalStackMissing(
            f"no LocalStack python at {python}: run `make localstack` (it installs "
            "requirements/localstack.txt into .venv-localstack) or set "
            "REDRIVE_LOCALSTACK_PYTHON"
        )
    directory.mkdir(parents=True, exist_ok=True)
    tails: list[str] = []
    for _ in range(3):
        server, log = _start_once(directory, python)
        if server is not None:
            return server
        tails.append(f"--- {log}\n{log.read_text(errors='replace')[-2000:]}")
    raise RuntimeError("LocalStack exited before its SQS ran, three times:\n" + "\n".join(tails))


def reset_sqs(server: LocalStackServer) -> None:
    """Delete every queue (a test's own state), as ``MotoServer.reset`` empties moto."""
    client = server.client()
    for page in client.get_paginator("list_queues").paginate():
        for url in page.get("QueueUrls", []):
            with contextlib.suppress(client.exceptions.QueueDoesNotExist):
                client.delete_queue(QueueUrl=url)
