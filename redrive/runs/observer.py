"""What a run tells whoever watches it: its progress (the CLI's progress line), each planned
action of a dry run (a ``--plan-out`` file), and each step it passes (the points between
receive, claim, send, record and delete, where the tests inject crashes).

An observer is called from the run's worker threads; one call at a time for plan items,
from any worker for the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

R = TypeVar("R", contravariant=True)


@dataclass(frozen=True, slots=True)
class PlanItem:
    """One planned action of a dry run: what :meth:`RunObserver.on_plan` hears, and one item
    of a plan file (:mod:`redrive.operations.plan` writes and reads them)."""

    message_id: str
    task: str
    task_id: str | None
    key: str | None
    """The idempotency key (move); ``None`` for purge, which sends nothing."""
    target: str | None = None
    """Queue the message would go to (move)."""
    action: str = "send"
    """``send``, ``delete-duplicate`` (a copy of a task that is or will be sent) or ``purge``."""
    routed_from: str | None = None
    """The message's source queue, when its task's route sends it elsewhere (redrive.celery)."""
    digest_before: str | None = None
    """An edited move (issue 26): the digest of the body reviewed, and of the body to send."""
    digest_after: str | None = None
    digest: str | None = None
    """The message as planned (:func:`redrive.operations.plan.message_digest`): apply
    leaves a message whose digest differs (``changed-since-plan``). None in plans written
    before every item had one: those apply as they always did."""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "message_id": self.message_id,
            "action": self.action,
            "task": self.task,
        }
        if self.task_id is not None:
            data["task_id"] = self.task_id
        if self.key is not None:
            data["key"] = self.key
        if self.target is not None:
            data["target"] = self.target
        if self.routed_from is not None:
            data["routed_from"] = self.routed_from
        if self.digest is not None:
            data["digest"] = self.digest
        if self.digest_before is not None:
            data["digest_before"] = self.digest_before
            data["digest_after"] = self.digest_after
        return data


class RunObserver(Generic[R]):
    """Hears a run's events; every method does nothing unless a subclass says otherwise.
    ``R`` is the run's result type, handed to :meth:`on_progress` as it grows."""

    @property
    def wants_progress(self) -> bool:
        """Whether :meth:`on_progress` does anything: when it does not, a run spares itself
        the copy of its counts it would hand over after every batch."""
        return True

    def on_progress(self, result: R) -> None:
        """The run's result so far, after each batch."""

    def on_plan(self, item: PlanItem) -> None:
        """A dry run's planned action for one message."""

    def on_step(self, step: str) -> None:
        """The run passed ``step`` (one of the operation's ``STEPS``). What this raises
        stops the run there, as a crash at that point would."""

    def on_check(self, read: int) -> None:
        """Records read so far by a check before the run (replay's check of its archive)."""

    def on_depth(self, depth: int) -> None:
        """How many messages the queue holds as the run starts (inspect: its progress's
        total)."""

    def on_problem(self, problem: str) -> None:
        """Something the run carries on past, for the operator to know (a damaged record)."""


class NullObserver(RunObserver[Any]):
    """Hears nothing."""

    @property
    def wants_progress(self) -> bool:
        return False


NULL_OBSERVER = NullObserver()


class Observers(RunObserver[R]):
    """Several observers, told in order."""

    def __init__(self, *observers: RunObserver[R]) -> None:
        self.observers = observers

    @property
    def wants_progress(self) -> bool:
        return any(observer.wants_progress for observer in self.observers)

    def on_progress(self, result: R) -> None:
        for observer in self.observers:
            observer.on_progress(result)

    def on_plan(self, item: PlanItem) -> None:
        for observer in self.observers:
            observer.on_plan(item)

    def on_step(self, step: str) -> None:
        for observer in self.observers:
            observer.on_step(step)

    def on_check(self, read: int) -> None:
        for observer in self.observers:
            observer.on_check(read)

    def on_problem(self, problem: str) -> None:
        for observer in self.observers:
            observer.on_problem(problem)

    def on_depth(self, depth: int) -> None:
        for observer in self.observers:
            observer.on_depth(depth)


class Callbacks(RunObserver[R]):
    """An observer made of plain functions, each optional (tests, small callers)."""

    def __init__(
        self,
        *,
        on_progress: Callable[[R], None] | None = None,
        on_plan: Callable[[PlanItem], None] | None = None,
        on_step: Callable[[str], None] | None = None,
        on_check: Callable[[int], None] | None = None,
        on_problem: Callable[[str], None] | None = None,
    ) -> None:
        self._progress = on_progress
        self._plan = on_plan
        self._step = on_step
        self._check = on_check
        self._problem = on_problem

    @property
    def wants_progress(self) -> bool:
        return self._progress is not None

    def on_progress(self, result: R) -> None:
        if self._progress is not None:
            self._progress(result)

    def on_plan(self, item: PlanItem) -> None:
        if self._plan is not None:
            self._plan(item)

    def on_step(self, step: str) -> None:
        if self._step is not None:
            self._step(step)

    def on_check(self, read: int) -> None:
        if self._check is not None:
            self._check(read)

    def on_problem(self, problem: str) -> None:
        if self._problem is not None:
            self._problem(problem)
