"""``report --post``: the report as a Slack-compatible incoming-webhook payload: a text (what a
notification shows) and one block per non-empty DLQ.

Task names come from message bodies that anyone who can enqueue may write. In Slack's text
``<!here>``, ``<!channel>``, ``<@U123>`` and ``<https://x|click>`` are mentions and links, so
``&``, ``<`` and ``>`` are escaped as Slack documents (``&amp;``, ``&lt;``, ``&gt;``), and a
task name is shown as code, where ``*bold*`` or a bare URL is not formatted either.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from redrive.durations import format_duration
from redrive.inspection.timeline import rebinned
from redrive.render.sparkline import group_label, sparkline
from redrive.render.tables import printable, shorten_task
from redrive.reporting.alerts import Change
from redrive.reporting.report import FamilyReport, Report

GROUPS_PER_BLOCK = 10
MOST_BLOCKS = 48  # Slack takes 50: the headline, 48 DLQs, and how many were left out
TASK_CHARS = 80
MARKS = 30


def slack_text(value: str) -> str:
    """Text from a message made inert in Slack's mrkdwn: no mention, no link, no control
    character."""
    return printable(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_code(value: str) -> str:
    """Inline code; a backtick in the value would end it early, so it becomes a look-alike."""
    return "`" + slack_text(value).replace("`", "\u02cb") + "`"


def _family_line(q: FamilyReport, now: float) -> str:
    head = f"*{slack_text(q.family)}* ({slack_code(q.dlq or '-')})"
    r = q.result
    if r is None:
        return f"{head}: could not be scanned: {slack_text(q.error or '?')}"
    age = f", oldest {format_duration(now - r.oldest)}" if r.oldest is not None else ""
    return (
        f"{head}: {r.total} message(s){age}, poison {r.poison}, expired {r.expired}, "
        f"leaving within 24h {r.leaving_within_24h}"
    )


def _family_block(q: FamilyReport, now: float) -> dict[str, Any]:
    lines = [_family_line(q, now)]
    groups = q.result.groups if q.result else []
    for g in groups[:GROUPS_PER_BLOCK]:
        marks = ""
        if g.timeline is not None:
            marks = " `" + sparkline(rebinned(g.timeline.counts, MARKS)[0]) + "`"
        lines.append(f"• {slack_code(shorten_task(group_label(g), TASK_CHARS))} {g.count}{marks}")
    if len(groups) > GROUPS_PER_BLOCK:
        lines.append(f"… and {len(groups) - GROUPS_PER_BLOCK} more task(s)")
    return {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)}}


def _change_line(c: Change) -> str:
    if c.previous_messages is None:
        return f"{slack_text(c.family)}: first report"
    new = ", ".join(slack_code(t) for t in list(c.new_tasks)[:5])
    if len(c.new_tasks) > 5:
        new += f" and {len(c.new_tasks) - 5} more"
    return f"{slack_text(c.family)}: {c.delta:+d}" + (f" (new: {new})" if new else "")


def slack_payload(report: Report, *, changes: Sequence[Change] | None = None) -> dict[str, Any]:
    now = report.generated_at
    generated = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M UTC")
    headline = f"DLQ report, {generated}: {report.total} message(s) in {len(report.queues)} DLQ(s)"
    summary = [headline, *(_family_line(q, now) for q in report.queues)]
    if changes:
        summary.append("since the last report: " + "; ".join(_change_line(c) for c in changes))
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": f"*{headline}*"}}
    ]
    shown = [q for q in report.queues if q.messages or q.error]
    blocks.extend(_family_block(q, now) for q in shown[:MOST_BLOCKS])
    if len(shown) > MOST_BLOCKS:
        left = f"… and {len(shown) - MOST_BLOCKS} more DLQ(s)"
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": left}})
    return {"text": "\n".join(summary), "blocks": blocks}
