"""Three hosts draining one DLQ, with real partitions, on both brokers and both shared
ledgers (issue 40, item 3).

Every host is a network namespace the test makes. The service host (``rd-svc-PID``) runs the
broker (moto's SQS server, or a private RabbitMQ node) and the ledger (a private PostgreSQL
server, or moto's DynamoDB); each client host (``rd-h0-PID`` ...) is joined to it by two veth
pairs made with both ends inside those namespaces, one for the broker (``brk0``) and one for
the ledger (``led0``), so that either can be cut alone. Servers on the service host's
loopback are reached through a relay there (tests/partition_host.py), bound to the service
host's end of each link; PostgreSQL listens on those ends itself. No namespace has a default
route; every address is a private one the test assigns (10.231.0.0/16 and 10.232.0.0/16),
and nothing is looked up by name. The machine's own namespace is never changed. The hosts
share the machine's kernel (its hostname and process ids): a run sees that another host's
dead run is gone at once, where separate machines wait for its heartbeat to go stale.

Each host runs the runbook's ``redrive move checkout --execute --yes --workers 4`` (docs/
ledgers.md, "Runbook: draining one DLQ from several hosts"), paced by ``--rate``, with a
short ``--lease``. Faults, each at an event, never after a sleep: host 2 is SIGKILLed at its
third send (a kill point); then hosts 0 and 1 drain the DLQ with host 2's claims in it, and
once each has sent 10, host 0's broker link and host 1's ledger link are cut, each restored
once its cut is seen (the service side dropped the host's connection, as the relay says,
or the host's run ended).
After the runbook's reruns: each task in its queue exactly once (read through the broker),
each in-doubt message resolved by evidence (did its task arrive? ``redrive ledger resolve
--skip`` it, else ``--resend`` it), at most one send batch per worker of each faulted host
in doubt, and no task ever in its queue twice (a host that sent a key another host held
would put it there twice: no copy is resent except by ``--resend``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import boto3
import postgres_server
import pytest
from conftest import make_family, missing_component
from kill_points import At, KillPoints
from test_docs import commands
from test_e2e import CAPTURE, REDRIVE, REFUND, ROOT, arrivals, by_body, celery, fill, wait_for
from test_ledger_partition import FAST_DETECTION, _drop, _ip, _root_routes, _stop, inside
from test_rabbitmq_e2e import drain, task_ids

from redrive.ledger import KeyState, open_ledger
from redrive.ledger.base import Ledger
from redrive.sandbox.rabbitmq_layout import fill_layout, rabbit_families
from redrive.sandbox.rabbitmq_node import RabbitMQNode, Vhost, server_installed

pytestmark = pytest.mark.e2e

Popen = subprocess.Popen[str]

HOSTS = 3
WORKERS = 4
FIRST = 10  # a host's sends before its fault
LEASE = "3"
BROKER_NET, LEDGER_NET = "10.231", "10.232"  # private, only inside the test's namespaces
SQS_PORT, DYNAMODB_PORT, AMQP_PORT, API_PORT = 5000, 5001, 5672, 15672
TABLE = "redrive-partition"
HOST_SCRIPT = Path(__file__).resolve().parent / "partition_host.py"
RUNBOOK = ROOT / "docs" / "ledgers.md"
RUNBOOK_HEADING = "## Runbook: draining one DLQ from several hosts"
NAME = re.compile(r"^rd-(svc|h\d)-(\d+)$")
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never the instance metadata address
}


def runbook_steps() -> list[str]:
    """The console commands of docs/ledgers.md's runbook for several hosts, in order."""
    start = RUNBOOK.read_text().splitlines().index(RUNBOOK_HEADING) + 1
    return [c.text for c in commands(RUNBOOK) if c.line > start]


# -- the hosts ---------------------------------------------------------------------------


