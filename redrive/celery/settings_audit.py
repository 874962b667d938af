"""``check --celery``: the Celery settings that decide whether a failing task reaches a DLQ at
all, and whether every deploy fills one. Each finding names the setting, its value and the
consequence. Settings are read per task as a worker binds them (a task's own option, else
the app's setting), so a finding names every task it concerns, or the app as a whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redrive.broker.base import queue_name
from redrive.celery.routes import AppRoutes
from redrive.celery.streams import users_code
from redrive.config import Family, Layout

#: kombu's SQS transport when ``broker_transport_options`` sets no ``visibility_timeout``.
KOMBU_SQS_VISIBILITY_TIMEOUT = 1800
MAX_NAMED = 5


@dataclass(frozen=True, slots=True)
class SettingFinding:
    setting: str
    value: str
    problem: str
    """The consequence, and whom it concerns."""


@dataclass(frozen=True, slots=True)
class _Task:
    """A task's settings as a worker applies them."""

    name: str
    acks_late: bool
    acks_on_failure: bool
    lost_redelivered: bool
    reject_on_worker_lost: bool
    time_limit: float | None
    retry_countdown: tuple[float, str]
    """The longest a retry waits before it runs again, and the setting that says so."""


def format_duration(seconds: float) -> str:
    return f"{seconds:g}s"


def _user_tasks(app: Any) -> list[_Task]:
    conf = app.conf
    out = []
    for name in sorted(app.tasks):
        if name.startswith("celery."):
            continue
        task = app.tasks[name]
        on_failure = getattr(task, "acks_on_failure", None)
        if on_failure is None:
            on_failure = getattr(task, "acks_on_failure_or_timeout", None)
        if on_failure is None:
            on_failure = conf.get("task_acks_on_failure_or_timeout", True)
        countdown = (float(getattr(task, "default_retry_delay", 0) or 0), "default_retry_delay")
        if getattr(task, "retry_backoff", False):
            backoff = float(getattr(task, "retry_backoff_max", 0) or 0)
            countdown = max(countdown, (backoff, "retry_backoff_max"))
        out.append(
            _Task(
                name=name,
                acks_late=bool(task.acks_late),
                acks_on_failure=bool(on_failure),
                lost_redelivered=bool(task.reject_on_worker_lost)
                or bool(getattr(task, "retry_on_worker_lost", False)),
                reject_on_worker_lost=bool(task.reject_on_worker_lost),
                time_limit=_time_limit(task, conf),
                retry_countdown=countdown,
            )
        )
    return out


def _time_limit(task: Any, conf: Any) -> float | None:
    """A task's hard time limit: its own, else the app's ``task_time_limit`` (as the worker
    applies it). Celery 5.7 gives a task the app's value; 5.5 and 5.6 leave its attribute
    None, so reading only that saw no limit where the app sets one."""
    limit = task.time_limit if task.time_limit is not None else conf.get("task_time_limit")
    return float(limit) if limit else None


def audit_app(
    app: Any,
    routes: AppRoutes,
    layout: Layout,
    dlqs: Mapping[str, str],
    *,
    declared_by_workers: bool = False,
) -> list[SettingFinding]:
    """Every finding for ``app`` against ``layout`` (its families, its deploy stop timeout);
    ``dlqs``: each family's DLQ name -> the family's name (the queues redrive watches).
    ``declared_by_workers``: the broker's queues are what workers declare (RabbitMQ): then
    their declarations (``task_queues``) are audited, and SQS's visibility timeout is not."""
    with users_code():  # the app's settings and tasks are the project's code
        tasks = _user_tasks(app)
        if declared_by_workers:
            broker_findings = [*_worker_lost(tasks), *declarations(app, layout, dlqs)]
        else:
            broker_findings = _visibility(app, tasks)
        return [
            *_acknowledgement(tasks),
            *_time_limits(tasks, layout.deploy_stop_timeout),
            *broker_findings,
            *_routing(app, routes, layout, tasks, dlqs),
        ]


def _worker_lost(tasks: Sequence[_Task]) -> list[SettingFinding]:
    return _each(
        tasks,
        lambda t: t.reject_on_worker_lost and not t.acks_late,
        "task_reject_on_worker_lost",
        "True",
        "without task_acks_late the task was acknowledged when received: a dead worker (or a "
        "Reject(requeue=False)) has nothing left to reject, and the task is lost, never "
        "dead-lettered; set task_acks_late = True",
    )


