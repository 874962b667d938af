"""``check --celery``: the Celery settings that decide whether a failing task reaches a DLQ at
all, and whether every deploy fills one. Each finding names the setting, its value and the
consequence. Settings are read per task as a worker binds them (a task's own option, else
the app's setting), so a finding names every task it concerns, or the app as a whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

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
class TaskSettings:
    """A task's settings as a worker applies them."""

    name: str
    acks_late: bool
    acks_on_failure: bool
    acks_on_timeout: bool
    reject_on_worker_lost: bool
    time_limit: float | None
    soft_time_limit: float | None
    retry_countdown: tuple[float, str]
    """The longest a retry waits before it runs again, and the setting that says so."""


WorkerLost = Literal["acknowledged", "requeued", "rejected"]


def worker_lost_fate(task: TaskSettings) -> WorkerLost:
    """What the installed Celery's ``Request.on_failure`` does with the message of a task
    whose pool process died mid-run (WorkerLostError: OOM, SIGKILL): ``acknowledged`` (lost),
    ``requeued`` (delivered again: never dead-lettered on a classic RabbitMQ queue) or
    ``rejected`` without requeue (dead-lettered on RabbitMQ). kombu's SQS transport leaves a
    requeued message and a rejected one alike for SQS to deliver again and dead-letter past
    maxReceiveCount (tests/test_celery_worker_lost_e2e.py: what a real worker does).
    ``task_retry_on_worker_lost`` only delays this: past max_retries the message meets it."""
    if not task.acks_late:
        return "acknowledged"  # when a worker received it: nothing is left to reject
    if task.reject_on_worker_lost:
        return "requeued"
    return "acknowledged" if task.acks_on_failure else "rejected"


def timeout_fate(task: TaskSettings) -> WorkerLost | None:
    """What the installed Celery does with the message of a run that overruns its time
    limits (None: it has none). A soft limit reached first raises SoftTimeLimitExceeded in
    the task: a failure (unless the task catches it), acknowledged or rejected as any; a
    hard limit reached first ends the run (``Request.on_timeout``): acknowledged with
    acks_on_timeout, else rejected *with* requeue (tests/test_celery_worker_lost_e2e.py)."""
    if task.time_limit is None and task.soft_time_limit is None:
        return None
    if not task.acks_late:
        return "acknowledged"
    if soft_first(task):
        return "acknowledged" if task.acks_on_failure else "rejected"
    return "acknowledged" if task.acks_on_timeout else "requeued"


def soft_first(task: TaskSettings) -> bool:
    """A soft time limit that a run reaches before its hard one (if any)."""
    soft = task.soft_time_limit
    return soft is not None and (task.time_limit is None or soft < task.time_limit)


def _installed_setting(new: str) -> str:
    """``new`` (``task_acks_on_failure``, ``task_acks_on_timeout``) where the installed
    Celery reads it, else ``task_acks_on_failure_or_timeout``, which it replaced."""
    from celery import Task

    names = {setting for _, setting in getattr(Task, "from_config", ())}
    return new if new in names else "task_acks_on_failure_or_timeout"


def acks_on_failure_setting() -> str:
    """The setting the installed Celery reads for a failure's ack."""
    return _installed_setting("task_acks_on_failure")


def acks_on_timeout_setting() -> str:
    """The setting the installed Celery reads for a hard time limit's ack."""
    return _installed_setting("task_acks_on_timeout")


def format_duration(seconds: float) -> str:
    return f"{seconds:g}s"


def task_settings(app: Any) -> list[TaskSettings]:
    conf = app.conf
    out = []
    for name in sorted(app.tasks):
        if name.startswith("celery."):
            continue
        task = app.tasks[name]
        # As Task.bind: each falls back to acks_on_failure_or_timeout, whose default is True.
        either = getattr(task, "acks_on_failure_or_timeout", None)
        if either is None:
            either = conf.get("task_acks_on_failure_or_timeout")
        either = True if either is None else either
        on_failure = getattr(task, "acks_on_failure", None)
        on_timeout = getattr(task, "acks_on_timeout", None)
        countdown = (float(getattr(task, "default_retry_delay", 0) or 0), "default_retry_delay")
        if getattr(task, "retry_backoff", False):
            backoff = float(getattr(task, "retry_backoff_max", 0) or 0)
            countdown = max(countdown, (backoff, "retry_backoff_max"))
        out.append(
            TaskSettings(
                name=name,
                acks_late=bool(task.acks_late),
                acks_on_failure=bool(either if on_failure is None else on_failure),
                acks_on_timeout=bool(either if on_timeout is None else on_timeout),
                reject_on_worker_lost=bool(task.reject_on_worker_lost),
                time_limit=_limit(task, conf, "time_limit"),
                soft_time_limit=_limit(task, conf, "soft_time_limit"),
                retry_countdown=countdown,
            )
        )
    return out


def _limit(task: Any, conf: Any, name: str) -> float | None:
    """A task's time limit ``name`` (``time_limit``, ``soft_time_limit``): its own, else the
    app's ``task_<name>`` (as the worker applies it). Celery 5.7 gives a task the app's
    value; 5.5 and 5.6 leave its attribute None, so reading only that saw no limit where the
    app sets one."""
    own = getattr(task, name, None)
    limit = own if own is not None else conf.get(f"task_{name}")
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
        tasks = task_settings(app)
        if declared_by_workers:
            broker_findings = [*_worker_lost(tasks), *declarations(app, layout, dlqs)]
        else:
            broker_findings = _visibility(app, tasks)
        return [
            *_acknowledgement(tasks, rabbitmq=declared_by_workers),
            *_time_limits(tasks, layout.deploy_stop_timeout, rabbitmq=declared_by_workers),
            *_overruns(tasks, rabbitmq=declared_by_workers),
            *broker_findings,
            *_routing(app, routes, layout, tasks, dlqs),
        ]


