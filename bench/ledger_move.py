"""Claims per second and move throughput per ledger, SQLite, PostgreSQL and DynamoDB (moto),
at 0 and 20 ms per broker call, with 10,000 and 1,000,000 keys already in the ledger
(issue 40, item 4). Ratios of one run.

Each ledger (``--backends``) is made once per size (``--preload``) and filled directly with
that many random keys DONE (as a long-used ledger holds them): SQLite and PostgreSQL through
their ``load_entries`` (bench/ledger_scale.py's ``preload``), DynamoDB by moto's own process
writing the items into its table in memory (a million conditional puts over HTTP would take
hours and measure moto). Then, in every round, in an order that changes each round
(interleaved, so a shared machine's drift spreads over all of them), each of these jobs runs:

- ``claims``: bench/ledger_scale.py's round: ``--threads`` threads share one ledger object
  and claim, mark sent and mark done batches of 10 new random keys (``--batches`` batches;
  on moto ``--dynamodb-batches``, as moto serves some 30 claims a second);
- ``move @ L ms``: ``redrive move checkout --execute --workers W`` (a process of its own,
  bench/move.py's launcher: wall, CPU and peak RSS from ``wait4``) of ``--messages`` Celery
  messages, on bench/fast_sqs.py answering every call after ``L`` ms (``--latencies``),
  with ``--ledger`` that ledger. Checked: moved == N, nothing in doubt or failed, the target
  holding N and the DLQ none.

moto's Query sorts every item of the table on each call (``Table.all_items``): with
1,000,000 items in it one query took minutes, so DynamoDB runs only at the sizes up to
``--dynamodb-max-keys`` (100,000).

After each job the keys it added are deleted again from SQLite and PostgreSQL (every key not
of the preload's run), so each size stays what it says; moto's table keeps them (DynamoDB on
moto measures moto: its figures are context only).

Printed: per job, medians over rounds of msg/s, the client's CPU per message, and the
server's (PostgreSQL's processes, moto's); then the ratios: each ledger against SQLite at the
same size and latency, and each at 1,000,000 keys against itself at 10,000.

PostgreSQL: a private server (tests/postgres_server.py; as root, as the ``postgres`` user;
fsync on) or ``--postgres-url``. DynamoDB: moto's server in a child process on 127.0.0.1.

Usage (repository root, the project's venv)::

    nice -n 10 .venv/bin/python bench/ledger_move.py --preload 10000,1000000 --rounds 2

Only local files and servers on 127.0.0.1.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))
sys.path.insert(1, os.path.join(os.path.dirname(_HERE), "tests"))

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import socket  # noqa: E402
import sqlite3  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from bench import ledger_scale  # noqa: E402
from bench.common import PYTHON, REGION, ROOT, child_env, log  # noqa: E402
from bench.move import (  # noqa: E402
    SEED_CONNECTIONS,
    RawSqs,
    SeedBatches,
    Server,
    depth,
    fresh_family,
    redrive_command,
    run_child,
    seed,
    start_server,
)
from redrive.ledger import Ledger, SqliteLedger, open_ledger  # noqa: E402

PRELOAD_RUN = "old"

# moto's server in a child: creates each ledger table (redrive's own init_table), fills it
# with N keys DONE straight into moto's in-memory table, says "ready", serves until its
# stdin closes.
_MOTO = r"""
import json, random, sys
from moto.server import ThreadedMotoServer
import boto3
from moto.core import DEFAULT_ACCOUNT_ID
from moto.dynamodb.models import dynamodb_backends
from redrive.ledger import Entry, KeyState
from redrive.ledger.dynamodb import open_dynamodb
from redrive.ledger.dynamodb_table import TTL_SECONDS, init_table
from redrive.ledger.dynamodb_writes import copied_entry_item

port, region, q, specs = int(sys.argv[1]), sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
import logging
logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
server.start()
def client(service):
    return boto3.client(service, endpoint_url=f"http://127.0.0.1:{port}", region_name=region,
                        aws_access_key_id="bench", aws_secret_access_key="bench")
