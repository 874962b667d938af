"""End to end: the real ``redrive`` command, run as a subprocess against a moto server on
127.0.0.1, on DLQs filled the way SQS fills them (``redrive.sandbox.dead_letter``: sent to
the source queue, received more than maxReceiveCount times).

Every message a test dead-letters is built here with a known task and task id, so what
arrives in a queue is checked against what was sent, never against redrive's own decoder.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from redrive.messages import encode
from redrive.sandbox import dead_letter
from tests.conftest import Family, MotoServer, free_port, make_family, start_moto_server

pytestmark = pytest.mark.e2e

REDRIVE = [sys.executable, "-m", "redrive"]
ROOT = Path(__file__).resolve().parent.parent

CAPTURE = "apps.payments.tasks.capture_payment"
REFUND = "apps.payments.tasks.refund"
IBFT = "apps.webhooks.tasks.save_checkout_ibft"
UNKNOWN = "(unknown)"
REDRIVE_ATTRIBUTES = {"redrive-count", "redrive-key", "redrive-dlq"}


# -- what was dead-lettered ------------------------------------------------------------------


@dataclass(frozen=True)
class Dead:
    """One message as it was sent to the source queue (and then dead-lettered)."""

    body: str
    attributes: dict[str, Any]
    task: str
    ident: str
    """The Celery task id, or ``body:N`` for a body Celery did not write."""
    protocol: int | None
    expired: bool = False


def celery(
    task: str,
    protocol: int = 2,
    *,
    task_id: str | None = None,
    attributes: dict[str, Any] | None = None,
    expired: bool = False,
    **options: Any,
) -> Dead:
    task_id = task_id or str(uuid.uuid4())
    if expired:
        options["expires"] = time.time() - 3600
        from datetime import UTC, datetime

        options["expires"] = datetime.fromtimestamp(options["expires"], UTC)
    body = encode(
        task,
        [random.randint(1, 10**6)],
        {"note": "Zoë ✓"},
        protocol=protocol,
        task_id=task_id,
        queue="onion-checkout",
        **options,
    )
    return Dead(body, attributes or {}, task, task_id, protocol, expired)


def odd_bodies() -> list[Dead]:
    """Bodies a Celery worker could not run, which inspect counts under "(unknown)"."""
    pickled = {
        "body": base64.b64encode(b"\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00K\x01.").decode(),
        "content-encoding": "binary",
        "content-type": "application/x-python-serialize",
        "headers": {},
        "properties": {
            "body_encoding": "base64",
            "delivery_info": {"exchange": "", "routing_key": "onion-checkout"},
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    bodies = [
        "legacy cron 4242: resync inventory for store 7",
        json.dumps({"event": "order.created", "order_id": 31337, "v": 1}),
        "eyJib2R5IjogImJyb2tlbiBiYXNlNjQ",  # a base64 envelope cut short
        base64.b64encode(json.dumps(pickled).encode()).decode(),
    ]
    return [Dead(b, {}, UNKNOWN, f"body:{i}", None) for i, b in enumerate(bodies)]


def fill(family: Family, dead: Sequence[Dead]) -> None:
    """Dead-letter ``dead`` into the family's DLQ the way SQS does."""
    arrived = dead_letter(family.client, family.queue_url, [(d.body, d.attributes) for d in dead])
    assert arrived == len(dead)
    assert family.depth() == (len(dead), 0)


def by_body(dead: Iterable[Dead]) -> dict[str, Dead]:
    return {d.body: d for d in dead}


