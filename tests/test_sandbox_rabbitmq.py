"""``redrive sandbox --broker rabbitmq``: a private node, the layout with its DLX, DLQs filled
by real dead-lettering, the environment to export; stopped by PID when it ends. On RabbitMQ
4.0.5, the version users run (issue 39): the node runs in the root ``make rabbitmq4`` builds
(``REDRIVE_SANDBOX_RABBITMQ_ROOT``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Cli
from rabbitmq_shared import RABBITMQ4_ROOT, group_members, require_rabbitmq4

from redrive.sandbox import rabbitmq_node
from redrive.sandbox.rabbitmq_layout import open_connection, queue_depth, raw_channel
from redrive.sandbox.rabbitmq_rehearsal import SANDBOX_ROOT_ENV

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.e2e
def test_the_rabbitmq_sandbox_prints_exports_holds_dead_letters_and_stops_its_node(
    tmp_path: Path,
) -> None:
    require_rabbitmq4()
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("REDRIVE_")},
        "TMPDIR": str(temp),
        "PYTHONPATH": str(ROOT),
        SANDBOX_ROOT_ENV: str(RABBITMQ4_ROOT),
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "redrive",
            "sandbox",
            "--broker",
            "rabbitmq",
            "--messages",
            "3",
            "--seed",
            "7",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
    )
    exports: dict[str, str] = {}
    try:
        assert process.stdout is not None
        for raw in process.stdout:  # the node's start is bounded by RabbitMQNode (240 s)
            line = raw.decode().strip()
            if line.startswith("export "):
                name, value = line.removeprefix("export ").split("=", 1)
                exports[name] = value
            if line == "unset REDRIVE_LEDGER":
                break
        url = exports["REDRIVE_BROKER"]
        assert re.fullmatch(r"amqp://guest:guest@127\.0\.0\.1:\d+//", url)
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", exports["REDRIVE_RABBITMQ_API"])
        api = exports["REDRIVE_RABBITMQ_API"]
        overview = rabbitmq_node.management_request(api, "GET", "/api/overview")
        assert overview["rabbitmq_version"] == "4.0.5"
        state_dir = Path(exports["REDRIVE_STATE_DIR"])
        assert state_dir.parent == temp and state_dir.is_dir()
        with open_connection(url) as connection:
            channel = raw_channel(connection)
            for queue in ("onion-checkout", "onion", "onion-progress"):
                assert queue_depth(channel, f"{queue}-dlq") == 3
                assert queue_depth(channel, queue) == 0
                message = channel.basic_get(f"{queue}-dlq", no_ack=False)
                (death,) = message.properties["application_headers"]["x-death"]
                assert (death["reason"], death["queue"]) == ("rejected", queue)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    text = err.decode()
    assert "# checkout: 3 in onion-checkout-dlq" in text
    assert "sandbox ready" in text
    found = re.search(r"\(PID (\d+)\)", text)
    assert found is not None
    assert group_members(int(found.group(1))) == []  # the node was stopped by PID
    assert not state_dir.exists()
    assert not any(temp.iterdir())  # the node's folder is gone too


def test_without_the_server_one_line_says_how_to_install_it(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(rabbitmq_node, "RABBITMQ_SERVER", tmp_path / "rabbitmq-server")
    result = cli("sandbox", "--broker", "rabbitmq")
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert "apt-get install rabbitmq-server" in line


def test_serial_is_the_sqs_sandboxs(cli: Cli) -> None:
    result = cli("sandbox", "--broker", "rabbitmq", "--serial")
    assert result.exit_code == 2
    assert "--serial" in result.stderr
