"""The console's pages: overview, a DLQ, a message, operations; signing in and out. Each
is rendered on the server from :mod:`redrive.web.reads` (the CLI's views) and works without
JavaScript."""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from redrive.errors import RedriveError
from redrive.web import reads
from redrive.web.filters import filters_of
from redrive.web.security import new_session
from redrive.web.views import (
    checked_form,
    console_of,
    render,
    replace_session,
    require,
)


def routes() -> list[BaseRoute]:
    return [
        Route("/", overview, name="overview"),
        Route("/dlq/{target:path}", dlq_page, name="dlq"),
        Route("/message/{target}/{message_id:path}", message_page, name="message"),
        Route("/operations", operations_page, name="operations"),
        Route("/login", login_page, methods=["GET"], name="login"),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"], name="logout"),
        Route("/healthz", healthz),
    ]


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok\n")


async def overview(request: Request) -> Response:
    require(request)
    console = console_of(request)
    try:
        data = await run_in_threadpool(reads.overview_json, console)
    except RedriveError as exc:
        return render(request, "error.html", {"status": 502, "detail": str(exc)}, status=502)
    return render(request, "overview.html", {"data": data})


async def dlq_page(request: Request) -> Response:
    require(request)
    console = console_of(request)
    filters = filters_of(request.query_params)
    outcome = await run_in_threadpool(
        console.source.scan, filters.request(request.path_params["target"])
    )
    return render(
        request,
        "dlq.html",
        {
            "target": request.path_params["target"],
            "filters": filters,
            "data": reads.dlq_json(outcome),
        },
    )


async def message_page(request: Request) -> Response:
    require(request)
    raise HTTPException(404, "no such message in the DLQ's last scan")


async def operations_page(request: Request) -> Response:
    require(request)
    console = console_of(request)
    try:
        runs = await run_in_threadpool(reads.runs_json, console)
    except RedriveError as exc:
        return render(request, "error.html", {"status": 502, "detail": str(exc)}, status=502)
    return render(request, "operations.html", {"runs": runs})


def _next_path(value: str | None) -> str:
    """Where to go after signing in: a path of this console only (never another site)."""
    if not value or not value.startswith("/") or value.startswith("//"):
        return "/"
    parts = urlsplit(value)
    return "/" if parts.scheme or parts.netloc else value


async def login_page(request: Request) -> Response:
    return render(
        request,
        "login.html",
        {"next": _next_path(request.query_params.get("next")), "error": None},
    )


async def login(request: Request) -> Response:
    console = console_of(request)
    form = await checked_form(request)
    name = str(form.get("user", ""))
    password = str(form.get("password", ""))
    target = _next_path(str(form.get("next", "/")))
    address = request.scope["redrive.peer"].address
    keys = (f"address:{address}", f"user:{name}")
    wait = console.limiter.wait(*keys)
    if wait > 0:
        context = {"next": target, "error": f"too many failed sign-ins: try again in {wait:.0f} s"}
        return render(request, "login.html", context, status=429)
    users = console.settings.users
    user = await run_in_threadpool(users.authenticate, name, password) if users else None
    if user is None:
        console.limiter.failed(*keys)
        context = {"next": target, "error": "wrong user name or password"}
        return render(request, "login.html", context, status=401)
    session = new_session(console.clock())
    session["user"] = user.name
    replace_session(request, session)
    return RedirectResponse(target, status_code=303)


async def logout(request: Request) -> Response:
    await checked_form(request)
    replace_session(request, new_session(console_of(request).clock()))
    return RedirectResponse("/login", status_code=303)
