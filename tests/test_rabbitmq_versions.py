"""What changed between RabbitMQ 3.10 and 4.0 that a DLQ tool leans on (issue 39), each on a
real 3.10.8 node and a real 4.0.5 node (``on_both_rabbitmq``): the broker's fact, said as
each version behaves, and what redrive does about it, so that a test fails wherever redrive
(or the suite) assumed the other version's behaviour.

- x-death's count: a message dead-lettered, sent back with its headers and dead-lettered
  again counts 1, 2, 3 on 3.10 and 1, 1, 1 on 4.0 (4.0 no longer reads a client's x-death).
  redrive's generations and poison counts come from its own plain headers on both.
- A quorum queue without a delivery limit has none on 3.10 and 20 on 4.0, and every
  ``basic.get`` then requeue counts: peeked 21 times it loses the message on 4.0. redrive
  refuses such a DLQ on 4.0 before it reads a single message.
- A requeued delivery on a quorum queue with a limit goes back near its head, and on 4.0
  every quorum queue has one (a get-then-requeue loop sees m0, m0, m0 on 4.0; m0, m1, m2 on
  3.10 where none is set): redrive holds what it reads, so it still reads each message once.
- 3.13+ writes ``x-last-death-*`` beside x-death; nothing a client publishes is stripped.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import amqp
import pytest
from conftest import Cli, on_both_rabbitmq
from test_rabbitmq_delivery_limit import put_policy
from test_rabbitmq_e2e import drain, ok_json, redrive, task_ids

from redrive.broker.rabbitmq.queues import Queues
from redrive.sandbox.rabbitmq_layout import (
    fill_layout,
    open_connection,
    publish_confirmed,
    rabbit_families,
    raw_channel,
)
from redrive.sandbox.rabbitmq_node import Vhost

pytestmark = [pytest.mark.e2e, on_both_rabbitmq]


def reject_all(vhost: Vhost, queue: str) -> int:
    """Take every message of ``queue`` and reject it without requeue (dead-lettered, as a
    worker's failure does); how many."""
    connection = open_connection(vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        rejected = 0
        while (message := channel.basic_get(queue, no_ack=False)) is not None:
            channel.basic_reject(message.delivery_tag, requeue=False)
            rejected += 1
        return rejected
    finally:
        connection.close()


def headers(message: amqp.Message) -> dict[str, Any]:
    return dict(message.properties["application_headers"])


# -- x-death's count ------------------------------------------------------------------------------


def test_x_death_counts_on_3_10_restarts_on_4_0_and_redrives_own_marks_count_on_both(
    rabbitmq_vhost: Vhost, rabbitmq_version: str, tmp_path: Path
) -> None:
    """Three rounds of: moved back by redrive (its headers, x-death included, as received),
    failed again by the worker (rejected, dead-lettered). x-death's count says 2, 3, 4 on
    3.10 and 1, 1, 1 on 4.0; redrive's ``redrive-count`` says 1, 2, 3 on both, and the third
    round's messages are poison on both (an x-death count would find none on 4.0)."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families()[:1], 4)
    before = task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq"))
    ledger = tmp_path / "ledger.sqlite3"
    move = ["move", "checkout", "--execute", "--yes", "--json", "--ledger", str(ledger)]
    x_death_counts, redrive_counts = [], []
    for _ in range(3):
        assert ok_json(redrive(rabbitmq_vhost, *move))["moved"] == 4
        assert reject_all(rabbitmq_vhost, "onion-checkout") == 4
        back = drain(rabbitmq_vhost, "onion-checkout-dlq")
        assert task_ids(back) == before
        x_death_counts.append({headers(m)["x-death"][0]["count"] for m in back})
        redrive_counts.append({headers(m)["redrive-count"] for m in back})
        for message in back:
            (death,) = headers(message)["x-death"]  # one entry per {queue, reason}
            assert (death["queue"], death["reason"]) == ("onion-checkout", "rejected")
    expected = {"3.10": [{2}, {3}, {4}], "4.0": [{1}, {1}, {1}]}[rabbitmq_version]
    assert x_death_counts == expected
    assert redrive_counts == [{"1"}, {"2"}, {"3"}]

    inspected = ok_json(redrive(rabbitmq_vhost, "inspect", "checkout", "--json"))
    groups = inspected["groups"]
    assert sum(g["redriven"] for g in groups) == 4
    assert sum(g["poison"] for g in groups) == 4, "poison from redrive-count, on both"
    # A fourth move holds them back as poison (--max-redrives 3), on both versions.
    held = ok_json(redrive(rabbitmq_vhost, *move))
    assert held["moved"] == 0, held
    assert task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq")) == before


def test_a_clients_x_headers_arrive_as_sent_and_4_0_adds_x_last_death(
    rabbitmq_vhost: Vhost, rabbitmq_version: str
) -> None:
    """Nothing is stripped on publish (x-death, x-first-death-*, a custom x- header): so a
    byte-identical resend keeps them on both. Dead-lettered, 3.13+ adds x-last-death-*
    (4.0 here), which 3.10 never writes; redrive's death reasons read x-death itself."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families()[:1], 1)
    (dead,) = drain(rabbitmq_vhost, "onion-checkout-dlq")
    shape = {name for name in headers(dead) if name.startswith("x-")}
    first = {"x-death", "x-first-death-exchange", "x-first-death-queue", "x-first-death-reason"}
    last = {"x-last-death-exchange", "x-last-death-queue", "x-last-death-reason"}
    assert shape == (first | last if rabbitmq_version == "4.0" else first), shape

    sent = amqp.Message(b"[[], {}, {}]", application_headers={**headers(dead), "x-mine": "kept"})
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        channel.queue_declare("plain", durable=True, auto_delete=False)
        publish_confirmed(channel, "plain", [sent])
    finally:
        connection.close()
    (arrived,) = drain(rabbitmq_vhost, "plain")
    assert headers(arrived) == {**headers(dead), "x-mine": "kept"}

    inspected = ok_json(redrive(rabbitmq_vhost, "inspect", "checkout", "--json"))
    (group,) = inspected["groups"]
    assert group["death_reasons"] == {"rejected": 1}
    assert group["died_in"] == {"onion-checkout": 1}


# -- a quorum queue's delivery limit ------------------------------------------------------------


def quorum_queue(vhost: Vhost, name: str, messages: int, **arguments: Any) -> None:
    connection = open_connection(vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        channel.queue_declare(
            name, durable=True, auto_delete=False, arguments={"x-queue-type": "quorum", **arguments}
        )
        publish_confirmed(channel, name, [amqp.Message(f"m{i}".encode()) for i in range(messages)])
    finally:
        connection.close()


def peek_and_requeue(vhost: Vhost, queue: str, times: int) -> list[bytes | None]:
    """What ``times`` rounds of basic.get then reject(requeue) see (None: the queue was empty)."""
    connection = open_connection(vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        seen: list[bytes | None] = []
        for _ in range(times):
            message = channel.basic_get(queue, no_ack=False)
            seen.append(None if message is None else bytes(message.body))
            if message is not None:
                channel.basic_reject(message.delivery_tag, requeue=True)
        return seen
    finally:
        connection.close()


def test_a_quorum_queue_peeked_21_times_loses_its_message_on_4_0_only(
    rabbitmq_vhost: Vhost, rabbitmq_version: str
) -> None:
    """No delivery limit set and no dead-letter target: 4.0's implicit limit of 20 drops the
    message at its 21st requeue; 3.10 sets none. This is what redrive's guard is for."""
    quorum_queue(rabbitmq_vhost, "peeked", 1)
    seen = peek_and_requeue(rabbitmq_vhost, "peeked", 30)
    if rabbitmq_version == "4.0":
        assert seen[:21] == [b"m0"] * 21 and set(seen[21:]) == {None}, seen
    else:
        assert seen == [b"m0"] * 30


def test_a_requeued_delivery_comes_back_first_on_4_0_and_redrive_still_reads_each_once(
    rabbitmq_vhost: Vhost, rabbitmq_version: str
) -> None:
    """A quorum queue with a delivery limit puts a requeued delivery back at its head (both
    versions); one with none set has 4.0's 20, so a get-then-requeue loop sees m0, m0, m0 on
    4.0 where it saw m0, m1, m2 on 3.10. redrive holds what it reads until it is done, so an
    inspect (allowed past the limit) sees each of the DLQ's messages exactly once on both."""
    quorum_queue(rabbitmq_vhost, "unlimited", 3)
    quorum_queue(rabbitmq_vhost, "limited", 3, **{"x-delivery-limit": 50})
    seen = peek_and_requeue(rabbitmq_vhost, "unlimited", 3)
    assert seen == ([b"m0"] * 3 if rabbitmq_version == "4.0" else [b"m0", b"m1", b"m2"])
    assert peek_and_requeue(rabbitmq_vhost, "limited", 3) == [b"m0"] * 3

    families = rabbit_families(dlq_type="quorum", dlq_delivery_limit=50)[:1]
    fill_layout(rabbitmq_vhost.amqp_url, families, 12)
    args = ["inspect", "checkout", "--json", "--allow-delivery-limit", "--show-args"]
    inspected = ok_json(redrive(rabbitmq_vhost, *args))
    assert inspected["total"] == 12
    assert sum(g["count"] for g in inspected["groups"]) == 12
    assert len(task_ids(drain(rabbitmq_vhost, "onion-checkout-dlq"))) == 12


def delivery_counts(vhost: Vhost, queue: str) -> Counter[int]:
    """Each message's x-delivery-count as one more get shows it (absent: 0), then requeued."""
    return Counter(int(headers(m).get("x-delivery-count", 0) or 0) for m in drain(vhost, queue))


def test_4_0s_implicit_limit_of_20_is_refused_before_any_read_and_3_10_has_none(
    rabbitmq_vhost: Vhost, rabbitmq_version: str
) -> None:
    """A quorum DLQ declared with no limit, no policy: on 4.0 inspect, move, purge and report
    refuse it at once (exit 2, one line naming 4.x's default and the way out), having read
    nothing (no delivery of any message counted); on 3.10 it is read as any DLQ. On 4.0 a
    policy of -1 (unlimited) lifts the refusal."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families(dlq_type="quorum")[:1], 5)
    if rabbitmq_version == "3.10":
        assert ok_json(redrive(rabbitmq_vhost, "inspect", "checkout", "--json"))["total"] == 5
        return
    for args in (["inspect", "checkout"], ["move", "checkout"], ["purge", "checkout"]):
        refused = redrive(rabbitmq_vhost, *args)
        assert refused.returncode == 2, (args, refused.stdout, refused.stderr)
        (line,) = refused.stderr.strip().splitlines()
        assert "x-delivery-limit 20, RabbitMQ 4.x's default of 20 for quorum queues" in line
        assert "rabbitmqctl set_policy" in line and "--allow-delivery-limit" in line
    report = redrive(rabbitmq_vhost, "report", "--format", "json")
    assert report.returncode == 1 and "default of 20" in report.stderr, report.stderr
    # One get by the test: the first delivery of each, so redrive counted none.
    assert delivery_counts(rabbitmq_vhost, "onion-checkout-dlq") == Counter({0: 5})

    put_policy(rabbitmq_vhost, "no-limit", "^onion-checkout-dlq$", {"delivery-limit": -1})
    lifted = ok_json(redrive(rabbitmq_vhost, "inspect", "checkout", "--json"))
    assert lifted["total"] == 5, json.dumps(lifted)[:300]


# -- saying the version (issue 39, point 5) -------------------------------------------------------


def test_status_check_and_the_audit_name_rabbitmq_and_its_version(
    rabbitmq_vhost: Vhost, rabbitmq_version: str, tmp_path: Path
) -> None:
    """Debian's 3.10.8 and 4.0.5, as the management API says them: in status's and check's
    JSON and text, and in an executed run's audit record; no warning (both are tested)."""
    version = {"3.10": "3.10.8", "4.0": "4.0.5"}[rabbitmq_version]
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families(), 2)
    for command in (["status", "--json"], ["check", "--json"]):
        done = redrive(rabbitmq_vhost, *command)
        broker = json.loads(done.stdout)["broker"]
        assert (broker["kind"], broker["version"], broker["tested"]) == ("rabbitmq", version, True)
        assert broker["endpoint"].startswith("amqp://guest:***@127.0.0.1:"), broker
        assert "warning" not in done.stderr, done.stderr
    text = redrive(rabbitmq_vhost, "status")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[-1].startswith(
        f"broker: RabbitMQ {version} at amqp://guest:***@"
    )

    ledger = tmp_path / "ledger.sqlite3"
    move = ["move", "checkout", "--execute", "--yes", "--json", "--ledger", str(ledger)]
    run_id = ok_json(redrive(rabbitmq_vhost, *move))["run_id"]
    audited = ok_json(redrive(rabbitmq_vhost, "audit", run_id, "--json", "--ledger", str(ledger)))
    assert audited["info"]["broker_server"]["version"] == version
    detail = redrive(rabbitmq_vhost, "audit", run_id, "--ledger", str(ledger))
    assert f"  broker:   RabbitMQ {version} at amqp://guest:***@" in detail.stdout, detail.stdout


def test_a_version_outside_the_tested_ones_gets_one_warning_line(
    rabbitmq_vhost: Vhost, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    """The node is 3.10.8 or 4.0.5; the version the management API gives is made 3.13.7
    (no such node here): status and check say it, and warn once."""
    monkeypatch.setattr(Queues, "server_version", lambda self: "3.13.7")
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families(), 0)
    broker = ["--broker", rabbitmq_vhost.amqp_url, "--rabbitmq-api", rabbitmq_vhost.api_url]
    for command in (["status"], ["check", "--json"]):
        done = cli(*broker, *command)
        assert done.exit_code == 0, (done.output, done.exception)
        warnings = [line for line in done.stderr.splitlines() if line.startswith("warning:")]
        assert warnings == [
            "warning: RabbitMQ 3.13.7 is not a version redrive is tested on (RabbitMQ 3.10 and "
            "4.0): its dead-lettering and delivery limits may differ from what redrive "
            "expects; check a dry run before --execute"
        ], done.stderr
    assert "RabbitMQ 3.13.7" in cli(*broker, "status").stdout
