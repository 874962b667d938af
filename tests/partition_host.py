"""One host's side of tests/test_ledger_partition.py's claims: run inside the host's network
namespace (``ip netns exec rd-host-PID python tests/partition_host.py ROLE URL``), so its
connection to the PostgreSQL ledger crosses the link the test cuts.

``a``: claims the keys in batches of 10, one JSON line a batch (``{"won": [...]}``) and, once
200 are won, ``{"enough": true}`` (the test cuts the link then); the link cut, one line
``{"error": "..."}`` and exit 1. After ``enough`` it claims a batch every 20 ms, so the cut
comes long before the last key (what it proves does not depend on the pace).
``b``: claims every key in batches of 50, then one line: what it won, how long that took
(the cut host's open transaction must not hold it up), and each key's owner and state.
``leased URL``: one line, the runs not ended whose lease the ledger still counts as running
(``{"leased": [...]}``): a stopped run's claims can be skipped or taken over only once it is
empty, as the ledger judges by its own clock (the test waits on that, never on a sleep).
``relay PORT TO ADDRESS...``: on the ledger host, passes TCP connections to ADDRESS:PORT on
to TO (host:port, a broker on the ledger host's loopback, which it alone may listen on),
for hosts that share one broker; prints ``{"listening": true}`` once it accepts, and
``{"dropped": ADDRESS}`` when a host's connection went silent (its link cut: keepalives).
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import threading
import time

from redrive.errors import LedgerError
from redrive.ledger import Claim, KeyState
from redrive.ledger.postgres import PostgresLedger

KEYS = [f"k{i:05}" for i in range(10000)]
ENOUGH = 200


def claims(keys: list[str]) -> list[Claim]:
    return [Claim(key=k, task="app.tasks.charge", message_id=f"m-{k}", target="q") for k in keys]


def say(**what: object) -> None:
    print(json.dumps(what), flush=True)


def host_a(url: str) -> int:
    led = PostgresLedger(url)
    won = 0
    try:
        led.start_run("A", command="move", info={})
        for i in range(0, len(KEYS), 10):
            batch = list(led.claim_many("A", claims(KEYS[i : i + 10])).won)
            say(won=batch)
            won += len(batch)
            if won >= ENOUGH:
                if won - len(batch) < ENOUGH:
                    say(enough=True)
                time.sleep(0.02)
    except LedgerError as exc:
        say(error=str(exc))
        return 1
    finally:
        led.close()
    return 0


def host_b(url: str) -> int:
    with PostgresLedger(url) as led:
        led.start_run("B", command="move", info={})
        started = time.monotonic()
        won = [
            k
            for i in range(0, len(KEYS), 50)
            for k in led.claim_many("B", claims(KEYS[i : i + 50])).won
        ]
        waited = time.monotonic() - started
        entries = led.get_many(KEYS)
    say(
        won=won,
        waited=waited,
        owners={k: e.run_id for k, e in entries.items()},
        all_claimed=all(e.state is KeyState.CLAIMED for e in entries.values()),
    )
    return 0


def leased(url: str) -> int:
    # Heartbeats within 0 s count for nothing: what is left is whose lease still runs, the
    # test the ledger makes before it lets a run skip or take over another run's claim.
    with PostgresLedger(url) as led:
        say(leased=[run.run_id for run in led.live_runs(stale_after=0.0)])
    return 0


def _pump(src: socket.socket, dst: socket.socket, *, last: bool) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError as exc:
        if not last:  # the host's side went silent: its link is down (keepalive, timeout)
            with contextlib.suppress(OSError):
                say(dropped=src.getpeername()[0], error=str(exc))
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)
    if last:  # the broker's side is done: the exchange is over
        src.close()
        dst.close()


def _keepalive(client: socket.socket) -> None:
    """A host that went silent (its link cut) is dropped within ~4 s, as a broker with
    heartbeats drops it, so its connection to the server behind ends (a RabbitMQ consumer's
    deliveries go back to their queue) instead of waiting for a host that cannot answer."""
    client.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        (socket.TCP_KEEPIDLE, 1),
        (socket.TCP_KEEPINTVL, 1),
        (socket.TCP_KEEPCNT, 3),
        (socket.TCP_USER_TIMEOUT, 3000),
    ):
        client.setsockopt(socket.IPPROTO_TCP, option, value)


def _accept(listener: socket.socket, to: tuple[str, int]) -> None:
    while True:
        client, _ = listener.accept()
        _keepalive(client)
        upstream = socket.create_connection(to)
        for src, dst, last in ((client, upstream, False), (upstream, client, True)):
            threading.Thread(target=_pump, args=(src, dst), kwargs={"last": last}).start()


def relay(port: int, to: str, addresses: list[str]) -> int:
    host, _, to_port = to.rpartition(":")
    listeners = [socket.create_server((address, port)) for address in addresses]
    threads = [
        threading.Thread(target=_accept, args=(listener, (host, int(to_port))))
        for listener in listeners
    ]
    for thread in threads:
        thread.start()
    say(listening=True)
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    role = sys.argv[1]
    if role == "relay":
        sys.exit(relay(int(sys.argv[2]), sys.argv[3], sys.argv[4:]))
    url = sys.argv[2]
    sys.exit({"a": host_a, "b": host_b, "leased": leased}[role](url))
