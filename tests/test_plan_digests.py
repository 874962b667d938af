"""Every plan item records its message's digest, and ``apply`` leaves a message whose digest
changed since the plan (issue 41, item 3): ``changed-since-plan``, the rest applied, exit 3
(something is left for the user: a new plan to review). A plan an earlier redrive wrote (no
digests: ``fixtures/plans-before/``, by ``make_plans.py`` at the commit its README names)
applies as it always did."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import amqp
import pytest
from conftest import Cli, Family, as_json
from test_rabbitmq_e2e import drain, ok_json, redrive

from redrive.broker.base import Delivery
from redrive.broker.sqs.headers import headers_of
from redrive.cli.exit_codes import EXIT_ATTENTION, EXIT_USAGE
from redrive.messages import decode
from redrive.operations.merge import merge_purge_results
from redrive.operations.plan import message_digest, read_plan
from redrive.operations.purge import PurgeResult
from redrive.sandbox.encoder import encode
from redrive.sandbox.rabbitmq_layout import (
    celery_message,
    dead_letter,
    declare_layout,
    open_connection,
    rabbit_families,
    raw_channel,
)
from redrive.sandbox.rabbitmq_node import Vhost

CHARGE = "apps.shop.tasks.charge"
MAIL = "apps.mail.tasks.send_receipt"
BEFORE = Path(__file__).parent / "fixtures" / "plans-before"


def charge(family: Family, n: int) -> str:
    return family.send_to_dlq(encode(CHARGE, [n], {}, task_id=f"charge-{n}"))


def task_ids(family: Family, url: str) -> list[str]:
    return sorted(decode(m["Body"]).task_id or "" for m in family.drain(url))


def delivery(body: str, attributes: dict[str, Any] | None = None) -> Delivery:
    """A delivery whose headers SQS's translation made of ``attributes`` (MessageAttributes)."""
    return Delivery("m1", "tag", body, {}, headers_of(attributes or {}))


def tamper(path: Path, message_id: str) -> None:
    """The plan as if its message ``message_id`` had been another when it was reviewed."""
    data = json.loads(path.read_text())
    for item in data["items"]:
        if item["message_id"] == message_id:
            item["digest"] = "sha256:" + "0" * 64
    path.write_text(json.dumps(data))


# -- the digest -------------------------------------------------------------------------------


def test_the_digest_covers_the_body_and_every_message_attribute() -> None:
    plain = message_digest(delivery("body"))
    assert plain.startswith("sha256:") and len(plain) == 7 + 64
    assert message_digest(delivery("body")) == plain
    assert message_digest(delivery("bodY")) != plain
    text = {"DataType": "String", "StringValue": "a"}
    blob = {"DataType": "Binary", "BinaryValue": b"\x00\xff"}
    with_text = message_digest(delivery("body", {"t": text}))
    assert with_text != plain
    assert message_digest(delivery("body", {"t": dict(text, StringValue="b")})) != with_text
    both = message_digest(delivery("body", {"t": text, "b": blob}))
    assert message_digest(delivery("body", {"b": blob, "t": text})) == both  # order is no part
    assert message_digest(delivery("body", {"t": text, "b": dict(blob, BinaryValue=b"\x00")})) != (
        both
    )


def test_read_plan_refuses_a_digest_that_is_not_a_string(tmp_path: Path, cli: Cli) -> None:
    data = json.loads((BEFORE / "move.json").read_text())
    data["items"][0]["digest"] = 42
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    result = cli("apply", str(path))
    assert result.exit_code == EXIT_USAGE
    assert "damaged" in result.output and "digest" in result.output


# -- plans record digests ---------------------------------------------------------------------


