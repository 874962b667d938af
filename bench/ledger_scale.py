"""Does a ledger's cost per message grow with the keys already in it? (issue 40, item 4)

For each backend (``--backends``: ``sqlite``, ``postgres``) and each number of keys already
in the ledger (``--preload``: e.g. 10,000 and 1,000,000, written DONE with random keys, as
a long-used ledger holds them), ``--threads`` worker threads share one ledger object and do
the engine's ledger calls for batches of 10 new random keys, over and over: ``claim_many``,
``mark_sent_many``, ``mark_done_many``. Configurations are interleaved per round (each
round in another order), so a machine's drift spreads over all of them.

Printed per configuration (medians over rounds): messages/s, the client's CPU per message
(this process, every thread), and for PostgreSQL the server's CPU per message (its
processes' user + system time, read from /proc). Every round is checked: each key won once,
and every key DONE at the end.

PostgreSQL: a private server this script starts (tests/postgres_server.py: initdb and
pg_ctl on a free loopback port; as root, as the ``postgres`` user; fsync on, so that a
commit costs what it costs), or ``--postgres-url`` for one of yours (a schema per
configuration is created in it, and dropped).

Usage (from the repository root)::

    nice -n 10 .venv/bin/python bench/ledger_scale.py --preload 10000,1000000 --rounds 3

Only local files and a server on 127.0.0.1; no network.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))
sys.path.insert(1, os.path.join(os.path.dirname(_HERE), "tests"))

import argparse  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.parse  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

from redrive.ledger import Claim, Entry, KeyState, Ledger, SqliteLedger  # noqa: E402

Q = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"
BATCH = 10
LOAD_PAGE = 10_000
SCHEMAS: list[tuple[str, str]] = []  # (server URL, schema) made by this run, dropped at its end


@dataclass
class Config:
    backend: str
    preload: int
    open: Callable[[], Ledger]
    server_cpu: Callable[[], float]
    location: str = ""
    """The ledger's path or URL (as ``--ledger`` takes it)."""


def random_keys(rng: random.Random, n: int) -> list[str]:
    return [f"celery:{rng.getrandbits(128):032x}:0" for _ in range(n)]


def preload(ledger: Ledger, n: int, rng: random.Random) -> None:
    load = getattr(ledger, "load_entries")  # noqa: B009 (SQLite's and PostgreSQL's)
    ledger.start_run("old", command="move", info={})
    for start in range(0, n, LOAD_PAGE):
        keys = random_keys(rng, min(LOAD_PAGE, n - start))
        load(
            [
                Entry(k, KeyState.DONE, "old", "app.t", "m-" + k[7:19], Q, "s", 1.0, 1.0)
                for k in keys
            ],
            legacy_keys=False,
        )
    ledger.end_run("old", outcome="completed", counts={})


