"""The console's actions (issue 41, item 3): move (by task, age, ``--where`` or messages
ticked; ``--route``, ``--to``), purge (an archive required) and repair (``--set``,
``--unset``, ``--rename``, ``--clear-expires``), each in two steps: a dry run whose plan is
shown (items, targets, digests, the edits' before/after), then exactly that plan executed
(redrive.web.acting: ``apply``, which leaves a message changed since), with the DLQ's name
typed for a purge and a big move. An operation runs in a thread of the server's, outlives
the tab, is stopped from its page (holds released, summary kept) and with the server. A plan
can be downloaded (``redrive apply`` takes it) and one made by the CLI uploaded.

Only with ``--allow-actions`` and for an operator; every state-changing request carries its
CSRF token (redrive.web.views: ``require``, ``checked_form``) and is audited with the person
and their address before it starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, TypeVar
from urllib.parse import quote, urlencode

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, QueryParams, UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from redrive.durations import parse_duration
from redrive.errors import RedriveError
from redrive.state_dir import default_state_dir
from redrive.web import acting
from redrive.web.console import Console
from redrive.web.filters import DlqFilters, kept_filters
from redrive.web.operations import Operations, PlanStore
from redrive.web.security import Person
from redrive.web.users import Role
from redrive.web.views import checked_form, console_of, render, require

T = TypeVar("T")


def _found(lookup: Callable[[], T]) -> T:
    """What ``lookup`` finds; a plan, replay or operation it cannot find is a 404."""
    try:
        return lookup()
    except RedriveError as exc:
        raise HTTPException(404, str(exc)) from None


MAX_PLAN_BYTES = 64 * 1024 * 1024


def actions_allowed(request: Request) -> None:
    """403 unless the console was started with --allow-actions."""
    if not console_of(request).settings.allow_actions:
        raise HTTPException(403, "this console is read-only: start it with --allow-actions")


def operations_of(console: Console) -> Operations:
    ops = console.extras.get("operations")
    if ops is None:
        ops = console.extras.setdefault("operations", Operations(console.clock))
    assert isinstance(ops, Operations)
    return ops


def plans_of(console: Console) -> PlanStore:
    store = console.extras.get("plans")
    if store is None:
        store = console.extras.setdefault("plans", PlanStore(default_state_dir() / "web-plans"))
    assert isinstance(store, PlanStore)
    return store


def routes() -> list[BaseRoute]:
    return [
        Route("/actions/new", new_action, name="new_action"),
        Route("/actions/dry-run", dry_run, methods=["POST"]),
        Route("/actions/upload", upload, methods=["POST"]),
        Route("/actions/replay", replay_dry_run, methods=["POST"]),
        Route("/actions/replays/{replay_id}", replay_page, name="replay"),
        Route("/actions/replays/{replay_id}/execute", replay_execute, methods=["POST"]),
        Route("/actions/plans/{plan_id}", plan_page, name="plan"),
        Route("/actions/plans/{plan_id}/download", download),
        Route("/actions/plans/{plan_id}/execute", execute, methods=["POST"]),
        Route("/actions/operations", operations_list, name="console_operations"),
        Route("/actions/operations/{op_id}", operation_page, name="operation"),
        Route("/actions/operations/{op_id}/stop", stop, methods=["POST"]),
    ]


async def _acting(request: Request) -> tuple[Person, FormData]:
    actions_allowed(request)
    person = require(request, Role.OPERATOR)
    return person, await checked_form(request)


def _viewing(request: Request) -> Console:
    actions_allowed(request)
    require(request)
    return console_of(request)


async def new_action(request: Request) -> Response:
    _viewing(request)
    require(request, Role.OPERATOR)
    target = request.query_params.get("target", "")
    ticked = request.query_params.getlist("message_id")
    context = {"target": target, "ticked": ticked, "error": None}
    return render(request, "actions/new.html", context | _kept(request.query_params, target))


def _view(given: QueryParams | FormData) -> DlqFilters:
    """The DLQ page's filters an action started from, carried to each next page and
    redirect: a form's ``view`` field, or a page's URL (a form's own fields are its
    selection, never the view)."""
    view = given.get("view")
    if isinstance(view, str):
        return kept_filters(QueryParams(view))
    return kept_filters(given) if isinstance(given, QueryParams) else DlqFilters()


def _kept(given: QueryParams | FormData, target: str) -> dict[str, Any]:
    """The view carried along, and the link back to the DLQ's page as it was."""
    view = _view(given)
    return {"view": view, "back": f"/dlq/{quote(target, safe='')}{view.query()}"}


