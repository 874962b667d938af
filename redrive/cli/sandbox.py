"""``sandbox``: a local SQS with the families and seeded DLQs (moto, an optional dependency)."""

from __future__ import annotations

import sys
from typing import Any

import click

from redrive.cli.console import interruptible
from redrive.cli.context import Context, core_errors, fail, pass_ctx

# -- sandbox ----------------------------------------------------------------------------------


@click.command(short_help="Run a local SQS (moto) with the families and seeded DLQs.")
@click.option("--port", type=click.IntRange(0, 65535), default=4566, show_default=True)
@click.option(
    "--messages",
    "per_family",
    type=click.IntRange(0, 10_000),
    default=40,
    show_default=True,
    help="Messages to dead-letter into each family's DLQ.",
)
@click.option(
    "--seed",
    type=click.IntRange(0),
    default=None,
    help="Draw the same tasks as an earlier start (default: new task ids every start).",
)
@click.option(
    "--keep-state",
    is_flag=True,
    help="Keep the sandbox's state directory (ledger, audit trail) when it stops.",
)
@click.option("--serial", is_flag=True, help="Serve one request at a time (for concurrency tests).")
@click.option(
    "--broker",
    "broker_kind",
    type=click.Choice(["sqs", "rabbitmq"]),
    default="sqs",
    show_default=True,
    help="sqs: moto on --port; rabbitmq: a private node of Debian's rabbitmq-server "
    "(free loopback ports, its own folder), DLQs filled by real dead-lettering.",
)
@click.option(
    "--queue-type",
    type=click.Choice(["classic", "quorum"]),
    default="classic",
    show_default=True,
    help="RabbitMQ only: the type of the queues and DLQs.",
)
@pass_ctx
def sandbox(
    ctx: Context,
    port: int,
    per_family: int,
    seed: int | None,
    keep_state: bool,
    serial: bool,
    broker_kind: str,
    queue_type: str,
) -> None:
    """Run a local SQS (moto) on 127.0.0.1 with the families, their DLQs and sample tasks;
    or, with --broker rabbitmq, a private RabbitMQ node on loopback.

    It prints the environment to export (with a fresh REDRIVE_STATE_DIR of its own), then
    runs until stopped (Ctrl-C).
    """
    if broker_kind == "rabbitmq":
        if serial:
            raise click.UsageError("--serial is the SQS sandbox's (moto's server)")
        rabbitmq_sandbox(ctx, per_family, seed, keep_state, queue_type)
        return
    try:
        from redrive import sandbox as sandbox_module
    except ImportError as exc:  # moto is an optional dependency
        fail(f"the sandbox needs moto: pip install 'redrive[sandbox]' ({exc})")

    def ready(server: Any, seeded: list[Any]) -> None:
        for line in sandbox_module.export_lines(server):
            click.echo(line)
        for line in sandbox_module.seeded_lines(server, seeded):
            click.echo(line, err=True)
        removes = "" if keep_state else " and removes its state directory"
        click.echo(f"# sandbox ready; Ctrl-C stops it{removes}", err=True)
        sys.stdout.flush()

    with core_errors(), interruptible("stopping the sandbox") as stop:
        try:
            kept = sandbox_module.run(
                port,
                ctx.layout,
                per_family=per_family,
                serial=serial,
                seed=seed,
                keep_state=keep_state,
                on_ready=ready,
                stop=stop,
            )
        except OSError as exc:
            fail(f"cannot listen on 127.0.0.1:{port} ({exc.strerror}): pick another --port")
        except ValueError as exc:
            fail(f"cannot build the sandbox layout: {exc}")
    if kept is not None:
        click.echo(f"# the sandbox's ledger and audit trail stay in {kept}", err=True)


def rabbitmq_sandbox(
    ctx: Context, per_family: int, seed: int | None, keep_state: bool, queue_type: str
) -> None:
    """``sandbox --broker rabbitmq``: a private node, stopped by PID when the command ends."""
    try:
        from redrive.sandbox import rabbitmq_rehearsal
    except ImportError as exc:  # py-amqp is an optional dependency
        fail(f"the RabbitMQ sandbox needs py-amqp: pip install 'redrive[rabbitmq]' ({exc})")

    def ready(running: Any) -> None:
        for line in running.export_lines():
            click.echo(line)
        for line in running.seeded_lines():
            click.echo(line, err=True)
        removes = "" if keep_state else " and removes its state directory"
        click.echo(f"# sandbox ready; Ctrl-C stops the node{removes}", err=True)
        sys.stdout.flush()

    with core_errors(), interruptible("stopping the sandbox") as stop:
        kept = rabbitmq_rehearsal.run_rabbitmq(
            ctx.layout,
            per_family=per_family,
            seed=seed,
            keep_state=keep_state,
            queue_type="quorum" if queue_type == "quorum" else "classic",
            on_ready=ready,
            stop=stop,
        )
    if kept is not None:
        click.echo(f"# the sandbox's ledger and audit trail stay in {kept}", err=True)
