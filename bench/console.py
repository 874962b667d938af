"""The console under 20 viewers (issue 41, item 8): p95 of the overview and a DLQ page after
the first scan, how many scans each DLQ took per refresh interval, counted by the broker,
and the server's peak memory (its DLQ pages list the messages a page at a time from the
scan's spool on disk: the memory should not grow with the DLQ).

Setup, as the sandbox's: the built-in layout's three families (checkout, default, progress)
(``--dlqs`` of them), each DLQ holding ``--messages`` Celery tasks (10,000 by default), on
bench/fast_sqs.py (``--broker sqs``) or on a private RabbitMQ node (``--broker rabbitmq``:
Debian's 3.10, quorum DLQs with an ``x-delivery-limit`` of their own far above the run's
scans, filled through RabbitMQ's dead-lettering; ``redrive web --allow-delivery-limit``);
``redrive web --refresh R`` as a subprocess against it. Once every DLQ's first scan is over
(``/api/overview`` polled), ``--viewers`` threads (20) request the overview (``/``) and a
DLQ page (``/dlq/FAMILY?page=N``: the DLQs in turn, the pages of messages spread over the
whole list) back to back, one keep-alive connection each, for ``--seconds``. The issue's
run is 5 minutes of 60 s intervals; here the interval is scaled down by ``--refresh`` (10 s
by default: 6 intervals a minute) so that a run of ``--seconds`` (60) covers as many
intervals as 5 minutes would at 60 s, plus one.

Scans are counted by the broker, once the run is over: on SQS each message's
``ApproximateReceiveCount`` (every scan receives every message once; this script's own look
adds one, taken off) and fast_sqs's ReceiveMessage calls (``GET /stats``); on RabbitMQ each
message's ``x-delivery-count`` (a quorum queue counts every delivery). A DLQ may take at
most ``1 + ceil(seconds / refresh)`` scans (the first, and one per interval that began
during the run).

Memory: the server's peak RSS (``VmHWM`` in /proc) once the first scans are over and at the
end, and the size of the scans' spools on disk (the server's TMPDIR is the run's own).

    .venv/bin/python bench/console.py [--broker sqs|rabbitmq] [--messages 10000]
        [--dlqs 3] [--viewers 20] [--seconds 60] [--refresh 10] [--amqp-url URL --api-url URL]

With ``--amqp-url`` and ``--api-url`` (a vhost of a node already running: the tests') no node
is started.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder comes first on sys.path, and bench/inspect.py would
# shadow the standard library's inspect module for everything imported after this line.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
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
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.common import HOST, PYTHON, REGION, child_env, log  # noqa: E402

FAMILIES = (("checkout", "onion-checkout"), ("default", "onion"), ("progress", "onion-progress"))
TASKS = ("apps.payments.tasks.capture_payment", "apps.payments.tasks.refund")
PAGE_SIZE = 50  # redrive.web.paging.PAGE_SIZE
DELIVERY_LIMIT = 1_000  # the quorum DLQs' own, far above a run's scans


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


class SqsBroker:
    """bench/fast_sqs.py, the families' queues on it; scans counted by receive counts."""

    name = "sqs"

    def __init__(self, state: str) -> None:
        self.state = state
        self.endpoint = f"http://{HOST}:{free_port()}"
        port = self.endpoint.rsplit(":", 1)[1]
        self.server = subprocess.Popen(
            [PYTHON, "-P", os.path.join(ROOT, "bench", "fast_sqs.py"), "--port", port],
            stdout=subprocess.DEVNULL,
        )
        wait_for(self.endpoint + "/", 60, self.server)
        self.client = sqs_client(self.endpoint)
        self.dlqs: dict[str, str] = {}

    def fill(self, families: tuple[tuple[str, str], ...], messages: int) -> None:
        from redrive.sandbox.encoder import encode

        client = self.client
        for family, queue in families:
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
            self.dlqs[family] = dlq

    def env(self) -> dict[str, str]:
        return child_env(self.endpoint, self.state, 0)

    def web_args(self) -> list[str]:
        return []

    def calls(self) -> dict[str, int]:
        with urllib.request.urlopen(self.endpoint + "/stats", timeout=10) as answer:
            data: dict[str, int] = json.loads(answer.read())
            return data

    def scans(self, family: str) -> Counter[int]:
        """How many times SQS delivered each message of the DLQ (this look taken off)."""
        counts: Counter[int] = Counter()
        while True:
            got = self.client.receive_message(
                QueueUrl=self.dlqs[family],
                MaxNumberOfMessages=10,
                VisibilityTimeout=600,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            ).get("Messages", [])
            if not got:
                return counts
            counts.update(int(m["Attributes"]["ApproximateReceiveCount"]) - 1 for m in got)

    def stop(self) -> None:
        if self.server.poll() is None:
            self.server.terminate()
            self.server.wait(30)


