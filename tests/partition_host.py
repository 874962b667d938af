"""One host's side of tests/test_ledger_partition.py's claims: run inside the host's network
namespace (``ip netns exec rd-host-PID python tests/partition_host.py ROLE URL``), so its
connection to the PostgreSQL ledger crosses the link the test cuts.

``a``: claims the keys in batches of 10, one JSON line a batch (``{"won": [...]}``) and, once
200 are won, ``{"enough": true}`` (the test cuts the link then); the link cut, one line
``{"error": "..."}`` and exit 1. After ``enough`` it claims a batch every 20 ms, so the cut
comes long before the last key (what it proves does not depend on the pace).
``b``: claims every key in batches of 50, then one line: what it won, how long that took
(the cut host's open transaction must not hold it up), and each key's owner and state.
"""

from __future__ import annotations

import json
import sys
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


if __name__ == "__main__":
    role, url = sys.argv[1:3]
    sys.exit(host_a(url) if role == "a" else host_b(url))
