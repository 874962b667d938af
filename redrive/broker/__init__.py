"""Brokers behind one seam: :mod:`redrive.broker.base` is what every operation speaks;
each backend (:mod:`redrive.broker.sqs`) implements it."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from redrive.broker.base import Broker, Delivery, DlqTarget
from redrive.config import SqsClient as SqsClient  # the name open_broker's callers give
from redrive.errors import UsageProblem

if TYPE_CHECKING:
    from redrive.aws.session import AwsSettings
    from redrive.config import Layout

#: URL schemes of each backend (none: SQS, as before there was a choice).
SQS_SCHEMES = ("sqs", "https+sqs")
#: Celery's broker_url forms for RabbitMQ.
RABBITMQ_SCHEMES = ("amqp", "amqps", "pyamqp")


def broker_scheme(url: str | None) -> str:
    """Which backend a broker URL names; a URL no backend takes is a usage error."""
    scheme = (url or "sqs://").partition("://")[0].lower()
    if scheme in SQS_SCHEMES:
        return "sqs"
    if scheme in RABBITMQ_SCHEMES:
        return "rabbitmq"
    raise UsageProblem(
        f"broker URL {mask_password(url or '')!r}: redrive speaks SQS (sqs://, or none) and "
        "RabbitMQ (amqp://, amqps://, pyamqp://)"
    )


def mask_password(url: str) -> str:
    """A URL fit to print: its password, if any, as ``***`` (in its user part, and in a
    ``password=`` of its query, as libpq's URLs may carry one)."""
    if "://" in url:
        url = _QUERY_PASSWORD.sub(r"\1***", url)
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.partition(':')[0]}:***@{host}"


_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)


def open_broker(
    url: str | None,
    *,
    aws: AwsSettings,
    region: str | None = None,
    sqs_client: SqsClient = "botocore",
    rabbitmq_api: str | None = None,
) -> Broker:
    """The broker a URL names (None: SQS), with connections of its own; SQS's calls go
    through ``sqs_client`` (``--sqs-client``). RabbitMQ's brokers of one URL share one
    connection per process (its delivery tags belong to a channel); ``rabbitmq_api`` is its
    management API (default ``http://HOST:15672`` with the URL's credentials)."""
    if url is not None and broker_scheme(url) == "rabbitmq":
        from redrive.broker.rabbitmq import open_rabbitmq

        return open_rabbitmq(url, api_url=rabbitmq_api, mask=mask_password)
    broker_scheme(url)
    from redrive.broker.sqs import open_sqs

    return open_sqs(aws, region=region, client=sqs_client)


def restored_delivery(
    message_id: str,
    body: str,
    attributes: Mapping[str, str],
    message_attributes: Mapping[str, Mapping[str, Any]],
) -> Delivery:
    """A delivery rebuilt from an archive record with no broker at hand (inspecting an
    archive): archives of format 1 hold what SQS kept of each message."""
    from redrive.broker.sqs.calls import restored_delivery as from_sqs

    return from_sqs(message_id, body, attributes, message_attributes)


def resolve_target(
    layout: Layout, target: str, broker_for: Callable[[str | None], Broker]
) -> DlqTarget:
    """A TARGET (family, source queue or DLQ) as a DLQ and its sources, on the default
    region's broker (a family of another region on its own)."""
    family = layout.family(target)
    if family is not None:
        return broker_for(family.region).resolve_family(family)
    return broker_for(None).resolve(layout, target, broker_for)
