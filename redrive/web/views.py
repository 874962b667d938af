"""What every handler shares: the console of the request, who asks, the role and CSRF
checks of a state-changing request, and the templates (Jinja2, autoescaped everywhere:
every value a message carries is text on the page, never markup)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse

from redrive import __version__
from redrive.durations import format_duration, iso_utc
from redrive.web.console import Console
from redrive.web.security import CSRF_FIELD, CSRF_HEADER, Person, csrf_ok
from redrive.web.users import Role

SESSION_CHANGED = "redrive.session_changed"
TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"

ENVIRONMENT = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    # Every template, whatever its name: a value is escaped unless a template says otherwise,
    # and none does for anything a message carries.
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
ENVIRONMENT.filters["iso"] = iso_utc
ENVIRONMENT.filters["duration"] = lambda s: format_duration(s) if s is not None else "-"
ENVIRONMENT.filters["count"] = lambda n: (
    f"{n:,}" if isinstance(n, int) else ("-" if n is None else str(n))
)


def console_of(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


def person_of(request: Request) -> Person | None:
    person: Person | None = request.scope.get("redrive.person")
    return person


def session_of(request: Request) -> dict[str, Any]:
    session: dict[str, Any] = request.scope["redrive.session"]
    return session


def require(request: Request, role: Role = Role.VIEWER) -> Person:
    """Who asks, when they may (401 when no one, 403 when a viewer asks to act)."""
    person = person_of(request)
    if person is None:
        raise HTTPException(401, "sign in first")
    if role is Role.OPERATOR and person.role is not Role.OPERATOR:
        raise HTTPException(403, f"{person.name} is a viewer: acting needs an operator")
    return person


async def checked_form(request: Request) -> FormData:
    """A state-changing request's form, once its CSRF token (the form's field, or the
    X-CSRF-Token header for the JSON API) matches the session's: 403 otherwise."""
    form = await request.form()
    given = request.headers.get(CSRF_HEADER) or form.get(CSRF_FIELD)
    if not csrf_ok(session_of(request), given if isinstance(given, str) else None):
        raise HTTPException(403, "the form's CSRF token is missing or stale: reload the page")
    return form


def render(
    request: Request, template: str, context: dict[str, Any], *, status: int = 200
) -> HTMLResponse:
    console = console_of(request)
    base = {
        "request": request,
        "person": person_of(request),
        "csrf": session_of(request).get(CSRF_FIELD, ""),
        "version": __version__,
        "allow_actions": console.settings.allow_actions,
        "authenticated": console.settings.authenticated,
        "refresh": console.settings.refresh,
    }
    html = ENVIRONMENT.get_template(template).render(base | context)
    return HTMLResponse(html, status_code=status)


def replace_session(request: Request, session: dict[str, Any]) -> None:
    """Give the request's client a new session (signing in or out): a new CSRF token too,
    so a token seen before signing in is worth nothing after."""
    request.scope["redrive.session"] = session
    request.scope[SESSION_CHANGED] = True
