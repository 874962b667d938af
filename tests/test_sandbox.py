"""The sandbox: a moto server on loopback, the layout's queues, and DLQs seeded like SQS does.

moto keeps its state in module globals, so every in-process server here shares one set of
queues: each test that creates queues uses names no other test uses.
"""

from __future__ import annotations

import base64
import collections
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli

from redrive import sandbox
from redrive.config import DEFAULT_DLQ_RETENTION_SECONDS, Family, Layout, built_in_layout
from redrive.messages import UNKNOWN_TASK, decode

PER_FAMILY = 20
ROOT = Path(__file__).resolve().parent.parent
TASKS = {
    "checkout": {
        "apps.webhooks.tasks.save_checkout_ibft",
        "apps.payments.tasks.capture_payment",
        "apps.payments.tasks.refund",
    },
    "default": {
        "apps.notifications.tasks.send_email",
        "apps.users.tasks.activate_user",
        "apps.reports.tasks.export_csv",
        # Issue 13: dead-lettered before the onion split, and a task deleted since.
        "apps.webhooks.tasks.save_checkout_ibft",
        "apps.engagements.tasks.save_progress_lesson",
        "apps.inventory.tasks.resync_stock",
    },
    "progress": {
        "apps.engagements.tasks.save_progress_lesson",
        "apps.engagements.tasks.save_progress_quiz",
    },
}


@dataclass
class Seeded:
    server: sandbox.SandboxServer
    client: Any
    now: datetime
    """When the seeding said it was: enqueue times count back from it."""
    families: dict[str, sandbox.SeededFamily]
    depths: dict[str, tuple[int, int]]
    """Family -> (source queue depth, DLQ depth) right after seeding."""
    messages: dict[str, list[dict[str, Any]]]
    """Family -> every message of its DLQ (received, then released)."""


def depth(client: Any, url: str) -> int:
    attrs = client.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return sum(int(value) for value in attrs.values())


def peek_all(client: Any, url: str) -> list[dict[str, Any]]:
    """Every message of a queue, left in it (received with a lease, then released)."""
    out: list[dict[str, Any]] = []
    while True:
        got = client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=60,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        ).get("Messages", [])
        if not got:
            break
        out.extend(got)
    for start in range(0, len(out), 10):
        batch = out[start : start + 10]
        client.change_message_visibility_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
                for i, m in enumerate(batch)
            ],
        )
    return out


@pytest.fixture(scope="module")
def seeded() -> Iterator[Seeded]:
    with sandbox.start_server() as server:
        # moto's state is per process and outlives servers: xdist may run this module's
        # tests in more than one stretch, and each seeding must start from nothing.
        urllib.request.urlopen(
            urllib.request.Request(f"{server.endpoint_url}/moto-api/reset", method="POST"),
            timeout=10,
        ).close()
        client = sandbox.client_for(server)
        now = datetime.now(UTC)
        try:
            families = {
                s.family: s
                for s in sandbox.seed(client, built_in_layout({}), per_family=PER_FAMILY, now=now)
            }
            depths = {
                name: (depth(client, s.queue_url), depth(client, s.dlq_url))
                for name, s in families.items()
            }
            messages = {name: peek_all(client, s.dlq_url) for name, s in families.items()}
            yield Seeded(server, client, now, families, depths, messages)
        finally:
            client.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except OSError:
        return True


# -- seeding the built-in layout ------------------------------------------------------------


def test_seeding_fills_each_dlq_and_empties_each_source_queue(seeded: Seeded) -> None:
    assert set(seeded.families) == {"checkout", "default", "progress"}
    for name, family in seeded.families.items():
        assert seeded.depths[name] == (0, PER_FAMILY)
        assert family.messages == PER_FAMILY
        assert sum(family.by_task.values()) == PER_FAMILY
        assert len(seeded.messages[name]) == PER_FAMILY
        # Released again: the DLQ still holds them all.
        assert depth(seeded.client, family.dlq_url) == PER_FAMILY


def test_queues_follow_the_built_in_layout(seeded: Seeded) -> None:
    urls = {(s.queue_url, s.dlq_url) for s in seeded.families.values()}
    base = seeded.server.endpoint_url
    assert urls == {
        (f"{base}/123456789012/{queue}", f"{base}/123456789012/{queue}-dlq")
        for queue in ("onion-checkout", "onion", "onion-progress")
    }


