"""The summaries of move, purge and replay runs, with their hints (expired tasks, filters
that matched nothing, archive damage)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from redrive.archive import DamageReport
from redrive.ledger import default_ledger_path
from redrive.operations.move import BUSY, LEASE_LIVE, MoveResult, TaskCounts
from redrive.operations.move.repair_step import UNCHANGED, RepairReport
from redrive.operations.purge.engine import PurgeResult
from redrive.operations.verdict import POISON, STOPPED, UNRECORDED
from redrive.render.selection import misses_text
from redrive.render.tables import Narrow, fit_text, fitted_table, printable
from redrive.shell import shell_quote

# Per task: the task's name and its counts stay; where it went and why some were skipped
# wrap within their columns.
TASKS_STEPS = (
    Narrow("tight"),
    Narrow("headers"),
    Narrow("empty", "failed"),
    Narrow("empty", "duplicates"),
    Narrow("empty", "already sent"),
    Narrow("empty", "skipped (why)"),
    Narrow("shrink", "task", 40),
    Narrow("wrap", "to", 24),
    Narrow("wrap", "skipped (why)", 20),
    Narrow("shrink", "task", 24),
    Narrow("wrap", "to", 12),
    Narrow("below", "skipped (why)"),
    Narrow("below", "to"),
    Narrow("shrink", "task", 12),
)

# A list of messages: every id whole (each is looked up in its queue); an error wraps.
LISTED_STEPS = (
    Narrow("tight"),
    Narrow("headers"),
    Narrow("shrink", "task", 24),
    Narrow("wrap", "error", 24),
    Narrow("wrap", "why", 24),
    Narrow("shrink", "task", 12),
    Narrow("wrap", "error", 12),
    Narrow("wrap", "why", 12),
)


def move_text(
    result: MoveResult, *, verb: str = "move", plan: bool = False, width: int | None = None
) -> str:
    """A move's (or replay's) summary, fitted to ``width`` (None: at full length); ``plan``:
    the run applied a plan (``apply``), whose advice is a new plan, not --to."""
    past = {"move": "moved", "replay": "replayed"}.get(verb, verb + "d")
    would = "would " + verb if result.dry_run else past
    lines = [_move_head(result, verb, would)]
    if result.tasks:
        lines += ["", _tasks_table(result, verb, would, width)]
    if result.repair is not None:
        lines += repair_lines(
            result.repair, dry_run=result.dry_run, replay=verb == "replay", result=result
        )
    lines += _in_doubt_lines(result, width)
    lines += cut_lines(result.in_doubt, result.in_doubt_messages, in_doubt_rest(result.ledger))
    lines += _failed_lines(result, width)
    lines += cut_lines(result.failed, result.failed_messages, FAILED_REST)
    lines += _ambiguous_lines(result, verb, plan, width)
    lines += cut_lines(result.ambiguous, result.ambiguous_messages, AMBIGUOUS_REST)
    lines += _skipped_lines(result, verb, plan)
    lines += returns_lines(result)
    lines.extend(misses_text(result.misses, matched=result.matched))
    lines.extend(expired_hint(result, verb, plan=plan))
    lines += _still_hidden_lines(result)
    lines += _stopped_lines(result.interrupted, result.error)
    return fit_text("\n".join(lines), width)


def _stopped_lines(interrupted: bool, error: str | None) -> list[str]:
    """How a run that did not finish ended: the summary covers what it did."""
    if interrupted:
        return ["", "interrupted: the summary covers what was done; rerun to resume"]
    if error:
        return [
            "",
            "stopped by the error below: the summary covers what was done before it; "
            "rerun to resume once it is fixed",
        ]
    return []


def _move_head(result: MoveResult, verb: str, would: str) -> str:
    if verb == "replay":
        # An archive has no copies to delete: a key already sent is simply skipped.
        return (
            f"{'DRY RUN: ' if result.dry_run else ''}archive {result.target}: "
            f"{result.scanned} read, {result.matched} matched, {result.moved} {would}, "
            f"{result.duplicates} already sent (skipped), {result.skipped_total} skipped "
            f"otherwise, {result.failed} failed, {result.in_doubt} in doubt"
        )
    return (
        f"{'DRY RUN: ' if result.dry_run else ''}DLQ {result.dlq} ({result.target}): "
        f"{result.scanned} scanned, {result.matched} matched, {result.moved} {would}, "
        f"{result.skipped_total} skipped, "
        f"{result.failed} failed, {result.in_doubt} in doubt, "
        f"{result.duplicates} duplicate cop{'y' if result.duplicates == 1 else 'ies'} "
        f"{'would be deleted' if result.dry_run else 'deleted'}"
    )


def _tasks_table(result: MoveResult, verb: str, would: str, width: int | None) -> str:
    rows = []
    for task, c in sorted(result.tasks.items()):
        rows.append(
            [
                task,
                c.matched,
                c.moved,
                targets_cell(c),
                ", ".join(f"{reason}: {n}" for reason, n in sorted(c.skipped.items())) or "-",
                c.failed,
                c.duplicates,
            ]
        )
    headers = ["task", "matched", would, "to", "skipped (why)", "failed"]
    headers.append("already sent" if verb == "replay" else "duplicates")
    return fitted_table(rows, headers, width=width, steps=TASKS_STEPS)


def _listed(intro: str, rows: list[list[Any]], headers: list[str], width: int | None) -> list[str]:
    """A section naming messages, one table row each; nothing when there are none."""
    if not rows:
        return []
    return ["", intro, fitted_table(rows, headers, width=width, steps=LISTED_STEPS)]


FAILED_REST = (
    "all of them are still in the DLQ, and a rerun sends them again (the ledger keeps no "
    "record of a refused send)"
)
AMBIGUOUS_REST = (
    "all of them are still in the DLQ; a dry run narrowed with --task, --older-than or "
    "--newer-than lists the rest (the ledger keeps no record of held copies)"
)


def in_doubt_rest(ledger: str | None) -> str:
    """Where the in-doubt messages a summary leaves out are listed: the ledger's command."""
    command = "redrive ledger in-doubt"
    if ledger is not None and ledger != f"sqlite://{default_ledger_path().absolute()}":
        command += f" --ledger {shell_quote(ledger)}"
    return f"`{command}` lists them all"


