"""Replay archives, byte-identical and each task once, and inspect them offline.

Archives are written by a real purge/archive of an in-process moto DLQ; replay is driven
through ``replay_archive`` and through the ``replay`` / ``inspect ARCHIVE`` commands.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest
from conftest import REGION, Cli, Family, make_family

from redrive import attributes
from redrive.archive import (
    ArchiveDamaged,
    ArchiveRecord,
    LocalArchiveWriter,
    check_archive,
    open_writer,
    read_records,
)
from redrive.broker import resolve_target
from redrive.broker.base import DlqTarget
from redrive.broker.sqs import SqsBroker
from redrive.broker.sqs.queues import describe_queue
from redrive.config import load_layout
from redrive.inspection.archive import inspect_archive
from redrive.ledger import SqliteLedger
from redrive.messages import decode
from redrive.operations.move import MoveOptions, MoveResult
from redrive.operations.purge import PurgeOptions, purge_dlq
from redrive.operations.replay import replay_archive
from redrive.runs.observer import Callbacks
from redrive.sandbox.encoder import encode
from redrive.selection import Selection

REFUND = "apps.payments.tasks.refund"
RECEIPT = "apps.emails.tasks.send_receipt"
PROGRESS = "apps.engagements.tasks.save_progress"
IBFT = "apps.webhooks.tasks.save_checkout_ibft"
OURS = (attributes.COUNT, attributes.KEY, attributes.SOURCE_DLQ)
SQS_MAX_BYTES = 262_144


class Crash(BaseException):
    """A simulated SIGKILL: not an Exception, so the run's own cleanup is skipped."""


# -- helpers ------------------------------------------------------------------------------


def checkout(client: Any) -> DlqTarget:
    return resolve_target(load_layout(None), "checkout", lambda region: SqsBroker(client))


def attrs(n: int) -> dict[str, dict[str, Any]]:
    """``n`` message attributes of every kind SQS has, custom types included."""
    kinds: list[dict[str, Any]] = [
        {"DataType": "Binary", "BinaryValue": bytes(range(256))},
        {"DataType": "Binary.gzip", "BinaryValue": b"\x1f\x8b\x00\xff"},
        {"DataType": "String.custom", "StringValue": "ünï € 🎉"},
        {"DataType": "Number.int", "StringValue": "0042"},
        {"DataType": "Number", "StringValue": "1.50"},
    ]
    return {f"attr-{i}": kinds[i % len(kinds)] for i in range(n)}


def seed(family: Family, plan: Sequence[tuple[str, int]]) -> dict[str, dict[str, Any]]:
    """Interleaved Celery tasks in the DLQ; returns MessageId -> what was sent."""
    sent: dict[str, dict[str, Any]] = {}
    queue = sorted(
        ((task, i) for task, count in plan for i in range(count)), key=lambda x: (x[1], x[0])
    )
    for task, i in queue:
        task_id = f"{task.rsplit('.', 1)[-1]}-{i:04d}"
        body = encode(task, [i], {"who": f"zoë {i}"}, task_id=task_id)
        message_attributes = attrs(i % 4)
        mid = family.send_to_dlq(body, message_attributes)
        sent[mid] = {
            "task": task,
            "task_id": task_id,
            "body": body,
            "attributes": message_attributes,
        }
    return sent


def purge_to(
    client: Any, destination: str, *, tasks: Sequence[str] = (), **writer_kw: Any
) -> list[ArchiveRecord]:
    """Purge (archive, then delete) the selected checkout DLQ messages; return the archive."""
    writer = open_writer(destination, **writer_kw)
    with writer:
        result = purge_dlq(
            checkout(client),
            PurgeOptions(selection=Selection(tasks=tuple(tasks)), execute=True),
            broker_factory=lambda: SqsBroker(client),
            writer=writer,
        )
    assert result.failed == 0
    factory = writer_kw.get("s3_client_factory")
    return list(read_records(writer.location, s3_client_factory=factory))


def replay(
    client: Any,
    source: str,
    ledger: SqliteLedger | None,
    *,
    to: str = "onion-checkout",
    tasks: Sequence[str] = (),
    execute: bool = True,
    fault: Callable[[str], None] | None = None,
    include_unknown: bool = False,
    **kw: Any,
) -> MoveResult:
    return replay_archive(
        source,
        describe_queue(SqsBroker(client), to),
        ledger,
        MoveOptions(
            selection=Selection(tasks=tuple(tasks)),
            execute=execute,
            include_unknown=include_unknown,
        ),
        broker_factory=lambda: SqsBroker(client),
        observer=Callbacks(on_step=fault),
        **kw,
    ).move