def plain_attributes(attributes: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Only what SendMessage takes (receive adds empty list fields)."""
    return {
        name: {k: v for k, v in value.items() if k in ("DataType", "StringValue", "BinaryValue")}
        for name, value in attributes.items()
    }


def arrivals(family: Family, sent: dict[str, Dead]) -> Counter[str]:
    """Drain the source queue; every message must be a byte-identical copy of one that was
    dead-lettered. Returns how many copies of each ident arrived."""
    got: Counter[str] = Counter()
    for message in family.drain(family.queue_url):
        original = sent.get(message["Body"])
        assert original is not None, f"a body that was never dead-lettered: {message['Body']!r}"
        received = plain_attributes(message.get("MessageAttributes", {}))
        originals = {k: v for k, v in received.items() if k not in REDRIVE_ATTRIBUTES}
        assert originals == plain_attributes(original.attributes)
        if len(original.attributes) < 10:
            assert set(received) - set(originals), "redrive stamps its attributes when it can"
        got[original.ident] += 1
    return got


def dlq_bodies(family: Family) -> Counter[str]:
    """The DLQ's bodies, left in it: received with a lease, then made visible again."""
    bodies: Counter[str] = Counter()
    handles: list[str] = []
    for _ in range(200):
        got = family.client.receive_message(
            QueueUrl=family.dlq_url, MaxNumberOfMessages=10, VisibilityTimeout=60
        ).get("Messages", [])
        if not got:
            break
        for message in got:
            bodies[message["Body"]] += 1
            handles.append(message["ReceiptHandle"])
    for start in range(0, len(handles), 10):
        family.client.change_message_visibility_batch(
            QueueUrl=family.dlq_url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0}
                for i, h in enumerate(handles[start : start + 10])
            ],
        )
    return bodies


# -- running redrive --------------------------------------------------------------------------


def redrive(
    server: MotoServer | None, *args: str, timeout: float = 60, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*REDRIVE, *args],
        env=env if env is not None else _env(server),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def start_redrive(server: MotoServer, *args: str, out: Path) -> subprocess.Popen[str]:
    with (out.with_suffix(".out")).open("w") as stdout, out.with_suffix(".err").open("w") as err:
        return subprocess.Popen(
            [*REDRIVE, *args],
            env=_env(server),
            cwd=ROOT,
            stdout=stdout,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
        )


def finished(process: subprocess.Popen[str], out: Path, timeout: float = 60) -> tuple[int, str, str]:
    code = process.wait(timeout)
    return code, out.with_suffix(".out").read_text(), out.with_suffix(".err").read_text()


def _env(server: MotoServer | None) -> dict[str, str]:
    env = server.env() if server is not None else dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def ok_json(result: subprocess.CompletedProcess[str], code: int = 0) -> dict[str, Any]:
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def wait_for(condition: Any, *, timeout: float, every: float = 0.05, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or condition}")


def ledger_states(path: Path) -> Counter[str]:
    """Key states in a SQLite ledger another process is writing (read-only peek)."""
    if not path.exists():
        return Counter()
    with contextlib.closing(sqlite3.connect(path, timeout=5)) as conn:
        try:
            rows = conn.execute("SELECT state, count(*) FROM keys GROUP BY state").fetchall()
        except sqlite3.OperationalError:  # the schema is not there yet
            return Counter()
    return Counter({str(state): int(n) for state, n in rows})


@pytest.fixture
def checkout(server: MotoServer) -> Family:
    return make_family(server.client(), "onion-checkout")


@pytest.fixture
def families(server: MotoServer) -> dict[str, Family]:
    client = server.client()
    return {
        "checkout": make_family(client, "onion-checkout"),
        "default": make_family(client, "onion"),
        "progress": make_family(client, "onion-progress"),
    }


# -- 1. inspect -------------------------------------------------------------------------------


