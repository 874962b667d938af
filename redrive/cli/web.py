"""``redrive web``: the console (redrive.web, the optional ``redrive[web]`` extra), and
``redrive web passwd`` for its users file. The console's modules are imported only when it
starts: the CLI works without the extra."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from redrive.cli.celery_app import known_tasks
from redrive.cli.console import Refused, warn
from redrive.cli.context import Context, core_errors, ledger_uri, pass_ctx
from redrive.cli.options import duration, ledger_option
from redrive.errors import UsageProblem

WEB_EXTRA = "redrive web needs the console's extra: pip install 'redrive[web]'"
SECRET_ENV = "REDRIVE_WEB_SECRET"


def _web_modules() -> Any:
    try:
        import uvicorn  # noqa: F401

        from redrive.web import app
    except ImportError as exc:
        raise click.ClickException(f"{WEB_EXTRA} ({exc})") from None
    return app


@click.group(
    "web",
    invoke_without_command=True,
    short_help="A console in the browser: DLQs, messages, operations.",
)
@click.option(
    "--bind",
    default="127.0.0.1:8080",
    show_default=True,
    metavar="HOST:PORT",
    help="Where to listen; loopback by default (other machines cannot reach it).",
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Let operators move, purge, replay and repair (refused on a non-loopback bind "
    "without --users or --trusted-proxy).",
)
@click.option(
    "--users",
    "users_file",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Users who sign in: NAME:ROLE:HASH lines (redrive web passwd writes them).",
)
@click.option(
    "--trusted-proxy",
    "trusted_proxies",
    multiple=True,
    metavar="CIDR",
    help="A reverse proxy (oauth2-proxy) whose X-Forwarded-User/-Email name the user; "
    "believed only from these addresses (repeatable).",
)
@click.option(
    "--refresh",
    default="60s",
    show_default=True,
    callback=duration,
    metavar="DUR",
    help="Scan each DLQ at most once per DUR, whatever the number of viewers.",
)
@ledger_option
@pass_ctx
@click.pass_context
def web(click_ctx: click.Context, ctx: Context, /, **options: Any) -> None:
    """A console in the browser: every family and DLQ, a DLQ's groups and messages (arguments
    hidden until revealed, and audited), operations and the audit trail; with
    --allow-actions, an operator's moves, purges, replays and repairs."""
    if click_ctx.invoked_subcommand is not None:
        return
    app_module = _web_modules()
    with core_errors():
        settings = _settings(options)
        console = _console(ctx, settings, options.get("ledger"))
    import uvicorn

    from redrive.web.settings import start_lines

    for line in start_lines(settings):
        click.echo(line, err=True)
    uvicorn.run(
        app_module.create_app(console),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        proxy_headers=False,  # the console believes a proxy's headers itself (--trusted-proxy)
        server_header=False,
    )


def _settings(options: dict[str, Any]) -> Any:
    from redrive.web.settings import (
        ConsoleSettings,
        bind_refusal,
        parse_bind,
        parse_network,
    )
    from redrive.web.users import load_users

    host, port = parse_bind(options["bind"])
    users_file = options.get("users_file")
    extra: dict[str, Any] = {}
    if secret := os.environ.get(SECRET_ENV):
        extra["secret"] = secret.encode()
    settings = ConsoleSettings(
        host=host,
        port=port,
        allow_actions=options["allow_actions"],
        users=load_users(Path(users_file)) if users_file else None,
        trusted_proxies=tuple(parse_network(p) for p in options["trusted_proxies"]),
        refresh=options["refresh"],
        **extra,
    )
    refusal = bind_refusal(settings)
    if refusal is not None:
        raise Refused(refusal)
    return settings


def _console(ctx: Context, settings: Any, ledger: str | None) -> Any:
    """The console's state, its workspace resolved from the global options now, in this
    thread (the server's threads open brokers from what is resolved here)."""
    from redrive.web.console import Console
    from redrive.web.shared_scans import SharedScanSource
    from redrive.web.workspace import Workspace

    brokers = ctx.broker_settings
    log = ctx.receive_log()
    workspace = Workspace(
        layout=ctx.layout,
        open_broker=lambda region: brokers.open(ctx.aws, region),
        broker=brokers,
        results=ctx.results(probe=False),
        receive_log=log if not log.problem else None,
        knowledge=known_tasks(ctx),
        ledger_uri=ledger_uri(ctx, ledger),
        allow_delivery_limit=ctx.allow_delivery_limit,
        client_factory=ctx.aws.client,
    )
    # One scan per DLQ and --refresh interval for every viewer (issue 41, item 4).
    return Console(settings, workspace, scans=SharedScanSource(workspace, refresh=settings.refresh))


@web.command("passwd", short_help="Add a user to a users file, or set their password or role.")
@click.argument("user")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--role",
    type=click.Choice(["viewer", "operator"]),
    default="viewer",
    show_default=True,
    help="operator: may act (with --allow-actions); viewer: reads only.",
)
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin's first line.")
def passwd(user: str, file: str, role: str, password_stdin: bool) -> None:
    """Add USER to FILE (made if missing, mode 0600), or set their password and role. The
    password is asked twice (or read from stdin), and stored as an scrypt hash."""
    from redrive.web.users import User, check_name, hash_password, role_named, set_password

    with core_errors():
        check_name(user)
        if password_stdin:
            password = sys.stdin.readline().rstrip("\r\n")
        else:
            password = click.prompt("password", hide_input=True, confirmation_prompt=True)
        if not password:
            raise UsageProblem("an empty password: give one")
        set_password(Path(file), User(user, role_named(role), hash_password(password)))
    click.echo(f"{user} ({role}) written to {file}", err=True)
    if os.name == "posix" and Path(file).stat().st_mode & 0o077:
        warn(f"{file} is readable by others: chmod 600 {file}")
