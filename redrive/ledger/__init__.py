"""The idempotency ledger: opening one by URI, and the types every backend shares.

The interface and its types are in :mod:`redrive.ledger.base` (the state machine of a key
is described there); the backends are :mod:`redrive.ledger.sqlite` (one machine),
:mod:`redrive.ledger.dynamodb` and :mod:`redrive.ledger.postgres` (shared across machines),
each with modules of its own (``sqlite_*``, ``dynamodb_*``, ``postgres_*``). They import
``.base`` and those only: this package imports them to open a URI, never the reverse.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redrive.errors import LedgerError
from redrive.ledger.base import (
    MAX_KEY_LENGTH,
    RUN_OUTCOMES,
    Claim,
    ClaimResult,
    Entry,
    KeyState,
    Ledger,
    RunInfo,
)
from redrive.ledger.dynamodb import open_dynamodb
from redrive.ledger.postgres_schema import mask_url
from redrive.ledger.sqlite import SCHEMA_VERSION, SqliteLedger
from redrive.state_dir import default_state_dir

__all__ = [
    "MAX_KEY_LENGTH",
    "POSTGRES_SCHEMES",
    "RUN_OUTCOMES",
    "SCHEMA_VERSION",
    "Claim",
    "ClaimResult",
    "Entry",
    "KeyState",
    "Ledger",
    "RunInfo",
    "SqliteLedger",
    "default_ledger_path",
    "init_postgres",
    "open_ledger",
]


def default_ledger_path() -> Path:
    """``$REDRIVE_STATE_DIR``, else ``$XDG_STATE_HOME/redrive``, else ``~/.local/state/redrive``;
    file ``ledger.sqlite3``."""
    return default_state_dir() / "ledger.sqlite3"


_ACCEPTED_FORMS = (
    "a file path, sqlite:///ABSOLUTE/PATH, sqlite://RELATIVE/PATH, dynamodb://TABLE or "
    "postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
)


# Service name -> boto3 client (e.g. AwsSettings.client); None: boto3's usual settings chain.
ClientFactory = Callable[[str], Any]


def _open_sqlite(rest: str, uri: str, client_factory: ClientFactory | None) -> Ledger:
    if not rest:
        raise LedgerError(f"ledger URI {uri!r} names no file; use {_ACCEPTED_FORMS}")
    return SqliteLedger(Path(rest).expanduser())


def _open_dynamodb(rest: str, uri: str, client_factory: ClientFactory | None) -> Ledger:
    return open_dynamodb(rest, uri, client_factory)


POSTGRES_SCHEMES = ("postgresql", "postgres")


def _need_psycopg() -> None:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise LedgerError(
            "a PostgreSQL ledger needs psycopg: pip install 'redrive[postgres]'"
        ) from None


def _open_postgres(rest: str, uri: str, client_factory: ClientFactory | None) -> Ledger:
    _need_psycopg()
    from redrive.ledger.postgres import PostgresLedger

    return PostgresLedger(uri)


def init_postgres(uri: str) -> str:
    """``redrive ledger init postgresql://...``: create (or upgrade) the ledger's tables;
    what was done, as one line."""
    _need_psycopg()
    from redrive.ledger.postgres_setup import init_schema
    from redrive.ledger.postgres_writes import PgConnector

    return init_schema(PgConnector(uri, mask_url(uri)))


# A new backend is one entry here: scheme -> opener(rest of the URI, whole URI, client factory).
_BACKENDS: dict[str, Callable[[str, str, ClientFactory | None], Ledger]] = {
    "sqlite": _open_sqlite,
    "dynamodb": _open_dynamodb,
    "postgresql": _open_postgres,
    "postgres": _open_postgres,
}


def open_ledger(uri: str | None, *, client_factory: ClientFactory | None = None) -> Ledger:
    """Open the ledger ``uri`` names; None means ``$REDRIVE_LEDGER``, else the default path.

    Accepted: a plain path, ``sqlite:///abs/path``, ``sqlite://relative/path``,
    ``dynamodb://TABLE`` (its client from ``client_factory("dynamodb")``, else from boto3's
    usual settings: AWS_ENDPOINT_URL(_DYNAMODB), AWS_REGION, AWS_PROFILE ...),
    ``postgresql://USER:PASSWORD@HOST:PORT/DATABASE`` (libpq's URL: ``?sslmode=...``).
    """
    if uri is None:
        uri = os.environ.get("REDRIVE_LEDGER") or str(default_ledger_path())
    if not uri.strip():
        raise LedgerError(f"the ledger location is empty; use {_ACCEPTED_FORMS}")
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return SqliteLedger(Path(uri).expanduser())
    opener = _BACKENDS.get(scheme.lower())
    if opener is None:
        raise LedgerError(f"unknown ledger URI {mask_url(uri)!r}; use {_ACCEPTED_FORMS}")
    return opener(rest, uri, client_factory)