def test_inspect_counts_each_task_exactly_and_leaves_the_dlq_as_it_was(
    checkout: Family, server: MotoServer
) -> None:
    random.seed(1)
    dead = [
        *(celery(CAPTURE, 2) for _ in range(7)),
        *(celery(CAPTURE, 1) for _ in range(4)),
        *(celery(REFUND, 2, compression="gzip") for _ in range(2)),
        *(celery(REFUND, 1, compression="bzip2") for _ in range(3)),
        celery(REFUND, 2, base64_envelope=False),
        *(celery(IBFT, 2, expired=True) for _ in range(2)),
        *odd_bodies(),
    ]
    random.shuffle(dead)
    fill(checkout, dead)

    first = ok_json(redrive(server, "inspect", "checkout", "--json"))
    assert first["total"] == len(dead)
    groups = {g["task"]: g for g in first["groups"]}
    assert {task: g["count"] for task, g in groups.items()} == {
        CAPTURE: 11,
        REFUND: 6,
        IBFT: 2,
        UNKNOWN: 4,
    }
    assert groups[CAPTURE]["protocols"] == {"2": 7, "1": 4}
    assert groups[REFUND]["protocols"] == {"2": 3, "1": 3}
    assert groups[IBFT]["expired"] == 2
    assert groups[CAPTURE]["expired"] == 0
    ids = {d.ident for d in dead}
    for group in first["groups"]:
        assert set(group["sample_task_ids"]) <= ids
        # dead_letter received each one 6 times (5 + the receive that moved it).
        assert group["max_receive_count"] >= 6
    assert checkout.depth() == (len(dead), 0), "inspect must give back every message"

    second = ok_json(redrive(server, "inspect", "checkout", "--json"))
    assert checkout.depth() == (len(dead), 0)
    assert checkout.depth(checkout.queue_url) == (0, 0)

    # SQS has no peek: every receive raises ApproximateReceiveCount, and which samples a
    # group shows depends on the order SQS hands messages out. Everything else is the same.
    def stable(data: dict[str, Any]) -> list[dict[str, Any]]:
        drop = {"max_receive_count", "sample_task_ids", "sample_message_ids"}
        return [{k: v for k, v in g.items() if k not in drop} for g in data["groups"]]

    assert stable(second) == stable(first)
    assert second["total"] == first["total"]
    for one, two in zip(first["groups"], second["groups"], strict=True):
        assert two["max_receive_count"] == one["max_receive_count"] + 1


# -- 2. report and status ---------------------------------------------------------------------


def test_report_formats_alerting_exit_code_and_status(
    families: dict[str, Family], server: MotoServer, tmp_path: Path
) -> None:
    empty = redrive(server, "report", "--format", "json", "--fail-on-messages")
    assert ok_json(empty)["total"] == 0

    checkout, progress = families["checkout"], families["progress"]
    random.seed(2)
    fill(checkout, [*(celery(CAPTURE, 2) for _ in range(3)), celery(REFUND, 1)])
    progress_task = "apps.engagements.tasks.save_progress_quiz"
    fill(progress, [celery(progress_task, 2) for _ in range(2)])

    data = ok_json(redrive(server, "report", "--format", "json"))
    assert data["total"] == 6
    queues = {q["family"]: q for q in data["queues"]}
    assert set(queues) == {"checkout", "default", "progress"}
    assert {q: queues[q]["messages"] for q in queues} == {"checkout": 4, "default": 0, "progress": 2}
    assert all(q["error"] is None for q in data["queues"])
    assert {g["task"]: g["count"] for g in queues["checkout"]["groups"]} == {CAPTURE: 3, REFUND: 1}
    assert queues["checkout"]["dlq"] == "onion-checkout-dlq"

    alert = redrive(server, "report", "--format", "json", "--fail-on-messages")
    assert ok_json(alert, 1)["total"] == 6, "the document is still printed when alerting"

    markdown = redrive(server, "report", "--format", "markdown")
    assert markdown.returncode == 0, markdown.stderr
    rows = [line for line in markdown.stdout.splitlines() if line.startswith("|")]
    assert any(CAPTURE in row and "| 3 " in row for row in rows), markdown.stdout
    assert any(progress_task in row for row in rows), markdown.stdout
    assert "onion-checkout-dlq" in markdown.stdout

    written = tmp_path / "report.md"
    quiet = redrive(server, "report", "--format", "markdown", "--output", str(written))
    assert quiet.returncode == 0 and quiet.stdout == ""
    assert written.read_text() == markdown.stdout

    status = ok_json(redrive(server, "status", "--json"))
    rows_by_family = {r["family"]: r for r in status["families"]}
    assert rows_by_family["checkout"]["dlq_counts"] == {"visible": 4, "in_flight": 0, "delayed": 0}
    assert rows_by_family["progress"]["dlq_counts"]["visible"] == 2
    assert rows_by_family["default"]["dlq_counts"]["visible"] == 0
    assert rows_by_family["checkout"]["queue_counts"] == {"visible": 0, "in_flight": 0, "delayed": 0}
    assert rows_by_family["checkout"]["dlq_retention_seconds"] == 14 * 86400
    # Neither report nor status changed anything.
    assert checkout.depth() == (4, 0) and progress.depth() == (2, 0)


