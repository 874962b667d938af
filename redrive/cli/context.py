"""The state a command runs with (:class:`Context`: AWS settings, the layout, brokers per
region), the mapping of core errors to one-line failures, and what every run shares."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import click

from redrive.aws.identity import caller_identity
from redrive.aws.session import AwsSettings
from redrive.broker import BrokerSettings, celery_broker_url, resolve_target
from redrive.broker.base import Broker, DlqTarget, QueueRef, queue_name
from redrive.broker.server import server_of
from redrive.celery.app import load_app
from redrive.celery.results import ResultLookup, open_app_results, open_results
from redrive.cli.console import ARGV, Refused, warn
from redrive.config import (
    DEFAULT_SQS_CLIENT,
    SQS_CLIENT_ENV,
    Layout,
    SqsClient,
    load_layout,
    sqs_client_named,
)
from redrive.dlq import delivery_limit
from redrive.dlq.receive_log import ReceiveLog
from redrive.dlq.scan import shared_by_workers
from redrive.errors import RedriveError, UsageProblem
from redrive.ledger import Ledger, open_ledger
from redrive.operations.coordinator import ledger_exists
from redrive.render.selection import filters_text
from redrive.selection import Selection

# -- shared state and helpers -------------------------------------------------------------


@dataclass
class Context:
    aws: AwsSettings
    config: str | None
    _layout: Layout | None = None
    broker_option: str | None = None
    """``--broker`` (or REDRIVE_BROKER); else the config's ``[broker] url``, else the Celery
    app's ``broker_url`` (:attr:`broker_url`)."""
    rabbitmq_api_option: str | None = None
    """``--rabbitmq-api`` (or REDRIVE_RABBITMQ_API); else the config's."""
    allow_delivery_limit: bool = False
    """``--allow-delivery-limit``: receive from a DLQ with a delivery limit of its own
    (redrive.dlq.delivery_limit)."""

    @property
    def layout(self) -> Layout:
        if self._layout is None:
            self._layout = load_layout(self.config)
        return self._layout

    _spare: dict[str | None, Broker] = field(default_factory=dict)
    _shared: dict[str | None, Broker] = field(default_factory=dict)
    """Per region, the broker every worker shares (:func:`shared_by_workers`)."""
    _receive_log: ReceiveLog | None = None
    celery_app: str | None = None
    """``--celery-app`` (or REDRIVE_CELERY_APP); else the config's ``[celery] app``."""
    celery_app_from_env: bool = False
    """``celery_app`` is REDRIVE_CELERY_APP's (messages name where the app came from)."""
    _celery: Any = None
    """The loaded app and its spec (:meth:`celery`), once a command asked for it."""
    result_backend: str | None = None
    """--result-backend (or REDRIVE_RESULT_BACKEND); else the config's [celery] one."""
    result_backend_given: bool = False
    """--result-backend was on the command line (not a standing default from the env or
    the config file)."""
    _results: ResultLookup | None = None
    sqs_client: SqsClient | None = None
    """--sqs-client's (checked when parsed); None: not on the command line."""
    sqs_client_env: str | None = None
    """REDRIVE_SQS_CLIENT's, unchecked until a broker is opened (--sqs-client after the
    command overrides it)."""

    @property
    def sqs(self) -> SqsClient:
        """The SQS client the run's brokers call with: --sqs-client's, else
        REDRIVE_SQS_CLIENT's, else the config's ``[sqs] client``, else lean. A bad value
        is a usage error (exit 2) naming where it came from."""
        with core_errors():
            if self.sqs_client is not None:
                return self.sqs_client
            if self.sqs_client_env is not None:
                return sqs_client_named(self.sqs_client_env, SQS_CLIENT_ENV)
            return self.layout.sqs_client or DEFAULT_SQS_CLIENT

    @property
    def broker_url(self) -> str | None:
        """The broker's URL (None: SQS with the AWS settings): --broker's, else
        REDRIVE_BROKER's, else the config's ``[broker] url``, else, with a Celery app named,
        the app's ``broker_url`` when it is one redrive speaks (RabbitMQ's or SQS's)."""
        if self.broker_option:
            return self.broker_option
        if self.layout.broker_url:
            return self.layout.broker_url
        if not (self.celery_app or self.layout.celery_app):
            return None
        try:
            loaded = self.celery()
        except RedriveError:
            # An app that does not load is reported by what uses it, not here: SQS, as before.
            return None
        url = str(getattr(loaded[0].conf, "broker_url", None) or "") if loaded else ""
        return celery_broker_url(url)

    @property
    def rabbitmq_api(self) -> str | None:
        return self.rabbitmq_api_option or self.layout.rabbitmq_api

    @property
    def broker_settings(self) -> BrokerSettings:
        """What opens the run's brokers, here and in each ``--processes`` child."""
        return BrokerSettings(
            url=self.broker_url, sqs_client=self.sqs, rabbitmq_api=self.rabbitmq_api
        )

    @property
    def result_backend_url(self) -> str | None:
        """The result backend's URL: --result-backend's, else the config's (None: neither;
        the Celery app's own may still keep results)."""
        return self.result_backend or self.layout.result_backend

    def results(self, *, probe: bool = True) -> ResultLookup | None:
        """Celery's result backend, opened once per command (read-only), or None when
        none is configured. A bad URL is an error; so is a backend that does not answer,
        with ``probe`` (a move must know before it sends anything; inspect and report say
        so and go on)."""
        if self._results is None:
            url = self.result_backend_url
            if url:
                # Without a probe (inspect, report) it opens while the scan starts.
                self._results = open_results(url, probe=probe, background=not probe)
            else:
                self._results = self._app_results(probe)
            if self._results is not None:
                click.get_current_context().call_on_close(self._results.close)
        return self._results

    def celery(self) -> tuple[Any, str] | None:
        """The Celery app and its spec, loaded once per command by the commands that use
        it; None when no app is named."""
        spec = self.celery_app or self.layout.celery_app
        if not spec:
            return None
        if self._celery is None or self._celery[1] != spec:
            self._celery = (load_app(spec, named_by=self._named_by(spec)), spec)
        loaded: tuple[Any, str] = self._celery
        return loaded

    def _named_by(self, spec: str) -> str:
        """Where the app's spec came from, as its errors say it."""
        if self.celery_app is None:
            return f"[celery] app {spec!r} (config {self.layout.source})"
        if self.celery_app_from_env:
            return f"REDRIVE_CELERY_APP {spec!r}"
        return f"--celery-app {spec}"

    def _app_results(self, probe: bool) -> ResultLookup | None:
        """The result backend of ``--celery-app``'s app, when one is named and keeps
        results."""
        loaded = self.celery()
        return open_app_results(*loaded, probe=probe) if loaded is not None else None

    def receive_log(self) -> ReceiveLog:
        """Where redrive counts its own receives (redrive.dlq.receive_log), opened once per command
        and closed when it ends."""
        if self._receive_log is None:
            log = ReceiveLog.open_default()
            click.get_current_context().call_on_close(log.close)
            if log.problem:
                warn(
                    f"cannot count redrive's own receives: {log.problem}; receive counts "
                    "will include them"
                )
            self._receive_log = log
        return self._receive_log

    def broker_for(self, region: str | None = None) -> Broker:
        """A broker for one worker thread: with connections of its own, or the one every
        worker shares where that is safe (the lean SQS path: :func:`shared_by_workers`)."""
        if (shared := self._shared.get(region)) is not None:
            return shared
        spare = self._spare.pop(region, None)
        broker = spare if spare is not None else self._open_broker(region)
        if shared_by_workers(broker):
            self._shared[region] = self._spare[region] = broker
        return broker

    def _open_broker(self, region: str | None) -> Broker:
        return self.broker_settings.open(self.aws, region)

    def _resolver(self, region: str | None = None) -> Broker:
        # Resolving a target and the run's first worker share one adapter: each costs two
        # clients, ~15 ms apiece to create, paid by every run however small.
        if region not in self._spare:
            self._spare[region] = self._open_broker(region)
        return self._spare[region]

    def target(self, name: str, *, receives: bool = True) -> DlqTarget:
        """The TARGET as a DLQ and its sources; one whose DLQ counts deliveries toward a
        limit of its own is refused (exit 2, one line) when the command ``receives`` from it
        and ``--allow-delivery-limit`` was not given."""
        found = resolve_target(self.layout, name, self._resolver)
        if receives:
            try:
                delivery_limit.guard(
                    found.dlq,
                    self._resolver(found.region).capabilities,
                    self.receive_log,
                    allowed=self.allow_delivery_limit,
                )
            except delivery_limit.DeliveryLimitRisk as exc:
                raise Refused(str(exc)) from None
        return found

    def queue(self, name_or_url: str) -> QueueRef:
        return self._resolver().describe(name_or_url)

    def is_celery_queue(self, queue: QueueRef) -> bool:
        """Whether Celery workers consume ``queue``: it is one of the families' queues."""
        return any(queue_name(f.queue) == queue.name for f in self.layout.families)

    def broker_of(self, dlq: DlqTarget) -> Callable[[], Broker]:
        """Brokers for the DLQ's own region (a family may name one)."""
        return lambda: self.broker_for(dlq.region)

    def s3_client(self) -> Any:
        return self.aws.client("s3")