def _lines(form: FormData, name: str) -> tuple[str, ...]:
    value = form.get(name)
    text = value if isinstance(value, str) else ""
    return tuple(line.strip() for line in text.splitlines() if line.strip())


def _text(form: FormData, name: str) -> str | None:
    value = form.get(name)
    return value.strip() or None if isinstance(value, str) else None


def action_form(form: FormData) -> acting.ActionForm:
    """The form's fields as an action (a bad duration or expression: a RedriveError)."""
    older = _text(form, "older_than")
    kind: Literal["move", "purge"] = "purge" if form.get("kind") == "purge" else "move"
    return acting.ActionForm(
        kind=kind,
        target=_text(form, "target") or "",
        tasks=tuple(t for line in _lines(form, "tasks") for t in line.split(",") if t.strip()),
        older_than=parse_duration(older) if older else None,
        where=_lines(form, "where"),
        message_ids=(*_lines(form, "message_ids"), *form.getlist("message_id")),  # type: ignore[arg-type]
        route="task" if form.get("route") == "task" else "source",
        to=_text(form, "to"),
        archive=_text(form, "archive"),
        sets=_lines(form, "set"),
        unsets=_lines(form, "unset"),
        renames=_lines(form, "rename"),
        clear_expires=form.get("clear_expires") == "on",
    )


async def dry_run(request: Request) -> Response:
    person, form = await _acting(request)
    console = console_of(request)
    try:
        action = action_form(form)
        plan_id = await run_in_threadpool(
            acting.dry_run, console.workspace, plans_of(console), action, person
        )
    except (RedriveError, ValueError) as exc:
        target = str(form.get("target", ""))
        context = {"target": target, "ticked": [], "error": str(exc)} | _kept(form, target)
        return render(request, "actions/new.html", context, status=400)
    view = _view(form)
    return RedirectResponse(f"/actions/plans/{plan_id}{view.query()}", status_code=303)


async def upload(request: Request) -> Response:
    """A plan made by the CLI (``--plan-out``), kept to be shown and executed here."""
    _, form = await _acting(request)
    given = form.get("plan")
    if not isinstance(given, UploadFile):
        raise HTTPException(400, "choose a plan file to upload")
    content = await given.read(MAX_PLAN_BYTES + 1)
    await given.close()
    if len(content) > MAX_PLAN_BYTES:
        raise HTTPException(413, "the plan file is too big")
    try:
        plan_id = await run_in_threadpool(plans_of(console_of(request)).upload, content)
    except RedriveError as exc:
        raise HTTPException(400, str(exc)) from None
    return RedirectResponse(f"/actions/plans/{plan_id}", status_code=303)


async def plan_page(request: Request) -> Response:
    console = _viewing(request)
    plan_id = request.path_params["plan_id"]
    store = plans_of(console)
    plan = _found(lambda: store.read(plan_id))
    context: dict[str, Any] = {
        "plan_id": plan_id,
        "plan": plan,
        "items": plan.items[:500],
        "dry_run": store.dry_run(plan_id),
        "confirm": acting.confirmation_needed(plan),
        "error": request.query_params.get("error"),
        **_kept(request.query_params, plan.target),
    }
    return render(request, "actions/plan.html", context)


async def download(request: Request) -> Response:
    console = _viewing(request)
    plan_id = request.path_params["plan_id"]
    path = _found(lambda: plans_of(console).path(plan_id))
    if not path.exists():
        raise HTTPException(404, f"no such plan: {plan_id}")
    return Response(
        path.read_bytes(),
        media_type="application/json",
        headers={"Content-Disposition": f'attachment; filename="redrive-plan-{plan_id}.json"'},
    )