# -- 3. move: dry run, one task, rerun ---------------------------------------------------------


def test_move_one_task_sends_each_message_once_byte_identical(
    checkout: Family, server: MotoServer, tmp_path: Path
) -> None:
    random.seed(3)
    full = {f"attr-{i}": {"DataType": "String", "StringValue": f"v{i}"} for i in range(10)}
    capture = [
        *(celery(CAPTURE, 2) for _ in range(8)),
        *(celery(CAPTURE, 1) for _ in range(4)),
        celery(
            CAPTURE,
            attributes={
                "trace-id": {"DataType": "String", "StringValue": "Zoë-trace ✓"},
                "tenant-id": {"DataType": "Number", "StringValue": "42"},
                "blob": {"DataType": "Binary", "BinaryValue": b"\x00\xff\x80binary"},
            },
        ),
        celery(CAPTURE, attributes=full),  # no room for redrive's own attributes
    ]
    duplicate = celery(CAPTURE, task_id=capture[0].ident)  # a second copy of one task
    expired = celery(CAPTURE, 2, expired=True)
    others = [*(celery(REFUND) for _ in range(5)), *(celery(IBFT, 1) for _ in range(3))]
    dead = [*capture, duplicate, expired, *others, *odd_bodies()]
    random.shuffle(dead)
    fill(checkout, dead)
    total = len(dead)
    ledger = tmp_path / "ledger.sqlite3"

    plan = ok_json(
        redrive(server, "move", "checkout", "--task", CAPTURE, "--ledger", str(ledger), "--json")
    )
    assert plan["dry_run"] is True
    assert plan["moved"] == len(capture)
    assert plan["skipped_by_reason"] == {"expired": 1}
    assert plan["duplicates_deleted"] == 1
    assert checkout.depth() == (total, 0)
    assert checkout.depth(checkout.queue_url) == (0, 0)
    assert not ledger.exists(), "a dry run never creates the ledger"

    args = ("move", "checkout", "--task", CAPTURE, "--execute", "--yes", "--ledger", str(ledger))
    done = ok_json(redrive(server, *args, "--json"))
    assert done["dry_run"] is False
    assert done["moved"] == len(capture)
    assert done["by_task"] == {CAPTURE: len(capture)}
    assert done["duplicates_deleted"] == 1
    assert done["skipped_by_reason"] == {"expired": 1}
    assert done["failed"] == 0 and done["in_doubt"] == 0 and done["still_hidden"] == 0

    got = arrivals(checkout, by_body(dead))
    assert got == Counter({d.ident: 1 for d in capture})
    left = dlq_bodies(checkout)
    assert left == Counter(d.body for d in [expired, *others, *odd_bodies_of(dead)])
    assert checkout.depth() == (total - len(capture) - 1, 0)

    again = ok_json(redrive(server, *args, "--json"))
    assert again["moved"] == 0 and again["duplicates_deleted"] == 0
    assert checkout.depth(checkout.queue_url) == (0, 0)
    assert checkout.depth() == (total - len(capture) - 1, 0)

    text = redrive(server, *args)
    assert text.returncode == 0 and "0 moved" in text.stdout, text.stdout


