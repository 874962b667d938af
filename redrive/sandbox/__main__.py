"""``python -m redrive.sandbox``: the sandbox without the CLI (the test suite starts it so)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from redrive.config import load_layout
from redrive.errors import RedriveError
from redrive.sandbox.rehearsal import run, seeded_lines
from redrive.sandbox.seeding import SeededFamily
from redrive.sandbox.server import SandboxServer, export_lines, start_server


def _main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m redrive.sandbox",
        description="A local SQS (moto) on loopback for trying redrive; stop with Ctrl-C.",
    )
    parser.add_argument("--port", type=int, default=0, help="port (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address")
    parser.add_argument(
        "--serial", action="store_true", help="serve one request at a time (concurrent receivers)"
    )
    parser.add_argument(
        "--bare",
        action="store_true",
        help="no queues, stock moto (no extensions), log every request (for the test suite)",
    )
    parser.add_argument("--per-family", type=int, default=40, help="messages per DLQ")
    parser.add_argument("--seed", type=int, help="draw the same tasks as an earlier start")
    parser.add_argument(
        "--keep-state", action="store_true", help="keep the state directory when stopped"
    )
    parser.add_argument("--config", help="layout file (default: $REDRIVE_CONFIG or built-in)")
    args = parser.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        if args.bare:
            with start_server(
                args.port, host=args.host, serial=args.serial, log_requests=True, extended=False
            ) as server:
                print(f"redrive sandbox: SQS on {server.endpoint_url}", flush=True)
                while not stop.wait(0.5):
                    pass
            return 0

        def ready(server: SandboxServer, seeded: list[SeededFamily]) -> None:
            print("\n".join([*seeded_lines(server, seeded), *export_lines(server)]), flush=True)

        kept = run(
            args.port,
            load_layout(args.config),
            per_family=args.per_family,
            host=args.host,
            serial=args.serial,
            seed=args.seed,
            keep_state=args.keep_state,
            on_ready=ready,
            stop=stop,
        )
        if kept is not None:
            print(f"# kept the sandbox's state in {kept}", flush=True)
    except (RedriveError, ValueError, OSError) as exc:
        print(f"redrive sandbox: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
