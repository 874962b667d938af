"""``apply``: the command that acts on exactly the messages of a plan (a move's or a
purge's)."""

from __future__ import annotations

from typing import Any, Literal

import click

from redrive.broker.base import DlqTarget, QueueRef
from redrive.celery.knowledge import TaskKnowledge
from redrive.cli.celery_app import (
    route_options,
    task_knowledge,
)
from redrive.cli.console import (
    Progress,
    ProgressDisplay,
    emit_json,
    execute_command,
    finish_move,
)
from redrive.cli.context import (
    Context,
    core_errors,
    pass_ctx,
)
from redrive.cli.move import confirm_move, move_progress, routed_text
from redrive.cli.options import (
    complete_file,
    execute_options,
    include_succeeded_option,
    json_option,
    ledger_option,
    processes_sharing,
    wide_output_option,
    workers_option,
)
from redrive.cli.processes import processes_text
from redrive.cli.purge import confirm_purge, purge_progress
from redrive.cli.runner import prepared, run_request
from redrive.errors import UsageProblem
from redrive.operations.apply import ApplyOptions, ApplyResult
from redrive.operations.coordinator import ApplyRequest, apply_request
from redrive.operations.move import (
    IN_DOUBT_POLICIES,
    InDoubtPolicy,
    MoveOptions,
    MoveResult,
)
from redrive.operations.plan import Plan
from redrive.operations.purge import PurgeOptions
from redrive.render.move import move_text, purge_text


@click.command(short_help="Act on exactly the messages of a plan (move/purge --plan-out).")
@click.argument("plan_path", metavar="PLAN", shell_complete=complete_file)
@execute_options
@ledger_option
@click.option(
    "--in-doubt",
    type=click.Choice(IN_DOUBT_POLICIES),
    help="Override the plan's in-doubt policy (move plans).",
)
@include_succeeded_option
@workers_option
@processes_sharing("the ledger")
@route_options
@json_option
@wide_output_option
@pass_ctx
def apply(
    ctx: Context,
    /,
    plan_path: str,
    execute: bool,
    yes: bool,
    ledger: str | None,
    in_doubt: InDoubtPolicy | None,
    include_succeeded: bool,
    workers: int,
    processes: int,
    route: str | None,
    include_unregistered: bool,
    as_json: bool,
) -> None:
    """Act on exactly the messages of a plan written by `move/purge --plan-out`.

    Messages not in the plan are left alone even if they match its filters now; planned
    messages no longer in the DLQ are reported as gone; applying a plan twice does
    nothing the second time. A dry run unless --execute.
    """
    with core_errors():
        plan = Plan.read(plan_path)
        dlq = ctx.target(plan.dlq_url)
        if dlq.dlq.url != plan.dlq_url:
            raise UsageProblem(f"plan {plan_path} is for {plan.dlq_url}, which is not a DLQ now")
    if not plan.items:
        click.echo(f"plan {plan_path} selects no message: nothing to do", err=True)
        if as_json:
            kind: Literal["move", "purge"] = "move" if plan.kind == "move" else "purge"
            emit_json(ApplyResult(kind, 0, None, not execute).to_json())
        return
    with core_errors():
        applying = ApplyOptions(execute, in_doubt, workers, include_succeeded)
        destination = plan_destination(ctx, plan, route, include_unregistered)
        request = apply_request(dlq, plan, applying, processes=processes, **destination)
    run_apply(ctx, request, ledger, yes=yes, as_json=as_json)


def run_apply(
    ctx: Context, request: ApplyRequest, ledger: str | None, *, yes: bool, as_json: bool
) -> None:
    """Confirm, apply the plan through the coordinator, render."""
    request = prepared(ctx, request)
    dlq, options = request.target, request.options
    with core_errors():
        confirm_apply(ctx, dlq, options, yes)
    knowledge = getattr(options, "celery", None)
    display = (
        ProgressDisplay(Progress("move"), move_progress)
        if isinstance(options, MoveOptions)
        else ProgressDisplay(Progress(dlq.label), purge_progress)
    )
    result = run_request(
        ctx,
        request,
        ledger=ledger,
        display=display,
        as_json=as_json,
        summary=lambda partial, width: apply_summary(partial, knowledge, width),
        kinds=ApplyResult,
    ).unwrap()
    finish_move(
        result,
        as_json,
        lambda width: apply_summary(result, knowledge, width),
        next_command=execute_command() if would_act(result) else None,
    )


