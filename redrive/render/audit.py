"""``audit``: the list of executed runs, and one run in detail."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from redrive.broker.server import BrokerServer
from redrive.ledger import RunInfo
from redrive.render.selection import filters_text
from redrive.render.tables import Narrow, fit_text, fitted_table, printable, when, when_cell
from redrive.reporting.audit import RunDetail
from redrive.shell import shell_quote

# The command names the target, and `audit RUN` shows everything: the listing keeps what
# tells runs apart (id, when, outcome, counts, the command's start).
AUDIT_STEPS = (
    Narrow("tight"),
    Narrow("short", "started"),
    Narrow("headers"),
    Narrow("drop", "target"),
    Narrow("shrink", "command", 40),
    Narrow("shrink", "who", 16),
    Narrow("shrink", "counts", 24),
    Narrow("drop", "who"),
    Narrow("shrink", "command", 24),
    Narrow("shrink", "counts", 16),
    Narrow("shrink", "command", 16),
)


def audit_table(
    runs: Sequence[RunInfo], *, width: int | None = None, now: float | None = None
) -> str:
    if not runs:
        return "no runs recorded"
    rows = []
    for run in runs:
        info = run.info or {}
        who = info.get("aws_arn") or f"{info.get('user', '?')}@{info.get('host', '?')}"
        rows.append(
            [
                run.run_id,
                when_cell(run.started_at, now),
                run.outcome or "running/crashed",
                who,
                info.get("target", "-"),
                counts_text(run.counts) or "-",
                info.get("command_line") or run.command,
            ]
        )
    return fitted_table(
        rows,
        ["run", "started", "outcome", "who", "target", "counts", "command"],
        width=width,
        steps=AUDIT_STEPS,
    )


# The order a reader follows a run in (the ledger stores counts sorted by name).
_COUNT_ORDER = ("matched", "moved", "archived", "purged", "skipped", "failed", "in_doubt")


def counts_text(counts: Mapping[str, Any], *, zeros: bool = False) -> str:
    """``matched 3, moved 2, duplicates deleted 1``: a run's counts as a person reads them."""
    order = {name: i for i, name in enumerate(_COUNT_ORDER)}
    ranked = sorted(counts.items(), key=lambda item: order.get(str(item[0]), len(order)))
    return ", ".join(
        f"{str(name).replace('_', ' ')} {value}" for name, value in ranked if zeros or value
    )


# A run's keys and deletions: ids whole (each is looked up), the task's module path first.
KEYS_STEPS = (
    Narrow("tight"),
    Narrow("headers"),
    Narrow("shrink", "task", 24),
    Narrow("shrink", "task", 12),
)


def broker_text(server: dict[str, Any]) -> str:
    """``RabbitMQ 4.0.5 at amqp://...`` / ``SQS at https://...`` of a run's record."""
    version = server.get("version")
    name = BrokerServer(str(server.get("kind")), str(version) if version else None, "").name
    return f"{name} at {server.get('endpoint') or '?'}"


def run_detail_text(detail: RunDetail, *, width: int | None = None) -> str:
    run = detail.run
    info = run.info or {}

    def value_of(name: str, default: str = "-") -> str:
        # The command line and names are the operator's text, printed back to a terminal.
        return printable(str(info.get(name) or default))

    command = printable(str(info.get("command_line") or run.command))
    lines = [f"run {run.run_id}: {run.outcome or 'running, or crashed before it could end'}"]
    if width is not None and len(f"  command:  {command}") > width:
        # On a line of its own, whole: it pastes back into a shell.
        lines += ["  command:", f"    {command}"]
    else:
        lines.append(f"  command:  {command}")
    if info.get("cwd"):
        lines.append(f"  cwd:      {value_of('cwd')}")
    lines += [
        f"  started:  {when(run.started_at)}",
        f"  ended:    {when(run.ended_at)}",
        f"  who:      {value_of('user', '?')}@{value_of('host', '?')}"
        + (f" as {value_of('aws_arn')}" if info.get("aws_arn") else "")
        + (f" on {value_of('broker')}" if info.get("broker") else ""),
        f"  target:   {value_of('target')} ({value_of('dlq')})",
        f"  filters:  {filters_text(info.get('filters') or {})}",
        f"  ledger:   {value_of('ledger')}",
        f"  archive:  {value_of('archive')}",
    ]
    edits = info.get("edits")
    if isinstance(edits, list) and edits:
        # Issue 26: what the run changed in each task it sent (the archive keeps the originals).
        lines.append(f"  edits:    {' '.join(shell_quote(str(word)) for word in edits)}")
    server = info.get("broker_server")
    if isinstance(server, dict):
        # Runs of a redrive before issue 39 did not record it.
        lines.append(f"  broker:   {printable(broker_text(server))}")
    if info.get("sqs_client"):
        # Runs of a redrive before --sqs-client did not record it (they used botocore).
        lines.append(f"  client:   {value_of('sqs_client')} (SQS)")
    lines.append(f"  counts:   {counts_text(run.counts, zeros=True) or '-'}")
    if detail.keys:
        lines.append("")
        lines.append(
            fitted_table(
                [[e.key, str(e.state), e.task, e.message_id] for e in detail.keys],
                ["key", "state", "task", "dlq message id"],
                width=width,
                steps=KEYS_STEPS,
            )
        )
    lines += deleted_text(run.run_id, info, run.counts, width)
    return fit_text("\n".join(lines), width)


