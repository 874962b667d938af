"""Every command on RabbitMQ (issue 24, item 3): ``archive``, ``purge``, ``replay``, a plan and
``apply``, ``--processes 2``, ``--result-backend``, ``report`` in every format and ``--post``,
and ``audit`` after RabbitMQ runs; the real ``redrive`` as a subprocess against a private node
(``rabbitmq_vhost``), its DLQs filled by RabbitMQ's own dead-lettering. Each test checks the
JSON keys the SQS tests check, and RabbitMQ's truth: what the queues hold afterwards, bodies
byte for byte, properties and headers kept, a DLQ left whole by every dry run."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import amqp
import pytest
from test_rabbitmq_e2e import ROOT, drain, ok_json, redrive, task_ids
from test_report_post import Recorder, hook  # noqa: F401  (the fixture)

from redrive import attributes
from redrive.archive import read_records
from redrive.broker.rabbitmq.envelope import envelope_of
from redrive.sandbox.rabbitmq_layout import (
    celery_message,
    dead_letter,
    fill_layout,
    open_connection,
    rabbit_families,
)
from redrive.sandbox.rabbitmq_node import Vhost

pytestmark = pytest.mark.e2e

# Commands and their rendering: on RabbitMQ 4.0, the version users run (issue 39); the broker's
# own behaviour is tested on both (tests/test_rabbitmq_versions.py, tests/conftest.py).
RABBITMQ_VERSIONS = ("4.0",)

DLQ, QUEUE = "onion-checkout-dlq", "onion-checkout"
CAPTURE = "apps.payments.tasks.capture_payment"
MARKS = {attributes.COUNT, attributes.KEY, attributes.SOURCE_DLQ}
"""redrive's own headers on what it sends."""


def fill(vhost: Vhost, count: int, families: int = 1) -> list[amqp.Message]:
    """The first ``families`` families of the layout, each DLQ dead-lettered ``count`` tasks;
    the checkout DLQ's messages as they are before redrive touches them."""
    fill_layout(vhost.amqp_url, rabbit_families()[:families], count)
    return drain(vhost, DLQ)


def task_id_of(message: amqp.Message) -> str:
    return str(message.properties["application_headers"]["id"])


def assert_sent_as_they_were(sent: list[amqp.Message], originals: list[amqp.Message]) -> None:
    """Each sent message is its original byte for byte: the body, every property, every
    header (x-death as RabbitMQ wrote it) and only redrive's own marks added; persistent."""
    assert task_ids(sent) == task_ids(originals), "each task once"
    by_id = {task_id_of(m): m for m in originals}
    for copy in sent:
        original = by_id[task_id_of(copy)]
        assert copy.body == original.body
        props, theirs = dict(copy.properties), dict(original.properties)
        headers, their_headers = props.pop("application_headers"), theirs.pop("application_headers")
        assert props == theirs and props["delivery_mode"] == 2
        assert set(headers) - set(their_headers) == MARKS
        assert {k: v for k, v in headers.items() if k not in MARKS} == their_headers


def assert_whole(vhost: Vhost, before: list[amqp.Message], queue: str = DLQ) -> None:
    """The DLQ holds what it held: the same messages, bodies and order."""
    assert [m.body for m in drain(vhost, queue)] == [m.body for m in before]


def audit(vhost: Vhost, ledger: Path, *args: str) -> Any:
    return ok_json(redrive(vhost, "audit", *args, "--ledger", str(ledger), "--json"))


# -- archive, purge, replay --------------------------------------------------------------------


