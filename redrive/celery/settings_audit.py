"""``check --celery``: the Celery settings that decide whether a failing task reaches a DLQ at
all, and whether every deploy fills one. Each finding names the setting, its value and the
consequence. Settings are read per task as a worker binds them (a task's own option, else
the app's setting), so a finding names every task it concerns, or the app as a whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redrive.aws.sqs import queue_name
from redrive.celery.routes import AppRoutes
from redrive.config import Layout

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
    time_limit: float | None
    retry_delays: tuple[float, ...]


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
        delays = [float(getattr(task, "default_retry_delay", 0) or 0)]
        if getattr(task, "retry_backoff", False):
            delays.append(float(getattr(task, "retry_backoff_max", 0) or 0))
        out.append(
            _Task(
                name=name,
                acks_late=bool(task.acks_late),
                acks_on_failure=bool(on_failure),
                lost_redelivered=bool(task.reject_on_worker_lost)
                or bool(getattr(task, "retry_on_worker_lost", False)),
                time_limit=float(task.time_limit) if task.time_limit else None,
                retry_delays=tuple(delays),
            )
        )
    return out


def audit_app(app: Any, routes: AppRoutes, layout: Layout) -> list[SettingFinding]:
    """Every finding for ``app`` against ``layout`` (its families, its deploy stop timeout)."""
    tasks = _user_tasks(app)
    return [
        *_acknowledgement(tasks),
        *_time_limits(tasks, layout.deploy_stop_timeout),
        *_visibility(app, tasks),
        *_routing(app, routes, layout, tasks),
    ]


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


def _time_limits(tasks: Sequence[_Task], stop_timeout: float) -> list[SettingFinding]:
    stop = format_duration(stop_timeout)
    findings = _each(
        tasks,
        lambda t: t.time_limit is None,
        "task_time_limit",
        "None",
        f"no hard time limit: a run longer than the deploy's stop timeout ({stop}) is "
        "SIGKILLed by every deploy and delivered again, toward the DLQ; set task_time_limit "
        f"below {stop} (config [celery] deploy_stop_timeout)",
    )
    limits = sorted({t.time_limit for t in tasks if t.time_limit is not None})
    for limit in (x for x in limits if x > stop_timeout):

        def has(task: _Task, limit: float = limit) -> bool:
            return task.time_limit == limit

        findings += _each(
            tasks,
            has,
            "task_time_limit",
            format_duration(limit),
            f"longer than the deploy's stop timeout ({stop}): a run still going when a "
            "deploy stops the worker is SIGKILLed and delivered again after every deploy",
        )
    return findings


def visibility_timeout(app: Any) -> float:
    options = app.conf.broker_transport_options or {}
    return float(options.get("visibility_timeout") or KOMBU_SQS_VISIBILITY_TIMEOUT)


def _visibility(app: Any, tasks: Sequence[_Task]) -> list[SettingFinding]:
    timeout = visibility_timeout(app)
    value = format_duration(timeout)
    return [
        *_each(
            tasks,
            lambda t: t.time_limit is not None and t.time_limit > timeout,
            "broker_transport_options.visibility_timeout",
            value,
            "shorter than the task's time limit: a run still going when it ends is delivered "
            "to a second worker (it runs twice, and each delivery counts toward the DLQ)",
        ),
        *_each(
            tasks,
            lambda t: max(t.retry_delays, default=0) > timeout,
            "broker_transport_options.visibility_timeout",
            value,
            "shorter than the task's retry countdown (default_retry_delay, retry_backoff_max): "
            "a worker holds the retried message past it, SQS delivers it again meanwhile",
        ),
    ]


def _routing(
    app: Any, routes: AppRoutes, layout: Layout, tasks: Sequence[_Task]
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
        family, named = families.get(queue_name(url)), families.get(name)
        is_url = family is not None and family.queue.startswith(("https://", "http://"))
        if (
            family is None
            or (named is not None and named is not family)
            or (is_url and family.queue != url)
        ):
            findings.append(
                SettingFinding(
                    "broker_transport_options.predefined_queues",
                    f"{name} = {url}",
                    "not the queue of any configured family: the workers consume a queue "
                    "whose DLQ redrive does not watch",
                )
            )
    return findings
