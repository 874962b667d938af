"""Real servers for the console's end-to-end tests: the SQS sandbox (``python -m
redrive.sandbox``: moto's server with the built-in families and seeded DLQs) and ``redrive
web`` itself (uvicorn), each a process the test starts on a free loopback port and stops
by its PID."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from conftest import REGION, free_port

ROOT = Path(__file__).resolve().parent.parent


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            if process.poll() is not None:
                tail = log.read_text()[-3000:]
                raise RuntimeError(f"exited {process.returncode}: {tail}") from None
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"nothing listens on {port} after 120 s: {log.read_text()[-3000:]}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@dataclass
class Sandbox:
    """The sandbox's environment (what ``eval "$(redrive sandbox)"`` exports)."""

    env: dict[str, str]

    def sqs(self) -> Any:
        return boto3.client(
            "sqs",
            endpoint_url=self.env["AWS_ENDPOINT_URL"],
            region_name=REGION,
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
        )


@contextmanager
def sqs_sandbox(directory: Path, *, per_family: int = 30, seed: int = 7) -> Iterator[Sandbox]:
    port = free_port()
    out, log = directory / "sandbox.env", directory / "sandbox.log"
    with out.open("wb") as stdout, log.open("wb") as stderr:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "redrive.sandbox", "--port", str(port)),
                *("--per-family", str(per_family), "--seed", str(seed)),
            ],
            stdout=stdout,
            stderr=stderr,
            cwd=ROOT,
        )
    try:
        deadline = time.monotonic() + 120
        while "unset AWS_PROFILE" not in out.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sandbox: {log.read_text()[-3000:]}")
            time.sleep(0.1)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT")}
        for line in out.read_text().splitlines():
            if line.startswith("export "):
                name, _, value = line.removeprefix("export ").partition("=")
                env[name] = shlex.split(value)[0] if value else ""
            elif line.startswith("unset "):
                env.pop(line.removeprefix("unset ").strip(), None)
        yield Sandbox(env)
    finally:
        _stop(process)


@dataclass
class WebServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path


@contextmanager
def redrive_web(
    directory: Path,
    env: Mapping[str, str],
    *web_args: str,
    global_args: tuple[str, ...] = (),
    redrive: Sequence[str] = (sys.executable, "-m", "redrive"),
) -> Iterator[WebServer]:
    """``redrive [GLOBAL] web --bind 127.0.0.1:PORT [WEB_ARGS]`` until the block ends
    (``redrive``: how to run it, e.g. with kill points: ``KillPoints.argv()``)."""
    port = free_port()
    log = directory / f"web-{port}.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [
                *(*redrive, *global_args, "web"),
                *("--bind", f"127.0.0.1:{port}", *web_args),
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**env, "PYTHONUNBUFFERED": "1"},
            cwd=ROOT,
        )
    try:
        _wait_for_port(port, process, log)
        yield WebServer(f"http://127.0.0.1:{port}", process, log)
    finally:
        _stop(process)
