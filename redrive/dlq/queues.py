"""Turning a TARGET (family name, queue name or queue URL) into a DLQ and its source queues."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from redrive.aws.sqs import Sqs, queue_name
from redrive.config import Family, Layout
from redrive.errors import NoDeadLetterQueue, QueueNotFound

# Counts SQS keeps per queue; GetQueueAttributes with these names is instant at any depth.
COUNT_ATTRIBUTES = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)


@dataclass(frozen=True, slots=True)
class QueueRef:
    url: str
    name: str
    arn: str
    fifo: bool
    redrive_policy: dict[str, object] | None = None
    retention_seconds: int | None = None

    @property
    def max_receive_count(self) -> int | None:
        value = (self.redrive_policy or {}).get("maxReceiveCount")
        try:
            return int(str(value)) if value is not None else None
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class DlqTarget:
    """A DLQ to work on and the queue(s) that dead-letter into it."""

    label: str
    """The family name, or the DLQ's name when the target was a queue."""
    family: Family | None
    dlq: QueueRef
    sources: tuple[QueueRef, ...]

    def source_for_arn(self, arn: str) -> QueueRef | None:
        for source in self.sources:
            if source.arn == arn:
                return source
        return None

    @property
    def single_source(self) -> QueueRef | None:
        return self.sources[0] if len(self.sources) == 1 else None

    @property
    def region(self) -> str | None:
        """The DLQ's own region (a family may name one); None: the default."""
        return self.family.region if self.family is not None else None


def describe_queue(sqs: Sqs, name_or_url: str) -> QueueRef:
    url = sqs.queue_url(name_or_url)
    attrs = sqs.attributes(url, ["QueueArn", "RedrivePolicy", "MessageRetentionPeriod"])
    policy: dict[str, object] | None = None
    if attrs.get("RedrivePolicy"):
        try:
            loaded = json.loads(attrs["RedrivePolicy"])
            policy = loaded if isinstance(loaded, dict) else None
        except ValueError:
            policy = None
    retention = attrs.get("MessageRetentionPeriod")
    name = queue_name(url)
    return QueueRef(
        url=url,
        name=name,
        arn=attrs.get("QueueArn", ""),
        fifo=name.endswith(".fifo"),
        redrive_policy=policy,
        retention_seconds=int(retention) if retention and retention.isdigit() else None,
    )


def dlq_of(sqs: Sqs, source: QueueRef) -> QueueRef:
    """The DLQ named by a source queue's RedrivePolicy."""
    arn = str((source.redrive_policy or {}).get("deadLetterTargetArn") or "")
    if not arn:
        raise NoDeadLetterQueue(
            f"queue {source.name} has no RedrivePolicy, so it has no DLQ: name the DLQ "
            "itself, or set `dlq` for its family in the config file"
        )
    parts = arn.split(":")
    owner = parts[4] if len(parts) >= 6 and parts[4].isdigit() else None
    try:
        url = sqs.queue_url(parts[-1], owner=owner)
    except QueueNotFound:
        raise QueueNotFound(
            f"queue {source.name}'s RedrivePolicy names DLQ {arn}, which does not exist: "
            "recreate it or fix the RedrivePolicy"
        ) from None
    return describe_queue(sqs, url)


def resolve_family(sqs: Sqs, family: Family) -> DlqTarget:
    try:
        source = describe_queue(sqs, family.queue)
    except QueueNotFound:
        raise QueueNotFound(
            f"family {family.name}: queue {family.queue} does not exist: check the name, "
            "--region and the account, or the layout (config file or CELERY_*_QUEUE)"
        ) from None
    if family.dlq:
        try:
            dlq = describe_queue(sqs, family.dlq)
        except QueueNotFound:
            raise QueueNotFound(
                f"family {family.name}: DLQ {family.dlq} does not exist: fix `dlq` in the config"
            ) from None
    else:
        dlq = dlq_of(sqs, source)
    return DlqTarget(label=family.name, family=family, dlq=dlq, sources=(source,))


def resolve_target(layout: Layout, target: str, sqs_for: Callable[[str | None], Sqs]) -> DlqTarget:
    """A family name, a source queue (stands for its DLQ) or a DLQ, by name or URL.

    ``sqs_for(region)`` gives the adapter for a family's region (``None``: the default).
    """
    family = layout.family(target)
    if family is not None:
        return resolve_family(sqs_for(family.region), family)
    sqs = sqs_for(None)
    try:
        queue = describe_queue(sqs, target)
    except QueueNotFound:
        known = ", ".join(f.name for f in layout.families)
        raise QueueNotFound(
            f"'{target}' is neither a family ({known}) nor an existing queue: check the "
            "name, --region and --config"
        ) from None
    # A family's source queue, or the DLQ its config names: use the family, so output is
    # labelled and an explicit `dlq` holds where no RedrivePolicy links the two.
    for fam in layout.families:
        names = {queue_name(fam.queue), *([queue_name(fam.dlq)] if fam.dlq else [])}
        if queue.name in names and fam.region is None:
            return resolve_family(sqs, fam)
    if queue.redrive_policy:
        return DlqTarget(label=queue.name, family=None, dlq=dlq_of(sqs, queue), sources=(queue,))
    source_urls = sqs.dead_letter_sources(queue.url)
    if not source_urls:
        raise NoDeadLetterQueue(
            f"queue {queue.name} has no RedrivePolicy and no queue dead-letters into it: "
            "it has no DLQ and is no DLQ"
        )
    sources = tuple(describe_queue(sqs, url) for url in sorted(source_urls))
    owner = next((f for f in layout.families if f.dlq and queue_name(f.dlq) == queue.name), None)
    if owner is None:
        owner = next(
            (f for f in layout.families for s in sources if queue_name(f.queue) == s.name), None
        )
    label = owner.name if owner is not None and len(sources) == 1 else queue.name
    return DlqTarget(label=label, family=owner, dlq=queue, sources=sources)
