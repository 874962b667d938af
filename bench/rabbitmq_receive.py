"""How should the RabbitMQ backend receive a scan's copies: a consumer window per receive
(prefetch = the batch, cancelled when full: what redrive does) or ``basic.get`` per message?

    python -m bench.rabbitmq_receive [--messages 5000] [--rounds 3] [--amqp-url URL --api-url URL]

Per round, each way in rotating order, on a queue filled afresh: receive every message held
(none acked, as a scan holds them), then release them all; checked: all received, the queue
holds them all again. Without ``--amqp-url`` a private node is started and stopped.
Prints msg/s per way (medians) and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from redrive.aws.session import AwsSettings
from redrive.broker import open_broker
from redrive.broker.base import SendEntry
from redrive.broker.rabbitmq.broker import RabbitBroker
from redrive.broker.rabbitmq.envelope import envelope_of
from redrive.sandbox.rabbitmq_layout import open_connection, raw_channel


def fill(broker: RabbitBroker, queue: str, count: int) -> None:
    body = envelope_of(b'{"n": 1}' * 100, {"content_type": "application/json"})
    for start in range(0, count, 100):
        entries = [SendEntry(str(i), body, {}) for i in range(min(100, count - start))]
        assert len(broker.send(queue, entries).ok) == len(entries)


def by_window(broker: RabbitBroker, queue: str) -> list[str]:
    tags: list[str] = []
    while batch := broker.receive(queue, hold=60, max_messages=100):
        tags += [d.tag for d in batch]
    return tags


def by_get(broker: RabbitBroker, queue: str) -> list[str]:
    tags: list[str] = []
    lane = broker.lane
    with lane.lock:
        channel = lane.work()
        while (message := channel.basic_get(queue, no_ack=False)) is not None:
            tags.append(lane._got(message, queue).tag)
    return tags


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--amqp-url")
    parser.add_argument("--api-url")
    args = parser.parse_args()
    node = None
    if args.amqp_url is None:
        from redrive.sandbox.rabbitmq_node import start_node

        node = start_node(Path(tempfile.mkdtemp(prefix="bench-rmq-")))
        args.amqp_url, args.api_url = node.amqp_url, node.api_url
    try:
        broker = open_broker(args.amqp_url, aws=AwsSettings(), rabbitmq_api=args.api_url)
        assert isinstance(broker, RabbitBroker)
        connection = open_connection(args.amqp_url)
        raw_channel(connection).queue_declare("bench-receive", durable=True, auto_delete=False)
        connection.close()
        broker.purge("bench-receive")
        fill(broker, "bench-receive", args.messages)
        ways = {"window": by_window, "get": by_get}
        rates: dict[str, list[float]] = {name: [] for name in ways}
        names = list(ways)
        for round_ in range(args.rounds):
            for name in names[round_ % 2 :] + names[: round_ % 2]:
                started = time.perf_counter()
                tags = ways[name](broker, "bench-receive")
                took = time.perf_counter() - started
                assert len(tags) == args.messages, (name, len(tags))
                broker.release("bench-receive", {str(i): t for i, t in enumerate(tags)})
                deadline = time.monotonic() + 60  # rejects have no reply: wait for the count
                while broker.counts("bench-receive").ready < args.messages:
                    assert time.monotonic() < deadline, "released messages did not come back"
                    time.sleep(0.01)
                rates[name].append(args.messages / took)
        for name, values in rates.items():
            print(f"{name:7} {statistics.median(values):9,.0f} msg/s  ({len(values)} rounds)")
        ratio = statistics.median(rates["window"]) / statistics.median(rates["get"])
        print(f"window/get: {ratio:.1f}x")
    finally:
        if node is not None:
            node.stop()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
