"""The console's actions (move, purge, replay, repair: a dry run whose plan is shown, then
that plan executed exactly, typed confirmation, stop, plan download): filled in by the
actions work; this module is where they plug in.

The contract for what goes here:

- :func:`routes` returns the Starlette routes of the actions (mounted under ``/actions``
  by convention; pages link to ``/actions/...`` only when ``--allow-actions`` is on).
- Every state-changing handler starts with ``person = require(request, Role.OPERATOR)``
  and ``form = await checked_form(request)`` (redrive.web.views): 403 for a viewer, 403
  without the session's CSRF token; and refuses when ``console.settings.allow_actions``
  is off (``actions_allowed`` below).
- Every action is audited with ``console.audit(person, WHAT, details)`` (who, from which
  address, what, on which DLQ) before it starts.
- Templates go in redrive/web/templates/actions/, extending ``base.html``.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import BaseRoute

from redrive.web.views import console_of


def actions_allowed(request: Request) -> None:
    """403 unless the console was started with --allow-actions."""
    if not console_of(request).settings.allow_actions:
        raise HTTPException(403, "this console is read-only: start it with --allow-actions")


def routes() -> list[BaseRoute]:
    """The actions' routes (none yet)."""
    return []
