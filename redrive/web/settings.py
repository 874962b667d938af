"""What ``redrive web`` starts with (:class:`ConsoleSettings`), and the decisions made from
it before anything listens: where it binds, and whether that bind is allowed."""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass, field
from typing import TypeAlias

from redrive.errors import UsageProblem
from redrive.web.users import Users

Network: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network
DEFAULT_BIND = "127.0.0.1:8080"
DEFAULT_REFRESH = 60.0


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    allow_actions: bool = False
    users: Users | None = None
    trusted_proxies: tuple[Network, ...] = ()
    refresh: float = DEFAULT_REFRESH
    """Seconds a DLQ's scan serves every viewer before the next one (``--refresh``)."""
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    """Signs session cookies; random per start unless REDRIVE_WEB_SECRET gives one (several
    replicas behind one address must share it)."""
    session_seconds: int = 8 * 3600
    login_failures: int = 5
    """Failed logins allowed per address (and per user name) in ``login_window``."""
    login_window: float = 300.0

    @property
    def authenticated(self) -> bool:
        """Whether people sign in (a users file) or a trusted proxy names them."""
        return self.users is not None or bool(self.trusted_proxies)

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def parse_bind(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets) as host and port."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageProblem(f"--bind {text!r}: give HOST:PORT, e.g. {DEFAULT_BIND}")
    return host.strip("[]"), int(port)


def parse_network(text: str) -> Network:
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        raise UsageProblem(
            f"--trusted-proxy {text!r}: give an address or CIDR, e.g. 10.0.0.0/8"
        ) from None


def bind_refusal(settings: ConsoleSettings) -> str | None:
    """Why the console must not start as set (None: it may): actions on an address others
    can reach, with no one signing in, would let anyone on the network move messages."""
    if settings.allow_actions and not settings.loopback and not settings.authenticated:
        return (
            f"--allow-actions on {settings.host} (not loopback) needs authentication: "
            "give --users FILE or --trusted-proxy CIDR, or bind 127.0.0.1"
        )
    return None


def start_lines(settings: ConsoleSettings) -> list[str]:
    """What the console says when it starts: where, who may see it, whether it acts."""
    where = f"http://{_url_host(settings.host)}:{settings.port}/"
    reach = (
        "loopback only: other machines cannot reach it"
        if settings.loopback
        else f"on {settings.host}: reachable from the network"
    )
    if settings.users is not None and settings.trusted_proxies:
        who = f"users from {settings.users.source} and a trusted proxy's X-Forwarded-User"
    elif settings.users is not None:
        who = f"users sign in (users file {settings.users.source})"
    elif settings.trusted_proxies:
        who = "a trusted proxy names each user (X-Forwarded-User)"
    else:
        who = "no sign-in: whoever reaches it is the local user"
    acts = "actions allowed to operators" if settings.allow_actions else "read-only"
    return [f"redrive console at {where} ({reach}); {who}; {acts}"]


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
