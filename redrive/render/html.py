"""``report --format html``: one self-contained page. Inline CSS and SVG only: no script, no
font, no image or style sheet to fetch (a Content-Security-Policy that allows none says so
to the browser too). Readable on a phone, light or dark as the reader's system is.

Everything that comes from a message (task names, sample arguments) and from SQS or the
config (queue and family names, errors) is escaped: a task name cannot inject markup.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import UTC, datetime

from redrive.celery.results import WORKER_DIED, ResultCounts
from redrive.durations import format_duration
from redrive.inspection.groups import TaskGroup
from redrive.inspection.timeline import Timeline
from redrive.render.inspect import exceptions_cell
from redrive.render.report import coverage_cell, interrupted_note
from redrive.render.sparkline import group_label
from redrive.render.tables import printable
from redrive.reporting.alerts import Change
from redrive.reporting.report import FamilyReport, Report

CHART_HEIGHT = 40
BAR_PITCH = 10  # viewBox units per bucket; a bar takes 8 of them

STYLE = """
:root { color-scheme: light dark; --bg: #fff; --fg: #1c1e21; --muted: #606770;
  --card: #f5f6f7; --bar: #2d6cdf; --bad: #c0392b; --line: #dadde1; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #18191a; --fg: #e4e6eb; --muted: #b0b3b8; --card: #242526;
    --bar: #6ea8fe; --bad: #ff7b72; --line: #3a3b3c; } }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 60rem; padding: 1rem; background: var(--bg);
  color: var(--fg); font: 16px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; }
h1 { font-size: 1.4rem; margin: 0 0 .25rem; } h2 { font-size: 1.15rem; margin: 0 0 .5rem; }
.muted, .span { color: var(--muted); font-size: .85rem; }
.family { background: var(--card); border-radius: .5rem; padding: 1rem; margin: 1rem 0; }
.figures { display: grid; grid-template-columns: repeat(auto-fit, minmax(7.5rem, 1fr));
  gap: .5rem; margin: 0 0 .75rem; }
.figures div { border: 1px solid var(--line); border-radius: .4rem; padding: .35rem .5rem; }
.figures dt { color: var(--muted); font-size: .8rem; } .figures dd { margin: 0;
  font-size: 1.2rem; font-weight: 600; }
.error { color: var(--bad); }
.why { margin: .3rem 0 0; font-size: .9rem; overflow-wrap: anywhere; }
.why dt { display: inline; color: var(--muted); }
.why dd { display: inline; margin: 0; }
.why div + div { margin-top: .15rem; }
.died { color: var(--bad); font-weight: 600; }
.interrupted { border: 2px solid var(--bad); border-radius: .4rem; padding: .5rem .75rem; }
.group { border-top: 1px solid var(--line); padding: .5rem 0; }
.group-head { display: flex; justify-content: space-between; gap: .5rem; }
.task { overflow-wrap: anywhere; font-family: ui-monospace, Menlo, Consolas, monospace; }
.count { font-weight: 600; white-space: nowrap; }
svg.timeline { display: block; width: 100%; height: 3rem; color: var(--bar); }
pre { white-space: pre-wrap; overflow-wrap: anywhere; font-size: .85rem; }
"""


def esc(value: object) -> str:
    """Any value as inert HTML text (quotes too, so it is safe in an attribute)."""
    return html.escape(printable(str(value)), quote=True)


def _stamp(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%MZ")


def timeline_svg(timeline: Timeline | None, label: str) -> str:
    """A bar per bucket, scaled to the group's own peak; an empty chart without times."""
    if timeline is None or not timeline.counts:
        return (
            f'<svg class="timeline" viewBox="0 0 100 {CHART_HEIGHT}" role="img" '
            f'aria-label="{esc(label)}: no enqueue time"></svg>'
        )
    peak = max(timeline.counts) or 1
    bars = []
    for i, count in enumerate(timeline.counts):
        if count <= 0:
            continue
        height = max(2.0, CHART_HEIGHT * count / peak)
        start = timeline.start + i * timeline.bucket_seconds
        bars.append(
            f'<rect x="{i * BAR_PITCH}" y="{CHART_HEIGHT - height:.1f}" width="8" '
            f'height="{height:.1f}" fill="currentColor"><title>{_stamp(start)}: {count}'
            "</title></rect>"
        )
    width = len(timeline.counts) * BAR_PITCH
    # The baseline shows where the span starts and ends when the first or last bars are 0.
    base = (
        f'<line x1="0" y1="{CHART_HEIGHT - 0.5}" x2="{width}" y2="{CHART_HEIGHT - 0.5}" '
        'stroke="currentColor" stroke-opacity=".35" vector-effect="non-scaling-stroke"/>'
    )
    return (
        f'<svg class="timeline" viewBox="0 0 {width} {CHART_HEIGHT}" preserveAspectRatio="none" '
        f'role="img" aria-label="{esc(label)}: when enqueued">{base}{"".join(bars)}</svg>'
    )


def _states_html(counts: ResultCounts) -> str:
    """``FAILURE 8, STARTED 3`` and, said apart where it stands out, how many times the
    worker died while running the task (as the table's ``states`` cell says it)."""
    states = ", ".join(f"{state} {n}" for state, n in counts.states.most_common())
    died = (
        f'<span class="died">{counts.worker_died}: {esc(WORKER_DIED)}</span>'
        if counts.worker_died
        else ""
    )
    if not (states or died):
        return "-"
    return esc(states) + ("; " if states and died else "") + died