def test_every_item_of_a_move_and_a_purge_plan_has_its_messages_digest(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    ids = [charge(family, 0), charge(family, 1)]
    family.send_to_dlq(
        encode(MAIL, [], {"order": 0}, task_id="mail-0"),
        {"tenant": {"DataType": "String", "StringValue": "acme"}},
    )
    received = family.client.receive_message(
        QueueUrl=family.dlq_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
    )["Messages"]
    family.client.change_message_visibility_batch(
        QueueUrl=family.dlq_url,
        Entries=[
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
            for i, m in enumerate(received)
        ],
    )
    expected = {
        m["MessageId"]: message_digest(
            Delivery(m["MessageId"], "", m["Body"], {}, headers_of(m.get("MessageAttributes", {})))
        )
        for m in received
    }
    assert set(expected) > set(ids) and len(set(expected.values())) == 3
    for command in (["move", "checkout"], ["purge", "checkout", "--no-archive"]):
        path = tmp_path / f"{command[0]}.json"
        cli.ok(*command, "--plan-out", str(path))
        items = json.loads(path.read_text())["items"]
        assert {i["message_id"]: i["digest"] for i in items} == expected
        assert read_plan(str(path)).digests == expected


# -- apply refuses what changed ---------------------------------------------------------------


def test_apply_leaves_a_message_that_changed_since_the_plan_and_exits_3(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    changed = charge(family, 0)
    charge(family, 1)
    path = tmp_path / "p.json"
    cli.ok("move", "checkout", "--plan-out", str(path))
    tamper(path, changed)

    dry = as_json(cli.ok("apply", str(path), "--json"))  # a dry run says so, and exits 0
    assert (dry["moved"], dry["changed_since_plan"], dry["gone"]) == (1, 1, 0)
    done = cli.ok("apply", str(path), "--execute", "--yes", code=EXIT_ATTENTION)
    assert "1 of the plan's 2 message(s) changed since the plan" in done.output
    assert "make a new plan" in done.output
    assert task_ids(family, family.queue_url) == ["charge-1"]
    assert task_ids(family, family.dlq_url) == ["charge-0"]  # left, as it was


def test_apply_json_counts_the_changed_under_their_reason(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    changed = charge(family, 0)
    charge(family, 1)
    path = tmp_path / "p.json"
    cli.ok("move", "checkout", "--plan-out", str(path))
    tamper(path, changed)
    data = as_json(cli.ok("apply", str(path), "--execute", "--yes", "--json", code=3))
    assert data["skipped_by_reason"] == {"changed-since-plan": 1}
    assert (data["planned"], data["moved"], data["gone"], data["changed_since_plan"]) == (
        2,
        1,
        0,
        1,
    )
    assert family.depth() == (1, 0)


def test_a_purge_of_processes_adds_up_their_changed() -> None:
    parts = [PurgeResult(False, "checkout", "dlq", None, changed_since_plan=n) for n in (1, 2)]
    merged = merge_purge_results(PurgeResult(False, "checkout", "dlq", None), parts, None)
    assert merged.changed_since_plan == 3 and merged.needs_attention


def test_a_purge_plans_apply_leaves_a_message_that_changed(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    changed = charge(family, 0)
    charge(family, 1)
    path = tmp_path / "p.json"
    archive = tmp_path / "a.jsonl.gz"
    cli.ok("purge", "checkout", "--archive", str(archive), "--plan-out", str(path))
    tamper(path, changed)
    text = cli.ok("apply", str(path)).output  # a dry run says why
    assert "1 of the plan's 2 message(s) changed since the plan" in text
    data = as_json(cli.ok("apply", str(path), "--execute", "--yes", "--json", code=3))
    assert (data["planned"], data["purged"], data["changed_since_plan"], data["gone"]) == (
        2,
        1,
        1,
        0,
    )
    assert task_ids(family, family.dlq_url) == ["charge-0"]


def test_an_edited_moves_plan_counts_the_changed_in_its_repair_report(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    changed = family.send_to_dlq(encode(CHARGE, [0], {"currency": "USD"}, task_id="charge-0"))
    family.send_to_dlq(encode(CHARGE, [1], {"currency": "USD"}, task_id="charge-1"))
    path = tmp_path / "p.json"
    words = ["--set", 'kwargs.currency="EUR"', "--archive", str(tmp_path / "a.jsonl.gz")]
    cli.ok("move", "checkout", *words, "--plan-out", str(path))
    items = json.loads(path.read_text())["items"]
    assert all(i["digest"] and i["digest_before"] and i["digest_after"] for i in items)
    tamper(path, changed)
    data = as_json(cli.ok("apply", str(path), "--execute", "--yes", "--json", code=3))
    assert (data["moved"], data["changed_since_plan"]) == (1, 1)
    assert data["repair"]["changed_since_plan"] == 1
    assert task_ids(family, family.dlq_url) == ["charge-0"]


# -- plans an earlier redrive wrote -----------------------------------------------------------


def earlier_plan(family: Family, tmp_path: Path, name: str) -> Path:
    """The earlier release's plan, its items pointed at the same bodies seeded again here
    (SQS gives each a new MessageId; nothing else of the plan is touched)."""
    messages = json.loads((BEFORE / "messages.json").read_text())
    ids = {m["message_id"]: family.send_to_dlq(m["body"]) for m in messages}
    data = json.loads((BEFORE / name).read_text())
    assert data["dlq_url"] == family.dlq_url
    assert all("digest" not in item for item in data["items"])
    for item in data["items"]:
        item["message_id"] = ids[item["message_id"]]
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_an_earlier_releases_move_plan_applies_as_it_did(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    path = earlier_plan(family, tmp_path, "move.json")
    assert read_plan(str(path)).digests is None
    data = as_json(cli.ok("apply", str(path), "--execute", "--yes", "--json"))
    assert (data["planned"], data["moved"], data["changed_since_plan"]) == (4, 4, 0)
    assert task_ids(family, family.queue_url) == ["charge-0", "charge-0", "charge-1", "mail-0"]
    assert family.depth() == (0, 0)


def test_an_earlier_releases_purge_plan_applies_as_it_did(
    family: Family, tmp_path: Path, cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # its archive is a relative path
    path = earlier_plan(family, tmp_path, "purge.json")
    data = as_json(cli.ok("apply", str(path), "--execute", "--yes", "--json"))
    assert (data["planned"], data["archived"], data["purged"]) == (4, 4, 4)
    assert (tmp_path / "originals.jsonl.gz").exists()
    assert family.depth() == (0, 0)


# -- RabbitMQ: a producer's own message_id on a new publish -----------------------------------


@pytest.mark.e2e
def test_on_rabbitmq_a_new_publish_under_a_planned_message_id_is_left(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    """RabbitMQ ids a message by the producer's AMQP ``message_id`` when it sets one: the
    message reviewed may be consumed and another published under its id. The plan's digest
    tells them apart: the new one is left, byte for byte; the other planned one moves."""
    family = rabbit_families()[0]

    def order(n: int, amount: int) -> amqp.Message:
        message = celery_message(CHARGE, [n], {"amount": amount}, task_id=f"charge-{n}")
        message.properties["message_id"] = f"order-{n}"
        return message

    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        declare_layout(raw_channel(connection), [family])
        dead_letter(connection, family, [order(1, 10), order(2, 20)])
        plan = tmp_path / "p.json"
        ok_json(redrive(rabbitmq_vhost, "move", "checkout", "--plan-out", str(plan), "--json"))
        assert {i["message_id"] for i in json.loads(plan.read_text())["items"]} == {
            "order-1",
            "order-2",
        }
        channel = raw_channel(connection)
        while (got := channel.basic_get(family.dlq, no_ack=False)) is not None:
            if got.properties.get("message_id") == "order-1":
                channel.basic_ack(got.delivery_tag)  # consumed; order-2 goes back as it was
        channel.close()
        dead_letter(connection, family, [order(1, 99)])  # republished: amount 99
    finally:
        connection.close()
    done = ok_json(
        redrive(rabbitmq_vhost, "apply", str(plan), "--execute", "--yes", "--json"),
        EXIT_ATTENTION,
    )
    assert (done["moved"], done["changed_since_plan"], done["gone"]) == (1, 1, 0)
    (moved,) = drain(rabbitmq_vhost, family.queue)
    assert moved.properties["message_id"] == "order-2"
    (left,) = drain(rabbitmq_vhost, family.dlq)
    assert left.properties["message_id"] == "order-1"
    assert json.loads(left.body)[1] == {"amount": 99}