@dataclass
class Client:
    """A client host: its namespace, and the service host's end of each of its links."""

    namespace: str
    broker_at: str
    ledger_at: str
    own: dict[str, str]  # its own end of each link (what a relay sees), by link name
    root_routes: str

    def cmd(self, *argv: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *argv]

    def sealed(self) -> None:
        """Nothing it sends can leave (no default route); the machine's routes unchanged."""
        for family in ("-4", "-6"):
            assert _ip("-n", self.namespace, family, "route", "show", "default") == ""
        assert _root_routes() == self.root_routes, "the machine's routes changed"

    def cut(self, link: str) -> None:
        _ip("-n", self.namespace, "link", "set", link, "down")

    def restore(self, link: str) -> None:
        _ip("-n", self.namespace, "link", "set", link, "up")


@dataclass
class Topology:
    service: str
    clients: list[Client]
    root_routes: str
    made: list[str] = field(default_factory=list)


def _drop_leftovers() -> None:
    """This test's namespaces of an earlier run killed before its cleanup."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    for line in listed.stdout.splitlines():
        found = NAME.match(line.split(" ")[0])
        if found and not Path(f"/proc/{found.group(2)}").exists():
            _drop(found.group(0))


def _pair(client: str, service: str, dev: str, peer: str, net: str) -> tuple[str, str]:
    """A veth pair made with each end already in its namespace; (client, service) address
    of its /30."""
    mine, theirs = f"{net}.1", f"{net}.2"  # net: the /30's first three octets
    _ip("-n", client, "link", "add", dev, "type", "veth", "peer", "name", peer,
        "netns", service)  # fmt: skip
    _ip("-n", client, "addr", "add", f"{mine}/30", "dev", dev)
    _ip("-n", service, "addr", "add", f"{theirs}/30", "dev", peer)
    for namespace, link in ((client, dev), (service, peer)):
        _ip("-n", namespace, "link", "set", link, "up")
    return mine, theirs


def _build(topology: Topology, count: int) -> None:
    pid = os.getpid()
    for namespace in (topology.service, *(f"rd-h{i}-{pid}" for i in range(count))):
        try:
            _ip("netns", "add", namespace)
        except (OSError, subprocess.CalledProcessError) as exc:
            missing_component(f"cannot make a network namespace here ({exc})")
        topology.made.append(namespace)
        _ip("-n", namespace, "link", "set", "lo", "up")
    for i, namespace in enumerate(topology.made[1:]):
        service = topology.service
        own_broker, broker_at = _pair(namespace, service, "brk0", f"b{i}", f"{BROKER_NET}.{i}")
        own_ledger, ledger_at = _pair(namespace, service, "led0", f"l{i}", f"{LEDGER_NET}.{i}")
        own = {"brk0": own_broker, "led0": own_ledger}
        topology.clients.append(Client(namespace, broker_at, ledger_at, own, topology.root_routes))


@pytest.fixture
def topology() -> Iterator[Topology]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        missing_component("network namespaces need root and ip (iproute2)")
    _drop_leftovers()
    found = Topology(f"rd-svc-{os.getpid()}", [], _root_routes())
    try:
        _build(found, HOSTS)
        for client in found.clients:
            client.sealed()
        yield found
        for client in found.clients:
            client.sealed()
    finally:
        for namespace in found.made:
            _drop(namespace)  # kills what still runs there (servers, relays) by PID
        assert _root_routes() == found.root_routes, "the machine's routes changed"


def _background(argv: list[str], log: Path) -> Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True
        )


def _relay(topology: Topology, port: int, to: int, ats: list[str], log: Path) -> Relay:
    """On the service host: its loopback's ``to`` reachable at each of ``ats`` (its ends
    of the links), port ``port``."""
    argv = [sys.executable, str(HOST_SCRIPT), "relay", str(port), f"127.0.0.1:{to}", *ats]
    process = _background(["ip", "netns", "exec", topology.service, *argv], log)
    wait_for(
        lambda: process.poll() is not None or "listening" in log.read_text(),
        timeout=120,
        what="the relay",
    )
    assert process.poll() is None, log.read_text()
    return Relay(process, log)


@dataclass
class Relay:
    process: Popen
    log: Path

    def dropped(self, address: str) -> bool:
        return f'"dropped": "{address}"' in self.log.read_text()


def _moto(topology: Topology, port: int, log: Path) -> Popen:
    """moto's server (serial) on the service host's loopback."""
    argv = [sys.executable, "-m", "redrive.sandbox", "--bare", "--serial", "--port", str(port)]
    process = _background(["ip", "netns", "exec", topology.service, *argv], log)
    wait_for(
        lambda: process.poll() is not None or "SQS on" in log.read_text(),
        timeout=120,
        what="moto's server",
    )
    assert process.poll() is None, log.read_text()
    return process


# -- the brokers -------------------------------------------------------------------------


class Broker(Protocol):
    # Sized so that every host has work when its fault comes, paced so that every fault
    # lands mid-run: on RabbitMQ each worker holds up to a send batch (100) a receive, so
    # one host's 4 workers take 400 at once (hosts 0 and 1 share what is left of 450).
    messages: int
    rate: int  # a host's messages a second
    batch: int  # the broker's send batch (--rate's one-second slice when smaller)
    expected: Counter[str]
    relay: Relay
    processes: list[Popen]

    def env(self, client: Client) -> dict[str, str]: ...

    def arrived(self) -> Counter[str]:
        """Every copy that arrived in the source queue so far, by task id."""
        ...

    def left(self) -> int:
        """What is still in the DLQ."""
        ...


class Sqs:
    messages, rate, batch = 120, 10, 10

    def __init__(self, topology: Topology, tmp_path: Path) -> None:
        self.service = topology.service
        self.server = _moto(topology, SQS_PORT, tmp_path / "sqs.log")
        ats = [c.broker_at for c in topology.clients]
        self.relay = _relay(topology, SQS_PORT, SQS_PORT, ats, tmp_path / "sqs-relay.log")
        self.processes = [self.server, self.relay.process]
        with inside(self.service):
            client = boto3.client(
                "sqs", endpoint_url=f"http://127.0.0.1:{SQS_PORT}", region_name="us-east-1"
            )
            self.family = make_family(client, "onion-checkout")
            rng = random.Random(405)
            self.dead = [celery(rng.choice((CAPTURE, REFUND)), 2) for _ in range(self.messages)]
            fill(self.family, self.dead)
        self.expected = Counter({d.ident: 1 for d in self.dead})
        self.seen: Counter[str] = Counter()

    def env(self, client: Client) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": f"http://{client.broker_at}:{SQS_PORT}"}

    def arrived(self) -> Counter[str]:
        with inside(self.service):
            self.seen += arrivals(self.family, by_body(self.dead))  # drained as it counts
        return Counter(self.seen)

    def left(self) -> int:
        with inside(self.service):
            return sum(self.family.depth())


class Rabbit:
    messages, rate, batch = 450, 10, 100

    def __init__(self, topology: Topology, tmp_path: Path) -> None:
        self.service = topology.service
        with inside(self.service):  # the node and its epmd start in the service host
            self.node = RabbitMQNode(tmp_path / "rabbit").start()
        self.vhost = Vhost("/", self.node.amqp_url, self.node.api_url)
        ats = [c.broker_at for c in topology.clients]
        log = tmp_path / "amqp-relay.log"
        self.relay = _relay(topology, AMQP_PORT, self.node.ports.amqp, ats, log)
        api = _relay(topology, API_PORT, self.node.ports.management, ats, tmp_path / "api.log")
        self.processes = [self.relay.process, api.process]
        with inside(self.service):
            fill_layout(self.node.amqp_url, rabbit_families()[:1], self.messages)
            self.expected = task_ids(drain(self.vhost, "onion-checkout-dlq"))
        assert sum(self.expected.values()) == self.messages

    def env(self, client: Client) -> dict[str, str]:
        return {
            "REDRIVE_BROKER": f"amqp://guest:guest@{client.broker_at}:{AMQP_PORT}//",
            "REDRIVE_RABBITMQ_API": f"http://{client.broker_at}:{API_PORT}",
        }

    def arrived(self) -> Counter[str]:
        with inside(self.service):
            return task_ids(drain(self.vhost, "onion-checkout"))

    def left(self) -> int:
        with inside(self.service):
            return len(drain(self.vhost, "onion-checkout-dlq"))

    def stop(self) -> None:
        for process in self.processes:
            _stop(process)
        with inside(self.service):
            self.node.stop()


# -- the ledgers -------------------------------------------------------------------------


class Shared(Protocol):
    @property
    def relay(self) -> Relay | None:
        """The relay in front of the server (None: the server listens on the links)."""
        ...

    def env(self, client: Client) -> dict[str, str]: ...

    def open(self) -> Ledger:
        """The ledger, as the test reads it from the service host (inside it only)."""
        ...

    def stop(self) -> None: ...


class Postgres:
    relay: Relay | None = None  # it listens on the links itself

    def __init__(self, topology: Topology, tmp_path: Path) -> None:
        bin_path = postgres_server.bin_dir()
        if bin_path is None:
            missing_component("no PostgreSQL (/usr/lib/postgresql/*/bin/initdb)")
        assert bin_path is not None
        ats = ",".join(c.ledger_at for c in topology.clients)
        self.server = postgres_server.start(
            bin_path,
            listen=f"127.0.0.1,{ats}",
            netns=topology.service,
            settings=("idle_in_transaction_session_timeout=3s",),
            trusted=f"{LEDGER_NET}.0.0/16",
        )

    def env(self, client: Client) -> dict[str, str]:
        url = f"postgresql://postgres@{client.ledger_at}:{self.server.port}/postgres"
        return {"REDRIVE_LEDGER": f"{url}?{FAST_DETECTION}"}

    def open(self) -> Ledger:
        return open_ledger(f"postgresql://postgres@127.0.0.1:{self.server.port}/postgres")

    def stop(self) -> None:
        postgres_server.stop(self.server)


class Dynamo:
    def __init__(self, topology: Topology, tmp_path: Path) -> None:
        self.server = _moto(topology, DYNAMODB_PORT, tmp_path / "dynamodb.log")
        ats = [c.ledger_at for c in topology.clients]
        log = tmp_path / "dynamodb-relay.log"
        self.relay = _relay(topology, DYNAMODB_PORT, DYNAMODB_PORT, ats, log)

    def env(self, client: Client) -> dict[str, str]:
        return {
            "REDRIVE_LEDGER": f"dynamodb://{TABLE}",
            "AWS_ENDPOINT_URL_DYNAMODB": f"http://{client.ledger_at}:{DYNAMODB_PORT}",
        }

    def open(self) -> Ledger:
        def client(service: str) -> Any:
            url = f"http://127.0.0.1:{DYNAMODB_PORT}"
            return boto3.client(service, endpoint_url=url, region_name="us-east-1")  # type: ignore[call-overload]

        return open_ledger(f"dynamodb://{TABLE}", client_factory=client)

    def stop(self) -> None:
        _stop(self.server)
        _stop(self.relay.process)


# -- runs and events ---------------------------------------------------------------------


@dataclass
class World:
    topology: Topology
    broker: Broker
    ledger: Shared
    tmp_path: Path
    reader: Ledger = field(init=False)  # the test's own view of it, from the service host

    def env(self, client: Client) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "REDRIVE_"))}
        env.update(AWS_ENV, PYTHONUNBUFFERED="1", REDRIVE_RECEIVE_WAIT="0")
        env.update(self.broker.env(client))
        env.update(self.ledger.env(client))
        env["REDRIVE_STATE_DIR"] = str(self.tmp_path / client.namespace)
        return env

    def redrive(self, client: Client, command: str) -> subprocess.CompletedProcess[str]:
        """A runbook command (a shell line) on ``client``, inside its namespace."""
        client.sealed()
        return subprocess.run(
            client.cmd("bash", "-c", command),
            env={**self.env(client), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
            cwd=self.tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
            stdin=subprocess.DEVNULL,
        )

    def sent(self, pid: int) -> int:
        """How many keys the run of process ``pid`` has sent (SENT or DONE in the ledger)."""
        with inside(self.topology.service):
            runs = [r for r in self.reader.runs() if r.info.get("pid") == pid]
            return sum(
                e.state in (KeyState.SENT, KeyState.DONE)
                for r in runs
                for e in self.reader.keys_for_run(r.run_id)
            )

    def states(self, runs: list[Popen]) -> list[dict[str, int]]:
        """Each host's keys in the ledger, by state."""
        with inside(self.topology.service):
            by_pid = {r.info.get("pid"): r.run_id for r in self.reader.runs()}
            return [
                dict(Counter(e.state.value for e in self.reader.keys_for_run(by_pid[run.pid])))
                if run.pid in by_pid
                else {}
                for run in runs
            ]

    def leases_over(self) -> bool:
        with inside(self.topology.service):
            now = time.time()
            return not any(r.ended_at is None and r.lease_until > now for r in self.reader.runs())


