"""The console under 20 viewers (issue 41, item 8): p95 of the overview and a DLQ page after
the first scan, and how many scans each DLQ took per refresh interval, counted by the broker.

Setup, as the sandbox's: the built-in layout's three families (checkout, default, progress)
on bench/fast_sqs.py, each DLQ holding ``--messages`` Celery tasks (10,000 by default);
``redrive web --refresh R`` as a subprocess against it. After a first request that waits for
the three first scans, ``--viewers`` threads (20) request the overview (``/``) and a DLQ page
(``/dlq/FAMILY``, the three in turn) back to back, one keep-alive connection each, for
``--seconds``. The issue's run is 5 minutes of 60 s intervals; here the interval is scaled
down by ``--refresh`` (10 s by default: 6 intervals a minute) so that a run of ``--seconds``
(60) covers as many intervals as 5 minutes would at 60 s, plus one.

Scans are counted by the broker: each message's ``ApproximateReceiveCount`` once the run is
over (every scan receives every message once; this script's own look adds one, taken off),
and fast_sqs's ReceiveMessage calls (``GET /stats``). A DLQ may take at most
``1 + ceil(seconds / refresh)`` scans (the first, and one per interval that began during
the run).

    .venv/bin/python bench/console.py [--messages 10000] [--viewers 20] [--seconds 60]
        [--refresh 10]
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder comes first on sys.path, and bench/inspect.py would
# shadow the standard library's inspect module for everything imported after this line.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from collections import Counter  # noqa: E402
from typing import Any  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.common import HOST, PYTHON, REGION, child_env, log  # noqa: E402

FAMILIES = (("checkout", "onion-checkout"), ("default", "onion"), ("progress", "onion-progress"))
TASKS = ("apps.payments.tasks.capture_payment", "apps.payments.tasks.refund")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def wait_for(url: str, seconds: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {seconds:.0f} s")


def sqs_client(endpoint: str) -> Any:
    import boto3

    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )


def fill(client: Any, messages: int) -> dict[str, str]:
    """The three families, each DLQ holding ``messages`` tasks: family -> DLQ URL."""
    from redrive.sandbox.encoder import encode

    dlqs = {}
    for family, queue in FAMILIES:
        dlq = client.create_queue(QueueName=f"{queue}-dlq")["QueueUrl"]
        arn = client.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])
        policy = {"deadLetterTargetArn": arn["Attributes"]["QueueArn"], "maxReceiveCount": 5}
        client.create_queue(QueueName=queue, Attributes={"RedrivePolicy": json.dumps(policy)})
        for start in range(0, messages, 10):
            entries = [
                {
                    "Id": str(i),
                    "MessageBody": encode(TASKS[n % 2], [n], {}, task_id=f"{family}-{n}"),
                }
                for i, n in enumerate(range(start, min(start + 10, messages)))
            ]
            client.send_message_batch(QueueUrl=dlq, Entries=entries)
        dlqs[family] = dlq
    return dlqs


def receive_counts(client: Any, url: str) -> Counter[int]:
    """How many times the broker delivered each message of the DLQ (this look taken off)."""
    counts: Counter[int] = Counter()
    while True:
        got = client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=600,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        ).get("Messages", [])
        if not got:
            return counts
        counts.update(int(m["Attributes"]["ApproximateReceiveCount"]) - 1 for m in got)


class Viewers:
    """``n`` threads requesting pages back to back until ``stop``; latencies by page."""

    def __init__(self, port: int, n: int) -> None:
        self.port = port
        self.n = n
        self.stop = threading.Event()
        self.latencies: dict[str, list[float]] = {"overview": [], "dlq": []}
        self.errors: Counter[str] = Counter()
        self._lock = threading.Lock()

    def run(self, seconds: float) -> None:
        threads = [threading.Thread(target=self._viewer, args=(i,)) for i in range(self.n)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        self.stop.set()
        for t in threads:
            t.join(60)

    def _viewer(self, number: int) -> None:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=30)
        turn = number
        while not self.stop.is_set():
            family = FAMILIES[turn % len(FAMILIES)][0]
            for page, path in (("overview", "/"), ("dlq", f"/dlq/{family}")):
                started = time.perf_counter()
                try:
                    conn.request("GET", path)
                    response = conn.getresponse()
                    response.read()
                    status = response.status
                except (OSError, http.client.HTTPException) as exc:
                    self.errors[type(exc).__name__] += 1
                    conn.close()
                    conn = http.client.HTTPConnection(HOST, self.port, timeout=30)
                    continue
                took = time.perf_counter() - started
                with self._lock:
                    if status == 200:
                        self.latencies[page].append(took)
                    else:
                        self.errors[f"HTTP {status}"] += 1
            turn += 1
        conn.close()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def calls(endpoint: str) -> dict[str, int]:
    with urllib.request.urlopen(endpoint + "/stats", timeout=10) as answer:
        data: dict[str, int] = json.loads(answer.read())
        return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--viewers", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--refresh", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="redrive-bench-console-") as state:
        return bench(args, state)


def bench(args: argparse.Namespace, state: str) -> int:
    ok = False
    sqs_port, web_port = free_port(), free_port()
    endpoint = f"http://{HOST}:{sqs_port}"
    server = subprocess.Popen(
        [PYTHON, "-P", os.path.join(ROOT, "bench", "fast_sqs.py"), "--port", str(sqs_port)],
        stdout=subprocess.DEVNULL,
    )
    web: subprocess.Popen[bytes] | None = None
    try:
        wait_for(endpoint + "/", 60, server)
        client = sqs_client(endpoint)
        started = time.monotonic()
        dlqs = fill(client, args.messages)
        log(f"filled 3 DLQs of {args.messages:,} in {time.monotonic() - started:.1f} s")
        env = child_env(endpoint, state, 0)
        refresh = f"{args.refresh:g}s"
        web = subprocess.Popen(
            [PYTHON, "-m", "redrive", "web", "--bind", f"{HOST}:{web_port}", "--refresh", refresh],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(state, "web.log"), "wb"),  # noqa: SIM115
        )
        base = f"http://{HOST}:{web_port}"
        wait_for(base + "/healthz", 60, web)
        started = time.monotonic()
        with urllib.request.urlopen(base + "/", timeout=300) as first:
            first.read()
        log(f"first overview (the three first scans): {time.monotonic() - started:.1f} s")
        before = calls(endpoint)
        viewers = Viewers(web_port, args.viewers)
        viewers.run(args.seconds)
        after = calls(endpoint)
        web.terminate()
        web.wait(60)
        web = None
        ok = report(args, viewers, dlqs, client, before, after)
    finally:
        for process in (web, server):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(30)
    return 0 if ok else 1


def report(
    args: argparse.Namespace,
    viewers: Viewers,
    dlqs: dict[str, str],
    client: Any,
    before: dict[str, int],
    after: dict[str, int],
) -> bool:
    """Print the figures; whether the run passed its checks (no error answered, no DLQ
    scanned more often than the interval allows, every message read as often, but for the
    part a scan stopped by the server's end had read)."""
    print(
        f"{args.viewers} viewers for {args.seconds:g} s, --refresh {args.refresh:g}s "
        f"(scaled down from 60 s), 3 DLQs of {args.messages:,}"
    )
    for page, values in viewers.latencies.items():
        print(
            f"  {page:8s} requests {len(values):6d}  p50 {percentile(values, 0.5) * 1000:7.1f} ms"
            f"  p95 {percentile(values, 0.95) * 1000:7.1f} ms  max {max(values) * 1000:7.1f} ms"
            f"  mean {statistics.fmean(values) * 1000:6.1f} ms"
            if values
            else f"  {page}: no answer"
        )
    ok = not viewers.errors and all(viewers.latencies.values())
    if viewers.errors:
        print(f"  errors: {dict(viewers.errors)}")
    allowed = 1 + math.ceil(args.seconds / args.refresh)
    receives = after.get("ReceiveMessage", 0) - before.get("ReceiveMessage", 0)
    print(f"  ReceiveMessage calls during the run: {receives:,}")
    for family, url in dlqs.items():
        counts = receive_counts(client, url)
        print(
            f"  {family:8s} receives per message (= scans, the first included): "
            f"{dict(sorted(counts.items()))}; at most {allowed} allowed "
            f"({(max(counts) - 1) / (args.seconds / args.refresh):.2f} per interval after "
            "the first)"
        )
        # A scan under way when the server stops is stopped there: it read part of the DLQ.
        ok = ok and max(counts) <= allowed and max(counts) - min(counts) <= 1
    print("checks: " + ("passed" if ok else "FAILED"))
    return ok


if __name__ == "__main__":
    sys.exit(main())
