"""``ledger resolve``'s text: per in-doubt message what was found and what is (or would be)
done, then the counts and what is left to the operator."""

from __future__ import annotations

from redrive.durations import iso_utc
from redrive.ledger import RunInfo
from redrive.operations.resolve import Action, Resolution, ResolveResult
from redrive.render.tables import printable

_WOULD = {
    Action.RECORD_SENT: "record it as sent",
    Action.RESEND: "release its claim to resend",
    Action.SKIP: "mark it skipped",
    Action.LEAVE: "leave it in doubt",
    Action.WAIT: "wait for the lease",
}
_DID = {
    Action.RECORD_SENT: "recorded as sent",
    Action.RESEND: "claim released to resend",
    Action.SKIP: "marked skipped",
    Action.LEAVE: "left in doubt",
    Action.WAIT: "left: the lease runs",
}


def resolution_lines(item: Resolution, *, executed: bool) -> list[str]:
    """One message: who it is, what was found, what is (or would be) done and why."""
    entry = item.evidence.entry
    head = (
        f"{printable(entry.message_id)}  {printable(entry.task)}  task id "
        f"{printable(item.evidence.task_id or '-')}  (claimed by run {entry.run_id} at "
        f"{iso_utc(entry.updated_at)}, {_run_end(item.evidence.run)})"
    )
    if not executed:
        act = f"would {_WOULD[item.action]}"
    elif item.done or item.action in (Action.LEAVE, Action.WAIT):
        act = _DID[item.action]
    else:
        act = f"not done (the ledger refused: the key changed meanwhile): {_WOULD[item.action]}"
    return [head, f"  found: {printable(item.found)}", f"  {act}: {printable(item.why)}"]


def _run_end(run: RunInfo | None) -> str:
    """How the audit trail says the claiming run ended."""
    if run is None:
        return "a run the ledger no longer records"
    if run.ended_at is None:
        return "which never ended (killed or crashed)"
    return f"which ended {run.outcome or 'without an outcome'}"


def resolve_text(result: ResolveResult, *, again: str | None = None) -> str:
    """The whole summary; ``again``: the command that would do what this dry run shows."""
    if not result.resolutions:
        busy = f" ({result.busy} claimed by runs still live: not in doubt)" if result.busy else ""
        return f"nothing in doubt in ledger {printable(result.ledger)}{busy}" + _unmatched(result)
    lines: list[str] = []
    for item in result.resolutions:
        lines += [*resolution_lines(item, executed=result.executed), ""]
    counts = ", ".join(
        f"{result.count(a)} {(_DID if result.executed else _WOULD)[a]}"
        for a in Action
        if result.count(a)
    )
    lines.append(
        f"{len(result.resolutions)} in doubt in ledger {printable(result.ledger)}: {counts}."
    )
    if result.count(Action.RESEND):
        lines.append(
            "Released claims are sent by the next `redrive move` (or `replay`) of their DLQ."
        )
    if result.count(Action.LEAVE):
        lines.append(
            f"{result.count(Action.LEAVE)} left to you: nothing redrive can read without harm "
            "proves whether they were sent. Check the worker's logs or the task's side "
            "effects, then name each with --resend ID (only if the task may run twice) or "
            "--skip ID (task id, message id or key)."
        )
    if not result.executed and again is not None:
        lines += ["", f"nothing was changed (dry run); to do it, run:\n  {again}"]
    return "\n".join(lines) + _unmatched(result)


def _unmatched(result: ResolveResult) -> str:
    if not result.unmatched:
        return ""
    return "\nnot in doubt (so nothing done with them): " + ", ".join(
        printable(i) for i in result.unmatched
    )