def deleted_text(
    run_id: str, info: Mapping[str, Any], counts: Mapping[str, Any], width: int | None = None
) -> list[str]:
    """What a purge deleted, as its run recorded it (runs of older redrives did not)."""
    deleted = info.get("deleted")
    if not isinstance(deleted, list):
        return []
    total = int(counts.get("purged", len(deleted)) or 0)
    head = f"deleted from the DLQ: {total} message(s)"
    if info.get("method") == "purge-queue":
        return ["", head + " by SQS PurgeQueue, which does not say which (no archive)"]
    if len(deleted) < total:
        head += f"; the first {len(deleted)} are listed"
        head += (
            f" (the archive holds every one, with run_id {run_id})"
            if info.get("archive")
            else " (no archive was kept)"
        )
    lines = ["", head + (":" if deleted else "")]
    if deleted:
        lines.append(
            fitted_table(
                [[m[0], m[2] or "-", m[1]] for m in deleted if isinstance(m, list) and len(m) == 3],
                ["message id", "task id", "task"],
                width=width,
                steps=KEYS_STEPS,
            )
        )
    return lines


# -- ledger in-doubt -------------------------------------------------------------------------

IN_DOUBT_HEADERS = ("message id", "task id", "task")
# A row is printed as it is read (no table can be measured first): SQS's MessageIds and
# Celery's task ids are UUIDs, and the task, the one long value, goes last.
_ID_WIDTH = 36


def in_doubt_head(location: str) -> str:
    return (
        f"in doubt in ledger {printable(location)}: claimed by a run that ended before SQS "
        "confirmed the send, so the task may already be in its queue; each message is still "
        "in its DLQ\n" + in_doubt_row(IN_DOUBT_HEADERS)
    )


def in_doubt_row(cells: Sequence[str | None]) -> str:
    message_id, task_id, task = (printable(c or "-") for c in cells)
    return f"{message_id:<{_ID_WIDTH}}  {task_id:<{_ID_WIDTH}}  {task}".rstrip()


def in_doubt_foot(location: str, listed: int, busy: int, *, run_id: str | None = None) -> str:
    """What follows the listed rows: what to do with them, or that nothing is in doubt."""
    live = f"{busy} claimed by runs still live: being sent now, not in doubt" if busy else ""
    if not listed:
        where = f" by run {printable(run_id)}" if run_id else ""
        return f"nothing in doubt{where} in ledger {printable(location)}" + (
            f" ({live})" if live else ""
        )
    return "\n".join(
        [
            "",
            *([f"({busy} more {live.partition(' ')[2]})"] if busy else []),
            f"{listed} message(s) in doubt. `redrive ledger resolve` shows, for each, what "
            "redrive can tell (with --result-backend, the task's record) and what it would do. "
            "Or find out yourself whether its task ran (its task "
            "id in the workers' logs or the result backend), then `redrive move TARGET "
            "--message-id ID --in-doubt skip --execute` if it ran, `--in-doubt resend` if it "
            "did not (TARGET: the one the run moved, as `redrive audit RUN_ID` shows). --json "
            "adds each one's key, target queue, run and time of claim.",
        ]
    )
