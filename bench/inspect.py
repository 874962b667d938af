"""Benchmark ``redrive inspect`` against a minimal hand-written boto3 scan, on a local SQS.

For each server kind (``fast``: bench/fast_sqs.py, O(1) per call; ``moto``: the project's
moto sandbox, whose cost grows with queue depth) and each size N, this:

1. starts a fresh server on 127.0.0.1 (a subprocess, so its CPU time can be read from
   /proc/<pid>/stat),
2. creates the built-in ``checkout`` family (onion-checkout, and onion-checkout-dlq as its
   DLQ with maxReceiveCount 5) and seeds the DLQ with N realistic Celery messages through
   SendMessageBatch (seeding is timed and reported, not benchmarked),
3. runs, over ``--rounds`` rounds and in a rotating order (interleaved, so drift of the
   machine hits every tool alike), each tool as a subprocess of its own:

   - ``redrive``: ``python -m redrive inspect checkout --json``;
   - ``handwritten``: the minimal batched scan a person would write with boto3: receive 10
     (same long VisibilityTimeout, same attributes, 1 s long poll, stop at the first empty
     answer), ``redrive.messages.decode`` each body, count per task, keep the receipt
     handles in a list, then ChangeMessageVisibilityBatch them back to 0, 10 at a time;
   - ``floor``: the same without decode or counting: what boto3 and the server cost alone.

   For each run it records wall time (spawn to exit), the child's peak RSS and CPU time
   (``os.wait4`` rusage of that child; ru_maxrss is KiB on Linux), the server's CPU seconds
   during the run (utime+stime from /proc), and the scan time the tool measured itself
   (after interpreter start-up and imports). It checks the tool counted N messages and
   that the DLQ holds N visible, 0 in-flight messages again afterwards.
4. prints one table per server kind with medians over the rounds.

Usage (from the repository root, with the project's venv)::

    .venv/bin/python bench/inspect.py --server fast --sizes 1000,10000,100000 --rounds 3
    .venv/bin/python bench/inspect.py --server moto --sizes 1000,2000 --rounds 3

Every request goes to 127.0.0.1; every loop and every child process is bounded.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's folder is sys.path[0] and this very file would shadow the
# standard library's ``inspect`` module (dataclasses, boto3 ... import it). Drop the folder.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
# The repository root instead: what both scripts share is bench/common.py.
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import socket  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Iterator, Sequence  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from bench.common import (  # noqa: E402
    DLQ,
    DLQ_RETENTION,
    FAMILY,
    HOST,
    MAX_RECEIVE_COUNT,
    PYTHON,
    QUEUE,
    REGION,
    ROOT,
    TASKS,
    arguments,
    child_env,
    log,
    median,
    parse_sizes,
)

TOOLS = ("redrive", "handwritten", "floor")
#: Diagnostic variant, not run by default: redrive with its scan ending at the first empty
#: long poll instead of the second (redrive.dlq.scan.DlqScan.stop_after_empty = 1).
#: ``redrive-where``: redrive inspect with ``--where`` (``--where EXPR``; issue 15's target is
#: at least 0.9x redrive's own throughput without it, same run).
EXTRA_TOOLS = ("redrive-1empty", "redrive-where")
# Reads a kwarg of every message (so every message's arguments are decoded) and matches
# every one, so the two runs count the same messages: what is measured is the expression.
DEFAULT_WHERE = "kwargs.currency != 'EUR'"
WHERE = [DEFAULT_WHERE]
_ONE_EMPTY = (
    "import functools, sys\n"
    "import redrive.dlq.scan, redrive.inspection.scan\n"
    "redrive.inspection.scan.DlqScan = functools.partial(\n"
    "    redrive.dlq.scan.DlqScan, stop_after_empty=1\n"
    ")\n"
    "from redrive.cli import main\n"
    "sys.exit(main())\n"
)
BACKEND_KINDS = ("redis", "sqlite")
BACKEND_TOOLS = tuple(f"redrive+{k}" for k in BACKEND_KINDS)
CHILD_TIMEOUT = 3_600  # seconds one scan may take before it is killed
SEED_TIMEOUT = 3_600  # seconds seeding one size may take


# -- the hand-written scan (runs in its own process) ---------------------------------------------


def hold_seconds(depth: int) -> int:
    """A visibility timeout long enough for a whole scan of ``depth``, as a person picks one
    (and as redrive did before it renewed short holds: redrive.dlq.scan.hold_seconds)."""
    return max(120, min(43_200, 120 + depth // 50))


def handwritten_scan(
    queue: str, expect: int, *, decode_bodies: bool, wait: int = 1
) -> dict[str, Any]:
    """Receive 10 at a time, decode, count per task, then make everything visible again."""
    import boto3

    from redrive.messages import decode

    client = boto3.client("sqs")  # endpoint, region and credentials from the environment
    started = time.perf_counter()
    url = client.get_queue_url(QueueName=queue)["QueueUrl"]
    hold = hold_seconds(expect)
    counts: Counter[str] = Counter()
    handles: list[str] = []
    received = 0
    for _ in range(expect // 10 + 1_000):  # bounded: an empty answer ends it well before
        messages = client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=hold,
            WaitTimeSeconds=wait,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        ).get("Messages", [])
        if not messages:
            break
        received += len(messages)
        for message in messages:
            if decode_bodies:
                counts[decode(message["Body"]).task] += 1
            handles.append(message["ReceiptHandle"])
    scanned = time.perf_counter()
    released = failed = 0
    for first in range(0, len(handles), 10):
        response = client.change_message_visibility_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": handle, "VisibilityTimeout": 0}
                for i, handle in enumerate(handles[first : first + 10])
            ],
        )
        released += len(response.get("Successful", []))
        failed += len(response.get("Failed", []))
    done = time.perf_counter()
    return {
        "total": received,
        "tasks": dict(counts),
        "seconds": done - started,
        "receive_seconds": scanned - started,
        "released": released,
        "release_failed": failed,
    }


# -- realistic DLQ content --------------------------------------------------------------------


def realistic_messages(count: int, *, seed: int = 7) -> Iterator[tuple[str, dict[str, Any]]]:
    """(Body, MessageAttributes) pairs like a checkout DLQ holds: five tasks in skewed
    proportions, one in six protocol 1, some compressed, expired or with an eta, a few with
    redrive's own attributes, and about one in 200 bodies Celery did not write."""
    from datetime import UTC, datetime, timedelta

    from redrive.sandbox.encoder import encode

    rng = random.Random(seed)
    names = [name for name, weight in TASKS for _ in range(weight)]
    now = datetime.now(UTC)
    for index in range(count):
        roll = rng.random()
        attributes: dict[str, Any] = {}
        if roll < 0.002:
            yield f"legacy cron {rng.randint(1000, 9999)}: resync store {index}", attributes
            continue
        if roll < 0.004:
            body = json.dumps({"event": "order.created", "order_id": index, "v": 1})
            yield body, attributes
            continue
        if roll < 0.005:
            yield "eyJib2R5IjogImJyb2tlbi" + "A" * rng.randint(0, 40), attributes
            continue
        task = rng.choice(names)
        args, kwargs = arguments(task, rng)
        options: dict[str, Any] = {
            "task_id": f"{rng.getrandbits(128):032x}",
            "retries": rng.choice((0, 0, 0, 1, 2, 3)),
            "queue": QUEUE,
            "protocol": 1 if rng.random() < 1 / 6 else 2,
        }
        kind = rng.random()
        if kind < 0.02:
            options["compression"] = rng.choice(("gzip", "bzip2"))
        elif kind < 0.10:
            options["expires"] = now - timedelta(minutes=rng.randint(5, 4_000))
        elif kind < 0.15:
            options["eta"] = now + timedelta(minutes=rng.choice((-1, 1)) * rng.randint(10, 600))
        elif kind < 0.17:
            options["base64_envelope"] = False
        if rng.random() < 0.05:
            attributes = {
                "redrive-count": {"DataType": "Number", "StringValue": str(rng.randint(1, 4))},
                "trace-id": {"DataType": "String", "StringValue": f"{rng.getrandbits(128):032x}"},
            }
        yield encode(task, args, kwargs, **options), attributes