def odd_bodies_of(dead: Iterable[Dead]) -> list[Dead]:
    return [d for d in dead if d.task == UNKNOWN]


# -- 4. SIGKILL mid-run --------------------------------------------------------------------------


def test_sigkill_mid_run_then_reruns_lose_nothing_and_double_only_explicit_resends(
    checkout: Family, server: MotoServer, tmp_path: Path
) -> None:
    random.seed(4)
    unique = [celery(random.choice((CAPTURE, REFUND, IBFT)), random.choice((1, 2, 2))) for _ in range(278)]
    unique += odd_bodies()[:2]
    copies = [celery(d.task, d.protocol or 2, task_id=d.ident) for d in random.sample(unique[:278], 20)]
    dead = [*unique, *copies]
    random.shuffle(dead)
    fill(checkout, dead)
    sent = by_body(dead)
    ledger = tmp_path / "ledger.sqlite3"
    move = ("move", "checkout", "--execute", "--yes", "--lease", "2", "--json", "--ledger", str(ledger))

    victim = start_redrive(server, *move, out=tmp_path / "killed")
    try:
        # Kill while a batch is claimed (the in-doubt window) once a third is done; if that
        # window is never caught, kill anyway before the end.
        def ripe() -> bool:
            states = ledger_states(ledger)
            done = states["done"] + states["sent"]
            return (done >= 90 and states["claimed"] > 0) or done >= 200

        wait_for(ripe, timeout=40, every=0.002, what="a third of the keys done")
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(10)
    killed_at = ledger_states(ledger)
    assert 0 < killed_at["done"] + killed_at["sent"] < len(unique), killed_at

    # The killed run's batch comes back when its 2 s lease runs out.
    wait_for(lambda: checkout.depth()[1] == 0, timeout=15, every=0.2, what="the lease")
    time.sleep(0.5)

    got: Counter[str] = Counter()
    in_doubt: dict[str, str] = {}  # task id -> task
    for _ in range(4):
        result = redrive(server, *move[:-2], "--ledger", str(ledger))
        data = ok_json(result, 3 if result.returncode == 3 else 0)
        assert data["failed"] == 0
        for listed in data["in_doubt_messages"]:
            assert listed["task"] in (CAPTURE, REFUND, IBFT, UNKNOWN)
            assert listed["message_id"] and listed["key"]
            if listed["task"] != UNKNOWN:
                assert listed["task_id"] in sent_ids(dead)
            in_doubt[listed["task_id"] or listed["key"]] = listed["task"]
        assert data["in_doubt"] == len(data["in_doubt_messages"])
        got += arrivals(checkout, sent)
        if data["in_doubt"] == 0 and checkout.depth() == (0, 0):
            break
        if data["in_doubt"]:
            # Held in doubt: they stay in the DLQ, visible, and were not sent again.
            assert checkout.depth() == (data["in_doubt"], 0)
            break
    else:
        raise AssertionError("reruns did not drain the DLQ")

    # Before any explicit resend: every task arrived exactly once, except the in-doubt ones,
    # which arrived at most once (their first send may or may not have landed).
    expected = {d.ident for d in unique}
    for ident in expected:
        if ident in in_doubt:
            assert got[ident] <= 1, ident
        else:
            assert got[ident] == 1, ident
    assert set(got) <= expected

    if in_doubt:
        before = Counter(got)
        resend = redrive(server, *move[:-2], "--ledger", str(ledger), "--in-doubt", "resend")
        data = ok_json(resend)
        assert data["in_doubt"] == 0 and data["failed"] == 0
        assert data["moved"] == len(in_doubt)
        after = arrivals(checkout, sent)
        assert set(after) == set(in_doubt), "the resend sends the in-doubt tasks and only them"
        assert all(n == 1 for n in after.values())
        got += after
        for ident in in_doubt:
            assert 1 <= got[ident] <= 2
            assert got[ident] == before[ident] + 1

    assert checkout.depth() == (0, 0), "nothing left in the DLQ"
    assert {ident for ident in expected if got[ident] == 0} == set(), "nothing lost"
    final = ok_json(redrive(server, *move[:-2], "--ledger", str(ledger)))
    assert final["moved"] == 0 and final["matched"] == 0
    assert checkout.depth(checkout.queue_url) == (0, 0)


