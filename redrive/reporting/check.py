"""Check: audit the configured families against what the broker says, for CI or a schedule.

Findings: a source queue without a link to a DLQ, a DLQ not named ``QUEUE-dlq`` (unless
the config names it), a receive limit or DLQ retention other than expected (5 and 14 days,
unless the config says otherwise), and any queue with the layout's prefix that belongs to
no family. With ``--celery``, the app's settings too (:mod:`redrive.celery.settings_audit`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redrive.broker.base import Broker, Capabilities, QueueRef, queue_name
from redrive.celery.routes import AppRoutes
from redrive.celery.settings_audit import audit_app
from redrive.config import DLQ_SUFFIX, Family, Layout
from redrive.durations import format_duration
from redrive.errors import BrokerUnavailable, RedriveError


@dataclass(frozen=True, slots=True)
class Finding:
    family: str | None
    queue: str
    problem: str
    setting: str | None = None
    """A Celery setting (``check --celery``), and its value."""
    value: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = {"family": self.family, "queue": self.queue, "problem": self.problem}
        if self.setting is not None:
            data.update(setting=self.setting, value=self.value)
        return data


def expected_dlq_name(queue: str) -> str:
    name = queue_name(queue)
    if name.endswith(".fifo"):
        return name.removesuffix(".fifo") + DLQ_SUFFIX + ".fifo"
    return name + DLQ_SUFFIX


def check_layout(layout: Layout, broker_for: Callable[[str | None], Broker]) -> list[Finding]:
    findings: list[Finding] = []
    known: set[str] = set()
    for family in layout.families:
        if family.dlq:
            # The config names this family's DLQ: never a stray, whatever else is wrong.
            known.add(queue_name(family.dlq))
        findings += _check_family(family, broker_for(family.region), known)
    if layout.prefix:
        for url in broker_for(None).queues_named(layout.prefix):
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


def _check_family(family: Family, broker: Broker, known: set[str]) -> list[Finding]:
    """One family's findings; adds the queues it finds to ``known``."""
    try:
        source = broker.describe(family.queue)
    except BrokerUnavailable:
        raise
    except RedriveError as exc:
        return [Finding(family.name, queue_name(family.queue), str(exc))]
    known.add(source.name)
    words = broker.capabilities
    # "": it dead-letters, but not to one queue (none: its dead messages vanish; dlq_of says).
    if source.dead_letter_target is None:
        return [Finding(family.name, source.name, f"has no {words.dead_letter_setting} (no DLQ)")]
    try:
        dlq = broker.dlq_of(source)
    except BrokerUnavailable:
        raise
    except RedriveError as exc:
        return [Finding(family.name, source.name, str(exc))]
    known.add(dlq.name)
    findings = []
    wanted = queue_name(family.dlq) if family.dlq else expected_dlq_name(source.name)
    if dlq.name != wanted:
        findings.append(
            Finding(
                family.name,
                source.name,
                f"{words.dead_letter_setting} points to {dlq.name}, expected {wanted}",
            )
        )
    findings += _limit_findings(family, source, dlq, words)
    # None: the broker keeps a message until it is consumed (RabbitMQ without a TTL).
    if dlq.retention_seconds is not None and dlq.retention_seconds != family.dlq_retention_seconds:
        findings.append(
            Finding(
                family.name,
                dlq.name,
                f"retention is {format_duration(dlq.retention_seconds or 0)}, expected "
                f"{format_duration(family.dlq_retention_seconds)}",
            )
        )
    return findings


def _limit_findings(
    family: Family, source: QueueRef, dlq: QueueRef, words: Capabilities
) -> list[Finding]:
    """The source's receive limit against the family's, and a DLQ with a limit of its own."""
    findings = []
    # A broker that counts deliveries only on some queues (RabbitMQ: quorum queues with a
    # limit) has no limit to compare where none is set: failures dead-letter on rejection.
    optional = not words.receive_count and source.max_receive_count is None
    if source.max_receive_count != family.max_receive_count and not optional:
        findings.append(
            Finding(
                family.name,
                source.name,
                f"{words.receive_limit_setting} is {source.max_receive_count}"
                f"{source.receive_limit_origin}, "
                f"expected {family.max_receive_count}",
            )
        )
    if dlq.max_receive_count is not None:
        findings.append(
            Finding(
                family.name,
                dlq.name,
                f"the DLQ has {words.receive_limit_setting} {dlq.max_receive_count}"
                f"{dlq.receive_limit_origin or ' of its own'}: every read (inspect, report, "
                "dry run, a move's) counts toward it and past "
                "it the broker drops or dead-letters the message; redrive refuses to read it "
                "without --allow-delivery-limit. Remove the limit from the DLQ",
            )
        )
    return findings


def check_celery(
    app: Any, spec: str, routes: AppRoutes, layout: Layout, *, declared_by_workers: bool = False
) -> list[Finding]:
    """``check --celery``: the app's settings findings (redrive.celery.settings_audit);
    ``declared_by_workers``: the broker's (Capabilities.declared_by_consumers)."""
    return [
        Finding(None, f"app {spec}", f"{f.setting} = {f.value}: {f.problem}", f.setting, f.value)
        for f in audit_app(
            app, routes, layout, family_dlqs(layout), declared_by_workers=declared_by_workers
        )
    ]


def family_dlqs(layout: Layout) -> dict[str, str]:
    """Each family's DLQ name (the config's, else the expected ``QUEUE-dlq``) -> family."""
    return {
        queue_name(f.dlq) if f.dlq else expected_dlq_name(f.queue): f.name for f in layout.families
    }
