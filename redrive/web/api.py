"""The JSON API beside the pages: the same objects as the CLI's ``--json`` (redrive.web.reads),
described by the OpenAPI document at ``/api/openapi.json`` (redrive.web.openapi)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from redrive.errors import RedriveError
from redrive.web import reads
from redrive.web.actions import operations_of
from redrive.web.filters import filters_of
from redrive.web.openapi import document
from redrive.web.paging import page_of
from redrive.web.scans import status_of
from redrive.web.security import CSRF_FIELD
from redrive.web.views import checked_form, console_of, person_of, require, session_of


def routes() -> list[BaseRoute]:
    return [
        Route("/api/openapi.json", openapi),
        Route("/api/session", session),
        Route("/api/status", status),
        Route("/api/overview", overview),
        Route("/api/dlq/{target}", dlq),
        Route("/api/dlq/{target}/messages/{message_id}", message),
        Route("/api/dlq/{target}/messages/{message_id}/reveal", reveal, methods=["POST"]),
        Route("/api/operations", operations),
        Route("/api/operations/{op_id}", operation),
    ]


def _error(exc: RedriveError) -> JSONResponse:
    return JSONResponse({"error": str(exc)}, status_code=status_of(exc))


async def _answer(read: Callable[[], Any]) -> Response:
    try:
        return JSONResponse(await run_in_threadpool(read))
    except RedriveError as exc:
        return _error(exc)


async def openapi(request: Request) -> Response:
    return JSONResponse(document())


async def session(request: Request) -> Response:
    """Who the session is, and the CSRF token the API's POSTs send as X-CSRF-Token."""
    person = require(request)
    return JSONResponse({"person": person.to_json(), "csrf": session_of(request)[CSRF_FIELD]})


async def status(request: Request) -> Response:
    require(request)
    console = console_of(request)
    return await _answer(lambda: reads.status_json(console))


async def overview(request: Request) -> Response:
    require(request)
    console = console_of(request)
    return await _answer(lambda: reads.overview_json(console))


async def operations(request: Request) -> Response:
    require(request)
    console = console_of(request)
    try:
        page = reads.page_number(request.query_params.get("in_doubt_page"))
    except RedriveError as exc:
        return _error(exc)
    return await _answer(lambda: reads.operations_json(console, in_doubt_page=page))


async def operation(request: Request) -> Response:
    """One of this console's operations: its state and its counts so far (after each batch),
    what its page's script polls until it ends."""
    require(request)
    try:
        op = operations_of(console_of(request)).get(request.path_params["op_id"])
    except RedriveError as exc:
        return JSONResponse({"error": str(exc)}, status_code=404)
    return JSONResponse(op.to_json())


async def dlq(request: Request) -> Response:
    require(request)
    console = console_of(request)
    try:
        filters = filters_of(request.query_params)
        ask = page_of(request.query_params)
        scan_request = filters.request(request.path_params["target"])
    except RedriveError as exc:
        return _error(exc)
    outcome = await run_in_threadpool(console.source.scan, scan_request)
    if outcome.result is None and outcome.status != 200:
        return JSONResponse({"error": outcome.problem}, status_code=outcome.status)
    return JSONResponse(await run_in_threadpool(reads.dlq_json, outcome, filters, ask))


async def _message(request: Request, *, revealed: bool) -> Response:
    console = console_of(request)
    try:
        scan_request = filters_of(request.query_params).request(request.path_params["target"])
    except RedriveError as exc:
        return _error(exc)
    outcome = await run_in_threadpool(console.source.scan, scan_request)
    if outcome.result is None and outcome.status != 200:
        return JSONResponse({"error": outcome.problem}, status_code=outcome.status)
    message_id = request.path_params["message_id"]
    data = reads.message_json(outcome, message_id, revealed=revealed)
    if data is None:
        detail = outcome.problem or "no such message in the DLQ's last scan"
        return JSONResponse({"error": detail}, status_code=404)
    if revealed and not data["revealed"]:
        return JSONResponse({"error": reads.NOT_KEPT}, status_code=404)
    if revealed:
        person = person_of(request)
        assert person is not None  # required by the caller
        details = {"target": scan_request.target, "dlq": data["dlq"], "message_id": message_id}
        details |= {"task": data["record"].get("task"), "task_id": data["record"].get("id")}
        try:
            await run_in_threadpool(console.audit, person, "reveal", details)
        except RedriveError as exc:
            return _error(exc)
    return JSONResponse(data)


async def message(request: Request) -> Response:
    require(request)
    return await _message(request, revealed=False)


async def reveal(request: Request) -> Response:
    """The message's arguments, once the reveal is in the audit trail (X-CSRF-Token)."""
    require(request)
    await checked_form(request)
    return await _message(request, revealed=True)