def apply_summary(
    applied: ApplyResult, knowledge: TaskKnowledge | None, width: int | None = None
) -> str:
    return processes_text(applied.spread, apply_text(applied, knowledge, width))


def would_act(applied: ApplyResult) -> bool:
    """Whether the plan's dry run found something the execute would do."""
    result = applied.result
    if not applied.dry_run or result is None:
        return False
    if isinstance(result, MoveResult):
        return bool(result.moved or result.duplicates)
    return bool(result.matched)


def plan_destination(
    ctx: Context, plan: Plan, route: str | None, include_unregistered: bool
) -> dict[str, Any]:
    """Where a move plan sends (nothing for a purge plan), as :func:`apply_request` takes it."""
    if plan.kind != "move":
        return {}
    to = ctx.queue(plan.options["to"]) if plan.options.get("to") else None
    return {
        "to": to,
        "to_celery_queue": to is None or ctx.is_celery_queue(to),
        "celery": plan_knowledge(ctx, plan, to, route, include_unregistered),
    }


def plan_knowledge(
    ctx: Context, plan: Plan, to: QueueRef | None, route: str | None, include_unregistered: bool
) -> TaskKnowledge | None:
    """A move plan made with task routes sends each message to the target it recorded (what
    was reviewed), one made without to its source, as it always did; ``--route`` decides
    again instead."""
    routed = plan.options.get("route") == "task"
    planned = {i.message_id: i.target for i in plan.items if i.target}
    return task_knowledge(
        ctx,
        route=route or ("task" if routed else "source"),
        include_unregistered=include_unregistered or bool(plan.options.get("include_unregistered")),
        to=to,
        planned=planned if routed and route is None else None,
    )


def confirm_apply(
    ctx: Context, dlq: DlqTarget, options: MoveOptions | PurgeOptions, yes: bool
) -> None:
    if isinstance(options, MoveOptions):
        confirm_move(ctx, dlq, options, yes)
        return
    confirm_purge(ctx, dlq, options, yes)


def apply_text(
    applied: ApplyResult, knowledge: TaskKnowledge | None, width: int | None = None
) -> str:
    result = applied.result
    if isinstance(result, MoveResult):
        text = routed_text(knowledge, move_text(result, plan=True, width=width))
    else:
        assert result is not None  # an empty plan is not rendered
        text = purge_text(result, width=width)
    if applied.gone:
        text += "\n\n" + gone_text(applied)
    if applied.changed:
        text += "\n\n" + changed_text(applied)
    return text


def changed_text(applied: ApplyResult) -> str:
    """The plan's messages left because they are not the ones reviewed."""
    return (
        f"{applied.changed} of the plan's {applied.planned} message(s) changed since the plan "
        "(changed-since-plan: not the message reviewed): left in the DLQ; make a new plan "
        "(a dry run with --plan-out) to review them"
    )


def gone_text(applied: ApplyResult) -> str:
    """What became of the plan's messages no longer in the DLQ, as far as the ledger knows."""
    gone, sent = applied.gone, applied.gone_sent
    head = f"{gone} of the plan's {applied.planned} message(s) are no longer in the DLQ"
    if sent is not None and sent >= gone:
        return (
            f"{head}: the ledger records every one of them as sent (this plan was applied "
            "already, or another run moved them); nothing is left to do for them"
        )
    if sent:
        return (
            f"{head}: the ledger records {sent} of them as sent (moved already); the other "
            f"{gone - sent} were removed otherwise (a purge, a consumer, or a run with another "
            "ledger): left as they are"
        )
    return f"{head} (already acted on, or removed by someone else): left as they are"