def cut_lines(count: int, listing: Sequence[object], rest: str) -> list[str]:
    """Under a list cut at MAX_LISTED: how much of it is shown, and where the rest is."""
    if count <= len(listing):
        return []
    return [f"{len(listing)} of {count} shown: {rest}"]


def _in_doubt_lines(result: MoveResult, width: int | None) -> list[str]:
    return _listed(
        f"{result.in_doubt} message(s) in doubt: their send was in flight when "
        f"{_in_doubt_cause(result)}, so they may already be in the target queue. They stay in "
        "the DLQ. `redrive ledger resolve` shows, message by message, what can be known of "
        "each; or rerun with --in-doubt resend (safe when the task is idempotent on its "
        f"Celery task id) or --in-doubt skip{_not_before(result)}{_lease_live_note(result)}:",
        [[m.task, m.task_id or "-", m.message_id] for m in result.in_doubt_messages],
        ["task", "task id", "message id"],
        width,
    )


def _not_before(result: MoveResult) -> str:
    """When the ledger lets a rerun resolve what stopped runs left: once their leases end."""
    if not result.stopped_leases or result.skipped[LEASE_LIVE]:
        return ""
    return (
        f", once the lease of run {_runs(sorted(result.stopped_leases))} ends at about "
        f"{_clock(result.rerun_at)} (the ledger resolves none of its claims before)"
    )


def _lease_live_note(result: MoveResult) -> str:
    """For in-doubt messages an --in-doubt policy asked to resolve, which the ledger would
    not resolve yet: why, and when to rerun."""
    leased = result.skipped[LEASE_LIVE]
    if not leased:
        return ""
    return (
        f". {leased} of them were not resolved: the run that claimed them stopped, but its "
        "ledger lease has not run out, and the ledger resolves none of its claims before "
        "it does (--json: each message's detail says until when); rerun once it is over, "
        "or, if that run is in fact still running elsewhere, let it finish"
    )


