"""Time ``redrive sandbox --messages N`` as a user meets it: seeding, then a full inspect scan.

For each size N: start ``python -m redrive sandbox --port P --messages N`` (a subprocess, so
its CPU time can be read from /proc/<pid>/stat), wait for ``sandbox ready`` on its stderr
(seeding time: spawn to ready, interpreter start-up included), take the ``export`` lines it
prints the way a shell that pasted them would, then run, each as a subprocess of its own:

- ``redrive status --json`` (the DLQ depths it reports are the check: 3 x N visible);
- ``redrive inspect checkout --json`` (a full scan: it must count N, and exit 0);
- ``redrive move checkout --newer-than 6h --json`` (a dry run with an age filter: a scan too).

Each run records wall time, its exit code and what it counted, and the sandbox's CPU seconds
during it. A size passes when every command counted every message and exited 0.
The sandbox's own long poll default (REDRIVE_RECEIVE_WAIT unset: 1 s) is kept unless
``--receive-wait`` says otherwise: that is what a newcomer's terminal does.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/sandbox.py --sizes 2000,10000

Everything listens on and talks to 127.0.0.1; every child process has a timeout.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder comes first on sys.path, and bench/inspect.py would
# shadow the standard library's inspect module. The repository root instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import json  # noqa: E402
import shlex  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

from bench.common import PYTHON, ROOT, log, parse_sizes  # noqa: E402

READY = "sandbox ready"


def read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


@dataclass
class Step:
    name: str
    seconds: float
    server_cpu: float
    rc: int
    counted: int | None
    note: str


def base_env(home: str, wait: int | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "CELERY_", "REDRIVE_", "PYTHON"))
        and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")
    }
    env["HOME"] = home
    env["AWS_CONFIG_FILE"] = os.path.join(home, "aws-config-absent")
    env["AWS_SHARED_CREDENTIALS_FILE"] = os.path.join(home, "aws-credentials-absent")
    env["NO_PROXY"] = "127.0.0.1,localhost"
    if wait is not None:
        env["REDRIVE_RECEIVE_WAIT"] = str(wait)
    return env


def exports(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            found[name] = shlex.split(value)[0] if value else ""
    return found


def run_step(name: str, args: list[str], env: dict[str, str], pid: int, timeout: float) -> Step:
    cpu = cpu_seconds(pid)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [PYTHON, "-m", "redrive", *args],
            env=env,
            cwd=env["HOME"],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return Step(name, time.monotonic() - started, cpu_seconds(pid) - cpu, -1, None, "timeout")
    seconds = time.monotonic() - started
    counted: int | None = None
    note = (done.stderr.strip().splitlines() or [""])[-1][:160]
    try:
        data: Any = json.loads(done.stdout)
    except ValueError:
        data = None
    if isinstance(data, dict):
        if "families" in data:
            counted = sum(int(f["dlq_counts"]["visible"] or 0) for f in data["families"])
        elif "total" in data:
            counted = int(data["total"])
        elif "scanned" in data:
            counted = int(data["scanned"])
        elif "matched" in data:
            counted = int(data["matched"]) + sum(int(v) for v in data.get("skipped", {}).values())
    return Step(name, seconds, cpu_seconds(pid) - cpu, done.returncode, counted, note)


def bench_size(n: int, wait: int | None, timeout: float) -> tuple[float, float, list[Step]]:
    with tempfile.TemporaryDirectory(prefix="redrive-bench-sandbox-") as home:
        env = base_env(home, wait)
        port = free_port()
        out_path, err_path = os.path.join(home, "out"), os.path.join(home, "err")
        with open(out_path, "w") as out, open(err_path, "w") as err:
            started = time.monotonic()
            server = subprocess.Popen(
                [PYTHON, "-m", "redrive", "sandbox", "--port", str(port), "--messages", str(n)],
                env={**env, "PYTHONPATH": ROOT},
                cwd=home,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
        try:
            while READY not in read(err_path):
                if server.poll() is not None:
                    raise SystemExit(f"sandbox exited: {read(err_path)[-2000:]}")
                if time.monotonic() - started > timeout:
                    raise SystemExit(f"sandbox not ready after {timeout:g} s")
                time.sleep(0.1)
            seeded = time.monotonic() - started
            seed_cpu = cpu_seconds(server.pid)
            shell = {**env, **exports(read(out_path)), "PYTHONPATH": ROOT}
            shell.pop("AWS_PROFILE", None)
            shell.setdefault("REDRIVE_STATE_DIR", os.path.join(home, "state"))
            steps = []
            for name, args in (
                ("status", ["status", "--json"]),
                ("inspect checkout", ["inspect", "checkout", "--json"]),
                ("move --newer-than 6h (dry run)", ["move", "checkout", "--newer-than", "6h"]),
            ):
                step = run_step(
                    name,
                    [*args, "--json"] if "--json" not in args else args,
                    shell,
                    server.pid,
                    timeout,
                )
                log(f"  N={n:,} {name}: {step.seconds:.1f} s rc={step.rc} counted={step.counted}")
                steps.append(step)
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
    return seeded, seed_cpu, steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=parse_sizes("2000,10000"))
    parser.add_argument("--receive-wait", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per step")
    args = parser.parse_args()
    ok = True
    rows = []
    for n in args.sizes:
        log(f"N={n:,} per family: starting the sandbox")
        seeded, seed_cpu, steps = bench_size(n, args.receive_wait, args.timeout)
        rows.append((n, seeded, seed_cpu, steps))
        expected = {"status": 3 * n}
        for step in steps:
            if step.rc != 0 or step.counted != expected.get(step.name, n):
                ok = False
    print("| N per DLQ | step | wall s | sandbox CPU s | exit | counted | last stderr line |")
    print("|---|---|---|---|---|---|---|")
    for n, seeded, seed_cpu, steps in rows:
        print(f"| {n:,} | seeding (spawn to ready, 3 DLQs) | {seeded:.1f} | {seed_cpu:.1f} | | | |")
        for s in steps:
            print(
                f"| {n:,} | {s.name} | {s.seconds:.1f} | {s.server_cpu:.1f} | {s.rc} | "
                f"{s.counted if s.counted is not None else '-'} | {s.note} |"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
