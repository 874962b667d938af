"""RabbitMQ's management API (HTTP, stdlib urllib): queue arguments, effective policies,
exchanges and their bindings, which AMQP itself does not tell."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Final

from redrive.errors import BrokerUnavailable

TIMEOUT: Final = 15.0


class ManagementApi:
    """The API at ``url`` (``http://HOST:15672``); credentials from the URL, else given."""

    def __init__(self, url: str, *, user: str, password: str, masked: str) -> None:
        parts = urllib.parse.urlsplit(url)
        #: Where the credentials come from, for the words of a refusal.
        self.credentials_from = "the broker URL (--broker)"
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            self.credentials_from = "the management API's URL (--rabbitmq-api)"
        self.user = user
        netloc = parts.hostname or "localhost"
        if parts.port:
            netloc += f":{parts.port}"
        self.base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self.masked = masked
        token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
        self._auth = f"Basic {token}"

    def get(self, *path: str, query: str = "") -> Any:
        """The JSON at ``/api/<path...>`` (each part quoted), or None for a 404."""
        return self.call("GET", *path, query=query)[1]

    def put(self, *path: str, body: Any) -> Any:
        """PUT ``body`` as JSON at ``/api/<path...>``; None for a 404."""
        return self.call("PUT", *path, body=body)[1]

    def delete(self, *path: str) -> bool:
        """DELETE ``/api/<path...>``; False when there was nothing to delete (404)."""
        return self.call("DELETE", *path)[0]

    def call(self, method: str, *path: str, query: str = "", body: Any = None) -> tuple[bool, Any]:
        """Whether the resource was there (not a 404), and the JSON answered."""
        quoted = "/".join(urllib.parse.quote(part, safe="") for part in path)
        url = f"{self.base}/api/{quoted}" + (f"?{query}" if query else "")
        headers = {"Authorization": self._auth}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
                return True, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return False, None
            if exc.code in (401, 403):
                raise BrokerUnavailable(self._refused(exc.code)) from None
            detail = _reason(exc)
            raise BrokerUnavailable(
                f"RabbitMQ management API at {self.masked} answered {exc.code} for "
                f"{method} {quoted}{detail}"
            ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise BrokerUnavailable(
                f"RabbitMQ management API at {self.masked} cannot be reached: {reason} "
                "(is the rabbitmq_management plugin on? --rabbitmq-api names another address)"
            ) from None

    def _refused(self, code: int) -> str:
        """A 401 (wrong user or password) or 403 (a user the API does not serve), said as
        the credential that failed and what to do."""
        if code == 401:
            return (
                f"RabbitMQ refused user {self.user!r}: wrong user or password in "
                f"{self.credentials_from} (the management API at {self.masked} answered 401); "
                "check USER:PASS in it, or give the API its own as --rabbitmq-api "
                "http://USER:PASS@HOST:15672"
            )
        return (
            f"RabbitMQ's management API at {self.masked} does not serve user {self.user!r} "
            f"(from {self.credentials_from}; 403): give the user the management tag "
            f"(rabbitmqctl set_user_tags {self.user} management) and permissions on the vhost, "
            "or another user's credentials as --rabbitmq-api http://USER:PASS@HOST:15672"
        )


def _reason(exc: urllib.error.HTTPError) -> str:
    """The API's own one-line reason (a 400 says which shovel setting it refused)."""
    try:
        reason = json.loads(exc.read() or b"{}").get("reason")
    except (ValueError, OSError, AttributeError):
        return ""
    return f": {' '.join(str(reason).split())}" if reason else ""
