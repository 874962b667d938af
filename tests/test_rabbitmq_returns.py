"""A moved task that fails again while the move goes on, on RabbitMQ (issue 37, point 2): a real
consumer of the source queue rejects every task it gets (``requeue=False``), so RabbitMQ
dead-letters it straight back into the DLQ the run is draining. One ``move --execute`` delivers
each task to the consumer once; what came back stays in the DLQ for the next run; and a run
stops (exit 3) once more came back than ``--stop-after-returns`` allows."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import amqp
import pytest
from conftest import wait_until
from test_rabbitmq_commands import DLQ, QUEUE, fill, task_id_of
from test_rabbitmq_e2e import ok_json, redrive

from redrive.sandbox.rabbitmq_layout import open_connection, queue_depth, raw_channel
from redrive.sandbox.rabbitmq_node import Vhost

pytestmark = pytest.mark.e2e


class RejectingWorker:
    """A consumer of the source queue that fails every task: basic.reject, requeue=False
    (the task is dead-lettered to the DLQ). Counts each task id it was delivered."""

    def __init__(self, vhost: Vhost) -> None:
        self.connection = open_connection(vhost.amqp_url)
        self.channel = raw_channel(self.connection)
        self.channel.basic_qos(0, 50, False)
        self.deliveries: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.channel.basic_consume(QUEUE, callback=self._reject)
        self._thread = threading.Thread(target=self._consume, name="rejecting-worker")
        self._thread.start()

    def _reject(self, message: amqp.Message) -> None:
        with self._lock:
            self.deliveries[task_id_of(message)] += 1
        self.channel.basic_reject(message.delivery_tag, requeue=False)

    def _consume(self) -> None:
        while not self._stop.is_set():
            try:
                self.connection.drain_events(timeout=0.05)
            except TimeoutError:
                continue

    def delivered(self) -> int:
        with self._lock:
            return sum(self.deliveries.values())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.connection.close()


def dlq_depth(vhost: Vhost) -> int:
    connection = open_connection(vhost.amqp_url)
    try:
        return queue_depth(raw_channel(connection), DLQ)
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("spread", "tasks"), [([], 200), (["--processes", "2"], 600)], ids=["one-process", "two"]
)
def test_one_move_delivers_each_failing_task_to_the_worker_once(
    rabbitmq_vhost: Vhost, tmp_path: Path, spread: list[str], tasks: int
) -> None:
    """Two processes: a copy one sent may come back to the other, which leaves it too."""
    before = fill(rabbitmq_vhost, tasks)
    ids = Counter(task_id_of(m) for m in before)
    ledger = tmp_path / "ledger.sqlite3"
    worker = RejectingWorker(rabbitmq_vhost)
    try:
        move = ["move", "checkout", "--execute", "--yes", "--json", "--ledger", str(ledger)]
        # Paced, so that the run is still draining while the first batches come back.
        data = ok_json(
            redrive(rabbitmq_vhost, *move, *spread, "--rate", "200", "--stop-after-returns", "off")
        )
        wait_until(lambda: worker.delivered() >= data["moved"], "the worker got every task")
        wait_until(lambda: dlq_depth(rabbitmq_vhost) == tasks, "every task back in the DLQ")
    finally:
        worker.close()
    assert worker.deliveries == ids, "each task delivered once by one command"
    assert (data["moved"], data["in_doubt"], data["failed"]) == (tasks, 0, 0), data
    # What came back during the run was received and left, not sent again.
    assert 0 < data["came_back"] <= tasks
    assert data["skipped_by_reason"] == {"came-back": data["came_back"]}
    assert data["stopped_by_returns"] is None

    # The next run (no worker now) moves the earlier run's returns on, each once more.
    again = ok_json(redrive(rabbitmq_vhost, *move))
    assert (again["moved"], again["came_back"], again["skipped"]) == (tasks, 0, 0), again
    source = Counter(task_id_of(m) for m in _drain(rabbitmq_vhost, QUEUE))
    assert source == ids


def test_a_run_stops_with_exit_3_once_more_came_back_than_it_allows(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    before = fill(rabbitmq_vhost, 600)
    ids = {task_id_of(m) for m in before}
    worker = RejectingWorker(rabbitmq_vhost)
    try:
        move = ["move", "checkout", "--execute", "--yes", "--ledger", str(tmp_path / "l.db")]
        # 100 a batch at 100 a second: the first batch is back long before the sixth is sent.
        result = redrive(
            rabbitmq_vhost, *move, "--json", "--rate", "100", "--stop-after-returns", "5"
        )
        data = ok_json(result, code=3)
        wait_until(lambda: worker.delivered() >= data["moved"], "the worker got what moved")
        wait_until(lambda: dlq_depth(rabbitmq_vhost) == 600, "every task in the DLQ")
    finally:
        worker.close()
    assert data["stopped_by_returns"] == "5", data
    assert data["dlq_grew_by"] > 5 or data["came_back"] > 5
    assert 0 < data["moved"] < 600, "stopped before draining the DLQ into the failing worker"
    assert set(worker.deliveries.values()) == {1} and set(worker.deliveries) <= ids
    assert worker.delivered() == data["moved"]


def _drain(vhost: Vhost, queue: str) -> list[amqp.Message]:
    connection = open_connection(vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        got = []
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            got.append(message)
        return got
    finally:
        connection.close()