async def execute(request: Request) -> Response:
    person, form = await _acting(request)
    console = console_of(request)
    plan_id = request.path_params["plan_id"]
    try:
        plan = plans_of(console).read(plan_id)
        apply = await run_in_threadpool(acting.plan_request, console.workspace, plan)
    except RedriveError as exc:
        raise HTTPException(400, str(exc)) from None
    view = _view(request.query_params)
    if not acting.confirmed(plan, apply.target, str(form.get("confirm", ""))):
        why = f"type the DLQ's name ({apply.target.dlq.name}) to confirm"
        query = urlencode([("error", why), *view.pairs()])
        return RedirectResponse(f"/actions/plans/{plan_id}?{query}", status_code=303)
    details = {"plan": plan_id, "kind": plan.kind, "dlq": plan.dlq_url, "items": len(plan.items)}
    await run_in_threadpool(console.audit, person, "apply", details)
    op = operations_of(console).start(
        plan_id=plan_id,
        kind=plan.kind,
        target=plan.target,
        person=person,
        work=lambda stop, observer: acting.execute(
            console.workspace, apply, person, plan_id, stop, observer
        ),
    )
    return RedirectResponse(f"/actions/operations/{op.id}{view.query()}", status_code=303)


async def operations_list(request: Request) -> Response:
    """This console's operations, running and finished (the ledger's runs are /operations)."""
    console = _viewing(request)
    ops = [op.to_json() for op in operations_of(console).all()]
    return render(request, "actions/operations.html", {"ops": ops})


async def operation_page(request: Request) -> Response:
    console = _viewing(request)
    op = _found(lambda: operations_of(console).get(request.path_params["op_id"]))
    context = {"op": op.to_json(), **_kept(request.query_params, op.target)}
    return render(request, "actions/operation.html", context)


async def stop(request: Request) -> Response:
    person, _ = await _acting(request)
    console = console_of(request)
    op_id = request.path_params["op_id"]
    op = _found(lambda: operations_of(console).get(op_id))
    await run_in_threadpool(console.audit, person, "stop", {"operation": op.id, "plan": op.plan_id})
    operations_of(console).stop(op.id)
    view = _view(request.query_params)
    return RedirectResponse(f"/actions/operations/{op.id}{view.query()}", status_code=303)


# -- replay an archive ------------------------------------------------------------------------


def replay_form(form: FormData) -> acting.ReplayForm:
    return acting.ReplayForm(
        source=_text(form, "source") or "",
        to=_text(form, "to"),
        tasks=tuple(t for line in _lines(form, "tasks") for t in line.split(",") if t.strip()),
        where=_lines(form, "where"),
    )


async def replay_dry_run(request: Request) -> Response:
    person, form = await _acting(request)
    console = console_of(request)
    asked = replay_form(form)
    try:
        result = await run_in_threadpool(acting.replay_dry_run, console.workspace, asked, person)
    except RedriveError as exc:
        context = {"target": "", "ticked": [], "error": str(exc)}
        return render(request, "actions/new.html", context, status=400)
    replay_id = plans_of(console).keep_replay(asked.to_json(), result)
    return RedirectResponse(f"/actions/replays/{replay_id}", status_code=303)


async def replay_page(request: Request) -> Response:
    console = _viewing(request)
    replay_id = request.path_params["replay_id"]
    data = _found(lambda: plans_of(console).replay(replay_id))
    return render(request, "actions/replay.html", {"replay_id": replay_id, **data})


async def replay_execute(request: Request) -> Response:
    person, _ = await _acting(request)
    console = console_of(request)
    replay_id = request.path_params["replay_id"]
    asked = acting.ReplayForm(
        **_tuples(_found(lambda: plans_of(console).replay(replay_id))["form"])
    )
    await run_in_threadpool(
        console.audit, person, "replay", {"replay": replay_id, **asked.to_json()}
    )
    op = operations_of(console).start(
        plan_id=replay_id,
        kind="replay",
        target=asked.source,
        person=person,
        work=lambda stop, observer: acting.execute_replay(
            console.workspace, asked, person, stop, observer
        ),
    )
    return RedirectResponse(f"/actions/operations/{op.id}", status_code=303)


def _tuples(form: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if isinstance(v, list) else v for k, v in form.items()}
