"""``--processes N``: what the CLI hands the core's orchestration
(redrive.operations.processes), and the lines it adds to a run's text."""

from __future__ import annotations

from typing import Any

from redrive.cli.context import Context
from redrive.dlq.queues import DlqTarget
from redrive.ledger import Ledger
from redrive.operations.processes import ProcessesResult, Wiring


def child_wiring(ctx: Context, dlq: DlqTarget, ledger: Ledger | None) -> Wiring:
    """What each process of ``--processes`` builds its own adapters from."""
    return Wiring.of(
        ctx.aws,
        region=dlq.family.region if dlq.family is not None else None,
        ledger=ledger.location if ledger is not None else None,
        receive_log=not ctx.receive_log().problem,
    )


def processes_text(outcome: Any, text: str) -> str:
    """A run's text, and for ``--processes`` how many ran and any that died."""
    if not isinstance(outcome, ProcessesResult):
        return text
    lines = [text, "", f"processes: {outcome.processes}"]
    if outcome.archives:
        lines.append("archives (one per process; replay each):")
        lines.extend(f"  {where}" for where in outcome.archives)
    for child in outcome.children:
        if child.outcome != "completed":
            lines.append(f"  {child.describe()}")
    if any(c.claims for c in outcome.died):
        lines.append(
            "a process died: what it claimed and did not confirm is in doubt (above); rerun "
            "to finish the rest"
        )
    elif outcome.died:
        lines.append("a process died: rerun to finish the rest")
    return "\n".join(lines)
