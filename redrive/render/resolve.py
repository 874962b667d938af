"""``ledger resolve``'s text: per in-doubt message what was found and what is (or would be)
done, then the counts and what is left to the operator."""

from __future__ import annotations

import json

from redrive.durations import iso_utc
from redrive.ledger import RunInfo
from redrive.operations.resolve import Action, Resolution, ResolveResult, ResolveTally
from redrive.render.tables import printable

MESSAGE_INDENT = "    "
"""A message's depth in ``--json``'s document: inside the top object, inside its list."""
JSON_BETWEEN = ",\n"
"""What stands between two messages of ``--json``'s list."""
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
    items = "".join(resolution_text(item, executed=result.executed) for item in result.resolutions)
    return items + resolve_foot(result.tally(), again=again)


def resolution_text(item: Resolution, *, executed: bool) -> str:
    """One message's lines in ``ledger resolve``'s text, and the blank line after them:
    what :func:`resolve_foot` follows, a page at a time."""
    return "\n".join(resolution_lines(item, executed=executed)) + "\n\n"


def resolve_foot(tally: ResolveTally, *, again: str | None = None) -> str:
    """What follows the messages: the counts and what is left to the operator (or that
    nothing is in doubt); ``again``: the command that would do what this dry run shows."""
    if not tally.in_doubt:
        busy = f" ({tally.busy} claimed by runs still live: not in doubt)" if tally.busy else ""
        return f"nothing in doubt in ledger {printable(tally.ledger)}{busy}" + _unmatched(tally)
    counts = ", ".join(
        f"{tally.count(a)} {(_DID if tally.executed else _WOULD)[a]}"
        for a in Action
        if tally.count(a)
    )
    lines = [f"{tally.in_doubt} in doubt in ledger {printable(tally.ledger)}: {counts}."]
    if tally.count(Action.RESEND):
        lines.append(
            "Released claims are sent by the next `redrive move` (or `replay`) of their DLQ."
        )
    if tally.count(Action.LEAVE):
        lines.append(
            f"{tally.count(Action.LEAVE)} left to you: nothing redrive can read without harm "
            "proves whether they were sent. Check the worker's logs or the task's side "
            "effects, then name each with --resend ID (only if the task may run twice) or "
            "--skip ID (task id, message id or key)."
        )
    if not tally.executed and again is not None:
        lines += ["", f"nothing was changed (dry run); to do it, run:\n  {again}"]
    return "\n".join(lines) + _unmatched(tally)


def resolution_json(item: Resolution) -> str:
    """One message of ``ledger resolve --json``, as it stands in the whole document's
    ``messages`` list (indented, without the comma between two)."""
    text = json.dumps(item.to_json(), indent=2, ensure_ascii=False)
    # Split on newlines only: str.splitlines would also split inside a string value at
    # the separators JSON does not escape (U+2028, U+2029, ...).
    return "\n".join(MESSAGE_INDENT + line for line in text.split("\n"))


def resolve_json_around(tally: ResolveTally) -> tuple[str, str]:
    """``ledger resolve --json`` around its messages: the text before the first and after
    the last. ``before``, the messages (each :func:`resolution_json`, :data:`JSON_BETWEEN`
    between two) and ``after`` are, printed in turn, the very text of the whole document
    printed at once (the CLI's ``--json``: indented by two, not ASCII-escaped)."""
    empty = json.dumps({**tally.head_json(), "messages": []}, indent=2, ensure_ascii=False)
    if not tally.in_doubt:
        return empty, ""
    return empty.removesuffix("[]\n}") + "[\n", "\n  ]\n}"


def _unmatched(tally: ResolveTally) -> str:
    if not tally.unmatched:
        return ""
    return "\nnot in doubt (so nothing done with them): " + ", ".join(
        printable(i) for i in tally.unmatched
    )
