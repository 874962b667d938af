"""``status``: every family's queue and DLQ counts as a table."""

from __future__ import annotations

from collections.abc import Sequence

from redrive.durations import format_duration
from redrive.render.tables import Narrow, fitted_table
from redrive.reporting.status import FamilyStatus, QueueCounts

STATUS_STEPS = (
    Narrow("tight"),
    Narrow("headers"),
    Narrow("shrink", "queue", 16),
    Narrow("shrink", "dlq", 16),
    Narrow("shrink", "queue", 12),
    Narrow("shrink", "dlq", 12),
    Narrow("wrap", "error", 24),
    Narrow("drop", "dlq retention"),
    Narrow("shrink", "queue", 8),
    Narrow("shrink", "dlq", 8),
    Narrow("wrap", "error", 12),
)


def _counts(counts: QueueCounts) -> str:
    return f"{counts.visible} / {counts.in_flight} / {counts.delayed}"


def status_table(rows: Sequence[FamilyStatus], *, width: int | None = None) -> str:
    body = []
    for row in rows:
        if row.error:
            # The source's counts where it exists; a DLQ nobody found is said so, not "-".
            source = _counts(row.queue_counts) if row.queue_counts else "-"
            dlq = row.dlq or ("not found" if row.queue_counts else "-")
            body.append([row.family, row.queue or "-", source, dlq, "-", "-", row.error])
            continue
        q, d = row.queue_counts, row.dlq_counts
        assert q is not None and d is not None
        body.append(
            [
                row.family,
                row.queue or "-",
                _counts(q),
                row.dlq or "-",
                _counts(d),
                format_duration(row.dlq_retention_seconds or 0)
                if row.dlq_retention_seconds
                else "-",
                "",
            ]
        )
    headers = [
        "family",
        "queue",
        "visible / in flight / delayed",
        "dlq",
        "dlq visible / in flight / delayed",
        "dlq retention",
        "error",
    ]
    if not any(row.error for row in rows):
        # An always-empty column is noise (and width).
        headers.pop()
        body = [line[:-1] for line in body]
    return fitted_table(body, headers, width=width, steps=STATUS_STEPS)
