"""Check: audit the configured families against what SQS says, for CI or a schedule.

Findings: a source queue without a RedrivePolicy, a DLQ not named ``QUEUE-dlq`` (unless the
config names it), a maxReceiveCount or DLQ retention other than expected (5 and 14 days,
unless the config says otherwise), and any queue with the layout's prefix that belongs to
no family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redrive.aws.sqs import Sqs, queue_name
from redrive.config import DLQ_SUFFIX, Layout
from redrive.dlq.queues import describe_queue, dlq_of
from redrive.durations import format_duration
from redrive.errors import AwsUnavailable, RedriveError


@dataclass(frozen=True, slots=True)
class Finding:
    family: str | None
    queue: str
    problem: str

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "queue": self.queue, "problem": self.problem}


def expected_dlq_name(queue: str) -> str:
    name = queue_name(queue)
    if name.endswith(".fifo"):
        return name.removesuffix(".fifo") + DLQ_SUFFIX + ".fifo"
    return name + DLQ_SUFFIX


def check_layout(layout: Layout, sqs_for: Callable[[str | None], Sqs]) -> list[Finding]:
    findings: list[Finding] = []
    known: set[str] = set()
    for family in layout.families:
        if family.dlq:
            # The config names this family's DLQ: never a stray, whatever else is wrong.
            known.add(queue_name(family.dlq))
        sqs = sqs_for(family.region)
        try:
            source = describe_queue(sqs, family.queue)
        except AwsUnavailable:
            raise
        except RedriveError as exc:
            findings.append(Finding(family.name, queue_name(family.queue), str(exc)))
            continue
        known.add(source.name)
        policy = source.redrive_policy
        if not policy:
            findings.append(Finding(family.name, source.name, "has no RedrivePolicy (no DLQ)"))
            continue
        try:
            dlq = dlq_of(sqs, source)
        except AwsUnavailable:
            raise
        except RedriveError as exc:
            findings.append(Finding(family.name, source.name, str(exc)))
            continue
        known.add(dlq.name)
        wanted = queue_name(family.dlq) if family.dlq else expected_dlq_name(source.name)
        if dlq.name != wanted:
            findings.append(
                Finding(
                    family.name,
                    source.name,
                    f"RedrivePolicy points to {dlq.name}, expected {wanted}",
                )
            )
        if source.max_receive_count != family.max_receive_count:
            findings.append(
                Finding(
                    family.name,
                    source.name,
                    f"maxReceiveCount is {source.max_receive_count}, "
                    f"expected {family.max_receive_count}",
                )
            )
        if dlq.retention_seconds != family.dlq_retention_seconds:
            findings.append(
                Finding(
                    family.name,
                    dlq.name,
                    "retention is "
                    f"{format_duration(dlq.retention_seconds or 0)}, expected "
                    f"{format_duration(family.dlq_retention_seconds)}",
                )
            )
    if layout.prefix:
        for url in sqs_for(None).list_queues(layout.prefix):
            name = queue_name(url)
            if name not in known:
                findings.append(
                    Finding(
                        None,
                        name,
                        f"has the layout's prefix '{layout.prefix}' but belongs to no family",
                    )
                )
    return findings