def test_redrive_policy_and_dlq_retention(seeded: Seeded) -> None:
    client = seeded.client
    for family in seeded.families.values():
        source = client.get_queue_attributes(
            QueueUrl=family.queue_url, AttributeNames=["RedrivePolicy"]
        )["Attributes"]
        dlq = client.get_queue_attributes(
            QueueUrl=family.dlq_url, AttributeNames=["QueueArn", "MessageRetentionPeriod"]
        )["Attributes"]
        policy = json.loads(source["RedrivePolicy"])
        assert policy == {"deadLetterTargetArn": dlq["QueueArn"], "maxReceiveCount": 5}
        assert int(dlq["MessageRetentionPeriod"]) == 14 * 86400 == DEFAULT_DLQ_RETENTION_SECONDS


def test_dlq_messages_were_received_max_receive_count_times(seeded: Seeded) -> None:
    for messages in seeded.messages.values():
        counts = [int(m["Attributes"]["ApproximateReceiveCount"]) for m in messages]
        # Five receives from the source queue, plus the peek: SQS carries the count over.
        assert min(counts) >= 5
        assert all(int(m["Attributes"]["SentTimestamp"]) > 0 for m in messages)


def test_dlq_messages_decode_to_the_expected_mix(seeded: Seeded) -> None:
    now = datetime.now(UTC)
    for name, messages in seeded.messages.items():
        infos = [decode(m["Body"]) for m in messages]
        tasks = collections.Counter(info.task for info in infos)
        assert tasks == seeded.families[name].by_task
        assert set(tasks) == TASKS[name] | {UNKNOWN_TASK}
        assert tasks[UNKNOWN_TASK] == 2
        assert {i.body_format for i in infos if i.task == UNKNOWN_TASK} == {"json", "text"}

        celery = [info for info in infos if info.task != UNKNOWN_TASK]
        protocols = collections.Counter(info.protocol for info in celery)
        assert protocols[2] > protocols[1] > 0
        assert sum(info.is_expired(now) for info in celery) >= 1
        assert sum(info.eta is not None for info in celery) >= 1
        assert all(info.task_id for info in celery)
        assert len({info.task_id for info in celery}) == len(celery)
        assert collections.Counter(info.body_format for info in celery) == {
            "kombu-base64": len(celery) - 1,
            "kombu-json": 1,
        }
        assert all(info.note is None for info in celery), [i.note for i in celery]

        with_attributes = [m["MessageAttributes"] for m in messages if m.get("MessageAttributes")]
        assert len(with_attributes) == 1
        assert with_attributes[0]["trace-id"]["DataType"] == "String"
        assert with_attributes[0]["tenant-id"]["DataType"] == "Number"


def test_checkout_tasks_carry_realistic_arguments(seeded: Seeded) -> None:
    infos = [decode(m["Body"]) for m in seeded.messages["checkout"]]
    ibft = [i for i in infos if i.task == "apps.webhooks.tasks.save_checkout_ibft"]
    assert ibft
    assert all(i.kwargs is not None and "IBFT-" in i.kwargs for i in ibft)


# -- enqueue times: the stories the runbooks diagnose --------------------------------------


def identity(body: str) -> str:
    return decode(body).task_id or body


def sent_ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def test_dlq_messages_carry_the_enqueue_times_of_their_stories(seeded: Seeded) -> None:
    """SQS dates what it is sent; the sandbox's DLQs hold messages enqueued hours and days
    ago, exactly when sample_dlq says, each received for the first time after it was sent."""
    for name, family in seeded.families.items():
        queue = family.queue_url.rsplit("/", 1)[1]
        # By task id: kombu's delivery_tag makes every encoding of a body differ.
        expected = {
            identity(m.body): m
            for m in sandbox.sample_dlq(name, PER_FAMILY, now=seeded.now, queue=queue)
        }
        assert {story: n for story, n in family.by_story.items()} == dict(
            collections.Counter(m.story for m in expected.values())
        )
        for message in seeded.messages[name]:
            sample = expected[identity(message["Body"])]
            attributes = message["Attributes"]
            assert int(attributes["SentTimestamp"]) == sent_ms(sample.sent_at)
            first = int(attributes["ApproximateFirstReceiveTimestamp"])
            assert sent_ms(sample.sent_at) < first < sent_ms(seeded.now)
    assert set(seeded.families["checkout"].by_story) == {"blip", "outage", "poison"}


