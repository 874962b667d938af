"""One broker for every worker thread where that is safe (issue 25, item 5): on the lean SQS
path a run's ``--workers`` share one broker (one thread-safe transport, one connection pool)
instead of two botocore clients each; botocore's path keeps one broker per worker. The
command's brokers (the CLI's Context) and each ``--processes`` child's (ChildRun) alike."""

from __future__ import annotations

import threading
from typing import Any, cast

from conftest import Cli, Family, as_json

from redrive.aws.session import AwsSettings
from redrive.broker import BrokerSettings
from redrive.cli.context import Context
from redrive.config import SqsClient
from redrive.dlq.scan import shared_by_workers
from redrive.runs.processes import ChildRun, Wiring
from redrive.sandbox.encoder import encode


def context(client: SqsClient) -> Context:
    return Context(aws=AwsSettings(), config=None, sqs_client=client)


def test_the_lean_path_gives_every_worker_of_a_command_one_broker(family: Family) -> None:
    ctx = context("lean")
    dlq = ctx.target("checkout")
    factory = ctx.broker_of(dlq)
    first, *others = [factory() for _ in range(4)]
    assert shared_by_workers(first)
    assert all(other is first for other in others)
    # The broker that resolved the target is the same one: one broker for the command.
    assert ctx.broker_for(dlq.region) is first


def test_botocores_path_gives_each_worker_a_broker_of_its_own(family: Family) -> None:
    ctx = context("botocore")
    factory = ctx.broker_of(ctx.target("checkout"))
    brokers = [factory() for _ in range(4)]
    assert not shared_by_workers(brokers[0])
    assert len({id(b) for b in brokers}) == 4


def child(client: SqsClient) -> ChildRun:
    wiring = Wiring.of(AwsSettings(), broker=BrokerSettings(sqs_client=client))
    return ChildRun(
        wiring=wiring, shares=cast(Any, None), stop=threading.Event(), observer=cast(Any, None)
    )


def test_a_childs_workers_share_a_broker_on_the_lean_path_only(family: Family) -> None:
    lean = child("lean")
    assert lean.broker() is lean.broker()
    botocore = child("botocore")
    assert botocore.broker() is not botocore.broker()


def test_workers_sharing_a_lean_broker_move_every_message_once(family: Family, cli: Cli) -> None:
    for i in range(60):
        family.send_to_dlq(encode("apps.shop.tasks.charge", [i], {}, task_id=f"charge-{i}"))
    args = ("--sqs-client", "lean", "move", "checkout", "--execute", "--yes", "--json")
    result = as_json(cli.ok(*args, "--workers", "4"))
    assert (result["moved"], result["failed"], result["in_doubt"]) == (60, 0, 0)
    assert family.depth() == (0, 0)
    assert family.depth(family.queue_url) == (60, 0)