def declarations(app: Any, layout: Layout, dlqs: Mapping[str, str]) -> list[SettingFinding]:
    """What a worker declares on AMQP (``task_queues``): a family's queue declared without
    ``x-dead-letter-exchange`` (created without a DLQ, or refused where it has one), and no
    DLQ declared (on a new broker the DLX routes failures nowhere: they vanish)."""
    declared = {str(q.name): q for q in (app.conf.task_queues or ())}
    if not declared:
        return [
            SettingFinding(
                "task_queues",
                "None",
                "workers declare each queue they consume with no arguments: where it does not "
                "exist yet it is created with no x-dead-letter-exchange (failing tasks are "
                "dropped), and nothing declares a DLQ; declare every family's queue with "
                "queue_arguments x-dead-letter-exchange/-routing-key, and its DLQ",
            )
        ]
    findings = []
    for family in layout.families:
        name = queue_name(family.queue)
        queue = declared.get(name)
        arguments = dict(getattr(queue, "queue_arguments", None) or {})
        if queue is not None and "x-dead-letter-exchange" not in arguments:
            findings.append(
                SettingFinding(
                    "task_queues",
                    name,
                    f"family {family.name}'s queue is declared without "
                    "x-dead-letter-exchange: a worker that declares it first creates it with "
                    "no DLQ (failing tasks are dropped); where it has one, the declare is "
                    "refused (406 PRECONDITION_FAILED) and the worker stops",
                )
            )
    for dlq, family_name in sorted(dlqs.items()):
        if dlq not in declared:
            findings.append(
                SettingFinding(
                    "task_queues",
                    dlq,
                    f"family {family_name}'s DLQ is declared by no worker: on a new broker (or "
                    "once it is deleted) the dead-letter exchange routes failures to no queue "
                    "and they vanish; declare it (a task_queues entry no worker's -Q consumes) "
                    "or create it with the broker's own definitions",
                )
            )
    return findings


def _concerning(tasks: Sequence[_Task], bad: Sequence[_Task]) -> str:
    if len(bad) == len(tasks):
        return "every task"
    names = ", ".join(t.name for t in bad[:MAX_NAMED])
    more = f" and {len(bad) - MAX_NAMED} more" if len(bad) > MAX_NAMED else ""
    return f"task{'s' if len(bad) > 1 else ''} {names}{more}"


def _each(
    tasks: Sequence[_Task], when: Callable[[_Task], bool], setting: str, value: str, why: str
) -> list[SettingFinding]:
    bad = [t for t in tasks if when(t)]
    if not bad:
        return []
    return [SettingFinding(setting, value, f"{why} ({_concerning(tasks, bad)})")]


def _acknowledgement(tasks: Sequence[_Task]) -> list[SettingFinding]:
    return [
        *_each(
            tasks,
            lambda t: not t.acks_late,
            "task_acks_late",
            "False",
            "a task is acknowledged when a worker receives it, so one that fails is never "
            "received again and never reaches the DLQ: set task_acks_late = True",
        ),
        *_each(
            tasks,
            lambda t: t.acks_late and t.acks_on_failure,
            "task_acks_on_failure_or_timeout",
            "True",
            "a task that fails or times out is acknowledged all the same: it never reaches "
            "the DLQ; set task_acks_on_failure_or_timeout = False",
        ),
        *_each(
            tasks,
            lambda t: t.acks_late and not t.lost_redelivered,
            "task_reject_on_worker_lost",
            "False",
            "with task_acks_late, a task whose worker process dies (OOM, SIGKILL) is "
            "acknowledged: it is lost, never in the DLQ; set task_reject_on_worker_lost = True",
        ),
    ]


LOST_UNACKED = (
    "lost: acknowledged when a worker received it (task_acks_late = False), it is never "
    "delivered again and never reaches the DLQ"
)


def _time_limits(tasks: Sequence[_Task], stop_timeout: float) -> list[SettingFinding]:
    stop = format_duration(stop_timeout)
    findings: list[SettingFinding] = []
    for acks_late in (True, False):

        def unlimited(task: _Task, late: bool = acks_late) -> bool:
            return task.time_limit is None and task.acks_late == late

        fate = "delivered again, toward the DLQ" if acks_late else LOST_UNACKED
        findings += _each(
            tasks,
            unlimited,
            "task_time_limit",
            "None",
            f"no hard time limit: a run longer than the deploy's stop timeout ({stop}) is "
            f"SIGKILLed by every deploy and {fate}; set task_time_limit below {stop} "
            "(config [celery] deploy_stop_timeout)",
        )
    limits = sorted({t.time_limit for t in tasks if t.time_limit is not None})
    for limit in (x for x in limits if x > stop_timeout):
        for acks_late in (True, False):

            def has(task: _Task, limit: float = limit, late: bool = acks_late) -> bool:
                return task.time_limit == limit and task.acks_late == late

            fate = (
                "SIGKILLed and delivered again after every deploy"
                if acks_late
                else f"SIGKILLed by every deploy and {LOST_UNACKED}"
            )
            findings += _each(
                tasks,
                has,
                "task_time_limit",
                format_duration(limit),
                f"longer than the deploy's stop timeout ({stop}): a run still going when a "
                f"deploy stops the worker is {fate}",
            )
    return findings