def one_round(
    ledger: Ledger, threads: int, batches: int, rng: random.Random, run: str
) -> dict[str, float]:
    ledger.start_run(run, command="move", info={})
    work = [[random_keys(rng, BATCH) for _ in range(batches // threads)] for _ in range(threads)]
    won: list[int] = []

    def worker(mine: list[list[str]]) -> None:
        count = 0
        for keys in mine:
            claims = [Claim(k, "app.t", "m-" + k[7:19], Q) for k in keys]
            result = ledger.claim_many(run, claims)
            count += len(result.won)
            ledger.mark_sent_many(run, {k: "s-" + k[7:15] for k in result.won})
            ledger.mark_done_many(run, list(result.won))
        won.append(count)

    pool = [threading.Thread(target=worker, args=(w,)) for w in work]
    cpu, wall = time.process_time(), time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    ledger.end_run(run, outcome="completed", counts={})
    messages = sum(len(b) for w in work for b in w)
    assert sum(won) == messages, f"{sum(won)} won of {messages}"
    done = {e.key for e in ledger.iter_keys(KeyState.DONE, run_id=run)}
    assert len(done) == messages, f"{len(done)} DONE of {messages}"
    return {"msgs": messages, "wall": wall, "cpu": cpu}


def postgres_cpu(pid: int) -> Callable[[], float]:
    """User + system seconds of the server's processes (the postmaster and its children,
    those still running and those it has reaped)."""
    tick = os.sysconf("SC_CLK_TCK")

    def read() -> float:
        total = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(entry.name) == pid or int(fields[1]) == pid:
                total += int(fields[11]) + int(fields[12])
            if int(entry.name) == pid:
                # Its children that have exited (a closed connection's backend).
                total += int(fields[13]) + int(fields[14])
        return total / tick

    return read


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--preload", default="10000,1000000")
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--batches", type=int, default=800, help="per round, all threads")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/var/tmp", help="where SQLite files go (not tmpfs)")
    parser.add_argument("--postgres-url", help="a server of yours (default: a private one)")
    args = parser.parse_args()
    backends = args.backends.split(",")
    sizes = [int(s) for s in args.preload.split(",")]
    rng = random.Random(40)
    server = None
    workdir = Path(tempfile.mkdtemp(prefix="redrive-ledger-scale-", dir=args.dir))
    try:
        base_url, cpu_of = None, (lambda: 0.0)
        if "postgres" in backends:
            base_url, cpu_of, server = _postgres(args.postgres_url)
        configs = [_config(b, n, workdir, base_url, cpu_of, rng) for b in backends for n in sizes]
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        for r in range(args.rounds):
            order = configs if r % 2 == 0 else configs[::-1]
            for c in order:
                with c.open() as led:
                    before = c.server_cpu()
                    got = one_round(led, args.threads, args.batches, rng, f"r{r}")
                    got["server"] = c.server_cpu() - before
                results.setdefault((c.backend, c.preload), []).append(got)
                rate = got["msgs"] / got["wall"]
                print(f"round {r + 1}: {c.backend} {c.preload:>9,}: {rate:,.0f} msg/s", flush=True)
        _table(results, args.threads)
    finally:
        _drop_schemas()
        if server is not None:
            import postgres_server

            postgres_server.stop(server)
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _drop_schemas() -> None:
    if not SCHEMAS:
        return
    import psycopg

    for url, schema in SCHEMAS:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def fresh_schema(base_url: str, schema: str) -> str:
    """A new, empty ledger schema on the server (``ledger init``'s tables), dropped again
    at the run's end (``_drop_schemas``); its URL (the schema as the session's search path)."""
    import psycopg

    from redrive.ledger.postgres_setup import init_schema
    from redrive.ledger.postgres_writes import PgConnector

    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in base_url else "?"
    options = urllib.parse.quote(f"-csearch_path={schema}")
    url = f"{base_url}{sep}options={options}"
    SCHEMAS.append((base_url, schema))
    init_schema(PgConnector(url, url))
    return url


def drop_schema(url: str) -> None:
    """Drops a schema ``fresh_schema`` made (its URL), before the run's end."""
    import psycopg

    for base_url, schema in list(SCHEMAS):
        if url.startswith(base_url) and urllib.parse.quote(f"-csearch_path={schema}") in url:
            with psycopg.connect(base_url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            SCHEMAS.remove((base_url, schema))


def _postgres(url: str | None) -> tuple[str, Callable[[], float], object]:
    if url is not None:
        return url, (lambda: 0.0), None
    import postgres_server

    bin_path = postgres_server.bin_dir()
    if bin_path is None:
        raise SystemExit("no PostgreSQL server installed: apt-get install postgresql")
    server = postgres_server.start(bin_path, fsync=True)
    return server.url(), postgres_cpu(server.pid), server


def _config(
    backend: str,
    n: int,
    workdir: Path,
    base_url: str | None,
    cpu_of: Callable[[], float],
    rng: random.Random,
) -> Config:
    if backend == "sqlite":
        path = workdir / f"ledger-{n}.sqlite3"
        config = Config(backend, n, lambda: SqliteLedger(path), lambda: 0.0, str(path))
    else:
        from redrive.ledger.postgres import PostgresLedger

        assert base_url is not None
        url = fresh_schema(base_url, f"bench_{n}_{os.getpid()}")
        config = Config(backend, n, lambda: PostgresLedger(url), cpu_of, url)
    started = time.perf_counter()
    with config.open() as led:
        preload(led, n, rng)
    print(f"{backend}: {n:,} keys loaded in {time.perf_counter() - started:.1f} s", flush=True)
    return config


def _table(results: dict[tuple[str, int], list[dict[str, float]]], threads: int) -> None:
    print(f"\n{threads} threads, batches of {BATCH} (claim, sent, done); medians over rounds")
    print("| backend | keys already in | msg/s | client CPU ms/msg | server CPU ms/msg |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for (backend, n), rounds in results.items():
        rate = statistics.median(r["msgs"] / r["wall"] for r in rounds)
        cpu = statistics.median(1000 * r["cpu"] / r["msgs"] for r in rounds)
        server = statistics.median(1000 * r["server"] / r["msgs"] for r in rounds)
        shown = f"{server:.3f}" if backend == "postgres" else "-"
        print(f"| {backend} | {n:,} | {rate:,.0f} | {cpu:.3f} | {shown} |")


if __name__ == "__main__":
    raise SystemExit(main())
