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
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import Family, MotoServer, free_port, make_family, start_moto_server
from kill_points import At, KillPoints, wait_until_stopped

from redrive.sandbox import dead_letter
from redrive.sandbox.encoder import encode

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


_TASK_IDS: dict[str, random.Random] = {}


def seeded_task_id() -> str:
    """A task id drawn from the running test's own seed (its node id): the same ids on every
    run, whatever ran before in this process, so which ``--processes`` shard or ledger row a
    task lands in never depends on a draw (issue 37)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    rng = _TASK_IDS.setdefault(test, random.Random(f"test-task-ids:{test}"))
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def celery(
    task: str,
    protocol: int = 2,
    *,
    task_id: str | None = None,
    attributes: dict[str, Any] | None = None,
    expired: bool = False,
    **options: Any,
) -> Dead:
    task_id = task_id or seeded_task_id()
    if expired:
        options["expires"] = datetime.now(UTC) - timedelta(hours=1)
    body = encode(
        task,
        [int(uuid.UUID(task_id)) % 10**6],
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


def drain(client: Any, url: str) -> list[dict[str, Any]]:
    """Every message of a queue, deleted (in batches: hundreds of single deletes are slow)."""
    out: list[dict[str, Any]] = []
    for _ in range(500):
        got = client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=60,
            MessageAttributeNames=["All"],
        ).get("Messages", [])
        if not got:
            return out
        out.extend(got)
        deleted = client.delete_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
            ],
        )
        assert not deleted.get("Failed"), deleted
    raise AssertionError(f"{url} did not drain")


def arrivals(family: Family, sent: dict[str, Dead]) -> Counter[str]:
    """Drain the source queue; every message must be a byte-identical copy of one that was
    dead-lettered. Returns how many copies of each ident arrived."""
    got: Counter[str] = Counter()
    for message in drain(family.client, family.queue_url):
        original = sent.get(message["Body"])
        assert original is not None, f"a body that was never dead-lettered: {message['Body']!r}"
        received = plain_attributes(message.get("MessageAttributes", {}))
        originals = {k: v for k, v in received.items() if k not in REDRIVE_ATTRIBUTES}
        assert originals == plain_attributes(original.attributes)
        if len(original.attributes) < 10:
            assert set(received) - set(originals), "redrive stamps its attributes when it can"
        got[original.ident] += 1
    return got


def dlq_messages(family: Family) -> dict[str, str]:
    """The DLQ's messages (MessageId -> Body), left in it: received with a lease, then made
    visible again."""
    bodies: dict[str, str] = {}
    handles: list[str] = []
    for _ in range(200):
        got = family.client.receive_message(
            QueueUrl=family.dlq_url, MaxNumberOfMessages=10, VisibilityTimeout=60
        ).get("Messages", [])
        if not got:
            break
        for message in got:
            bodies[message["MessageId"]] = message["Body"]
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


def dlq_bodies(family: Family) -> Counter[str]:
    return Counter(dlq_messages(family).values())


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


def start_redrive(
    server: MotoServer, *args: str, out: Path, points: KillPoints | None = None
) -> subprocess.Popen[str]:
    """``redrive ARGS`` in the background, its output in ``out``.out and .err; with
    ``points``, killed (or stopped) where they say (tests/kill_points.py)."""
    argv = points.argv(*args) if points is not None else [*REDRIVE, *args]
    env = points.env(_env(server)) if points is not None else _env(server)
    with (out.with_suffix(".out")).open("w") as stdout, out.with_suffix(".err").open("w") as err:
        return subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdout=stdout,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
        )


def finished(
    process: subprocess.Popen[str], out: Path, timeout: float = 60
) -> tuple[int, str, str]:
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


def wait_for(
    condition: Callable[[], bool], *, timeout: float, every: float = 0.05, what: str = ""
) -> None:
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
    with contextlib.closing(sqlite3.connect(path, timeout=60)) as conn:
        try:
            rows = conn.execute("SELECT state, count(*) FROM keys GROUP BY state").fetchall()
        except sqlite3.OperationalError:  # the schema is not there yet
            return Counter()
    return Counter({str(state): int(n) for state, n in rows})


def watch(
    processes: Sequence[subprocess.Popen[str]],
    progress: Callable[[], object],
    *,
    stall: float = 60.0,
    timeout: float = 300.0,
) -> None:
    """Wait until every process has ended. A run that stops making progress (``progress()``
    unchanged for ``stall`` seconds while a process lives) is hung: kill it and fail at once
    instead of waiting out the whole timeout. A healthy run changes the ledger or a queue
    at least every couple of seconds (its scan ends after two empty 1 s long polls); a
    loaded machine may be many times slower, so ``stall`` is a minute."""
    started = changed = time.monotonic()
    last = progress()
    while any(p.poll() is None for p in processes):
        now = time.monotonic()
        if now - changed > stall or now - started > timeout:
            for p in processes:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
            raise Hung(
                f"redrive made no progress for {now - changed:.0f} s "
                f"({now - started:.0f} s in all): hung"
            )
        time.sleep(0.5)  # light: on a serial server every poll delays redrive
        current = progress()
        if current != last:
            last, changed = current, time.monotonic()


class Hung(AssertionError):
    """A redrive subprocess stopped making progress and was killed."""


def progress_of(family: Family, ledger: Path) -> Callable[[], object]:
    def progress() -> object:
        return (
            sorted(ledger_states(ledger).items()),
            family.depth(family.queue_url),
            family.depth(),
        )

    return progress


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


# -- 1. inspect --------------------------------------------------------------------------------


def test_inspect_counts_each_task_exactly_and_leaves_the_dlq_as_it_was(
    checkout: Family, server: MotoServer
) -> None:
    rng = random.Random(1)
    dead = [
        *(celery(CAPTURE, 2) for _ in range(7)),
        *(celery(CAPTURE, 1) for _ in range(4)),
        *(celery(REFUND, 2, compression="gzip") for _ in range(2)),
        *(celery(REFUND, 1, compression="bzip2") for _ in range(3)),
        celery(REFUND, 2, base64_envelope=False),
        *(celery(IBFT, 2, expired=True) for _ in range(2)),
        *odd_bodies(),
    ]
    rng.shuffle(dead)
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
        drop = {
            "max_receive_count",
            "max_redrive_receives",
            "sample_task_ids",
            "sample_message_ids",
        }
        return [{k: v for k, v in g.items() if k not in drop} for g in data["groups"]]

    assert stable(second) == stable(first)
    # What the consumers did stays put, however often one looks.
    assert {g["max_consumer_receives"] for g in second["groups"]} == {5}
    assert all(g["max_redrive_receives"] == 2 for g in second["groups"])
    assert second["total"] == first["total"]
    for one, two in zip(first["groups"], second["groups"], strict=True):
        assert two["max_receive_count"] == one["max_receive_count"] + 1


# -- 2. report and status ----------------------------------------------------------------------


def test_report_formats_alerting_exit_code_and_status(
    families: dict[str, Family], server: MotoServer, tmp_path: Path
) -> None:
    # A scan ends after two empty 1 s long polls, so each family costs 2 s of a report:
    # the checks that need no other family use a config file naming only checkout.
    only_checkout = tmp_path / "checkout.toml"
    only_checkout.write_text('[families.checkout]\nqueue = "onion-checkout"\n')
    two = tmp_path / "two.toml"  # the built-in layout without "default" (status shows all 3)
    two.write_text(
        '[families.progress]\nqueue = "onion-progress"\npriority = 2\n\n'
        '[families.checkout]\nqueue = "onion-checkout"\npriority = 1\n'
    )
    empty = redrive(
        server, "--config", str(only_checkout), "report", "--format", "json", "--fail-on-messages"
    )
    assert ok_json(empty)["total"] == 0

    checkout, progress = families["checkout"], families["progress"]
    fill(checkout, [*(celery(CAPTURE, 2) for _ in range(3)), celery(REFUND, 1)])
    progress_task = "apps.engagements.tasks.save_progress_quiz"
    fill(progress, [celery(progress_task, 2) for _ in range(2)])

    alert = redrive(
        server, "--config", str(two), "report", "--format", "json", "--fail-on-messages"
    )
    data = ok_json(alert, 1)  # the document is printed all the same
    assert data["total"] == 6
    queues = {q["family"]: q for q in data["queues"]}
    assert [q["family"] for q in data["queues"]] == ["checkout", "progress"], "by priority"
    assert {q: queues[q]["messages"] for q in queues} == {"checkout": 4, "progress": 2}
    assert all(q["error"] is None for q in data["queues"])
    assert {g["task"]: g["count"] for g in queues["checkout"]["groups"]} == {
        CAPTURE: 3,
        REFUND: 1,
    }
    assert {g["task"]: g["count"] for g in queues["progress"]["groups"]} == {progress_task: 2}
    assert queues["checkout"]["dlq"] == "onion-checkout-dlq"
    assert queues["checkout"]["oldest_age_seconds"] >= 0

    written = tmp_path / "report.md"
    quiet = redrive(
        server,
        *("--config", str(only_checkout), "report"),
        *("--format", "markdown", "--output", str(written)),
    )
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == ""
    markdown = written.read_text()
    assert markdown.startswith("# DLQ report")
    rows = [line for line in markdown.splitlines() if line.startswith("|")]
    assert any("onion-checkout-dlq" in row and "| 4 " in row for row in rows), markdown
    assert any(CAPTURE in row and "| 3 " in row for row in rows), markdown
    assert any(REFUND in row and "| 1 " in row for row in rows), markdown
    assert "onion-progress" not in markdown, "only the config file's families"
    assert not list(tmp_path.glob(".report.md*")), "written atomically, no temporary left"

    status = ok_json(redrive(server, "status", "--json"))
    rows_by_family = {r["family"]: r for r in status["families"]}
    assert rows_by_family["checkout"]["dlq_counts"] == {"visible": 4, "in_flight": 0, "delayed": 0}
    assert rows_by_family["progress"]["dlq_counts"]["visible"] == 2
    assert rows_by_family["default"]["dlq_counts"]["visible"] == 0
    assert rows_by_family["checkout"]["queue_counts"] == {
        "visible": 0,
        "in_flight": 0,
        "delayed": 0,
    }
    assert rows_by_family["checkout"]["dlq_retention_seconds"] == 14 * 86400
    assert all(r["error"] is None for r in status["families"])
    # Neither report nor status changed anything.
    assert checkout.depth() == (4, 0) and progress.depth() == (2, 0)


# -- 3. move: dry run, one task, rerun ---------------------------------------------------------


def test_move_one_task_sends_each_message_once_byte_identical(
    checkout: Family, server: MotoServer, tmp_path: Path
) -> None:
    rng = random.Random(3)
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
    duplicate = capture[0]  # a second copy of one publish (the same bytes)
    expired = celery(CAPTURE, 2, expired=True)
    others = [*(celery(REFUND) for _ in range(5)), *(celery(IBFT, 1) for _ in range(3))]
    dead = [*capture, duplicate, expired, *others, *odd_bodies()]
    rng.shuffle(dead)
    fill(checkout, dead)
    total = len(dead)
    ledger = tmp_path / "ledger.sqlite3"

    plan = ok_json(
        redrive(server, "move", "checkout", "--task", CAPTURE, "--ledger", str(ledger), "--json")
    )
    assert plan["dry_run"] is True
    assert plan["moved"] == len(capture)
    assert plan["skipped_by_reason"] == {"expired": 1}
    # A dry run deletes nothing: it names the copy it would delete (issue 11).
    assert plan["duplicates_to_delete"] == 1 and plan["duplicates_deleted"] == 0
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


def odd_bodies_of(dead: Iterable[Dead]) -> list[Dead]:
    return [d for d in dead if d.task == UNKNOWN]


# -- 4. SIGKILL mid-run ------------------------------------------------------------------------

MOVE = ("move", "checkout", "--execute", "--yes", "--json")


def move_watched(
    server: MotoServer, family: Family, ledger: Path, *args: str, out: Path
) -> tuple[int, dict[str, Any]]:
    """``redrive move checkout --execute --yes --json --ledger LEDGER ARGS``, watched for hangs."""
    process = start_redrive(server, *MOVE, "--ledger", str(ledger), *args, out=out)
    watch([process], progress_of(family, ledger))
    code, stdout, stderr = finished(process, out)
    assert "Traceback" not in stderr, stderr
    assert code in (0, 3), (code, stdout, stderr)
    return code, json.loads(stdout)


def claimed_by_a_dead_run(family: Family, ledger: Path) -> tuple[Dead, str]:
    """One dead-lettered task whose key a dead run claimed; returns it and its key.

    What a SIGKILL between claim and send leaves: the key CLAIMED by a run that never
    ended, long stale (no heartbeat for an hour, lease long over, another host)."""
    from redrive.keys import key_for
    from redrive.ledger import Claim, SqliteLedger
    from redrive.messages import decode

    task = celery(CAPTURE)
    fill(family, [task])
    long_ago = time.time() - 3600
    with SqliteLedger(ledger, clock=lambda: long_ago) as book:
        book.start_run("dead-run", command="redrive move", info={"host": "elsewhere", "pid": 1})
        key = key_for(
            decode(task.body), message_id="-", generation=0, body=task.body, namespace="sqs"
        )
        book.claim_many("dead-run", [Claim(key, CAPTURE, "-", family.queue_url)])
    return task, key


def test_a_claim_left_by_a_dead_run_is_reported_in_doubt(
    checkout: Family, server: MotoServer, tmp_path: Path
) -> None:
    """Held in doubt and listed, not a hang.

    Regression: MoveEngine._process held self._lock (not reentrant) while calling
    self._is_live(), which takes it again, so any move meeting a key CLAIMED by another run
    (in doubt after a crash, or a second operator's live claim) hung forever.
    """
    ledger = tmp_path / "ledger.sqlite3"
    task, key = claimed_by_a_dead_run(checkout, ledger)
    # A healthy run takes about 3 s (two empty 1 s long polls end its scan).
    result = redrive(server, *MOVE, "--ledger", str(ledger), timeout=120)
    data = ok_json(result, 3)
    assert data["in_doubt"] == 1 and data["moved"] == 0
    [listed] = data["in_doubt_messages"]
    assert (listed["task"], listed["task_id"], listed["key"]) == (CAPTURE, task.ident, key)
    assert checkout.depth() == (1, 0), "held in doubt: it stays in the DLQ, visible"
    assert checkout.depth(checkout.queue_url) == (0, 0)


def test_a_dry_run_exits_0_even_when_it_finds_in_doubt_keys(
    checkout: Family, server: MotoServer, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.sqlite3"
    task, _ = claimed_by_a_dead_run(checkout, ledger)
    result = redrive(server, "move", "checkout", "--ledger", str(ledger), "--json", timeout=120)
    assert "Traceback" not in result.stderr
    data = json.loads(result.stdout)
    # The plan reports the in-doubt task (that part works)...
    assert data["dry_run"] is True and data["in_doubt"] == 1
    assert data["in_doubt_messages"][0]["task_id"] == task.ident
    assert checkout.depth() == (1, 0)
    # ...but a dry run failed nothing: it must exit 0.
    assert result.returncode == 0, (result.returncode, result.stderr)


@pytest.mark.parametrize(
    ("step", "landed"),
    [("claimed", 0), ("sent", 1)],
    ids=["between-claim-and-send", "between-send-and-record"],
)
def test_sigkill_mid_run_then_reruns_lose_nothing_and_double_only_explicit_resends(
    checkout: Family, server: MotoServer, tmp_path: Path, step: str, landed: int
) -> None:
    """SIGKILLed at the fourth batch's ``step``: its keys CLAIMED, their send not recorded
    (the in-doubt window), and SQS holding ``landed`` copies of each (``claimed``: the send
    was never made; ``sent``: SQS answered, the ledger had not recorded it)."""
    rng = random.Random(4)
    tasks = [celery(rng.choice((CAPTURE, REFUND, IBFT)), rng.choice((1, 2, 2))) for _ in range(278)]
    # Two bodies that are not Celery tasks go too (--include-unknown), so that every message
    # is sent or in doubt: nothing else is held to the end of the killed scan.
    unique = [*tasks, *odd_bodies()[:2]]
    everything = "--include-unknown"
    copies = rng.sample(tasks, 20)  # second copies of those publishes
    dead = [*unique, *copies]
    rng.shuffle(dead)
    fill(checkout, dead)
    sent = by_body(dead)
    ledger = tmp_path / "ledger.sqlite3"

    points = KillPoints(tmp_path / "kill", At(f"move.{step}", nth=4))
    victim = start_redrive(
        server,
        *MOVE,
        everything,
        "--lease",
        "2",
        "--ledger",
        str(ledger),
        out=tmp_path / "kill",
        points=points,
    )
    try:
        assert victim.wait(120) == -signal.SIGKILL
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(10)
    assert points.note() is not None
    killed_at = ledger_states(ledger)
    # One batch of at most 10 claimed (a batch's copies of keys it claims are not claimed);
    # the three before it sent and done (deleting a batch's copies may leave some SENT).
    assert 0 < killed_at["claimed"] <= 10, killed_at
    assert 0 < killed_at["done"] + killed_at["sent"] <= 30, killed_at
    in_flight = arrivals(checkout, sent)
    assert (
        sum(in_flight.values())
        == killed_at["done"] + killed_at["sent"] + landed * killed_at["claimed"]
    ), (in_flight, killed_at)

    # The killed run's batch comes back when its 2 s lease runs out.
    wait_for(lambda: checkout.depth()[1] == 0, timeout=90, every=0.2, what="the lease to end")

    # The rerun moves everything else, holds what is in doubt and lists it.
    code, held = move_watched(server, checkout, ledger, everything, out=tmp_path / "held")
    assert code == 3, held
    assert held["failed"] == 0 and held["still_hidden"] == 0
    assert held["in_doubt"] == len(held["in_doubt_messages"]) >= killed_at["claimed"]
    # Each key the kill left claimed, and no other (a second copy of one is listed too).
    assert len({m["key"] for m in held["in_doubt_messages"]}) == killed_at["claimed"]
    left = dlq_messages(checkout)
    assert set(left) == {m["message_id"] for m in held["in_doubt_messages"]}
    in_doubt: set[str] = set()
    for listed in held["in_doubt_messages"]:
        original = sent[left[listed["message_id"]]]
        assert listed["task"] == original.task
        assert listed["task_id"] == (original.ident if original.task != UNKNOWN else None)
        assert listed["key"]
        in_doubt.add(original.ident)
    assert checkout.depth() == (len(left), 0), "held in doubt: visible in the DLQ"

    # So far every task arrived exactly once, except the in-doubt ones: exactly as often as
    # the kill point says (their send landed before the kill, or was never made).
    got = in_flight + arrivals(checkout, sent)
    expected = {d.ident for d in unique}
    assert set(got) <= expected
    assert {i for i in expected - in_doubt if got[i] != 1} == set(), "each task exactly once"
    assert {i: got[i] for i in in_doubt} == {i: landed for i in in_doubt}
    before = Counter(got)

    # The operator resends them explicitly: each arrives once more, and nothing else does.
    code, resent = move_watched(
        server, checkout, ledger, everything, "--in-doubt", "resend", out=tmp_path / "re"
    )
    assert code == 0, resent
    assert resent["in_doubt"] == 0 and resent["failed"] == 0
    assert resent["moved"] == len(in_doubt)
    after = arrivals(checkout, sent)
    assert after == Counter({i: 1 for i in in_doubt})
    got += after
    for ident in in_doubt:
        assert got[ident] == before[ident] + 1 == landed + 1
    assert checkout.depth() == (0, 0), "the DLQ is empty"
    assert {i for i in expected if got[i] == 0} == set(), "nothing lost"
    assert ledger_states(ledger) == Counter({"done": len(unique)})


def test_a_killed_run_hides_what_it_held_for_about_its_lease_then_a_rerun_sees_it_all(
    checkout: Family, server: MotoServer, tmp_path: Path
) -> None:
    """Issue 11: after a SIGKILL of `move --execute --lease 4`, the 20-30 messages it kept
    hidden (not selected) stayed in flight for over 90 s: their holds were sized for a whole
    scan (120 s at least), and a rerun scanned 0. A live run now renews short holds, so a
    dead one's end within about its lease."""
    rng = random.Random(11)
    dead = [celery(CAPTURE) for _ in range(30)] + [celery(REFUND) for _ in range(30)]
    rng.shuffle(dead)
    fill(checkout, dead)
    ledger = tmp_path / "ledger.sqlite3"
    lease = 4
    # The run stays alive at its third batch's claim (its worker waits there for good) while
    # its renewing thread renews the holds; stopped after the second renewal, it has held
    # the messages it kept (the refunds of two batches) past their receive's own hold.
    points = KillPoints(
        tmp_path / "kill",
        At("move.claimed", nth=3, do="hang"),
        At("broker.extend", nth=2, do="stop"),
    )
    victim = start_redrive(
        server,
        *MOVE,
        "--task",
        CAPTURE,
        "--lease",
        str(lease),
        "--ledger",
        str(ledger),
        out=tmp_path / "victim",
        points=points,
    )
    try:
        renewed = points.wait_for_note(1)
        wait_until_stopped(victim.pid)
        assert points.note(0) is not None, "renewed while its worker waited at the claim"
        assert renewed["entries"] >= 5, renewed
        assert checkout.depth(checkout.queue_url)[0] >= 3, "the first captures moved"
        assert checkout.depth()[1] >= 5, "held messages"
        victim.send_signal(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(10)
    # Its last renewal gave `lease` seconds (more only if its renewals were slow: see
    # hold_seconds, and test_scan's test of a killed run on a hand-wound clock); its batch in
    # flight had `lease` too. The bug held them 120 s at least: 90 s is far from both.
    wait_for(lambda: checkout.depth()[1] == 0, timeout=90, every=0.2, what="the holds")
    left = checkout.depth()[0]
    assert left > 30, "the refunds, and the captures it had not moved yet"
    seen = ok_json(redrive(server, "inspect", "checkout", "--json", timeout=60))
    assert (seen["total"], seen["hidden_before"], seen["incomplete"]) == (left, 0, False)


# -- 5. two operators at once ------------------------------------------------------------------


def test_two_operators_at_once_send_each_task_once(tmp_path: Path) -> None:
    serial = start_moto_server(tmp_path / "server.log", serial=True)
    try:
        checkout = make_family(serial.client(), "onion-checkout")
        rng = random.Random(5)
        unique = [celery(rng.choice((CAPTURE, REFUND)), rng.choice((1, 2))) for _ in range(170)]
        copies = unique[:10] * 3  # more copies of those publishes
        dead = [*unique, *copies]
        rng.shuffle(dead)
        fill(checkout, dead)
        ledger = tmp_path / "shared-ledger.sqlite3"

        outs = [tmp_path / "op1", tmp_path / "op2"]
        runs = [start_redrive(serial, *MOVE, "--ledger", str(ledger), out=out) for out in outs]
        # One request at a time: two long polls can hold the server for 2 s.
        watch(runs, progress_of(checkout, ledger))
        results = []
        for run, out in zip(runs, outs, strict=True):
            code, stdout, stderr = finished(run, out)
            assert code == 0, (code, stdout, stderr)
            assert "Traceback" not in stderr
            results.append(json.loads(stdout))
        assert all(r["failed"] == 0 and r["in_doubt"] == 0 for r in results)
        assert all(r["moved"] > 0 for r in results), "both operators did part of the work"
        assert sum(r["moved"] for r in results) == len(unique)

        got = arrivals(checkout, by_body(dead))
        assert got == Counter({d.ident: 1 for d in unique}), "every task exactly once"
        # A copy one operator skipped as claimed-by-another-run (the other was sending that
        # task) stays in the DLQ, visible: only second copies of tasks that arrived.
        left = dlq_bodies(checkout)
        busy = sum(r["skipped_by_reason"].get("claimed-by-another-run", 0) for r in results)
        # (The other operator may still have received and deleted such a copy afterwards.)
        assert sum(left.values()) <= busy
        assert all(by_body(dead)[body].ident in got for body in left)
        assert checkout.depth() == (sum(left.values()), 0)
    finally:
        serial.process.terminate()
        serial.process.wait(10)
    log = (tmp_path / "server.log").read_text(errors="replace")
    assert '"POST / HTTP/1.1" 200' in log, "the server logs every request"
    assert " 500 " not in log


# -- 6. Ctrl-C ---------------------------------------------------------------------------------


def test_ctrl_c_stops_cleanly_and_a_rerun_finishes(
    checkout: Family, server: MotoServer, tmp_path: Path
) -> None:
    rng = random.Random(6)
    unique = [celery(CAPTURE, rng.choice((1, 2))) for _ in range(95)]
    copies = unique[:5]  # second copies of those publishes
    dead = [*unique, *copies]
    rng.shuffle(dead)
    fill(checkout, dead)
    ledger = tmp_path / "ledger.sqlite3"
    move = ("move", "checkout", "--execute", "--yes", "--ledger", str(ledger))

    run = start_redrive(server, *move, "--rate", "20", "--json", out=tmp_path / "int")
    try:
        wait_for(
            lambda: checkout.depth(checkout.queue_url)[0] >= 10,
            timeout=120,
            every=0.05,
            what="the first messages moved",
        )
        run.send_signal(signal.SIGINT)
        # Stopped early is what `moved` below says; the bound is for a hang only.
        code, out, err = finished(run, tmp_path / "int", timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)
    assert code == 130, (code, out, err)
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


# -- 7. the sandbox command --------------------------------------------------------------------


@dataclass
class RunningSandbox:
    process: subprocess.Popen[bytes]
    port: int
    exports: dict[str, str]
    lines: list[str]
    """What it printed on stdout."""
    env: dict[str, str]
    """A shell's environment after pasting those lines."""
    err: Path


@contextlib.contextmanager
def running_sandbox(tmp_path: Path, *args: str) -> Iterator[RunningSandbox]:
    """``redrive sandbox`` as a user starts it; stopped with Ctrl-C (SIGINT) at the end."""
    port = free_port()
    out, err = tmp_path / "sandbox.out", tmp_path / "sandbox.err"
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    with out.open("w") as stdout, err.open("w") as stderr:
        sandbox = subprocess.Popen(
            # Seeded: what the tests read of it never depends on a draw (issue 37).
            [*REDRIVE, "sandbox", "--port", str(port), "--seed", "7", *args],
            env={**_env(None), "TMPDIR": str(temp)},
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
        lines = out.read_text().splitlines()
        exports = dict(
            line.removeprefix("export ").split("=", 1)
            for line in lines
            if line.startswith("export ")
        )
        unset = {name for line in lines if line.startswith("unset ") for name in line.split()[1:]}
        # What a shell that pasted those lines has (this test's AWS config files stay absent).
        env = {k: v for k, v in _env(None).items() if k not in unset} | exports
        yield RunningSandbox(sandbox, port, exports, lines, env, err)
        sandbox.send_signal(signal.SIGINT)
        assert sandbox.wait(10) == 0
    finally:
        if sandbox.poll() is None:
            sandbox.kill()
            sandbox.wait(10)
    assert "Traceback" not in err.read_text()


def test_sandbox_command_serves_a_seeded_sqs_until_ctrl_c(tmp_path: Path) -> None:
    with running_sandbox(tmp_path, "--messages", "10") as sandbox:
        exports = sandbox.exports
        assert exports["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{sandbox.port}"
        assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"} <= set(exports)
        assert "unset AWS_PROFILE" in sandbox.lines
        assert "unset REDRIVE_LEDGER" in sandbox.lines
        # A state directory of its own, fresh, in the temporary directory: not the user's.
        state_dir = Path(exports["REDRIVE_STATE_DIR"])
        assert state_dir.parent == tmp_path / "tmp" and state_dir.is_dir()
        assert str(state_dir) != _env(None)["REDRIVE_STATE_DIR"]
        assert str(state_dir) in sandbox.err.read_text()
        env = sandbox.env

        status = ok_json(redrive(None, "status", "--json", env=env))
        counts = {r["family"]: r["dlq_counts"]["visible"] for r in status["families"]}
        assert counts == {"checkout": 10, "default": 10, "progress": 10}

        inspected = ok_json(redrive(None, "inspect", "checkout", "--json", env=env))
        assert inspected["total"] == 10
        assert sum(g["count"] for g in inspected["groups"]) == 10
        assert {g["task"] for g in inspected["groups"]} <= {IBFT, CAPTURE, REFUND, UNKNOWN}

        moved = ok_json(redrive(None, "move", "checkout", "--execute", "--yes", "--json", env=env))
        assert moved["moved"] > 0
        assert (state_dir / "ledger.sqlite3").exists()  # the sandbox's ledger, not the user's
    assert not state_dir.exists()  # removed when the sandbox stopped
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", sandbox.port), timeout=1):
        pass


def test_native_move_and_tasks_on_the_sandbox(tmp_path: Path) -> None:
    """``move --native`` and ``tasks`` rehearse on the sandbox: its SQS has message move
    tasks (moto 5.2's server answers them with an HTML 500 page)."""
    with running_sandbox(tmp_path, "--messages", "25") as sandbox:
        env = sandbox.env
        moved = ok_json(
            redrive(None, "move", "checkout", "--native", "--execute", "--yes", "--json", env=env)
        )
        assert moved["native"] is True
        assert moved["status"] == "COMPLETED"
        assert moved["moved"] == moved["to_move"] == 25
        status = ok_json(redrive(None, "status", "--json", env=env))
        checkout = next(r for r in status["families"] if r["family"] == "checkout")
        assert checkout["dlq_counts"]["visible"] == 0
        assert checkout["queue_counts"]["visible"] == 25
        listed = ok_json(redrive(None, "tasks", "checkout", "--json", env=env))
        assert [t["status"] for t in listed["tasks"]] == ["COMPLETED"]
        table = redrive(None, "tasks", "checkout", env=env)
        assert table.returncode == 0 and "COMPLETED" in table.stdout
        nothing = redrive(None, "tasks", "checkout", "--cancel", env=env)
        assert nothing.returncode == 1
        assert nothing.stderr.strip().count("\n") == 0
        assert "no move task is running" in nothing.stderr


def test_an_endpoint_without_move_tasks_is_one_line(server: MotoServer) -> None:
    """Stock moto (the suite's server) answers ListMessageMoveTasks with an HTML 500 page:
    redrive says so in one line, never prints the page."""
    make_family(server.client(), "onion-checkout")
    for args in (["tasks", "checkout"], ["move", "checkout", "--native"]):
        done = redrive(server, *args)
        if args[0] == "move":  # the dry run only informs: it names the problem, exits 0
            assert done.returncode == 0, done.stderr
            text = done.stdout + done.stderr
        else:
            assert done.returncode == 1, done.stdout + done.stderr
            assert len(done.stderr.strip().splitlines()) == 1, done.stderr
            text = done.stderr
        assert "HTTP 500 with an HTML page (500 Internal Server Error)" in text
        assert "<" not in text and "Traceback" not in text


# -- 8. errors end to end ----------------------------------------------------------------------


def test_unreachable_endpoint_is_one_line_exit_1_without_traceback(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    endpoint = f"http://127.0.0.1:{port}"
    from_env = _env(None)
    from_env["AWS_ENDPOINT_URL"] = endpoint
    commands = {
        "status": (["--endpoint-url", endpoint, "status"], _env(None)),
        "move": (
            ["--endpoint-url", endpoint, "move", "checkout", "--execute", "--yes"],
            _env(None),
        ),
        "inspect (AWS_ENDPOINT_URL)": (["inspect", "checkout", "--json"], from_env),
    }
    # All at once: each is independent, and this keeps the test to one interpreter start.
    # How long redrive waits on purpose for a dead endpoint is test_cli's (its backoff,
    # recorded): here three interpreters start, which a loaded machine may take long to do.
    running = {
        name: subprocess.Popen(
            [*REDRIVE, *args],
            env=env,
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        for name, (args, env) in commands.items()
    }
    try:
        outputs = {name: p.communicate(timeout=120) for name, p in running.items()}
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
                process.wait(10)
    for name, (stdout, stderr) in outputs.items():
        assert running[name].returncode == 1, (name, stdout, stderr)
        assert "Traceback" not in stderr, name
        lines = stderr.strip().splitlines()
        assert len(lines) == 1, (name, stderr)
        assert f"127.0.0.1:{port}" in lines[0] and "cannot reach" in lines[0], (name, stderr)
        assert stdout == "", name


# -- a reader that leaves early ------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("status",),
        ("move", "checkout"),
        ("move", "checkout", "--json"),
        ("move", "checkout", "--execute", "--yes"),
        ("--help",),
    ],
)
def test_a_closed_pipe_on_stdout_is_not_an_error(
    families: dict[str, Family], server: MotoServer, args: tuple[str, ...]
) -> None:
    """``redrive move checkout | head -1``: the reader may go before redrive writes. A pipe
    whose read end is closed before redrive starts makes every write meet it, every time."""
    fill(families["checkout"], [celery(CAPTURE, 2) for _ in range(3)])
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [*REDRIVE, *args],
            env=_env(server),
            cwd=ROOT,
            stdout=write_end,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_end)
    if "--execute" not in args:
        assert (done.returncode, done.stderr.strip()) == (0, ""), "no error, no traceback"
        return
    # The reader left before the summary: the move still finished, each task sent once.
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    checkout = families["checkout"]
    assert (checkout.depth(checkout.queue_url), checkout.depth()) == ((3, 0), (0, 0))
