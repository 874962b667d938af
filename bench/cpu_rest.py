"""Issue 25 item 5's figures in one run: this tree against a "before" tree, both on the lean
SQS path (``--sqs-client lean``), in interleaved rounds (rotating order), as ratios.

Built on bench/move.py and bench/inspect.py (their servers, seeding, checks and launcher):
``move`` contenders are ``redrive-wN`` / ``redrive-p2-wN`` (this tree), ``before-wN`` /
``before-p2-wN`` (``--before DIR``) and bench/move.py's loops (``batched-16``, ...);
``inspect`` contenders are ``redrive`` and ``before`` (``redrive inspect checkout --json``,
default settings), ``before-botocore`` (the before tree on botocore's path, its default) and
bench/inspect.py's ``handwritten``. Every other redrive contender gets ``--sqs-client lean``.

Printed per size: per contender the medians of msgs/s (spawn to exit), client CPU per
message (getrusage of the contender, its children included) and peak RSS (its own, and its
largest child's with --processes); then the medians of the per-round ratios of the pairs
asked for (``--pairs a/b,...``).

Usage (repository root, the project's venv)::

    .venv/bin/python bench/cpu_rest.py move --before /tmp/redrive-before --sizes 20000 \
        --latency-ms 20 --tools redrive-w16,before-w16,batched-16,redrive-p2-w16 \
        --pairs redrive-w16/batched-16,redrive-p2-w16/redrive-w16,redrive-w16/before-w16
    .venv/bin/python bench/cpu_rest.py inspect --before /tmp/redrive-before --sizes 100000

Every request goes to 127.0.0.1.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from typing import Any  # noqa: E402

from bench import move as bm  # noqa: E402
from bench.common import FAMILY, PYTHON, ROOT, log, median, parse_sizes  # noqa: E402

LEAN = ["--sqs-client", "lean"]
BEFORE: list[str] = []


def _load_inspect() -> Any:
    """bench/inspect.py as a module (by path: ``bench.inspect`` would be fine too, but its
    name shadows the standard library's module in tools that import by name)."""
    spec = importlib.util.spec_from_file_location(
        "bench_inspect", os.path.join(_HERE, "inspect.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_inspect"] = module
    spec.loader.exec_module(module)
    return module


# -- move: bench/move.py's contenders, with before-* and the lean path --------------------------

_move_command = bm.tool_command


def move_tool_command(tool: str, n: int, ledger: str, wait: int) -> list[str]:
    if tool.startswith("before"):
        tool = "redrive" + tool.removeprefix("before")
    command = _move_command(tool, n, ledger, wait)
    return [*command, *LEAN] if tool.startswith("redrive") else command


def move_tool_tree(tool: str) -> str:
    return BEFORE[0] if tool.startswith("before") else ROOT


def bench_move(args: argparse.Namespace, tools: list[str]) -> list[bm.SizeResult]:
    bm.tool_command = move_tool_command
    bm.tool_tree = move_tool_tree
    bm.SEED_CONNECTIONS[0] = 16 if args.latency_ms else 1
    server = bm.start_server("fast", args.latency_ms)
    try:
        if not args.no_warmup:
            bm.bench_size(server, 200, 1, tools, 0, quiet=True)
        return [bm.bench_size(server, n, args.rounds, tools, 0) for n in args.sizes]
    finally:
        server.stop()


def move_rows(result: bm.SizeResult, tools: Sequence[str]) -> list[str]:
    lines = [
        f"N={result.n:,}  tool  msgs/s  own msgs/s  client CPU ms/msg  peak RSS MB  child RSS MB"
        "  ok"
    ]
    for tool in tools:
        runs = [r for r in result.runs if r.tool == tool and r.ok]
        if not runs:
            lines.append(f"  {tool:<16} no run passed its checks")
            continue
        lines.append(
            f"  {tool:<16} {median([r.rate_wall for r in runs]):8,.0f} "
            f"{median([r.rate_own or 0.0 for r in runs]):8,.0f} "
            f"{median([r.client_cpu_s / r.n * 1000 for r in runs]):8.3f} "
            f"{median([r.peak_rss_mb for r in runs]):8.1f} "
            f"{median([r.child_rss_mb for r in runs]):8.1f}  "
            f"{len(runs)}/{args_rounds(result, tool)}"
        )
    return lines


def args_rounds(result: Any, tool: str) -> int:
    return len([r for r in result.runs if r.tool == tool])


# -- inspect ---------------------------------------------------------------------------------


def inspect_main_for(tree: str) -> str:
    return (
        f"import sys\nsys.path.insert(0, {tree!r})\n"
        "from redrive.cli import main\nsys.exit(main())\n"
    )


def bench_inspect(args: argparse.Namespace, tools: list[str]) -> list[Any]:
    bi = _load_inspect()
    original = bi.tool_command

    def tool_command(tool: str, n: int, wait: int, backends: Any = None) -> list[str]:
        if tool in ("redrive", "before", "before-botocore"):
            tree = ROOT if tool == "redrive" else BEFORE[0]
            client = [] if tool == "before-botocore" else LEAN  # botocore: the default then
            return [PYTHON, "-c", inspect_main_for(tree), "inspect", FAMILY, "--json", *client]
        return list(original(tool, n, wait, backends))

    bi.tool_command = tool_command
    return [bi.bench_size("fast", n, args.rounds, tools, args.receive_wait) for n in args.sizes]


def inspect_rows(result: Any, tools: Sequence[str]) -> list[str]:
    lines = [f"N={result.n:,}  tool  msgs/s  scan msgs/s  client CPU ms/msg  peak RSS MB  ok"]
    for tool in tools:
        runs = [r for r in result.runs if r.tool == tool and r.ok]
        if not runs:
            lines.append(f"  {tool:<16} no run passed its checks")
            continue
        lines.append(
            f"  {tool:<16} {median([r.rate_wall for r in runs]):8,.0f} "
            f"{median([r.rate_scan or 0.0 for r in runs]):8,.0f} "
            f"{median([r.client_cpu_s / r.n * 1000 for r in runs]):8.3f} "
            f"{median([r.peak_rss_mb for r in runs]):8.1f}  {len(runs)}/{args_rounds(result, tool)}"
        )
    return lines


# -- ratios ----------------------------------------------------------------------------------


def ratios(result: Any, pairs: Sequence[tuple[str, str]], own: str) -> list[str]:
    """Medians of per-round ratios: rate (wall), rate (own timer), client CPU per message."""
    lines = []
    for a, b in pairs:
        cells = {}
        for label, value in (
            ("wall", lambda r: r.rate_wall),
            ("own", lambda r: getattr(r, own) or 0.0),
            ("cpu/msg", lambda r: r.client_cpu_s / r.n),
        ):
            per_round = []
            for rnd in sorted({r.round for r in result.runs}):
                ra = [r for r in result.runs if r.tool == a and r.round == rnd and r.ok]
                rb = [r for r in result.runs if r.tool == b and r.round == rnd and r.ok]
                if ra and rb and value(rb[0]):
                    per_round.append(value(ra[0]) / value(rb[0]))
            cells[label] = (median(per_round), per_round)
        lines.append(
            f"  {a} / {b}: "
            + "; ".join(
                f"{label} {m:.2f}x (rounds {', '.join(f'{x:.2f}' for x in rs)})"
                for label, (m, rs) in cells.items()
            )
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/cpu_rest.py", description=__doc__)
    parser.add_argument("what", choices=("move", "inspect"))
    parser.add_argument("--before", required=True, metavar="DIR")
    parser.add_argument("--sizes", type=parse_sizes, default=[20_000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--receive-wait", type=int, default=1, help="inspect's long poll")
    parser.add_argument("--tools", default="")
    parser.add_argument("--pairs", default="", help="a/b,c/d: ratios of a to b, c to d")
    parser.add_argument("--no-warmup", action="store_true")
    parser.add_argument("--json-out", metavar="FILE")
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.before, "redrive", "__init__.py")):
        parser.error(f"--before {args.before}: no redrive package there")
    BEFORE[:] = [os.path.abspath(args.before)]
    default = "redrive-w16,before-w16" if args.what == "move" else "redrive,before,handwritten"
    tools = [t for t in (args.tools or default).split(",") if t]
    pairs = [tuple(p.split("/", 1)) for p in args.pairs.split(",") if "/" in p]
    subprocess.run(
        [PYTHON, "-c", "import redrive.cli, redrive.broker.sqs.lean"], cwd=ROOT, check=True
    )
    subprocess.run(
        [PYTHON, "-c", "import redrive.cli, redrive.broker.sqs.lean"], cwd=BEFORE[0], check=True
    )
    log(f"bench/cpu_rest.py {args.what}: tools {tools}, sizes {args.sizes}, load {os.getloadavg()}")
    if args.what == "move":
        results = bench_move(args, tools)
        rows, own = move_rows, "rate_own"
    else:
        results = bench_inspect(args, tools)
        rows, own = inspect_rows, "rate_scan"
    for result in results:
        print("\n".join(rows(result, tools)))
        print("\n".join(ratios(result, pairs, own)))  # type: ignore[arg-type]
    print(f"load average now {os.getloadavg()}")
    if args.json_out:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump(
                [{"n": r.n, "runs": [vars(x) for x in r.runs]} for r in results], out, indent=1
            )
    return 0 if all(x.ok for r in results for x in r.runs) else 1


if __name__ == "__main__":
    sys.exit(main())