def sent_ids(dead: Iterable[Dead]) -> set[str]:
    return {d.ident for d in dead}


# -- 5. two operators at once ---------------------------------------------------------------------


def test_two_operators_at_once_send_each_task_once(tmp_path: Path) -> None:
    serial = start_moto_server(tmp_path / "server.log", serial=True)
    try:
        checkout = make_family(serial.client(), "onion-checkout")
        random.seed(5)
        unique = [celery(random.choice((CAPTURE, REFUND)), random.choice((1, 2))) for _ in range(180)]
        copies = [celery(d.task, d.protocol or 2, task_id=d.ident) for d in random.sample(unique, 20)]
        dead = [*unique, *copies]
        random.shuffle(dead)
        fill(checkout, dead)
        ledger = tmp_path / "shared-ledger.sqlite3"
        move = ("move", "checkout", "--execute", "--yes", "--json", "--ledger", str(ledger))

        runs = [start_redrive(serial, *move, out=tmp_path / f"op{i}") for i in (1, 2)]
        results = []
        try:
            for i, run in enumerate(runs, 1):
                code, out, err = finished(run, tmp_path / f"op{i}", timeout=60)
                assert code == 0, (code, out, err)
                assert "Traceback" not in err
                results.append(json.loads(out))
        finally:
            for run in runs:
                if run.poll() is None:
                    run.kill()
                    run.wait(10)
        assert all(r["failed"] == 0 and r["in_doubt"] == 0 for r in results)
        assert all(r["moved"] > 0 for r in results), "both operators did part of the work"
        assert sum(r["moved"] for r in results) == len(unique)

        got = arrivals(checkout, by_body(dead))
        # A copy skipped as claimed-by-another-run stays in the DLQ; a rerun deletes it.
        if checkout.depth() != (0, 0):
            last = ok_json(redrive(serial, *move))
            assert last["moved"] == 0
            got += arrivals(checkout, by_body(dead))
        assert got == Counter({d.ident: 1 for d in unique})
        assert checkout.depth() == (0, 0)
    finally:
        serial.process.terminate()
        serial.process.wait(10)
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert "SendMessageBatch" in log or "POST / HTTP" in log, "the log records requests"
    assert " 500 " not in log


# -- 6. Ctrl-C ------------------------------------------------------------------------------------


