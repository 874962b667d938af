"""A real network partition between a host and its PostgreSQL ledger (issue 40, item 3, the
ledger's link): the server runs on a host of its own, a network namespace joined to this
one by a veth link, and the test cuts that link in the middle of a host's claims.

What must hold: the cut host is told within seconds, in one line, never hangs; every key
keeps exactly one owner (what the cut host won before the cut stays its own, a second host
wins only the rest, never a key the first holds); what the cut host cannot know is at most
its one batch in flight (in doubt: in the ledger as its claim, or not there at all); and the
second host is not held up for long by the locks of the cut host's open transaction (the
server ends it).

Needs root and ``ip netns`` (skipped with the reason elsewhere; under CI=true it must run).
Addresses: a /30 of the link-local 169.254.0.0/16 on the veth link only.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import postgres_server
import pytest
from conftest import make_family, start_moto_server
from test_e2e import (
    CAPTURE,
    REFUND,
    arrivals,
    by_body,
    celery,
    fill,
    finished,
    redrive,
    start_redrive,
    wait_for,
)
from test_ledger_contract import claims

from redrive.errors import LedgerError
from redrive.ledger import KeyState, init_postgres
from redrive.ledger.postgres import PostgresLedger

pytestmark = pytest.mark.e2e

# The cut host learns of the cut within ~3 s (libpq's parameters, in the URL as a team
# would tune them), and the server ends the lost host's open transaction after 3 s.
FAST_DETECTION = "keepalives_idle=1&keepalives_interval=1&keepalives_count=2"
FAST_DETECTION += "&tcp_user_timeout=3000&connect_timeout=3"
MOVE = ("move", "checkout", "--execute", "--yes", "--workers", "4")
GUARD_METRIC = "4242"


@dataclass
class LedgerHost:
    namespace: str
    link: str  # this side's end of the veth link
    url: str

    def cut(self) -> None:
        _ip("link", "set", self.link, "down")
        # Where the ledger's packets go now: dropped here (the lookup meets the blackhole:
        # "Invalid argument"), never out of this machine.
        route = subprocess.run(
            ["ip", "route", "get", self.url.split("@")[1].split(":")[0]],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert route.returncode != 0 and "Invalid argument" in route.stderr, route

    def restore(self) -> None:
        _ip("link", "set", self.link, "up")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _cannot(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def ledger_host() -> Iterator[LedgerHost]:
    bin_path = postgres_server.bin_dir()
    if bin_path is None:
        _cannot("no PostgreSQL (/usr/lib/postgresql/*/bin/initdb): apt-get install postgresql")
    if os.geteuid() != 0:
        _cannot("network namespaces need root")
    assert bin_path is not None
    pid = os.getpid()
    tag = f"{pid:x}"[-6:]
    namespace, here, there = f"rdpg-{tag}", f"rdA{tag}", f"rdB{tag}"
    # A /30 of its own per test process: 169.254.N.M, .1 here, .2 the ledger host.
    net = f"169.254.{(pid >> 6) % 250 + 1}.{(pid % 64) * 4}"
    prefix = net.rsplit(".", 1)[0]
    last = int(net.rsplit(".", 1)[1])
    mine, theirs = f"{prefix}.{last + 1}", f"{prefix}.{last + 2}"
    try:
        _ip("netns", "add", namespace)
    except (OSError, subprocess.CalledProcessError) as exc:
        _cannot(f"cannot make a network namespace here ({exc})")
    server = None
    guarded = False
    try:
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", namespace)
        # Never anywhere but the link: a cut takes the link's own route away, and the
        # default route would then carry the ledger's packets off this machine. This one,
        # behind the link's, drops them here instead (a connect fails at once).
        _ip("route", "replace", "blackhole", f"{net}/30", "metric", GUARD_METRIC)
        guarded = True
        _ip("addr", "add", f"{mine}/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("netns", "exec", namespace, "ip", "addr", "add", f"{theirs}/30", "dev", there)
        _ip("netns", "exec", namespace, "ip", "link", "set", there, "up")
        _ip("netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        server = postgres_server.start(
            bin_path,
            listen=theirs,
            netns=namespace,
            settings=("idle_in_transaction_session_timeout=3s",),
            trusted=f"{net}/30",
        )
        url = f"postgresql://postgres@{theirs}:{server.port}/postgres?{FAST_DETECTION}"
        yield LedgerHost(namespace, here, url)
    finally:
        if server is not None:
            postgres_server.stop(server)
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=30)
        if guarded:
            drop = ["ip", "route", "del", "blackhole", f"{net}/30", "metric", GUARD_METRIC]
            subprocess.run(drop, capture_output=True, timeout=30)


def test_a_host_cut_off_mid_claims_is_told_and_every_key_keeps_one_owner(
    ledger_host: LedgerHost,
) -> None:
    init_postgres(ledger_host.url)
    keys = [f"k{i:04}" for i in range(3000)]
    won_by_a: list[str] = []
    failure: list[tuple[float, BaseException]] = []
    enough = threading.Event()

    def host_a() -> None:
        led = PostgresLedger(ledger_host.url)
        try:
            led.start_run("A", command="move", info={})
            for i in range(0, len(keys), 10):
                won_by_a.extend(led.claim_many("A", claims(*keys[i : i + 10])).won)
                if len(won_by_a) >= 200:
                    enough.set()
        except BaseException as exc:
            failure.append((time.monotonic(), exc))
        finally:
            enough.set()
            led.close()

    a = threading.Thread(target=host_a)
    a.start()
    assert enough.wait(120), "host A claimed nothing"
    ledger_host.cut()
    cut_at = time.monotonic()
    try:
        a.join(60)
        assert not a.is_alive(), "host A still waits for its ledger 60 s after the cut"
    finally:
        ledger_host.restore()
    assert failure, "host A claimed every key although its ledger was cut off"
    told_at, error = failure[0]
    assert isinstance(error, LedgerError), repr(error)
    assert "\n" not in str(error)
    assert told_at - cut_at < 20, f"told {told_at - cut_at:.1f} s after the cut"
    print(f"told {told_at - cut_at:.1f} s after the cut, {len(won_by_a)} keys won: {error}")

    with PostgresLedger(ledger_host.url) as b:
        b.start_run("B", command="move", info={})
        started = time.monotonic()
        won_by_b = [
            k
            for i in range(0, len(keys), 50)
            for k in b.claim_many("B", claims(*keys[i : i + 50])).won
        ]
        waited = time.monotonic() - started
        owners = {k: e.run_id for k, e in b.get_many(keys).items()}
        assert all(e.state is KeyState.CLAIMED for e in b.get_many(keys).values())
    assert waited < 30, f"host B waited {waited:.0f} s for host A's lost transaction"
    assert sorted(owners) == keys, "every key has an owner"
    assert set(won_by_a).isdisjoint(won_by_b), "no key was won by both hosts"
    assert {k for k, o in owners.items() if o == "A"} >= set(won_by_a)
    assert {k for k, o in owners.items() if o == "B"} == set(won_by_b)
    in_doubt = {k for k, o in owners.items() if o == "A"} - set(won_by_a)
    assert len(in_doubt) <= 10, "at most the one batch in flight at the cut"


def test_a_move_whose_ledger_is_cut_off_mid_run_then_the_runbooks_reruns_send_each_task_once(
    ledger_host: LedgerHost, tmp_path: Path
) -> None:
    """``redrive move --execute --workers 4`` on moto's server (here), its ledger on the
    ledger host (there); the link is cut mid-run, then restored. The run stops with one
    line; a rerun moves the rest and holds what is in doubt (at most one send batch per
    worker); each in-doubt message is resolved by evidence (did its task arrive?), as the
    runbook says; then each task is in its queue exactly once and nothing is in doubt."""
    init_postgres(ledger_host.url)
    server = start_moto_server(tmp_path / "moto.log", serial=True)
    try:
        checkout = make_family(server.client(), "onion-checkout")
        rng = random.Random(403)
        dead = [celery(rng.choice((CAPTURE, REFUND)), 2) for _ in range(200)]
        fill(checkout, dead)
        move = (*MOVE, "--lease", "3", "--ledger", ledger_host.url)
        first = start_redrive(server, *move, "--rate", "40", out=tmp_path / "first")
        try:
            wait_for(lambda: checkout.depth(checkout.queue_url)[0] >= 40, timeout=120)
            ledger_host.cut()
            code, out, err = finished(first, tmp_path / "first", timeout=60)
        finally:
            ledger_host.restore()
            if first.poll() is None:
                first.kill()
                first.wait(10)
        assert code == 1, (code, out, err)
        assert "Traceback" not in err
        assert err.count("\n") <= 3, err
        time.sleep(3.5)  # the stopped run's lease (3 s) runs out: its claims are in doubt
        rerun = redrive(server, *move, "--json", timeout=120)
        assert rerun.returncode in (0, 3), (rerun.returncode, rerun.stdout, rerun.stderr)
        listed = redrive(server, "ledger", "in-doubt", "--json", "--ledger", ledger_host.url)
        doubts = [json.loads(line) for line in listed.stdout.splitlines()]
        assert len(doubts) <= 4 * 10, "at most one send batch per worker"
        # The evidence: what arrived so far (drained, and counted at the end).
        got = arrivals(checkout, by_body(dead))
        sent = [d["message_id"] for d in doubts if d["task_id"] in got]
        not_sent = [d["message_id"] for d in doubts if d["task_id"] not in got]
        for how, ids in (("skip", sent), ("resend", not_sent)):
            if ids:
                picks = [arg for i in ids for arg in ("--message-id", i)]
                resolved = redrive(server, *move, "--in-doubt", how, *picks, timeout=120)
                assert resolved.returncode == 0, (resolved.stdout, resolved.stderr)
        got += arrivals(checkout, by_body(dead))
        assert got == Counter({d.ident: 1 for d in dead}), "every task exactly once"
        # A last run sends nothing again; the copies resolved as sent (skipped) stay in the
        # DLQ for a purge with its archive, as the runbook says.
        last = redrive(server, *move, "--json", timeout=120)
        assert last.returncode == 0, (last.stdout, last.stderr)
        assert json.loads(last.stdout)["moved"] == 0
        assert checkout.depth() == (len(sent), 0)
        final = redrive(server, "ledger", "in-doubt", "--ledger", ledger_host.url)
        assert final.returncode == 0, final.stdout
    finally:
        server.process.terminate()
        server.process.wait(10)