backend = dynamodb_backends[DEFAULT_ACCOUNT_ID][region]
for name, n, seed in specs:
    init_table(client("dynamodb"), name)
    with open_dynamodb(name, "dynamodb://" + name, client) as led:
        led.start_run("old", command="move", info={})
        table = backend.get_table(name)
        rng = random.Random(seed)
        for _ in range(n):
            k = f"celery:{rng.getrandbits(128):032x}:0"
            e = Entry(k, KeyState.DONE, "old", "app.t", "m-" + k[7:19], q, "s", 1.0, 1.0)
            table.put_item(copied_entry_item(e, now=1.0, ttl=TTL_SECONDS))
        led.end_run("old", outcome="completed", counts={})
print("ready", flush=True)
sys.stdin.read()
server.stop()
"""


@dataclass
class Config:
    backend: str
    preload: int
    ledger_arg: str
    """What ``--ledger`` gets: a path or a URL."""
    open: Callable[[], Ledger]
    server_cpu: Callable[[], float]
    env: dict[str, str] = field(default_factory=dict)
    """What the move's environment adds (DynamoDB's endpoint)."""
    forget: Callable[[], None] = lambda: None
    """Deletes the keys a job added (the preload stays)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoDynamo:
    """moto's server in a child process, its ledger tables filled (see ``_MOTO``)."""

    def __init__(self, sizes: list[int]) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        specs = [(self.table(n), n, 40 + i) for i, n in enumerate(sizes)]
        env = {**os.environ, "PYTHONPATH": ROOT, "AWS_ACCESS_KEY_ID": "bench"}
        env["AWS_SECRET_ACCESS_KEY"] = "bench"
        started = time.perf_counter()
        self.process = subprocess.Popen(
            [PYTHON, "-c", _MOTO, str(self.port), REGION, ledger_scale.Q, json.dumps(specs)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if line.strip() != "ready":
            self.stop()
            raise SystemExit("moto's DynamoDB did not start")
        took = time.perf_counter() - started
        log(f"dynamodb (moto): {', '.join(f'{n:,}' for n in sizes)} keys loaded in {took:.1f} s")

    @staticmethod
    def table(n: int) -> str:
        return f"bench-ledger-{n}"

    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)


def sqlite_config(n: int, workdir: Path, rng: random.Random) -> Config:
    path = workdir / f"ledger-{n}.sqlite3"

    def forget() -> None:
        with sqlite3.connect(path) as conn:
            conn.execute("DELETE FROM keys WHERE run_id <> ?", (PRELOAD_RUN,))
            conn.execute("DELETE FROM runs WHERE run_id <> ?", (PRELOAD_RUN,))

    config = Config("sqlite", n, str(path), lambda: SqliteLedger(path), lambda: 0.0)
    config.forget = forget
    _preload(config, rng)
    return config


def postgres_config(n: int, base_url: str, cpu: Callable[[], float], rng: random.Random) -> Config:
    made = ledger_scale._config("postgres", n, Path("."), base_url, cpu, rng)
    url = made.location

    def forget() -> None:
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DELETE FROM redrive_keys WHERE run_id <> %s", (PRELOAD_RUN,))
            conn.execute("DELETE FROM redrive_runs WHERE run_id <> %s", (PRELOAD_RUN,))

    return Config("postgres", n, url, made.open, cpu, forget=forget)


def dynamodb_config(n: int, moto: MotoDynamo) -> Config:
    table = moto.table(n)
    return Config(
        "dynamodb",
        n,
        f"dynamodb://{table}",
        lambda: open_ledger(f"dynamodb://{table}", client_factory=moto.client),
        ledger_scale.postgres_cpu(moto.process.pid),
        env={"AWS_ENDPOINT_URL_DYNAMODB": moto.endpoint},
    )


def _preload(config: Config, rng: random.Random) -> None:
    started = time.perf_counter()
    with config.open() as led:
        ledger_scale.preload(led, config.preload, rng)
    took = time.perf_counter() - started
    log(f"{config.backend}: {config.preload:,} keys loaded in {took:.1f} s")


@dataclass
class Job:
    kind: str
    """``claims`` or ``move``."""
    config: Config
    latency_ms: float = 0.0

    @property
    def label(self) -> tuple[str, float, str, int]:
        return (self.kind, self.latency_ms, self.config.backend, self.config.preload)


def claims_job(
    job: Job, args: argparse.Namespace, rng: random.Random, run: str
) -> dict[str, float]:
    with job.config.open() as led:
        before = job.config.server_cpu()
        batches = args.dynamodb_batches if job.config.backend == "dynamodb" else args.batches
        got = ledger_scale.one_round(led, args.threads, batches, rng, run)
        got["server"] = job.config.server_cpu() - before
    return got


def move_job(job: Job, args: argparse.Namespace, server: Server) -> dict[str, float] | None:
    """One ``redrive move --execute`` of ``--messages`` into the job's ledger; None when it
    failed a check (said on stderr)."""
    raw = RawSqs(server.endpoint)
    state = tempfile.mkdtemp(prefix="redrive-ledger-move-")
    try:
        dlq_url, queue_url = fresh_family(raw)
        seed(raw, dlq_url, SeedBatches(args.messages))
        env = {**child_env(server.endpoint, state, 0), **job.config.env}
        command = redrive_command(f"redrive-w{args.workers}", job.config.ledger_arg)
        cpu_before = job.config.server_cpu()
        child = run_child(command, env, timeout=args.timeout)
        server_cpu = job.config.server_cpu() - cpu_before
        try:
            data = json.loads(child.stdout)
        except ValueError:
            log(f"{job.label}: no JSON (exit {child.exit}): {child.stderr[-1500:]}")
            return None
        target, dlq = depth(raw, queue_url), depth(raw, dlq_url)
        problems = _move_problems(data, args.messages, target, dlq)
        if problems:
            log(f"{job.label}: {problems}; stderr: {child.stderr[-800:]}")
            return None
        return {
            "msgs": args.messages,
            "wall": child.wall_s,
            "cpu": child.cpu_s,
            "server": server_cpu,
            "rss": child.peak_rss_mb,
        }
    finally:
        raw.close()
        shutil.rmtree(state, ignore_errors=True)


def _move_problems(
    data: dict[str, Any], n: int, target: tuple[int, int, int], dlq: tuple[int, int, int]
) -> str:
    problems = []
    if data.get("moved") != n or data.get("failed") or data.get("in_doubt"):
        problems.append(
            f"moved {data.get('moved')} failed {data.get('failed')} in doubt {data.get('in_doubt')}"
        )
    if target != (n, 0, 0) or sum(dlq):
        problems.append(f"target {target} DLQ {dlq}")
    return "; ".join(problems)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="sqlite,postgres,dynamodb")
    parser.add_argument("--preload", default="10000,1000000")
    parser.add_argument("--latencies", default="0,20", help="ms per broker call")
    parser.add_argument("--messages", type=int, default=5000, help="per move")
    parser.add_argument("--workers", type=int, default=4, help="the move's --workers")
    parser.add_argument("--threads", type=int, default=4, help="claims: threads")
    parser.add_argument("--batches", type=int, default=800, help="claims: batches of 10")
    parser.add_argument(
        "--dynamodb-batches", type=int, default=80, help="claims on moto (~30 claims/s)"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800, help="per move, seconds")
    parser.add_argument("--dir", default="/var/tmp", help="where SQLite files go (not tmpfs)")
    parser.add_argument("--postgres-url", help="a server of yours (default: a private one)")
    parser.add_argument(
        "--dynamodb-max-keys",
        type=int,
        default=100_000,
        help="DynamoDB (moto) only at sizes up to this (moto sorts a whole table per Query)",
    )
    args = parser.parse_args(argv)
    backends = args.backends.split(",")
    sizes = [int(s) for s in args.preload.split(",")]
    latencies = [float(s) for s in args.latencies.split(",")]
    rng = random.Random(40)
    workdir = Path(tempfile.mkdtemp(prefix="redrive-ledger-move-", dir=args.dir))
    pg_server, moto, servers = None, None, {}
    try:
        configs: list[Config] = []
        if "sqlite" in backends:
            configs += [sqlite_config(n, workdir, rng) for n in sizes]
        if "postgres" in backends:
            base_url, cpu, pg_server = ledger_scale._postgres(args.postgres_url)
            configs += [postgres_config(n, base_url, cpu, rng) for n in sizes]
        dynamo_sizes = [n for n in sizes if n <= args.dynamodb_max_keys]
        if "dynamodb" in backends and dynamo_sizes:
            moto = MotoDynamo(dynamo_sizes)
            configs += [dynamodb_config(n, moto) for n in dynamo_sizes]
        for latency in latencies:
            servers[latency] = start_server("fast", latency)
        jobs = [Job("claims", c) for c in configs]
        jobs += [Job("move", c, latency) for latency in latencies for c in configs]
        results = run_rounds(jobs, args, servers, rng)
        print(render(results, args))
        return 0 if all(len(r) == args.rounds for r in results.values()) else 1
    finally:
        for server in servers.values():
            server.stop()
        if moto is not None:
            moto.stop()
        ledger_scale._drop_schemas()
        if pg_server is not None:
            import postgres_server

            postgres_server.stop(pg_server)
        shutil.rmtree(workdir, ignore_errors=True)


