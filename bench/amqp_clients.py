"""Which AMQP client should redrive's RabbitMQ backend use? py-amqp (Celery installs it)
against pika, by client CPU per message and messages per second, on a private node.

    python bench/amqp_clients.py [--messages 10000] [--loop-messages 10000] [--rounds 3]
                                 [--window 500] [--amqp-url URL]

pika comes from ``pip install -r requirements/bench.txt``. Without ``--amqp-url`` the
script starts a private node (redrive/sandbox/rabbitmq_node.py) and stops it at the end.

Per round, for each client in a rotating order (round 1: amqp, pika; round 2: pika,
amqp; ...), on queues declared afresh:

- ``publish``: N persistent (delivery_mode 2) ~1 KB messages with Celery's headers to the
  default exchange, ``mandatory``, publisher confirms pipelined: publish a window, then
  read acks, nacks and basic.returns until the window is confirmed. Checked: N acks, no
  nack, no return, the queue holds N.
- ``peek``: a consumer without auto-ack (prefetch unlimited) receives the N messages and
  acknowledges none; the channel's close gives them back. Checked: N received, the queue
  still holds N.
- ``loop``: the one-at-a-time move people write: basic.get, publish with confirm to another
  queue (wait for its ack), ack the source; M messages. Checked: M moved.

CPU is this process's (``getrusage``: user + system; the broker's is not counted), per
message; msg/s is the wall-clock rate. Medians over rounds, and pika/amqp ratios. A probe
also records, per client, the order in which basic.return and basic.ack arrive for one
unroutable mandatory publish.

pika's blocking API cannot pipeline confirms (``confirm_delivery()`` makes each
``basic_publish`` wait for its confirm), so its pipelined publish runs pika's own
asynchronous channel (``BlockingChannel._impl``: ``confirm_delivery(ack_nack_callback)``,
``add_on_return_callback``) driven by BlockingConnection's own wait; the loop uses the blocking
API as a person would.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import statistics
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is sys.path[0], and bench/inspect.py would shadow the
# standard library's inspect (which vine, under py-amqp, imports).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
sys.path.insert(0, os.path.dirname(_HERE))

import amqp  # noqa: E402

from redrive.sandbox.rabbitmq_layout import Confirms  # noqa: E402

SRC = "bench-src"
DST = "bench-dst"
CLIENTS = ("amqp", "pika")


def celery_message(i: int) -> tuple[bytes, dict[str, Any]]:
    """A ~1 KB body and the headers Celery's protocol 2 puts on a task message."""
    task_id = str(uuid.uuid4())
    body = json.dumps(
        [
            [i],
            {"payload": {"reference": f"IBFT-{i:010d}", "note": "x" * 850, "amount": "10.00"}},
            {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
        ]
    ).encode()
    headers = {
        "lang": "py",
        "task": "apps.webhooks.tasks.save_checkout_ibft",
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": f"({i},)",
        "kwargsrepr": "{'payload': {...}}",
        "origin": "gen1234@bench",
        "ignore_result": False,
    }
    return body, headers


def parse(url: str) -> tuple[str, int, str, str, str]:
    parts = urllib.parse.urlsplit(url)
    vhost = urllib.parse.unquote(parts.path[1:]) or "/"
    return (
        parts.hostname or "127.0.0.1",
        parts.port or 5672,
        urllib.parse.unquote(parts.username or "guest"),
        urllib.parse.unquote(parts.password or "guest"),
        vhost,
    )


# -- py-amqp --------------------------------------------------------------------------------


class PyAmqp:
    name = "amqp"

    def __init__(self, url: str) -> None:
        host, port, user, password, vhost = parse(url)
        # confirm_publish stays False: True makes every basic_publish wait for its confirm.
        self.connection = amqp.Connection(
            f"{host}:{port}", userid=user, password=password, virtual_host=vhost
        )
        self.connection.connect()

    def close(self) -> None:
        self.connection.close()

    def channel(self) -> Any:
        """A channel that leaves bodies as bytes: py-amqp's default (``auto_decode``)
        decodes each body by its content_encoding, which costs CPU and is not byte-exact."""
        channel = amqp.Channel(self.connection, auto_decode=False)
        channel.open()
        return channel

    def publish(self, messages: list[tuple[bytes, dict[str, Any]]], window: int) -> dict[str, int]:
        channel = self.channel()
        channel.confirm_select()
        confirms = Confirms()  # acks come out of tag order (see Confirms)
        returned = [0]

        def on_return(exc: Any, exchange: str, routing_key: str, message: Any) -> None:
            returned[0] += 1

        channel.events["basic_ack"].add(lambda t, m: confirms.settle(t, m, ok=True))
        channel.events["basic_nack"].add(lambda t, m: confirms.settle(t, m, ok=False))
        channel.events["basic_return"].add(on_return)
        for start in range(0, len(messages), window):
            for body, headers in messages[start : start + window]:
                message = amqp.Message(
                    body,
                    content_type="application/json",
                    content_encoding="utf-8",
                    delivery_mode=2,
                    correlation_id=headers["id"],
                    application_headers=headers,
                )
                channel.basic_publish(message, exchange="", routing_key=SRC, mandatory=True)
                confirms.published()
            while confirms.pending:
                self.connection.drain_events(timeout=60)
        counts = {"acked": confirms.acked, "nacked": confirms.nacked, "returned": returned[0]}
        channel.close()
        return counts

    def peek(self, count: int) -> int:
        channel = self.channel()
        channel.basic_qos(0, 0, False)
        received = [0]

        def on_message(message: Any) -> None:
            received[0] += 1

        channel.basic_consume(SRC, callback=on_message, no_ack=False)
        while received[0] < count:
            self.connection.drain_events(timeout=60)
        channel.close()  # the unacknowledged messages go back, in order
        return received[0]

    def loop(self, count: int) -> int:
        channel = self.channel()
        channel.confirm_select()
        state = {"acked": 0, "returned": 0}
        channel.events["basic_ack"].add(lambda tag, multiple: state.__setitem__("acked", tag))
        channel.events["basic_return"].add(
            lambda *args: state.__setitem__("returned", state["returned"] + 1)
        )
        moved = 0
        while moved < count:
            message = channel.basic_get(SRC, no_ack=False)
            if message is None:
                break
            copy = amqp.Message(message.body, **message.properties)
            channel.basic_publish(copy, exchange="", routing_key=DST, mandatory=True)
            moved += 1
            while state["acked"] < moved:
                self.connection.drain_events(timeout=60)
            assert state["returned"] == 0, "a copy came back unroutable"
            channel.basic_ack(message.delivery_tag)
        channel.close()
        return moved

    def depth(self, queue: str) -> int:
        channel = self.channel()
        count = channel.queue_declare(queue, passive=True).message_count
        channel.close()
        return int(count)

    def return_order(self) -> list[str]:
        channel = self.channel()
        channel.confirm_select()
        order: list[str] = []
        channel.events["basic_ack"].add(lambda tag, multiple: order.append("ack"))
        channel.events["basic_return"].add(lambda *args: order.append("return"))
        channel.basic_publish(
            amqp.Message(b"x", delivery_mode=2), exchange="", routing_key="nowhere", mandatory=True
        )
        while "ack" not in order:
            self.connection.drain_events(timeout=60)
        channel.close()
        return order


# -- pika -----------------------------------------------------------------------------------


class Pika:
    name = "pika"

    def __init__(self, url: str) -> None:
        import pika

        self.pika = pika
        host, port, user, password, vhost = parse(url)
        self.connection = pika.BlockingConnection(
            pika.ConnectionParameters(
                host=host,
                port=port,
                virtual_host=vhost,
                credentials=pika.PlainCredentials(user, password),
            )
        )

    def close(self) -> None:
        self.connection.close()

    def channel(self) -> Any:
        return self.connection.channel()

    def _wait(self, done: Callable[[], bool]) -> None:
        """Run pika's I/O loop until ``done()``. ``process_data_events`` cannot wait for an
        event of the asynchronous channel (it returns on a timer or on the blocking
        channels' own events only), so this is BlockingConnection's own wait
        (``_flush_output``, which its blocking calls use)."""
        self.connection._flush_output(done)

    def _properties(self, headers: dict[str, Any]) -> Any:
        return self.pika.BasicProperties(
            content_type="application/json",
            content_encoding="utf-8",
            delivery_mode=2,
            correlation_id=headers["id"],
            headers=headers,
        )

    def _confirming_impl(
        self, confirms: Confirms, returned: list[int], order: list[str] | None = None
    ) -> tuple[Any, Any]:
        """pika's asynchronous channel under a blocking channel, in confirm mode."""
        spec = self.pika.spec
        channel = self.connection.channel()
        impl = channel._impl

        def on_confirm(frame: Any) -> None:
            method = frame.method
            ok = isinstance(method, spec.Basic.Ack)
            confirms.settle(method.delivery_tag, method.multiple, ok=ok)
            if order is not None:
                order.append("ack")

        def on_return(channel: Any, method: Any, properties: Any, body: bytes) -> None:
            returned[0] += 1
            if order is not None:
                order.append("return")

        selected = [False]
        impl.confirm_delivery(on_confirm, callback=lambda frame: selected.__setitem__(0, True))
        impl.add_on_return_callback(on_return)
        self._wait(lambda: selected[0])
        return channel, impl

    def publish(self, messages: list[tuple[bytes, dict[str, Any]]], window: int) -> dict[str, int]:
        confirms, returned = Confirms(), [0]
        channel, impl = self._confirming_impl(confirms, returned)
        for start in range(0, len(messages), window):
            for body, headers in messages[start : start + window]:
                impl.basic_publish("", SRC, body, self._properties(headers), mandatory=True)
                confirms.published()
            self._wait(lambda: not confirms.pending)
        channel.close()
        return {"acked": confirms.acked, "nacked": confirms.nacked, "returned": returned[0]}

    def peek(self, count: int) -> int:
        channel = self.channel()
        channel.basic_qos(prefetch_count=0)
        received = [0]

        def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
            received[0] += 1

        channel.basic_consume(SRC, on_message, auto_ack=False)
        while received[0] < count:
            self.connection.process_data_events(time_limit=None)  # blocking-channel events
        channel.close()
        return received[0]

    def loop(self, count: int) -> int:
        channel = self.channel()
        channel.confirm_delivery()  # basic_publish waits for the confirm; raises if returned
        moved = 0
        while moved < count:
            method, properties, body = channel.basic_get(SRC, auto_ack=False)
            if method is None:
                break
            channel.basic_publish("", DST, body, properties, mandatory=True)
            moved += 1
            channel.basic_ack(method.delivery_tag)
        channel.close()
        return moved

    def return_order(self) -> list[str]:
        order: list[str] = []
        confirms = Confirms()
        channel, impl = self._confirming_impl(confirms, [0], order)
        impl.basic_publish("", "nowhere", b"x", self.pika.BasicProperties(), mandatory=True)
        confirms.published()
        self._wait(lambda: not confirms.pending)
        channel.close()
        return order


# -- the rounds ---------------------------------------------------------------------------------


def measure(run: Callable[[], Any]) -> tuple[Any, float, float]:
    """``run()``'s result, wall seconds, and this process's CPU seconds (user + system)."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    result = run()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result, wall, cpu


def fresh_queues(admin: PyAmqp) -> None:
    channel = admin.connection.channel()
    for queue in (SRC, DST):
        channel.queue_delete(queue)
        channel.queue_declare(queue, durable=True, auto_delete=False)
    channel.close()


def one_client(
    client: Any, admin: PyAmqp, messages: list[Any], args: argparse.Namespace
) -> dict[str, tuple[float, float]]:
    """One client's three runs: {scenario: (msg/s, CPU µs per message)}."""
    n, m = len(messages), args.loop_messages
    fresh_queues(admin)
    out: dict[str, tuple[float, float]] = {}
    counts, wall, cpu = measure(lambda: client.publish(messages, args.window))
    assert counts == {"acked": n, "nacked": 0, "returned": 0}, counts
    assert admin.depth(SRC) == n
    out["publish"] = (n / wall, cpu / n * 1e6)
    received, wall, cpu = measure(lambda: client.peek(n))
    assert received == n
    assert wait_for_depth(admin, SRC, n), "the peeked messages did not come back"
    out["peek"] = (n / wall, cpu / n * 1e6)
    moved, wall, cpu = measure(lambda: client.loop(m))
    assert moved == m and wait_for_depth(admin, DST, m), moved
    out["loop"] = (m / wall, cpu / m * 1e6)
    return out


def wait_for_depth(admin: PyAmqp, queue: str, depth: int, timeout: float = 60) -> bool:
    """The queue's depth reaches ``depth`` (requeued messages are counted as they come back)."""
    deadline = time.monotonic() + timeout
    while admin.depth(queue) != depth:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def run_rounds(url: str, args: argparse.Namespace) -> dict[str, Any]:
    messages = [celery_message(i) for i in range(args.messages)]
    factories = {"amqp": PyAmqp, "pika": Pika}
    admin = PyAmqp(url)
    clients = tuple(args.clients)
    results: dict[str, dict[str, list[tuple[float, float]]]] = {c: {} for c in clients}
    orders: dict[str, list[str]] = {}
    for round_number in range(args.rounds):
        shift = round_number % len(clients)
        for name in clients[shift:] + clients[:shift]:
            client = factories[name](url)
            try:
                for scenario, figures in one_client(client, admin, messages, args).items():
                    results[name].setdefault(scenario, []).append(figures)
                orders[name] = client.return_order()
            finally:
                client.close()
            print(f"round {round_number + 1} {name}: done", file=sys.stderr)
    admin.close()
    return {"results": results, "return_order": orders}


def report(outcome: dict[str, Any], args: argparse.Namespace) -> None:
    results = outcome["results"]
    print(
        f"{args.messages} messages (~1 KB, persistent, mandatory), loop {args.loop_messages}, "
        f"window {args.window}, {args.rounds} rounds, medians"
    )
    print(f"{'scenario':<10}{'client':<7}{'msg/s':>10}{'CPU µs/msg':>12}")
    for scenario in ("publish", "peek", "loop"):
        medians = {}
        for name in results:
            rates = [rate for rate, _ in results[name][scenario]]
            cpus = [cpu for _, cpu in results[name][scenario]]
            medians[name] = (statistics.median(rates), statistics.median(cpus))
            rate, cpu = medians[name]
            print(f"{scenario:<10}{name:<7}{rate:>10.0f}{cpu:>12.1f}")
        if len(medians) == 2:
            (ra, ca), (rp, cp) = medians["amqp"], medians["pika"]
            print(f"{scenario:<10}{'ratio':<7}{rp / ra:>9.2f}x{cp / ca:>11.2f}x  (pika / amqp)")
    for name, order in outcome["return_order"].items():
        print(f"unroutable mandatory publish, {name}: {' then '.join(order)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--loop-messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=int, default=500)
    parser.add_argument("--amqp-url", help="a vhost of a running node (default: start one)")
    parser.add_argument("--json", action="store_true", help="the raw figures as JSON")
    parser.add_argument(
        "--clients",
        type=lambda text: [c for c in text.split(",") if c],
        default=list(CLIENTS),
        help="comma-separated, of amqp,pika (default both)",
    )
    args = parser.parse_args(argv)
    if args.amqp_url:
        outcome = run_rounds(args.amqp_url, args)
    else:
        from redrive.sandbox.rabbitmq_node import RabbitMQNode

        with (
            tempfile.TemporaryDirectory(prefix="bench-rabbitmq-") as base,
            RabbitMQNode(Path(base)).start() as node,
        ):
            print(f"node {node.node_name} at {node.amqp_url}", file=sys.stderr)
            outcome = run_rounds(node.amqp_url, args)
    if args.json:
        print(json.dumps(outcome))
    else:
        report(outcome, args)


if __name__ == "__main__":
    socket.setdefaulttimeout(120)
    # A SIGTERM unwinds like Ctrl-C, so that the private node is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    main()