def test_sample_dlq_tells_a_blip_an_outage_and_a_poison_task_apart() -> None:
    now = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    messages = sandbox.sample_dlq("checkout", 600, seed=11, now=now)
    by_story: dict[str, list[sandbox.SampleMessage]] = collections.defaultdict(list)
    for message in messages:
        by_story[message.story].append(message)
    tasks = {story: {decode(m.body).task for m in group} for story, group in by_story.items()}
    # The blip: every task, within 4 minutes, 2 hours ago.
    assert tasks["blip"] == TASKS["checkout"] | {UNKNOWN_TASK}
    assert len(by_story["blip"]) > len(messages) / 2
    # The outage: one task, over an hour, yesterday; the poison task: one, over days.
    assert tasks["outage"] == {"apps.payments.tasks.capture_payment"}
    assert tasks["poison"] == {"apps.payments.tasks.refund"}
    for story, group in by_story.items():
        window = sandbox.STORIES[story]
        times = [m.sent_at for m in group]
        assert now - window.oldest <= min(times) and max(times) <= now - window.newest
    spans = {
        story: max(m.sent_at for m in g) - min(m.sent_at for m in g)
        for story, g in by_story.items()
    }
    assert spans["blip"] <= timedelta(minutes=4)
    assert timedelta(minutes=30) < spans["outage"] <= timedelta(hours=1)
    assert spans["poison"] > timedelta(days=3)
    # Every story well inside the DLQ's 14-day retention.
    assert min(m.sent_at for m in messages) > now - timedelta(days=6)
    # An expired task expired while it sat in the DLQ: after it was sent, before now.
    expired = [(m, decode(m.body)) for m in messages if decode(m.body).is_expired(now)]
    assert expired
    for message, info in expired:
        assert info.expires is not None and message.sent_at < info.expires < now