def test_ctrl_c_stops_cleanly_and_a_rerun_finishes(
    checkout: Family, server: MotoServer, tmp_path: Path
) -> None:
    random.seed(6)
    unique = [celery(CAPTURE, random.choice((1, 2))) for _ in range(95)]
    copies = [celery(CAPTURE, 2, task_id=d.ident) for d in unique[:5]]
    dead = [*unique, *copies]
    random.shuffle(dead)
    fill(checkout, dead)
    ledger = tmp_path / "ledger.sqlite3"
    move = ("move", "checkout", "--execute", "--yes", "--ledger", str(ledger))

    run = start_redrive(server, *move, "--rate", "20", "--json", out=tmp_path / "int")
    try:
        wait_for(
            lambda: checkout.depth(checkout.queue_url)[0] >= 10,
            timeout=20,
            every=0.05,
            what="the first messages moved",
        )
        run.send_signal(signal.SIGINT)
        started = time.monotonic()
        code, out, err = finished(run, tmp_path / "int", timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
    assert code == 130, (code, out, err)
    assert time.monotonic() - started < 10
    assert "Traceback" not in err
    assert "stopping" in err
    summary = json.loads(out)
    assert summary["interrupted"] is True
    assert 10 <= summary["moved"] < len(unique)
    assert summary["failed"] == 0 and summary["in_doubt"] == 0
    # Nothing stays hidden: what was held is visible again, the rest moved.
    visible, in_flight = checkout.depth()
    assert in_flight == 0
    got = arrivals(checkout, by_body(dead))
    assert sum(got.values()) == summary["moved"]
    assert visible == len(dead) - summary["moved"] - summary["duplicates_deleted"]

    rest = redrive(server, *move)
    assert rest.returncode == 0, rest.stdout + rest.stderr
    got += arrivals(checkout, by_body(dead))
    assert got == Counter({d.ident: 1 for d in unique})
    assert checkout.depth() == (0, 0)


# -- 7. the sandbox command -------------------------------------------------------------------------


def test_sandbox_command_serves_a_seeded_sqs_until_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    out, err = tmp_path / "sandbox.out", tmp_path / "sandbox.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        sandbox = subprocess.Popen(
            [*REDRIVE, "sandbox", "--port", str(port), "--messages", "10"],
            env=_env(None),
            cwd=tmp_path,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
        )
    try:
        wait_for(
            lambda: "sandbox ready" in err.read_text() or sandbox.poll() is not None,
            timeout=60,
            every=0.1,
            what="the sandbox",
        )
        assert sandbox.poll() is None, err.read_text()
        exports = dict(
            line.removeprefix("export ").split("=", 1)
            for line in out.read_text().splitlines()
            if line.startswith("export ")
        )
        assert exports["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{port}"
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} <= set(exports)
        env = {k: v for k, v in _env(None).items() if not k.startswith("AWS_")}
        env.update(exports)

        status = ok_json(redrive(None, "status", "--json", env=env))
        counts = {r["family"]: r["dlq_counts"]["visible"] for r in status["families"]}
        assert counts == {"checkout": 10, "default": 10, "progress": 10}

        inspected = ok_json(redrive(None, "inspect", "checkout", "--json", env=env))
        assert inspected["total"] == 10
        assert sum(g["count"] for g in inspected["groups"]) == 10
        assert {g["task"] for g in inspected["groups"]} <= {IBFT, CAPTURE, REFUND, UNKNOWN}

        sandbox.send_signal(signal.SIGINT)
        assert sandbox.wait(10) == 0
    finally:
        if sandbox.poll() is None:
            sandbox.kill()
            sandbox.wait(10)
    assert "Traceback" not in err.read_text()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


# -- 8. errors end to end ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("inspect", "checkout"),
        ("report",),
        ("move", "checkout", "--execute", "--yes"),
        ("purge", "checkout", "--execute", "--yes"),
    ],
    ids=lambda args: args[0],
)
def test_unreachable_endpoint_is_one_line_exit_1(args: tuple[str, ...], tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    result = redrive(
        None,
        "--endpoint-url",
        f"http://127.0.0.1:{port}",
        *args,
        "--ledger" if args[0] == "move" else "--help-never",
        str(tmp_path / "ledger.sqlite3"),
        timeout=30,
    ) if False else redrive(None, "--endpoint-url", f"http://127.0.0.1:{port}", *args, timeout=30)
    elapsed = time.monotonic() - started
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert elapsed < 10
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "cannot reach" in lines[0]
    assert result.stdout == ""


def test_unreachable_endpoint_from_the_environment(tmp_path: Path) -> None:
    env = _env(None)
    env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"
    result = redrive(None, "inspect", "checkout", "--json", env=env, timeout=30)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def _unused(_: Iterator[None]) -> None:  # pragma: no cover - keeps imports honest
    pass
