"""The private RabbitMQ node the sandbox and the tests run (redrive/sandbox/rabbitmq_node.py):
on loopback only, answering its API, vhosts apart, and nothing left running once stopped."""

from __future__ import annotations

import ipaddress
import os
import socket
import urllib.parse
from dataclasses import replace
from pathlib import Path

import amqp
import pytest
from conftest import on_both_rabbitmq, skip_unless_installed
from rabbitmq_shared import RABBITMQ4_ROOT, group_members, require_rabbitmq4

from redrive.errors import RabbitMQNodeError, RabbitMQNotInstalled
from redrive.sandbox.rabbitmq_node import (
    INSTALL_HINT,
    ChrootRabbitMQNode,
    NodePorts,
    RabbitMQNode,
    Vhost,
    management_request,
    server_installed,
    vhost_amqp_url,
)

pytestmark = pytest.mark.e2e


def connect(vhost: Vhost) -> amqp.Connection:
    port = int(vhost.amqp_url.split("@127.0.0.1:")[1].split("/")[0])
    connection = amqp.Connection(
        f"127.0.0.1:{port}", userid="guest", password="guest", virtual_host=vhost.vhost
    )
    connection.connect()
    return connection


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def listening_addresses(port: int) -> set[str]:
    """The local addresses listening on ``port`` (from /proc/net/tcp and tcp6): what the
    kernel says, not what the API reports (it shows the management listener as ``::``
    while the socket is bound to 127.0.0.1)."""
    found = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                raw = bytes.fromhex(address)
                # /proc writes each 32-bit word in host order (little-endian here).
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, width // 2, 4))
                found.add(str(ipaddress.ip_address(words)))
    return found


@on_both_rabbitmq
def test_the_node_answers_its_api_and_listens_on_loopback_only(
    rabbitmq_node: RabbitMQNode, rabbitmq_vhost: Vhost, rabbitmq_version: str
) -> None:
    overview = management_request(rabbitmq_node.api_url, "GET", "/api/overview")
    assert overview["node"] == rabbitmq_node.node_name
    # Debian 12's and Debian 13's packages: the versions the suite says it tests.
    assert overview["rabbitmq_version"] == {"3.10": "3.10.8", "4.0": "4.0.5"}[rabbitmq_version]
    ports = rabbitmq_node.ports
    for port in (ports.amqp, ports.management, ports.dist):
        assert listening_addresses(port) == {"127.0.0.1"}, port
    assert listening_addresses(ports.epmd) <= {"127.0.0.1", "::1"}
    # The shovel plugins are on: their part of the API answers.
    # (In this test's own vhost: the node serves every worker's tests at once.)
    shovels = f"/api/shovels/{urllib.parse.quote(rabbitmq_vhost.vhost, safe='')}"
    assert management_request(rabbitmq_node.api_url, "GET", shovels) == []
    assert rabbitmq_node.amqp_url == f"amqp://guest:guest@127.0.0.1:{ports.amqp}//"


def test_each_test_has_a_vhost_of_its_own(
    rabbitmq_node: RabbitMQNode, rabbitmq_vhost: Vhost
) -> None:
    other = rabbitmq_node.create_vhost(f"{rabbitmq_vhost.vhost}-other")
    try:
        with connect(rabbitmq_vhost) as connection:
            channel = connection.channel()
            channel.queue_declare("only-here", durable=True, auto_delete=False)
            channel.basic_publish(amqp.Message(b"x", delivery_mode=2), routing_key="only-here")
        with connect(other) as connection, pytest.raises(amqp.exceptions.NotFound):
            connection.channel().queue_declare("only-here", passive=True)
        queues = management_request(rabbitmq_node.api_url, "GET", "/api/queues")
        assert {(q["vhost"], q["name"]) for q in queues if q["name"] == "only-here"} == {
            (rabbitmq_vhost.vhost, "only-here")
        }
    finally:
        rabbitmq_node.delete_vhost(other.vhost)
    rabbitmq_node.delete_vhost(other.vhost)  # already gone: no error
    vhosts = {v["name"] for v in management_request(rabbitmq_node.api_url, "GET", "/api/vhosts")}
    assert rabbitmq_vhost.vhost in vhosts
    assert other.vhost not in vhosts


