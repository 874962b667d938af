"""RabbitMQ, one backend of the broker seam (:mod:`redrive.broker.base`): AMQP 0-9-1
through py-amqp (the client Celery installs) and the management API for what AMQP does not
tell (queue arguments, policies, bindings)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING

from redrive.broker.rabbitmq.api import ManagementApi
from redrive.broker.rabbitmq.broker import RabbitBroker
from redrive.broker.rabbitmq.link import AmqpAddress, link_for

if TYPE_CHECKING:
    from redrive.broker import BrokerSettings

__all__ = ["RabbitBroker", "default_api_url", "open_from_settings", "open_rabbitmq"]


def open_from_settings(
    settings: BrokerSettings, aws: object, region: str | None = None
) -> RabbitBroker:
    """RabbitMQ at the settings' URL (its row in :data:`redrive.broker.BACKENDS`): the AWS
    settings and region are SQS's, not its."""
    from redrive.broker import mask_password

    return open_rabbitmq(str(settings.url), api_url=settings.rabbitmq_api, mask=mask_password)


def default_api_url(url: str) -> str:
    """``http://HOST:15672``, HOST the broker URL's."""
    host = urllib.parse.urlsplit(url).hostname or "localhost"
    return f"http://{host}:15672"


def open_rabbitmq(
    url: str, *, api_url: str | None = None, mask: Callable[[str], str]
) -> RabbitBroker:
    """A broker on the URL's vhost (sharing the process's link to it); the management API
    at ``api_url`` (default :func:`default_api_url`, the broker URL's credentials unless
    the API URL has its own). ``mask`` makes a URL fit to print."""
    address = AmqpAddress.parse(url)
    api_at = api_url or default_api_url(url)
    api = ManagementApi(api_at, user=address.user, password=address.password, masked=mask(api_at))
    return RabbitBroker(link_for(url, mask(url)), api)