def _in_doubt_cause(result: MoveResult) -> str:
    """Who left the in-doubt claims: earlier runs, this run's own unconfirmed sends, a
    process of this one that died; counted when more than one did."""
    died, own = result.died_in_doubt, result.own_in_doubt
    earlier = result.in_doubt - died - own
    # A run stopped mid-batch (an error, an abort) left its batch's claims as well.
    mine = OWN_STOPPED if result.error or result.interrupted else OWN_CAUSE
    causes = [
        (earlier, "an earlier run stopped", "an earlier run stopped ({n})"),
        (own, mine, mine + " ({n})"),
        (
            died,
            "a process of this run died (named below)",
            "a process of this run died ({n}, named below)",
        ),
    ]
    present = [(n, one, some) for n, one, some in causes if n > 0]
    if len(present) == 1:
        return present[0][1]
    return " or ".join(some.format(n=n) for n, _, some in present) or causes[0][1]


OWN_CAUSE = "the broker stopped answering this run (it never confirmed the send)"
OWN_STOPPED = "this run stopped (as said below) before the broker confirmed the send"


def _failed_lines(result: MoveResult, width: int | None) -> list[str]:
    return _listed(
        f"{result.failed} message(s) failed to send and stay in the DLQ:",
        [[m.task, m.message_id, m.detail] for m in result.failed_messages],
        ["task", "message id", "error"],
        width,
    )


def _pass(result: MoveResult, flag: str, plan: bool) -> str:
    """How to ask for ``flag``: pass it; after a plan (``apply`` has no such option), in a
    new plan."""
    if plan:
        return f"make a new plan with it (`redrive move {result.target} {flag} --plan-out FILE`)"
    return f"pass {flag}"


def _stay(verb: str) -> str:
    """Where skipped messages are, and how to clear them: an archive's stay in the archive,
    and purge cannot reach them there."""
    if verb == "replay":
        return "They were not sent (they stay in the archive)"
    return "They stay in the DLQ"


def _ambiguous_lines(result: MoveResult, verb: str, plan: bool, width: int | None) -> list[str]:
    copies = "leave them" if verb == "replay" else "purge them (archived)"
    again = _pass(result, "--ambiguous move", plan) if plan else "rerun with --ambiguous move"
    return _listed(
        f"{result.ambiguous} message(s) held as possible copies: each shares the "
        "idempotency key of a task already sent, and nothing tells a copy of it from a "
        f"second publish of its task id. {_stay(verb)}. If they are new invocations, "
        f"{again}; if copies, {copies}:",
        [[m.task, m.task_id or "-", m.message_id, m.detail] for m in result.ambiguous_messages],
        ["task", "task id", "message id", "why"],
        width,
    )


def _skipped_lines(result: MoveResult, verb: str, plan: bool) -> list[str]:
    """What to do about messages skipped as no-target, unregistered, not-celery or
    already-succeeded."""
    lines: list[str] = []
    if result.skipped.get("no-target"):
        lines += ["", _no_target_line(result, verb, plan)]
    # A replay's messages are in an archive: purge cannot reach them there.
    purge = "" if verb == "replay" else "purge them (archived), or "
    where = "ARCHIVE" if verb == "replay" else result.target
    if result.skipped.get("unregistered"):
        lines += [
            "",
            f"{result.skipped['unregistered']} message(s) skipped as unregistered: the Celery "
            f"app does not register their task, so a worker would drop them. {_stay(verb)}: "
            f"deploy the task again, {purge or 'or '}pass --include-unregistered to send them "
            "anyway.",
        ]
    if result.skipped.get("not-celery"):
        lines += [
            "",
            f"{result.skipped['not-celery']} message(s) skipped as not-celery: their bodies "
            "are not Celery tasks, so a Celery worker would drop them. Look at them with "
            f"`redrive inspect {where} --show-args`; {purge}"
            f"{_pass(result, '--include-unknown', plan)} to send them anyway.",
        ]
    lines += _stopped_skips(result, verb)
    if result.skipped.get(POISON):
        lines += ["", _poison_line(result, verb, plan, purge)]
    if result.skipped.get("already-succeeded"):
        lines += [
            "",
            f"{result.skipped['already-succeeded']} message(s) skipped as already-succeeded: "
            "Celery's result backend records their task as SUCCESS (an earlier copy ran), so "
            f"running them again would run the task twice. {_stay(verb)}: "
            f"{purge}pass --include-succeeded to send them anyway.",
        ]
    return lines


