"""A moved task that fails again while the move goes on (issue 37, point 2): one run sends each
task once, leaves what came back for the next run, counts it, and stops once too much comes
back. On in-process moto: the source queue's redrive policy (maxReceiveCount 1) sends a
moved task back to the DLQ at its consumer's second receive; the consumer receives every
batch the run has just sent (as a worker that fails them would), without deleting."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli, Family, make_family

from redrive.broker.base import Delivery
from redrive.broker.sqs import SqsBroker
from redrive.broker.sqs.queues import resolve_family
from redrive.config import built_in_layout
from redrive.keys import CLOCK_SLACK
from redrive.ledger import SqliteLedger
from redrive.messages import decode
from redrive.operations.move import MoveEngine, MoveOptions, MoveResult
from redrive.operations.move.owners import ClaimOwners
from redrive.operations.move.returns import (
    MIN_RETURNS_FOR_FRACTION,
    ReturnsLimit,
    died_after,
    parse_returns_limit,
)
from redrive.render.move import move_text
from redrive.runs.observer import Callbacks
from redrive.sandbox.encoder import encode

TASK = "apps.webhooks.tasks.save_checkout"
TASKS = 25


class FailingWorker:
    """Receives what is in the source queue without deleting it, until the redrive policy
    has sent all of it back to the DLQ; counts each task id's first receive (a run)."""

    def __init__(self, family: Family) -> None:
        self.family = family
        self.runs: Counter[str] = Counter()

    def fail_all(self) -> None:
        client, url = self.family.client, self.family.queue_url
        while True:
            got = client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=10,
                VisibilityTimeout=0,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            ).get("Messages", [])
            if not got:
                return
            for message in got:
                if message["Attributes"]["ApproximateReceiveCount"] == "1":
                    self.runs[str(decode(message["Body"]).task_id)] += 1

    def on_step(self, step: str) -> None:
        if step == "deleted":  # a batch sent and done: the worker gets it and fails it
            self.fail_all()


@pytest.fixture
def failing(sqs_client: Any) -> Family:
    """The checkout family, its source queue dead-lettering at the second receive."""
    return make_family(sqs_client, max_receive=1)


def seed(family: Family, n: int = TASKS) -> None:
    for start in range(0, n, 10):
        family.client.send_message_batch(
            QueueUrl=family.dlq_url,
            Entries=[
                {"Id": str(i), "MessageBody": encode(TASK, [i], {}, task_id=f"t-{i}")}
                for i in range(start, min(n, start + 10))
            ],
        )


def move(family: Family, ledger: Path, worker: FailingWorker | None, **options: Any) -> MoveResult:
    layout = built_in_layout({}).family("checkout")
    assert layout is not None
    opened = SqliteLedger(ledger)
    try:
        return MoveEngine(
            resolve_family(SqsBroker(family.client), layout),
            opened,
            MoveOptions(execute=True, **options),
            broker_factory=lambda: SqsBroker(family.client),
            observer=Callbacks(on_step=worker.on_step if worker else None),
        ).run()
    finally:
        opened.close()


@pytest.mark.parametrize("pipelined", [False, True], ids=["one-stage", "two-stage"])
def test_a_task_that_fails_again_during_the_run_is_sent_once_and_left_for_the_next_run(
    failing: Family, tmp_path: Path, pipelined: bool
) -> None:
    seed(failing)
    worker = FailingWorker(failing)
    ledger = tmp_path / "l.sqlite3"

    result = move(failing, ledger, worker, pipelined=pipelined, stop_after_returns=ReturnsLimit())

    assert result.moved == TASKS, "each task sent once by the run"
    worker.fail_all()  # what the run sent last fails too
    assert worker.runs == Counter({f"t-{i}": 1 for i in range(TASKS)})
    # The batches' copies came back while the run went on: left, counted, not sent again.
    assert 0 < result.came_back <= TASKS
    assert result.skipped == Counter({"came-back": result.came_back})
    assert (result.in_doubt, result.failed, result.stopped_by_returns) == (0, 0, None)
    text = move_text(result)
    assert f"{result.came_back} of the {TASKS} moved came back failed" in text
    assert "left in the DLQ for the next run" in text
    assert result.to_json()["came_back"] == result.came_back
    assert failing.depth() == (TASKS, 0), "every task back in the DLQ, once"

    # The next run moves the earlier run's returns on a generation, each once more.
    again = move(failing, ledger, None, pipelined=pipelined)
    assert (again.moved, again.came_back, again.skipped_total) == (TASKS, 0, 0)
    counts = Counter(
        m["MessageAttributes"]["redrive-count"]["StringValue"]
        for m in failing.client.receive_message(
            QueueUrl=failing.queue_url, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
        )["Messages"]
    )
    assert set(counts) == {"2"}


def test_a_run_stops_once_more_came_back_than_it_allows(failing: Family, tmp_path: Path) -> None:
    """SQS counts only approximately: the run counts what came back as it receives it (moto
    hands out its oldest first, so here only after every task was moved)."""
    seed(failing)
    worker = FailingWorker(failing)

    result = move(
        failing,
        tmp_path / "l.sqlite3",
        worker,
        pipelined=False,
        stop_after_returns=ReturnsLimit(count=5),
    )

    assert result.stopped_by_returns == "5"
    assert result.needs_attention, "exit 3"
    assert 5 < result.came_back <= result.moved == TASKS
    assert result.dlq_grew_by == 0, "SQS's counts are not exact: not used"
    worker.fail_all()
    assert worker.runs == Counter({f"t-{i}": 1 for i in range(TASKS)})
    text = move_text(result)
    assert "stopped: more than 5 of the moved came back failed" in text
    assert failing.depth() == (TASKS, 0), "nothing lost: every task in the DLQ, once"


