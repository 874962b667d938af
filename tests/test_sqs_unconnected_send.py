"""A send whose connection was never made was not sent (issue 40): its claims are released,
nothing is in doubt. One whose request left and got no answer stays in doubt.

On moto's server (receives, deletes, the ledger's runs) with the sends through a real client
to a loopback port: one bound and never listening (every connect refused: botocore's
EndpointConnectionError after the send's own retries), or one listening that never answers
(the kernel accepts the connection, the request is written, no answer comes: a
ReadTimeoutError). Neither depends on the machine's speed: a refused connect is refused at
once, and a server that never answers outlasts any read timeout.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from conftest import REGION, Family, MotoServer, make_family
from test_move import arrived, body, keys_in, move, put

from redrive.broker.sqs import SqsBroker
from redrive.broker.sqs.lean import LeanTransport
from redrive.errors import SendInDoubt, SendNotConnected
from redrive.ledger import KeyState

TASKS = [f"t-{i}" for i in range(5)]


@pytest.fixture
def family(server: MotoServer) -> Family:
    """The checkout family on moto's server, five tasks in its DLQ."""
    client = server.client()
    family = make_family(client)
    put(client, family.dlq_url, [body(t) for t in TASKS])
    return family


@pytest.fixture
def refused() -> Iterator[str]:
    """An endpoint on loopback where every connect is refused: the port is bound (nothing
    else can take it meanwhile) and never listened on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def silent() -> Iterator[str]:
    """An endpoint on loopback that accepts connections (the kernel completes them: the
    socket listens) and never answers a request."""
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _send_client(endpoint: str, *, read_timeout: float = 40) -> Any:
    """A send client as redrive's (it never retries by itself), to ``endpoint``."""
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        config=Config(
            connect_timeout=5,
            read_timeout=read_timeout,
            retries={"mode": "standard", "total_max_attempts": 1},
        ),
    )


def _broker(family: Family, send_client: Any, path: str) -> SqsBroker:
    """moto's server for everything but the sends, which go through ``send_client`` on
    ``path``: botocore's, or the lean path's (issue 25)."""
    if path == "lean":
        return SqsBroker(
            family.client,
            send_client=send_client,
            lean_send=LeanTransport(send_client),
            send_attempts=2,
        )
    return SqsBroker(family.client, send_client=send_client, send_attempts=2)


def _claimed(ledger: Path) -> list[str]:
    return [k for k, (state, *_) in keys_in(ledger).items() if state == KeyState.CLAIMED]


@pytest.mark.parametrize("path", ["botocore", "lean"])
def test_a_send_that_cannot_connect_was_not_sent_and_leaves_nothing_in_doubt(
    family: Family, refused: str, tmp_path: Path, path: str
) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    dead = _send_client(refused)

    with pytest.raises(SendNotConnected) as caught:
        move(family.client, ledger, sqs=lambda: _broker(family, dead, path))

    (line,) = str(caught.value).splitlines()
    assert "cannot reach SQS" in line and "EndpointConnectionError" in line, line
    assert "made no connection, so its 5 messages were not sent" in line, line
    assert _claimed(ledger) == [], "a batch never sent is not in doubt: its claims released"
    stopped = caught.value.partial
    assert stopped is not None and stopped.in_doubt == 0 and stopped.moved == 0, stopped

    rerun = move(family.client, ledger)
    assert (rerun.moved, rerun.in_doubt, rerun.duplicates) == (5, 0, 0), rerun
    assert arrived(family) == {t: 1 for t in TASKS}
    assert family.depth() == (0, 0)


@pytest.mark.parametrize("path", ["botocore", "lean"])
def test_a_send_whose_request_left_without_an_answer_stays_in_doubt(
    family: Family, silent: str, tmp_path: Path, path: str
) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    mute = _send_client(silent, read_timeout=1)

    with pytest.raises(SendInDoubt) as caught:
        move(family.client, ledger, sqs=lambda: _broker(family, mute, path))

    assert "ReadTimeoutError" in str(caught.value)
    assert not isinstance(caught.value, SendNotConnected)
    assert len(_claimed(ledger)) == 5, "the request may have reached SQS: in doubt"

    rerun = move(family.client, ledger)
    assert (rerun.moved, rerun.in_doubt) == (0, 5), rerun
    assert arrived(family) == {}
