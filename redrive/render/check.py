"""``check``: the layout's findings as a table."""

from __future__ import annotations

from collections.abc import Sequence

from redrive.render.tables import Narrow, fitted_table
from redrive.reporting.check import Finding

# A finding is a sentence that says what to fix: wrapped within its column, never cut.
FINDINGS_STEPS = (
    Narrow("tight"),
    Narrow("wrap", "finding", 30),
    Narrow("shrink", "queue", 20),
    Narrow("wrap", "finding", 16),
)


def findings_table(
    findings: Sequence[Finding], *, width: int | None = None, broker: str = "SQS"
) -> str:
    """``broker``: what people call the broker the layout was checked against."""
    if not findings:
        return f"no findings: the layout matches what {broker} says"
    return fitted_table(
        [[f.family or "-", f.queue, f.problem] for f in findings],
        ["family", "queue", "finding"],
        width=width,
        steps=FINDINGS_STEPS,
    )
