"""The sandbox's Celery app, mirroring the built-in layout as the onion split made it:
checkout tasks route to ``onion-checkout``, progress tasks to ``onion-progress``, everything
else to the default ``onion``. ``redrive --celery-app redrive.sandbox.celery_app:app ...``
reads its routes, its registered tasks and its settings (no broker is contacted).

It registers every task the sandbox seeds except ``apps.inventory.tasks.resync_stock``,
which was deleted (its messages in the default DLQ are "unregistered": a worker would drop
them). Its settings are the ones ``redrive check --celery`` asks for: it reports nothing, on SQS
and on the RabbitMQ sandbox (whose queues its ``task_queues`` declare as the sandbox does).

The queue names follow the same environment overrides as the built-in layout
(``CELERY_CHECKOUT_QUEUE``, ``CELERY_DEFAULT_QUEUE``, ``CELERY_PROGRESS_QUEUE``).
"""

from __future__ import annotations

import os
from typing import Any

import kombu.entity
from celery import Celery

from redrive.config import DLQ_SUFFIX
from redrive.sandbox.rabbitmq_layout import DLX

CHECKOUT_QUEUE = os.environ.get("CELERY_CHECKOUT_QUEUE") or "onion-checkout"
DEFAULT_QUEUE = os.environ.get("CELERY_DEFAULT_QUEUE") or "onion"
PROGRESS_QUEUE = os.environ.get("CELERY_PROGRESS_QUEUE") or "onion-progress"

#: The task the app no longer registers (seeded into the default DLQ all the same).
DELETED_TASK = "apps.inventory.tasks.resync_stock"


def _declared(queue: str) -> list[Any]:
    """A family's queue as the RabbitMQ sandbox declares it (dead-lettering through the DLX
    into its DLQ: a worker declaring it otherwise is refused), and its DLQ, declared so that
    no new broker routes failures to no queue (no worker consumes it). SQS ignores both."""
    dlq = f"{queue}{DLQ_SUFFIX}"
    arguments = {"x-dead-letter-exchange": DLX, "x-dead-letter-routing-key": dlq}
    make: Any = kombu.entity.Queue  # kombu's Queue has no type hints
    return [make(queue, routing_key=queue, queue_arguments=arguments), make(dlq)]


app = Celery("onion", set_as_current=False)
app.conf.update(
    task_default_queue=DEFAULT_QUEUE,
    # The onion split: progress floods at peak stopped delaying user activations.
    task_routes={
        "apps.webhooks.tasks.save_checkout_ibft": {"queue": CHECKOUT_QUEUE},
        "apps.payments.tasks.*": {"queue": CHECKOUT_QUEUE},
        "apps.engagements.tasks.save_progress_*": {"queue": PROGRESS_QUEUE},
    },
    # RabbitMQ: what its workers declare (check --celery audits it there).
    task_queues=[
        q for name in (CHECKOUT_QUEUE, DEFAULT_QUEUE, PROGRESS_QUEUE) for q in _declared(name)
    ],
    task_acks_late=True,
    # A failing task, or one whose worker process died, is rejected without requeue: the
    # broker dead-letters it (task_reject_on_worker_lost would requeue it instead).
    task_acks_on_failure_or_timeout=False,
    task_time_limit=25,
    task_soft_time_limit=20,
    broker_transport_options={"visibility_timeout": 300},
)


def _task(name: str) -> None:
    def run(*args: Any, **kwargs: Any) -> None:
        return None

    run.__name__ = name.rsplit(".", 1)[-1]
    app.task(name=name, shared=False)(run)


for _name in (
    "apps.webhooks.tasks.save_checkout_ibft",
    "apps.payments.tasks.capture_payment",
    "apps.payments.tasks.refund",
    "apps.notifications.tasks.send_email",
    "apps.users.tasks.activate_user",
    "apps.reports.tasks.export_csv",
    "apps.engagements.tasks.save_progress_lesson",
    "apps.engagements.tasks.save_progress_quiz",
):
    _task(_name)
