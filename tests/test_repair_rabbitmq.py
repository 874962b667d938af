"""Repair on RabbitMQ (issue 26, item 5): ``redrive --broker URL move FAMILY --set ...`` on a
private node, its DLQ filled by RabbitMQ's own dead-lettering of Celery's messages (protocol 2
as Celery publishes it on RabbitMQ, and protocol 1 from a real Celery producer with
``task_protocol=1``). A Delivery's body is kombu's JSON envelope of the AMQP message
(redrive/broker/rabbitmq/envelope.py), so the repair code is the one SQS uses; these tests
prove it byte for byte on the wire: the dry run changes nothing, the executed move sends the
edited body with every other header and property as it was, the archive gives the originals
back, the ledger stops a rerun with another edit, a SIGKILL loses and doubles nothing."""

from __future__ import annotations

import json
import os
import shlex
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import amqp
import celery
import pytest
from celery_worker import celery_worker
from kill_points import KillPoints
from test_rabbitmq_e2e import KILLED_AT_ACK, drain, killed, ok_json, redrive, task_ids

from redrive import attributes
from redrive.archive import read_records
from redrive.broker.rabbitmq.envelope import envelope_of, unpacked
from redrive.repair import Edit, edits_from_options, repair
from redrive.sandbox.rabbitmq_layout import (
    RabbitFamily,
    celery_message,
    dead_letter,
    declare_layout,
    fill_layout,
    open_connection,
    rabbit_families,
    raw_channel,
)
from redrive.sandbox.rabbitmq_node import Vhost

pytestmark = pytest.mark.e2e

# Commands and their rendering: on RabbitMQ 4.0, the version users run (issue 39); the broker's
# own behaviour is tested on both (tests/test_rabbitmq_versions.py, tests/conftest.py).
RABBITMQ_VERSIONS = ("4.0",)

TASK = "apps.payments.tasks.capture_payment"
DLQ, QUEUE = "onion-checkout-dlq", "onion-checkout"
SCRATCH = "celery-producer"
"""A queue of Celery's own declaring (it declares the queue it sends to without arguments: on
onion-checkout, which has a DLX, that is a 406): its messages are then dead-lettered."""
WORDS = ["--set", 'kwargs.currency="USD"', "--clear-expires"]
EDITS = edits_from_options(sets=['kwargs.currency="USD"'], clear_expires=True)
MARKS = {attributes.COUNT, attributes.KEY, attributes.SOURCE_DLQ}


def checkout() -> RabbitFamily:
    return rabbit_families()[0]


