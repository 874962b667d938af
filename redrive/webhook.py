"""Posting a report to an HTTP endpoint (a Slack-compatible incoming webhook, or any URL that
takes JSON): one POST, a bounded wait, and any failure raised as one line."""

from __future__ import annotations

import json
import shlex
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from redrive.errors import PostFailed

POST_TIMEOUT = 10.0
"""Seconds to wait for the endpoint: a scheduled report must not hang on a slow chat."""


def shown(url: str) -> str:
    """The URL as it may be printed: scheme and host only. A Slack webhook's path is its
    secret, and stderr goes to cron mail and CI logs."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(an unreadable URL)"
    host = parts.hostname or "?"
    return f"{parts.scheme}://{host}{port}/..." if parts.path.strip("/") else url


def as_given(url: str) -> str:
    """A URL that is not one, quoted as typed up to its host: what follows the first ``/``
    after it is left out, as :func:`shown` leaves a path out (a webhook given without its
    scheme still carries its secret there)."""
    scheme, sep, rest = url.partition("://")
    head, rest = (scheme + sep, rest) if sep else ("", url)
    host, slash, path = rest.partition("/")
    given = head + host + (slash + "..." if path.strip("/") else slash)
    # Quoted even when the shell would not need it: the value, not a word of the message.
    return f"'{given}'" if "'" not in given else shlex.quote(given)


def is_http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def post_json(url: str, payload: Mapping[str, Any], *, timeout: float = POST_TIMEOUT) -> int:
    """POST ``payload`` as JSON; the answer's status. Anything but a 2xx answer within
    ``timeout`` seconds raises PostFailed."""
    request = urllib.request.Request(
        url,
        data=json.dumps(payload, ensure_ascii=False).encode("utf-8"),
        headers={"Content-Type": "application/json; charset=utf-8", "User-Agent": "redrive"},
        method="POST",
    )
    where = shown(url)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            status = int(answer.status)
    except urllib.error.HTTPError as exc:
        raise PostFailed(
            f"cannot post the report to {where}: it answered {exc.code} {exc.reason}"
        ) from None
    except TimeoutError:
        raise PostFailed(
            f"cannot post the report to {where}: no answer within {timeout:g} s"
        ) from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            text = f"no answer within {timeout:g} s"
        else:
            text = getattr(reason, "strerror", None) or str(reason)
        raise PostFailed(f"cannot post the report to {where}: {text}") from None
    except OSError as exc:
        raise PostFailed(f"cannot post the report to {where}: {exc.strerror or exc}") from None
    if not 200 <= status < 300:
        raise PostFailed(f"cannot post the report to {where}: it answered {status}")
    return status
