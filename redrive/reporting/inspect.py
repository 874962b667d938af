"""Inspect's view of a scan's groups (:mod:`redrive.inspection`): what the user's Celery app
says of each group's task, which the scan itself never asks."""

from __future__ import annotations

from collections.abc import Sequence

from redrive.broker.base import queue_name
from redrive.celery.knowledge import TaskKnowledge
from redrive.errors import RedriveError
from redrive.inspection.groups import TaskGroup
from redrive.messages import UNKNOWN_TASK


def annotate_groups(
    groups: Sequence[TaskGroup], knowledge: TaskKnowledge, sources: Sequence[str]
) -> None:
    """Inspect's groups learn how many messages no worker registers (with an app) and the
    queue each task routes to now where that is not one of the DLQ's ``sources``."""
    for group in groups:
        if group.task == UNKNOWN_TASK:
            continue
        if knowledge.registry is not None:
            group.unregistered = (
                group.count if knowledge.registry.is_unregistered(group.task) else 0
            )
        try:
            address = knowledge.address_for(group.task)
        except RedriveError as exc:
            group.routes_to = f"? ({exc})"
            continue
        if address is not None and queue_name(address) not in sources:
            group.routes_to = queue_name(address)
