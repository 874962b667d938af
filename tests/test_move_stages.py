"""When a move worker receives its next batch in a second thread: only once SQS's answers
keep its first stage blocked (``pipelined="auto"``, the default); against an endpoint that
answers at once the second thread would only cost CPU (issue 17)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from conftest import Family

from redrive.broker.base import Delivery
from redrive.broker.sqs import SqsBroker
from redrive.broker.sqs.queues import resolve_family
from redrive.config import built_in_layout
from redrive.ledger import SqliteLedger
from redrive.operations.move import (
    OVERLAP_MIN_WAIT,
    OVERLAP_SAMPLE,
    MoveEngine,
    MoveOptions,
    MoveResult,
    overlap_pays,
)
from redrive.operations.waiting import BlockedClock
from redrive.runs.observer import Callbacks
from redrive.sandbox.encoder import encode

TASK = "apps.webhooks.tasks.save_checkout"


def test_overlap_pays_once_the_first_stage_is_blocked_a_millisecond_or_more() -> None:
    slow, fast = OVERLAP_MIN_WAIT * 2, OVERLAP_MIN_WAIT / 4
    assert OVERLAP_SAMPLE == 5
    assert not overlap_pays([])
    assert not overlap_pays([slow] * 4)  # too few batches to tell
    assert overlap_pays([slow] * 5)
    assert overlap_pays([slow, fast, slow, fast, slow])  # quick answers among slow ones
    assert not overlap_pays([fast, slow, fast, slow, fast])  # a few slow ones (a connection)
    assert not overlap_pays([fast] * 5)
    assert overlap_pays([fast, fast, *[slow] * 5])  # the last five count
    assert not overlap_pays([*[slow] * 5, fast, fast, fast])


def test_the_blocked_clock_counts_waiting_not_running() -> None:
    with BlockedClock() as blocked:
        before = blocked.now()
        time.sleep(0.05)
        slept = blocked.now() - before
        before = blocked.now()
        spin_until = time.thread_time() + 0.05
        while time.thread_time() < spin_until:
            pass
        spun = blocked.now() - before
    assert slept >= 0.04
    # A thread kept off a busy machine's CPUs is not blocked either (where Linux says so).
    if Path("/proc/thread-self/schedstat").exists():
        assert spun < 0.01


class SlowSqs(SqsBroker):
    """An SqsBroker whose receives wait ``wait`` seconds off the CPU, as a network's do."""

    def __init__(self, client: Any, wait: float) -> None:
        super().__init__(client)
        self.wait = wait

    def receive(self, url: str, **kwargs: Any) -> list[Delivery]:
        time.sleep(self.wait)
        return super().receive(url, **kwargs)


def seed(family: Family, n: int) -> None:
    for start in range(0, n, 10):
        family.client.send_message_batch(
            QueueUrl=family.dlq_url,
            Entries=[
                {"Id": str(i), "MessageBody": encode(TASK, [i], {}, task_id=f"t-{i}")}
                for i in range(start, min(n, start + 10))
            ],
        )


def move_watching_threads(
    family: Family, ledger: Path, sqs: SqsBroker
) -> tuple[MoveResult, Counter[str]]:
    """Run a move; which threads received its batches (step "received")."""
    receivers: Counter[str] = Counter()

    def on_step(step: str) -> None:
        if step == "received":
            receivers[threading.current_thread().name] += 1

    layout = built_in_layout({}).family("checkout")
    assert layout is not None
    opened = SqliteLedger(ledger)
    try:
        result = MoveEngine(
            resolve_family(SqsBroker(family.client), layout),
            opened,
            MoveOptions(execute=True),
            broker_factory=lambda: sqs,
            observer=Callbacks(on_step=on_step),
        ).run()
    finally:
        opened.close()
    return result, receivers


def test_a_move_starts_in_one_thread_and_stays_there_while_nothing_waits(
    family: Family, tmp_path: Path
) -> None:
    seed(family, 100)
    result, receivers = move_watching_threads(
        family, tmp_path / "l.sqlite3", SqsBroker(family.client)
    )
    assert (result.moved, result.in_doubt) == (100, 0)
    # In-process moto answers without waiting: the batches are received by the worker itself
    # (the first five always; a test machine so loaded that moto's thread waits for the
    # disk a millisecond a batch may start the second thread after them, as a network would).
    assert receivers[threading.current_thread().name] >= OVERLAP_SAMPLE
    assert sum(receivers.values()) == 10
    assert family.depth() == (0, 0)


def test_a_move_whose_receives_wait_receives_ahead_in_a_second_thread(
    family: Family, tmp_path: Path
) -> None:
    seed(family, 100)
    slow = SlowSqs(family.client, OVERLAP_MIN_WAIT * 5)
    result, receivers = move_watching_threads(family, tmp_path / "l.sqlite3", slow)
    assert (result.moved, result.in_doubt) == (100, 0)
    # Five batches in one stage tell that the receives wait; the rest come from the helper.
    assert receivers[threading.current_thread().name] == OVERLAP_SAMPLE
    assert receivers["redrive-receive"] == 10 - OVERLAP_SAMPLE
    assert family.depth() == (0, 0)
