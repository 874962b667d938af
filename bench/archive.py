"""What checking an archive costs: replay reads every archive whole before it sends anything.

For each size N: an archive of N realistic Celery messages is written the way a local purge
writes it (one gzip member per batch of 10, the header sealed on close); then, each in a
fresh child process (for its own peak RSS), best of ``--rounds``:

- ``check``: ``check_archive``, the pre-pass of ``replay`` (decompress, CRC, parse and
  validate every record, count, look for damage);
- ``json floor``: the same bytes through ``gzip`` and ``json.loads`` only, no checks: what
  any reader of the format pays.

    .venv/bin/python bench/archive.py --sizes 1000,100000

Runs on local disk only; nothing is sent anywhere.
"""

from __future__ import annotations

import os
import sys

# As in bench/inspect.py: this folder must not be sys.path[0] (bench/inspect.py would shadow
# the standard library's ``inspect``); the repository root instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from datetime import UTC, datetime  # noqa: E402

from bench.common import DLQ, TASKS, arguments, parse_sizes  # noqa: E402
from redrive.archive import ArchiveRecord, check_archive, open_writer  # noqa: E402
from redrive.broker.sqs.calls import ARCHIVED_ATTRIBUTES, delivery_of  # noqa: E402
from redrive.sandbox.encoder import encode  # noqa: E402

BATCH = 10  # records per write_batch: a local purge archives each receive of 10


def write_archive(path: str, size: int, seed: int = 7) -> float:
    rng = random.Random(seed)
    tasks = [task for task, weight in TASKS for _ in range(weight)]
    now = datetime.now(UTC)
    started = time.perf_counter()
    with open_writer(path) as writer:
        batch: list[ArchiveRecord] = []
        for n in range(size):
            task = rng.choice(tasks)
            args, kwargs = arguments(task, rng)
            message = {
                "MessageId": f"{rng.getrandbits(128):032x}",
                "Body": encode(task, args, kwargs, task_id=f"{rng.getrandbits(128):032x}"),
                "Attributes": {
                    "SentTimestamp": str(1_790_000_000_000 + n),
                    "ApproximateReceiveCount": "6",
                    "ApproximateFirstReceiveTimestamp": str(1_790_000_000_500 + n),
                },
                "MessageAttributes": {},
            }
            batch.append(
                ArchiveRecord.from_message(
                    delivery_of({**message, "ReceiptHandle": "-"}),
                    kept=ARCHIVED_ATTRIBUTES,
                    task=task,
                    task_id=None,
                    dlq=f"https://sqs.example/{DLQ}",
                    run_id="bench",
                    archived_at=now,
                )
            )
            if len(batch) == BATCH:
                writer.write_batch(batch)
                batch = []
        writer.write_batch(batch)
    return time.perf_counter() - started


def child(kind: str, path: str) -> None:
    started = time.perf_counter()
    if kind == "check":
        result = check_archive(path)
        assert result.damage is None, result.damage
        count = result.records
    else:
        with gzip.open(path, "rb") as handle:
            count = sum(1 for line in handle if json.loads(line) is not None)
    seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"records": count, "seconds": seconds, "peak_mb": peak_mb}))


def measure(kind: str, path: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, __file__, "--child", kind, path],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=parse_sizes, default=[1_000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        child(*options.child)
        return 0
    print(
        "| records | archive MB | write s | check s | check records/s | check peak RSS MB "
        "| json floor s | ok |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    failed = False
    for size in options.sizes:
        with tempfile.TemporaryDirectory(prefix="redrive-bench-archive-") as scratch:
            path = os.path.join(scratch, "a.jsonl.gz")
            wrote = write_archive(path, size)
            checks = [measure("check", path) for _ in range(options.rounds)]
            floors = [measure("floor", path) for _ in range(options.rounds)]
            best = min(checks, key=lambda r: r["seconds"])
            ok = all(r["records"] == size for r in checks + floors)
            failed |= not ok
            print(
                f"| {size:,} | {os.path.getsize(path) / 1e6:.1f} | {wrote:.2f} "
                f"| {best['seconds']:.2f} | {size / best['seconds']:,.0f} "
                f"| {max(r['peak_mb'] for r in checks):.1f} "
                f"| {min(r['seconds'] for r in floors):.2f} | {'yes' if ok else 'NO'} |"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
