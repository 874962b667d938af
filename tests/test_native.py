"""Server-side moves (StartMessageMoveTask, ListMessageMoveTasks, CancelMessageMoveTask).

Stock moto implements none of the three calls, so they go through botocore's Stubber, which
checks every request against SQS's service model and lets these tests answer as SQS does in
races no server reproduces on demand; the queue look-ups around them use moto. The sandbox's
own implementation of the calls is tested in test_sandbox_move_tasks.py, and redrive against
it end to end in test_e2e.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from conftest import REGION, Cli, Family

from redrive.broker import sqs as sqs_backend
from redrive.broker.base import DlqTarget, QueueRef
from redrive.broker.sqs import SqsBroker
from redrive.broker.sqs.native import (
    CANCELLING,
    COMPLETED,
    FAILED,
    RUNNING,
    MoveTask,
    MoveTaskRunning,
    NoRunningMoveTask,
    cancel_move_task,
    follow_native_move,
    list_move_tasks,
    start_native_move,
)
from redrive.cli import cli as redrive_group
from redrive.cli import native as cli_native
from redrive.cli.exit_codes import EXIT_ATTENTION, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE
from redrive.errors import AwsError, UsageProblem
from redrive.render.native import move_tasks_table, native_task_text

ACCOUNT = "123456789012"
DLQ_ARN = f"arn:aws:sqs:{REGION}:{ACCOUNT}:onion-checkout-dlq"
SOURCE_ARN = f"arn:aws:sqs:{REGION}:{ACCOUNT}:onion-checkout"
OTHER_ARN = f"arn:aws:sqs:{REGION}:{ACCOUNT}:onion-elsewhere"
HANDLE = "eyJ0YXNrSWQiOiJkYzdjMTJjZi0xMjM0In0="
NOW_MS = int(time.time() * 1000)


@pytest.fixture(autouse=True)
def fresh_now() -> None:
    """Task start times are "now" for each test, not for the module's import: the code under
    test tells a new task from an old one by its start time against the real clock."""
    global NOW_MS
    NOW_MS = int(time.time() * 1000)


def queue(name: str, arn: str) -> QueueRef:
    return QueueRef(
        url=f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{name}", name=name, ident=arn, fifo=False
    )


TARGET = DlqTarget(
    label="checkout",
    family=None,
    dlq=queue("onion-checkout-dlq", DLQ_ARN),
    sources=(queue("onion-checkout", SOURCE_ARN),),
)
ELSEWHERE = queue("onion-elsewhere", OTHER_ARN)


def entry(
    status: str, *, moved: int = 0, to_move: int | None = None, **extra: Any
) -> dict[str, Any]:
    """One ListMessageMoveTasks result, shaped as SQS returns it."""
    raw: dict[str, Any] = {
        "Status": status,
        "SourceArn": DLQ_ARN,
        "ApproximateNumberOfMessagesMoved": moved,
        "StartedTimestamp": NOW_MS,
    }
    if status == RUNNING:
        raw["TaskHandle"] = HANDLE
    if to_move is not None:
        raw["ApproximateNumberOfMessagesToMove"] = to_move
    raw.update(extra)
    return raw


def listing(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"Results": list(entries)}


LIST_PARAMS = {"SourceArn": DLQ_ARN, "MaxResults": 10}


@pytest.fixture
def stubbed() -> Iterator[tuple[SqsBroker, Stubber]]:
    client = boto3.client("sqs", region_name=REGION)
    with Stubber(client) as stubber:
        yield SqsBroker(client), stubber
        stubber.assert_no_pending_responses()


# -- start ---------------------------------------------------------------------------------


def test_start_moves_back_to_the_original_sources_by_default(
    stubbed: tuple[SqsBroker, Stubber],
) -> None:
    sqs, stub = stubbed
    # Only SourceArn: SQS then sends each message back where it was dead-lettered from.
    stub.add_response("start_message_move_task", {"TaskHandle": HANDLE}, {"SourceArn": DLQ_ARN})
    assert start_native_move(sqs, TARGET, destination=None, rate=None) == HANDLE


def test_start_with_a_destination_and_a_rate(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    stub.add_response(
        "start_message_move_task",
        {"TaskHandle": HANDLE},
        {"SourceArn": DLQ_ARN, "DestinationArn": OTHER_ARN, "MaxNumberOfMessagesPerSecond": 50},
    )
    assert start_native_move(sqs, TARGET, destination=ELSEWHERE, rate=50.0) == HANDLE


@pytest.mark.parametrize("rate", [1.0, 500.0])
def test_the_rate_limits_are_accepted(stubbed: tuple[SqsBroker, Stubber], rate: float) -> None:
    sqs, stub = stubbed
    stub.add_response(
        "start_message_move_task",
        {"TaskHandle": HANDLE},
        {"SourceArn": DLQ_ARN, "MaxNumberOfMessagesPerSecond": int(rate)},
    )
    start_native_move(sqs, TARGET, destination=None, rate=rate)


@pytest.mark.parametrize("rate", [0.5, 501.0, 2.5, 10_000.0])
def test_a_rate_sqs_cannot_take_is_a_usage_problem(
    stubbed: tuple[SqsBroker, Stubber], rate: float
) -> None:
    sqs, _ = stubbed
    with pytest.raises(UsageProblem, match="1 to 500"):
        start_native_move(sqs, TARGET, destination=None, rate=rate)


def test_moving_a_dlq_into_itself_is_refused(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, _ = stubbed
    with pytest.raises(UsageProblem, match="the DLQ itself"):
        start_native_move(sqs, TARGET, destination=TARGET.dlq, rate=None)


def test_an_already_running_task_is_one_clear_line(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    stub.add_client_error(
        "start_message_move_task",
        service_error_code="InvalidParameterValue",
        service_message="There is already a task running. Only one active task is allowed "
        "for a source queue arn at a given time.",
    )
    stub.add_response(
        "list_message_move_tasks", listing(entry(RUNNING, moved=40, to_move=100)), LIST_PARAMS
    )
    with pytest.raises(MoveTaskRunning) as caught:
        start_native_move(sqs, TARGET, destination=None, rate=None)
    text = str(caught.value)
    assert "\n" not in text
    assert "already running for DLQ onion-checkout-dlq" in text
    assert "40 of 100 moved" in text
    assert "redrive tasks checkout --cancel" in text


def test_an_active_task_found_after_an_unclear_refusal(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    stub.add_client_error(
        "start_message_move_task",
        service_error_code="AWS.SimpleQueueService.UnsupportedOperation",
        service_message="Operation not possible now.",
    )
    stub.add_response("list_message_move_tasks", listing(entry(RUNNING)), LIST_PARAMS)
    with pytest.raises(MoveTaskRunning, match="already running"):
        start_native_move(sqs, TARGET, destination=None, rate=None)


def test_other_refusals_keep_sqs_words(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    stub.add_client_error(
        "start_message_move_task",
        service_error_code="InvalidParameterValue",
        service_message="Source queue must be configured as a Dead Letter Queue.",
    )
    stub.add_response("list_message_move_tasks", listing(entry(COMPLETED)), LIST_PARAMS)
    with pytest.raises(AwsError) as caught:
        start_native_move(sqs, TARGET, destination=None, rate=None)
    assert not isinstance(caught.value, MoveTaskRunning)
    assert "must be configured as a Dead Letter Queue" in str(caught.value)


def test_access_denied_names_every_permission_a_redrive_needs(
    stubbed: tuple[SqsBroker, Stubber],
) -> None:
    sqs, stub = stubbed
    stub.add_client_error(
        "start_message_move_task", service_error_code="AccessDenied", http_status_code=403
    )
    with pytest.raises(AwsError) as caught:
        start_native_move(sqs, TARGET, destination=None, rate=None)
    text = str(caught.value)
    assert "sqs:StartMessageMoveTask on onion-checkout-dlq" in text
    assert "sqs:SendMessage on the destination" in text


# -- list ----------------------------------------------------------------------------------


def test_list_parses_every_field_newest_first(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    older = entry(
        FAILED,
        moved=3,
        to_move=9,
        StartedTimestamp=NOW_MS - 86_400_000,
        FailureReason="AccessDenied: sqs:SendMessage\non onion-elsewhere",
        DestinationArn=OTHER_ARN,
        MaxNumberOfMessagesPerSecond=20,
    )
    stub.add_response(
        "list_message_move_tasks", listing(older, entry(RUNNING, moved=5)), LIST_PARAMS
    )
    running, failed = list_move_tasks(sqs, TARGET)
    assert running.status == RUNNING and running.handle == HANDLE
    assert running.moved == 5 and running.to_move is None and running.destination is None
    assert running.started == pytest.approx(NOW_MS / 1000)
    assert failed.failure_reason == "AccessDenied: sqs:SendMessage on onion-elsewhere"
    assert (failed.moved, failed.to_move, failed.rate) == (3, 9, 20)
    assert failed.handle is None and failed.destination == "onion-elsewhere"
    assert failed.to_json()["started"].endswith("Z")


def test_list_asks_for_at_most_ten(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    stub.add_response("list_message_move_tasks", listing(), {"SourceArn": DLQ_ARN, "MaxResults": 1})
    assert list_move_tasks(sqs, TARGET, max_results=1) == []
    with pytest.raises(UsageProblem):
        list_move_tasks(sqs, TARGET, max_results=11)


def test_list_access_denied_names_the_action(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    stub.add_client_error("list_message_move_tasks", service_error_code="AccessDenied")
    with pytest.raises(AwsError, match="sqs:ListMessageMoveTasks on onion-checkout-dlq"):
        list_move_tasks(sqs, TARGET)


# -- follow --------------------------------------------------------------------------------


def follow(sqs: SqsBroker, **kwargs: Any) -> tuple[MoveTask, list[MoveTask]]:
    seen: list[MoveTask] = []
    kwargs.setdefault("stop", threading.Event())
    task = follow_native_move(
        sqs, TARGET, HANDLE, poll_seconds=0, on_progress=seen.append, **kwargs
    )
    return task, seen


def test_follow_reports_progress_until_completed(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    for raw in (
        entry(RUNNING),
        entry(RUNNING, moved=40, to_move=100),
        # SQS drops the handle once the task leaves RUNNING: matched by its start time.
        entry(COMPLETED, moved=100, to_move=100),
    ):
        stub.add_response("list_message_move_tasks", listing(raw), LIST_PARAMS)
    task, seen = follow(sqs)
    assert [(t.status, t.moved, t.to_move) for t in seen] == [
        (RUNNING, 0, None),
        (RUNNING, 40, 100),
        (COMPLETED, 100, 100),
    ]
    assert task.status == COMPLETED and task.terminal


def test_follow_ends_on_failure_with_the_reason(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    stub.add_response("list_message_move_tasks", listing(entry(RUNNING, moved=2)), LIST_PARAMS)
    failed = entry(FAILED, moved=7, to_move=50, FailureReason="CouldNotDetermineMessageSource")
    stub.add_response("list_message_move_tasks", listing(failed), LIST_PARAMS)
    task, seen = follow(sqs)
    assert task.status == FAILED and len(seen) == 2
    assert task.failure_reason == "CouldNotDetermineMessageSource"


def test_follow_finds_a_task_that_ended_before_the_first_poll(
    stubbed: tuple[SqsBroker, Stubber],
) -> None:
    sqs, stub = stubbed
    yesterday = entry(COMPLETED, moved=999, StartedTimestamp=NOW_MS - 86_400_000)
    stub.add_response(
        "list_message_move_tasks",
        listing(yesterday, entry(COMPLETED, moved=12, to_move=12)),
        LIST_PARAMS,
    )
    task, _ = follow(sqs)
    assert (task.status, task.moved) == (COMPLETED, 12)


def test_follow_is_not_fooled_by_an_old_task_while_the_new_one_is_not_listed_yet(
    stubbed: tuple[SqsBroker, Stubber],
) -> None:
    sqs, stub = stubbed
    yesterday = entry(COMPLETED, moved=999, StartedTimestamp=NOW_MS - 86_400_000)
    stub.add_response("list_message_move_tasks", listing(yesterday), LIST_PARAMS)
    stub.add_response(
        "list_message_move_tasks", listing(entry(COMPLETED, moved=5), yesterday), LIST_PARAMS
    )
    task, seen = follow(sqs)
    assert (task.status, task.moved) == (COMPLETED, 5)
    assert len(seen) == 1


def test_stopping_ends_the_follow_without_cancelling(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    stop = threading.Event()
    stub.add_response("list_message_move_tasks", listing(entry(RUNNING, moved=3)), LIST_PARAMS)
    # Stubber fails on any call not queued: a CancelMessageMoveTask here would fail the test.
    task = follow_native_move(
        sqs, TARGET, HANDLE, poll_seconds=30, stop=stop, on_progress=lambda _: stop.set()
    )
    assert (task.status, task.moved, task.handle) == (RUNNING, 3, HANDLE)


class Ticking(threading.Event):
    """A stop event whose every wait moves a fake clock on by one poll interval."""

    def __init__(self, step: float) -> None:
        super().__init__()
        self.step = step
        self.now = 0.0

    def wait(self, timeout: float | None = None) -> bool:
        self.now += self.step
        return False


def test_a_task_that_never_appears_ends_the_follow(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    stop = Ticking(40)
    # Polls at 0, 40 and 80 s: the third is past the 60 s allowed for the task to show up.
    for _ in range(3):
        stub.add_response("list_message_move_tasks", listing(), LIST_PARAMS)
    with pytest.raises(AwsError, match="did not appear in ListMessageMoveTasks"):
        follow(sqs, stop=stop, appear_within=60, clock=lambda: stop.now)


def test_following_is_bounded(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    stop = Ticking(10)
    for moved in (1, 2, 3):
        stub.add_response(
            "list_message_move_tasks", listing(entry(RUNNING, moved=moved)), LIST_PARAMS
        )
    task, seen = follow(sqs, stop=stop, max_wait=20, clock=lambda: stop.now)
    assert (task.status, task.moved, len(seen)) == (RUNNING, 3, 3)
    assert not stop.is_set()


# -- cancel --------------------------------------------------------------------------------


def test_cancel_the_running_task(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    stub.add_response(
        "list_message_move_tasks",
        listing(entry(RUNNING, moved=10, to_move=80), entry(COMPLETED, StartedTimestamp=1)),
        LIST_PARAMS,
    )
    stub.add_response(
        "cancel_message_move_task",
        {"ApproximateNumberOfMessagesMoved": 12},
        {"TaskHandle": HANDLE},
    )
    task = cancel_move_task(sqs, TARGET)
    assert task is not None
    assert (task.status, task.moved, task.to_move) == (CANCELLING, 12, 80)


def test_cancel_with_nothing_running_says_so(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    stub.add_response("list_message_move_tasks", listing(entry(COMPLETED)), LIST_PARAMS)
    with pytest.raises(NoRunningMoveTask) as caught:
        cancel_move_task(sqs, TARGET)
    assert "no move task is running for DLQ onion-checkout-dlq" in str(caught.value)
    assert "is COMPLETED" in str(caught.value)


def test_cancel_racing_the_end_of_the_task(stubbed: tuple[SqsBroker, Stubber]) -> None:
    sqs, stub = stubbed
    stub.add_response("list_message_move_tasks", listing(entry(RUNNING)), LIST_PARAMS)
    stub.add_client_error(
        "cancel_message_move_task",
        service_error_code="InvalidParameterValue",
        service_message="Only tasks in RUNNING status can be cancelled.",
    )
    stub.add_response("list_message_move_tasks", listing(entry(COMPLETED)), LIST_PARAMS)
    assert cancel_move_task(sqs, TARGET) is None


# -- rendering -----------------------------------------------------------------------------


def test_tasks_table_and_task_text() -> None:
    now = NOW_MS / 1000
    tasks = [
        MoveTask.from_response(entry(RUNNING, moved=1200, to_move=5000)),
        MoveTask.from_response(
            entry(
                FAILED,
                StartedTimestamp=NOW_MS - 3_600_000,
                FailureReason="boom",
                DestinationArn=OTHER_ARN,
                MaxNumberOfMessagesPerSecond=9,
            )
        ),
    ]
    text = move_tasks_table(tasks, dlq="onion-checkout-dlq", now=now)
    assert "RUNNING" in text and "1,200" in text and "5,000" in text
    assert "FAILED" in text and "boom" in text and "onion-elsewhere" in text
    assert "original source(s)" in text and "(1h ago)" in text
    assert "no move tasks" in move_tasks_table([], dlq="onion-checkout-dlq")
    done = native_task_text(tasks[0], dlq="onion-checkout-dlq", destination="onion-checkout")
    assert "1,200 of 5,000 message(s) moved so far" in done


# -- the CLI -------------------------------------------------------------------------------


class MoveTaskClient:
    """moto's client, except for the move-task calls moto lacks: those go to a Stubber."""

    STUBBED = frozenset(
        {"start_message_move_task", "list_message_move_tasks", "cancel_message_move_task"}
    )

    def __init__(self, real: Any, stubbed: Any) -> None:
        self.real = real
        self.stubbed = stubbed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stubbed if name in self.STUBBED else self.real, name)