Results = dict[tuple[str, float, str, int], list[dict[str, float]]]


def run_rounds(
    jobs: list[Job], args: argparse.Namespace, servers: dict[float, Server], rng: random.Random
) -> Results:
    """Every job once a round, each round in another order (rotated, every other reversed)."""
    results: Results = {job.label: [] for job in jobs}
    for r in range(args.rounds):
        shift = (r * len(jobs)) // max(args.rounds, 1)
        order = jobs[shift:] + jobs[:shift]
        if r % 2:
            order.reverse()
        for job in order:
            SEED_CONNECTIONS[0] = 16 if job.latency_ms else 1
            if job.kind == "claims":
                got = claims_job(job, args, rng, f"claims-{r}")
            else:
                got = move_job(job, args, servers[job.latency_ms])
            job.config.forget()
            if got is None:
                continue
            results[job.label].append(got)
            kind, latency, backend, n = job.label
            what = "claims" if kind == "claims" else f"move @ {latency:g} ms"
            rate = got["msgs"] / got["wall"]
            log(f"round {r + 1}: {what:<13} {backend:<8} {n:>9,}: {rate:,.0f} msg/s")
    return results


def _median_rate(rounds: list[dict[str, float]]) -> float:
    return statistics.median(r["msgs"] / r["wall"] for r in rounds) if rounds else float("nan")