def _why_html(group: TaskGroup, backend: bool) -> str:
    """The result backend's states and exceptions of a group (``backend``: the scan read
    one: a group it said nothing of shows ``-``, as the table's cells do)."""
    if not backend:
        return ""
    counts = group.results
    states = _states_html(counts) if counts else "-"
    exceptions = esc(exceptions_cell(counts)) if counts else "-"
    samples = ""
    if counts and counts.samples:
        shown = "\n".join(f"{name}: {sample}" for name, sample in counts.samples.items())
        samples = f"<details><summary>exception samples</summary><pre>{esc(shown)}</pre></details>"
    return (
        f'<dl class="why"><div><dt>states:</dt> <dd>{states}</dd></div>'
        f'<div><dt>exceptions:</dt> <dd class="task">{exceptions}</dd></div></dl>{samples}'
    )


def _group_html(group: TaskGroup, now: float, backend: bool) -> str:
    samples = ""
    if group.sample_args:
        shown = "\n".join(
            f"body: {sample['body']}"
            if "body" in sample
            else f"args={sample['args']} kwargs={sample['kwargs']}"
            for sample in group.sample_args
        )
        samples = f"<details><summary>sample arguments</summary><pre>{esc(shown)}</pre></details>"
    label = group_label(group)
    oldest = f"oldest {format_duration(now - group.oldest)} ago · " if group.oldest else ""
    return (
        f'<div class="group"><div class="group-head"><span class="task">{esc(label)}</span>'
        f'<span class="count">{group.count}</span></div>'
        f'<div class="muted">{oldest}poison {group.poison} · expired {group.expired} · '
        f"leaving within 24h {group.leaving_within_24h}</div>"
        f"{_why_html(group, backend)}{timeline_svg(group.timeline, label)}{samples}</div>"
    )


def _family_html(q: FamilyReport, now: float, change: Change | None) -> str:
    parts = [
        f'<section class="family"><h2>{esc(q.family)} '
        f'<span class="muted">{esc(q.dlq or "-")}</span></h2>'
    ]
    r = q.result
    if q.skipped:
        parts.append('<p class="error">not scanned: the report was interrupted first</p>')
        return "".join(parts) + "</section>"
    if r is None:
        parts.append(f'<p class="error">could not be scanned: {esc(q.error or "?")}</p>')
        return "".join(parts) + "</section>"
    if q.coverage == "partial":
        parts.append(
            f'<p class="error">scanned in part ({esc(coverage_cell(q))} scanned): the report '
            "was interrupted; the figures are of what was scanned</p>"
        )
    figures = [
        ("messages", r.total),
        ("oldest age", format_duration(now - r.oldest) if r.oldest is not None else "-"),
        ("poison", r.poison),
        ("expired", r.expired),
        ("leaving within 24h", r.leaving_within_24h),
    ]
    if change is not None:
        figures.append(("since the last report", _delta(change)))
    parts.append('<dl class="figures">')
    parts.extend(f"<div><dt>{name}</dt><dd>{esc(value)}</dd></div>" for name, value in figures)
    parts.append("</dl>")
    if change is not None and (change.new_tasks or change.grown_tasks):
        new = ", ".join(f"{t} ({n})" for t, n in change.new_tasks.items()) or "-"
        grown = ", ".join(f"{t} (+{n})" for t, n in change.grown_tasks.items()) or "-"
        parts.append(f'<p class="muted">new tasks: {esc(new)}; grown: {esc(grown)}</p>')
    spans = [g.timeline for g in r.groups if g.timeline is not None]
    if spans:
        parts.append(
            f'<p class="span">enqueued {_stamp(spans[0].start)} to {_stamp(spans[0].end)}, '
            f"one bar: {format_duration(spans[0].bucket_seconds)}</p>"
        )
    backend = r.result_backend is not None
    if r.result_backend_problem:
        parts.append(
            f'<p class="error">{esc(r.result_backend_problem)}; states and exceptions left out</p>'
        )
        backend = False
    parts.extend(_group_html(g, now, backend) for g in r.groups)
    if not r.groups:
        parts.append('<p class="muted">empty</p>')
    return "".join(parts) + "</section>"


def _delta(change: Change) -> str:
    if change.delta is None:
        return "first report"
    return f"{change.delta:+d}" if change.delta else "unchanged"


def report_html(report: Report, *, changes: Sequence[Change] | None = None) -> str:
    now = report.generated_at
    title = f"DLQ report, {_stamp(now)}"
    body = [
        f'<header><h1>{title}</h1><p class="muted">{report.total} message(s) in '
        f"{len(report.queues)} DLQ(s), layout {esc(report.layout)}</p>"
        + (
            f'<p class="error interrupted">{esc(interrupted_note(report))}</p>'
            if report.interrupted
            else ""
        )
        + "</header>"
    ]
    by_family = {c.family: c for c in changes or ()}
    body.extend(_family_html(q, now, by_family.get(q.family)) for q in report.queues)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; style-src 'unsafe-inline'\">"
        f"<title>{title}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )
