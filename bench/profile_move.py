"""Where one ``redrive move --execute`` spends its client CPU: py-spy on a real run (issue 25).

Starts bench/fast_sqs.py (``--latency-ms``), seeds the DLQ with N realistic Celery messages
(bench/move.py's), and runs ``redrive move checkout --execute`` (``--workers``,
``--sqs-client``, ``--processes``) under ``py-spy record`` (``--gil`` by default: only the
thread holding the GIL is sampled, so the samples are where the interpreter's one core
goes). The raw (collapsed) profile is kept; the summary prints the top functions by self
samples and by inclusive samples, and the shares of redrive's parts (decode, keys, ledger,
move engine, scan, lean SQS path, botocore, sqlite, sockets, the GIL's hand-offs).

``--tracemalloc`` instead runs the move once with tracemalloc on (``--frames``) and prints
the top allocations still held at the peak of traced memory (snapshot taken when the
traced peak was last exceeded by 1 MB), with the peak RSS of the process.

Usage (repository root, the project's venv, py-spy from requirements/bench.txt)::

    .venv/bin/python bench/profile_move.py --n 20000 --workers 16 --latency-ms 20
    .venv/bin/python bench/profile_move.py --n 20000 --workers 16 --tree /tmp/redrive-before
    .venv/bin/python bench/profile_move.py --n 100000 --workers 16 --tracemalloc

Every request goes to 127.0.0.1.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Sequence  # noqa: E402

from bench.common import FAMILY, PYTHON, ROOT, child_env, log  # noqa: E402
from bench.move import (  # noqa: E402
    SEED_CONNECTIONS,
    RawSqs,
    SeedBatches,
    depth,
    fresh_family,
    seed,
    start_server,
)

#: Parts of a run, by where a sampled frame's code lives (the first that matches wins,
#: scanning the stack from its leaf).
PARTS = (
    ("decode", ("redrive/messages.py", "redrive/message_record.py", "kombu/", "zlib")),
    ("keys", ("redrive/keys.py", "hashlib")),
    ("ledger", ("redrive/ledger/", "sqlite3")),
    ("lean SQS", ("redrive/broker/sqs/lean.py",)),
    ("SQS calls", ("redrive/broker/sqs/", "redrive/aws/")),
    ("scan", ("redrive/dlq/",)),
    ("move engine", ("redrive/operations/move/",)),
    ("run/limits", ("redrive/operations/", "redrive/rate.py", "redrive/selection.py")),
    ("botocore", ("botocore/",)),
    ("http/json", ("http/client.py", "json/", "socket.py", "ssl.py", "email/")),
    ("threading", ("threading.py", "queue.py")),
)

# The traced move: tracemalloc on before redrive is imported; at exit the snapshot taken at
# the traced peak is written as text, top allocations by size.
_TRACED = """
import atexit, os, resource, sys, threading, tracemalloc
tracemalloc.start(int(os.environ.get("BENCH_TRACE_FRAMES", "1")))
state = {"peak": 0, "snap": None}
def watch():
    while True:
        current, peak = tracemalloc.get_traced_memory()
        if current > state["peak"] + (4 << 20):
            state["peak"] = current
            state["snap"] = tracemalloc.take_snapshot()
        threading.Event().wait(0.5)
threading.Thread(target=watch, daemon=True).start()
def dump():
    snap = state["snap"] or tracemalloc.take_snapshot()
    snap = snap.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    lines = [f"traced peak {tracemalloc.get_traced_memory()[1] / 2**20:.1f} MiB; "
             f"snapshot at {state['peak'] / 2**20:.1f} MiB; "
             f"maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.1f} MB"]
    for key in ("filename", "lineno"):
        lines.append(f"-- by {key}")
        for stat in snap.statistics(key)[:25]:
            lines.append(
                f"{stat.size / 2**20:8.2f} MiB {stat.count:>8} blocks  {stat.traceback[0]}"
            )
    lines.append("-- by traceback (top 8)")
    for stat in snap.statistics("traceback")[:8]:
        lines.append(f"{stat.size / 2**20:8.2f} MiB {stat.count:>8} blocks")
        lines.extend("      " + line for line in stat.traceback.format()[-12:])
    with open(os.environ["BENCH_TRACE_OUT"], "w") as out:
        out.write("\\n".join(lines) + "\\n")