def returns_lines(result: MoveResult) -> list[str]:
    """What came back failed while the run went on, what died meanwhile, and whether the run
    stopped for it (redrive.operations.move.returns)."""
    lines: list[str] = []
    if result.came_back:
        lines += [
            "",
            f"{result.came_back} of the {result.moved} moved came back failed (left in the DLQ "
            "for the next run): a worker ran them and they failed again. One run sends each "
            f"task once; look at them with `redrive inspect {result.target}` before a rerun "
            "moves them again.",
        ]
    if result.dlq_grew_by > result.came_back:
        lines += [
            "",
            f"The DLQ grew by {result.dlq_grew_by} while the run went on ({result.moved} "
            "moved): tasks it moved that came back failed, or others that died meanwhile, "
            "left in the DLQ for the next run.",
        ]
    if result.died_during_run:
        lines += [
            "",
            f"{result.died_during_run} message(s) died after this run began: left in the DLQ "
            "for the next run.",
        ]
    if result.stopped_by_returns:
        limit = result.stopped_by_returns
        lines += [
            "",
            f"stopped: more than {limit} of the moved came back failed (--stop-after-returns "
            f"{limit}): nothing more was sent, the rest stay in the DLQ. Fix what fails them, "
            "then rerun (or rerun with a higher --stop-after-returns, or off).",
        ]
    return lines


def _no_target_line(result: MoveResult, verb: str, plan: bool) -> str:
    """Why messages had nowhere to go, and only ways that give them somewhere: never --to
    a queue that does not exist, nor an option the command does not have."""
    head = f"{result.skipped['no-target']} message(s) skipped as no-target: "
    head += result.no_target_reason or "their source queue is ambiguous"
    if plan:
        to = (
            f"make a plan that names an existing queue (`redrive move {result.target} --to "
            "QUEUE --plan-out FILE`) and apply that"
        )
    elif result.no_target_missing:
        to = "pass --to an existing queue"
    elif result.no_target_candidates:
        to = f"pass --to QUEUE (one of: {', '.join(result.no_target_candidates)})"
    else:
        to = "pass --to QUEUE"
    ways = []
    if result.no_target_missing:
        ways.append(f"create queue {result.no_target_missing} and rerun")
    if result.no_target_by_route and verb != "replay":
        # A replay has no source queue to go back to: --route source is no way for it.
        ways.append("pass --route source to send them back to their source queue")
    if not ways:
        return f"{head}: {to} to send them there."
    return f"{head}. {_stay(verb)}: {', '.join(ways)}, or {to}."


def targets_cell(counts: TaskCounts) -> str:
    """Where a task's messages go, and when their route sends them elsewhere than their
    source (redrive.celery)."""
    text = ", ".join(sorted(counts.targets)) or "-"
    rerouted = sorted(counts.rerouted.items())
    if len(rerouted) == 1 and sum(counts.targets.values()) == rerouted[0][1]:
        text += f" (by route; source {rerouted[0][0]})"
    elif rerouted:
        text += f" (by route: {', '.join(f'{n} from {q}' for q, n in rerouted)})"
    return text


def _still_hidden_lines(result: MoveResult) -> list[str]:
    """What the DLQ still hides, and whose it is: a stopped run's (rerun after its lease,
    exit 3), a live run's (it moves them), or someone's the ledger does not know."""
    lines = _left_to_live_runs(result)
    if not result.still_hidden:
        return lines
    if result.stopped_leases:
        return [*lines, "", _left_to_stopped_runs(result)]
    until = (
        f"; they reappear by about {_clock(result.hidden_until)}"
        if result.hidden_until
        else "; they reappear when the lease of whoever received them runs out"
    )
    holder = (
        f"received by run {_runs(result.live_runs)}, still running"
        if result.live_runs
        else "received by another run or consumer"
    )
    return [
        *lines,
        "",
        f"note: {result.still_hidden} message(s) are still hidden in the DLQ ({holder}), so "
        f"the DLQ is not drained{until}. Rerun then.",
    ]


