"""Queue families: the built-in layout, its environment overrides, and TOML config files.

A *family* is one Celery queue and its dead-letter queue. The built-in layout has three
(``checkout``, ``default``, ``progress``); a config file replaces it with any other layout.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from redrive.durations import parse_duration
from redrive.errors import ConfigError, UsageProblem

#: name, queue, environment variable that overrides the queue, priority (lower = more urgent)
BUILT_IN_FAMILIES: tuple[tuple[str, str, str, int], ...] = (
    ("checkout", "onion-checkout", "CELERY_CHECKOUT_QUEUE", 1),
    ("default", "onion", "CELERY_DEFAULT_QUEUE", 2),
    ("progress", "onion-progress", "CELERY_PROGRESS_QUEUE", 3),
)
BUILT_IN_PREFIX = "onion"
DEFAULT_MAX_RECEIVE_COUNT = 5
DEFAULT_DLQ_RETENTION_SECONDS = 14 * 24 * 3600
DLQ_SUFFIX = "-dlq"
DEFAULT_DEPLOY_STOP_TIMEOUT = 30.0

_FAMILY_KEYS = {"queue", "dlq", "region", "priority", "max_receive_count", "dlq_retention"}
_DEFAULT_KEYS = {"region", "prefix", "max_receive_count", "dlq_retention"}
_CELERY_KEYS = {"app", "deploy_stop_timeout", "result_backend"}
_SQS_KEYS = {"client"}
_BROKER_KEYS = {"url", "rabbitmq_api"}
_LEDGER_KEYS = {"url"}

SqsClient = Literal["botocore", "lean"]
#: The clients the SQS backend calls SQS with (``--sqs-client``, REDRIVE_SQS_CLIENT,
#: ``[sqs] client``): botocore's, or the lean path for the per-message calls (issue 25).
SQS_CLIENTS: tuple[SqsClient, ...] = ("botocore", "lean")
#: lean since its proof passed (issue 25: tests/test_sqs_lean.py against moto, fast_sqs and
#: LocalStack, the broker contract on both paths); botocore stays one option away.
DEFAULT_SQS_CLIENT: SqsClient = "lean"
SQS_CLIENT_OPTION = "--sqs-client"
SQS_CLIENT_ENV = "REDRIVE_SQS_CLIENT"


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    queue: str
    """Source queue name or URL."""
    dlq: str | None = None
    """DLQ name or URL; ``None`` means: the one the source queue dead-letters into."""
    region: str | None = None
    priority: int = 100
    max_receive_count: int = DEFAULT_MAX_RECEIVE_COUNT
    dlq_retention_seconds: int = DEFAULT_DLQ_RETENTION_SECONDS


@dataclass(frozen=True, slots=True)
class Layout:
    families: tuple[Family, ...]
    source: str
    """Where the layout came from: ``built-in`` or the config file's path."""
    prefix: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    routes: Mapping[str, str] = field(default_factory=dict)
    """``[routes]``: task name or glob -> family name or queue (see redrive.celery.routes)."""
    celery_app: str | None = None
    """``[celery] app``: the Celery app, as ``--celery-app`` names it."""
    deploy_stop_timeout: float = DEFAULT_DEPLOY_STOP_TIMEOUT
    """``[celery] deploy_stop_timeout``: how long a deploy lets a worker finish before SIGKILL."""
    result_backend: str | None = None
    """``[celery] result_backend``: Celery's result backend URL (read-only)."""
    sqs_client: SqsClient | None = None
    """``[sqs] client``: the SQS client, as ``--sqs-client`` names it (None: not set)."""
    broker_url: str | None = None
    """``[broker] url``: the broker, as ``--broker`` names it (None: SQS)."""
    rabbitmq_api: str | None = None
    """``[broker] rabbitmq_api``: RabbitMQ's management API, as ``--rabbitmq-api``."""
    ledger_url: str | None = None
    """``[ledger] url``: the ledger, as ``--ledger`` names it, of any kind (a path,
    sqlite://, dynamodb://, postgresql://); None: the default path."""

    def family(self, name: str) -> Family | None:
        for family in self.families:
            if family.name == name:
                return family
        return None


def built_in_layout(env: Mapping[str, str]) -> Layout:
    families = tuple(
        Family(name=name, queue=env.get(var) or queue, priority=priority)
        for name, queue, var, priority in BUILT_IN_FAMILIES
    )
    return Layout(families=families, source="built-in", prefix=BUILT_IN_PREFIX)


def load_layout(config_path: str | None, env: Mapping[str, str] | None = None) -> Layout:
    """The layout from ``config_path``, else ``$REDRIVE_CONFIG``, else the built-in one."""
    env = os.environ if env is None else env
    path = config_path or env.get("REDRIVE_CONFIG") or None
    if path is None:
        return built_in_layout(env)
    return parse_config_file(Path(path))


def parse_config_file(path: Path) -> Layout:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            f"config file {path} does not exist: check --config / REDRIVE_CONFIG"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    return parse_config(data, str(path))