def test_vhost_urls_are_written_as_kombu_reads_them() -> None:
    url = "amqp://guest:guest@127.0.0.1:5672//"
    assert vhost_amqp_url(url, "/") == url
    assert vhost_amqp_url(url, "t-a[1]") == "amqp://guest:guest@127.0.0.1:5672/t-a%5B1%5D"
    assert vhost_amqp_url("amqp://u:p@h:1/x", "y/z") == "amqp://u:p@h:1/y%2Fz"


@skip_unless_installed(server_installed(), "no RabbitMQ: apt-get install rabbitmq-server")
def test_stop_leaves_no_process_and_frees_the_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its AMQP port first picked is taken by another process before the node binds it
    (seen on this busy machine: the API answered, then the node died of eaddrinuse): the
    start picks ports again and the node runs on the new ones."""
    # Bound, not listening: as an outgoing connection's port is (and nothing answers on it).
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    picks = [NodePorts.pick]
    real_pick = NodePorts.pick

    def pick() -> NodePorts:
        picked = real_pick()
        if len(picks) == 1:
            picks.append(picked)
            return replace(picked, amqp=taken.getsockname()[1])
        return picked

    monkeypatch.setattr(NodePorts, "pick", staticmethod(pick))
    with taken, RabbitMQNode(tmp_path / "node").start() as node:
        assert node.ports.amqp != taken.getsockname()[1] and port_open(node.ports.amqp)
        assert node.process is not None and node.epmd is not None
        groups = [node.process.pid, node.epmd.pid]
        assert all(group_members(group) for group in groups)
        ports = [node.ports.amqp, node.ports.management, node.ports.dist, node.ports.epmd]
        assert all(port_open(port) for port in ports)
    assert node.process is None and node.epmd is None
    assert [group_members(group) for group in groups] == [[], []]
    assert not any(port_open(port) for port in ports)
    node.stop()  # again: nothing to do


def test_a_missing_server_says_how_to_install_it(tmp_path: Path) -> None:
    node = RabbitMQNode(tmp_path, server=tmp_path / "rabbitmq-server")
    with pytest.raises(RabbitMQNotInstalled) as raised:
        node.start()
    assert INSTALL_HINT in str(raised.value)
    assert "\n" not in str(raised.value)
    assert node.process is None and node.epmd is None


@skip_unless_installed(server_installed(), "no RabbitMQ: apt-get install rabbitmq-server")
def test_a_server_that_exits_fails_the_start_at_once_with_its_output(tmp_path: Path) -> None:
    script = tmp_path / "rabbitmq-server"
    script.write_text("#!/bin/sh\necho 'cannot start: eaddrinuse'\nexit 3\n")
    script.chmod(0o755)
    node = RabbitMQNode(tmp_path / "node", server=script)
    with pytest.raises(RabbitMQNodeError, match=r"exited \(3\).*eaddrinuse"):
        node.start(timeout=600)
    assert node.process is None and node.epmd is None
    assert os.path.exists(tmp_path / "node" / "rabbitmq.conf")


def proc_mounts(root: Path) -> int:
    target = str((root / "proc").resolve())
    return sum(line.split()[1] == target for line in Path("/proc/mounts").read_text().splitlines())


def test_a_4_0_node_from_its_root_stops_leaving_no_process_no_mount_and_no_folder() -> None:
    """Its own node beside the run's shared one (which may hold a /proc mount of the same
    root): this one's start adds a mount and its stop takes exactly that one away."""
    require_rabbitmq4()
    mounts = proc_mounts(RABBITMQ4_ROOT)
    with ChrootRabbitMQNode(RABBITMQ4_ROOT).start() as node:
        assert node.server_version() == "4.0.5"
        assert node.process is not None and node.epmd is not None
        groups = [node.process.pid, node.epmd.pid]
        assert proc_mounts(RABBITMQ4_ROOT) == mounts + 1
        ports = [node.ports.amqp, node.ports.management, node.ports.dist, node.ports.epmd]
        for port in ports[:3]:
            assert listening_addresses(port) == {"127.0.0.1"}, port
        # Run as the root's rabbitmq user, never as this machine's root.
        assert all(Path(f"/proc/{pid}").stat().st_uid != 0 for pid in group_members(groups[0]))
        assert node.base.is_relative_to(RABBITMQ4_ROOT / "tmp")
    assert [group_members(group) for group in groups] == [[], []]
    assert not any(port_open(port) for port in ports)
    assert proc_mounts(RABBITMQ4_ROOT) == mounts
    node.remove()
    assert not node.base.exists()
