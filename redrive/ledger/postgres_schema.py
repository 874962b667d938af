"""The PostgreSQL ledger's schema (versioned), its URL as it may be printed, and the
check that a commit is durable before a send follows it.

Tables carry a ``redrive_`` prefix: a team's ledger often lives in a database that holds
other things (Celery's result backend, an application's tables). ``redrive_schema_version``
holds one row, the version; :func:`migrate` creates the schema or brings an older one up to
date (``redrive ledger init``), and every open refuses a schema newer than this code
knows, or one older that ``ledger init`` has not upgraded yet.
"""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass

SCHEMA_VERSION = 1

VERSION_TABLE = "redrive_schema_version"

# Rows in claim order by ``id`` (iter_keys pages along it, as SQLite's rowid); the key is
# the primary key, so two claims of one key meet in its unique index: INSERT ... ON
# CONFLICT DO NOTHING makes the second wait for the first to commit, then lose.
SCHEMA_1 = (
    f"CREATE TABLE {VERSION_TABLE} (version integer NOT NULL)",
    """CREATE TABLE redrive_keys (
    id              bigint GENERATED ALWAYS AS IDENTITY,
    key             text PRIMARY KEY,
    state           text NOT NULL CHECK (state IN ('claimed', 'sent', 'done', 'skipped')),
    run_id          text NOT NULL,
    task            text NOT NULL,
    message_id      text NOT NULL,
    target          text NOT NULL,
    sent_message_id text,
    updated_at      double precision NOT NULL,
    sent_at         double precision
)""",
    "CREATE INDEX redrive_keys_by_state ON redrive_keys (state, id)",
    "CREATE INDEX redrive_keys_by_run ON redrive_keys (run_id, id)",
    """CREATE TABLE redrive_runs (
    run_id       text PRIMARY KEY,
    command      text NOT NULL,
    started_at   double precision NOT NULL,
    heartbeat_at double precision NOT NULL,
    lease_until  double precision NOT NULL,
    ended_at     double precision,
    outcome      text,
    info         text NOT NULL,
    counts       text NOT NULL
)""",
    "CREATE INDEX redrive_runs_by_start ON redrive_runs (started_at, run_id)",
    "CREATE TABLE redrive_meta (name text PRIMARY KEY, value text NOT NULL)",
)

#: version -> the statements that bring the schema one version before it up to it.
MIGRATIONS: dict[int, tuple[str, ...]] = {1: SCHEMA_1}

LEGACY_KEYS = "legacy_keys"


def mask_url(url: str) -> str:
    """``url`` fit to print: the password of its user part, and a ``password=`` of its
    query, as ``***``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if at and ":" in userinfo:
        authority = f"{userinfo.partition(':')[0]}:***@{host}"
    path, question, query = tail.partition("?")
    if question:
        parts = query.split("&")
        query = "&".join(
            "password=***" if p.partition("=")[0].lower() == "password" else p for p in parts
        )
    return f"{scheme}://{authority}{slash}{path}{question}{query}"


def url_secrets(url: str) -> list[str]:
    """The password(s) ``url`` holds, as they might appear in a driver's message."""
    parts = urllib.parse.urlsplit(url)
    found = []
    with_password = parts.netloc.rpartition("@")[0]
    if ":" in with_password:
        raw = with_password.partition(":")[2]
        found += [raw, urllib.parse.unquote(raw)]
    for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        if name.lower() == "password":
            found.append(value)
    return [s for s in found if s]


def scrub(text: str, url: str) -> str:
    """``text`` on one line, with any password of ``url`` in it as ``***``."""
    line = " ".join(text.split())
    for secret in url_secrets(url):
        line = line.replace(secret, "***")
    return line


def schema_problem(found: int | None, location: str) -> str | None:
    """What is wrong with a database whose schema version is ``found`` (None: no ledger
    in it), for a run to use it; None when nothing is."""
    if found == SCHEMA_VERSION:
        return None
    if found is None:
        return (
            f"no redrive ledger in {location}; create it with `redrive ledger init URL` "
            "(as a role that may create tables)"
        )
    if found > SCHEMA_VERSION:
        return (
            f"ledger {location} was written by a newer redrive (schema {found}, this one "
            f"knows {SCHEMA_VERSION}); upgrade redrive"
        )
    return (
        f"ledger {location} has schema {found}, this redrive needs {SCHEMA_VERSION}; "
        "upgrade it with `redrive ledger init URL`"
    )


@dataclass(frozen=True, slots=True)
class Durability:
    """What the server says of a commit's durability, as this session sees it."""

    synchronous_commit: str  # SHOW synchronous_commit: on, off, local, remote_write, ...
    synchronous_standby_names: str  # '' when no standby is synchronous
    standbys: int | None  # rows of pg_stat_replication (None: not readable)


def durability_verdict(d: Durability, location: str) -> tuple[str | None, str | None]:
    """(refusal, warning): why this session's commits cannot guard a send (refused), or
    what a failover could still lose (a warning). A claim is only as durable as its
    commit: a lost claim is a second send after a restart or a failover."""
    setting = d.synchronous_commit.lower()
    fix = (
        "set it to on for redrive's role (ALTER ROLE ... SET synchronous_commit = on) or "
        "add ?options=-csynchronous_commit%3Don to the ledger URL"
    )
    if setting == "off":
        return (
            f"ledger {location}: synchronous_commit is off, so a claim could be lost after "
            f"redrive was told it was committed (a second send); {fix}",
            None,
        )
    sync_standbys = bool(d.synchronous_standby_names.strip())
    if setting == "local" and sync_standbys:
        return (
            f"ledger {location}: synchronous_commit is local while the server has "
            "synchronous standbys, so a failover could lose a claim (a second send); "
            f"{fix}",
            None,
        )
    if d.standbys and not sync_standbys:
        return (
            None,
            f"ledger {location}: the server streams to {d.standbys} asynchronous "
            "standby(s): a failover to one could lose the last claims (in doubt, or a "
            "second send); set synchronous_standby_names on the primary",
        )
    return None, None