@pytest.fixture
def cli_stub(family: Family, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stubber]:
    client = boto3.client("sqs", region_name=REGION)
    with Stubber(client) as stubber:
        hybrid = MoveTaskClient(family.client, client)
        monkeypatch.setattr(
            sqs_backend, "open_sqs", lambda aws, region=None, client="botocore": SqsBroker(hybrid)
        )
        monkeypatch.setattr(cli_native, "NATIVE_POLL_SECONDS", 0.0)
        yield stubber
        stubber.assert_no_pending_responses()


def family_list(family: Family) -> dict[str, Any]:
    return {"SourceArn": family.dlq_arn, "MaxResults": 10}


def family_entry(family: Family, status: str, **kwargs: Any) -> dict[str, Any]:
    return entry(status, SourceArn=family.dlq_arn, **kwargs)


def test_cli_dry_run_starts_nothing(family: Family, cli_stub: Stubber, cli: Cli) -> None:
    family.send_to_dlq("a")
    family.send_to_dlq("b")
    cli_stub.add_response("list_message_move_tasks", listing(), family_list(family))
    result = cli("move", "checkout", "--native")
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert "DRY RUN" in text and "StartMessageMoveTask" in text
    assert "DLQ onion-checkout-dlq: every message (about 2 now)" in text
    assert "each message's original source queue (onion-checkout)" in text
    assert "chosen by SQS" in text
    # Issue 37, 9: the command to run, not "rerun with --execute".
    assert text.endswith(
        "Nothing was started; to start it, run:\n  redrive move checkout --native --execute --yes\n"
    ), text


