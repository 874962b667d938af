"""The console's ASGI app: :func:`create_app` puts the pages, the JSON API, the actions and
the static files behind one middleware that names who asks and adds the security headers.

Starlette rather than FastAPI: the core already returns the CLI's ``--json`` objects as
plain dicts; FastAPI would want a pydantic model of each (a second model of the data) to
describe them, where an OpenAPI document written beside those shapes (redrive.web.openapi)
says the same with one less dependency, and Starlette is what FastAPI runs on anyway."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from http.cookies import CookieError, SimpleCookie
from urllib.parse import quote

from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from redrive.web import actions, api, pages
from redrive.web.console import Console
from redrive.web.security import (
    SECURITY_HEADERS,
    SESSION_COOKIE,
    new_session,
    peer_of,
    person_of,
    read_session,
    session_cookie,
    sign_session,
)
from redrive.web.views import SESSION_CHANGED, STATIC, render

#: Paths anyone may open: signing in, the style sheet and script, the API's description.
PUBLIC = ("/login", "/static/", "/healthz", "/api/openapi.json")


def create_app(console: Console) -> Starlette:
    routes: list[BaseRoute] = [
        *pages.routes(),
        *api.routes(),
        *actions.routes(),
        Mount("/static", app=StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_error},  # type: ignore[dict-item]
        lifespan=_lifespan(console),
    )
    app.state.console = console
    app.add_middleware(ConsoleMiddleware, console=console)
    return app


def _lifespan(console: Console) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            # The server stops: scans give back what they hold, as Ctrl-C stops the CLI's.
            console.close()

    return lifespan


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code)
    return render(
        request,
        "error.html",
        {"status": exc.status_code, "detail": exc.detail},
        status=exc.status_code,
    )


class ConsoleMiddleware:
    """Names who asks (a trusted proxy's header, the signed session, or the local user on
    a console without sign-in), sends whoever is no one to the login page (401 on the API),
    and adds the security headers and the session cookie to every response."""

    def __init__(self, app: ASGIApp, console: Console) -> None:
        self.app = app
        self.console = console

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        settings = self.console.settings
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        client = scope.get("client")
        peer = peer_of(
            client[0] if client else None,
            scope.get("scheme", "http"),
            headers,
            settings.trusted_proxies,
        )
        now = self.console.clock()
        session = read_session(
            _cookie(headers.get("cookie")),
            settings.secret,
            now=now,
            max_age=settings.session_seconds,
        )
        scope[SESSION_CHANGED] = session is None
        scope["redrive.session"] = session if session is not None else new_session(now)
        scope["redrive.peer"] = peer
        person = person_of(
            settings, peer, headers, scope["redrive.session"], self.console.local_user
        )
        scope["redrive.person"] = person
        path: str = scope["path"]
        if person is None and not path.startswith(PUBLIC):
            response = _sign_in_first(path, scope.get("query_string", b""))
            await response(scope, receive, self._sending(scope, send, peer.https))
            return
        await self.app(scope, receive, self._sending(scope, send, peer.https))

    def _sending(self, scope: Scope, send: Send, https: bool) -> Send:
        settings = self.console.settings

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS:
                    if name not in headers and not (
                        name == "cache-control" and scope["path"].startswith("/static/")
                    ):
                        headers[name] = value
                if scope.get(SESSION_CHANGED):
                    signed = sign_session(scope["redrive.session"], settings.secret)
                    headers.append(
                        "set-cookie",
                        session_cookie(signed, secure=https, max_age=settings.session_seconds),
                    )
            await send(message)

        return sending


def _cookie(header: str | None) -> str | None:
    if not header:
        return None
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return None
    morsel = jar.get(SESSION_COOKIE)
    return morsel.value if morsel is not None else None


def _sign_in_first(path: str, query: bytes) -> Response:
    if path.startswith("/api/"):
        return JSONResponse({"error": "sign in first"}, status_code=401)
    back = path + ("?" + query.decode("latin-1") if query else "")
    return RedirectResponse(f"/login?next={quote(back, safe='')}", status_code=303)
