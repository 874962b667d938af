"""The run's shared RabbitMQ node is stopped by process group (tests/rabbitmq_shared.py),
and a zombie its starter has not reaped counts as gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import wait_until
from rabbitmq_shared import INFO, group_members, rabbitmq4_missing, stop_shared

pytestmark = pytest.mark.e2e  # it starts processes


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "600"], process_group=0)


def test_stop_shared_ends_every_group_it_names(tmp_path: Path) -> None:
    leaders = [sleeper(), sleeper()]
    (tmp_path / INFO).write_text(json.dumps({"groups": [p.pid for p in leaders]}))
    try:
        assert stop_shared(tmp_path, timeout=30) is True
        for leader in leaders:
            assert leader.wait(30) == -signal.SIGTERM
            assert group_members(leader.pid) == []
    finally:
        for leader in leaders:
            leader.kill()
            leader.wait()


def test_a_zombie_is_no_running_member_and_a_dead_node_is_reported(tmp_path: Path) -> None:
    leader = sleeper()
    try:
        os.kill(leader.pid, signal.SIGKILL)
        # Not reaped yet: still in the group, but not running.
        wait_until(lambda: not group_members(leader.pid, running=True), "the sleeper is a zombie")
        assert group_members(leader.pid) == [leader.pid]
        (tmp_path / INFO).write_text(json.dumps({"groups": [leader.pid]}))
        assert stop_shared(tmp_path, timeout=30) is False  # it had died before the end
    finally:
        leader.kill()
        leader.wait()


def test_no_node_started_is_nothing_to_stop(tmp_path: Path) -> None:
    assert stop_shared(tmp_path) is True


def test_a_missing_4_0_root_says_why_and_how_to_build_it(tmp_path: Path) -> None:
    root = tmp_path / "trixie-rabbitmq"
    assert rabbitmq4_missing(root) == (
        f"no RabbitMQ 4.0 root at {root} (not built): `make rabbitmq4` builds it, as root"
    )
    (tmp_path / "trixie-rabbitmq.failed").write_text("debootstrap trixie failed: no network\n")
    assert "(debootstrap trixie failed: no network)" in str(rabbitmq4_missing(root))
    root.mkdir()
    (root / ".redrive-root").write_text("rabbitmq-server 4.0.5\n")
    built = rabbitmq4_missing(root)
    assert (
        built is None
        if os.geteuid() == 0
        else built == f"the RabbitMQ 4.0 node in {root} needs root"
    )
