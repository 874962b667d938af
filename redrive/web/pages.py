"""The console's pages: overview, a DLQ, a message, operations; signing in and out. Each
is rendered on the server from :mod:`redrive.web.reads` (the CLI's views) and works without
JavaScript."""

from __future__ import annotations

from urllib.parse import quote, urlsplit

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from redrive.errors import RedriveError
from redrive.operations.resolve import Choices
from redrive.web import reads
from redrive.web.actions import actions_allowed
from redrive.web.charts import timeline_chart
from redrive.web.filters import DlqFilters, filters_of
from redrive.web.paging import page_of
from redrive.web.scans import ScanOutcome, status_of
from redrive.web.security import new_session
from redrive.web.users import Role
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
        Route("/dlq/{target}", dlq_page, name="dlq"),
        Route("/dlq/{target}/message/{message_id:path}", message_page, name="message"),
        Route("/dlq/{target}/reveal/{message_id:path}", reveal, methods=["POST"]),
        Route("/dlq/{target}/scan", scan_now, methods=["POST"]),
        Route("/operations", operations_page, name="operations"),
        Route("/operations/live", operations_live),
        Route("/operations/resolve", resolve, methods=["POST"]),
        Route("/login", login_page, methods=["GET"], name="login"),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"], name="logout"),
        Route("/healthz", healthz),
    ]


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok\n")


def _failed(request: Request, exc: RedriveError) -> Response:
    status = status_of(exc)
    return render(request, "error.html", {"status": status, "detail": str(exc)}, status=status)


async def overview(request: Request) -> Response:
    require(request)
    try:
        data = await run_in_threadpool(reads.overview_json, console_of(request))
    except RedriveError as exc:
        return _failed(request, exc)
    return render(request, "overview.html", {"data": data})


async def scan_now(request: Request) -> Response:
    """A new scan of one DLQ now, not at the next --refresh: a read the broker counts, so an
    operator's to ask for (a POST with its CSRF token); then its page."""
    require(request, Role.OPERATOR)
    await checked_form(request)
    try:
        filters = filters_of(request.query_params)
        await _scan(request, filters, fresh=True)
    except RedriveError as exc:
        return _failed(request, exc)
    target = request.path_params["target"]
    return RedirectResponse(f"/dlq/{quote(target, safe='')}{filters.query()}", status_code=303)


async def _scan(request: Request, filters: DlqFilters, *, fresh: bool = False) -> ScanOutcome:
    scan_request = filters.request(request.path_params["target"])
    return await run_in_threadpool(console_of(request).source.scan, scan_request, fresh=fresh)


async def dlq_page(request: Request) -> Response:
    require(request)
    try:
        filters = filters_of(request.query_params)
        ask = page_of(request.query_params)
        outcome = await _scan(request, filters)
    except RedriveError as exc:
        return _failed(request, exc)
    # A page of the spool: a few rows of a file, off the event loop all the same.
    data = await run_in_threadpool(reads.dlq_json, outcome, filters, ask)
    groups = [g for g in (data["inspect"] or {}).get("groups", []) if filters.selects(g["task"])]
    return render(
        request,
        "dlq.html",
        {
            "target": request.path_params["target"],
            "filters": filters,
            "data": data,
            "groups": groups,
            "messages": data["messages"],
            "paging": data["paging"],
            "chart": timeline_chart(groups),
        },
        status=outcome.status if outcome.result is None else 200,
    )


async def _message(request: Request, *, revealed: bool) -> Response:
    try:
        filters = filters_of(request.query_params)
        outcome = await _scan(request, filters)
    except RedriveError as exc:
        return _failed(request, exc)
    message_id = request.path_params["message_id"]
    data = reads.message_json(outcome, message_id, revealed=revealed)
    if data is None:
        detail = outcome.problem or "no such message in the DLQ's last scan (it may have left)"
        raise HTTPException(404, detail)
    if data["revealed"]:
        person = require(request)
        record = data["record"]
        details = {
            "target": request.path_params["target"],
            "dlq": data["dlq"],
            "message_id": message_id,
            "task": record.get("task"),
            "task_id": record.get("id"),
        }
        try:
            await run_in_threadpool(console_of(request).audit, person, "reveal", details)
        except RedriveError as exc:
            # Not audited, not shown: the arguments stay hidden.
            return _failed(request, exc)
    context = {"target": request.path_params["target"], "filters": filters, "data": data}
    context["not_kept"] = reads.NOT_KEPT
    return render(request, "message.html", context)


async def message_page(request: Request) -> Response:
    require(request)
    return await _message(request, revealed=False)


async def reveal(request: Request) -> Response:
    """The message with its arguments, once the reveal is in the audit trail (a POST: it
    writes the audit; its answer is not a URL to share or cache)."""
    require(request)
    await checked_form(request)
    return await _message(request, revealed=True)


async def operations_page(request: Request) -> Response:
    require(request)
    try:
        page = reads.page_number(request.query_params.get("in_doubt_page"))
        data = await run_in_threadpool(
            lambda: reads.operations_json(console_of(request), in_doubt_page=page)
        )
    except RedriveError as exc:
        return _failed(request, exc)
    return render(request, "operations.html", {"data": data, "resolved": None})


async def operations_live(request: Request) -> Response:
    """The live runs' table alone: what console.js polls to keep the operations page
    current (without script, the page's refresh link reloads it all)."""
    require(request)
    try:
        data = await run_in_threadpool(reads.live_runs_json, console_of(request))
    except RedriveError as exc:
        return _failed(request, exc)
    return render(request, "live.html", {"data": data})


async def resolve(request: Request) -> Response:
    """Resolve in-doubt messages by an operator's choice, as ``redrive ledger resolve
    --resend ID --skip ID --execute`` does (what the evidence proves is recorded whatever
    the choice); the choice is audited first, with the person and address."""
    person = require(request, Role.OPERATOR)
    actions_allowed(request)
    form = await checked_form(request)
    chosen = {
        str(name).removeprefix("choice:"): str(value)
        for name, value in form.multi_items()
        if str(name).startswith("choice:")
    }
    choices = Choices(
        resend=frozenset(k for k, v in chosen.items() if v == "resend"),
        skip=frozenset(k for k, v in chosen.items() if v == "skip"),
    )
    console = console_of(request)
    details = {"resend": sorted(choices.resend), "skip": sorted(choices.skip)}
    try:
        await run_in_threadpool(console.audit, person, "ledger resolve", details)
        result = await run_in_threadpool(reads.resolve_json, console, choices)
        data = await run_in_threadpool(reads.operations_json, console)
    except RedriveError as exc:
        return _failed(request, exc)
    return render(request, "operations.html", {"data": data, "resolved": result})


def _next_path(value: str | None) -> str:
    """Where to go after signing in: a path of this console only (never another site)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
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
