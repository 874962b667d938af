"""One RabbitMQ node for a whole xdist run (tests/conftest.py's ``rabbitmq_node``).

A node costs ~10 s of CPU to start and a little to keep; one per xdist worker was four per
``make suite`` on two cores. Tests never see each other on it (each takes a vhost of its
own), so the workers share one: the first worker to ask starts it under the run's shared
folder while the others wait on a file lock, and writes where it is (``node.json``); every
worker then attaches to it. No worker stops it (another may still be using it): the
controller does, by process group, once every worker is done (:func:`stop_shared`).

Node-wide settings are off limits on the shared node: a test that changes one (the
consumer_timeout test) starts a node of its own.

The RabbitMQ 4.0 node (Debian 13's, run in the root ``.ci/rabbitmq4_root.sh`` builds:
:class:`~redrive.sandbox.rabbitmq_node.ChrootRabbitMQNode`) is shared the same way, under a
folder of its own; its data lives inside that root, and the controller also unmounts the
root's ``/proc`` and removes the node's folder once it has stopped it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from redrive.errors import RabbitMQNodeError
from redrive.sandbox.rabbitmq_node import (
    RABBITMQ_SERVER,
    STOP_TIMEOUT,
    ChrootRabbitMQNode,
    NodePorts,
    RabbitMQNode,
    unmount,
)

#: Where ``make rabbitmq4`` (.ci/rabbitmq4_root.sh) keeps the Debian 13 root with RabbitMQ
#: 4.0.5: outside the clone, built once and reused; REDRIVE_RABBITMQ4_ROOT moves it.
RABBITMQ4_ROOT = Path(
    os.environ.get("REDRIVE_RABBITMQ4_ROOT", "/var/cache/redrive-test/trixie-rabbitmq")
)

INFO = "node.json"
FAILED = "failed.txt"

#: The node this process started, kept so that its Popen outlives the fixture (the
#: controller stops the node; a collected Popen of a live process would warn).
_STARTED: list[RabbitMQNode] = []


class SharedNode(RabbitMQNode):
    """A node another process may have started: its addresses, vhosts and environment, and
    no life of its own (``start`` and ``stop`` are not this process's to call)."""

    def __init__(self, base: Path, ports: NodePorts, node_name: str, groups: list[int]) -> None:
        self.base = base
        self.server = RABBITMQ_SERVER
        self.ports = ports
        self.node_name = node_name
        self.process = None
        self.epmd = None
        self.groups = groups
        """The process groups of the node and of its epmd (each led by its first PID)."""

    def start(self, *, timeout: float = 0.0) -> RabbitMQNode:
        raise RabbitMQNodeError("a shared node is started by attach(), once per run")

    def stop(self, *, timeout: float = 0.0) -> None:
        """Nothing: the controller stops the shared node at the run's end."""

    def alive(self) -> bool:
        return all(group_members(group, running=True) for group in self.groups)


def host_node(shared: Path) -> RabbitMQNode:
    """The machine's own rabbitmq-server (Debian 12's 3.10.8 here), under ``shared``."""
    return RabbitMQNode(shared / "node")


def rabbitmq4_missing(root: Path = RABBITMQ4_ROOT) -> str | None:
    """Why the RabbitMQ 4.0 node cannot run here (None: it can)."""
    if (root / ".redrive-root").is_file():
        return None if os.geteuid() == 0 else f"the RabbitMQ 4.0 node in {root} needs root"
    failed = root.with_name(root.name + ".failed")
    why = failed.read_text().strip() if failed.is_file() else "not built"
    return f"no RabbitMQ 4.0 root at {root} ({why}): `make rabbitmq4` builds it, as root"


def require_rabbitmq4() -> None:
    """Skip the test where the 4.0 node cannot run, saying why; fail it under ``CI=true``
    (CI must test 4.0)."""
    missing = rabbitmq4_missing()
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true: {missing}")
        pytest.skip(missing)


def trixie_node(shared: Path) -> RabbitMQNode:
    """Debian 13's rabbitmq-server 4.0.5, in the root ``make rabbitmq4`` built."""
    return ChrootRabbitMQNode(RABBITMQ4_ROOT)


def attach(shared: Path, new_node: Callable[[Path], RabbitMQNode] = host_node) -> SharedNode:
    """The run's node under ``shared``, started by whichever worker asks first (as
    ``new_node(shared)`` makes it)."""
    shared.mkdir(parents=True, exist_ok=True)
    with (shared / "lock").open("w") as lock:
        # Held by the first worker for the ~15 s its node takes to answer.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (shared / FAILED).exists():
            raise RabbitMQNodeError((shared / FAILED).read_text())
        if not (shared / INFO).exists():
            _start(shared, new_node(shared))
        return _read(shared)


def _start(shared: Path, node: RabbitMQNode) -> None:
    try:
        node.start()
    except RabbitMQNodeError as exc:
        (shared / FAILED).write_text(str(exc))
        if isinstance(node, ChrootRabbitMQNode):
            node.remove()
        raise
    _STARTED.append(node)
    assert node.process is not None and node.epmd is not None
    info = {
        "node_name": node.node_name,
        "base": str(node.base),
        "ports": [node.ports.amqp, node.ports.management, node.ports.dist, node.ports.epmd],
        "groups": [node.process.pid, node.epmd.pid],
    }
    if isinstance(node, ChrootRabbitMQNode):
        # What the controller undoes after the stop (the root's /proc; the node's folder).
        info["unmount"] = None if node.mounted_proc is None else str(node.mounted_proc)
        info["remove"] = str(node.base)
    (shared / INFO).write_text(json.dumps(info))


def _read(shared: Path) -> SharedNode:
    info = json.loads((shared / INFO).read_text())
    amqp, management, dist, epmd = info["ports"]
    ports = NodePorts(amqp=amqp, management=management, dist=dist, epmd=epmd)
    base = Path(info.get("base", shared / "node"))
    return SharedNode(base, ports, info["node_name"], list(info["groups"]))


def stop_shared(shared: Path, timeout: float = STOP_TIMEOUT) -> bool:
    """Stop the run's node, if one was started: SIGTERM to each of its process groups, then
    SIGKILL to what is left after ``timeout``. False if it was already gone (it died
    during the run)."""
    if not (shared / INFO).exists():
        return True
    info = json.loads((shared / INFO).read_text())
    groups = list(info["groups"])
    was_alive = all(group_members(group, running=True) for group in groups)
    for group in groups:
        _signal(group, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while group_members(group, running=True) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal(group, signal.SIGKILL)
    if info.get("unmount"):
        unmount(Path(info["unmount"]))
    if info.get("remove"):
        shutil.rmtree(info["remove"], ignore_errors=True)
    return was_alive


def group_members(group: int, *, running: bool = False) -> list[int]:
    """PIDs of the processes in a process group (read from /proc); ``running``: only those
    not zombies (the worker that started the shared node may outlive it, not reaping it)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and not (running and fields[0] == "Z"):
            members.append(int(entry.name))
    return members


def _signal(group: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signum)