def _cuts(world: World, runs: list[Popen]) -> dict[str, str]:
    """Once hosts 0 and 1 have each sent their first few, cut host 0's broker link and host
    1's ledger link; restore each once its cut is seen: the service side dropped the host's
    connection (the relay in front of the server says so: keepalives, ~4 s), or the host's
    run ended (PostgreSQL's keepalives and ``tcp_user_timeout`` in its URL: ~3 s). What
    ended each cut, by link."""
    faults = {"brk0": 0, "led0": 1}
    for victim in faults.values():
        run = runs[victim]
        wait_for(
            lambda run=run: run.poll() is not None or world.sent(run.pid) >= FIRST,  # type: ignore[misc]
            timeout=180,
            every=0.2,
            what=f"host {victim}'s first {FIRST} sends",
        )
        assert run.poll() is None, f"host {victim} ended before its fault"
    for link, victim in faults.items():
        world.topology.clients[victim].cut(link)
    ended: dict[str, str] = {}

    def seen() -> bool:
        for link, victim in faults.items():
            client, run = world.topology.clients[victim], runs[victim]
            relay = world.broker.relay if link == "brk0" else world.ledger.relay
            if link in ended:
                continue
            if relay is not None and relay.dropped(client.own[link]):
                ended[link] = "dropped"
            elif run.poll() is not None:
                ended[link] = f"ended {run.returncode}"
            else:
                continue
            client.restore(link)
        return len(ended) == len(faults)

    try:
        wait_for(seen, timeout=180, every=0.2, what="the cuts seen")
    finally:
        for link, victim in faults.items():
            world.topology.clients[victim].restore(link)
    return ended


