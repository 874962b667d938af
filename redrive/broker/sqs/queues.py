"""SQS's side of turning a TARGET (family name, queue name, URL or ARN) into a DLQ and its
source queues: a source names its DLQ in its RedrivePolicy; a DLQ lists its sources."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from redrive.broker.base import DlqTarget, QueueRef, queue_name
from redrive.broker.sqs.calls import SqsCalls
from redrive.errors import NoDeadLetterQueue, QueueNotFound

if TYPE_CHECKING:
    from redrive.broker.base import Broker
    from redrive.config import Family, Layout


def describe_queue(sqs: SqsCalls, name_or_url: str) -> QueueRef:
    """A queue by name, URL or ARN (an ARN names its owner's account)."""
    owner = None
    if name_or_url.startswith("arn:"):
        parts = name_or_url.split(":")
        owner = parts[4] if len(parts) >= 6 and parts[4].isdigit() else None
        name_or_url = parts[-1]
    url = sqs.queue_url(name_or_url, owner=owner)
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
    target = str((policy or {}).get("deadLetterTargetArn") or "") if policy else ""
    return QueueRef(
        url=url,
        name=name,
        ident=attrs.get("QueueArn", ""),
        fifo=name.endswith(".fifo"),
        # A RedrivePolicy without a target still says the queue was meant to have a DLQ.
        dead_letter_target=target or ("" if policy else None),
        max_receive_count=_max_receive_count(policy),
        retention_seconds=int(retention) if retention and retention.isdigit() else None,
    )


def _max_receive_count(policy: dict[str, object] | None) -> int | None:
    value = (policy or {}).get("maxReceiveCount")
    try:
        return int(str(value)) if value is not None else None
    except ValueError:
        return None


def dlq_of(sqs: SqsCalls, source: QueueRef) -> QueueRef:
    """The DLQ named by a source queue's RedrivePolicy."""
    arn = source.dead_letter_target or ""
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


def resolve_family(sqs: SqsCalls, family: Family) -> DlqTarget:
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


def resolve_target(
    layout: Layout, target: str, broker_for: Callable[[str | None], Broker], *, default: SqsCalls
) -> DlqTarget:
    """A family name, a source queue (stands for its DLQ) or a DLQ, by name or URL.

    ``broker_for(region)`` gives the broker of a family's region; ``default`` is the
    default region's.
    """
    family = layout.family(target)
    if family is not None:
        if family.region is None:
            return resolve_family(default, family)
        return broker_for(family.region).resolve_family(family)
    sqs = default
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
    if queue.dead_letter_target is not None:
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
