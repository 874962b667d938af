"""How fast does ``redrive move`` drain a RabbitMQ DLQ, next to what one would write by hand
and to RabbitMQ's own shovel? And does ``redrive inspect`` stay bounded in memory?

    python -m bench.rabbitmq_move [--messages 10000] [--rounds 3] [--window 100]
                                  [--inspect-messages 100000] [--amqp-url URL --api-url URL]

Each round refills the ``checkout`` family's DLQ (``onion-checkout-dlq``) with ``--messages``
Celery tasks through RabbitMQ's own dead-lettering (redrive/sandbox/rabbitmq_layout.py), then
runs one candidate; candidates take turns in rotating order, so a busy core slows them all
alike. Candidates:

- ``redrive``: ``redrive move checkout --execute --yes`` as a subprocess (default workers);
  ``redrive-w16`` the same with ``--workers 16``; ``redrive-p2`` with ``--processes 2`` (a
  core each, where one process's py-amqp is CPU-bound);
- ``one-at-a-time``: basic_get, publish (mandatory) and wait for its confirm, ack;
- ``pipelined``: basic_get up to ``--window`` messages, publish them all, wait for the
  confirms, then one multiple ack;
- ``shovel``: a dynamic shovel (management API, ``src-delete-after: queue-length``,
  ``ack-mode: on-confirm``), timed from its creation until the DLQ is empty and the source
  holds every message.

Checked after each run: the DLQ is empty and the source queue holds exactly ``--messages``.
Then ``redrive inspect checkout`` on ``--messages`` and on ``--inspect-messages``: msg/s and
the redrive process's peak RSS (VmHWM, written by the process itself at exit). Prints
msg/s per candidate (medians) with the CPU each spent a message, the client's (this process
or its redrive subprocess) and the server's (every ``beam.smp`` on the machine), and the
ratios redrive ÷ one-at-a-time (target ≥ 5×) and redrive ÷ pipelined (target ≥ 0.9×).
redrive's bytecode is written first, as an install writes it. Without ``--amqp-url`` a
private node is started.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from resource import RUSAGE_CHILDREN, RUSAGE_SELF, getrusage
from typing import Any

# Run as a script, this file's folder is sys.path[0], and bench/inspect.py would shadow the
# standard library's inspect (which vine, under py-amqp, imports).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

from dataclasses import dataclass, field  # noqa: E402 (imports inspect: after the path)

import amqp  # noqa: E402

from redrive.sandbox.rabbitmq_layout import (  # noqa: E402
    Confirms,
    dead_letter,
    declare_layout,
    open_connection,
    queue_depth,
    rabbit_families,
    raw_channel,
    sample_celery_messages,
)
from redrive.sandbox.rabbitmq_node import management_request  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WAIT = 300.0  # a bound for a hang, not a pace

# redrive runs through this so that it reports its own peak RSS (KiB) at exit: VmHWM, the
# high-water mark of its own memory since exec. Not ru_maxrss: Linux carries the parent's
# high-water mark over (v)fork and exec into it, and this bench process, after a refill of
# 100,000 messages, is larger than redrive (it read 93 MB where redrive's own peak was 56).
_LAUNCH = """
import atexit, json, os, runpy, sys
def _rss():
    with open("/proc/self/status") as status:
        hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    with open(os.environ["BENCH_RSS_OUT"], "w") as out:
        json.dump(hwm, out)
