"""Benchmark the SQLite ledger's write path as the move engine drives it, plain and grouped.

Each worker thread does the engine's ledger calls for one batch of 10 messages, over and
over: ``claim_many`` of 10 new keys (flushed: the claim is on disk before the send),
``mark_sent_many`` of the 10, ``mark_done_many`` of the 10 (neither flushed). Configurations
(``--configs``): ``1``, ``4``, ``16`` threads sharing one :class:`SqliteLedger` in one
process, and ``2x16``: two processes of 16 threads each, on one ledger file (each process
with its own ledger object, as ``--processes`` would have).

``1m`` is one worker in the main thread, as ``--workers 1`` runs: the main thread always
hands its requests to the writer thread (Ctrl-C lands there and must never stop a
transaction carrying others' requests), where a worker thread that finds the writer idle
runs its request itself.

Modes (``--modes``), interleaved per round (round 1: plain, grouped; round 2: grouped,
plain; ...), each on a fresh ledger file on disk (``--dir``, default a temporary directory
under /var/tmp, i.e. not tmpfs):

- ``plain``: ``SqliteLedger(path, group_commit=False)``: one transaction per call, callers
  serialised by the object's lock, SQLite's busy handler between processes (what main did);
- ``grouped``: ``SqliteLedger(path)``: one writer per ledger object commits the requests
  that queued while its previous commit was in flight, in one transaction; it waits for
  another process's write lock by retrying BEGIN IMMEDIATE at 0.1-1 ms steps;
- diagnostic variants of grouped (``--modes`` only), for the wait across processes:
  ``grouped-busy`` waits in SQLite's busy handler instead (sleeps of 1, 2, 5, 10 ... ms),
  ``grouped-flock`` queues the processes' writers on a blocking ``flock`` of a sidecar
  file around each transaction (woken by the kernel at once; unbounded, so not shippable
  as is: a stopped holder would hang the others instead of failing after the timeout).

Printed per configuration and mode (medians over rounds): calls/s and messages/s (10 per
batch of 3 calls), mean latency per call, and where each call's time went: waiting for the
write lock inside SQLite (``BEGIN IMMEDIATE``: the busy handler's sleeps when another
process holds it), ``COMMIT`` (the WAL write and, when flushed, the fsync), and, plain only,
waiting for the object's lock; grouped: requests per transaction. Then the ratio
grouped/plain per round, in one run. Every run is checked: every key ends DONE, won once.

``--dynamodb``: the same pattern on the DynamoDB ledger, against moto in-process, with a
simulated round trip per call (``--latency-ms``, default 20: a botocore ``before-send``
hook that sleeps, this script only) and a client configured as redrive's are (20 HTTP
connections). Modes: ``pool-10`` (``write_threads=10``: the one pool of 10 threads that
every caller's per-key conditional writes queued for before) and ``pool-auto`` (the
default now: as wide as the client's connection pool). DynamoDB has no conditional batch
write (BatchWriteItem takes no conditions), and every ledger write is conditional, so the
writes stay one call per key; what changes is how many run at once. moto's own CPU per
call (in this process, under the GIL) bounds what this can show.

Usage (from the repository root)::

    nice -n 10 .venv/bin/python bench/ledger.py --rounds 3
    nice -n 10 .venv/bin/python bench/ledger.py --configs 16,2x16 --batches 400
    nice -n 10 .venv/bin/python bench/ledger.py --dynamodb --configs 1,4,16 --batches 96

Only local files; no network.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import json  # noqa: E402
import sqlite3  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from redrive.ledger import Claim, KeyState, SqliteLedger  # noqa: E402
from redrive.ledger import sqlite_file as ledger_file  # noqa: E402
from redrive.ledger.sqlite_writes import SqliteWrites  # noqa: E402

BATCH = 10
CALLS_PER_BATCH = 3
Q = "https://sqs.us-east-1.amazonaws.com/123456789012/onion-checkout"


# --------------------------------------------------------------------------- instruments


class Stats:
    """Seconds and counts, summed over threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: dict[str, float] = {}

    def add(self, name: str, value: float) -> None:
        with self._lock:
            self.values[name] = self.values.get(name, 0.0) + value

    def peak(self, name: str, value: float) -> None:
        with self._lock:
            self.values[name] = max(self.values.get(name, 0.0), value)