def _worker_lost(tasks: Sequence[TaskSettings]) -> list[SettingFinding]:
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


def _concerning(tasks: Sequence[TaskSettings], bad: Sequence[TaskSettings]) -> str:
    if len(bad) == len(tasks):
        return "every task"
    names = ", ".join(t.name for t in bad[:MAX_NAMED])
    more = f" and {len(bad) - MAX_NAMED} more" if len(bad) > MAX_NAMED else ""
    return f"task{'s' if len(bad) > 1 else ''} {names}{more}"


def _each(
    tasks: Sequence[TaskSettings],
    when: Callable[[TaskSettings], bool],
    setting: str,
    value: str,
    why: str,
) -> list[SettingFinding]:
    bad = [t for t in tasks if when(t)]
    if not bad:
        return []
    return [SettingFinding(setting, value, f"{why} ({_concerning(tasks, bad)})")]


def _acknowledgement(tasks: Sequence[TaskSettings], *, rabbitmq: bool) -> list[SettingFinding]:
    """What Celery does with a failing task's message (``Request.on_failure``): acknowledged
    on receipt without acks_late; with it, acknowledged or rejected without requeue (into the
    DLQ) by the failure ack setting; a dead pool process's task requeued by
    task_reject_on_worker_lost, else treated as any failure."""
    on_failure = acks_on_failure_setting()
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
            on_failure,
            "True",
            "a task that fails (it raises, or its worker process dies and "
            "task_reject_on_worker_lost is unset) is acknowledged all the same: it never "
            f"reaches the DLQ; set {on_failure} = False",
        ),
        *_each(
            tasks,
            # On SQS kombu leaves a requeued message as a rejected one, for SQS to deliver
            # again and dead-letter past maxReceiveCount: the setting changes nothing there.
            lambda t: rabbitmq and t.acks_late and worker_lost_fate(t) == "requeued",
            "task_reject_on_worker_lost",
            "True",
            "a task whose worker process dies (OOM, SIGKILL) is requeued, never dead-lettered: "
            "one that kills its worker every time is delivered again without end on a classic "
            "queue (a quorum queue dead-letters it past its x-delivery-limit); unset it: with "
            f"{on_failure} = False, Celery rejects such a task without requeue and it is "
            "dead-lettered",
        ),
    ]


def _overruns(tasks: Sequence[TaskSettings], *, rabbitmq: bool) -> list[SettingFinding]:
    """A run past its hard time limit: acknowledged (lost), or on RabbitMQ requeued (a
    classic queue never dead-letters it); a soft limit below the hard one makes it a
    failure, which reaches the DLQ. On SQS kombu leaves a requeued message for SQS."""
    on_timeout = acks_on_timeout_setting()
    soft = (
        "set task_soft_time_limit below task_time_limit: the SoftTimeLimitExceeded it raises "
        "fails the task (unless the task catches it), and a failure reaches the DLQ"
    )
    findings = _each(
        tasks,
        lambda t: t.acks_late and not soft_first(t) and timeout_fate(t) == "acknowledged",
        on_timeout,
        "True",
        "a run killed at its hard time limit is acknowledged all the same: it is lost, never "
        f"in the DLQ; {soft}" + ("" if rabbitmq else f", or set {on_timeout} = False"),
    )
    for unset in (True, False) if rabbitmq else ():

        def requeued(task: TaskSettings, unset: bool = unset) -> bool:
            return timeout_fate(task) == "requeued" and (task.soft_time_limit is None) == unset

        findings += _each(
            tasks,
            requeued,
            "task_soft_time_limit",
            "None" if unset else "not below task_time_limit",
            f"a run killed at its hard time limit is requeued ({on_timeout} = False), never "
            "dead-lettered: one that always overruns runs again without end on a classic "
            f"queue (a quorum queue dead-letters it past its x-delivery-limit); {soft}",
        )
    return findings


LOST_UNACKED = (
    "lost: acknowledged when a worker received it (task_acks_late = False), it is never "
    "delivered again and never reaches the DLQ"
)


#: Where a SIGKILLed worker's unacknowledged task goes: the broker delivers it again, and
#: only a broker that counts deliveries dead-letters it (a classic RabbitMQ queue never does).
AGAIN = {
    False: "delivered again, toward the DLQ",
    True: "delivered again (toward the DLQ only on a quorum queue, past its x-delivery-limit: "
    "a classic queue delivers it again without end)",
}


def _time_limits(
    tasks: Sequence[TaskSettings], stop_timeout: float, *, rabbitmq: bool
) -> list[SettingFinding]:
    stop = format_duration(stop_timeout)
    findings: list[SettingFinding] = []
    for acks_late in (True, False):

        def unlimited(task: TaskSettings, late: bool = acks_late) -> bool:
            return task.time_limit is None and task.acks_late == late

        fate = AGAIN[rabbitmq] if acks_late else LOST_UNACKED
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

            def has(task: TaskSettings, limit: float = limit, late: bool = acks_late) -> bool:
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


def _visibility(app: Any, tasks: Sequence[TaskSettings]) -> list[SettingFinding]:
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

        def waits(task: TaskSettings, countdown: tuple[float, str] = countdown) -> bool:
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
    tasks: Sequence[TaskSettings],
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
