"""What the console's actions do, without the web: a dry run that writes the CLI's plan file
(``move/purge --plan-out``: a console plan *is* a CLI plan), and the execution of exactly
that plan through the coordinator's ``apply`` (a message that changed since is left:
``changed-since-plan``), in a thread of the server's (redrive.web.operations).

Every run goes through :func:`redrive.operations.coordinator.run_operation`, as the CLI's
do: the same ledger (so the console, the CLI and other consoles on one shared ledger never
send a task twice), the same audit record (the person and their address as its who)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from redrive.aws.identity import caller_identity
from redrive.broker.base import DlqTarget, QueueRef, queue_name
from redrive.celery.knowledge import TaskKnowledge
from redrive.errors import UsageProblem
from redrive.operations.apply import ApplyOptions
from redrive.operations.coordinator import (
    ApplyRequest,
    Caller,
    MoveRequest,
    Outcome,
    PurgeRequest,
    ReplayRequest,
    Setup,
    apply_request,
    run_operation,
)
from redrive.operations.move import MoveOptions, RepairOptions
from redrive.operations.plan import Plan
from redrive.operations.purge import PurgeOptions
from redrive.repair import edits_from_options
from redrive.runs.observer import RunObserver
from redrive.selection import Selection
from redrive.web.operations import PlanStore
from redrive.web.security import Person
from redrive.web.workspace import Workspace
from redrive.where import compile_where

CONFIRM_OVER = 100
"""A move of more messages than this asks for the DLQ's name typed (a purge always does)."""


@dataclass(frozen=True, slots=True)
class ActionForm:
    """A move (with edits: a repair) or a purge of one DLQ, as its form asks."""

    kind: Literal["move", "purge"]
    target: str
    tasks: tuple[str, ...] = ()
    older_than: float | None = None
    where: tuple[str, ...] = ()
    message_ids: tuple[str, ...] = ()
    route: Literal["source", "task"] = "source"
    to: str | None = None
    archive: str | None = None
    sets: tuple[str, ...] = ()
    unsets: tuple[str, ...] = ()
    renames: tuple[str, ...] = ()
    clear_expires: bool = False

    @property
    def edits(self) -> bool:
        return bool(self.sets or self.unsets or self.renames or self.clear_expires)

    def selection(self) -> Selection:
        return Selection(
            tasks=self.tasks,
            older_than=self.older_than,
            message_ids=frozenset(self.message_ids),
            where=compile_where(self.where) if self.where else None,
        )


def setup_of(workspace: Workspace) -> Setup:
    """What the console's runs run with: its brokers, clients, receive log and backend."""
    clients = workspace.client_factory
    return Setup(
        brokers=workspace.broker_for,
        s3_client=(lambda: clients("s3")) if clients is not None else None,
        ledger_clients=clients,
        receive_log=lambda: workspace.receive_log,
        results=lambda: workspace.results,
        identity=lambda: {"caller": broker_caller(workspace)},
    )


def broker_caller(workspace: Workspace) -> dict[str, Any]:
    """Whom the broker knows the console's runs as: the AWS principal on SQS (as the CLI
    records it); on another broker, the console itself (its person is the record's who)."""
    clients = workspace.client_factory
    if clients is not None and workspace.broker.aws_credentials:
        return caller_identity(lambda: clients("sts"))
    return {"front_end": "redrive web"}


def caller_of(person: Person, what: str) -> Caller:
    """The audit's who: the person signed in, where they asked from, and the action."""
    return Caller.of(person.name, f"web {what}", person.address)


def dry_run(workspace: Workspace, plans: PlanStore, form: ActionForm, person: Person) -> str:
    """The action's dry run, writing its plan (the CLI's file); the plan's id. Raises a
    RedriveError for what the CLI would refuse (exit 1 or 2 there)."""
    target = workspace.target(form.target)
    plan_id, path = plans.new_path()
    request: MoveRequest | PurgeRequest
    if form.kind == "purge":
        if not form.archive:
            raise UsageProblem("a purge from the console keeps an archive: give its path")
        options = PurgeOptions(selection=form.selection(), archive_to=form.archive)
        request = PurgeRequest(target, options, plan_out=str(path))
    else:
        request = MoveRequest(target, move_options(workspace, target, form), plan_out=str(path))
    outcome: Outcome[Any] = run_operation(
        request,
        setup=setup_of(workspace),
        ledger=workspace.ledger_uri,
        caller=caller_of(person, f"{form.kind} {form.target} (dry run)"),
    )
    result = outcome.unwrap()
    plans.keep_dry_run(plan_id, result.to_json())
    return plan_id


def move_options(workspace: Workspace, target: DlqTarget, form: ActionForm) -> MoveOptions:
    to = _queue(workspace, target, form.to) if form.to else None
    repair = None
    if form.edits:
        if not form.archive:
            raise UsageProblem("a repair keeps the originals: give an archive path")
        edits = edits_from_options(
            sets=form.sets,
            unsets=form.unsets,
            renames=form.renames,
            clear_expires=form.clear_expires,
        )
        repair = RepairOptions(edits, form.archive)
    return MoveOptions(
        selection=form.selection(),
        to=to,
        to_celery_queue=to is None or _celery_queue(workspace, to),
        celery=knowledge_for(workspace, route=form.route, to=to),
        repair=repair,
    )