def _left_to_stopped_runs(result: MoveResult) -> str:
    """Messages hidden while the lease of a run that stopped without ending runs."""
    runs = sorted(result.stopped_leases)
    return (
        f"{result.still_hidden} message(s) are still hidden in the DLQ, held by run "
        f"{_runs(runs)}, which stopped without ending (killed or crashed): the DLQ is not "
        f"drained, and what that run was sending may be in doubt. Its lease ends at about "
        f"{_clock(result.rerun_at)}: rerun then (`redrive ledger resolve` then shows what is "
        "in doubt, message by message)."
    )


def _left_to_live_runs(result: MoveResult) -> list[str]:
    """Messages skipped because a live run claimed them: that run sends them."""
    busy = result.skipped[BUSY]
    if not busy:
        return []
    who = f"run {_runs(result.live_runs)}" if result.live_runs else "another run"
    return [
        "",
        f"note: {busy} message(s) skipped as {BUSY}: {who} is still running (its heartbeat "
        "is fresh) and sends them; nothing is left for this run. `redrive audit` shows that "
        "run; rerun after it ends to check.",
    ]


def _runs(run_ids: Sequence[str]) -> str:
    return ", ".join(run_ids)


def _clock(when: float | None) -> str:
    return f"{datetime.fromtimestamp(when or 0, UTC):%H:%M:%S} UTC"


def archive_damage_lines(report: DamageReport, *, replayed: bool = False) -> list[str]:
    """What a damaged archive kept out of an inspect or a partial replay, place by place."""
    promised = f" (its header promises {report.expected})" if report.expected is not None else ""
    if replayed:
        head = f"DAMAGED ARCHIVE: only the {report.readable} record(s) that read cleanly"
        head += f"{promised} were replayed or skipped as above; not read:"
    else:
        head = f"DAMAGED ARCHIVE: the counts above cover only the {report.readable} record(s)"
        head += f" that read cleanly{promised}; damaged:"
    lines = [head]
    for place in report.places:
        lines.append(f"  {printable(place.location)} at {place.where}: {printable(place.text)}")
    if report.count > len(report.places):
        lines.append(f"  ... and {report.count - len(report.places)} more damaged place(s)")
    return lines


def expired_hint(result: MoveResult, verb: str, *, plan: bool = False) -> list[str]:
    """What to do about messages skipped as expired (the table only says ``expired: N``);
    ``plan``: after ``apply``, which has no --include-expired of its own."""
    expired = result.skipped.get("expired", 0)
    if not expired:
        return []
    if plan:
        return [
            "",
            f"hint: {expired} message(s) skipped as expired: their Celery `expires` has passed, "
            "so a worker would discard them. To move them anyway, "
            f"{_pass(result, '--include-expired', plan)}",
        ]
    clear = (
        ""
        if verb == "replay"
        else f"; or archive and delete them with `redrive purge {result.target}` and filters "
        "that select them (inspect shows which tasks hold them)"
    )
    return [
        "",
        f"hint: {expired} message(s) skipped as expired: their Celery `expires` has passed, so a "
        f"worker would discard them. --include-expired {verb}s them anyway{clear}",
    ]


def _archive_named(result: PurgeResult) -> str:
    """The archive, and a ``--processes`` run's parts (one file per process) by name."""
    where = result.archive or "?"
    if not result.parts:
        return where
    return f"{where} (in {len(result.parts)} part(s): {', '.join(result.parts)})"


def purge_text(result: PurgeResult, *, width: int | None = None) -> str:
    """A purge's (or archive's) summary, fitted to ``width`` (None: at full length)."""
    return fit_text(_purge_text(result, width), width)


