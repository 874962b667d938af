"""Who is asking, and what they may do: signed session cookies, a trusted proxy's user
headers, CSRF tokens, the login rate limit, and the headers every response carries.

Decisions are pure functions of their inputs (the clock is passed in); the middleware in
:mod:`redrive.web.app` applies them to each request."""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import secrets
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redrive.web.settings import ConsoleSettings, Network
from redrive.web.users import Role

SESSION_COOKIE = "redrive_session"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
PROXY_USER = "x-forwarded-user"
PROXY_EMAIL = "x-forwarded-email"

#: No inline script or style anywhere (no 'unsafe-inline'): the pages' own CSS and JS are
#: static files of this server; charts are SVG markup with presentation attributes.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS: tuple[tuple[str, str], ...] = (
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cache-control", "no-store"),
)


@dataclass(frozen=True, slots=True)
class Person:
    """Who a request is from, as the audit records them."""

    name: str
    role: Role
    address: str
    via: str
    """How they were named: ``session`` (signed in), ``proxy`` (a trusted proxy's header),
    ``local`` (a console without sign-in, on loopback)."""
    email: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": str(self.role),
            "address": self.address,
            "via": self.via,
            "email": self.email,
        }


# -- sessions -------------------------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign_session(data: Mapping[str, Any], secret: bytes) -> str:
    payload = _b64(json.dumps(dict(data), separators=(",", ":"), sort_keys=True).encode())
    mac = hmac.new(secret, payload.encode("ascii"), hashlib.sha256).digest()
    return f"{payload}.{_b64(mac)}"


def read_session(
    cookie: str | None, secret: bytes, *, now: float, max_age: float
) -> dict[str, Any] | None:
    """The session a cookie holds; None when it is missing, forged, or older than
    ``max_age`` (its ``issued`` time, which signing covers)."""
    if not cookie or "." not in cookie:
        return None
    payload, _, mac = cookie.partition(".")
    expected = hmac.new(secret, payload.encode("ascii"), hashlib.sha256).digest()
    try:
        if not hmac.compare_digest(_unb64(mac), expected):
            return None
        data = json.loads(_unb64(payload))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict):
        return None
    issued = data.get("issued")
    if not isinstance(issued, int | float) or not now - max_age <= issued <= now + 60:
        return None
    return data


def new_session(now: float) -> dict[str, Any]:
    """An anonymous session: a CSRF token (the login form needs one too), no user."""
    return {"issued": now, CSRF_FIELD: secrets.token_urlsafe(24)}


def session_cookie(value: str, *, secure: bool, max_age: int) -> str:
    """The Set-Cookie header: HttpOnly (no script reads it), SameSite=Strict (no other site's
    page sends it), Secure when the console is reached over HTTPS."""
    parts = [
        f"{SESSION_COOKIE}={value}",
        "Path=/",
        f"Max-Age={max_age}",
        "HttpOnly",
        "SameSite=Strict",
    ]
    if secure:
        parts.append("Secure")
    return "; ".join(parts)


def csrf_ok(session: Mapping[str, Any], given: str | None) -> bool:
    expected = session.get(CSRF_FIELD)
    return (
        isinstance(expected, str)
        and isinstance(given, str)
        and hmac.compare_digest(expected.encode(), given.encode())
    )


# -- addresses and proxies ------------------------------------------------------------------


def in_networks(address: str, networks: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in networks)


@dataclass(frozen=True, slots=True)
class Peer:
    """The request's client as the audit records it, and whether a trusted proxy sent it."""

    address: str
    proxied: bool
    https: bool


def peer_of(
    client: str | None, scheme: str, headers: Mapping[str, str], proxies: Sequence[Network]
) -> Peer:
    """``client``: the address that connected. Only a trusted proxy's X-Forwarded-For and
    X-Forwarded-Proto are believed (the last address it appended: the one it saw)."""
    address = client or "unknown"
    if not in_networks(address, proxies):
        return Peer(address, False, scheme == "https")
    forwarded = [a.strip() for a in headers.get("x-forwarded-for", "").split(",") if a.strip()]
    proto = headers.get("x-forwarded-proto", scheme).split(",")[-1].strip().lower()
    return Peer(forwarded[-1] if forwarded else address, True, proto == "https")


def person_of(
    settings: ConsoleSettings,
    peer: Peer,
    headers: Mapping[str, str],
    session: Mapping[str, Any],
    local_user: str,
) -> Person | None:
    """Who the request is from (None: no one; sign in). A trusted proxy's header names
    them first; then the signed session; a console without sign-in (loopback) takes every
    request as the local user, an operator."""
    if peer.proxied:
        user = headers.get(PROXY_USER, "").strip()
        email = headers.get(PROXY_EMAIL, "").strip() or None
        name = user or email or ""
        if name:
            listed = settings.users.get(name) if settings.users is not None else None
            role = listed.role if listed is not None else Role.VIEWER
            return Person(name, role, peer.address, "proxy", email)
    signed_in = session.get("user")
    if isinstance(signed_in, str) and settings.users is not None:
        listed = settings.users.get(signed_in)
        if listed is not None:
            return Person(signed_in, listed.role, peer.address, "session")
    if not settings.authenticated:
        return Person(local_user, Role.OPERATOR, peer.address, "local")
    return None


# -- the login rate limit -------------------------------------------------------------------


@dataclass
class LoginLimiter:
    """At most ``failures`` failed logins per key (an address, a user name) in any
    ``window`` seconds; the clock is the caller's."""

    clock: Callable[[], float]
    failures: int = 5
    window: float = 300.0
    _seen: dict[str, deque[float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def wait(self, *keys: str) -> float:
        """Seconds until a login for ``keys`` may be tried (0: now)."""
        now = self.clock()
        longest = 0.0
        with self._lock:
            for key in keys:
                times = self._recent(key, now)
                if len(times) >= self.failures:
                    longest = max(longest, times[0] + self.window - now)
        return longest

    def failed(self, *keys: str) -> None:
        now = self.clock()
        with self._lock:
            for key in keys:
                self._recent(key, now).append(now)

    def _recent(self, key: str, now: float) -> deque[float]:
        times = self._seen.setdefault(key, deque())
        while times and times[0] <= now - self.window:
            times.popleft()
        return times