def test_archive_and_purge_keep_every_original_and_replay_puts_them_back_byte_identical(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    before = fill(rabbitmq_vhost, 40)
    snapshot, archive = tmp_path / "snapshot.jsonl.gz", tmp_path / "purged.jsonl.gz"
    ledger = tmp_path / "ledger.sqlite3"
    originals = Counter(envelope_of(m.body, m.properties) for m in before)

    copied = ok_json(
        redrive(rabbitmq_vhost, "archive", "checkout", "--archive", str(snapshot), "--json")
    )
    assert (copied["archived"], copied["purged"], copied["scanned"]) == (40, 0, 40), copied
    assert Counter(r.body for r in read_records(str(snapshot))) == originals
    assert_whole(rabbitmq_vhost, before)

    purge = ["purge", "checkout", "--archive", str(archive), "--json"]
    dry = ok_json(redrive(rabbitmq_vhost, *purge))
    assert dry["dry_run"] is True
    assert (dry["matched"], dry["archived"], dry["purged"]) == (40, 0, 0), dry
    assert not archive.exists()
    assert_whole(rabbitmq_vhost, before)

    done = ok_json(redrive(rabbitmq_vhost, *purge, "--execute", "--yes", "--ledger", str(ledger)))
    assert done["dry_run"] is False
    assert (done["archived"], done["purged"], done["failed"]) == (40, 40, 0), done
    assert drain(rabbitmq_vhost, DLQ) == [] and drain(rabbitmq_vhost, QUEUE) == []
    # The archive holds each original once, as the DLQ held it (kombu's envelope of it).
    assert Counter(r.body for r in read_records(str(archive))) == originals

    replay = ["replay", str(archive), "--to", QUEUE, "--json"]
    would = ok_json(redrive(rabbitmq_vhost, *replay))
    assert would["dry_run"] is True and (would["replayed"], would["scanned"]) == (40, 40), would
    assert drain(rabbitmq_vhost, QUEUE) == []

    sent = ok_json(redrive(rabbitmq_vhost, *replay, "--execute", "--yes", "--ledger", str(ledger)))
    assert (sent["replayed"], sent["failed"], sent["in_doubt"]) == (40, 0, 0), sent
    assert_sent_as_they_were(drain(rabbitmq_vhost, QUEUE), before)

    again = ok_json(redrive(rabbitmq_vhost, *replay, "--execute", "--yes", "--ledger", str(ledger)))
    assert (again["replayed"], again["already_sent"]) == (0, 40), "twice sends nothing"
    assert task_ids(drain(rabbitmq_vhost, QUEUE)) == task_ids(before)

    runs = audit(rabbitmq_vhost, ledger)["runs"]
    assert [r["info"]["command_line"].split()[5] for r in runs] == ["replay", "replay", "purge"]
    assert {r["outcome"] for r in runs} == {"completed"}
    replayed_again, replayed, purged = runs
    # Who ran it, as the broker knows it: no AWS identity asked for, no password kept.
    masked = rabbitmq_vhost.amqp_url.replace(":guest@", ":***@")
    for run in runs:
        info = run["info"]
        assert (info["broker"], info["broker_user"]) == (masked, "guest")
        assert not {"aws_arn", "aws_error", "sqs_client"} & set(info), info
        assert masked in info["command_line"] and ":guest@" not in info["command_line"]
        assert ":guest@" not in run["command"]
    assert purged["counts"]["purged"] == 40 and purged["counts"]["archived"] == 40
    assert purged["info"]["archive"] == str(archive)
    assert (replayed["counts"]["moved"], replayed_again["counts"]["moved"]) == (40, 0)


# -- a plan, then apply -------------------------------------------------------------------------


def test_apply_acts_on_exactly_the_planned_messages_and_twice_does_nothing(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    before = fill(rabbitmq_vhost, 30)
    captures = [m for m in before if m.properties["application_headers"]["task"] == CAPTURE]
    assert 0 < len(captures) < len(before)
    plan = tmp_path / "plan.json"
    made = redrive(rabbitmq_vhost, "move", "checkout", "--task", CAPTURE, "--plan-out", str(plan))
    assert made.returncode == 0, made.stderr
    written = json.loads(plan.read_text())
    items = written["items"]
    assert written["kind"] == "move" and written["count"] == len(captures)
    assert Counter(i["task_id"] for i in items) == Counter(task_id_of(m) for m in captures)
    assert {i["action"] for i in items} == {"send"} and {i["task"] for i in items} == {CAPTURE}
    assert_whole(rabbitmq_vhost, before)
    # A task that matches the filters now but was not reviewed: apply leaves it alone.
    late = celery_message(CAPTURE, [999], {"amount_cents": 1}, task_id="late-capture")
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        dead_letter(connection, rabbit_families()[0], [late])
    finally:
        connection.close()
    in_dlq = drain(rabbitmq_vhost, DLQ)
    assert len(in_dlq) == len(before) + 1

    ledger = tmp_path / "ledger.sqlite3"
    apply = ["apply", str(plan), "--json"]
    dry = ok_json(redrive(rabbitmq_vhost, *apply))
    assert dry["dry_run"] is True
    assert (dry["planned"], dry["moved"], dry["gone"]) == (len(captures),) * 2 + (0,), dry
    assert_whole(rabbitmq_vhost, in_dlq)

    done = ok_json(redrive(rabbitmq_vhost, *apply, "--execute", "--yes", "--ledger", str(ledger)))
    assert (done["planned"], done["moved"], done["gone"]) == (len(captures),) * 2 + (0,), done
    assert (done["in_doubt"], done["failed"]) == (0, 0)
    assert_sent_as_they_were(drain(rabbitmq_vhost, QUEUE), captures)
    left = drain(rabbitmq_vhost, DLQ)
    assert task_ids(left) == task_ids(in_dlq) - task_ids(captures)
    assert "late-capture" in task_ids(left)

    again = ok_json(redrive(rabbitmq_vhost, *apply, "--execute", "--yes", "--ledger", str(ledger)))
    assert (again["moved"], again["gone"], again["gone_sent"]) == (0,) + (len(captures),) * 2
    assert task_ids(drain(rabbitmq_vhost, QUEUE)) == task_ids(captures)

    first = audit(rabbitmq_vhost, ledger)["runs"][-1]  # newest first: the first apply
    shown = audit(rabbitmq_vhost, ledger, first["run_id"])
    assert shown["counts"]["moved"] == len(captures)
    assert Counter(k["state"] for k in shown["keys"]) == Counter({"done": len(captures)})
    assert {k["task"] for k in shown["keys"]} == {CAPTURE}
    text = redrive(rabbitmq_vhost, "audit", first["run_id"], "--ledger", str(ledger))
    assert text.returncode == 0, text.stderr
    assert f"@{socket.gethostname()} on {shown['info']['broker']}" in text.stdout, text.stdout


# -- --workers 4 ---------------------------------------------------------------------------------


def test_a_move_in_four_workers_sends_each_task_once_as_it_was(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """Four workers in one process, each receiving on a lane of its own and publishing on
    another, on one DLQ: their consumers share what is ready (a receive whose window another
    emptied ends with what it got), and every task reaches its queue once, byte for byte."""
    before = fill(rabbitmq_vhost, 350)
    ledger = tmp_path / "ledger.sqlite3"
    move = ["move", "checkout", "--workers", "4", "--json", "--ledger", str(ledger)]
    done = ok_json(redrive(rabbitmq_vhost, *move, "--execute", "--yes"))
    assert (done["moved"], done["in_doubt"], done["failed"]) == (350, 0, 0), done
    assert done["duplicates_deleted"] == 0
    assert_sent_as_they_were(drain(rabbitmq_vhost, QUEUE), before)
    assert drain(rabbitmq_vhost, DLQ) == []
    with sqlite3.connect(ledger) as db:
        states = dict(db.execute("SELECT state, COUNT(*) FROM keys GROUP BY state"))
    assert states == {"done": 350}, states


def test_a_move_on_rabbitmq_never_loads_botocores_session_or_clients(
    rabbitmq_vhost: Vhost,
) -> None:
    """redrive.aws.session imports botocore's session, loaders and config on first use: a
    run on RabbitMQ (here an executed move of one family's DLQ) never loads them."""
    fill(rabbitmq_vhost, 20)
    launch = (
        "import atexit, runpy, sys\n"
        "unwanted = ('botocore.session', 'botocore.client', 'botocore.loaders')\n"
        "atexit.register(lambda: print('loaded:', [m for m in unwanted if m in sys.modules],"
        " file=sys.stderr))\n"
        "sys.argv = ['redrive', *sys.argv[1:]]\n"
        "runpy.run_module('redrive', run_name='__main__')\n"
    )
    urls = ["--broker", rabbitmq_vhost.amqp_url, "--rabbitmq-api", rabbitmq_vhost.api_url]
    done = subprocess.run(
        [sys.executable, "-c", launch, *urls, "move", "checkout", "--execute", "--yes", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert ok_json(done)["moved"] == 20
    assert "loaded: []" in done.stderr, done.stderr


# -- --processes 2 --------------------------------------------------------------------------------


def test_move_and_purge_in_two_processes_act_on_each_message_once(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    before = fill(rabbitmq_vhost, 150, families=2)
    default_before = drain(rabbitmq_vhost, "onion-dlq")
    ledger = tmp_path / "ledger.sqlite3"
    move = ["move", "checkout", "--processes", "2", "--json"]

    dry = ok_json(redrive(rabbitmq_vhost, *move))
    assert dry["dry_run"] is True and dry["processes"] == 2
    assert (dry["scanned"], dry["moved"], dry["in_doubt"]) == (150, 150, 0), dry
    assert_whole(rabbitmq_vhost, before)

    done = ok_json(redrive(rabbitmq_vhost, *move, "--execute", "--yes", "--ledger", str(ledger)))
    assert (done["moved"], done["in_doubt"], done["failed"], done["processes"]) == (150, 0, 0, 2)
    assert done["skipped_by_reason"] == {} and done["duplicates_deleted"] == 0
    assert_sent_as_they_were(drain(rabbitmq_vhost, QUEUE), before)
    assert drain(rabbitmq_vhost, DLQ) == []
    with sqlite3.connect(ledger) as db:
        by_run = dict(db.execute("SELECT run_id, COUNT(*) FROM keys GROUP BY run_id"))
    # Each key once; how the two share the queue is the broker's (one may take it all).
    assert sum(by_run.values()) == 150 and 1 <= len(by_run) <= 2, by_run

    archive = tmp_path / "purged.jsonl.gz"
    purge = ["purge", "default", "--archive", str(archive), "--processes", "2", "--json"]
    purged = ok_json(redrive(rabbitmq_vhost, *purge, "--execute", "--yes", "--ledger", str(ledger)))
    assert (purged["archived"], purged["purged"], purged["failed"]) == (150, 150, 0), purged
    parts = {tmp_path / "purged.p1.jsonl.gz", tmp_path / "purged.p2.jsonl.gz"}
    archives = {Path(a) for a in purged["archives"]}
    assert archives and archives <= parts
    archived = Counter(r.body for a in archives for r in read_records(str(a)))
    assert archived == Counter(envelope_of(m.body, m.properties) for m in default_before)
    assert drain(rabbitmq_vhost, "onion-dlq") == [] and drain(rabbitmq_vhost, "onion") == []

    # Audit: one entry per command, its processes' runs folded into it.
    purge_run, move_run = audit(rabbitmq_vhost, ledger)["runs"]
    assert move_run["counts"]["moved"] == 150 and move_run["info"]["target"] == "checkout"
    assert purge_run["counts"]["purged"] == 150
    shown = audit(rabbitmq_vhost, ledger, move_run["run_id"])
    assert len(shown["keys"]) == 150 and len(shown["info"]["children"]) == 2


# -- --result-backend -----------------------------------------------------------------------------


def test_a_result_backend_says_why_and_a_task_that_succeeded_is_not_sent_again(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """Celery's database backend on SQLite, its records written by Celery's own backend
    class as a worker writes them, under the task ids the DLQ's messages carry."""
    pytest.importorskip("sqlalchemy")
    from celery import Celery

    before = fill(rabbitmq_vhost, 20)
    url = f"db+sqlite:///{tmp_path / 'results.sqlite3'}"
    app = Celery("writer", backend=url, set_as_current=False)
    succeeded, failed = before[:4], before[4:7]
    for message in succeeded:
        app.backend.store_result(task_id_of(message), 42, "SUCCESS")
    for message in failed:
        app.backend.store_result(task_id_of(message), ValueError("card declined"), "FAILURE")
    app.backend.ResultSession().close()
    backend = ["--result-backend", url]

    inspected = ok_json(redrive(rabbitmq_vhost, *backend, "inspect", "checkout", "--json"))
    assert inspected["total"] == 20
    states: Counter[str] = Counter()
    exceptions: Counter[str] = Counter()
    for group in inspected["groups"]:
        states.update(group["states"])
        exceptions.update(group["exceptions"])
        assert group["death_reasons"] == {"rejected": group["count"]}
    assert states == Counter({"SUCCESS": 4, "FAILURE": 3, "PENDING": 13})
    assert exceptions == Counter({"ValueError": 3})

    dry = ok_json(redrive(rabbitmq_vhost, *backend, "move", "checkout", "--json"))
    assert dry["skipped_by_reason"] == {"already-succeeded": 4} and dry["moved"] == 16
    assert_whole(rabbitmq_vhost, before)

    ledger = ["--ledger", str(tmp_path / "ledger.sqlite3")]
    done = ok_json(
        redrive(
            rabbitmq_vhost, "move", "checkout", "--execute", "--yes", "--json", *ledger, *backend
        )
    )
    assert done["skipped_by_reason"] == {"already-succeeded": 4} and done["moved"] == 16
    assert_sent_as_they_were(drain(rabbitmq_vhost, QUEUE), before[4:])
    assert_whole(rabbitmq_vhost, succeeded)


# -- report ---------------------------------------------------------------------------------------


def test_report_in_every_format_and_posted_leaves_every_dlq_whole(
    rabbitmq_vhost: Vhost,
    hook: Recorder,  # noqa: F811
    tmp_path: Path,
) -> None:
    families = rabbit_families()
    fill_layout(rabbitmq_vhost.amqp_url, families, 10)
    before = {f.dlq: drain(rabbitmq_vhost, f.dlq) for f in families}

    data = ok_json(redrive(rabbitmq_vhost, "report", "--format", "json"))
    assert data["total"] == 30
    queues = {q["family"]: q for q in data["queues"]}
    assert set(queues) == {"checkout", "default", "progress"}
    for family in families:
        queue = queues[family.name]
        assert queue["dlq"] == family.dlq and queue["messages"] == 10 and queue["error"] is None
        assert sum(g["count"] for g in queue["groups"]) == 10
        want = Counter(str(m.properties["application_headers"]["task"]) for m in before[family.dlq])
        assert {g["task"]: g["count"] for g in queue["groups"]} == dict(want)
        for group in queue["groups"]:
            assert group["death_reasons"] == {"rejected": group["count"]}
            assert group["died_in"] == {family.queue: group["count"]}

    # The table, posted to Slack as well.
    table = redrive(rabbitmq_vhost, "report", "--post", hook.url)
    assert table.returncode == 0, table.stderr
    assert "30 message(s)" in table.stdout and "rejected" in table.stdout
    for family in families:
        assert family.dlq in table.stdout
    (slack,) = hook.bodies()
    assert slack["text"].startswith("DLQ report, ") and "30 message(s) in 3 DLQ(s)" in slack["text"]
    blocks = [b["text"]["text"].split("*")[1] for b in slack["blocks"][1:]]
    assert blocks == ["checkout", "default", "progress"]

    markdown = redrive(
        rabbitmq_vhost,
        "report",
        "--format",
        "markdown",
        "--post",
        hook.url,
        "--post-format",
        "json",
    )
    assert markdown.returncode == 0, markdown.stderr
    assert markdown.stdout.startswith("# DLQ report") and "| checkout |" in markdown.stdout
    posted = hook.bodies()[-1]
    assert posted["total"] == 30 and len(posted["queues"]) == 3

    prometheus = redrive(rabbitmq_vhost, "report", "--format", "prometheus")
    assert prometheus.returncode == 0, prometheus.stderr
    for family in families:
        line = f'redrive_dlq_messages{{family="{family.name}",dlq="{family.dlq}"}} 10'
        assert line in prometheus.stdout.splitlines()

    page = tmp_path / "report.html"
    html = redrive(rabbitmq_vhost, "report", "--format", "html", "--output", str(page))
    assert html.returncode == 0, html.stderr
    text = page.read_text()
    assert text.lstrip().lower().startswith("<!doctype html") and "onion-checkout-dlq" in text

    for family in families:
        assert_whole(rabbitmq_vhost, before[family.dlq], family.dlq)