def test_the_stop_threshold_counts_tasks_or_a_share_from_the_tenth_return() -> None:
    assert parse_returns_limit("off") == ReturnsLimit()
    assert not ReturnsLimit().exceeded(10**6, 10**6)
    five = parse_returns_limit("5")
    assert (five.exceeded(5, 5), five.exceeded(6, 100)) == (False, True)
    half = parse_returns_limit("50%")
    assert half.describe() == "50%"
    assert not half.exceeded(MIN_RETURNS_FOR_FRACTION - 1, MIN_RETURNS_FOR_FRACTION - 1)
    assert half.exceeded(MIN_RETURNS_FOR_FRACTION, MIN_RETURNS_FOR_FRACTION)
    assert not half.exceeded(50, 100) and half.exceeded(51, 100)
    assert MoveOptions().stop_after_returns == half, "the default"
    for bad in ("-1", "150%", "half", ""):
        with pytest.raises(Exception, match="--stop-after-returns"):
            parse_returns_limit(bad)


def test_a_message_that_died_after_the_run_began_is_left_for_the_next_run(
    family: Family, tmp_path: Path
) -> None:
    """Not this run's copy: a task that failed elsewhere while the run went on. Its
    SentTimestamp is after the run began: the next run's to take (and to count as poison)."""
    seed(family)
    late: list[str] = []

    def one_dies_meanwhile(step: str) -> None:
        if step == "deleted" and not late:
            late.append("late-1")
            family.client.send_message(
                QueueUrl=family.dlq_url, MessageBody=encode(TASK, [99], {}, task_id="late-1")
            )

    layout = built_in_layout({}).family("checkout")
    assert layout is not None
    with SqliteLedger(tmp_path / "l.sqlite3") as ledger:
        result = MoveEngine(
            resolve_family(SqsBroker(family.client), layout),
            ledger,
            MoveOptions(execute=True, pipelined=False),
            broker_factory=lambda: SqsBroker(family.client),
            observer=Callbacks(on_step=one_dies_meanwhile),
        ).run()

    assert (result.moved, result.died_during_run, result.came_back) == (TASKS, 1, 0)
    assert result.skipped == Counter({"died-during-run": 1})
    assert "1 message(s) died after this run began" in move_text(result)
    left = family.client.receive_message(QueueUrl=family.dlq_url)["Messages"]
    assert [decode(m["Body"]).task_id for m in left] == ["late-1"]


def test_what_a_process_of_this_run_sent_is_this_runs() -> None:
    mine = ClaimOwners(None, "parent.2", "parent", clock=lambda: 0.0)
    assert mine.of_this_run("parent.2") and mine.of_this_run("parent.1")
    assert not mine.of_this_run("other.1") and not mine.of_this_run("parent")
    alone = ClaimOwners(None, "run", None, clock=lambda: 0.0)
    assert alone.of_this_run("run") and not alone.of_this_run("run.1")
    assert not ClaimOwners(None, None, None, clock=lambda: 0.0).of_this_run("run")


def test_the_summary_says_how_much_the_dlq_grew_and_why_the_run_stopped() -> None:
    result = MoveResult(dry_run=False, target="checkout", dlq="onion-checkout-dlq", moved=200)
    result.dlq_grew_by, result.stopped_by_returns = 120, "50%"
    text = move_text(result)
    assert "The DLQ grew by 120 while the run went on (200 moved)" in text
    assert "stopped: more than 50% of the moved came back failed" in text
    data = result.to_json()
    assert (data["dlq_grew_by"], data["stopped_by_returns"], data["came_back"]) == (120, "50%", 0)
    assert result.needs_attention


def test_a_bad_stop_after_returns_is_a_usage_error_and_native_refuses_it(cli: Cli) -> None:
    bad = cli("move", "checkout", "--stop-after-returns", "half")
    assert bad.exit_code == 2, bad.output
    assert "--stop-after-returns 'half': give a number of tasks" in bad.output
    native = cli("move", "checkout", "--native", "--stop-after-returns", "5")
    assert native.exit_code == 2, native.output
    assert "--stop-after-returns" in native.output


def test_died_after_trusts_the_brokers_times_while_they_are_believable() -> None:
    began, now = 1_000_000.0, 1_000_060.0

    def died(enqueued_at: float | None = None, died_at: float | None = None) -> bool:
        message = Delivery("m", "t", "{}", {}, {}, enqueued_at=enqueued_at, died_at=died_at)
        return died_after(message, began, now)

    assert not died()  # no time: nothing said
    assert not died(enqueued_at=began - 1) and not died(died_at=began - 1)
    assert died(enqueued_at=began + 1) and died(enqueued_at=began - 9, died_at=began + 1)
    assert died(died_at=now + CLOCK_SLACK)
    # A broker clock ahead by more than clocks drift: its times are wrong, the message taken.
    assert not died(enqueued_at=now + CLOCK_SLACK + 1)
