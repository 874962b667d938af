"""What every command that runs an operation shares: the coordinator's :class:`Setup` made
from the command's :class:`Context`, its progress line as the run's observer, Ctrl-C as its
stop signal, and the summary a run stopped partway by an error prints before the error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import click

from redrive.cli.console import (
    ProgressDisplay,
    command_line,
    emit_json,
    interruptible,
    output_width,
)
from redrive.cli.context import Context, audit_identity, core_errors, ledger_uri
from redrive.cli.processes import run_wiring
from redrive.errors import RedriveError
from redrive.operations.coordinator import Caller, Outcome, Request, Setup, run_operation
from redrive.render.tables import fit_text
from redrive.runs.lifecycle import Finished

R = TypeVar("R")
Q = TypeVar("Q", bound=Request[Any])


def setup_of(ctx: Context) -> Setup:
    """What the command's runs run with: its brokers, clients and result backend."""
    return Setup(
        brokers=ctx.broker_for,
        s3_client=ctx.s3_client,
        ledger_clients=ctx.aws.client,
        receive_log=ctx.receive_log,
        results=ctx.results,
        identity=lambda: audit_identity(ctx),
        wiring=lambda dlq, ledger, options: run_wiring(ctx, dlq, ledger, options),
    )


def prepared(ctx: Context, request: Q) -> Q:
    """The request with what must come before a confirmation done (a move's result backend,
    checked to answer)."""
    with core_errors():
        return cast(Q, request.prepare(setup_of(ctx)))


def run_request(
    ctx: Context,
    request: Request[R],
    *,
    ledger: str | None,
    display: ProgressDisplay,
    as_json: bool,
    summary: Callable[[Any, int | None], str],
    kinds: type | tuple[type, ...],
    refuse: Callable[[RedriveError], None] = lambda error: None,
) -> Outcome[R]:
    """Run ``request`` once through the coordinator: ``display`` as its observer, the first
    Ctrl-C as its stop. A run an error stopped partway prints ``summary`` of what it had
    done (its partial result, of one of ``kinds``: text, or JSON with its ``error``), then
    the error's one line; ``refuse``: what
    turns an error into the command's own refusal first (a damaged archive)."""
    with core_errors(), interruptible() as stop:
        outcome = run_operation(
            request,
            setup=setup_of(ctx),
            ledger=ledger_uri(ctx, ledger),
            caller=Caller.local(command_line()),
            observer=display,
            stop=stop,
        )
    display.done()
    if outcome.error is not None:
        refuse(outcome.error)
        with core_errors():
            if isinstance(outcome.error.partial, kinds):
                show_partial(outcome.error.partial, as_json, summary)
            raise outcome.error
    return outcome


def show_partial(partial: Any, as_json: bool, summary: Callable[[Any, int | None], str]) -> None:
    """What a run had done when an error stopped it, when it had begun (``acted``)."""
    if partial is None or not getattr(partial, "acted", True):
        return
    if as_json:
        emit_json(cast(Finished, partial).to_json())
    else:
        width = output_width()
        click.echo(fit_text(summary(partial, width), width))
