"""Brokers behind one seam: :mod:`redrive.broker.base` is what every operation speaks;
each backend (:mod:`redrive.broker.sqs`, :mod:`redrive.broker.rabbitmq`,
:mod:`redrive.broker.memory`) implements it, and :data:`BACKENDS` (kombu's alias table as
the model) is the one place a URL's scheme picks one. Nothing above this package chooses a
backend by its name or class: what differs comes from the broker's
:class:`~redrive.broker.base.Capabilities` or from its row here."""

from __future__ import annotations

import importlib
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from redrive.broker.base import Broker, Delivery, DlqTarget, Headers
from redrive.config import SqsClient as SqsClient  # the name open_broker's callers give
from redrive.errors import UsageProblem

if TYPE_CHECKING:
    from redrive.aws.session import AwsSettings
    from redrive.config import Layout


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Everything a process needs to open the run's brokers besides the AWS settings: one
    opaque, picklable value that travels to ``--processes`` children as it is. Above this
    package nobody reads its parts: they are each backend's own options."""

    url: str | None = None
    """The broker's URL (None: SQS with the AWS settings)."""
    sqs_client: SqsClient = "botocore"
    """The client SQS's calls go through (``--sqs-client``)."""
    rabbitmq_api: str | None = None
    """RabbitMQ's management API (``--rabbitmq-api``)."""

    def open(self, aws: AwsSettings, region: str | None = None) -> Broker:
        """A broker with connections of its own (:func:`open_broker`)."""
        return backend_of(self.url).opener()(self, aws, region)

    @property
    def backend(self) -> str:
        return backend_of(self.url).name

    @property
    def aws_credentials(self) -> bool:
        """Whether the backend is called with the AWS settings' credentials (the audit's
        caller is then the AWS principal)."""
        return self.url is None or backend_of(self.url).aws_credentials

    def caller(self) -> dict[str, Any] | None:
        """Whom the broker knows the run as, where its URL says (the audit's *who*); None:
        the backend's credentials are AWS's (the caller is the AWS principal)."""
        if self.url is None or self.aws_credentials:
            return None
        user = urllib.parse.urlsplit(self.url).username
        return {
            "broker": mask_password(self.url),
            "broker_user": urllib.parse.unquote(user or "guest"),
        }


Opener = Callable[[BrokerSettings, "AwsSettings", "str | None"], Broker]


@dataclass(frozen=True, slots=True)
class Backend:
    """One row of the scheme table."""

    name: str
    schemes: tuple[str, ...]
    opens: str
    """``module:function`` that opens it (imported on first use: an SQS command never
    loads py-amqp)."""
    spoken: str = ""
    """How a usage error names it and its schemes ("": tests only, never offered)."""
    celery_url: bool = False
    """A Celery app's ``broker_url`` of this backend is the broker redrive talks to (SQS's
    is not: its queues are named by the AWS settings, as before there was a choice)."""
    aws_credentials: bool = False
    """It is called with the AWS settings' credentials (the audit's caller is AWS's)."""
    restores: str = ""
    """The module whose ``restored_delivery`` rebuilds an archived delivery's metadata from
    the facts the backend archives (its ``ARCHIVED_ATTRIBUTES``), when a record holds any of
    them ("": it archives none that say anything of the metadata)."""

    def opener(self) -> Opener:
        return _imported(self.opens)  # type: ignore[no-any-return]

    def restorer(self) -> Restorer | None:
        """The backend's ``restored_delivery`` for a record holding one of its archived facts
        (None for any other record)."""
        if not self.restores:
            return None
        names = _imported(f"{self.restores}:ARCHIVED_ATTRIBUTES")
        restore = _imported(f"{self.restores}:restored_delivery")

        def restored_if_ours(
            message_id: str, body: str, attributes: Mapping[str, str], headers: Headers
        ) -> Delivery | None:
            if not any(name in attributes for name in names):
                return None
            return restore(message_id, body, attributes, headers)  # type: ignore[no-any-return]

        return restored_if_ours


def _imported(path: str) -> Any:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


Restorer = Callable[[str, str, Mapping[str, str], Headers], "Delivery | None"]


#: Every backend, by the URL schemes that name it; a URL without one is SQS's.
BACKENDS: Final = (
    Backend(
        "sqs",
        ("sqs", "https+sqs"),
        "redrive.broker.sqs:open_from_settings",
        spoken="SQS (sqs://, or none)",
        aws_credentials=True,
        restores="redrive.broker.sqs.calls",
    ),
    Backend(
        "rabbitmq",
        ("amqp", "amqps", "pyamqp"),
        "redrive.broker.rabbitmq:open_from_settings",
        spoken="RabbitMQ (amqp://, amqps://, pyamqp://)",
        celery_url=True,
    ),
    # Tests only: queues in this process (redrive/broker/memory), never persistent.
    Backend(
        "memory",
        ("memory",),
        "redrive.broker.memory:open_from_settings",
        restores="redrive.broker.memory.broker",
    ),
)
_BY_SCHEME: Final = {scheme: row for row in BACKENDS for scheme in row.schemes}
#: URL schemes of each backend (kept by name for their callers).
SQS_SCHEMES = BACKENDS[0].schemes
RABBITMQ_SCHEMES = BACKENDS[1].schemes


def backend_of(url: str | None) -> Backend:
    """The backend a broker URL names (None: SQS); a URL no backend takes is a usage error."""
    scheme = (url or "sqs://").partition("://")[0].lower()
    row = _BY_SCHEME.get(scheme)
    if row is None:
        offered = " and ".join(b.spoken for b in BACKENDS if b.spoken)
        raise UsageProblem(f"broker URL {mask_password(url or '')!r}: redrive speaks {offered}")
    return row


def broker_scheme(url: str | None) -> str:
    """Which backend a broker URL names (its name in :data:`BACKENDS`)."""
    return backend_of(url).name


def celery_broker_url(url: str) -> str | None:
    """A Celery app's ``broker_url`` as the broker to talk to, when its backend is one
    redrive reaches by URL (None: not one, or SQS's, named by the AWS settings instead)."""
    row = _BY_SCHEME.get(url.partition("://")[0].lower())
    return url if row is not None and row.celery_url else None


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
    settings = BrokerSettings(url=url, sqs_client=sqs_client, rabbitmq_api=rabbitmq_api)
    return settings.open(aws, region)


def restored_delivery(
    message_id: str, body: str, attributes: Mapping[str, str], headers: Headers
) -> Delivery:
    """A delivery rebuilt from an archive record with no broker at hand (inspecting an
    archive): the backend whose facts the record kept rebuilds its metadata (an SQS
    archive's receive count and sent time); facts none of them reads, or none, give the
    body, headers and facts alone."""
    for row in BACKENDS:
        restorer = row.restorer()
        found = restorer(message_id, body, attributes, headers) if restorer else None
        if found is not None:
            return found
    return Delivery(message_id, "", body, dict(attributes), dict(headers))


def resolve_target(
    layout: Layout, target: str, broker_for: Callable[[str | None], Broker]
) -> DlqTarget:
    """A TARGET (family, source queue or DLQ) as a DLQ and its sources, on the default
    region's broker (a family of another region on its own)."""
    family = layout.family(target)
    if family is not None:
        return broker_for(family.region).resolve_family(family)
    return broker_for(None).resolve(layout, target, broker_for)