def _median_ms(rounds: list[dict[str, float]], what: str) -> float:
    if not rounds:
        return float("nan")
    return statistics.median(1000 * r[what] / r["msgs"] for r in rounds)


def render(results: Results, args: argparse.Namespace) -> str:
    out = [
        f"claims: {args.threads} threads, batches of 10 (claim, sent, done); moves: "
        f"{args.messages:,} messages, --workers {args.workers}; medians of {args.rounds} rounds",
        "",
        "| job | ledger | keys already in | msg/s | client CPU ms/msg | server CPU ms/msg | ok |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (kind, latency, backend, n), rounds in results.items():
        what = "claims" if kind == "claims" else f"move @ {latency:g} ms"
        server = "-" if backend == "sqlite" else f"{_median_ms(rounds, 'server'):.3f}"
        out.append(
            f"| {what} | {backend} | {n:,} | {_median_rate(rounds):,.0f} "
            f"| {_median_ms(rounds, 'cpu'):.3f} | {server} | {len(rounds)}/{args.rounds} |"
        )
    out += ["", "ratios (msg/s; client CPU a message in brackets):"]
    out += _ratios(results)
    return "\n".join(out)


def _ratios(results: Results) -> list[str]:
    lines = []
    for (kind, latency, backend, n), rounds in results.items():
        what = "claims" if kind == "claims" else f"move @ {latency:g} ms"
        base = results.get((kind, latency, "sqlite", n))
        if backend != "sqlite" and base:
            lines.append(
                f"  {what}, {n:,} keys: {backend} / sqlite = "
                f"{_median_rate(rounds) / _median_rate(base):.2f}x "
                f"({_median_ms(rounds, 'cpu') / _median_ms(base, 'cpu'):.2f}x)"
            )
    sizes = sorted({label[3] for label in results})
    for (kind, latency, backend, n), rounds in results.items():
        if len(sizes) < 2 or n != sizes[-1]:
            continue
        small = results.get((kind, latency, backend, sizes[0]))
        what = "claims" if kind == "claims" else f"move @ {latency:g} ms"
        if small:
            lines.append(
                f"  {what}, {backend}: {sizes[-1]:,} / {sizes[0]:,} keys = "
                f"{_median_rate(rounds) / _median_rate(small):.2f}x "
                f"({_median_ms(rounds, 'cpu') / _median_ms(small, 'cpu'):.2f}x)"
            )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