def test_cli_dry_run_json_with_to_and_rate(family: Family, cli_stub: Stubber, cli: Cli) -> None:
    family.client.create_queue(QueueName="onion-elsewhere")
    cli_stub.add_response(
        "list_message_move_tasks",
        listing(family_entry(family, RUNNING, moved=4)),
        family_list(family),
    )
    result = cli(
        "move", "checkout", "--native", "--to", "onion-elsewhere", "--rate", "50", "--json"
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["native"] is True and data["dry_run"] is True
    assert (data["dlq"], data["destination"], data["rate"]) == (
        "onion-checkout-dlq",
        "onion-elsewhere",
        50,
    )
    assert data["destination_arn"].endswith(":onion-elsewhere")
    assert data["dlq_arn"] == family.dlq_arn  # SQS's ARNs as they were (issue 37, 9)
    assert data["running_task"]["status"] == RUNNING


def test_cli_execute_follows_until_completed(family: Family, cli_stub: Stubber, cli: Cli) -> None:
    cli_stub.add_response(
        "start_message_move_task",
        {"TaskHandle": HANDLE},
        {"SourceArn": family.dlq_arn, "MaxNumberOfMessagesPerSecond": 100},
    )
    for raw in (
        family_entry(family, RUNNING, to_move=30),
        family_entry(family, COMPLETED, moved=30, to_move=30),
    ):
        cli_stub.add_response("list_message_move_tasks", listing(raw), family_list(family))
    result = cli("move", "checkout", "--native", "--execute", "--yes", "--rate", "100", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["native"] is True and data["dry_run"] is False
    assert (data["task_handle"], data["status"], data["moved"], data["to_move"]) == (
        HANDLE,
        COMPLETED,
        30,
        30,
    )
    assert data["rate"] == 100 and data["following_stopped"] is False
    assert f"started move task {HANDLE}" in result.stderr


def test_cli_execute_to_another_queue(family: Family, cli_stub: Stubber, cli: Cli) -> None:
    url = family.client.create_queue(QueueName="onion-elsewhere")["QueueUrl"]
    arn = family.client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    cli_stub.add_response(
        "start_message_move_task",
        {"TaskHandle": HANDLE},
        {"SourceArn": family.dlq_arn, "DestinationArn": arn},
    )
    cli_stub.add_response(
        "list_message_move_tasks",
        listing(family_entry(family, COMPLETED, moved=3, DestinationArn=arn)),
        family_list(family),
    )
    result = cli("move", "checkout", "--native", "--to", "onion-elsewhere", "--execute", "--yes")
    assert result.exit_code == 0, result.output
    assert "move task COMPLETED: 3 message(s) moved, from DLQ onion-checkout-dlq to " in (
        result.stdout
    )


def test_cli_failed_task_exits_1_with_the_reason(
    family: Family, cli_stub: Stubber, cli: Cli
) -> None:
    cli_stub.add_response("start_message_move_task", {"TaskHandle": HANDLE})
    failed = family_entry(
        family, FAILED, moved=4, to_move=10, FailureReason="AccessDenied:\nsqs:SendMessage"
    )
    cli_stub.add_response("list_message_move_tasks", listing(failed), family_list(family))
    result = cli("move", "checkout", "--native", "--execute", "--yes")
    assert result.exit_code == EXIT_ERROR, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [
        "Error: move task on DLQ onion-checkout-dlq FAILED after moving 4 message(s): "
        "AccessDenied: sqs:SendMessage"
    ]
    assert "move task FAILED" in result.stdout


def test_cli_cancelled_task_needs_attention(family: Family, cli_stub: Stubber, cli: Cli) -> None:
    cli_stub.add_response("start_message_move_task", {"TaskHandle": HANDLE})
    cli_stub.add_response(
        "list_message_move_tasks",
        listing(family_entry(family, "CANCELLED", moved=2)),
        family_list(family),
    )
    result = cli("move", "checkout", "--native", "--execute", "--yes")
    assert result.exit_code == EXIT_ATTENTION, result.output
    assert "cancelled after moving 2 message(s)" in result.stderr


def test_cli_stopped_following_leaves_the_task_running(
    family: Family, cli_stub: Stubber, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    @contextlib.contextmanager
    def stopped() -> Iterator[threading.Event]:
        stop = threading.Event()
        stop.set()
        yield stop

    monkeypatch.setattr(cli_native, "following", stopped)
    cli_stub.add_response("start_message_move_task", {"TaskHandle": HANDLE})
    cli_stub.add_response(
        "list_message_move_tasks", listing(family_entry(family, RUNNING)), family_list(family)
    )
    result = cli("move", "checkout", "--native", "--execute", "--yes", "--json")
    assert result.exit_code == EXIT_INTERRUPTED, result.output
    assert json.loads(result.stdout)["following_stopped"] is True
    assert "keeps running on the server (it was not cancelled)" in result.stderr
    assert "redrive tasks checkout --cancel" in result.stderr


def test_ctrl_c_stops_following_and_says_the_task_keeps_running(
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = signal.getsignal(signal.SIGINT)
    with cli_native.following() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.wait(60)
    assert signal.getsignal(signal.SIGINT) is before
    assert "the move task keeps running on the server" in capsys.readouterr().err


def test_cli_losing_sight_of_the_task_says_it_may_still_run(
    family: Family, cli_stub: Stubber, cli: Cli
) -> None:
    cli_stub.add_response("start_message_move_task", {"TaskHandle": HANDLE})
    cli_stub.add_client_error("list_message_move_tasks", service_error_code="AccessDenied")
    result = cli("move", "checkout", "--native", "--execute", "--yes")
    assert result.exit_code == EXIT_ERROR
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1
    assert "sqs:ListMessageMoveTasks" in errors[0]
    assert errors[0].endswith("may still be running: `redrive tasks checkout`)")


def test_cli_already_running(family: Family, cli_stub: Stubber, cli: Cli) -> None:
    cli_stub.add_client_error(
        "start_message_move_task",
        service_error_code="InvalidParameterValue",
        service_message="There is already a task running.",
    )
    cli_stub.add_response(
        "list_message_move_tasks", listing(family_entry(family, RUNNING)), family_list(family)
    )
    result = cli("move", "checkout", "--native", "--execute", "--yes")
    assert result.exit_code == EXIT_ERROR
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: a move task is already running")


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--task", "apps.*"], "cannot filter"),
        (["--exclude-task", "apps.*"], "cannot filter"),
        (["--older-than", "1h"], "cannot filter"),
        (["--newer-than", "1h"], "cannot filter"),
        (["--limit", "5"], "cannot filter"),
        (["--message-id", "m-1"], "cannot filter"),
        (["--include-expired"], "bypasses redrive's ledger"),
        (["--in-doubt", "resend"], "bypasses redrive's ledger"),
        (["--max-redrives", "7"], "bypasses redrive's ledger"),
        (["--workers", "4"], "no workers or leases"),
        (["--processes", "2"], "no workers or leases"),
        (["--lease", "90"], "no workers or leases"),
    ],
)
def test_cli_refuses_native_with_options_it_cannot_honour(
    args: list[str], reason: str, sqs_client: Any, cli: Cli
) -> None:
    result = cli("move", "checkout", "--native", *args)
    assert result.exit_code == EXIT_USAGE, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1
    assert f"--native cannot be combined with {args[0]}" in errors[0]
    assert reason in errors[0]


def test_cli_refuses_native_with_plan_options(sqs_client: Any, tmp_path: Any, cli: Cli) -> None:
    flags = {opt for p in redrive_group.commands["move"].params for opt in getattr(p, "opts", [])}
    if "--plan-out" not in flags:
        pytest.skip("move has no plan options")
    result = cli("move", "checkout", "--native", "--plan-out", str(tmp_path / "plan.jsonl"))
    assert result.exit_code == EXIT_USAGE, result.output
    assert "--native cannot be combined with --plan-out" in result.output
    assert "only --to, --rate, --execute, --yes and --json apply" in result.output


def test_cli_refusal_lists_every_conflict(sqs_client: Any, cli: Cli) -> None:
    result = cli("move", "checkout", "--native", "--task", "x", "--workers", "2")
    assert result.exit_code == EXIT_USAGE
    assert "--task, --workers" in result.output
    assert "cannot filter" in result.output and "no workers" in result.output


def test_cli_native_accepts_defaults_and_the_ledger_variable(
    family: Family, cli_stub: Stubber, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, cli: Cli
) -> None:
    monkeypatch.setenv("REDRIVE_LEDGER", str(tmp_path / "ledger.sqlite3"))
    cli_stub.add_response("list_message_move_tasks", listing(), family_list(family))
    result = cli("move", "checkout", "--native", "--workers", "1", "--in-doubt", "hold")
    assert result.exit_code == 0, result.output


def test_cli_native_rate_out_of_range(family: Family, cli_stub: Stubber, cli: Cli) -> None:
    result = cli("move", "checkout", "--native", "--rate", "501")
    assert result.exit_code == EXIT_USAGE, result.output
    assert "1 to 500" in result.output


def test_cli_tasks_lists_recent_tasks(family: Family, cli_stub: Stubber, cli: Cli) -> None:
    tasks = listing(
        family_entry(family, RUNNING, moved=5, to_move=50),
        family_entry(family, FAILED, StartedTimestamp=NOW_MS - 7_200_000, FailureReason="boom"),
    )
    cli_stub.add_response("list_message_move_tasks", tasks, family_list(family))
    cli_stub.add_response("list_message_move_tasks", tasks, family_list(family))
    result = cli("tasks", "checkout")
    assert result.exit_code == 0, result.output
    assert "move tasks of DLQ onion-checkout-dlq" in result.stdout
    assert "RUNNING" in result.stdout and "FAILED" in result.stdout and "boom" in result.stdout
    data = json.loads(cli("tasks", "checkout", "--json").stdout)
    assert data["dlq"] == "onion-checkout-dlq"
    assert [t["status"] for t in data["tasks"]] == [RUNNING, FAILED]
    assert data["tasks"][0]["task_handle"] == HANDLE


def test_cli_tasks_cancel(family: Family, cli_stub: Stubber, cli: Cli) -> None:
    cli_stub.add_response(
        "list_message_move_tasks",
        listing(family_entry(family, RUNNING, moved=5, to_move=50)),
        family_list(family),
    )
    cli_stub.add_response(
        "cancel_message_move_task", {"ApproximateNumberOfMessagesMoved": 6}, {"TaskHandle": HANDLE}
    )
    result = cli("tasks", "checkout", "--cancel", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["cancelled"]["status"] == CANCELLING and data["cancelled"]["moved"] == 6


def test_cli_tasks_cancel_with_nothing_running(family: Family, cli_stub: Stubber, cli: Cli) -> None:
    cli_stub.add_response("list_message_move_tasks", listing(), family_list(family))
    result = cli("tasks", "checkout", "--cancel")
    assert result.exit_code == EXIT_ERROR
    assert result.output.strip().splitlines() == [
        "Error: no move task is running for DLQ onion-checkout-dlq: nothing to cancel"
    ]
