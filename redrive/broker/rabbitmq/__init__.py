"""RabbitMQ, one backend of the broker seam (:mod:`redrive.broker.base`): AMQP 0-9-1
through py-amqp (the client Celery installs) and the management API for what AMQP does not
tell (queue arguments, policies, bindings)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable

from redrive.broker.rabbitmq.api import ManagementApi
from redrive.broker.rabbitmq.broker import RabbitBroker
from redrive.broker.rabbitmq.link import AmqpAddress, link_for

__all__ = ["RabbitBroker", "default_api_url", "open_rabbitmq"]


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
