"""Where a task routes to now: the app's own router, or a ``[routes]`` config table.

With an app, the queue is what Celery's producer would pick for a new ``apply_async`` of the
task by name: a task's own ``queue=`` option first, then ``task_routes`` (dicts, glob and
regex keys, router functions, in order), then ``task_default_queue``. Celery's queue name
becomes the SQS queue kombu's SQS transport uses: its ``predefined_queues`` URL when the app
declares one, else the name with ``queue_name_prefix`` and kombu's character replacements.

A router function sees the task's name and options, not the message's arguments (redrive
never unpickles or evaluates them): one that routes on arguments gets ``()`` and ``{}``.

Without an app, ``[routes]`` in the config maps task names or globs to a family or a queue
(first the exact name, then the globs in file order).
"""

from __future__ import annotations

import fnmatch
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from redrive.broker.base import queue_name
from redrive.celery.streams import users_code
from redrive.config import Layout
from redrive.errors import CeleryAppError

# kombu.transport.SQS.CHARS_REPLACE_TABLE: punctuation but "-_." becomes "_", "." becomes "-".
_SQS_NAME_TABLE = {ord(c): "_" for c in string.punctuation if c not in "-_."} | {ord("."): "-"}


class TaskRouter(Protocol):
    """The queue (an SQS name or URL) a task routes to now, or None when nothing says."""

    @property
    def origin(self) -> str:
        """Where the routes come from, for people: ``app proj:app`` or ``config [routes]``."""
        ...

    def queue_for(self, task: str) -> str | None: ...


@dataclass(frozen=True, slots=True)
class ConfigRoutes:
    """``[routes]``: task name or glob -> family name or queue (name or URL)."""

    table: Mapping[str, str]
    layout: Layout

    @property
    def origin(self) -> str:
        return f"config [routes] ({self.layout.source})"

    def queue_for(self, task: str) -> str | None:
        destination = self.table.get(task)
        if destination is None:
            destination = next(
                (dest for glob, dest in self.table.items() if fnmatch.fnmatchcase(task, glob)),
                None,
            )
        return self._queue(destination) if destination is not None else None

    def _queue(self, destination: str) -> str:
        family = self.layout.family(destination)
        return family.queue if family is not None else destination

    def queues(self) -> set[str]:
        """Every SQS queue name a route names."""
        return {queue_name(self._queue(dest)) for dest in self.table.values()}


class AppRoutes:
    """The app's own router, as its producer would route a new publish of the task."""

    def __init__(self, app: Any, spec: str) -> None:
        self.app = app
        self.spec = spec
        self._cache: dict[str, str] = {}
        with users_code():  # app.conf may import the project's settings module now
            options = app.conf.broker_transport_options or {}
            self.prefix = str(options.get("queue_name_prefix") or "")
            predefined = options.get("predefined_queues") or {}
            self.predefined: dict[str, str] = {
                str(name): str(q["url"])
                for name, q in predefined.items()
                if isinstance(q, Mapping) and q.get("url")
            }

    @property
    def origin(self) -> str:
        return f"app {self.spec}"

    def queue_for(self, task: str) -> str:
        known = self._cache.get(task)
        if known is None:
            known = self._cache[task] = self.sqs_queue(self.celery_queue(task))
        return known

    def celery_queue(self, task: str) -> str:
        """Celery's name of the queue ``task`` routes to."""
        with users_code():
            registered = self.app.tasks.get(task)
            options: dict[str, Any] = {}
            if registered is not None and getattr(registered, "queue", None):
                options["queue"] = registered.queue
            try:
                routed = self.app.amqp.router.route(options, task, (), {}, registered)
            except Exception as exc:
                raise CeleryAppError(
                    f"the router of {self.spec} raised {type(exc).__name__}: {exc} for task {task}"
                ) from None
        queue = routed.get("queue")
        name = getattr(queue, "name", queue)
        if not name:
            raise CeleryAppError(f"the router of {self.spec} names no queue for task {task}")
        return str(name)

    def sqs_queue(self, celery_queue: str) -> str:
        """The SQS queue (URL when predefined, else name) kombu's SQS transport uses."""
        if celery_queue in self.predefined:
            return self.predefined[celery_queue]
        return sqs_name(self.prefix + celery_queue)


def sqs_name(name: str) -> str:
    """kombu's ``Channel.entity_name``: an AMQP queue name as a legal SQS queue name."""
    if name.endswith(".fifo"):
        return name[: -len(".fifo")].translate(_SQS_NAME_TABLE) + ".fifo"
    return name.translate(_SQS_NAME_TABLE)
