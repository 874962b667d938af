"""The Celery app on the command line: ``--route``, ``--include-unregistered``, and what a
command learns from ``--celery-app`` (or REDRIVE_CELERY_APP, or ``[celery] app``) or the
config's ``[routes]`` table. The app is loaded only by the commands that use it, once."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import click

from redrive.broker.base import QueueRef
from redrive.celery.knowledge import ROUTE_MODES, TaskKnowledge
from redrive.celery.registry import Registry
from redrive.celery.routes import AppRoutes, ConfigRoutes, TaskRouter
from redrive.cli.context import Context
from redrive.errors import UsageProblem
from redrive.reporting.check import Finding, check_celery

F = TypeVar("F", bound=Callable[..., Any])


def route_options(f: F) -> F:
    f = click.option(
        "--include-unregistered",
        is_flag=True,
        help="Also send tasks the Celery app does not register (a worker drops them; "
        "skipped as unregistered by default).",
    )(f)
    f = click.option(
        "--route",
        type=click.Choice(ROUTE_MODES),
        help="task: each task to the queue its route names now (default when --celery-app "
        "or [routes] gives routes); source: back to the message's source queue. --to "
        "overrides both.",
    )(f)
    return f


def task_router(ctx: Context) -> TaskRouter | None:
    """The app's router, else the config's ``[routes]``, else None."""
    loaded = ctx.celery()
    if loaded is not None:
        return AppRoutes(*loaded)
    if ctx.layout.routes:
        return ConfigRoutes(ctx.layout.routes, ctx.layout)
    return None


def task_knowledge(
    ctx: Context,
    *,
    route: str | None,
    include_unregistered: bool,
    to: str | QueueRef | None,
    planned: Mapping[str, str] | None = None,
) -> TaskKnowledge | None:
    """What move, replay and apply know of the tasks; None when nothing (as before). An
    explicit ``--to`` sends unregistered tasks too: the user named the queue (a quarantine
    queue is where one sends them), so none is skipped as one no worker of the app takes."""
    loaded = ctx.celery()
    router = task_router(ctx)
    if route == "task" and router is None and planned is None:
        raise UsageProblem(
            "--route task needs the tasks' routes: --celery-app MODULE:ATTR (or "
            "REDRIVE_CELERY_APP, or [celery] app in the config), or a [routes] table"
        )
    registry = Registry(*loaded) if loaded is not None else None
    if router is None and registry is None and planned is None:
        return None
    return TaskKnowledge(
        router=router,
        registry=registry,
        route_by_task=to is None and route != "source" and router is not None,
        include_unregistered=include_unregistered or to is not None,
        planned=planned if to is None else None,
    )


def refuse_native_with_routes(
    ctx: Context, *, route: str | None, include_unregistered: bool, to: str | None
) -> None:
    """``move --native`` is the broker's own redrive: every message to its source (or
    ``--to``)."""
    if route == "task" or include_unregistered:
        raise UsageProblem(
            "--native lets the broker move every message to its source (or --to): it cannot route "
            "by task or keep unregistered tasks; drop --native"
        )
    if route is None and to is None and task_router(ctx) is not None:
        raise UsageProblem(
            "--native sends every message back to its source queue, not to the queue its "
            "task routes to now (--celery-app or [routes] give routes): pass --route source "
            "to accept that, or drop --native"
        )


def known_tasks(ctx: Context) -> TaskKnowledge | None:
    """What inspect shows of the tasks (routes, registry); None without app or [routes]."""
    loaded = ctx.celery()
    router = task_router(ctx)
    if router is None:
        return None
    return TaskKnowledge(router=router, registry=Registry(*loaded) if loaded else None)


def routing_note(knowledge: TaskKnowledge | None) -> str | None:
    """The line a move's summary starts its routes with."""
    if knowledge is None:
        return None
    if knowledge.planned is not None:
        return "routes: each message to the target its plan recorded"
    if knowledge.route_by_task and knowledge.router is not None:
        return (
            f"routes: each task to the queue its route names now ({knowledge.router.origin}); "
            "--route source sends each back to its source queue"
        )
    return None


def celery_findings(ctx: Context) -> list[Finding]:
    """``check --celery``: the app's settings findings; the app is required."""
    loaded = ctx.celery()
    if loaded is None:
        raise UsageProblem(
            "check --celery needs the Celery app: --celery-app MODULE:ATTR (or "
            "REDRIVE_CELERY_APP, or [celery] app in the config)"
        )
    app, spec = loaded
    return check_celery(
        app,
        spec,
        AppRoutes(app, spec),
        ctx.layout,
        declared_by_workers=ctx.broker_for(None).capabilities.declared_by_consumers,
    )
