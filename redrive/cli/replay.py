"""``replay``: the command that sends archived messages to a queue."""

from __future__ import annotations

import re
import sys
from typing import NoReturn, Unpack

import click

from redrive.archive import ArchiveDamaged, DamageReport
from redrive.broker.base import QueueRef
from redrive.celery.knowledge import TaskKnowledge
from redrive.cli.celery_app import (
    route_options,
    task_knowledge,
)
from redrive.cli.console import (
    Progress,
    ProgressDisplay,
    command_words,
    confirm,
    emit_json,
    execute_command,
    finish_move,
    warn,
)
from redrive.cli.context import (
    Context,
    core_errors,
    pass_ctx,
)
from redrive.cli.exit_codes import EXIT_ATTENTION
from redrive.cli.move import move_run_options, repair_options, routed_text
from redrive.cli.options import (
    EditValues,
    MovePolicyValues,
    complete_file,
    complete_queue,
    edit_options,
    execute_options,
    json_option,
    ledger_option,
    move_options,
    processes_option,
    rate_option,
    selected,
    wide_output_option,
    workers_option,
)
from redrive.cli.processes import processes_text
from redrive.cli.runner import run_request
from redrive.errors import RedriveError, UsageProblem
from redrive.operations.coordinator import ReplayRequest
from redrive.operations.move import MoveOptions, RepairOptions
from redrive.operations.replay import ReplayResult
from redrive.render.move import already_sent_hint, archive_damage_lines, move_text
from redrive.render.selection import filters_text
from redrive.runs.processes import ProcessesResult
from redrive.selection import Selection
from redrive.shell import shell_join


@click.command(short_help="Send archived messages to a queue, byte-identical, each task once.")
@click.argument("source", metavar="ARCHIVE", shell_complete=complete_file)
@click.option(
    "--to",
    "to",
    metavar="QUEUE",
    shell_complete=complete_queue,
    help="Queue to send to (name or URL); required unless --celery-app or [routes] route "
    "each task.",
)
@selected
@execute_options
@ledger_option
@move_options
@workers_option
@processes_option
@rate_option
@edit_options
@click.option(
    "--allow-partial",
    is_flag=True,
    help="Replay what reads cleanly from a damaged archive, skipping the damage (exit 3).",
)
@route_options
@json_option
@wide_output_option
@pass_ctx
def replay(
    ctx: Context,
    /,
    source: str,
    to: str | None,
    selection: Selection,
    edits: EditValues,
    execute: bool,
    yes: bool,
    ledger: str | None,
    workers: int,
    processes: int,
    rate: float | None,
    allow_partial: bool,
    route: str | None,
    include_unregistered: bool,
    as_json: bool,
    **policies: Unpack[MovePolicyValues],
) -> None:
    """Send archived messages to a queue, byte-identical, each task once.

    ARCHIVE is a file written by purge or archive (.jsonl or .jsonl.gz) or an s3:// prefix.
    A dry run unless --execute; replaying twice sends nothing the second time. The whole
    archive is checked first: a damaged one sends nothing (exit 1) unless --allow-partial.
    """
    with core_errors():
        queue, knowledge = replay_destination(ctx, to, route, include_unregistered)
        repair = replay_repair(edits, execute)
    options = move_run_options(
        ctx,
        selection,
        to=queue,
        knowledge=knowledge,
        execute=execute,
        workers=workers,
        rate=rate,
        repair=repair,
        **policies,
    )
    outcome = run_replay(
        ctx,
        source,
        queue,
        options,
        yes=yes,
        ledger_uri=ledger,
        allow_partial=allow_partial,
        as_json=as_json,
        processes=processes,
    )
    finish_replay(
        outcome,
        options.celery,
        as_json=as_json,
        allow_partial=allow_partial,
        elsewhere=(to, own_ledger_command(to)) if to else None,
    )


def replay_repair(edits: EditValues, execute: bool) -> RepairOptions | None:
    """A replay's edits: its originals are the archive it reads, so it names none."""
    if edits["edit_archive"] or edits["no_archive"]:
        raise click.UsageError(
            "a replay sends from an archive: its originals are kept there already; "
            "drop --archive/--no-archive"
        )
    return repair_options(edits, execute=execute, archives=False)


def own_ledger_command(to: str) -> str:
    """How to replay to ``to`` tasks the ledger has sent already (elsewhere, say: a debug
    queue is a different send): this dry run with a ledger of its own, which has sent none
    of them, and keeps that replay once per task as any other."""
    words: list[str] = []
    skip = False
    for word in command_words():
        if skip:
            skip = False
        elif word == "--ledger":
            skip = True
        elif not word.startswith("--ledger=") and word not in ("--execute", "--yes", "-y"):
            words.append(word)
    name = re.sub(r"[^A-Za-z0-9._-]", "_", to.rsplit("/", 1)[-1]) or "queue"
    return shell_join(["redrive", *words, "--ledger", f"./redrive-replay-to-{name}.sqlite3"])