def _purge_text(result: PurgeResult, width: int | None) -> str:
    verb = result.command
    if result.method == "purge-queue":
        head = (
            f"{'DRY RUN: ' if result.dry_run else ''}DLQ {result.dlq} ({result.target}): "
            f"PurgeQueue {'would delete' if result.dry_run else 'deleted'} about "
            f"{result.matched} message(s), with no archive"
        )
        return head
    if not result.matched:
        # Nothing to archive or delete: no "would be archived to" a file no one will write.
        nothing = "archived" if verb == "archive" else "archived or deleted"
        head = (
            f"{'DRY RUN: ' if result.dry_run else ''}DLQ {result.dlq} ({result.target}): "
            f"{result.scanned} scanned, 0 matched: nothing "
            f"{'would be ' if result.dry_run else ''}{nothing}"
            + ("; the DLQ is unchanged" if not result.dry_run else "")
        )
    elif result.dry_run:
        head = (
            f"DRY RUN: DLQ {result.dlq} ({result.target}): {result.scanned} scanned, "
            f"{result.matched} matched, would be "
            + ("archived to " + _archive_named(result) if result.archive else "deleted")
            + (" and deleted" if result.archive and verb == "purge" else "")
        )
    elif verb == "archive":
        head = (
            f"DLQ {result.dlq} ({result.target}): {result.scanned} scanned, "
            f"{result.archived} archived to {_archive_named(result)}; the DLQ is unchanged"
        )
    else:
        head = (
            f"DLQ {result.dlq} ({result.target}): {result.scanned} scanned, "
            f"{result.matched} matched, {result.archived} archived, {result.purged} deleted, "
            f"{result.failed} failed"
            + (f"; archive: {_archive_named(result)}" if result.archive else "; no archive kept")
        )
    lines = [head]
    if result.by_task:
        lines.append("")
        lines.append(
            fitted_table(
                sorted(result.by_task.items()),
                ["task", "matched"],
                width=width,
                steps=(Narrow("tight"), Narrow("shrink", "task", 12)),
            )
        )
    if result.failed:
        lines.append("")
        lines.append(
            f"{result.failed} message(s) could not be deleted: they are archived and still "
            "in the DLQ (rerun to delete them; replay skips what is already sent)"
        )
    lines.extend(misses_text(result.misses, matched=result.matched))
    lines += _stopped_lines(result.interrupted, result.error)
    return "\n".join(lines)


def repair_lines(
    report: RepairReport,
    *,
    dry_run: bool,
    replay: bool = False,
    result: MoveResult | None = None,
) -> list[str]:
    """What the edits did (issue 26): the edits, a sample's diff per task, what became of
    the messages they changed (``result``: the run's counts) and how many they left (and
    why), and where the originals went."""
    edits = " ".join(shell_quote(word) for word in report.edits)
    lines = ["", f"edits: {edits}"]
    for task, samples in sorted(report.samples.items()):
        for sample in samples:
            lines.append(f"  {task} (a sample):")
            lines += [f"    {line}" for line in sample]
    where = "archive" if replay else "DLQ"
    if result is None:
        lines.append(f"  {report.changed} message(s) changed by the edits")
    else:
        lines.append(changed_line(report, result, replay=replay))
    left = sum(report.left.values())
    lines.append(
        f"  {left} left in the {where} by the edits ({report.left[UNCHANGED]} unchanged by them)"
        + (":" if report.details else "")
    )
    for detail, count in report.details.most_common(10):
        lines.append(f"    {count} × {detail}")
    return lines + _originals_lines(report, dry_run=dry_run, replay=replay)


