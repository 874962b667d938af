"""The console's users file: one line per user, ``NAME:ROLE:HASH``, the hash scrypt's
(``hashlib.scrypt``: no dependency), so that the file can sit in a Kubernetes Secret or a
config repository without holding a password.

A user a trusted proxy names (``X-Forwarded-User``) may be listed with the hash ``-``: the
file then only gives that user a role (a proxy user not listed is a viewer)."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from redrive.errors import ConfigError, UsageProblem

# scrypt's cost: ~50 ms and 16 MiB per check on a 2020 laptop core (RFC 7914's interactive
# figures); a login is rare, a guessed one is what it slows.
SCRYPT_N = 2**14
SCRYPT_R = 8
SCRYPT_P = 1
NO_PASSWORD = "-"


class Role(StrEnum):
    VIEWER = "viewer"
    """Reads every page (arguments only when revealed, audited)."""
    OPERATOR = "operator"
    """A viewer who may also act (with ``--allow-actions``)."""


@dataclass(frozen=True, slots=True)
class User:
    name: str
    role: Role
    password_hash: str = NO_PASSWORD

    def line(self) -> str:
        return f"{self.name}:{self.role}:{self.password_hash}"


def role_named(text: str) -> Role:
    try:
        return Role(text)
    except ValueError:
        raise UsageProblem(f"role {text!r}: give viewer or operator") from None


def hash_password(password: str, *, salt: bytes | None = None) -> str:
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(
        password.encode("utf-8"), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32
    )
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"


def password_matches(password: str, stored: str) -> bool:
    """Whether ``password`` is the one ``stored`` hashes (compared in constant time); a
    malformed or empty hash matches nothing."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        return False
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, expected = bytes.fromhex(parts[4]), bytes.fromhex(parts[5])
        digest = hashlib.scrypt(
            password.encode("utf-8"), salt=salt, n=n, r=r, p=p, dklen=len(expected)
        )
    except ValueError:
        return False
    return hmac.compare_digest(digest, expected)


def check_name(name: str) -> str:
    if not name or ":" in name or any(c.isspace() for c in name):
        raise UsageProblem(f"user name {name!r}: give a name without spaces or ':'")
    return name


@dataclass(frozen=True, slots=True)
class Users:
    """The users file, read once when the console starts."""

    source: str
    by_name: dict[str, User]

    def get(self, name: str) -> User | None:
        return self.by_name.get(name)

    def authenticate(self, name: str, password: str) -> User | None:
        """The user, when ``password`` is theirs. An unknown name costs one hash too: the
        time taken does not tell which names exist."""
        user = self.by_name.get(name)
        stored = user.password_hash if user is not None else _DECOY
        ok = password_matches(password, stored)
        return user if ok and user is not None and user.password_hash != NO_PASSWORD else None


_DECOY = hash_password("", salt=b"\0" * 16)


def parse_users(text: str, *, source: str) -> Users:
    users: dict[str, User] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(":")
        if len(fields) != 3:
            raise ConfigError(f"{source}:{number}: expected NAME:ROLE:HASH")
        name, role, digest = fields
        try:
            users[check_name(name)] = User(name, role_named(role), digest)
        except UsageProblem as exc:
            raise ConfigError(f"{source}:{number}: {exc}") from None
    return Users(source, users)


def load_users(path: Path) -> Users:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the users file {path}: {exc.strerror or exc}") from None
    return parse_users(text, source=str(path))


def set_password(path: Path, user: User) -> None:
    """Add or replace ``user``'s line in the file (made if missing, mode 0600), atomically."""
    lines: list[str] = []
    if path.exists():
        load_users(path)  # a broken file is said, not overwritten
        kept = path.read_text(encoding="utf-8").splitlines()
        lines = [
            line
            for line in kept
            if line.split(":", 1)[0].strip() != user.name or line.lstrip().startswith("#")
        ]
    lines.append(user.line())
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"cannot write the users file {path}: {exc.strerror or exc}") from None