def parse_config(data: Mapping[str, Any], source: str) -> Layout:
    unknown = set(data) - {"defaults", "families", "routes", "celery", "sqs", "broker", "ledger"}
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(
            f"{source}: unknown key '{key}' (expected [defaults], [families.NAME], [routes], "
            "[celery], [sqs], [broker] and [ledger])"
        )
    defaults = _table(data.get("defaults", {}), "defaults", source)
    _check_keys(defaults, _DEFAULT_KEYS, "defaults", source)
    # Checked here, once, so a bad default is reported under its own key even when every
    # family overrides it.
    default_region = _opt_str(defaults, "region", "defaults", source)
    default_max_receive = _int(
        defaults, "max_receive_count", "defaults", source, default=DEFAULT_MAX_RECEIVE_COUNT
    )
    default_retention = _duration(defaults.get("dlq_retention"), "defaults.dlq_retention", source)
    families_table = _table(data.get("families"), "families", source)
    if not families_table:
        raise ConfigError(f"{source}: no [families.NAME] table: define at least one family")
    default = Family(
        name="",
        queue="",
        region=default_region,
        max_receive_count=default_max_receive,
        dlq_retention_seconds=default_retention,
    )
    families = [
        _family(name, raw, position, source, default)
        for position, (name, raw) in enumerate(families_table.items())
    ]
    families.sort(key=lambda f: f.priority)
    prefix = _opt_str(defaults, "prefix", "defaults", source)
    sqs = _table(data.get("sqs"), "sqs", source)
    _check_keys(sqs, _SQS_KEYS, "sqs", source)
    client = sqs.get("client")
    broker = _table(data.get("broker"), "broker", source)
    _check_keys(broker, _BROKER_KEYS, "broker", source)
    ledger = _table(data.get("ledger"), "ledger", source)
    _check_keys(ledger, _LEDGER_KEYS, "ledger", source)
    layout = Layout(
        families=tuple(families),
        source=source,
        prefix=prefix,
        sqs_client=(
            None if client is None else sqs_client_named(client, f"{source}: key 'sqs.client'")
        ),
        broker_url=_opt_str(broker, "url", "broker", source),
        rabbitmq_api=_opt_str(broker, "rabbitmq_api", "broker", source),
        ledger_url=_opt_str(ledger, "url", "ledger", source),
    )
    return _with_celery(layout, data, source)


def _family(name: str, raw: Any, position: int, source: str, default: Family) -> Family:
    """The table ``[families.NAME]``, with ``default``'s region, receive count and
    retention where it names none."""
    where = f"families.{name}"
    table = _table(raw, where, source)
    _check_keys(table, _FAMILY_KEYS, where, source)
    queue = table.get("queue")
    if not isinstance(queue, str) or not queue:
        raise ConfigError(f"{source}: key '{where}.queue' must be a queue name or URL")
    return Family(
        name=name,
        queue=queue,
        dlq=_opt_str(table, "dlq", where, source),
        region=_opt_str(table, "region", where, source) or default.region,
        priority=_int(table, "priority", where, source, default=position + 1),
        max_receive_count=_int(
            table, "max_receive_count", where, source, default=default.max_receive_count
        ),
        dlq_retention_seconds=(
            _duration(table["dlq_retention"], f"{where}.dlq_retention", source)
            if "dlq_retention" in table
            else default.dlq_retention_seconds
        ),
    )


def sqs_client_named(value: object, where: str) -> SqsClient:
    """``value`` as an SQS client's name; any other is a usage error (exit 2) that names
    ``where`` it came from (the option, the environment variable, the config file's key)."""
    if isinstance(value, str) and value in SQS_CLIENTS:
        return value
    allowed = " or ".join(repr(name) for name in SQS_CLIENTS)
    raise UsageProblem(f"{where} must be {allowed}, not {value!r}")


def _with_celery(layout: Layout, data: Mapping[str, Any], source: str) -> Layout:
    """The layout with the config's ``[routes]`` and ``[celery]`` tables, checked."""
    celery = _table(data.get("celery"), "celery", source)
    _check_keys(celery, _CELERY_KEYS, "celery", source)
    return replace(
        layout,
        routes=_routes(data.get("routes"), source),
        celery_app=_opt_str(celery, "app", "celery", source),
        result_backend=_opt_str(celery, "result_backend", "celery", source),
        deploy_stop_timeout=(
            _duration(celery["deploy_stop_timeout"], "celery.deploy_stop_timeout", source)
            if "deploy_stop_timeout" in celery
            else DEFAULT_DEPLOY_STOP_TIMEOUT
        ),
    )


def _routes(value: Any, source: str) -> dict[str, str]:
    """``[routes]``: each key a task name or glob, each value a family name or a queue."""
    table = _table(value, "routes", source)
    for task, destination in table.items():
        if not isinstance(destination, str) or not destination:
            raise ConfigError(
                f"{source}: key 'routes.{task}' must be a family name or a queue (name or URL)"
            )
    return dict(table)


def _table(value: Any, where: str, source: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: key '{where}' must be a table")
    return value


def _check_keys(table: Mapping[str, Any], allowed: set[str], where: str, source: str) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(
                f"{source}: unknown key '{where}.{key}' (allowed: {', '.join(sorted(allowed))})"
            )


def _opt_str(table: Mapping[str, Any], key: str, where: str, source: str) -> str | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{source}: key '{where}.{key}' must be a non-empty string")
    return value


def _int(table: Mapping[str, Any], key: str, where: str, source: str, *, default: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{source}: key '{where}.{key}' must be a whole number >= 0")
    return value


def _duration(value: Any, where: str, source: str) -> int:
    if value is None:
        return DEFAULT_DLQ_RETENTION_SECONDS
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        try:
            return int(parse_duration(value))
        except ValueError:
            pass
    raise ConfigError(f"{source}: key '{where}' must be seconds or a duration like '14d'")
