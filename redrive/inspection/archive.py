"""Inspect an archive offline: the grouped view of a live inspect, read from the records
purge and archive wrote."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from redrive.archive import ArchiveReader, DamageReport, archive_label, as_message
from redrive.inspection.groups import DEFAULT_MAX_REDRIVES
from redrive.inspection.scan import Focus, InspectResult, grouping_fields
from redrive.messages import decode


@dataclass(slots=True)
class ArchiveInspectResult(InspectResult):
    """An inspect of an archive: what read cleanly, and any damage that kept records out."""

    damaged: DamageReport | None = None

    def to_json(self) -> dict[str, Any]:
        # Explicit base: zero-argument super() fails in a slots dataclass.
        data = InspectResult.to_json(self)
        data["damaged"] = self.damaged.to_json() if self.damaged is not None else None
        return data


def inspect_archive(
    source: str,
    *,
    show_args: bool = False,
    limit: int | None = None,
    s3_client_factory: Callable[[], Any] | None = None,
    on_problem: Callable[[str], None] | None = None,
    now: float | None = None,
    focus: Focus | None = None,
) -> ArchiveInspectResult:
    """The grouped view of a live inspect, read offline from an archive (with the same
    --where and --group-by when ``focus`` has them).

    Damage does not stop it: the result counts what read cleanly and says what did not.
    """
    started = time.monotonic()
    now = time.time() if now is None else now
    focus = Focus.of(focus, show_args)
    grouping = focus.grouping(now, None, DEFAULT_MAX_REDRIVES)
    grouping.limit = limit
    dlqs: set[str] = set()
    partial = False
    reader = ArchiveReader(
        source, s3_client_factory=s3_client_factory, on_problem=on_problem, skip_damage=True
    )
    for record in reader:
        if grouping.full:
            partial = True
            break
        dlqs.add(record.dlq.rsplit("/", 1)[-1])
        # The receives the archive says were redrive's own (its attributes keep SQS's count).
        message = replace(as_message(record), redrive_receives=record.redrive_receives or 0)
        grouping.offer(message, decode(record.body))
    return ArchiveInspectResult(
        label=archive_label(source),
        dlq=", ".join(sorted(dlqs)) or "-",
        dlq_url=source,
        sources=[],
        **grouping_fields(grouping),
        **focus.describe(),
        scanned_at=now,
        seconds=time.monotonic() - started,
        depth_before=grouping.scanned,
        hidden_before=0,
        partial=partial,
        limit=limit,
        damaged=reader.report(),
    )
