"""Which task names the app registers: a name missing there is what a worker logs as
"Received unregistered task" and then discards, so redrive keeps such a message in the DLQ."""

from __future__ import annotations

from typing import Any

from redrive.celery.streams import users_code
from redrive.errors import CeleryAppError
from redrive.messages import UNKNOWN_TASK


class Registry:
    """The app's task names, read once (``app.tasks``: the app is already finalized)."""

    def __init__(self, app: Any, spec: str) -> None:
        self.spec = spec
        try:
            with users_code():
                self.names: frozenset[str] = frozenset(str(name) for name in app.tasks)
        except Exception as exc:
            raise CeleryAppError(
                f"the Celery app {spec}: reading its tasks raised {type(exc).__name__}: {exc}"
            ) from None

    def knows(self, task: str) -> bool:
        return task in self.names

    def is_unregistered(self, task: str) -> bool:
        """A Celery task the app does not register. A body that is not a Celery task is not
        "unregistered": it has no task name at all (it is ``not-celery``)."""
        return task != UNKNOWN_TASK and task not in self.names