def _start(world: World, i: int, argv: list[str], points: KillPoints | None) -> Popen:
    client = world.topology.clients[i]
    client.sealed()
    env = points.env(world.env(client)) if points else world.env(client)
    out = world.tmp_path / f"host{i}"
    with out.with_suffix(".out").open("w") as stdout, out.with_suffix(".err").open("w") as err:
        command = points.argv(*argv) if points else [*REDRIVE, *argv]
        return subprocess.Popen(
            client.cmd(*command), env=env, cwd=ROOT, stdout=stdout, stderr=err,
            stdin=subprocess.DEVNULL, text=True,
        )  # fmt: skip


def _first_runs(world: World, move: str) -> tuple[list[Popen], dict[str, str]]:
    """The runbook's move on each host (paced, a short lease). The last host first, through
    the kill points: SIGKILLed at its third send (in doubt: what its workers had in flight;
    on RabbitMQ its held deliveries go back with its connection); then hosts 0 and 1 at
    once, on a DLQ that holds the killed run's claims, until their cuts. What ended each
    cut, by link."""
    argv = [*move.split()[1:], "--rate", str(world.broker.rate), "--lease", LEASE]
    points = KillPoints(world.tmp_path / "kill", At("move.sent", nth=3))
    killed = _start(world, HOSTS - 1, argv, points)
    runs: list[Popen] = []
    try:
        assert killed.wait(180) == -signal.SIGKILL, (world.tmp_path / "host2.err").read_text()
        runs = [_start(world, i, argv, None) for i in range(HOSTS - 1)]
        ended = _cuts(world, [*runs, killed])
        codes = [run.wait(180) for run in runs]
    finally:
        for run in [*runs, killed]:
            _stop(run)
    for i, code in enumerate(codes):
        said = (world.tmp_path / f"host{i}.err").read_text()
        assert code in (0, 1, 3), (i, code, said)
        assert "Traceback" not in said, said
    return [*runs, killed], ended


