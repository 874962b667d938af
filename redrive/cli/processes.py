"""``--processes N``: what the CLI hands the core's orchestration
(redrive.runs.processes), and the lines it adds to a run's text."""

from __future__ import annotations

import functools
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from redrive.aws.session import AwsSettings
from redrive.broker.base import DlqTarget
from redrive.celery.knowledge import TaskKnowledge
from redrive.celery.registry import Registry
from redrive.celery.results import ResultLookup, open_app_results, open_results
from redrive.cli.celery_app import task_router
from redrive.cli.context import Context
from redrive.operations.coordinator import InspectRequest
from redrive.operations.move import MoveOptions
from redrive.runs.processes import ProcessesResult, Wiring


def run_wiring(
    ctx: Context, dlq: DlqTarget | None, ledger: str | None, options: Any = None
) -> Wiring:
    """What each process of ``--processes`` builds its own adapters from (the coordinator's
    ``Setup.wiring``): for the DLQ ``dlq`` (None: a replay, which sends to the region of
    the options, and counts no receives), the ledger's URI, and the request's options."""
    if isinstance(options, InspectRequest):
        assert dlq is not None
        return inspect_wiring(ctx, dlq, options.results)
    rebuild = _celery_rebuild(ctx, options) if isinstance(options, MoveOptions) else None
    return Wiring.of(
        ctx.aws,
        broker=ctx.broker_settings,
        **({"region": dlq.region} if dlq is not None else {}),
        ledger=ledger,
        receive_log=dlq is not None and not ctx.receive_log().problem,
        rebuild=rebuild,
    )


def _celery_rebuild(ctx: Context, options: MoveOptions) -> Callable[[Any], Any] | None:
    """How a process makes a move's Celery app and result backend again (None: it has
    neither)."""
    if options.celery or options.results:
        return functools.partial(rebuild_celery, CeleryRecipe.of(ctx, options))
    return None


def inspect_wiring(ctx: Context, dlq: DlqTarget, results: ResultLookup | None) -> Wiring:
    """An inspect's: its result backend (if any) opened again in each process, read-only
    and without a probe, as inspect opens it."""
    rebuild = None
    if results is not None:
        url = ctx.result_backend_url
        rebuild = functools.partial(open_scan_results, url, ctx.config, ctx.celery_app)
    return Wiring.of(
        ctx.aws,
        broker=ctx.broker_settings,
        region=dlq.region,
        receive_log=not ctx.receive_log().problem,
        rebuild=rebuild,
    )


def open_scan_results(
    url: str | None, config: str | None, celery_app: str | None, _: object
) -> ResultLookup | None:
    """In a child: the result backend an inspect reads (its URL, else the app's)."""
    if url:
        return open_results(url, probe=False, background=True)
    loaded = Context(AwsSettings(), config, celery_app=celery_app).celery()
    return open_app_results(*loaded, probe=False) if loaded is not None else None


@dataclass(frozen=True, slots=True)
class CeleryRecipe:
    """How a process of ``--processes`` makes the parent's TaskKnowledge and ResultLookup
    again: the same config and app, the same decisions (``route_by_task``...)."""

    config: str | None
    celery_app: str | None
    knowledge: bool
    route_by_task: bool
    include_unregistered: bool
    planned: Mapping[str, str] | None
    results_url: str | None
    results_of_app: bool

    @classmethod
    def of(cls, ctx: Context, options: MoveOptions) -> CeleryRecipe:
        knowledge = options.celery
        url = ctx.result_backend_url
        return cls(
            config=ctx.config,
            celery_app=ctx.celery_app,
            knowledge=knowledge is not None,
            route_by_task=knowledge is not None and knowledge.route_by_task,
            include_unregistered=knowledge is not None and knowledge.include_unregistered,
            planned=dict(knowledge.planned) if knowledge and knowledge.planned else None,
            results_url=url if options.results is not None else None,
            results_of_app=options.results is not None and not url,
        )


def rebuild_celery(recipe: CeleryRecipe, options: MoveOptions) -> MoveOptions:
    """In a child: the options with its own app's knowledge and result backend."""
    ctx = Context(AwsSettings(), recipe.config, celery_app=recipe.celery_app)
    knowledge = None
    if recipe.knowledge:
        loaded = ctx.celery()
        knowledge = TaskKnowledge(
            router=task_router(ctx),
            registry=Registry(*loaded) if loaded is not None else None,
            route_by_task=recipe.route_by_task,
            include_unregistered=recipe.include_unregistered,
            planned=recipe.planned,
        )
    results: ResultLookup | None = None
    if recipe.results_url:
        results = open_results(recipe.results_url, probe=True)
    elif recipe.results_of_app and (loaded := ctx.celery()) is not None:
        results = open_app_results(*loaded, probe=True)
    return replace(options, celery=knowledge, results=results)


def processes_text(outcome: Any, text: str) -> str:
    """A run's text, and for ``--processes`` how many ran and any that died."""
    if not isinstance(outcome, ProcessesResult):
        return text
    lines = [text, "", f"processes: {outcome.processes}"]
    named = getattr(outcome.result, "archive", None)
    if outcome.archives and named and not outcome.dry_run:
        # Every part is named in the summary above: say how to replay them together.
        lines.append(
            f"archive: one part per process; `redrive replay {shlex.quote(named)}` replays "
            "them all as one archive"
        )
    for child in outcome.children:
        if child.outcome != "completed":
            lines.append(f"  {child.describe()}")
    if any(c.claims for c in outcome.died):
        lines.append(
            "a process died: what it claimed and did not confirm is in doubt (above); rerun "
            "to finish the rest"
        )
    elif outcome.died:
        lines.append("a process died: rerun to finish the rest")
    return "\n".join(lines)