atexit.register(_rss)
sys.argv = ["redrive", *sys.argv[1:]]
runpy.run_module("redrive", run_name="__main__")
"""


class Bench:
    def __init__(self, amqp_url: str, api_url: str, messages: int, window: int) -> None:
        self.amqp_url, self.api_url = amqp_url, api_url
        self.messages, self.window = messages, window
        self.families = rabbit_families()
        self.family = next(f for f in self.families if f.name == "checkout")
        self.connection = open_connection(amqp_url)
        self.channel = raw_channel(self.connection)
        declare_layout(self.channel, self.families)
        self.vhost = _vhost(amqp_url)

    def refill(self, count: int) -> None:
        """Empty both queues, then dead-letter ``count`` tasks into the DLQ (in chunks, so
        that 100,000 are never all held here)."""
        self.channel.queue_purge(self.family.queue)
        self.channel.queue_purge(self.family.dlq)
        for start in range(0, count, 10_000):
            chunk = sample_celery_messages("checkout", min(10_000, count - start), seed=start)
            dead_letter(self.connection, self.family, chunk)
        assert queue_depth(self.channel, self.family.dlq) == count

    def check_moved(self, name: str) -> None:
        dlq, source = self.depths()
        assert (dlq, source) == (0, self.messages), (name, dlq, source)

    def depths(self) -> tuple[int, int]:
        return queue_depth(self.channel, self.family.dlq), queue_depth(
            self.channel, self.family.queue
        )

    # -- candidates ----------------------------------------------------------------------------

    def redrive(self, *args: str) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="bench-state-") as state:
            rss = Path(state) / "rss.json"
            urls = ("--broker", self.amqp_url, "--rabbitmq-api", self.api_url)
            done = subprocess.run(
                [sys.executable, "-c", _LAUNCH, *urls, *args],
                cwd=ROOT,
                env={**os.environ, "REDRIVE_STATE_DIR": state, "BENCH_RSS_OUT": str(rss)},
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=WAIT,
            )
            assert done.returncode == 0, (args, done.stdout[-1500:], done.stderr[-1500:])
            out: dict[str, Any] = json.loads(done.stdout)
            out["rss_kib"] = json.loads(rss.read_text())
        return out

    def redrive_move(self, *extra: str) -> None:
        out = self.redrive("move", "checkout", "--execute", "--yes", "--json", *extra)
        assert out["moved"] == self.messages, out

    def one_at_a_time(self) -> None:
        channel = raw_channel(self.connection)
        channel.confirm_select()
        family = self.family
        while (got := channel.basic_get(family.dlq, no_ack=False)) is not None:
            channel.basic_publish_confirm(
                _copy(got), exchange="", routing_key=family.queue, mandatory=True
            )
            channel.basic_ack(got.delivery_tag)
        channel.close()

    def pipelined(self) -> None:
        channel = raw_channel(self.connection)
        channel.confirm_select()
        confirms = Confirms()
        returned = [0]
        channel.events["basic_ack"].add(lambda t, m: confirms.settle(t, m, ok=True))
        channel.events["basic_nack"].add(lambda t, m: confirms.settle(t, m, ok=False))
        channel.events["basic_return"].add(lambda *_: returned.__setitem__(0, returned[0] + 1))
        family = self.family
        while True:
            last = None
            for _ in range(self.window):
                got = channel.basic_get(family.dlq, no_ack=False)
                if got is None:
                    break
                channel.basic_publish(
                    _copy(got), exchange="", routing_key=family.queue, mandatory=True
                )
                confirms.published()
                last = got.delivery_tag
            if last is None:
                break
            while confirms.pending:
                self.connection.drain_events(timeout=WAIT)
            assert not confirms.nacked and not returned[0], (confirms.nacked, returned)
            channel.basic_ack(last, multiple=True)
        channel.close()

    def shovel(self) -> None:
        uri = "amqp:///" + urllib.parse.quote(self.vhost, safe="")
        path = f"/api/parameters/shovel/{urllib.parse.quote(self.vhost, safe='')}/bench-move"
        value = {
            "src-protocol": "amqp091",
            "src-uri": uri,
            "src-queue": self.family.dlq,
            "dest-protocol": "amqp091",
            "dest-uri": uri,
            "dest-queue": self.family.queue,
            "src-delete-after": "queue-length",
            "ack-mode": "on-confirm",
        }
        management_request(self.api_url, "PUT", path, {"value": value})
        deadline = time.monotonic() + WAIT
        while self.depths() != (0, self.messages):
            assert time.monotonic() < deadline, ("shovel", self.depths())
            time.sleep(0.005)

    def candidates(self, w16: bool) -> dict[str, Callable[[], None]]:
        ways: dict[str, Callable[[], None]] = {"redrive": self.redrive_move}
        if w16:
            ways["redrive-w16"] = lambda: self.redrive_move("--workers", "16")
        ways["redrive-p2"] = lambda: self.redrive_move("--processes", "2")
        ways |= {
            "one-at-a-time": self.one_at_a_time,
            "pipelined": self.pipelined,
            "shovel": self.shovel,
        }
        return ways


def _vhost(amqp_url: str) -> str:
    path = urllib.parse.urlsplit(amqp_url).path
    return urllib.parse.unquote(path[1:]) if len(path) > 1 else "/"


def _copy(got: amqp.Message) -> amqp.Message:
    """The message as it came, to publish again (body and properties, x-death included)."""
    return amqp.Message(got.body, **got.properties)


def client_cpu() -> float:
    """CPU seconds of this process and of its children waited for (redrive's runs)."""
    own, children = (getrusage(who) for who in (RUSAGE_SELF, RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def server_cpu() -> float:
    """CPU seconds of every RabbitMQ node (``beam.smp``) on this machine: the bench's own,
    and, with --amqp-url, the one named (only loopback nodes are reachable here)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # gone since the listing
        name, _, rest = text.partition(") ")
        if name.endswith("(beam.smp"):
            fields = rest.split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


@dataclass
class Rates:
    """Per candidate, per round: msg/s, and client and server CPU ms a message."""

    rate: dict[str, list[float]] = field(default_factory=dict)
    client: dict[str, list[float]] = field(default_factory=dict)
    server: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, messages: int, took: float, client: float, server: float) -> None:
        self.rate.setdefault(name, []).append(messages / took)
        self.client.setdefault(name, []).append(1000 * client / messages)
        self.server.setdefault(name, []).append(1000 * server / messages)


def run_moves(bench: Bench, rounds: int, w16: bool) -> Rates:
    ways = bench.candidates(w16)
    names = list(ways)
    rates = Rates()
    for round_ in range(rounds):
        turn = round_ % len(names)
        for name in names[turn:] + names[:turn]:
            bench.refill(bench.messages)
            client, server = client_cpu(), server_cpu()
            started = time.perf_counter()
            ways[name]()
            took = time.perf_counter() - started
            client, server = client_cpu() - client, server_cpu() - server
            bench.check_moved(name)
            rates.add(name, bench.messages, took, client, server)
    return rates


def run_inspect(bench: Bench, sizes: Sequence[int]) -> list[tuple[int, float, float]]:
    rows = []
    for size in sizes:
        bench.refill(size)
        started = time.perf_counter()
        out = bench.redrive("inspect", "checkout", "--json")
        took = time.perf_counter() - started
        assert _counted(out) == size, (size, {k: v for k, v in out.items() if k != "tasks"})
        # Inspect left the DLQ as it was: what it held comes back when its connection closes,
        # a moment after it exits; wait for the count (bounded), not for a time.
        deadline = time.monotonic() + WAIT
        while bench.depths() != (size, 0):
            assert time.monotonic() < deadline, ("inspect", size, bench.depths())
            time.sleep(0.05)
        rows.append((size, size / took, out["rss_kib"] / 1024))
        report_inspects(rows[-1:])  # at once: a failed later size must not hide this one
    return rows


def _counted(out: dict[str, Any]) -> int:
    for key in ("scanned", "messages", "total"):
        if isinstance(out.get(key), int):
            return int(out[key])
    return sum(int(group["count"]) for group in out["tasks"])


def report_moves(rates: Rates) -> None:
    med = {name: statistics.median(values) for name, values in rates.rate.items()}
    for name, value in med.items():
        client = statistics.median(rates.client[name])
        server = statistics.median(rates.server[name])
        print(
            f"move {name:14} {value:9,.0f} msg/s  CPU a message: client {client:5.3f} ms,"
            f" server {server:5.3f} ms  ({len(rates.rate[name])} rounds)"
        )
    best = max((v, n) for n, v in med.items() if n.startswith("redrive"))
    print(f"ratio {best[1]} / one-at-a-time: {best[0] / med['one-at-a-time']:.1f}x (target >= 5x)")
    print(f"ratio {best[1]} / pipelined: {best[0] / med['pipelined']:.2f}x (target >= 0.9x)")
    print(f"ratio {best[1]} / shovel: {best[0] / med['shovel']:.2f}x", flush=True)


def report_inspects(inspects: list[tuple[int, float, float]]) -> None:
    for size, rate, rss in inspects:
        print(f"inspect {size:>7,} {rate:9,.0f} msg/s  peak RSS {rss:6.1f} MB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--inspect-messages", type=int, default=100_000)
    parser.add_argument("--no-w16", action="store_true", help="leave out redrive --workers 16")
    parser.add_argument("--amqp-url")
    parser.add_argument("--api-url")
    args = parser.parse_args()
    # redrive's bytecode written once, as an install writes it: where PYTHONDONTWRITEBYTECODE
    # is set, each run would otherwise compile its modules again at every start.
    compileall.compile_dir(ROOT / "redrive", quiet=1)
    node = None
    if args.amqp_url is None:
        from redrive.sandbox.rabbitmq_node import start_node

        node = start_node(Path(tempfile.mkdtemp(prefix="bench-rmq-")))
        args.amqp_url, args.api_url = node.amqp_url, node.api_url
    try:
        bench = Bench(args.amqp_url, args.api_url, args.messages, args.window)
        report_moves(run_moves(bench, args.rounds, not args.no_w16))
        run_inspect(bench, sorted({args.messages, args.inspect_messages}))
    finally:
        if node is not None:
            node.stop()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