def _resolve_by_evidence(world: World, client: Client, runs: list[Popen]) -> int:
    """What ``redrive ledger in-doubt`` lists, each resolved by evidence: its task arrived
    (``--skip``: never sent again) or did not (``--resend``). At most one send batch per
    worker of each host is in doubt. How many were skipped."""
    listed = world.redrive(client, "redrive ledger in-doubt --json")
    assert listed.returncode in (0, 3), (listed.stdout, listed.stderr)
    doubts = [json.loads(line) for line in listed.stdout.splitlines()]
    with inside(world.topology.service):
        pids = {r.run_id: r.info.get("pid") for r in world.reader.runs()}
    per_host = Counter(pids[d["run_id"]] for d in doubts)
    for run in runs:
        batch = min(world.broker.batch, world.broker.rate)
        assert per_host[run.pid] <= WORKERS * batch, (run.pid, per_host)
    arrived = world.broker.arrived()
    skip = [d["key"] for d in doubts if d["task_id"] in arrived]
    resend = [d["key"] for d in doubts if d["task_id"] not in arrived]
    print(f"in doubt per host {[per_host[r.pid] for r in runs]}: {len(skip)} had arrived")
    picks = [f"--skip {k}" for k in skip] + [f"--resend {k}" for k in resend]
    if picks:
        done = world.redrive(client, f"redrive ledger resolve --execute {' '.join(picks)}")
        assert done.returncode == 0, (done.stdout, done.stderr)
    return len(skip)