def knowledge_for(
    workspace: Workspace,
    *,
    route: str,
    to: QueueRef | None,
    planned: Mapping[str, str] | None = None,
) -> TaskKnowledge | None:
    """What a move knows of the tasks (the CLI's ``task_knowledge``): routes by task when
    asked, a plan's recorded targets when it was made so."""
    known = workspace.knowledge
    if route == "task" and (known is None or known.router is None) and planned is None:
        raise UsageProblem("routing by task needs the Celery app's routes (--celery-app)")
    if known is None and planned is None:
        return None
    return TaskKnowledge(
        router=known.router if known is not None else None,
        registry=known.registry if known is not None else None,
        route_by_task=to is None and route == "task" and planned is None,
        include_unregistered=to is not None,
        planned=planned if to is None else None,
    )


def _queue(workspace: Workspace, target: DlqTarget, name: str) -> QueueRef:
    return workspace.broker_for(target.region).describe(name)


def _celery_queue(workspace: Workspace, queue: QueueRef) -> bool:
    return any(queue_name(f.queue) == queue.name for f in workspace.layout.families)


def plan_request(workspace: Workspace, plan: Plan) -> ApplyRequest:
    """Executing exactly ``plan`` (the console's or the CLI's), as ``redrive apply PLAN
    --execute`` does."""
    target = workspace.target(plan.dlq_url)
    if target.dlq.url != plan.dlq_url:
        raise UsageProblem(f"the plan is for {plan.dlq_url}, which is not a DLQ now")
    applying = ApplyOptions(execute=True)
    if plan.kind != "move":
        return apply_request(target, plan, applying)
    to = _queue(workspace, target, plan.options["to"]) if plan.options.get("to") else None
    routed = plan.options.get("route") == "task"
    planned = {i.message_id: i.target for i in plan.items if i.target} if routed else None
    return apply_request(
        target,
        plan,
        applying,
        to=to,
        to_celery_queue=to is None or _celery_queue(workspace, to),
        celery=knowledge_for(workspace, route="source", to=to, planned=planned),
    )


def confirmation_needed(plan: Plan) -> bool:
    """Whether executing the plan asks for the DLQ's name typed: a purge, a big move."""
    return plan.kind == "purge" or len(plan.items) > CONFIRM_OVER


def confirmed(plan: Plan, target: DlqTarget, typed: str) -> bool:
    return not confirmation_needed(plan) or typed.strip() == target.dlq.name


def execute(
    workspace: Workspace,
    request: ApplyRequest,
    person: Person,
    plan_id: str,
    stop: threading.Event,
    observer: RunObserver[Any],
) -> Outcome[Any]:
    """Run the plan's apply to its end or to ``stop`` (in an operation's thread)."""
    return run_operation(
        request,
        setup=setup_of(workspace),
        ledger=workspace.ledger_uri,
        caller=caller_of(person, f"apply {plan_id}"),
        observer=observer,
        stop=stop,
    )


# -- replaying an archive (no plan file: the CLI's replay has none) ------------------------


@dataclass(frozen=True, slots=True)
class ReplayForm:
    """A replay of an archive (``redrive replay ARCHIVE``): its selection and where to."""

    source: str
    to: str | None = None
    tasks: tuple[str, ...] = ()
    where: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "to": self.to, "tasks": self.tasks, "where": self.where}


def replay_request(workspace: Workspace, form: ReplayForm, *, execute: bool) -> ReplayRequest:
    """The replay as ``redrive replay`` makes it: to ``form.to``, or where each task's route
    names (the Celery app's routes)."""
    to = workspace.broker_for(None).describe(form.to) if form.to else None
    knowledge = knowledge_for(workspace, route="source" if to else "task", to=to)
    if to is None and (knowledge is None or not knowledge.route_by_task):
        raise UsageProblem("a replay needs a queue to send to (or the Celery app's routes)")
    selection = Selection(tasks=form.tasks, where=compile_where(form.where) if form.where else None)
    options = MoveOptions(
        selection=selection,
        execute=execute,
        to=to,
        to_celery_queue=to is None or _celery_queue(workspace, to),
        celery=knowledge,
    )
    return ReplayRequest(form.source, to, options)


def replay_dry_run(workspace: Workspace, form: ReplayForm, person: Person) -> dict[str, Any]:
    """The replay's dry run: what it would send (its JSON), or a RedriveError."""
    outcome: Outcome[Any] = run_operation(
        replay_request(workspace, form, execute=False),
        setup=setup_of(workspace),
        ledger=workspace.ledger_uri,
        caller=caller_of(person, f"replay {form.source} (dry run)"),
    )
    result: dict[str, Any] = outcome.unwrap().to_json()
    return result


def execute_replay(
    workspace: Workspace,
    form: ReplayForm,
    person: Person,
    stop: threading.Event,
    observer: RunObserver[Any],
) -> Outcome[Any]:
    """Run the replay its dry run showed (in an operation's thread)."""
    return run_operation(
        replay_request(workspace, form, execute=True),
        setup=setup_of(workspace),
        ledger=workspace.ledger_uri,
        caller=caller_of(person, f"replay {form.source}"),
        observer=observer,
        stop=stop,
    )
