"""The JSON API beside the pages: the same objects as the CLI's ``--json`` (redrive.web.reads),
described by the OpenAPI document at ``/api/openapi.json`` (redrive.web.openapi)."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from redrive.errors import RedriveError, UsageProblem
from redrive.web import reads
from redrive.web.filters import filters_of
from redrive.web.openapi import document
from redrive.web.views import console_of, require


def routes() -> list[BaseRoute]:
    return [
        Route("/api/openapi.json", openapi),
        Route("/api/status", status),
        Route("/api/overview", overview),
        Route("/api/dlq/{target:path}", dlq),
        Route("/api/runs", runs),
    ]


def _error(exc: RedriveError) -> JSONResponse:
    return JSONResponse(
        {"error": str(exc)}, status_code=400 if isinstance(exc, UsageProblem) else 502
    )


async def openapi(request: Request) -> Response:
    return JSONResponse(document())


async def status(request: Request) -> Response:
    require(request)
    try:
        return JSONResponse(await run_in_threadpool(reads.status_json, console_of(request)))
    except RedriveError as exc:
        return _error(exc)


async def overview(request: Request) -> Response:
    require(request)
    try:
        return JSONResponse(await run_in_threadpool(reads.overview_json, console_of(request)))
    except RedriveError as exc:
        return _error(exc)


async def dlq(request: Request) -> Response:
    require(request)
    console = console_of(request)
    try:
        filters = filters_of(request.query_params)
        scan_request = filters.request(request.path_params["target"])
    except RedriveError as exc:
        return _error(exc)
    outcome = await run_in_threadpool(console.source.scan, scan_request)
    return JSONResponse(reads.dlq_json(outcome))


async def runs(request: Request) -> Response:
    require(request)
    try:
        return JSONResponse(await run_in_threadpool(reads.runs_json, console_of(request)))
    except RedriveError as exc:
        return _error(exc)
