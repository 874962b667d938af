"""The ``redrive`` command: parse options, call one core operation, render its result.

Results go to stdout (tables, or JSON with ``--json``); progress and warnings to stderr.
This package is the only part of redrive that imports click: the group and :func:`main`
live here, the commands one module per family (:mod:`~redrive.cli.look`,
:mod:`~redrive.cli.move`, :mod:`~redrive.cli.replay`, :mod:`~redrive.cli.apply`,
:mod:`~redrive.cli.purge`, :mod:`~redrive.cli.native`,
:mod:`~redrive.cli.audit`, :mod:`~redrive.cli.sandbox`), what they share in
:mod:`~redrive.cli.context`, :mod:`~redrive.cli.options` and :mod:`~redrive.cli.console`.
"""

from __future__ import annotations

import sys

import click

from redrive import __version__
from redrive.aws.session import AwsSettings
from redrive.cli import apply, audit, console, look, move, native, purge, replay, sandbox, web
from redrive.cli.context import Context, RedriveGroup
from redrive.cli.exit_codes import EXIT_INTERRUPTED
from redrive.cli.options import (
    SQS_CLIENT_HELP,
    add_global_options,
    checked_sqs_client,
    endpoint_url,
)


@click.group(
    cls=RedriveGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--endpoint-url",
    metavar="URL",
    callback=endpoint_url,
    help="SQS endpoint, e.g. the sandbox's (default: AWS_ENDPOINT_URL, else AWS).",
)
@click.option("--region", metavar="REGION", help="AWS region (default: AWS_REGION / profile).")
@click.option("--profile", metavar="NAME", help="AWS profile (default: AWS_PROFILE).")
@click.option(
    "--config",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="TOML file with the queue families (default: REDRIVE_CONFIG, else the built-in layout).",
)
@click.option(
    "--celery-app",
    metavar="MODULE:ATTR",
    envvar="REDRIVE_CELERY_APP",
    help="The Celery app (as `celery -A`): task routes, registered tasks, settings "
    "(default: REDRIVE_CELERY_APP, else the config's [celery] app).",
)
@click.option(
    "--result-backend",
    metavar="URL",
    envvar="REDRIVE_RESULT_BACKEND",
    help="Celery's result backend, read-only: why tasks failed, and which already "
    "succeeded (redis://..., db+sqlite:///...; env REDRIVE_RESULT_BACKEND; "
    "config [celery] result_backend).",
)
@click.option(
    "--sqs-client",
    metavar="botocore|lean",
    envvar="REDRIVE_SQS_CLIENT",
    help=SQS_CLIENT_HELP,
)
@click.option(
    "--broker",
    metavar="URL",
    envvar="REDRIVE_BROKER",
    help="The broker: amqp://USER:PASS@HOST:PORT/VHOST (also amqps://, pyamqp://) for "
    "RabbitMQ; none or sqs:// for SQS (env REDRIVE_BROKER; config [broker] url; else "
    "--celery-app's broker_url).",
)
@click.option(
    "--rabbitmq-api",
    metavar="URL",
    envvar="REDRIVE_RABBITMQ_API",
    help="RabbitMQ's management API (default http://HOST:15672 with the broker URL's "
    "credentials; env REDRIVE_RABBITMQ_API; config [broker] rabbitmq_api).",
)
@click.option(
    "--allow-delivery-limit",
    is_flag=True,
    help="Receive from a DLQ that has a delivery limit of its own (a RabbitMQ quorum DLQ's "
    "x-delivery-limit, an SQS DLQ's RedrivePolicy) though every read counts toward it; "
    "without it such a DLQ is refused (exit 2).",
)
@click.version_option(__version__, prog_name="redrive")
@click.pass_context
def cli(
    ctx: click.Context,
    endpoint_url: str | None,
    region: str | None,
    profile: str | None,
    config: str | None,
    celery_app: str | None,
    result_backend: str | None,
    sqs_client: str | None,
    broker: str | None,
    rabbitmq_api: str | None,
    allow_delivery_limit: bool,
) -> None:
    """Drain Amazon SQS (and RabbitMQ) dead-letter queues full of Celery tasks, safely.

    TARGET is a family name (checkout, default, progress in the built-in layout), a queue
    name or a queue URL; a source queue stands for its DLQ. Commands that change anything
    are dry runs unless given --execute.
    """
    ctx.obj = Context(AwsSettings(endpoint_url, region, profile), config, celery_app=celery_app)
    ctx.obj.celery_app_from_env = (
        ctx.get_parameter_source("celery_app") is click.core.ParameterSource.ENVIRONMENT
    )
    ctx.obj.broker_option = broker or None
    ctx.obj.rabbitmq_api_option = rabbitmq_api or None
    ctx.obj.allow_delivery_limit = allow_delivery_limit
    ctx.obj.result_backend = result_backend or None
    ctx.obj.result_backend_given = (
        ctx.get_parameter_source("result_backend") is click.core.ParameterSource.COMMANDLINE
    )
    if ctx.get_parameter_source("sqs_client") is click.core.ParameterSource.ENVIRONMENT:
        # Checked when a broker is opened: a --sqs-client after the command overrides it.
        ctx.obj.sqs_client_env = sqs_client
    else:
        ctx.obj.sqs_client = checked_sqs_client(sqs_client)


def main() -> None:
    sys.stdout = console.ClosedPipeStdout(sys.stdout)
    try:
        cli.main(prog_name="redrive", standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        # A second Ctrl-C: stop at once. Leases and the ledger keep what was in flight safe.
        click.echo("\naborted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)


for command in (
    look.status,
    look.inspect,
    look.report,
    look.check,
    move.move,
    replay.replay,
    apply.apply,
    purge.purge,
    purge.archive,
    native.tasks,
    audit.ledger_group,
    audit.audit,
    sandbox.sandbox,
    web.web,
):
    cli.add_command(command)
add_global_options(cli)