def dry_run(seeded: Seeded, *args: str) -> dict[str, Any]:
    env = {k: v for k, v in _subprocess_env().items() if not k.startswith(("AWS_", "REDRIVE_"))}
    env.update(sandbox.sandbox_env(seeded.server))
    env["REDRIVE_RECEIVE_WAIT"] = "0"
    done = subprocess.run(
        [sys.executable, "-m", "redrive", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


@pytest.mark.e2e
def test_age_filters_and_inspect_tell_the_stories_apart(seeded: Seeded, tmp_path: Path) -> None:
    checkout = seeded.families["checkout"]
    stories = checkout.by_story
    newer = dry_run(
        seeded, "move", "checkout", "--newer-than", "6h", "--ledger", str(tmp_path / "l")
    )
    older = dry_run(
        seeded, "move", "checkout", "--older-than", "6h", "--ledger", str(tmp_path / "l")
    )
    assert newer["matched"] == stories["blip"]
    assert older["matched"] == stories["outage"] + stories["poison"]
    yesterday = dry_run(
        seeded,
        "move",
        "checkout",
        "--older-than",
        "25h",
        "--newer-than",
        "28h",
        "--ledger",
        str(tmp_path / "l"),
    )
    queue = checkout.queue_url.rsplit("/", 1)[1]
    outage = [
        m
        for m in sandbox.sample_dlq("checkout", PER_FAMILY, now=seeded.now, queue=queue)
        if seeded.now - timedelta(hours=28) < m.sent_at < seeded.now - timedelta(hours=25)
    ]
    assert yesterday["matched"] == len(outage) == stories["outage"]

    groups = {g["task"]: g for g in dry_run(seeded, "inspect", "checkout")["groups"]}
    ibft = groups["apps.webhooks.tasks.save_checkout_ibft"]  # a task of the blip only
    span = datetime.fromisoformat(ibft["newest"]) - datetime.fromisoformat(ibft["oldest"])
    assert span <= timedelta(minutes=4)
    refund = groups["apps.payments.tasks.refund"]  # the poison task, caught by the blip too
    assert datetime.fromisoformat(refund["oldest"]) < seeded.now - timedelta(hours=7)


# -- every start: fresh tasks, a fresh state directory ----------------------------------------


def run_in_thread(
    layout: Layout, **options: Any
) -> tuple[sandbox.SandboxServer, list[sandbox.SeededFamily], threading.Event, Any]:
    """Start sandbox.run in a thread; returns its server, what it seeded, its stop event and
    a function that stops it and returns run's result."""
    stop = threading.Event()
    ready: list[tuple[sandbox.SandboxServer, list[sandbox.SeededFamily]]] = []
    result: list[Any] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            result.append(
                sandbox.run(
                    0,
                    layout,
                    on_ready=lambda server, seeded: ready.append((server, seeded)),
                    stop=stop,
                    **options,
                )
            )
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    deadline = time.monotonic() + 30
    while not ready and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not ready:
        stop.set()
        thread.join(10)
        pytest.fail(f"the sandbox did not start: {errors}")

    def finish() -> Any:
        stop.set()
        thread.join(10)
        assert not thread.is_alive() and not errors, errors
        return result[0]

    return ready[0][0], ready[0][1], stop, finish


def task_ids(server: sandbox.SandboxServer, url: str) -> set[str]:
    client = sandbox.client_for(server)
    try:
        return {identity(m["Body"]) for m in peek_all(client, url)}
    finally:
        client.close()


def test_each_start_draws_fresh_task_ids_and_gets_a_fresh_state_dir(tmp_path: Path) -> None:
    seen: list[tuple[set[str], Path]] = []
    for start in range(2):
        # One family, new queues: moto's state outlives a server of this process.
        layout = Layout(families=(Family("fresh", f"fresh-jobs-{start}"),), source="t")
        server, seeded, _, finish = run_in_thread(layout, per_family=12, state_root=tmp_path)
        state_dir = server.state_dir
        assert state_dir is not None and state_dir.is_dir() and state_dir.parent == tmp_path
        assert state_dir.name.startswith(f"redrive-sandbox-{server.port}-")
        assert f"export REDRIVE_STATE_DIR={state_dir}" in sandbox.export_lines(server)
        assert sandbox.sandbox_env(server)["REDRIVE_STATE_DIR"] == str(state_dir)
        assert f"# ledger and audit trail of this sandbox: {state_dir}" in (
            sandbox.seeded_lines(server, seeded)
        )
        seen.append((task_ids(server, seeded[0].dlq_url), state_dir))
        assert finish() is None
        assert not state_dir.exists()  # removed when it stopped
    (first_ids, first_dir), (second_ids, second_dir) = seen
    assert len(first_ids) == len(second_ids) == 12
    assert not first_ids & second_ids
    assert first_dir != second_dir


def test_a_seed_draws_the_same_tasks_and_keep_state_keeps_the_directory(tmp_path: Path) -> None:
    ids = []
    for keep in (False, True):
        layout = Layout(families=(Family("again", f"again-jobs-{keep}"),), source="t")
        server, seeded, _, finish = run_in_thread(
            layout, per_family=6, seed=1234, keep_state=keep, state_root=tmp_path
        )
        assert server.seed == 1234
        assert "# tasks drawn from --seed 1234" in sandbox.seeded_lines(server, seeded)
        ids.append(task_ids(server, seeded[0].dlq_url))
        kept = finish()
        assert kept == (server.state_dir if keep else None)
    assert ids[0] == ids[1]
    assert kept is not None and (kept / "REDRIVE-SANDBOX-STATE").is_file()


def test_remove_state_dir_removes_only_what_the_sandbox_made(tmp_path: Path) -> None:
    made = sandbox.new_state_dir(4566, root=tmp_path)
    (made / "ledger.sqlite3").write_text("")
    other = tmp_path / "someone-elses"
    other.mkdir()
    link = tmp_path / "link"
    link.symlink_to(made)
    plain = tmp_path / "a-file"
    plain.write_text("")
    assert not sandbox.remove_state_dir(other) and other.is_dir()
    assert not sandbox.remove_state_dir(link) and made.is_dir()
    assert not sandbox.remove_state_dir(plain) and plain.exists()
    assert not sandbox.remove_state_dir(tmp_path / "absent")
    assert sandbox.remove_state_dir(made) and not made.exists()
    assert oct(sandbox.new_state_dir(0, root=tmp_path).stat().st_mode & 0o777) == "0o700"


def test_seed_needs_a_server_of_this_process_with_the_extensions() -> None:
    with sandbox.start_server(extended=False) as stock:
        client = sandbox.client_for(stock)
        try:
            with pytest.raises(ValueError, match="extended=True"):
                sandbox.seed(client, Layout(families=(Family("s", "stock-jobs"),), source="t"))
        finally:
            client.close()
    elsewhere = sandbox.SandboxServer("http://127.0.0.1:9", "127.0.0.1", 9)
    client = sandbox.client_for(elsewhere)
    try:
        with pytest.raises(ValueError, match="dead_letter"):
            sandbox.seed(client, Layout(families=(Family("e", "else-jobs"),), source="t"))
    finally:
        client.close()


def test_export_lines_of_a_seeded_sandbox_keep_the_users_ledger_out(tmp_path: Path) -> None:
    server = sandbox.SandboxServer(
        "http://127.0.0.1:4566", "127.0.0.1", 4566, state_dir=tmp_path / "state dir"
    )
    assert sandbox.export_lines(server) == [
        "export AWS_ENDPOINT_URL=http://127.0.0.1:4566",
        "export AWS_ACCESS_KEY_ID=sandbox",
        "export AWS_SECRET_ACCESS_KEY=sandbox",
        "export AWS_DEFAULT_REGION=us-east-1",
        f"export REDRIVE_STATE_DIR='{tmp_path}/state dir'",
        "unset REDRIVE_LEDGER",
        "unset AWS_PROFILE",
    ]


# -- the pieces -----------------------------------------------------------------------------


def _envelope(body: str) -> dict[str, Any]:
    text = body if body.startswith("{") else base64.b64decode(body).decode()
    envelope: dict[str, Any] = json.loads(text)
    return envelope


def test_sample_messages_mix_and_determinism() -> None:
    now = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    first = sandbox.sample_messages("checkout", 40, seed=3, now=now)
    again = sandbox.sample_messages("checkout", 40, seed=3, now=now)
    other = sandbox.sample_messages("checkout", 40, seed=4, now=now)

    def fingerprint(entries: list[tuple[str, dict[str, Any]]]) -> list[tuple[Any, ...]]:
        out: list[tuple[Any, ...]] = []
        for body, attributes in entries:
            i = decode(body)
            out.append((i.task, i.task_id, i.protocol, i.args, i.kwargs, i.eta, i.expires))
            out.append(tuple(sorted(attributes)))
        return out

    assert len(first) == 40
    assert fingerprint(first) == fingerprint(again)
    assert fingerprint(first) != fingerprint(other)

    kombu = [_envelope(body) for body, _ in first if decode(body).task != UNKNOWN_TASK]
    compressed = [e["headers"]["compression"] for e in kombu if "compression" in e["headers"]]
    assert sorted(compressed) == ["application/x-bz2", "application/x-gzip"]
    routing = {e["properties"]["delivery_info"]["routing_key"] for e in kombu}
    assert routing == {"checkout"}
    assert sum(decode(body).is_expired(now) for body, _ in first) == 40 // 12


@pytest.mark.parametrize(("count", "odd"), [(0, 0), (1, 0), (3, 0), (7, 1), (12, 2)])
def test_sample_messages_small_counts(count: int, odd: int) -> None:
    tasks = [decode(body).task for body, _ in sandbox.sample_messages("progress", count)]
    assert len(tasks) == count
    assert tasks.count(UNKNOWN_TASK) == odd
    assert set(tasks) - {UNKNOWN_TASK} <= TASKS["progress"]


def test_sample_messages_for_an_unknown_family_name_its_tasks_after_it() -> None:
    tasks = {decode(b).task for b, _ in sandbox.sample_messages("Billing-EU", 12, queue="q")}
    assert tasks == {
        "apps.billing_eu.tasks.process",
        "apps.billing_eu.tasks.sync",
        UNKNOWN_TASK,
    }


def test_create_layout_is_idempotent_and_handles_fifo_and_urls(seeded: Seeded) -> None:
    client = seeded.client
    layout = Layout(
        families=(
            Family("orders", "layout-orders.fifo", max_receive_count=3),
            Family("jobs", "https://sqs.us-east-1.amazonaws.com/210987654321/layout-jobs"),
            Family("named", "layout-named", dlq="layout-named-graveyard"),
        ),
        source="test",
    )
    created = sandbox.create_layout(client, layout)
    names = [(f.name, q.rsplit("/", 1)[1], d.rsplit("/", 1)[1]) for f, q, d in created]
    assert names == [
        ("orders", "layout-orders.fifo", "layout-orders-dlq.fifo"),
        ("jobs", "layout-jobs", "layout-jobs-dlq"),
        ("named", "layout-named", "layout-named-graveyard"),
    ]
    fifo_dlq = client.get_queue_attributes(QueueUrl=created[0][2], AttributeNames=["All"])
    assert fifo_dlq["Attributes"]["FifoQueue"] == "true"

    def policy(url: str) -> dict[str, Any]:
        attrs = client.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
        result: dict[str, Any] = json.loads(attrs["Attributes"]["RedrivePolicy"])
        return result

    assert policy(created[0][1])["maxReceiveCount"] == 3
    # Again, with other settings: same queues, new policy, no QueueAlreadyExists.
    again = sandbox.create_layout(client, layout, max_receive_count=7, dlq_retention_seconds=3600)
    assert [(q, d) for _, q, d in again] == [(q, d) for _, q, d in created]
    assert policy(created[0][1])["maxReceiveCount"] == 7
    retention = client.get_queue_attributes(
        QueueUrl=created[1][2], AttributeNames=["MessageRetentionPeriod"]
    )["Attributes"]["MessageRetentionPeriod"]
    assert retention == "3600"

    with pytest.raises(ValueError, match="maxReceiveCount"):
        sandbox.create_layout(client, layout, max_receive_count=0)


def test_dead_letter_into_a_fifo_dlq(seeded: Seeded) -> None:
    client = seeded.client
    layout = Layout(families=(Family("fifo", "dl-fifo.fifo", max_receive_count=2),), source="t")
    [(_, queue_url, dlq_url)] = sandbox.create_layout(client, layout)
    entries = sandbox.sample_messages("fifo", 12)
    assert sandbox.dead_letter(client, queue_url, entries) == 12
    # A second seeding within SQS's deduplication window is not dropped.
    assert sandbox.dead_letter(client, queue_url, entries[:3]) == 3
    assert depth(client, dlq_url) == 15
    # FIFO: one group, so a receive stops at the first 10 while they are in flight.
    messages = peek_all(client, dlq_url)
    assert len(messages) == 10
    assert {m["Attributes"]["MessageGroupId"] for m in messages} == {"default"}
    assert min(int(m["Attributes"]["ApproximateReceiveCount"]) for m in messages) >= 2


def test_dead_letter_needs_a_redrive_policy(seeded: Seeded) -> None:
    url = seeded.client.create_queue(QueueName="dl-no-policy")["QueueUrl"]
    with pytest.raises(ValueError, match="no RedrivePolicy"):
        sandbox.dead_letter(seeded.client, url, [("x", {})])


def test_family_region_is_where_its_queues_are(seeded: Seeded) -> None:
    layout = Layout(
        families=(Family("eu", "region-jobs", region="eu-west-1"),), source="t", prefix=None
    )
    [family] = sandbox.seed(seeded.client, layout, per_family=2)
    assert family.messages == 2
    eu = sandbox.client_for(seeded.server, region="eu-west-1")
    try:
        assert [
            u.rsplit("/", 1)[1] for u in eu.list_queues(QueueNamePrefix="region-")["QueueUrls"]
        ] == [
            "region-jobs-dlq",
            "region-jobs",
        ]
    finally:
        eu.close()
    assert "QueueUrls" not in seeded.client.list_queues(QueueNamePrefix="region-")


# -- the server -----------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "10.0.0.1", "example.com", ""])
def test_non_loopback_hosts_are_refused(host: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        sandbox.start_server(host=host)


@pytest.mark.parametrize(
    ("host", "bound"), [("localhost", "127.0.0.1"), ("127.0.0.2", "127.0.0.2")]
)
def test_loopback_hosts_are_served(host: str, bound: str) -> None:
    with sandbox.start_server(host=host) as server:
        assert server.host == bound
        assert server.endpoint_url == f"http://{bound}:{server.port}"
        client = sandbox.client_for(server)
        try:
            assert client.list_queues()["ResponseMetadata"]["HTTPStatusCode"] == 200
        finally:
            client.close()


def test_ipv6_loopback_endpoint_is_bracketed() -> None:
    try:
        server = sandbox.start_server(host="::1")
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    with server:
        assert server.endpoint_url == f"http://[::1]:{server.port}"


def test_stop_frees_the_port_and_is_idempotent() -> None:
    server = sandbox.start_server()
    port = server.port
    assert not refuses_connections(port)
    server.stop()
    server.stop()
    assert refuses_connections(port)


def test_a_taken_port_raises_instead_of_exiting() -> None:
    with sandbox.start_server() as server, pytest.raises(OSError):
        sandbox.start_server(server.port)


def test_requests_are_not_logged_unless_asked(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="werkzeug")
    for log_requests in (False, True):
        caplog.clear()
        with sandbox.start_server(log_requests=log_requests) as server:
            client = sandbox.client_for(server)
            try:
                client.list_queues()
            finally:
                client.close()
        logged = [r for r in caplog.records if "POST /" in r.getMessage()]
        assert bool(logged) is log_requests


def test_serial_server_hands_each_message_to_one_of_many_receivers() -> None:
    with sandbox.start_server(serial=True) as server:
        setup = sandbox.client_for(server)
        try:
            layout = Layout(families=(Family("serial", "serial-jobs"),), source="t")
            [family] = sandbox.seed(setup, layout, per_family=30)
        finally:
            setup.close()
        received: list[str] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def consume() -> None:
            client = sandbox.client_for(server)
            try:
                while True:
                    got = client.receive_message(
                        QueueUrl=family.dlq_url, MaxNumberOfMessages=3, VisibilityTimeout=60
                    ).get("Messages", [])
                    if not got:
                        return
                    with lock:
                        received.extend(m["MessageId"] for m in got)
                    for m in got:
                        client.delete_message(
                            QueueUrl=family.dlq_url, ReceiptHandle=m["ReceiptHandle"]
                        )
            except BaseException as exc:
                errors.append(exc)
            finally:
                client.close()

        threads = [threading.Thread(target=consume) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not errors
        assert len(received) == len(set(received)) == 30


def test_sandbox_env_and_client_ignore_the_users_profile(
    seeded: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = sandbox.sandbox_env(seeded.server)
    assert env == {
        "AWS_ENDPOINT_URL": seeded.server.endpoint_url,
        "AWS_ACCESS_KEY_ID": "sandbox",
        "AWS_SECRET_ACCESS_KEY": "sandbox",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    assert sandbox.export_lines(seeded.server)[0] == (
        f"export AWS_ENDPOINT_URL={seeded.server.endpoint_url}"
    )
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    client = sandbox.client_for(seeded.server)
    try:
        assert "QueueUrls" in client.list_queues(QueueNamePrefix="onion")
    finally:
        client.close()


def test_run_serves_until_stopped() -> None:
    stop = threading.Event()
    ready: list[tuple[sandbox.SandboxServer, list[sandbox.SeededFamily]]] = []
    errors: list[BaseException] = []
    layout = Layout(families=(Family("run", "run-jobs"),), source="t")

    def target() -> None:
        try:
            sandbox.run(
                0,
                layout,
                per_family=4,
                on_ready=lambda server, seeded: ready.append((server, seeded)),
                stop=stop,
            )
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not ready and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready, errors
        server, seeded = ready[0]
        assert [(s.family, s.messages) for s in seeded] == [("run", 4)]
        client = sandbox.client_for(server)
        try:
            assert depth(client, seeded[0].dlq_url) == 4
        finally:
            client.close()
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
    assert not errors
    assert refuses_connections(server.port)


# -- python -m redrive.sandbox ---------------------------------------------------------------


def _subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _wait_for_port(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not refuses_connections(port):
            return
        if process.poll() is not None:
            pytest.fail(f"sandbox exited: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    process.kill()
    process.wait()
    pytest.fail("sandbox did not start within 30 s")


@pytest.mark.e2e
@pytest.mark.parametrize("serial", [False, True], ids=["threaded", "serial"])
def test_bare_subprocess_answers_and_stops_on_sigterm(tmp_path: Path, serial: bool) -> None:
    port = free_port()
    log = tmp_path / "sandbox.log"
    cmd = [sys.executable, "-m", "redrive.sandbox", "--bare", "--port", str(port)]
    if serial:
        cmd.append("--serial")
    with log.open("wb") as handle:
        process = subprocess.Popen(
            cmd, stdout=handle, stderr=subprocess.STDOUT, env=_subprocess_env(), cwd=tmp_path
        )
    try:
        _wait_for_port(process, port, log)
        server = sandbox.SandboxServer(f"http://127.0.0.1:{port}", "127.0.0.1", port)
        client = sandbox.client_for(server)
        try:
            assert "QueueUrls" not in client.list_queues()  # bare: no queues
        finally:
            client.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    output = log.read_text()
    assert f"SQS on http://127.0.0.1:{port}" in output
    assert "POST / HTTP" in output  # --bare logs requests
    assert refuses_connections(port)


@pytest.mark.e2e
def test_seeded_subprocess_prints_exports_and_stops_on_sigint(tmp_path: Path) -> None:
    config = tmp_path / "redrive.toml"
    config.write_text('[families.cli]\nqueue = "cli-jobs"\n')
    temp = tmp_path / "tmp"
    temp.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "redrive.sandbox", "--per-family", "3", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**_subprocess_env(), "TMPDIR": str(temp)},
        cwd=tmp_path,
    )
    state_dir: Path | None = None
    try:
        assert process.stdout is not None
        lines = []
        for raw in process.stdout:
            lines.append(raw.decode())
            if raw.startswith(b"export REDRIVE_STATE_DIR="):
                state_dir = Path(raw.decode().strip().split("=", 1)[1])
                # The sandbox's own, fresh, while it runs.
                assert state_dir.parent == temp and state_dir.is_dir()
            if raw.startswith(b"unset AWS_PROFILE"):
                break
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=10)
        assert process.returncode == 0, err
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    text = "".join(lines)
    assert "# cli: 3 in cli-jobs-dlq" in text
    assert "export AWS_ENDPOINT_URL=http://127.0.0.1:" in text
    assert "export AWS_ACCESS_KEY_ID=sandbox" in text
    assert "unset REDRIVE_LEDGER\n" in text
    assert b"POST /" not in err  # requests are not logged outside --bare
    assert state_dir is not None and not state_dir.exists()  # removed when it stopped


@pytest.mark.parametrize(
    ("args", "complaint"),
    [(["--messages", "10001"], "10000"), (["--seed", "-1"], "--seed")],
)
def test_cli_sandbox_limits(args: list[str], complaint: str, cli: Cli) -> None:

    result = cli("sandbox", *args)
    assert result.exit_code == 2, result.output
    assert complaint in result.output


def test_cli_sandbox_takes_ten_thousand_messages_a_dlq() -> None:
    from redrive.cli.sandbox import sandbox as command

    option = next(p for p in command.params if p.name == "per_family")
    assert option.type.max == sandbox.MAX_MESSAGES == 10_000  # type: ignore[attr-defined]


@pytest.mark.e2e
def test_where_expired_selects_only_the_tasks_whose_expires_has_passed(
    seeded: Seeded, tmp_path: Path
) -> None:
    """Issue 37, 6: the README's `--where 'expires' --clear-expires` matched every task with
    a deadline, passed or not, and cleared deadlines still to come; the record's `expired`
    is true where inspect counts one (the deadline has passed), so `--where expired` selects
    only those. The sandbox seeds both: passed deadlines and deadlines hours ahead."""
    now = datetime.now(UTC)
    with_expires = expired = 0
    for name, messages in seeded.messages.items():
        infos = [decode(m["Body"]) for m in messages]
        family_expired = sum(info.is_expired(now) for info in infos)
        family_expires = sum(info.expires is not None for info in infos)
        with_expires, expired = with_expires + family_expires, expired + family_expired
        ledger = str(tmp_path / "ledger")
        inspected = dry_run(seeded, "inspect", name, "--where", "expired")
        assert inspected["matched"] == inspected["expired"] == family_expired, inspected
        fixed = dry_run(
            seeded, "move", name, "--where", "expired", "--clear-expires", "--ledger", ledger
        )
        assert fixed["matched"] == family_expired, fixed
        assert (
            dry_run(seeded, "move", name, "--where", "expires", "--ledger", ledger)["matched"]
            == family_expires
        )
    # Both kinds are there: the old example would have cleared deadlines still to come.
    assert with_expires > expired > 0