def finish_replay(
    finished: ReplayResult | ProcessesResult[ReplayResult],
    knowledge: TaskKnowledge | None,
    *,
    as_json: bool,
    allow_partial: bool,
    elsewhere: tuple[str, str] | None = None,
) -> None:
    """``elsewhere``: the queue given, and the command that replays to it what the ledger
    has sent already."""
    outcome = finished.result if isinstance(finished, ProcessesResult) else finished
    would_act = outcome.move.dry_run and outcome.move.moved
    finish_move(
        finished,
        as_json,
        lambda width: replay_summary(finished, knowledge, width, elsewhere),
        next_command=execute_command() if would_act else None,
    )
    end_with_damage(outcome.damage, allow_partial=allow_partial)


def replay_summary(
    finished: ReplayResult | ProcessesResult[ReplayResult],
    knowledge: TaskKnowledge | None,
    width: int | None = None,
    elsewhere: tuple[str, str] | None = None,
) -> str:
    outcome = finished.result if isinstance(finished, ProcessesResult) else finished
    text = replay_text(outcome, knowledge, width)
    if elsewhere is not None and outcome.move.duplicates:
        to, command = elsewhere
        text += "\n\n" + already_sent_hint(outcome.move.duplicates, command, to)
    return processes_text(finished, text)


def end_with_damage(damage: DamageReport | None, *, allow_partial: bool) -> None:
    """A replay that met damage: an error, or (--allow-partial) exit 3."""
    if damage is not None and not allow_partial:
        # Damaged after the check passed (the archive changed meanwhile): stopped there.
        raise click.ClickException(f"{damage.describe()}; the replay stopped there")
    if damage is not None:
        warn(f"{damage.describe()}; replayed what read cleanly, the damage skipped")
        sys.exit(EXIT_ATTENTION)


def replay_destination(
    ctx: Context, to: str | None, route: str | None, include_unregistered: bool
) -> tuple[QueueRef | None, TaskKnowledge | None]:
    """Where a replay sends: ``--to``, or where each task's route names."""
    knowledge = task_knowledge(ctx, route=route, include_unregistered=include_unregistered, to=to)
    queue = ctx.queue(to) if to else None
    if queue is None and (knowledge is None or not knowledge.route_by_task):
        raise UsageProblem(
            "replay needs --to QUEUE, or the tasks' routes (--celery-app MODULE:ATTR or "
            "a [routes] table) to send each task to the queue its route names"
        )
    return queue, knowledge


def run_replay(
    ctx: Context,
    source: str,
    to: QueueRef | None,
    options: MoveOptions,
    *,
    yes: bool,
    ledger_uri: str | None,
    allow_partial: bool,
    as_json: bool,
    processes: int = 1,
) -> ReplayResult | ProcessesResult[ReplayResult]:
    """Confirm, replay through the coordinator; a damaged archive is refused here."""
    destination = to.name if to else "the queue each task routes to"
    with core_errors():
        confirm(
            options.execute,
            yes,
            f"Send the selected archived messages to {destination}?",
            details=lambda: replay_details(source, destination, options.selection),
        )

    def refuse(error: RedriveError) -> None:
        if isinstance(error, ArchiveDamaged):
            refuse_damaged_archive(source, error.report, options.execute, as_json)

    outcome = run_request(
        ctx,
        ReplayRequest(source, to, options, allow_partial, processes),
        ledger=ledger_uri,
        display=ProgressDisplay(
            Progress("replay"), lambda r, _: f"{r.moved} replayed / {r.scanned} read"
        ),
        as_json=as_json,
        summary=lambda partial, width: replay_summary(partial, options.celery, width),
        kinds=(ReplayResult, ProcessesResult),
        refuse=refuse,
    )
    return outcome.unwrap()


def replay_text(
    outcome: ReplayResult, knowledge: TaskKnowledge | None, width: int | None = None
) -> str:
    text = routed_text(knowledge, move_text(outcome.move, verb="replay", width=width))
    if outcome.damage is not None:
        text += "\n\n" + "\n".join(archive_damage_lines(outcome.damage, replayed=True))
    return text


def refuse_damaged_archive(
    source: str, report: DamageReport, execute: bool, as_json: bool
) -> NoReturn:
    """A damaged archive sends nothing without --allow-partial: say where, exit 1."""
    if as_json:
        emit_json(
            {"dry_run": not execute, "archive": source, "replayed": 0, "damaged": report.to_json()}
        )
    if report.not_an_archive:
        raise click.ClickException(
            f"{source} is not a redrive archive: {report.first.text}; nothing was replayed: "
            "check the path (purge and archive write .jsonl.gz files, or an s3:// prefix)"
        )
    if not report.readable:
        # --allow-partial would replay nothing: no way to offer.
        raise click.ClickException(
            f"{report.describe()}; nothing was replayed, and no record reads cleanly: "
            "restore the archive from a copy"
        )
    raise click.ClickException(
        f"{report.describe()}; nothing was replayed: restore the archive from a copy, or "
        f"replay the {report.readable} record(s) that read cleanly with --allow-partial"
    )


def replay_details(source: str, to: str, selection: Selection) -> list[str]:
    return [
        f"  archive:  {source}",
        f"  to:       {to}",
        f"  filters:  {filters_text(selection.describe())}",
    ]