pass_ctx = click.make_pass_decorator(Context)


def fail(message: str) -> NoReturn:
    raise click.ClickException(message)


@contextlib.contextmanager
def core_errors() -> Iterator[None]:
    """Core errors become one line and exit 1 (or 2 for usage problems), never a traceback."""
    try:
        yield
    except UsageProblem as exc:
        raise click.UsageError(str(exc)) from exc
    except RedriveError as exc:
        raise click.ClickException(str(exc)) from exc


def dlq_details(ctx: Context, dlq: DlqTarget, selection: Selection | None) -> list[str]:
    """What a confirmation names: the DLQ, how many messages it shows now, the filters."""
    try:
        visible = f"{ctx.broker_of(dlq)().counts(dlq.dlq.url).ready:,} message(s) visible"
    except Exception as exc:  # the prompt still asks; the run reports any real error
        visible = f"visible count unknown: {exc}"
    lines = [f"  DLQ:      {dlq.dlq.name} ({dlq.label}): {visible}"]
    if selection is not None:
        lines.append(f"  filters:  {filters_text(selection.describe())}")
    return lines


# -- the group --------------------------------------------------------------------------------


class RedriveGroup(click.Group):
    """Keeps the command line for the audit trail and dry runs' next step, and lists each
    command's summary whole in ``--help`` (click cuts a long one short with "...")."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # The outermost group sees every word; a nested group (ledger) only its own.
        ctx.meta.setdefault(ARGV, list(args))
        return super().parse_args(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def audit_identity(ctx: Context) -> dict[str, Any]:
    """Whom the broker knows an ``--execute`` run as, and the broker and its version, for
    the audit trail (:func:`redrive.runs.lifecycle.audit_record`)."""
    server = _broker_server(ctx)
    return {**_who_calls(ctx), "broker_server": server}


def _broker_server(ctx: Context) -> dict[str, Any] | None:
    """The broker and its version, for the audit trail (issue 39); None where it cannot be
    said (the management API did not answer: the run goes on, as it would have)."""
    try:
        server = server_of(ctx._resolver(None))
    except RedriveError:
        return None
    return server.to_json() if server is not None else None


def _who_calls(ctx: Context) -> dict[str, Any]:
    """Whom the broker knows the run as. On SQS the AWS principal and the SQS client; on
    RabbitMQ the broker (password masked) and its user: asking AWS's STS there would send
    a RabbitMQ run's audit to AWS, and record an unrelated identity, or an error."""
    caller = BrokerSettings(url=ctx.broker_url).caller()
    if caller is not None:
        return {"caller": caller, "sqs_client": None}
    return {"caller": caller_identity(lambda: ctx.aws.client("sts")), "sqs_client": ctx.sqs}


def ledger_uri(ctx: Context, uri: str | None) -> str | None:
    """The ledger a command uses: --ledger's (or REDRIVE_LEDGER's, which click reads into
    it), else the config's ``[ledger] url``; None: the default path."""
    return uri or ctx.layout.ledger_url


def open_cli_ledger(ctx: Context, uri: str | None) -> Ledger:
    """The command's ledger (:func:`ledger_uri`), opened (made if it is a file); what
    opening it found that the user should know is shown as warnings."""
    ledger = open_ledger(ledger_uri(ctx, uri), client_factory=ctx.aws.client)
    for line in ledger.warnings:
        warn(line)
    return ledger


def dry_run_ledger(ctx: Context, uri: str | None) -> Ledger | None:
    """A dry run reads the ledger (to report duplicates and in-doubt keys) if it exists,
    and never creates one."""
    uri = ledger_uri(ctx, uri)
    return open_cli_ledger(ctx, uri) if ledger_exists(uri) else None