# -- servers ---------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class Server:
    kind: str
    process: subprocess.Popen[bytes]
    endpoint: str
    command: list[str]

    def cpu_seconds(self) -> float:
        """utime + stime of the server process (all its threads) so far."""
        with open(f"/proc/{self.process.pid}/stat", encoding="ascii") as stat:
            data = stat.read()
        fields = data[data.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        with open(f"/proc/{self.process.pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(15)


def moto_command(port: int) -> list[str]:
    probe = subprocess.run(
        [PYTHON, "-c", "import redrive.sandbox"], cwd=ROOT, capture_output=True, timeout=120
    )
    if probe.returncode == 0:
        return [PYTHON, "-m", "redrive.sandbox", "--bare", "--port", str(port)]
    return [PYTHON, "-m", "moto.server", "-H", HOST, "-p", str(port)]


def start_server(kind: str) -> Server:
    port = free_port()
    if kind == "fast":
        command = [PYTHON, "-P", os.path.join(_HERE, "fast_sqs.py"), "--port", str(port)]
    else:
        command = moto_command(port)
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    endpoint = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {process.returncode}: {command}")
        try:
            with urllib.request.urlopen(endpoint + "/", timeout=2):
                pass
            return Server(kind, process, endpoint, command)
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"{kind} server did not answer on {endpoint} within 60 s")


# -- the family, seeding, depth -------------------------------------------------------------


def client_for(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
        config=Config(retries={"mode": "standard", "max_attempts": 3}, read_timeout=300),
    )


def create_family(client: Any) -> str:
    dlq_url = str(client.create_queue(QueueName=DLQ)["QueueUrl"])
    client.set_queue_attributes(
        QueueUrl=dlq_url, Attributes={"MessageRetentionPeriod": str(DLQ_RETENTION)}
    )
    dlq_arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    queue_url = str(client.create_queue(QueueName=QUEUE)["QueueUrl"])
    policy = {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": MAX_RECEIVE_COUNT}
    client.set_queue_attributes(
        QueueUrl=queue_url, Attributes={"RedrivePolicy": json.dumps(policy)}
    )
    return dlq_url


def seed(client: Any, dlq_url: str, count: int) -> None:
    deadline = time.monotonic() + SEED_TIMEOUT
    batch: list[dict[str, Any]] = []

    def flush() -> None:
        response = client.send_message_batch(QueueUrl=dlq_url, Entries=batch)
        if response.get("Failed"):
            raise RuntimeError(f"seeding: SendMessageBatch failed: {response['Failed'][:1]}")
        batch.clear()
        if time.monotonic() > deadline:
            raise RuntimeError(f"seeding took more than {SEED_TIMEOUT} s")

    for index, (body, attributes) in enumerate(realistic_messages(count)):
        entry: dict[str, Any] = {"Id": str(index % 10), "MessageBody": body}
        if attributes:
            entry["MessageAttributes"] = attributes
        batch.append(entry)
        if len(batch) == 10:
            flush()
    if batch:
        flush()


def depth(client: Any, url: str) -> tuple[int, int]:
    attrs = client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attrs["ApproximateNumberOfMessages"]), int(
        attrs["ApproximateNumberOfMessagesNotVisible"]
    )


# -- one measured run ------------------------------------------------------------------------


@dataclass
class Run:
    server: str
    n: int
    tool: str
    round: int
    wall_s: float
    scan_s: float | None
    peak_rss_mb: float
    client_cpu_s: float
    server_cpu_s: float
    counted: int | None
    depth_after: tuple[int, int]
    ok: bool
    problem: str = ""
    load_before: float = 0.0
    """1-minute load average when the run started (other work on the machine skews runs)."""

    @property
    def rate_wall(self) -> float:
        return self.n / self.wall_s

    @property
    def rate_scan(self) -> float | None:
        return self.n / self.scan_s if self.scan_s else None


def tool_command(tool: str, n: int, wait: int, backends: dict[str, str] | None = None) -> list[str]:
    if tool == "redrive":
        return [PYTHON, "-m", "redrive", "inspect", FAMILY, "--json"]
    if tool.startswith("redrive+"):
        url = (backends or {})[tool.removeprefix("redrive+")]
        return [PYTHON, "-m", "redrive", "inspect", FAMILY, "--json", "--result-backend", url]
    if tool == "redrive-1empty":
        return [PYTHON, "-c", _ONE_EMPTY, "inspect", FAMILY, "--json"]
    if tool == "redrive-where":
        return [PYTHON, "-m", "redrive", "inspect", FAMILY, "--json", "--where", WHERE[0]]
    command = [PYTHON, "-P", os.path.abspath(__file__), "--child", "--expect", str(n)]
    command += ["--receive-wait", str(wait)]
    return [*command, "--no-decode"] if tool == "floor" else command


def measure(
    server: Server,
    client: Any,
    dlq_url: str,
    tool: str,
    n: int,
    rnd: int,
    env: dict[str, str],
    wait: int,
    backends: dict[str, str] | None = None,
) -> Run:
    load = os.getloadavg()[0]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        cpu_before = server.cpu_seconds()
        started = time.perf_counter()
        process = subprocess.Popen(
            tool_command(tool, n, wait, backends), cwd=ROOT, env=env, stdout=out, stderr=err
        )
        result: list[tuple[int, int, Any]] = []
        waiter = threading.Thread(target=lambda: result.append(os.wait4(process.pid, 0)))
        waiter.start()
        waiter.join(CHILD_TIMEOUT)
        if waiter.is_alive():
            process.kill()
            waiter.join(30)
        wall = time.perf_counter() - started
        server_cpu = server.cpu_seconds() - cpu_before
        _, status, usage = result[0]
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    visible, hidden = depth(client, dlq_url)
    problems = []
    counted = scan_s = None
    if process.returncode != 0:
        problems.append(f"exit {process.returncode}: {stderr.strip()[-300:]}")
    else:
        data = json.loads(stdout)
        # With --where, "total" is what matched: the scan is checked by what it scanned.
        counted = int(data["scanned"] if tool == "redrive-where" else data["total"])
        scan_s = float(data["seconds"])
        if counted != n:
            problems.append(f"counted {counted}, expected {n}")
        if tool.startswith("redrive+"):
            if data.get("result_backend_problem"):
                problems.append(f"result backend: {data['result_backend_problem']}")
            elif not any(g.get("states") for g in data["groups"]):
                problems.append("no states read from the result backend")
    if (visible, hidden) != (n, 0):
        problems.append(f"DLQ afterwards: {visible} visible, {hidden} in flight (expected {n}, 0)")
    return Run(
        server=server.kind,
        n=n,
        tool=tool,
        round=rnd,
        wall_s=wall,
        scan_s=scan_s,
        peak_rss_mb=usage.ru_maxrss / 1024,
        client_cpu_s=usage.ru_utime + usage.ru_stime,
        server_cpu_s=server_cpu,
        counted=counted,
        depth_after=(visible, hidden),
        ok=not problems,
        problem="; ".join(problems),
        load_before=load,
    )


# -- the benchmark ---------------------------------------------------------------------------


@dataclass
class SizeResult:
    server: str
    n: int
    seed_s: float
    seed_server_cpu_s: float
    server_rss_mb: float
    runs: list[Run] = field(default_factory=list)


@contextlib.contextmanager
def result_backends(tools: Sequence[str], n: int, directory: str) -> Iterator[dict[str, str]]:
    """The result backends the ``redrive+KIND`` tools read, holding records for the
    seeded messages' task ids (bench/result_backends.py)."""
    from bench import result_backends as rb
    from redrive.messages import decode

    kinds = [t.removeprefix("redrive+") for t in tools if t.startswith("redrive+")]
    if not kinds:
        yield {}
        return
    ids = [i for body, _ in realistic_messages(n) if (i := decode(body).task_id)]
    urls: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        if "redis" in kinds:
            urls["redis"] = stack.enter_context(rb.redis_server(directory))
            log(f"[N={n:,}] redis: {rb.fill_redis(urls['redis'], ids):,} records")
        if "sqlite" in kinds:
            urls["sqlite"], count = rb.fill_sqlite(Path(directory) / "results.sqlite", ids)
            log(f"[N={n:,}] sqlite: {count:,} records")
        yield urls


def bench_size(kind: str, n: int, rounds: int, tools: Sequence[str], wait: int) -> SizeResult:
    log(f"[{kind} N={n:,}] starting the server")
    server = start_server(kind)
    try:
        client = client_for(server.endpoint)
        dlq_url = create_family(client)
        cpu0 = server.cpu_seconds()
        started = time.perf_counter()
        seed(client, dlq_url, n)
        seed_s = time.perf_counter() - started
        seeded = depth(client, dlq_url)
        if seeded != (n, 0):
            raise RuntimeError(f"seeding left {seeded} (visible, in flight), expected ({n}, 0)")
        result = SizeResult(kind, n, seed_s, server.cpu_seconds() - cpu0, server.rss_mb())
        log(f"[{kind} N={n:,}] seeded in {seed_s:.1f} s ({n / seed_s:,.0f} msgs/s)")
        with (
            tempfile.TemporaryDirectory(prefix="redrive-bench-") as state,
            result_backends(tools, n, state) as backends,
        ):
            env = child_env(server.endpoint, state, wait)
            for rnd in range(rounds):
                shift = rnd % len(tools)
                for tool in [*tools[shift:], *tools[:shift]]:
                    run = measure(server, client, dlq_url, tool, n, rnd + 1, env, wait, backends)
                    result.runs.append(run)
                    log(
                        f"[{kind} N={n:,}] round {rnd + 1} {tool:<14} {run.wall_s:7.2f} s "
                        f"{run.rate_wall:8,.0f} msgs/s  rss {run.peak_rss_mb:6.1f} MB  "
                        f"server cpu {run.server_cpu_s:6.2f} s  load {run.load_before:.2f}"
                        + ("" if run.ok else f"  FAILED: {run.problem}")
                    )
        client.close()
        return result
    finally:
        server.stop()


def summary_rows(result: SizeResult, tools: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    base_wall = base_scan = None
    # Medians over the runs that passed their checks (a failed run did other work); when
    # none passed, over the failed ones, marked "!" in the ok column.
    tried = {t: [r for r in result.runs if r.tool == t] for t in tools}
    by_tool = {t: [r for r in tried[t] if r.ok] or tried[t] for t in tools}
    hand = [r for r in tried.get("handwritten", []) if r.ok]
    if hand:
        base_wall = median([r.rate_wall for r in hand])
        base_scan = median([r.rate_scan or 0.0 for r in hand])
    for tool in tools:
        runs = by_tool[tool]
        if not tried[tool]:
            continue
        rate_wall = median([r.rate_wall for r in runs])
        rate_scan = median([r.rate_scan or 0.0 for r in runs])
        wall = median([r.wall_s for r in runs])
        server_cpu = median([r.server_cpu_s for r in runs])
        client_cpu = median([r.client_cpu_s for r in runs])
        rows.append(
            {
                "N": result.n,
                "tool": tool,
                "msgs/s": rate_wall,
                "scan msgs/s": rate_scan,
                "vs hand": rate_wall / base_wall if base_wall else None,
                "scan vs hand": rate_scan / base_scan if base_scan else None,
                "wall s": wall,
                "peak RSS MB": median([r.peak_rss_mb for r in runs]),
                "client CPU s": client_cpu,
                "server CPU s": server_cpu,
                "server CPU/wall": server_cpu / wall if wall else None,
                "server % of CPU": server_cpu / (server_cpu + client_cpu)
                if server_cpu + client_cpu
                else None,
                "ok": f"{sum(r.ok for r in runs)}/{len(runs)}" + ("" if runs[0].ok else " !"),
            }
        )
    return rows


def render(kind: str, results: Sequence[SizeResult], tools: Sequence[str]) -> str:
    headers = [
        "N",
        "tool",
        "msgs/s",
        "vs hand",
        "scan msgs/s",
        "scan vs hand",
        "wall s",
        "peak RSS MB",
        "client CPU s",
        "server CPU s",
        "server CPU/wall",
        "server % of CPU",
        "ok",
    ]
    lines: list[list[str]] = []
    for result in results:
        for row in summary_rows(result, tools):
            lines.append(
                [
                    f"{row['N']:,}",
                    row["tool"],
                    f"{row['msgs/s']:,.0f}",
                    f"{row['vs hand']:.2f}x" if row["vs hand"] else "-",
                    f"{row['scan msgs/s']:,.0f}",
                    f"{row['scan vs hand']:.2f}x" if row["scan vs hand"] else "-",
                    f"{row['wall s']:.2f}",
                    f"{row['peak RSS MB']:.1f}",
                    f"{row['client CPU s']:.2f}",
                    f"{row['server CPU s']:.2f}",
                    f"{row['server CPU/wall']:.0%}",
                    f"{row['server % of CPU']:.0%}",
                    row["ok"],
                ]
            )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(headers)]
    text = [
        f"server: {kind}",
        "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    for line in lines:
        cells = [
            c.ljust(w) if i == 1 else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        text.append("| " + " | ".join(cells) + " |")
    for result in results:
        rows = {row["tool"]: row for row in summary_rows(result, tools)}
        if "redrive" in rows and "redrive-where" in rows:
            plain, where = rows["redrive"], rows["redrive-where"]
            text.append(
                f"N={result.n:,}: redrive --where {WHERE[0]!r} / redrive: "
                f"{where['msgs/s'] / plain['msgs/s']:.2f}x msgs/s, "
                f"{where['scan msgs/s'] / plain['scan msgs/s']:.2f}x scan msgs/s"
            )
    text.extend(backend_ratios(results, tools))
    failures = [r for result in results for r in result.runs if not r.ok]
    if failures:
        text.append("")
        text.append("failed runs (! above: no run of that row passed its checks):")
        for r in failures:
            text.append(f"  N={r.n:,} {r.tool} round {r.round}: {r.problem}")
    text.append("")
    text.append("seeding (SendMessageBatch into the DLQ, not measured above):")
    for result in results:
        text.append(
            f"  N={result.n:,}: {result.seed_s:.1f} s ({result.n / result.seed_s:,.0f} msgs/s), "
            f"server CPU {result.seed_server_cpu_s:.1f} s, "
            f"server RSS after seeding {result.server_rss_mb:.0f} MB"
        )
    return "\n".join(text)


def backend_ratios(results: Sequence[SizeResult], tools: Sequence[str]) -> list[str]:
    """redrive with a result backend against redrive without one, same run (medians)."""
    lines = []
    for result in results:
        rows = {row["tool"]: row for row in summary_rows(result, tools)}
        if "redrive" not in rows:
            continue
        for tool, row in rows.items():
            if tool.startswith("redrive+"):
                lines.append(
                    f"  N={result.n:,}: {tool} / redrive = "
                    f"{row['msgs/s'] / rows['redrive']['msgs/s']:.2f}x (wall), "
                    f"{(row['scan msgs/s'] or 0) / (rows['redrive']['scan msgs/s'] or 1):.2f}x "
                    "(scan)"
                )
    return ["", "with a result backend (--result-backend):", *lines] if lines else []


def _size_result(item: dict[str, Any]) -> SizeResult:
    runs = [Run(**{**run, "depth_after": tuple(run["depth_after"])}) for run in item["runs"]]
    fields = {k: v for k, v in item.items() if k not in ("runs", "summary")}
    return SizeResult(**fields, runs=runs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python bench/inspect.py",
        description="Throughput and peak memory of `redrive inspect` vs a hand-written boto3 scan.",
    )
    parser.add_argument("--sizes", type=parse_sizes, default=[1_000, 10_000, 100_000])
    parser.add_argument(
        "--moto-sizes",
        type=parse_sizes,
        help="sizes for the moto server (default: --sizes capped at 2,000: moto's cost per "
        "call grows with depth, see bench/README.md)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server", choices=("fast", "moto", "both"), default="fast")
    parser.add_argument(
        "--tools",
        default=",".join(TOOLS),
        help=f"comma-separated, from {', '.join(TOOLS + EXTRA_TOOLS)} (default: {','.join(TOOLS)})",
    )
    parser.add_argument(
        "--receive-wait",
        type=int,
        choices=range(21),
        default=1,
        metavar="SECONDS",
        help="long poll of every receive, for every tool alike (redrive through "
        "REDRIVE_RECEIVE_WAIT); default 1, redrive's own default",
    )
    parser.add_argument(
        "--where",
        metavar="EXPR",
        help="also run redrive-where: redrive inspect --where EXPR (a kwarg that every message "
        f"passes, so both count the same; e.g. {DEFAULT_WHERE!r}), and print its ratio to redrive",
    )
    parser.add_argument(
        "--result-backend",
        choices=(*BACKEND_KINDS, "both"),
        help="also run redrive with --result-backend on a real redis-server and/or Celery's "
        "database backend on SQLite, holding records for the seeded task ids "
        "(tools redrive+redis, redrive+sqlite)",
    )
    parser.add_argument("--json-out", metavar="FILE", help="also write every run as JSON")
    parser.add_argument(
        "--from-json",
        metavar="FILE",
        help="print the tables of a --json-out file again, without running anything",
    )
    # Internal: the hand-written scan's own process.
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--expect", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--no-decode", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        scan = handwritten_scan(
            DLQ, args.expect, decode_bodies=not args.no_decode, wait=args.receive_wait
        )
        print(json.dumps(scan))
        return 0

    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    if args.where:
        WHERE[0] = args.where
        tools += [] if "redrive-where" in tools else ["redrive-where"]
    if args.result_backend:
        kinds_asked = BACKEND_KINDS if args.result_backend == "both" else (args.result_backend,)
        tools += [f"redrive+{k}" for k in kinds_asked if f"redrive+{k}" not in tools]
    unknown = set(tools) - set(TOOLS + EXTRA_TOOLS + BACKEND_TOOLS)
    if unknown or not tools:
        parser.error(
            f"unknown tools {sorted(unknown)}; choose from {', '.join(TOOLS + EXTRA_TOOLS)}"
        )
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as saved:
            loaded = [_size_result(item) for item in json.load(saved)]
        for kind in dict.fromkeys(r.server for r in loaded):
            tools_seen = list(dict.fromkeys(run.tool for r in loaded for run in r.runs))
            print(render(kind, [r for r in loaded if r.server == kind], tools_seen) + "\n")
        return 0
    kinds = ["fast", "moto"] if args.server == "both" else [args.server]
    # Compile and cache imports once so no measured run pays for writing .pyc files.
    subprocess.run(
        [PYTHON, "-c", "import boto3, redrive.cli, redrive.inspection.scan, redrive.messages"],
        cwd=ROOT,
        check=True,
        timeout=300,
    )
    tables = []
    everything: list[dict[str, Any]] = []
    failed = False
    for kind in kinds:
        sizes = args.sizes
        if kind == "moto":
            sizes = args.moto_sizes or sorted({min(n, 2_000) for n in args.sizes})
        results = [bench_size(kind, n, args.rounds, tools, args.receive_wait) for n in sizes]
        for result in results:
            failed = failed or any(not r.ok for r in result.runs)
            everything.append(
                {
                    **{k: v for k, v in asdict(result).items() if k != "runs"},
                    "runs": [asdict(r) for r in result.runs],
                    "summary": summary_rows(result, tools),
                }
            )
        tables.append(render(kind, results, tools))
        print(tables[-1] + "\n", flush=True)
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump(everything, out, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