STATS = Stats()


class TimedConnection(sqlite3.Connection):
    """Times BEGIN IMMEDIATE (its busy handler included) and COMMIT (flushed or not)."""

    flush = True

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        if sql.startswith("PRAGMA synchronous="):
            self.flush = sql.endswith("FULL")
        if sql.startswith("BEGIN IMMEDIATE"):
            name = "begin"
        elif sql == "COMMIT":
            name = "commit_full" if self.flush else "commit_normal"
        else:
            return super().execute(sql, *args)
        start = time.perf_counter()
        try:
            return super().execute(sql, *args)
        finally:
            spent = time.perf_counter() - start
            STATS.add(name + "_s", spent)
            STATS.add(name + "_n", 1)
            if name == "begin" and spent > 0.0005:
                STATS.add("begin_slow_n", 1)
            if name == "begin":
                STATS.peak("begin_max_s", spent)


class TimedLock:
    """The plain path's object lock, timing how long callers wait for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> bool:
        start = time.perf_counter()
        self._lock.acquire()
        STATS.add("lock_wait_s", time.perf_counter() - start)
        return True

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def instrument(mode: str) -> None:
    original = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return original(*args, factory=TimedConnection, **kwargs)

    ledger_file.sqlite3.connect = connect  # type: ignore[assignment]
    begin = getattr(SqliteWrites, "_begin_write", None)
    if begin is not None:
        # The grouped path takes SQLite's write lock itself (its own short retries instead of
        # the busy handler): time the whole wait, retries and sleeps included.
        def timed_begin(self: Any, conn: sqlite3.Connection, *a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return begin(self, conn, *a, **k)
            finally:
                STATS.add("lock_s", time.perf_counter() - start)
                STATS.peak("lock_max_s", time.perf_counter() - start)

        SqliteWrites._begin_write = timed_begin  # type: ignore[attr-defined]
    if mode == "grouped-busy":
        handled: set[int] = set()

        def busy_begin(self: Any, conn: sqlite3.Connection) -> None:
            if id(conn) not in handled:  # the writer's connection has it off: back on
                conn.execute("PRAGMA busy_timeout = 30000")
                handled.add(id(conn))
            start = time.perf_counter()
            try:
                conn.execute("BEGIN IMMEDIATE")  # in SQLite's busy handler (30 s)
            finally:
                STATS.add("lock_s", time.perf_counter() - start)
                STATS.peak("lock_max_s", time.perf_counter() - start)

        SqliteWrites._begin_write = busy_begin  # type: ignore[method-assign]
    if mode == "grouped-flock":
        import fcntl

        try_group = SqliteWrites._try_group
        locks: dict[int, int] = {}

        def flocked(self: Any, conn: sqlite3.Connection, pending: Any) -> Any:
            fd = locks.get(id(self))
            if fd is None:
                fd = locks[id(self)] = os.open(
                    f"{self._file.path}.lock", os.O_RDWR | os.O_CREAT, 0o600
                )
            start = time.perf_counter()
            fcntl.flock(fd, fcntl.LOCK_EX)
            STATS.add("lock_s", time.perf_counter() - start)
            STATS.peak("lock_max_s", time.perf_counter() - start)
            try:
                return try_group(self, conn, pending)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

        SqliteWrites._try_group = flocked  # type: ignore[method-assign]


# --------------------------------------------------------------------------- one process


def open_ledger(path: Path, mode: str) -> SqliteLedger:
    led = SqliteLedger(path, group_commit=mode.startswith("grouped"))
    if mode == "plain":
        led._writes.lock = TimedLock()  # type: ignore[assignment]
    return led


def work(
    path: Path, mode: str, threads: int, batches: int, run_id: str, *, main: bool = False
) -> dict[str, Any]:
    """``threads`` threads, ``batches`` batches each; returns timings and the keys won.
    ``main``: one worker, in the main thread (as ``--workers 1`` runs)."""
    led = open_ledger(path, mode)
    led.start_run(run_id, command="move", info={})
    won: list[list[str]] = [[] for _ in range(threads)]
    call_s = [0.0] * threads
    barrier = threading.Barrier(1 if main else threads + 1)

    def worker(index: int) -> None:
        barrier.wait()
        spent = 0.0
        for b in range(batches):
            keys = [f"{run_id}-{index}-{b}-{i}" for i in range(BATCH)]
            t0 = time.perf_counter()
            result = led.claim_many(run_id, [Claim(k, "t", "m-" + k, Q) for k in keys])
            mine = sorted(result.won)
            led.mark_sent_many(run_id, {k: "sqs-" + k for k in mine})
            led.mark_done_many(run_id, mine)
            spent += time.perf_counter() - t0
            won[index] += mine
        call_s[index] = spent

    pool = [] if main else [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    STATS.values.clear()
    if not main:
        barrier.wait()
    start, cpu = time.perf_counter(), time.process_time()
    if main:
        worker(0)
    for t in pool:
        t.join()
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    writer = getattr(led, "group_stats", None)
    led.end_run(run_id, outcome="completed", counts={})
    led.close()
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "call_s": sum(call_s),
        "won": [k for ks in won for k in ks],
        "stats": dict(STATS.values),
        "groups": writer() if writer is not None else None,
    }


def child_main(args: list[str]) -> None:
    path, mode, threads, batches, run_id = args
    instrument(mode)
    print("ready", flush=True)
    sys.stdin.readline()
    out = work(Path(path), mode, int(threads), int(batches), run_id)
    out["finished_at"] = time.time()
    print(json.dumps(out), flush=True)


# --------------------------------------------------------------------------- the runs


def run_config(config: str, mode: str, batches: int, directory: Path) -> dict[str, Any]:
    path = directory / f"ledger-{config}-{mode}-{time.monotonic_ns()}.sqlite3"
    SqliteLedger(path).close()  # the schema exists before anyone races for it
    procs, _, per = config.removesuffix("m").partition("x")
    threads = int(per or procs)
    nprocs = int(procs) if per else 1
    if nprocs == 1:
        results = [work(path, mode, threads, batches, "r0", main=config == "1m")]
    else:
        results = run_processes(path, mode, nprocs, threads, batches)
    return check_and_sum(path, results, nprocs * threads * batches)


@contextmanager
def children(commands: list[list[str]]) -> Iterator[list[subprocess.Popen[str]]]:
    procs = [
        subprocess.Popen(c, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for c in commands
    ]
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


def run_processes(
    path: Path, mode: str, nprocs: int, threads: int, batches: int
) -> list[dict[str, Any]]:
    me = os.path.abspath(__file__)
    commands = [
        [sys.executable, me, "--child", str(path), mode, str(threads), str(batches), f"r{i}"]
        for i in range(nprocs)
    ]
    with children(commands) as procs:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        start = time.perf_counter()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            assert p.stdout is not None
            results.append(json.loads(p.stdout.readline()))
        wall = time.perf_counter() - start
    first = min(r["finished_at"] for r in results)
    for r in results:
        r["wall_s"] = wall  # the processes' common wall time (start to last finish)
        # how much longer the last process ran than the first: starvation shows here
        r["spread_s"] = r["finished_at"] - first
    return results


def check_and_sum(path: Path, results: list[dict[str, Any]], batches: int) -> dict[str, Any]:
    won = [k for r in results for k in r["won"]]
    expected = batches * BATCH
    problems = []
    if len(won) != expected or len(set(won)) != expected:
        problems.append(f"won {len(won)} ({len(set(won))} distinct), expected {expected}")
    with SqliteLedger(path) as led:
        states = {e.state for e in led.get_many(won).values()}
    if states != {KeyState.DONE}:
        problems.append(f"states {sorted(states)}")
    stats: dict[str, float] = {}
    for r in results:
        for name, value in r["stats"].items():
            combine = max if name.endswith("_max_s") else (lambda a, b: a + b)
            stats[name] = combine(stats.get(name, 0.0), value)
    groups = [r["groups"] for r in results if r["groups"]]
    calls = batches * CALLS_PER_BATCH
    wall = max(r["wall_s"] for r in results)
    return {
        "problems": problems,
        "calls_per_s": calls / wall,
        "msgs_per_s": expected / wall,
        "latency_ms": 1000 * sum(r["call_s"] for r in results) / calls,
        "cpu_us": 1e6 * sum(r["cpu_s"] for r in results) / calls,
        "begin_ms": 1000 * max(stats.get("begin_s", 0), stats.get("lock_s", 0)) / calls,
        "slow_begins": stats.get("begin_slow_n", 0) / max(1, stats.get("begin_n", 0)),
        "begin_max_ms": 1000 * max(stats.get("begin_max_s", 0), stats.get("lock_max_s", 0)),
        "commit_full_ms": 1000
        * stats.get("commit_full_s", 0)
        / max(1, stats.get("commit_full_n", 0)),
        "commit_normal_ms": 1000
        * stats.get("commit_normal_s", 0)
        / max(1, stats.get("commit_normal_n", 0)),
        "commit_ms": 1000
        * (stats.get("commit_full_s", 0) + stats.get("commit_normal_s", 0))
        / calls,
        "spread_pct": 100 * max(r.get("spread_s", 0) for r in results) / wall,
        "lock_wait_ms": 1000 * stats.get("lock_wait_s", 0) / calls,
        "per_group": (
            sum(g["requests"] for g in groups) / max(1, sum(g["groups"] for g in groups))
            if groups
            else None
        ),
        "transactions": stats.get("commit_n", 0),
    }


COLUMNS = (
    ("calls/s", "calls_per_s", "{:,.0f}"),
    ("msgs/s", "msgs_per_s", "{:,.0f}"),
    ("ms/call", "latency_ms", "{:.2f}"),
    ("CPU µs/call", "cpu_us", "{:.0f}"),
    ("BEGIN (busy) ms/call", "begin_ms", "{:.3f}"),
    ("BEGINs > 0.5 ms", "slow_begins", "{:.1%}"),
    ("longest BEGIN ms", "begin_max_ms", "{:.1f}"),
    ("COMMIT ms/call", "commit_ms", "{:.3f}"),
    ("ms per COMMIT FULL / NORMAL", "commit_pair", "{}"),
    ("object lock ms/call", "lock_wait_ms", "{:.2f}"),
    ("requests/txn", "per_group", "{:.1f}"),
    ("last process later by", "spread_pct", "{:.0f} %"),
)


def render(rows: dict[tuple[str, str], list[dict[str, Any]]], modes: list[str]) -> str:
    head = "| threads | mode | " + " | ".join(c[0] for c in COLUMNS) + " | ok |"
    lines = [head, "|" + " --- |" * (len(COLUMNS) + 3)]
    for (config, mode), runs in rows.items():
        good = [r for r in runs if not r["problems"]]
        cells = []
        for _, key, fmt in COLUMNS:
            if key == "commit_pair":
                full = statistics.median([r["commit_full_ms"] for r in good] or [0])
                normal = statistics.median([r["commit_normal_ms"] for r in good] or [0])
                cells.append(f"{full:.2f} / {normal:.2f}")
                continue
            if key == "spread_pct" and "x" not in config:
                cells.append("-")
                continue
            values = [r[key] for r in good if r[key] is not None]
            cells.append(fmt.format(statistics.median(values)) if values else "-")
        lines.append(
            f"| {config} | {mode} | " + " | ".join(cells) + f" | {len(good)}/{len(runs)} |"
        )
    for other in (m for m in modes if m != "plain" and "plain" in modes):
        lines += ["", f"| threads | {other}/plain calls/s, per round | median | CPU per call |"]
        lines.append("| --- | --- | ---: | ---: |")
        for config in dict.fromkeys(c for c, _ in rows):
            plain, grouped = rows[(config, "plain")], rows[(config, other)]
            pairs = list(zip(plain, grouped, strict=True))
            ratios = [g["calls_per_s"] / p["calls_per_s"] for p, g in pairs]
            cpu = statistics.median(g["cpu_us"] / p["cpu_us"] for p, g in pairs)
            lines.append(
                f"| {config} | {', '.join(f'{r:.2f}' for r in ratios)} | "
                f"{statistics.median(ratios):.2f}× | {cpu:.2f}× |"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- DynamoDB


def dynamodb_run(threads: int, batches: int, mode: str, latency_s: float) -> dict[str, Any]:
    import boto3
    from botocore.config import Config
    from moto import mock_aws

    from redrive.ledger.dynamodb import DynamoDbLedger, init_table

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        client = boto3.client(
            "dynamodb", region_name="us-east-1", config=Config(max_pool_connections=20)
        )
        init_table(client, "bench-ledger")

        def round_trip(**_: Any) -> None:
            time.sleep(latency_s)

        client.meta.events.register_first("before-send", round_trip)
        led = DynamoDbLedger(
            "bench-ledger", client, write_threads=10 if mode == "pool-10" else None
        )
        run_id = "r0"
        led.start_run(run_id, command="move", info={})
        won: list[list[str]] = [[] for _ in range(threads)]
        call_s = [0.0] * threads
        barrier = threading.Barrier(threads + 1)

        def worker(index: int) -> None:
            barrier.wait()
            spent = 0.0
            for b in range(batches):
                keys = [f"{index}-{b}-{i}" for i in range(BATCH)]
                t0 = time.perf_counter()
                result = led.claim_many(run_id, [Claim(k, "t", "m-" + k, Q) for k in keys])
                mine = sorted(result.won)
                led.mark_sent_many(run_id, {k: "sqs-" + k for k in mine})
                led.mark_done_many(run_id, mine)
                spent += time.perf_counter() - t0
                won[index] += mine
            call_s[index] = spent

        pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        barrier.wait()
        start = time.perf_counter()
        for t in pool:
            t.join()
        wall = time.perf_counter() - start
        keys = [k for ks in won for k in ks]
        expected = threads * batches * BATCH
        states = {e.state for e in led.get_many(keys).values()}
        led.close()
    problems = []
    if len(set(keys)) != expected or states != {KeyState.DONE}:
        problems.append(f"won {len(set(keys))} of {expected}, states {sorted(states)}")
    calls = threads * batches * CALLS_PER_BATCH
    return {
        "problems": problems,
        "calls_per_s": calls / wall,
        "msgs_per_s": expected / wall,
        "latency_ms": 1000 * sum(call_s) / calls,
    }


def dynamodb_main(args: argparse.Namespace) -> int:
    modes = [m for m in args.modes.split(",") if m.startswith("pool-")] or ["pool-10", "pool-auto"]
    configs = [int(c) for c in args.configs.split(",") if "x" not in c]
    rows: dict[tuple[int, str], list[dict[str, Any]]] = {}
    print(
        f"DynamoDB on moto in-process, {args.latency_ms:g} ms per call; load "
        f"{os.getloadavg()[0]:.2f} at start",
        flush=True,
    )
    for round_ in range(args.rounds):
        order = modes[round_ % len(modes) :] + modes[: round_ % len(modes)]
        for threads in configs:
            for mode in order:
                result = dynamodb_run(
                    threads, max(1, args.batches // threads), mode, args.latency_ms / 1000
                )
                rows.setdefault((threads, mode), []).append(result)
                print(
                    f"round {round_ + 1} {threads:>3} {mode:<9} {result['calls_per_s']:7,.0f}"
                    f" calls/s {' '.join(result['problems'])}",
                    file=sys.stderr,
                    flush=True,
                )
    lines = ["| threads | mode | calls/s | msgs/s | ms/call | ok |", "|" + " --- |" * 6]
    for (threads, mode), runs in rows.items():
        good = [r for r in runs if not r["problems"]]
        cells = [
            f"{statistics.median([r[k] for r in good]):,.{d}f}" if good else "-"
            for k, d in (("calls_per_s", 0), ("msgs_per_s", 0), ("latency_ms", 1))
        ]
        lines.append(
            f"| {threads} | {mode} | " + " | ".join(cells) + f" | {len(good)}/{len(runs)} |"
        )
    if len(modes) == 2:
        lines += ["", f"| threads | {modes[1]}/{modes[0]} calls/s, per round | median |"]
        lines.append("| --- | --- | ---: |")
        for threads in configs:
            a, b = rows[(threads, modes[0])], rows[(threads, modes[1])]
            ratios = [y["calls_per_s"] / x["calls_per_s"] for x, y in zip(a, b, strict=True)]
            lines.append(
                f"| {threads} | {', '.join(f'{r:.2f}' for r in ratios)} | "
                f"{statistics.median(ratios):.2f}× |"
            )
    print("\n".join(lines))
    print(f"load at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if any(r["problems"] for runs in rows.values() for r in runs) else 0


_ORIGINALS = (
    SqliteWrites._begin_write,
    SqliteWrites._try_group,
    ledger_file.sqlite3.connect,
)


def instrument_once(mode: str) -> None:
    """This process's ledger instrumented for ``mode`` (child processes do their own)."""
    cls = SqliteWrites
    cls._begin_write, cls._try_group, ledger_file.sqlite3.connect = _ORIGINALS  # type: ignore[method-assign]
    instrument(mode)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="1m,1,4,16,2x16")
    parser.add_argument("--modes", default="plain,grouped")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--batches", type=int, default=960, help="batches per configuration (split over threads)"
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the ledger files go")
    parser.add_argument("--dynamodb", action="store_true", help="the DynamoDB ledger on moto")
    parser.add_argument("--latency-ms", type=float, default=20.0, help="--dynamodb: per call")
    args = parser.parse_args()
    if args.dynamodb:
        return dynamodb_main(args)
    modes = args.modes.split(",")
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir or "/var/tmp", prefix="ledger-bench-") as d:
        print(f"ledger files in {d}; load {os.getloadavg()[0]:.2f} at start", flush=True)
        for round_ in range(args.rounds):
            order = modes[round_ % len(modes) :] + modes[: round_ % len(modes)]
            for config in args.configs.split(","):
                procs, _, per = config.removesuffix("m").partition("x")
                threads = int(per or procs) * (int(procs) if per else 1)
                for mode in order:
                    instrument_once(mode)
                    result = run_config(config, mode, max(1, args.batches // threads), Path(d))
                    rows.setdefault((config, mode), []).append(result)
                    print(
                        f"round {round_ + 1} {config:>5} {mode:<8} "
                        f"{result['calls_per_s']:8,.0f} calls/s "
                        f"{result['latency_ms']:6.2f} ms/call "
                        f"load {os.getloadavg()[0]:.2f} {' '.join(result['problems'])}",
                        file=sys.stderr,
                        flush=True,
                    )
    # Keep the table's order: configurations, then modes as given.
    ordered = {(c, m): rows[(c, m)] for c in args.configs.split(",") for m in modes}
    print(render(ordered, modes))
    print(f"load at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if any(r["problems"] for runs in rows.values() for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