def json_of(result: Any) -> dict[str, Any]:
    assert result.exit_code == 0, (result.exit_code, result.output)
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def task_ids(messages: Sequence[Mapping[str, Any]]) -> Counter[str | None]:
    return Counter(decode(m["Body"]).task_id for m in messages)


def groups(inspect_json: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """What must agree between a live inspect and an archive inspect, per task."""
    keys = ("count", "oldest", "newest", "expired", "redriven", "poison", "protocols")
    return {g["task"]: {k: g[k] for k in keys} for g in inspect_json["groups"]}


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    with SqliteLedger(tmp_path / "ledger.sqlite3") as opened:
        yield opened


@pytest.fixture
def s3(sqs_client: Any) -> Any:
    client = boto3.client("s3", region_name=REGION)
    client.create_bucket(Bucket="dlq-archive")
    return client


# -- byte-identical -----------------------------------------------------------------------


def test_replay_sends_bodies_and_attributes_back_byte_identical(
    family: Family, tmp_path: Path, ledger: SqliteLedger
) -> None:
    text = 'ação ✓ 漢字 🎉 \u2028\u2029 "q" \\b\\ \t\r\n\ufffd'
    big = text + "é" * ((SQS_MAX_BYTES - len(text.encode()) - 40) // 2)
    big_task = encode(PROGRESS, ["p" * 140_000], task_id="t-big")
    assert SQS_MAX_BYTES - 20_000 < len(big_task.encode()) < SQS_MAX_BYTES - 1_000
    # (body, attributes, how many of ours fit: SQS allows 10 attributes, and attributes
    # count in a message's size, so a body at the limit gets none)
    messages = [
        (encode(REFUND, [text], task_id="t-unicode"), attrs(10), 0),
        (encode(REFUND, [1], task_id="t-eight", protocol=1), attrs(8), 2),
        (encode(RECEIPT, [2], task_id="t-zlib", compression="zlib"), attrs(3), 3),
        (big, {}, 0),  # not a Celery task: keyed by its MessageId
        (big_task, attrs(1), 3),
    ]
    sent = {family.send_to_dlq(body, a): (body, a, room) for body, a, room in messages}
    path = str(tmp_path / "all.jsonl.gz")
    assert len(purge_to(family.client, path)) == len(sent)

    # The body that is not a Celery task goes too: asked for.
    result = replay(family.client, path, ledger, include_unknown=True)
    assert (result.moved, result.failed, result.in_doubt) == (len(sent), 0, 0)
    received = family.drain(family.queue_url)
    assert len(received) == len(sent)
    by_body = {m["Body"]: m for m in received}
    for body, original, room in sent.values():
        got = by_body[body]
        assert got["Body"].encode("utf-8") == body.encode("utf-8")
        got_attributes = got.get("MessageAttributes", {})
        mine = {k: v for k, v in got_attributes.items() if k in OURS}
        theirs = {k: v for k, v in got_attributes.items() if k not in OURS}
        assert theirs == original
        assert list(mine) == list(OURS[:room])
        if attributes.COUNT in mine:
            assert mine[attributes.COUNT]["StringValue"] == "1"
        if attributes.KEY in mine:
            task_id = decode(body).task_id
            assert mine[attributes.KEY]["StringValue"].startswith(f"celery:{task_id}:r0:g0:")


# -- each task once -----------------------------------------------------------------------


def test_replaying_twice_sends_nothing_the_second_time(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    sent = seed(family, [(REFUND, 7), (RECEIPT, 5)])
    path = str(tmp_path / "a.jsonl.gz")
    purge_to(family.client, path)

    first = json_of(
        cli.raising("replay", path, "--to", "onion-checkout", "--execute", "--yes", "--json")
    )
    assert {"dry_run", "matched", "replayed", "skipped"} <= set(first)
    assert first["dry_run"] is False
    assert (first["matched"], first["replayed"], first["skipped"]) == (12, 12, 0)
    assert first["failed"] == 0 and first["in_doubt"] == 0

    second = json_of(
        cli.raising("replay", path, "--to", "onion-checkout", "--execute", "--yes", "--json")
    )
    assert (second["matched"], second["replayed"], second["skipped"]) == (12, 0, 12)
    assert second["already_sent"] == 12

    arrived = family.drain(family.queue_url)
    assert task_ids(arrived) == Counter(m["task_id"] for m in sent.values())
    assert all(n == 1 for n in task_ids(arrived).values())


def test_an_archive_with_copies_replayed_twice_sends_each_publish_once(
    family: Family, tmp_path: Path, ledger: SqliteLedger
) -> None:
    # Two copies of one publish (the same bytes) and a second publish of its task id.
    first = encode(REFUND, [1], {}, task_id="refund-1")
    again = encode(REFUND, [1], {}, task_id="refund-1")
    for body in (first, first, again):
        family.send_to_dlq(body)
    path = str(tmp_path / "a.jsonl.gz")
    purge_to(family.client, path)

    once = replay(family.client, path, ledger)
    twice = replay(family.client, path, ledger)

    assert (once.moved, once.duplicates) == (2, 1)
    assert (twice.moved, twice.duplicates) == (0, 3)
    assert sorted(m["Body"] for m in family.drain(family.queue_url)) == sorted([first, again])


def test_an_archive_replayed_before_the_upgrade_sends_nothing_again(
    family: Family, tmp_path: Path
) -> None:
    from test_ledger import schema_2_ledger

    from redrive.keys import legacy_key_for

    sent = seed(family, [(REFUND, 3)])
    path = str(tmp_path / "a.jsonl.gz")
    records = purge_to(family.client, path)
    url = family.queue_url
    # What an earlier redrive's replay of this archive left: its keys, of the earlier form.
    old = schema_2_ledger(
        tmp_path / "old.sqlite3",
        [
            (
                legacy_key_for(
                    decode(r.body), message_id=r.message_id, generation=0, namespace="sqs"
                ),
                "done",
                "old-run",
                REFUND,
                r.message_id,
                url,
                f"sent-{i}",
                1.0,
            )
            for i, r in enumerate(records)
        ],
    )

    with SqliteLedger(old) as book:
        result = replay(family.client, path, book)

    assert (result.moved, result.duplicates, result.skipped_total) == (0, 3, 0)
    assert family.drain(family.queue_url) == [] and len(sent) == 3


def test_replay_task_filter_then_the_rest(family: Family, tmp_path: Path, cli: Cli) -> None:
    sent = seed(family, [(REFUND, 6), (RECEIPT, 4), (PROGRESS, 3)])
    path = str(tmp_path / "a.jsonl")
    purge_to(family.client, path)

    only = json_of(
        cli.raising(
            *("replay", path, "--to", "onion-checkout", "--task", "*.refund"),
            *("--execute", "--yes", "--json"),
        )
    )
    assert (only["matched"], only["replayed"]) == (6, 6)
    assert only["by_task"] == {REFUND: 6}
    arrived = family.drain(family.queue_url)
    assert {decode(m["Body"]).task for m in arrived} == {REFUND}

    rest = json_of(
        cli.raising("replay", path, "--to", "onion-checkout", "--execute", "--yes", "--json")
    )
    assert (rest["matched"], rest["replayed"], rest["already_sent"]) == (13, 7, 6)
    arrived += family.drain(family.queue_url)
    assert task_ids(arrived) == Counter(m["task_id"] for m in sent.values())


def test_replay_into_a_fifo_queue_keeps_message_group_ids_and_order(
    sqs_client: Any, tmp_path: Path, ledger: SqliteLedger
) -> None:
    fifo = make_family(sqs_client, "onion-orders.fifo")
    order: dict[str, list[str]] = {}
    for i in range(14):
        group = f"user-{i % 3}"
        task_id = f"order-{i:02d}"
        fifo.send_to_dlq(
            encode(REFUND, [i], task_id=task_id),
            MessageGroupId=group,
            MessageDeduplicationId=f"dedup-{i}",
        )
        order.setdefault(group, []).append(task_id)
    target = resolve_target(load_layout(None), "onion-orders.fifo", lambda r: SqsBroker(sqs_client))
    path = str(tmp_path / "fifo.jsonl.gz")
    with open_writer(path) as writer:
        purge_dlq(
            target,
            PurgeOptions(execute=True),
            broker_factory=lambda: SqsBroker(sqs_client),
            writer=writer,
        )
    records = list(read_records(path))
    assert len(records) == 14
    assert all(r.attributes["MessageGroupId"].startswith("user-") for r in records)

    result = replay(sqs_client, path, ledger, to="onion-orders.fifo")
    assert result.moved == 14
    arrived = fifo.drain(fifo.queue_url)
    got: dict[str, list[str]] = {}
    for message in arrived:
        info = decode(message["Body"])
        assert info.task_id is not None
        got.setdefault(message["Attributes"]["MessageGroupId"], []).append(info.task_id)
        key = message["MessageAttributes"][attributes.KEY]["StringValue"]
        assert message["Attributes"]["MessageDeduplicationId"] == key
    assert got == order


def test_replay_is_a_dry_run_by_default(family: Family, tmp_path: Path, cli: Cli) -> None:
    seed(family, [(REFUND, 4), (RECEIPT, 2)])
    path = str(tmp_path / "a.jsonl.gz")
    purge_to(family.client, path)

    data = json_of(cli.raising("replay", path, "--to", "onion-checkout", "--json"))
    assert {"dry_run", "matched", "replayed", "skipped"} <= set(data)
    assert data["dry_run"] is True
    assert (data["matched"], data["replayed"], data["skipped"]) == (6, 6, 0)
    assert family.depth(family.queue_url) == (0, 0)
    # A dry run never creates the ledger.
    assert not (tmp_path / "state" / "ledger.sqlite3").exists()

    text = cli.raising("replay", path, "--to", "onion-checkout")
    assert text.exit_code == 0 and "DRY RUN" in text.stdout
    assert family.depth(family.queue_url) == (0, 0)

    core = replay(family.client, path, None, execute=False)
    assert core.dry_run and core.moved == 6 and core.run_id is None
    assert family.depth(family.queue_url) == (0, 0)


def test_a_replayed_task_that_fails_again_can_be_replayed_from_a_new_archive(
    family: Family, tmp_path: Path, ledger: SqliteLedger
) -> None:
    sent = seed(family, [(REFUND, 3)])
    first = str(tmp_path / "first.jsonl.gz")
    purge_to(family.client, first)
    assert replay(family.client, first, ledger).moved == 3
    # The workers fail them again: back in the DLQ, carrying redrive's stamp.
    for message in family.drain(family.queue_url):
        assert message["MessageAttributes"][attributes.COUNT]["StringValue"] == "1"
        family.send_to_dlq(message["Body"], message["MessageAttributes"])
    second = str(tmp_path / "second.jsonl.gz")
    purge_to(family.client, second)

    # A new failure is a new task run (generation 1), not a duplicate of the first replay.
    assert replay(family.client, second, ledger).moved == 3
    assert replay(family.client, first, ledger).moved == 0
    assert replay(family.client, second, ledger).moved == 0
    arrived = family.drain(family.queue_url)
    assert task_ids(arrived) == Counter(m["task_id"] for m in sent.values())
    assert {m["MessageAttributes"][attributes.COUNT]["StringValue"] for m in arrived} == {"2"}


def test_replay_after_move_sent_the_same_tasks_sends_nothing(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    sent = seed(family, [(REFUND, 5), (RECEIPT, 3)])
    path = str(tmp_path / "snapshot.jsonl.gz")
    assert cli.raising("archive", "checkout", "--archive", path).exit_code == 0
    assert cli.raising("move", "checkout", "--execute", "--yes").exit_code == 0
    assert family.depth() == (0, 0)

    data = json_of(
        cli.raising("replay", path, "--to", "onion-checkout", "--execute", "--yes", "--json")
    )
    assert (data["replayed"], data["already_sent"], data["skipped"]) == (0, 8, 8)
    arrived = family.drain(family.queue_url)
    assert task_ids(arrived) == Counter(m["task_id"] for m in sent.values())


def test_replay_to_another_queue(
    all_families: dict[str, Family], tmp_path: Path, ledger: SqliteLedger
) -> None:
    checkout_family, default = all_families["checkout"], all_families["default"]
    sent = seed(checkout_family, [(REFUND, 3)])
    path = str(tmp_path / "a.jsonl")
    purge_to(checkout_family.client, path)
    result = replay(checkout_family.client, path, ledger, to="onion")
    assert result.moved == 3
    assert checkout_family.depth(checkout_family.queue_url) == (0, 0)
    assert {m["Body"] for m in default.drain(default.queue_url)} == {
        m["body"] for m in sent.values()
    }


@pytest.mark.parametrize(
    ("step", "nth", "arrived_count", "held_count"),
    [
        # Claimed, never sent: held for the operator (it cannot be proven unsent).
        ("claimed", 2, 15, 10),
        # Sent, not yet recorded: it arrived once, and the rerun holds it, never resends.
        ("sent", 2, 25, 10),
        # Recorded as sent: the rerun knows and skips it.
        ("recorded", 1, 25, 0),
    ],
)
def test_a_killed_replay_never_sends_a_task_twice(
    family: Family, tmp_path: Path, step: str, nth: int, arrived_count: int, held_count: int
) -> None:
    sent = seed(family, [(REFUND, 25)])
    path = str(tmp_path / "a.jsonl.gz")
    purge_to(family.client, path)
    calls: Counter[str] = Counter()

    def kill(name: str) -> None:
        calls[name] += 1
        if name == step and calls[name] == nth:
            raise Crash(name)

    ledger_path = tmp_path / "ledger.sqlite3"
    with SqliteLedger(ledger_path) as ledger, pytest.raises(Crash):
        replay(family.client, path, ledger, fault=kill)
    with SqliteLedger(ledger_path) as ledger:
        rerun = replay(family.client, path, ledger)
        again = replay(family.client, path, ledger)
    arrived = task_ids(family.drain(family.queue_url))
    assert set(arrived) <= {m["task_id"] for m in sent.values()}
    assert all(n == 1 for n in arrived.values()), "a task was sent twice"
    # Nothing silently dropped: what may not have arrived is held and reported.
    held = rerun.in_doubt + rerun.skipped["claimed-by-another-run"]
    assert (len(arrived), held) == (arrived_count, held_count)
    assert len(arrived) + held >= len(sent)
    assert again.moved == 0 and again.failed == 0


# -- inspect ARCHIVE ----------------------------------------------------------------------


def test_inspect_archive_groups_like_a_live_inspect(
    family: Family, tmp_path: Path, cli: Cli
) -> None:
    seed(family, [(REFUND, 6), (RECEIPT, 4), (PROGRESS, 2)])
    past = datetime.now(UTC) - timedelta(hours=1)
    family.send_to_dlq(encode(PROGRESS, [9], task_id="gone", expires=past))
    family.send_to_dlq(
        encode(REFUND, [9], task_id="poison"),
        {attributes.COUNT: {"DataType": "Number", "StringValue": "3"}},
    )
    family.send_to_dlq("{not json")
    live = json_of(cli.raising("inspect", "checkout", "--json"))
    assert live["total"] == 15

    path = str(tmp_path / "a.jsonl.gz")
    purge_data = json_of(
        cli.raising("purge", "checkout", "--archive", path, "--execute", "--yes", "--json")
    )
    assert purge_data["purged"] == 15
    offline = json_of(cli.raising("inspect", path, "--json"))
    assert offline["total"] == live["total"]
    assert groups(offline) == groups(live)
    assert [g["task"] for g in offline["groups"]] == [g["task"] for g in live["groups"]]
    assert offline["expired"] == live["expired"] == 1
    assert offline["poison"] == live["poison"] == 1
    assert offline["dlq"] == "onion-checkout-dlq"

    core = inspect_archive(path, limit=5)
    assert core.partial and core.total == 5

    text = cli.raising("inspect", path)
    assert text.exit_code == 0 and REFUND in text.stdout


# -- S3 archives --------------------------------------------------------------------------


def test_s3_archive_round_trip_through_inspect_and_replay(
    family: Family, s3: Any, cli: Cli
) -> None:
    sent = seed(family, [(REFUND, 23), (RECEIPT, 4)])
    live = json_of(cli.raising("inspect", "checkout", "--json"))
    records = purge_to(
        family.client,
        "s3://dlq-archive/checkout",
        tasks=[REFUND],
        s3_client_factory=lambda: s3,
        chunk_records=5,
    )
    assert len(records) == 23
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="dlq-archive")["Contents"]]
    assert len(keys) >= 5 and all(k.endswith(".jsonl.gz") for k in keys)

    offline = json_of(cli.raising("inspect", "s3://dlq-archive/checkout", "--json"))
    assert groups(offline) == {REFUND: groups(live)[REFUND]}

    uri = "s3://dlq-archive/checkout"
    args = ["replay", uri, "--to", "onion-checkout", "--execute", "--yes", "--json"]
    first = json_of(cli.raising(*args))
    assert (first["replayed"], first["skipped"]) == (23, 0)
    assert json_of(cli.raising(*args))["replayed"] == 0
    arrived = family.drain(family.queue_url)
    expected = Counter(m["task_id"] for m in sent.values() if m["task"] == REFUND)
    assert task_ids(arrived) == expected
    assert {m["Body"] for m in arrived} == {r.body for r in records}


# -- damaged and missing archives ---------------------------------------------------------


def test_replay_of_a_killed_purges_archive_sends_the_intact_records_and_warns(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    seed(family, [(REFUND, 25)])
    path = tmp_path / "a.jsonl.gz"
    # Killed: the writer never closes, so its header stays open.
    monkeypatch.setattr(LocalArchiveWriter, "_seal", lambda self: None)
    records = purge_to(family.client, str(path))
    with path.open("ab") as handle:
        handle.write(unfinished_member()[:-20])  # cut as a writer killed mid-batch leaves it
    intact = list(read_records(str(path), on_problem=lambda _: None))
    assert intact == records

    result = cli.raising("replay", str(path), "--to", "onion-checkout", "--execute", "--yes")
    assert result.exit_code == 0, result.output
    assert "incomplete gzip member" in result.stderr and "stopped mid-batch" in result.stderr
    assert "DAMAGED" not in result.stdout
    arrived = family.drain(family.queue_url)
    assert {m["Body"] for m in arrived} == {r.body for r in intact}


def unfinished_member() -> bytes:
    """A whole gzip member; cut short, it is what a writer killed mid-batch leaves."""
    return gzip.compress(b'{"v":1,"message_id":"never-acknowledged"}\n' * 40)


def raw_members(data: bytes) -> list[bytes]:
    found = []
    while data:
        decompressor = zlib.decompressobj(31)
        decompressor.decompress(data)
        size = len(data) - len(decompressor.unused_data)
        found.append(data[:size])
        data = data[size:]
    return found


def damage(path: Path, how: str) -> None:
    """Damage an archive the three ways the issue found, in place."""
    if how == "not-gzip":
        path.write_bytes(b"this is not an archive\n")
        return
    members = raw_members(path.read_bytes())
    assert len(members) >= 4, "needs a header and three batches"
    if how == "truncated":
        # A copy cut in the middle of a member that is not the last.
        path.write_bytes(b"".join(members[:2]) + members[2][: len(members[2]) // 2])
    else:
        flipped = bytearray(members[2])
        flipped[len(flipped) // 2] ^= 0x01
        path.write_bytes(b"".join([*members[:2], bytes(flipped), *members[3:]]))


DAMAGE = ["not-gzip", "truncated", "flipped"]


@pytest.fixture
def damaged(family: Family, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Path, int]:
    """A purge's archive of 30 tasks, then damaged; and how many records still read."""
    seed(family, [(REFUND, 30)])
    path = tmp_path / "purged.jsonl.gz"
    assert len(purge_to(family.client, str(path))) == 30
    damage(path, request.param)
    check = check_archive(str(path), on_problem=lambda _: None)
    assert check.damage is not None
    return path, check.records


@pytest.mark.parametrize("damaged", DAMAGE, indirect=True)
def test_replay_of_a_damaged_archive_sends_nothing_and_says_where(
    family: Family, damaged: tuple[Path, int], cli: Cli
) -> None:
    path, readable = damaged
    assert readable < 30
    for args in (["--execute", "--yes"], []):
        result = cli("replay", str(path), "--to", "onion-checkout", *args)
        assert result.exit_code == 1, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.output
        assert str(path) in lines[0] and "nothing was replayed" in lines[0]
        assert "mid-batch" not in lines[0]
        if readable:
            assert "is damaged at" in lines[0] and "record(s) read before it" in lines[0]
            assert "--allow-partial" in lines[0]
        else:
            # Issue 22, 15: --allow-partial would replay nothing; it is no archive at all.
            assert "is not a redrive archive" in lines[0] and "not gzip" in lines[0]
            assert "--allow-partial" not in lines[0]
    assert family.drain(family.queue_url) == []

    as_json = cli("replay", str(path), "--to", "onion-checkout", "--execute", "--yes", "--json")
    assert as_json.exit_code == 1
    data = json.loads(as_json.stdout)
    assert data["replayed"] == 0 and data["archive"] == str(path)
    assert data["damaged"]["file"] == str(path) and data["damaged"]["readable"] == readable
    assert {"where", "what", "records_read", "offset"} <= set(data["damaged"])
    assert family.drain(family.queue_url) == []


@pytest.mark.parametrize("damaged", ["truncated", "flipped"], indirect=True)
def test_allow_partial_replays_what_reads_cleanly_and_exits_3(
    family: Family, damaged: tuple[Path, int], cli: Cli
) -> None:
    path, readable = damaged
    clean = list(read_records(str(path), on_problem=lambda _: None, on_damage=lambda _: None))
    assert len(clean) == readable > 0
    args = ["replay", str(path), "--to", "onion-checkout", "--execute", "--yes", "--allow-partial"]
    result = cli(*args, "--json")
    assert result.exit_code == 3, result.output
    data = json.loads(result.stdout)
    assert data["replayed"] == readable and data["failed"] == 0
    assert data["damaged"]["readable"] == readable and data["damaged"]["expected"] == 30
    assert "is damaged at" in result.stderr
    arrived = family.drain(family.queue_url)
    assert sorted(m["Body"] for m in arrived) == sorted(r.body for r in clean)

    # Again: nothing is sent twice; the text says what was skipped.
    again = cli(*args)
    assert again.exit_code == 3
    assert "DAMAGED ARCHIVE" in again.stdout and str(path) in again.stdout
    assert family.drain(family.queue_url) == []


@pytest.mark.parametrize("damaged", ["flipped"], indirect=True)
def test_replay_archive_refuses_a_damaged_archive_before_any_send(
    family: Family, damaged: tuple[Path, int], ledger: SqliteLedger
) -> None:
    path, readable = damaged
    sends: list[str] = []
    with pytest.raises(ArchiveDamaged) as caught:
        replay(family.client, str(path), ledger, fault=sends.append)
    assert caught.value.report.readable == readable
    # The engine never started: not one batch was read, claimed or sent.
    assert sends == [] and family.drain(family.queue_url) == []

    partial = replay_archive(
        str(path),
        describe_queue(SqsBroker(family.client), "onion-checkout"),
        ledger,
        MoveOptions(selection=Selection(), execute=True),
        broker_factory=lambda: SqsBroker(family.client),
        allow_partial=True,
    )
    assert partial.move.moved == readable and partial.damage is not None
    assert partial.damage.first.member == 3 and partial.damage.first.records_lost is not None
    assert len(family.drain(family.queue_url)) == readable


@pytest.mark.parametrize("damaged", DAMAGE, indirect=True)
def test_inspect_of_a_damaged_archive_is_an_error_saying_where(
    damaged: tuple[Path, int], cli: Cli
) -> None:
    path, readable = damaged
    result = cli("inspect", str(path))
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "is damaged at" in lines[0]
    assert f"{readable} message(s)" in result.stdout and "DAMAGED ARCHIVE" in result.stdout

    as_json = cli("inspect", str(path), "--json")
    assert as_json.exit_code == 1
    data = json.loads(as_json.stdout)
    assert data["total"] == readable and data["damaged"]["readable"] == readable
    assert data["damaged"]["records_read"] <= readable and data["damaged"]["where"]


def test_inspect_of_a_killed_purges_archive_warns_and_exits_0(
    family: Family, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    seed(family, [(REFUND, 12)])
    path = tmp_path / "killed.jsonl.gz"
    monkeypatch.setattr(LocalArchiveWriter, "_seal", lambda self: None)
    purge_to(family.client, str(path))
    with path.open("ab") as handle:
        handle.write(unfinished_member()[:50])
    result = cli("inspect", str(path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["damaged"] is None
    assert json.loads(result.stdout)["total"] == 12
    assert "stopped mid-batch" in result.stderr


def test_s3_damaged_part_refuses_the_replay_naming_the_object(
    family: Family, s3: Any, cli: Cli
) -> None:
    seed(family, [(REFUND, 12)])
    purge_to(
        family.client, "s3://dlq-archive/checkout", s3_client_factory=lambda: s3, chunk_records=4
    )
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="dlq-archive")["Contents"])
    body = bytearray(s3.get_object(Bucket="dlq-archive", Key=keys[2])["Body"].read())
    body[len(body) // 2] ^= 0x01
    s3.put_object(Bucket="dlq-archive", Key=keys[2], Body=bytes(body))

    args = ["replay", "s3://dlq-archive/checkout", "--to", "onion-checkout", "--execute", "--yes"]
    result = cli(*args)
    assert result.exit_code == 1 and f"s3://dlq-archive/{keys[2]}" in result.stderr
    assert family.drain(family.queue_url) == []
    partial = cli(*args, "--allow-partial", "--json")
    assert partial.exit_code == 3 and json.loads(partial.stdout)["replayed"] == 8
    inspected = cli("inspect", "s3://dlq-archive/checkout", "--json")
    assert inspected.exit_code == 1
    assert json.loads(inspected.stdout)["damaged"]["file"] == f"s3://dlq-archive/{keys[2]}"


def test_replay_errors_are_one_line(family: Family, tmp_path: Path, cli: Cli) -> None:
    missing = cli(
        "replay", str(tmp_path / "nope.jsonl.gz"), "--to", "onion-checkout", "--execute", "--yes"
    )
    assert missing.exit_code == 1 and "Traceback" not in missing.output
    assert len(missing.stderr.strip().splitlines()) == 1 and "no archive" in missing.stderr

    path = tmp_path / "a.jsonl"
    path.write_text("")
    no_queue = cli("replay", str(path), "--to", "no-such-queue")
    assert no_queue.exit_code == 1 and "Traceback" not in no_queue.output
    assert len(no_queue.stderr.strip().splitlines()) == 1


# -- the whole story ----------------------------------------------------------------------


def test_purge_one_task_then_replay_it_every_task_once(
    family: Family, tmp_path: Path, samples: list[dict[str, Any]], cli: Cli
) -> None:
    # Real Celery 5.7 messages of this family plus more of several tasks.
    for sample in samples:
        if sample["queue"] == "onion-checkout":
            family.send_to_dlq(sample["Body"], sample["MessageAttributes"])
    sent = seed(family, [(IBFT, 8), (REFUND, 6), (RECEIPT, 5)])
    sample_ids = {decode(s["Body"]).task_id for s in samples if s["queue"] == "onion-checkout"}
    expected_ids = sample_ids | {m["task_id"] for m in sent.values() if m["task"] == IBFT}
    assert len(expected_ids) == 10

    live = json_of(cli.raising("inspect", "checkout", "--json"))
    assert groups(live)[IBFT]["count"] == 10

    path = str(tmp_path / "ibft.jsonl.gz")
    purged = json_of(
        cli.raising(
            *("purge", "checkout", "--task", IBFT, "--archive", path),
            *("--execute", "--yes", "--json"),
        )
    )
    assert {"dry_run", "matched", "purged", "archive"} <= set(purged)
    assert (purged["dry_run"], purged["matched"], purged["purged"]) == (False, 10, 10)
    assert purged["archive"] == path
    assert family.depth() == (11, 0)

    records = list(read_records(path))
    assert {r.task for r in records} == {IBFT}
    assert {r.task_id for r in records} == expected_ids
    assert groups(json_of(cli.raising("inspect", path, "--json"))) == {IBFT: groups(live)[IBFT]}

    args = ["replay", path, "--to", "onion-checkout", "--execute", "--yes", "--json"]
    first = json_of(cli.raising(*args))
    assert (first["replayed"], first["failed"], first["in_doubt"]) == (10, 0, 0)
    second = json_of(cli.raising(*args))
    assert (second["replayed"], second["skipped"]) == (0, 10)

    arrived = family.drain(family.queue_url)
    assert task_ids(arrived) == Counter(dict.fromkeys(expected_ids, 1))
    assert {m["Body"] for m in arrived} == {r.body for r in records}
    # The other tasks never left the DLQ.
    left = family.drain(family.dlq_url)
    assert Counter(decode(m["Body"]).task for m in left) == Counter({REFUND: 6, RECEIPT: 5})


def test_archive_lines_are_what_replay_reads(tmp_path: Path, family: Family) -> None:
    # A human can read the archive with zcat; replay reads the same lines.
    seed(family, [(REFUND, 2)])
    path = tmp_path / "a.jsonl.gz"
    records = purge_to(family.client, str(path))
    lines = [json.loads(x) for x in gzip.decompress(path.read_bytes()).splitlines()]
    assert [line["message_id"] for line in lines] == [r.message_id for r in records]
    assert all(line["v"] == 1 and line["task"] == REFUND for line in lines)