def changed_line(report: RepairReport, result: MoveResult, *, replay: bool) -> str:
    """``N message(s) changed by the edits: M moved, S skipped (poison: S) and stay in the
    DLQ``: each changed message in exactly one of the counts."""
    total, fates = report.fates(
        moved=result.moved,
        duplicates=result.duplicates,
        failed=result.failed,
        skipped=result.skipped,
    )
    verb = "replay" if replay else "move"
    where = "archive" if replay else "DLQ"
    past = {"move": "moved", "replay": "replayed"}[verb]
    parts: list[str] = []
    skips: list[str] = []
    for fate, n in fates:
        if not n:
            continue
        if fate == "moved":
            parts.append(f"{n} {'would ' + verb if result.dry_run else past}")
        elif fate == "duplicates":
            parts.append(
                f"{n} already sent (not sent again)"
                if replay
                else f"{n} duplicate cop{'y' if n == 1 else 'ies'} of a task sent "
                + ("(would be deleted)" if result.dry_run else "(deleted)")
            )
        elif fate == "failed":
            parts.append(f"{n} failed to send (still in the {where})")
        elif fate == "not reached":
            parts.append(
                f"{n} not reached (--limit, or the run stopped first: still in the {where})"
            )
        else:
            skips.append(f"{fate.removeprefix('skipped:')}: {n}")
    if skips:
        parts.append(
            f"{sum(n for f, n in fates if f.startswith('skipped:'))} skipped "
            f"({', '.join(skips)}), so they stay in the {where} unedited"
        )
    return f"  {total} message(s) changed by the edits: " + (", ".join(parts) or "none")


def _originals_lines(report: RepairReport, *, dry_run: bool, replay: bool) -> list[str]:
    """Where the originals of the edited messages go."""
    if report.archive:
        said = "would be archived first to" if dry_run else "archived first to"
        line = f"  originals {said} {report.archive}"
        if report.continued:
            line += " (a new part beside the archive an earlier run of it began)"
        if not dry_run:
            line += f" ({report.archived} message(s))"
        return [line]
    if replay:
        return ["  originals: the archive replayed"]
    if dry_run:
        return ["  --execute archives the originals first: add --archive PATH (or --no-archive)"]
    if report.changed:
        return ["  originals not archived (--no-archive)"]
    return []


def _stopped_skips(result: MoveResult, verb: str) -> list[str]:
    """Messages a stop left uncounted by the run itself: what they are, and that a rerun
    takes them on."""
    lines: list[str] = []
    if result.skipped.get(STOPPED):
        lines += [
            "",
            f"{result.skipped[STOPPED]} message(s) not sent ({STOPPED}): decided on, then the "
            f"run stopped before it sent them. {_stay(verb)}: rerun to {verb} them.",
        ]
    if result.skipped.get(UNRECORDED):
        lines += [
            "",
            f"{result.skipped[UNRECORDED]} message(s) matched by a process that died before it "
            f"reported what it did with them ({UNRECORDED}): it sent none of them (the ledger "
            "holds no claim of theirs). Each is still in the DLQ (or was deleted as a copy of "
            f"a task sent before): rerun to {verb} them.",
        ]
    unscanned = _unscanned(result, verb)
    if unscanned:
        lines += [
            "",
            f"about {unscanned} message(s) of the DLQ not scanned: the run stopped before it "
            f"reached them. They stay in the DLQ: rerun to {verb} them.",
        ]
    return lines


def _unscanned(result: MoveResult, verb: str) -> int:
    """A stopped run's messages never reached (none for a replay: an archive has no depth)."""
    return 0 if verb == "replay" else result.not_scanned


def _poison_line(result: MoveResult, verb: str, plan: bool, purge: str) -> str:
    """Poison's way out: a higher --max-redrives, once what made them fail is fixed."""
    return (
        f"{result.skipped[POISON]} message(s) skipped as poison: redrive has sent each back "
        "--max-redrives times already, and each died again. "
        f"{_stay(verb)}: once what makes them fail is fixed, "
        f"{_pass(result, '--max-redrives N', plan)} (N above the times they were sent back; "
        f"`redrive inspect` counts them as poison) to {verb} them once more"
        + ("; or purge them (archived)." if purge else ".")
    )


def already_sent_hint(count: int, command: str, to: str) -> str:
    """A replay's tasks the ledger has sent already (to any queue): not sent again by it,
    and the exact way to send them to ``to`` as well, when that is where they did not go."""
    return (
        f"hint: {count} message(s) already sent: the ledger holds their task's key (an earlier "
        "move or replay sent them, to their queue or to another), and a replay sends each "
        f"task once per ledger. If {to} is not where they went (an edited move's originals, "
        "say: the edited copies went to their source queue) and you want them there too, "
        f"replay with a ledger of its own, which sends each of them there once (dry run "
        f"first):\n  {command}\nNever to the queue they went to: each task would run twice."
    )