def celery_published(vhost: Vhost, protocol: int, calls: list[tuple[Any, ...]]) -> list[Any]:
    """Each (args, kwargs, expires) of ``calls`` as a real Celery producer with
    ``task_protocol=protocol`` publishes it on RabbitMQ, taken back raw from its queue."""
    app = celery.Celery("producer", broker=vhost.amqp_url, set_as_current=False)
    app.conf.task_protocol = protocol
    try:
        for args, kwargs, expires in calls:
            app.send_task(TASK, args=args, kwargs=kwargs, queue=SCRATCH, expires=expires)
    finally:
        app.close()
    connection = open_connection(vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        got = []
        while (message := channel.basic_get(SCRATCH, no_ack=True)) is not None:
            got.append(amqp.Message(message.body, **message.properties))
        assert len(got) == len(calls)
        return got
    finally:
        connection.close()


def fill(vhost: Vhost) -> list[amqp.Message]:
    """The checkout DLQ, dead-lettered by RabbitMQ: 3 protocol-2 tasks written before a fix
    (currency in lower case; one whose ``expires`` passed while it sat, its AMQP TTL still an
    hour then), 2 protocol-1 tasks from Celery itself (one with an ``expires``). Returns the
    DLQ's messages as they are before redrive touches them."""
    now = datetime.now(UTC)
    p2 = [
        celery_message(TASK, [n], {"amount_cents": n, "currency": "usd"}, task_id=f"p2-{n}")
        for n in range(2)
    ]
    p2.append(
        celery_message(
            TASK,
            [2],
            {"amount_cents": 2, "currency": "usd"},
            task_id="p2-late",
            expires=now - timedelta(minutes=5),
            now=now - timedelta(hours=1),
        )
    )
    p1 = celery_published(
        vhost,
        1,
        [
            ([10], {"amount_cents": 10, "currency": "usd"}, None),
            ([11], {"amount_cents": 11, "currency": "usd"}, now + timedelta(hours=1)),
        ],
    )
    assert all("task" in json.loads(m.body) for m in p1)  # protocol 1: the task in the body
    connection = open_connection(vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        declare_layout(channel, [checkout()])
        channel.close()
        dead_letter(connection, checkout(), [*p2, *p1])
    finally:
        connection.close()
    return drain(vhost, DLQ)


def task_id_of(message: amqp.Message) -> str:
    headers = message.properties.get("application_headers") or {}
    if "id" in headers:
        return str(headers["id"])
    return str(json.loads(message.body)["id"])  # protocol 1


def expected_body(message: amqp.Message, edits: tuple[Edit, ...] = EDITS) -> bytes:
    """The AMQP body the edits should give: the envelope repaired, opened again."""
    done = repair(envelope_of(message.body, message.properties), edits)
    assert done.changed
    return unpacked(done.body, {})[0]


def test_repair_on_rabbitmq_dry_run_execute_archive_replay_and_ledger(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    before = fill(rabbitmq_vhost)
    assert len(before) == 5
    # Dead-lettering moved Celery's AMQP expiration into x-death.
    late = next(m for m in before if task_id_of(m) == "p2-late")
    assert "expiration" not in late.properties
    assert late.properties["application_headers"]["x-death"][0]["original-expiration"]
    ledger, archive = tmp_path / "ledger.sqlite3", tmp_path / "originals.jsonl.gz"
    common = ["--ledger", str(ledger), "--json"]

    dry = ok_json(
        redrive(rabbitmq_vhost, "move", "checkout", *WORDS, "--archive", str(archive), *common)
    )
    assert dry["dry_run"] is True and dry["moved"] == 5
    assert dry["repair"]["changed"] == 5 and dry["repair"]["archived"] == 0
    assert "kwargs.currency: … → …" in dry["repair"]["samples"][TASK][0]
    shown = redrive(rabbitmq_vhost, "move", "checkout", *WORDS, "--show-args")
    assert shown.returncode == 0, shown.stderr
    assert 'kwargs.currency: "usd" → "USD"' in shown.stdout
    assert [m.body for m in drain(rabbitmq_vhost, DLQ)] == [m.body for m in before]
    assert drain(rabbitmq_vhost, QUEUE) == [] and not archive.exists()

    done = ok_json(
        redrive(
            rabbitmq_vhost,
            "move",
            "checkout",
            *WORDS,
            "--archive",
            str(archive),
            "--execute",
            "--yes",
            *common,
        )
    )
    assert (done["moved"], done["repair"]["changed"], done["repair"]["archived"]) == (5, 5, 5)
    assert drain(rabbitmq_vhost, DLQ) == []
    sent = {task_id_of(m): m for m in drain(rabbitmq_vhost, QUEUE)}
    originals = {task_id_of(m): m for m in before}
    assert set(sent) == set(originals)
    for task_id, original in originals.items():
        copy = sent[task_id]
        # The AMQP body is the edited JSON, as Celery would write it.
        assert copy.body == expected_body(original)
        content = json.loads(copy.body)
        kwargs = content[1] if isinstance(content, list) else content["kwargs"]
        assert kwargs["currency"] == "USD"
        if isinstance(content, dict):
            assert content["expires"] is None  # protocol 1: the body's field
        # Every property as it was; nothing re-adds an expiration.
        props, theirs = dict(copy.properties), dict(original.properties)
        headers, their_headers = props.pop("application_headers"), theirs.pop("application_headers")
        assert "expiration" not in props
        assert props == theirs
        # Every header as it was (x-death, with its original-expiration, included) but the
        # ones the edit touches (protocol 2's expires, now None, and the arguments' reprs)
        # and redrive's own marks.
        assert set(headers) - set(their_headers) == MARKS
        assert list(their_headers) == [k for k in headers if k not in MARKS]
        for name, value in their_headers.items():
            if name == "expires":
                assert headers[name] is None
            elif name in ("argsrepr", "kwargsrepr"):  # Celery's reprs follow the arguments
                assert headers[name] == value.replace("'usd'", "'USD'"), name
            else:
                assert headers[name] == value, name
    # The archive holds every original, as the DLQ held it.
    records = list(read_records(str(archive)))
    assert sorted(r.body for r in records) == sorted(
        envelope_of(m.body, m.properties) for m in before
    )

    # Replaying the archive into the DLQ gives the original bodies back byte-identical (the
    # one whose expires passed too: --include-expired).
    replayed = ok_json(
        redrive(
            rabbitmq_vhost,
            "replay",
            str(archive),
            "--to",
            DLQ,
            "--include-expired",
            "--execute",
            "--yes",
            "--ledger",
            str(tmp_path / "replay.sqlite3"),
            "--json",
        )
    )
    assert replayed["replayed"] == 5, replayed
    back = drain(rabbitmq_vhost, DLQ)
    assert Counter(m.body for m in back) == Counter(m.body for m in before)
    for message in back:
        original = originals[task_id_of(message)]
        headers = dict(message.properties["application_headers"])
        assert {k: v for k, v in headers.items() if k not in MARKS} == dict(
            original.properties["application_headers"]
        )


def edit(word: str, archive: Path) -> list[str]:
    return ["--set", f'kwargs.repaired="{word}"', "--archive", str(archive)]


def test_a_sigkill_of_an_edited_move_loses_and_doubles_nothing(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """Killed at its first ack (a batch confirmed and recorded SENT, its DLQ copies not yet
    acked, as tests/test_rabbitmq_e2e.py): the rerun, with another edit, only acks those (the
    ledger knows them sent with the first edit) and sends the rest with its own; each task
    in the source once; the archives hold every original."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families()[:1], 150)
    before = drain(rabbitmq_vhost, DLQ)
    ledger = tmp_path / "ledger.sqlite3"
    first, second = tmp_path / "a1.jsonl.gz", tmp_path / "a2.jsonl.gz"
    args = ["move", "checkout", "--create", "--execute", "--yes", "--json", "--ledger", str(ledger)]
    killed(
        rabbitmq_vhost, KillPoints(tmp_path / "kill", KILLED_AT_ACK), *args, *edit("first", first)
    )
    assert sum(task_ids(drain(rabbitmq_vhost, QUEUE)).values()) == 100
    assert task_ids(drain(rabbitmq_vhost, DLQ)) == task_ids(before)

    data = ok_json(redrive(rabbitmq_vhost, *args, *edit("second", second)))
    assert data["moved"] == 50, data
    source = drain(rabbitmq_vhost, QUEUE)
    assert task_ids(source) == task_ids(before), "each task in the source exactly once"
    marks = Counter(json.loads(m.body)[1]["repaired"] for m in source)
    assert marks == Counter({"first": 100, "second": 50})
    assert drain(rabbitmq_vhost, DLQ) == []
    archived = {r.body for p in (first, second) if p.exists() for r in read_records(str(p))}
    assert {envelope_of(m.body, m.properties) for m in before} <= archived


# -- a real Celery worker on RabbitMQ runs each repaired task once --------------------------------

WORKER_APP = """
import json, os
from celery import Celery
from kombu import Queue

app = Celery("repair_rmq", broker=os.environ["E2E_BROKER"])
app.conf.update(
    task_queues=[Queue("onion-checkout", queue_arguments=json.loads(os.environ["E2E_ARGS"]))],
    broker_connection_retry_on_startup=True,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    task_ignore_result=True,
)


# The handler as deployed now: amount_cents (it was amount), the currency in capitals.
@app.task(bind=True, name="apps.payments.tasks.capture_payment")
def capture_payment(self, order_id, amount_cents, currency="USD"):
    if currency != currency.upper():
        raise ValueError(f"bad currency {currency!r}")
    line = json.dumps({"id": self.request.id, "args": list(self.request.args),
                       "kwargs": self.request.kwargs})
    fd = os.open(os.environ["E2E_RUNS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\\n").encode())
    finally:
        os.close(fd)
"""


def fill_for_worker(vhost: Vhost) -> list[amqp.Message]:
    """Tasks written before a deploy renamed ``amount`` to ``amount_cents`` (the currency in
    lower case, too), from real Celery producers of protocols 1 and 2 (one of each with an
    ``expires``), and one whose ``expires`` passed while it sat in the DLQ; dead-lettered."""
    now = datetime.now(UTC)
    messages = []
    for protocol in (1, 2):
        base = 100 * protocol
        messages += celery_published(
            vhost,
            protocol,
            [
                ([base], {"amount": base, "currency": "usd"}, None),
                ([base + 1], {"amount": base + 1, "currency": "eur"}, now + timedelta(hours=1)),
            ],
        )
    messages.append(
        celery_message(
            TASK,
            [300],
            {"amount": 300, "currency": "usd"},
            task_id="p2-late",
            expires=now - timedelta(minutes=5),
            now=now - timedelta(hours=1),
        )
    )
    connection = open_connection(vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        declare_layout(channel, [checkout()])
        channel.close()
        dead_letter(connection, checkout(), messages)
    finally:
        connection.close()
    return drain(vhost, DLQ)


def test_a_real_celery_worker_runs_each_repaired_task_once_with_its_new_arguments(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    before = fill_for_worker(rabbitmq_vhost)
    assert len(before) == 5
    words = [
        "--rename", "kwargs.amount=kwargs.amount_cents",
        "--set", 'kwargs.currency="USD"',
        "--clear-expires",
    ]  # fmt: skip
    ledger, archive = tmp_path / "ledger.sqlite3", tmp_path / "originals.jsonl.gz"
    done = ok_json(
        redrive(
            rabbitmq_vhost,
            "move",
            "checkout",
            *words,
            "--archive",
            str(archive),
            "--ledger",
            str(ledger),
            "--execute",
            "--yes",
            "--json",
        )
    )
    assert (done["moved"], done["repair"]["archived"]) == (5, 5), done
    again = ok_json(
        redrive(
            rabbitmq_vhost,
            "move",
            "checkout",
            *words,
            "--ledger",
            str(ledger),
            "--execute",
            "--yes",
            "--json",
            "--no-archive",
        )
    )
    assert again["moved"] == 0

    (tmp_path / "repair_rmq.py").write_text(WORKER_APP)
    runs = tmp_path / "runs.jsonl"
    env = {
        **os.environ,
        "E2E_BROKER": rabbitmq_vhost.amqp_url,
        "E2E_ARGS": json.dumps(checkout().queue_arguments()),
        "E2E_RUNS": str(runs),
    }
    log = tmp_path / "worker.log"

    def ran() -> list[dict[str, Any]]:
        text = runs.read_text() if runs.exists() else ""
        return [json.loads(line) for line in text.splitlines()]

    with celery_worker("repair_rmq", QUEUE, cwd=tmp_path, env=env, log=log) as worker:
        worker.wait_for(lambda: len(ran()) >= len(before), "the worker ran the repaired tasks")
        worker.wait_for(lambda: ready(rabbitmq_vhost) == 0, "the queue emptied", timeout=60)
        assert worker.stop_warm() == 0, worker.tail()
    edits = edits_from_options(
        renames=["kwargs.amount=kwargs.amount_cents"],
        sets=['kwargs.currency="USD"'],
        clear_expires=True,
    )
    expected = {}
    for message in before:
        body = expected_body(message, edits)
        content = json.loads(body)
        args, kwargs = (content[0], content[1]) if isinstance(content, list) else (
            content["args"], content["kwargs"]
        )  # fmt: skip
        assert kwargs["currency"] == "USD" and "amount" not in kwargs
        expected[task_id_of(message)] = {"args": args, "kwargs": kwargs}
    assert len(ran()) == len(before), log.read_text()[-3000:]
    assert {r["id"]: {"args": r["args"], "kwargs": r["kwargs"]} for r in ran()} == expected
    text = log.read_text()
    assert "revoked" not in text.lower() and "Traceback" not in text, text[-3000:]


def ready(vhost: Vhost) -> int:
    """How many messages of the source queue wait for a consumer."""
    connection = open_connection(vhost.amqp_url)
    try:
        return int(raw_channel(connection).queue_declare(QUEUE, passive=True).message_count)
    finally:
        connection.close()


def test_an_edited_dry_run_on_rabbitmq_says_what_becomes_of_each_changed_message(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """Issue 37: a dry run said `420 changed by the edits, 0 left in the DLQ` while 414 were
    poison and would stay; poison named no way out, and the printed command exited 2."""
    fresh = [
        celery_message(TASK, [n], {"amount_cents": n, "currency": "usd"}, task_id=f"f-{n}")
        for n in range(2)
    ]
    poison = []
    for n in range(3):
        message = celery_message(TASK, [n], {"currency": "usd"}, task_id=f"p-{n}")
        message.properties["application_headers"][attributes.COUNT] = 3
        poison.append(message)
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        declare_layout(channel, [checkout()])
        channel.close()
        dead_letter(connection, checkout(), [*fresh, *poison])
    finally:
        connection.close()
    ledger = tmp_path / "ledger.sqlite3"
    dry = redrive(rabbitmq_vhost, "move", "checkout", *WORDS, "--ledger", str(ledger))
    assert dry.returncode == 0, dry.stderr
    text = dry.stdout
    assert (
        "5 message(s) changed by the edits: 2 would move, 3 skipped (poison: 3), so they stay "
        "in the DLQ unedited" in text
    ), text
    assert "3 message(s) skipped as poison" in text and "--max-redrives N" in text
    # The printed command runs as it is (its archive named), and moves the two.
    command = shlex.split(text.split("to do it, run:\n", 1)[1].strip())
    assert command[0] == "redrive" and "--archive" in command
    archive = tmp_path / "originals.jsonl.gz"
    at = command.index("--archive")
    command[at + 1] = str(archive)  # the suggested path is relative to the test's cwd
    done = ok_json(redrive(rabbitmq_vhost, *command[1:], "--json"))
    assert done["moved"] == 2 and done["repair"]["became"] == {"moved": 2, "skipped:poison": 3}
    assert len(list(read_records(str(archive)))) == 2