def visibility_timeout(app: Any) -> float:
    options = app.conf.broker_transport_options or {}
    return float(options.get("visibility_timeout") or KOMBU_SQS_VISIBILITY_TIMEOUT)


def _visibility(app: Any, tasks: Sequence[_Task]) -> list[SettingFinding]:
    timeout = visibility_timeout(app)
    value = format_duration(timeout)
    findings = _each(
        tasks,
        # Without acks_late the message is acknowledged as the run starts: nothing to redeliver.
        lambda t: t.acks_late and t.time_limit is not None and t.time_limit > timeout,
        "broker_transport_options.visibility_timeout",
        value,
        "shorter than the task's time limit: a run still going when it ends is delivered "
        "to a second worker (it runs twice, and each delivery counts toward the DLQ)",
    )
    for countdown in sorted({t.retry_countdown for t in tasks if t.retry_countdown[0] > timeout}):
        seconds, setting = countdown
        up_to = "up to " if setting == "retry_backoff_max" else ""

        def waits(task: _Task, countdown: tuple[float, str] = countdown) -> bool:
            return task.retry_countdown == countdown

        findings += _each(
            tasks,
            waits,
            "broker_transport_options.visibility_timeout",
            value,
            f"shorter than the task's retry countdown ({up_to}{format_duration(seconds)}, "
            f"{setting}): a worker holds the retried message that long, and SQS delivers it "
            f"again after {value}",
        )
    return findings


def _routing(
    app: Any,
    routes: AppRoutes,
    layout: Layout,
    tasks: Sequence[_Task],
    dlqs: Mapping[str, str],
) -> list[SettingFinding]:
    families = {queue_name(f.queue): f for f in layout.families}
    routed: dict[str, list[str]] = {}
    for task in tasks:
        routed.setdefault(queue_name(routes.queue_for(task.name)), []).append(task.name)
    default = queue_name(routes.sqs_queue(str(app.conf.task_default_queue)))
    findings = [
        SettingFinding(
            "task_routes",
            queue,
            f"routes {_concerning(tasks, [t for t in tasks if t.name in names])} to a queue "
            "outside the configured families: no DLQ redrive watches (add a family)",
        )
        for queue, names in sorted(routed.items())
        if queue not in families
    ]
    findings += [
        SettingFinding(
            "task_routes",
            name,
            f"family {family.name}'s queue: no task routes to it and it is not "
            "task_default_queue (a queue nothing publishes to, or routes that miss it)",
        )
        for name, family in families.items()
        if name not in routed and name != default
    ]
    for name, url in sorted(routes.predefined.items()):
        problem = _predefined_problem(name, url, families, dlqs)
        if problem is not None:
            findings.append(
                SettingFinding(
                    "broker_transport_options.predefined_queues", f"{name} = {url}", problem
                )
            )
    return findings


def _predefined_problem(
    name: str, url: str, families: Mapping[str, Family], dlqs: Mapping[str, str]
) -> str | None:
    """What is wrong with ``predefined_queues`` giving Celery's queue ``name`` the URL ``url``
    (it lists the queues the app may publish to or consume, and the URL kombu uses for each)."""
    target = queue_name(url)
    family, named = families.get(target), families.get(name)
    if named is not None and named is not family:
        where = (
            f"family {family.name}'s queue"
            if family is not None
            else f"family {dlqs[target]}'s DLQ"
            if target in dlqs
            else "not the queue of any configured family"
        )
        return (
            f"{where}, though the Celery queue {name} is family {named.name}'s: tasks routed "
            f"to {name} are sent to {target}, not to {queue_name(named.queue)}"
        )
    if family is not None:
        if family.queue.startswith(("https://", "http://")) and family.queue != url:
            return (
                f"not family {family.name}'s queue ({family.queue} in the config) but another "
                "of that name (another account or region): its DLQ is not one redrive watches"
            )
        return None
    if target in dlqs:
        return None  # a family's DLQ: one redrive watches (an app may list it to read it)
    return (
        "not the queue of any configured family: the app may send tasks to it or consume "
        "it, and its DLQ is not one redrive watches (add a family for it, or drop it from "
        "predefined_queues)"
    )