@pytest.mark.parametrize("ledger_kind", ["postgresql", "dynamodb"])
@pytest.mark.parametrize("broker_kind", ["sqs", "rabbitmq"])
def test_three_hosts_drain_one_dlq_through_cuts_and_a_kill_and_each_task_arrives_once(
    topology: Topology, tmp_path: Path, broker_kind: str, ledger_kind: str
) -> None:
    if broker_kind == "rabbitmq" and not server_installed():
        missing_component("no RabbitMQ (/usr/lib/rabbitmq/bin/rabbitmq-server)")
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        ledger: Shared = (Postgres if ledger_kind == "postgresql" else Dynamo)(topology, tmp_path)
        stack.callback(ledger.stop)
        broker: Broker
        if broker_kind == "rabbitmq":
            broker = rabbit = Rabbit(topology, tmp_path)
            stack.callback(rabbit.stop)
        else:
            broker = sqs = Sqs(topology, tmp_path)
            for process in sqs.processes:
                stack.callback(_stop, process)
        world = World(topology, broker, ledger, tmp_path)
        first, other = topology.clients[0], topology.clients[1]
        url = world.env(first)["REDRIVE_LEDGER"]
        init = world.redrive(first, f"redrive ledger init '{url}'")
        assert init.returncode == 0, (init.stdout, init.stderr)
        with inside(topology.service):
            world.reader = stack.enter_context(contextlib.closing(ledger.open()))
        steps = runbook_steps()
        assert steps[0].startswith("redrive move checkout --execute"), steps
        set_up = time.monotonic()
        runs, ended = _first_runs(world, steps[0])
        ran = time.monotonic()
        print(f"after the first runs: {world.states(runs)}")
        assert max(broker.arrived().values(), default=0) <= 1, "a task arrived twice"
        # The cut and the killed runs' leases run out: their claims are in doubt.
        wait_for(world.leases_over, timeout=120, every=0.2, what="the runs' leases")
        waited = time.monotonic()
        skipped = _resolve_by_evidence(world, other, runs)
        for step in steps[1:]:
            done = world.redrive(other, step)
            assert done.returncode in (0, 3), (step, done.stdout, done.stderr)
        last = world.redrive(other, steps[-1])
        assert last.returncode == 0, ("nothing left in doubt", last.stdout)
        assert broker.arrived() == broker.expected, "every task exactly once"
        assert broker.left() == skipped, "only the copies resolved as sent stay in the DLQ"
    print(
        f"cuts ended by {ended}; set up {set_up - started:.1f} s, runs {ran - set_up:.1f} s, "
        f"leases {waited - ran:.1f} s, runbook {time.monotonic() - waited:.1f} s"
    )