class RabbitBroker:
    """A private RabbitMQ node, the families' queues on it with quorum DLQs; scans counted
    by each message's x-delivery-count."""

    name = "rabbitmq"

    def __init__(self, state: str, amqp_url: str | None, api_url: str | None) -> None:
        from redrive.sandbox.rabbitmq_node import start_node

        self.state = state
        self.node = None
        if amqp_url is None or api_url is None:
            self.node = start_node(Path(tempfile.mkdtemp(prefix="bench-console-rmq-")))
            amqp_url, api_url = self.node.amqp_url, self.node.api_url
        self.amqp_url, self.api_url = amqp_url, api_url
        self.dlqs: dict[str, str] = {}

    def fill(self, families: tuple[tuple[str, str], ...], messages: int) -> None:
        from redrive.sandbox.rabbitmq_layout import fill_layout, rabbit_families

        names = {family for family, _ in families}
        chosen = [
            dataclasses.replace(f, dlq_delivery_limit=DELIVERY_LIMIT)
            for f in rabbit_families(dlq_type="quorum")
            if f.name in names
        ]
        fill_layout(self.amqp_url, chosen, messages)
        self.dlqs = {f.name: f.dlq for f in chosen}

    def env(self) -> dict[str, str]:
        return child_env("http://127.0.0.1:9", self.state, 0)  # no SQS: nothing listens

    def web_args(self) -> list[str]:
        return ["--broker", self.amqp_url, "--rabbitmq-api", self.api_url, "--allow-delivery-limit"]

    def calls(self) -> dict[str, int]:
        return {}

    def scans(self, family: str) -> Counter[int]:
        """How many times RabbitMQ delivered each message of the DLQ before this look (its
        x-delivery-count); the look gives them back."""
        from redrive.sandbox.rabbitmq_layout import open_connection, raw_channel

        connection = open_connection(self.amqp_url)
        counts: Counter[int] = Counter()
        try:
            channel = raw_channel(connection)
            while (got := channel.basic_get(self.dlqs[family], no_ack=False)) is not None:
                headers = dict(got.properties.get("application_headers") or {})
                counts[int(headers.get("x-delivery-count", 0) or 0)] += 1
        finally:
            connection.close()
        return counts

    def stop(self) -> None:
        if self.node is not None:
            self.node.stop()


class Viewers:
    """``n`` threads requesting pages back to back until ``stop``; latencies by page."""

    def __init__(self, port: int, n: int, families: list[str], pages: int) -> None:
        self.port = port
        self.n = n
        self.families = families
        self.pages = max(1, pages)
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

    def _path(self, turn: int) -> str:
        family = self.families[turn % len(self.families)]
        # Spread over the whole list: the first page, the last, and those between.
        return f"/dlq/{family}?page={(turn * 7919) % self.pages + 1}"

    def _viewer(self, number: int) -> None:
        conn = http.client.HTTPConnection(HOST, self.port, timeout=60)
        turn = number
        while not self.stop.is_set():
            for page, path in (("overview", "/"), ("dlq", self._path(turn))):
                started = time.perf_counter()
                try:
                    conn.request("GET", path)
                    response = conn.getresponse()
                    response.read()
                    status = response.status
                except (OSError, http.client.HTTPException) as exc:
                    self.errors[type(exc).__name__] += 1
                    conn.close()
                    conn = http.client.HTTPConnection(HOST, self.port, timeout=60)
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


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), MB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def disk_mb(folder: str) -> float:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_blocks * 512
    return total / 1e6


def first_scans(base: str, families: list[str], process: subprocess.Popen[bytes]) -> None:
    """Wait until every DLQ's first scan is shown (the overview asks for each)."""
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"redrive web exited with {process.returncode}")
        with urllib.request.urlopen(base + "/api/overview", timeout=600) as answer:
            scans = json.loads(answer.read())["scans"]
        if all(scans[f]["scanned_at"] is not None for f in families):
            return
        time.sleep(1)
    raise RuntimeError("the first scans did not end within 30 minutes")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", choices=("sqs", "rabbitmq"), default="sqs")
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--dlqs", type=int, choices=(1, 2, 3), default=3)
    parser.add_argument("--viewers", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--refresh", type=float, default=10.0)
    parser.add_argument("--amqp-url", help="a RabbitMQ vhost to use (else a node is started)")
    parser.add_argument("--api-url", help="its management API")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="redrive-bench-console-") as state:
        return bench(args, state)