atexit.register(dump)
from redrive.cli import main
sys.exit(main())
"""
_MAIN = "import sys\nfrom redrive.cli import main\nsys.exit(main())\n"


def move_command(args: argparse.Namespace, ledger: str, code: str) -> list[str]:
    command = [PYTHON, "-c", code, "move", FAMILY, "--execute", "--yes", "--json"]
    command += ["--include-unknown", "--ledger", ledger, "--workers", str(args.workers)]
    if args.processes > 1:
        command += ["--processes", str(args.processes)]
    if args.sqs_client:
        command += ["--sqs-client", args.sqs_client]
    return command


def part_of(stack: Sequence[str]) -> str:
    for frame in reversed(stack):
        for part, needles in PARTS:
            if any(needle in frame for needle in needles):
                return part
    return "other"


def summarise(raw_path: str, top: int, *, lines: bool = False) -> str:
    """The raw (collapsed) profile: top self and inclusive functions (``lines``: lines), and
    the parts' shares."""
    self_counts: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    parts: collections.Counter[str] = collections.Counter()
    total = 0
    with open(raw_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stack_text, _, count_text = line.rstrip("\n").rpartition(" ")
            if not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [short(frame, lines) for frame in stack_text.split(";")]
            frames = [f for f in frames if f]
            if not frames:
                continue
            total += count
            self_counts[frames[-1]] += count
            for frame in set(frames):
                incl[frame] += count
            parts[part_of(frames)] += count
    out = [f"{total:,} samples"]
    out.append("-- parts (by the innermost frame that names one)")
    for part, count in parts.most_common():
        out.append(f"  {count / total:6.1%}  {part}")
    out.append(f"-- top {top} by self samples")
    for frame, count in self_counts.most_common(top):
        out.append(f"  {count / total:6.1%}  {frame}")
    out.append(f"-- top {top} by inclusive samples (redrive's own and the libraries' calls)")
    shown = 0
    for frame, count in incl.most_common():
        if frame.startswith(("<module>", "run (threading", "_bootstrap", "main (redrive/cli")):
            continue
        out.append(f"  {count / total:6.1%}  {frame}")
        shown += 1
        if shown >= top:
            break
    return "\n".join(out)


def short(frame: str, lines: bool = False) -> str:
    """``func (path/to/site-packages/pkg/mod.py:12)`` -> ``func (pkg/mod.py)`` (``lines``:
    ``:12`` kept)."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    if not lines:
        where = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", "lib/python3.11/", ROOT + "/"):
        if marker in where:
            where = where.split(marker, 1)[1]
            break
    if "/tmp/redrive-before/" in where:
        where = where.split("/tmp/redrive-before/", 1)[1]
    return f"{name} ({where})" if where else name


def run_once(
    args: argparse.Namespace, server_endpoint: str, raw: RawSqs, batches: SeedBatches
) -> int:
    dlq_url, queue_url = fresh_family(raw)
    seed(raw, dlq_url, batches)
    state = tempfile.mkdtemp(prefix="redrive-profile-")
    try:
        env = child_env(server_endpoint, state, 0)
        env["PYTHONPATH"] = os.path.abspath(args.tree)
        ledger = os.path.join(state, "ledger.sqlite3")
        out_dir = os.path.abspath(args.out)
        os.makedirs(out_dir, exist_ok=True)
        tree = os.path.basename(os.path.abspath(args.tree))
        label = f"{tree}-w{args.workers}-p{args.processes}-{args.n}-lat{args.latency_ms:g}"
        if args.tracemalloc:
            env["BENCH_TRACE_FRAMES"] = str(args.frames)
            env["BENCH_TRACE_OUT"] = os.path.join(out_dir, f"trace-{label}.txt")
            command = move_command(args, ledger, _TRACED)
        else:
            raw_out = os.path.join(out_dir, f"pyspy-{label}.txt")
            spy = [shutil.which("py-spy", path=os.path.dirname(PYTHON)) or "py-spy", "record"]
            spy += ["--format", "raw", "--rate", str(args.rate), "--output", raw_out]
            if args.gil:
                spy.append("--gil")
            if args.native:
                spy.append("--native")
            if args.processes > 1:
                spy.append("--subprocesses")
            command = [*spy, "--", *move_command(args, ledger, _MAIN)]
        started = time.perf_counter()
        done = subprocess.run(
            command, cwd=args.tree, env=env, capture_output=True, text=True, timeout=1800
        )
        wall = time.perf_counter() - started
        try:
            # py-spy says what it did on the same stdout, after redrive's JSON.
            text = "".join(
                line for line in done.stdout.splitlines(True) if not line.startswith("py-spy>")
            )
            data = json.loads(text)
        except ValueError:
            log(f"no JSON from redrive: {done.stdout[-300:]!r} {done.stderr[-1500:]}")
            return 1
        after = depth(raw, queue_url)
        log(
            f"moved {data.get('moved')} of {args.n} in {wall:.1f} s "
            f"(own {data.get('seconds', 0):.1f} s);"
            f" target {after}, failed {data.get('failed')}, in doubt {data.get('in_doubt')}"
        )
        if args.tracemalloc:
            with open(env["BENCH_TRACE_OUT"], encoding="utf-8") as f:
                print(f.read())
        else:
            print(f"py-spy raw profile: {raw_out}")
            print(summarise(raw_out, args.top, lines=args.lines))
        return 0 if data.get("moved") == args.n else 1
    finally:
        shutil.rmtree(state, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/profile_move.py", description=__doc__)
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--sqs-client", default="lean", choices=("lean", "botocore", ""))
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--tree", default=ROOT, help="the redrive tree to run (default: this)")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--no-gil", dest="gil", action="store_false")
    parser.add_argument("--native", action="store_true")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--frames", type=int, default=1, help="tracemalloc's frames per trace")
    parser.add_argument(
        "--out", default=os.path.join(tempfile.gettempdir(), "redrive-profile-move")
    )
    parser.add_argument("--summarise", metavar="RAW", help="only summarise a raw profile")
    parser.add_argument("--lines", action="store_true", help="summarise by line, not function")
    args = parser.parse_args(argv)
    if args.summarise:
        print(summarise(args.summarise, args.top, lines=args.lines))
        return 0
    SEED_CONNECTIONS[0] = 16 if args.latency_ms else 1
    batches = SeedBatches(args.n)
    server = start_server("fast", args.latency_ms)
    raw = RawSqs(server.endpoint)
    try:
        return run_once(args, server.endpoint, raw, batches)
    finally:
        raw.close()
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