def bench(args: argparse.Namespace, state: str) -> int:
    families = FAMILIES[: args.dlqs]
    names = [f for f, _ in families]
    broker: SqsBroker | RabbitBroker | None = None
    web: subprocess.Popen[bytes] | None = None
    try:
        broker = (
            SqsBroker(state)
            if args.broker == "sqs"
            else RabbitBroker(state, args.amqp_url, args.api_url)
        )
        started = time.monotonic()
        broker.fill(families, args.messages)
        log(
            f"filled {len(families)} DLQ(s) of {args.messages:,} on {broker.name} in "
            f"{time.monotonic() - started:.1f} s"
        )
        spools = os.path.join(state, "tmp")
        os.mkdir(spools)
        env = broker.env() | {"TMPDIR": spools}
        web_port = free_port()
        web = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "redrive",
                *broker.web_args(),
                "web",
                "--bind",
                f"{HOST}:{web_port}",
                "--refresh",
                f"{args.refresh:g}s",
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(state, "web.log"), "wb"),  # noqa: SIM115
        )
        base = f"http://{HOST}:{web_port}"
        wait_for(base + "/healthz", 60, web)
        started = time.monotonic()
        first_scans(base, names, web)
        memory = Memory(peak_rss_mb(web.pid), disk_mb(spools))
        log(f"first scans: {time.monotonic() - started:.1f} s")
        before = broker.calls()
        viewers = Viewers(web_port, args.viewers, names, math.ceil(args.messages / PAGE_SIZE))
        viewers.run(args.seconds)
        after = broker.calls()
        memory.peak_end = peak_rss_mb(web.pid)
        web.terminate()
        web.wait(60)
        web = None
        ok = report(args, viewers, broker, memory, before, after)
        if viewers.errors:
            # The server's own words for what went wrong (its log goes with the run's folder).
            with open(os.path.join(state, "web.log"), errors="replace") as log_file:
                print("  the server's log ends:\n" + "".join(log_file.readlines()[-40:]))
        return 0 if ok else 1
    finally:
        if web is not None and web.poll() is None:
            web.terminate()
            web.wait(30)
        if broker is not None:
            broker.stop()


@dataclasses.dataclass
class Memory:
    """The server's peak RSS once the first scans were over, its spools' size on disk then,
    and its peak RSS at the end of the run (MB)."""

    peak_first: float
    spool_disk: float
    peak_end: float = float("nan")


def report(
    args: argparse.Namespace,
    viewers: Viewers,
    broker: SqsBroker | RabbitBroker,
    memory: Memory,
    before: dict[str, int],
    after: dict[str, int],
) -> bool:
    """Print the figures; whether the run passed its checks (no error answered, no DLQ
    scanned more often than the interval allows, every message read as often, but for the
    part a scan stopped by the server's end had read)."""
    print(
        f"{args.viewers} viewers for {args.seconds:g} s, --refresh {args.refresh:g}s "
        f"(scaled down from 60 s), {args.dlqs} DLQ(s) of {args.messages:,} on {broker.name}"
    )
    for page, values in viewers.latencies.items():
        print(
            f"  {page:8s} requests {len(values):6d}  p50 {percentile(values, 0.5) * 1000:7.1f} ms"
            f"  p95 {percentile(values, 0.95) * 1000:7.1f} ms  max {max(values) * 1000:7.1f} ms"
            f"  mean {statistics.fmean(values) * 1000:6.1f} ms"
            if values
            else f"  {page}: no answer"
        )
    print(
        f"  server peak RSS (VmHWM): {memory.peak_first:.1f} MB after the first scans, "
        f"{memory.peak_end:.1f} MB at the end; spools on disk {memory.spool_disk:.1f} MB"
    )
    ok = not viewers.errors and all(viewers.latencies.values())
    if viewers.errors:
        print(f"  errors: {dict(viewers.errors)}")
    allowed = 1 + math.ceil(args.seconds / args.refresh)
    if "ReceiveMessage" in after:
        receives = after["ReceiveMessage"] - before.get("ReceiveMessage", 0)
        print(f"  ReceiveMessage calls during the run: {receives:,}")
    for family in broker.dlqs:
        counts = broker.scans(family)
        print(
            f"  {family:8s} deliveries per message (= scans, the first included): "
            f"{dict(sorted(counts.items()))}; at most {allowed} allowed "
            f"({(max(counts) - 1) / (args.seconds / args.refresh):.2f} per interval after "
            "the first)"
        )
        # A scan under way when the server stops is stopped there: it read part of the DLQ.
        ok = ok and max(counts) <= allowed and max(counts) - min(counts) <= 1
        ok = ok and sum(counts.values()) == args.messages
    print("checks: " + ("passed" if ok else "FAILED"))
    return ok


if __name__ == "__main__":
    sys.exit(main())
