"""Issue 13: knowing the Celery app. ``--celery-app`` loads the user's app as ``celery -A``
does (every failure one line); its router sends each task to the queue its route names now;
tasks it does not register stay in the DLQ. Real Celery apps, written to a temporary
directory and imported as the user's would be; moto in-process for SQS."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import textwrap
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import celery
import pytest
from celery.exceptions import CDeprecationWarning
from conftest import Cli, Family, MotoServer, as_json, make_family

pytest.importorskip("celery", minversion="5.0")

from redrive.celery.app import load_app
from redrive.celery.routes import AppRoutes, ConfigRoutes
from redrive.celery.settings_audit import acks_on_failure_setting, acks_on_timeout_setting
from redrive.config import built_in_layout
from redrive.errors import CeleryAppError
from redrive.messages import decode
from redrive.sandbox.encoder import encode

ROOT = Path(__file__).resolve().parent.parent
IBFT = "apps.webhooks.tasks.save_checkout_ibft"
LESSON = "apps.engagements.tasks.save_progress_lesson"
ACTIVATE = "apps.users.tasks.activate_user"
DELETED = "apps.inventory.tasks.resync_stock"

# The onion split, as an app declares it: task_routes with an exact name and a glob.
SPLIT_APP = """
from celery import Celery

app = Celery("onion", set_as_current=False)
app.conf.task_default_queue = "onion"
app.conf.task_routes = {{
    "apps.webhooks.tasks.save_checkout_ibft": {{"queue": "onion-checkout"}},
    "apps.engagements.tasks.save_progress_*": {{"queue": "onion-progress"}},
}}
{extra}

@app.task(name="apps.webhooks.tasks.save_checkout_ibft", shared=False)
def ibft(*args, **kwargs):
    pass

@app.task(name="apps.engagements.tasks.save_progress_lesson", shared=False)
def lesson(*args, **kwargs):
    pass

@app.task(name="apps.users.tasks.activate_user", shared=False)
def activate(*args, **kwargs):
    pass
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's project directory, the current directory (as for ``celery -A``)."""
    where = tmp_path / "project"
    where.mkdir()
    monkeypatch.chdir(where)
    monkeypatch.setattr(sys, "path", list(sys.path))
    return where


def write_app(project: Path, source: str) -> str:
    """Write ``source`` as a module of its own name (modules stay imported between tests)."""
    name = f"proj_{uuid.uuid4().hex[:10]}"
    (project / f"{name}.py").write_text(textwrap.dedent(source))
    return name


def split_app(project: Path, extra: str = "") -> str:
    return write_app(project, SPLIT_APP.format(extra=extra)) + ":app"


# -- 1. loading the app ---------------------------------------------------------------------


def test_an_app_loads_as_celery_a_does_from_the_current_directory(project: Path) -> None:
    spec = split_app(project)
    app = load_app(spec)
    assert IBFT in app.tasks
    # A bare module: its `app` attribute, as `celery -A proj` finds it.
    assert load_app(spec.split(":")[0]) is app


BAD_APPS = {
    "no module": ("", "nowhere_{id}:app", "no module named 'nowhere_{id}'"),
    "no attribute": (
        "from celery import Celery\napp = Celery('x')\n",
        "{mod}:nope",
        "no attribute",
    ),
    "not an app": ("app = {{'broker': 'sqs://'}}\n", "{mod}:app", "is a dict, not a Celery app"),
    "import raises": (
        "import celery\nraise RuntimeError('settings missing')\n",
        "{mod}:app",
        "raised RuntimeError: settings missing",
    ),
    "its imports fail": (
        "import missing_dependency_{id}\n",
        "{mod}:app",
        "No module named 'missing_dependency_",
    ),
    "syntax error": ("def broken(:\n", "{mod}:app", "raised SyntaxError"),
    "tasks fail to load": (
        "from celery import Celery\napp = Celery('x', set_as_current=False)\n"
        "app.conf.imports = ['gone_tasks_{id}']\n",
        "{mod}:app",
        "loading its tasks raised ModuleNotFoundError",
    ),
    # Issue 22: said in words, with what to name instead (it was "is a PromiseProxy").
    "an app's task": (
        "from celery import Celery\napp = Celery('x', set_as_current=False)\n"
        "@app.task(name='apps.x.own_{id}', shared=False)\ndef own():\n    pass\n",
        "{mod}:own",
        "is the Celery task apps.x.own_{id}, not a Celery app: name the Celery app itself",
    ),
    "an app factory": (
        "from celery import Celery\ndef make_app():\n    return Celery('x')\n",
        "{mod}:make_app",
        "is the function make_app, not a Celery app: redrive does not call it: name the app "
        "it makes, made at import (app = make_app())",
    ),
    "not a spec": ("", "proj:app:x", "is not MODULE:ATTR"),
    "module without an app": ("x = 1\n", "{mod}", "has no Celery app"),
}


# Every failure given before the command; each other way of naming the app with two of them.
WHERE = [(case, "before") for case in BAD_APPS] + [
    (case, where) for where in ("after", "env", "config") for case in ("no module", "import raises")
]


@pytest.mark.parametrize(("case", "where"), WHERE, ids=[f"{c}-{w}" for c, w in WHERE])
def test_every_bad_celery_app_is_one_line_and_exit_1(
    case: str, where: str, project: Path, monkeypatch: pytest.MonkeyPatch, cli: Cli
) -> None:
    source, spec, fragment = BAD_APPS[case]
    ident = uuid.uuid4().hex[:8]
    mod = write_app(project, source.format(id=ident)) if source else "unused"
    spec, fragment = spec.format(mod=mod, id=ident), fragment.format(id=ident)
    args = ["move", "checkout"]
    if where == "before":
        args = ["--celery-app", spec, *args]
    elif where == "after":
        args = [*args, "--celery-app", spec]
    elif where == "env":
        monkeypatch.setenv("REDRIVE_CELERY_APP", spec)
    else:
        config = project / "redrive.toml"
        config.write_text(
            f'[families.checkout]\nqueue = "onion-checkout"\n\n[celery]\napp = "{spec}"\n'
        )
        args = ["--config", str(config), *args]
    result = cli(*args)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert result.output.strip().splitlines() == errors and len(errors) == 1, result.output
    assert fragment in errors[0]
    # Issue 22: the line names where the app came from, and no option the user did not give.
    named_by = {
        "env": f"REDRIVE_CELERY_APP {spec!r}",
        "config": f"[celery] app {spec!r} (config {project / 'redrive.toml'})",
    }.get(where, f"--celery-app {spec}")
    assert errors[0].startswith(f"Error: {named_by}"), errors[0]
    if where in ("env", "config"):
        assert "--celery-app" not in errors[0], errors[0]


def test_a_shared_task_named_as_the_app_is_said_in_words(project: Path) -> None:
    """Issue 22: ``@shared_task`` is a Celery proxy: the line said "is a PromiseProxy". In a
    process of its own: a shared task joins every app made after it in the process."""
    import subprocess

    mod = write_app(
        project,
        "from celery import shared_task\n\n@shared_task(name='apps.x.add')\ndef add():\n    pass\n",
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(project)])}
    done = subprocess.run(
        [sys.executable, "-m", "redrive", "--celery-app", f"{mod}:add", "check", "--celery"],
        capture_output=True,
        text=True,
        cwd=project,
        env=env,
        timeout=60,
    )
    assert done.returncode == 1 and done.stdout == "", (done.stdout, done.stderr)
    assert done.stderr.strip() == (
        f"Error: --celery-app {mod}:add: {mod}:add is the Celery task apps.x.add, not a "
        "Celery app: name the Celery app itself, the `app = Celery(...)` its tasks are "
        "registered on, as `celery -A` takes it (e.g. proj.celery:app)"
    )


def test_without_celery_every_command_works_and_an_app_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, family: Family, cli: Cli
) -> None:
    monkeypatch.setitem(sys.modules, "celery", None)  # import celery now fails
    family.send_to_dlq(encode(IBFT, [1], {}, task_id="t-1"))
    assert as_json(cli.ok("move", "checkout", "--json"))["moved"] == 1
    assert as_json(cli.ok("inspect", "checkout", "--json"))["total"] == 1
    result = cli("move", "checkout", "--celery-app", "proj:app")
    assert result.exit_code == 1 and "pip install 'redrive[celery]'" in result.output
    with pytest.raises(CeleryAppError, match="needs Celery"):
        load_app("proj:app")


def test_the_celery_package_imports_without_celery(monkeypatch: pytest.MonkeyPatch) -> None:
    """redrive.celery's modules import celery only when an app is loaded."""
    import subprocess

    script = (
        "import sys; sys.modules['celery'] = None\n"
        "import redrive.celery.app, redrive.celery.routes, redrive.celery.registry\n"
        "import redrive.celery.knowledge, redrive.celery.settings_audit, redrive.cli\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


# The user's code prints while redrive loads and calls it: on import (print, fd 1, a child
# process, C's printf), in its router, in its result backend (built and read).
NOISY_APP = """
import ctypes
import os
import subprocess
import sys

print("noisy: print on import")
os.write(1, b"noisy: fd 1 on import\\n")
subprocess.run([sys.executable, "-c", "print('noisy: a child process on import')"], check=True)
ctypes.CDLL(None).printf(b"noisy: C printf on import\\n")

from celery import Celery
from celery.backends.cache import CacheBackend


class NoisyBackend(CacheBackend):
    def __init__(self, *args, **kwargs):
        print("noisy: backend built")
        os.write(1, b"noisy: fd 1 in the backend\\n")
        super().__init__(*args, **kwargs)

    def mget(self, keys):
        print("noisy: backend read")
        return super().mget(keys)


def router(name, args, kwargs, options, task=None, **kw):
    print(f"noisy: routing {name}")
    os.write(1, b"noisy: fd 1 in the router\\n")
    return {"queue": "onion-checkout"}


app = Celery("noisy", set_as_current=False)
app.conf.task_routes = (router,)
app.conf.result_backend = __name__ + ":NoisyBackend"
app.conf.cache_backend = "memory"


@app.task(name="apps.webhooks.tasks.save_checkout_ibft", shared=False)
def ibft(*args, **kwargs):
    pass
"""


@pytest.mark.e2e
@pytest.mark.parametrize(
    "args",
    [
        ("inspect", "checkout", "--json"),
        ("inspect", "checkout", "--json", "--processes", "2"),
        ("move", "checkout", "--json"),
        ("check", "--celery", "--json"),
    ],
    ids=["inspect", "inspect-processes", "move-dry-run", "check"],
)
def test_what_the_apps_code_prints_goes_to_stderr_never_into_json(
    args: tuple[str, ...], project: Path, server: MotoServer
) -> None:
    """Issue 22: `--celery-app noisy:app inspect default --json` put the app's print before
    the `{`. A real redrive process and a real noisy app: stdout is the JSON alone."""
    import subprocess

    family = make_family(server.client(), "onion-checkout")
    for i in range(3):
        family.send_to_dlq(encode(IBFT, [i], {}, task_id=f"t-{i}"))
    mod = write_app(project, NOISY_APP)
    env = {**server.env(), "PYTHONPATH": os.pathsep.join([str(ROOT), str(project)])}
    done = subprocess.run(
        [sys.executable, "-m", "redrive", "--celery-app", f"{mod}:app", *args],
        capture_output=True,
        text=True,
        cwd=project,
        env=env,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert "noisy" not in done.stdout, done.stdout
    json.loads(done.stdout)  # the whole of stdout is one JSON document
    for line in (
        "noisy: print on import",
        "noisy: fd 1 on import",
        "noisy: a child process on import",
        "noisy: C printf on import",
    ):
        assert line in done.stderr, (line, done.stderr)
    if args[0] != "check":
        assert "noisy: backend built" in done.stderr and "noisy: backend read" in done.stderr
        assert "noisy: fd 1 in the backend" in done.stderr
    assert f"noisy: routing {IBFT}" in done.stderr and "noisy: fd 1 in the router" in done.stderr


def test_only_the_thread_running_the_users_code_writes_to_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """While one thread runs the user's code, another's results still go to stdout; a stream
    the user's code kept (a logging handler made at import) writes to stderr afterwards."""
    import threading

    from redrive.celery.streams import users_code

    ours = sys.stdout
    inside, done = threading.Event(), threading.Event()
    kept: list[Any] = []

    def users() -> None:
        with users_code():
            print("theirs, on import")
            kept.append(sys.stdout)
            inside.set()
            assert done.wait(30)
            print("theirs, later")

    thread = threading.Thread(target=users)
    thread.start()
    assert inside.wait(30)
    print("ours, meanwhile")
    done.set()
    thread.join(30)
    print("the handler's line", file=kept[0])
    assert sys.stdout is ours
    out, err = capsys.readouterr()
    assert out == "ours, meanwhile\n"
    assert err == "theirs, on import\ntheirs, later\nthe handler's line\n"


# -- 2. routes --------------------------------------------------------------------------------


def test_routes_from_dicts_globs_functions_the_tasks_queue_and_the_default(
    project: Path,
) -> None:
    spec = write_app(
        project,
        """
        from celery import Celery

        def by_prefix(name, args, kwargs, options, task=None, **kw):
            if name.startswith("apps.reports."):
                return {"queue": "onion-reports"}
            return None

        app = Celery("onion", set_as_current=False)
        app.conf.task_default_queue = "onion"
        app.conf.task_routes = (
            by_prefix,
            {
                "apps.webhooks.tasks.save_checkout_ibft": {"queue": "onion-checkout"},
                "apps.engagements.tasks.save_progress_*": {"queue": "onion-progress"},
                "apps.payments.*": "onion-checkout",
            },
        )

        @app.task(name="apps.users.tasks.activate_user", queue="onion-users", shared=False)
        def activate():
            pass

        @app.task(name="apps.webhooks.tasks.save_checkout_ibft", queue="onion-own", shared=False)
        def ibft():
            pass
        """,
    )
    # Celery 5.7 deprecates a task's own queue= (it warns once the task is bound); apps still
    # use it, so the router must honour it, and the test expects the warning instead of
    # letting it past filterwarnings=error (Celery's warnings filter lets it through as one).
    # Celery 5.5 and 5.6 (the floor is 5.5) do not warn.
    deprecated = (
        pytest.warns(CDeprecationWarning, match="'queue' task attribute is deprecated")
        if celery.VERSION[:2] >= (5, 7)
        else contextlib.nullcontext()
    )
    with deprecated:
        routes = AppRoutes(load_app(spec), spec)
        assert routes.queue_for("apps.users.tasks.activate_user") == "onion-users"
    assert routes.queue_for("apps.engagements.tasks.save_progress_quiz") == "onion-progress"
    assert routes.queue_for("apps.payments.tasks.refund") == "onion-checkout"
    assert routes.queue_for("apps.reports.tasks.export_csv") == "onion-reports"
    assert routes.queue_for("apps.users.tasks.activate_user") == "onion-users"
    # A task's own queue= wins over task_routes, as for apply_async.
    assert routes.queue_for(IBFT) == "onion-own"
    assert routes.queue_for("apps.anything.else") == "onion"


def test_predefined_queue_urls_and_the_prefix_are_what_kombu_uses(project: Path) -> None:
    url = "https://sqs.eu-west-1.amazonaws.com/123456789012/prod-onion-checkout"
    spec = split_app(
        project,
        extra=(
            "app.conf.broker_transport_options = {'queue_name_prefix': 'prod-', "
            f"'predefined_queues': {{'onion-checkout': {{'url': '{url}'}}}}}}"
        ),
    )
    routes = AppRoutes(load_app(spec), spec)
    assert routes.queue_for(IBFT) == url
    assert routes.queue_for(LESSON) == "prod-onion-progress"
    assert routes.queue_for("apps.x.y") == "prod-onion"


def test_config_routes_map_names_and_globs_to_families_or_queues() -> None:
    layout = built_in_layout({})
    routes = ConfigRoutes(
        {IBFT: "checkout", "apps.engagements.*": "progress", "apps.x.*": "elsewhere"}, layout
    )
    assert routes.queue_for(IBFT) == "onion-checkout"
    assert routes.queue_for(LESSON) == "onion-progress"
    assert routes.queue_for("apps.x.y") == "elsewhere"
    assert routes.queue_for(ACTIVATE) is None


def seed_before_the_split(default: Family) -> dict[str, str]:
    """The default DLQ as the split found it: checkout and progress tasks from `onion`, a
    task still in the default queue, one the app no longer registers, and a body no
    Celery wrote. Returns body -> task."""
    bodies = {
        encode(IBFT, [1], {}, task_id="ibft-1", queue="onion"): IBFT,
        encode(IBFT, [2], {}, task_id="ibft-2", queue="onion"): IBFT,
        encode(LESSON, [3, "l-1", 0.5], {}, task_id="lesson-1", queue="onion"): LESSON,
        encode(ACTIVATE, [4], {}, task_id="activate-1", queue="onion"): ACTIVATE,
        encode(DELETED, [5], {}, task_id="deleted-1", queue="onion"): DELETED,
        '{"event": "order.created"}': "(unknown)",
    }
    for body in bodies:
        default.send_to_dlq(body)
    return bodies


def bodies_in(family: Family, url: str, seeded: dict[str, str] | None = None) -> Counter[str]:
    """The tasks in the queue at ``url`` (drained); with ``seeded`` (body -> task), each
    body must be one of them byte for byte: a route changes where a task goes, not what."""
    bodies = [m["Body"] for m in family.drain(url)]
    if seeded is not None:
        assert all(body in seeded for body in bodies), "a routed body changed on the way"
        assert len(set(bodies)) == len(bodies), "a routed task arrived twice"
    return Counter(decode(body).task for body in bodies)


def test_a_dlq_filled_before_the_split_drains_where_each_task_routes_now(
    project: Path, all_families: dict[str, Family], cli: Cli
) -> None:
    spec = split_app(project)
    default = all_families["default"]
    seeded = seed_before_the_split(default)

    dry = as_json(cli.ok("--celery-app", spec, "move", "default", "--json"))
    assert dry["dry_run"] and dry["moved"] == 4
    assert dry["tasks"][IBFT]["targets"] == {"onion-checkout": 2}
    assert dry["tasks"][IBFT]["routed_from"] == {"onion": 2}
    assert dry["tasks"][LESSON]["targets"] == {"onion-progress": 1}
    assert dry["tasks"][ACTIVATE]["targets"] == {"onion": 1}
    assert dry["tasks"][ACTIVATE]["routed_from"] == {}
    assert dry["skipped_by_reason"] == {"unregistered": 1, "not-celery": 1}
    assert dry["tasks"][DELETED]["skipped"] == {"unregistered": 1}
    text = cli.ok("move", "default", "--celery-app", spec).output
    assert "onion-checkout (by route; source onion)" in text
    assert "skipped as unregistered" in text and f"app {spec}" in text

    done = as_json(cli.ok("move", "default", "--celery-app", spec, "--execute", "--yes", "--json"))
    assert done["moved"] == 4 and done["failed"] == 0 and done["in_doubt"] == 0
    assert default.depth(all_families["checkout"].queue_url) == (2, 0)
    assert bodies_in(default, all_families["checkout"].queue_url, seeded) == {IBFT: 2}
    assert bodies_in(default, all_families["progress"].queue_url, seeded) == {LESSON: 1}
    assert bodies_in(default, default.queue_url, seeded) == {ACTIVATE: 1}
    left = bodies_in(default, default.dlq_url, seeded)
    assert left == {DELETED: 1, "(unknown)": 1}, "the unregistered task stays, with its reason"


def test_route_source_to_and_include_unregistered(
    project: Path, all_families: dict[str, Family], cli: Cli
) -> None:
    spec = split_app(project)
    default = all_families["default"]
    seed_before_the_split(default)
    source = as_json(cli.ok("move", "default", "--celery-app", spec, "--route", "source", "--json"))
    assert {t: c["targets"] for t, c in source["tasks"].items() if c["targets"]} == {
        IBFT: {"onion": 2},
        LESSON: {"onion": 1},
        ACTIVATE: {"onion": 1},
    }
    to = as_json(
        cli.ok("move", "default", "--celery-app", spec, "--to", "onion-checkout", "--json")
    )
    assert to["tasks"][LESSON]["targets"] == {"onion-checkout": 1}
    assert to["tasks"][LESSON]["routed_from"] == {}
    # Issue 37, 9: an explicit --to is the user's queue: unregistered tasks go there too.
    assert to["tasks"][DELETED]["targets"] == {"onion-checkout": 1}
    assert "unregistered" not in to["skipped_by_reason"]
    everything = as_json(
        cli.ok("move", "default", "--celery-app", spec, "--include-unregistered", "--json")
    )
    assert everything["tasks"][DELETED]["targets"] == {"onion": 1}
    assert everything["skipped_by_reason"] == {"not-celery": 1}, "bodies no Celery wrote"
    default.client.create_queue(QueueName="quarantine")
    quarantined = cli.ok(
        "move",
        "default",
        "--celery-app",
        spec,
        "--to",
        "quarantine",
        "--execute",
        "--yes",
        "--json",
    )
    assert as_json(quarantined)["skipped_by_reason"].get("unregistered") is None
    url = default.client.get_queue_url(QueueName="quarantine")["QueueUrl"]
    assert bodies_in(default, url)[DELETED] == 1


def test_config_routes_route_without_an_app(
    project: Path, all_families: dict[str, Family], cli: Cli
) -> None:
    config = project / "redrive.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [families.checkout]
            queue = "onion-checkout"
            [families.default]
            queue = "onion"
            [families.progress]
            queue = "onion-progress"

            [routes]
            "{IBFT}" = "checkout"
            "apps.engagements.tasks.*" = "onion-progress"
            """
        )
    )
    seed_before_the_split(all_families["default"])
    dry = as_json(cli.ok("move", "default", "--config", str(config), "--json"))
    assert dry["tasks"][IBFT]["targets"] == {"onion-checkout": 2}
    assert dry["tasks"][LESSON]["targets"] == {"onion-progress": 1}
    assert dry["tasks"][DELETED]["targets"] == {"onion": 1}, "no app: no registry"
    seen = as_json(cli.ok("inspect", "default", "--config", str(config), "--json"))
    routes_to = {g["task"]: g.get("routes_to") for g in seen["groups"]}
    assert routes_to[IBFT] == "onion-checkout" and routes_to[ACTIVATE] is None


def test_route_task_without_routes_is_a_usage_error(family: Family, cli: Cli) -> None:
    result = cli("move", "checkout", "--route", "task")
    assert result.exit_code == 2 and "--route task needs" in result.output


def test_a_route_to_a_queue_that_does_not_exist_keeps_the_task_as_no_target(
    project: Path, all_families: dict[str, Family], cli: Cli
) -> None:
    spec = write_app(
        project,
        SPLIT_APP.format(extra="app.conf.task_routes = {'apps.users.*': 'onion-gone'}"),
    )
    seed_before_the_split(all_families["default"])
    done = as_json(
        cli.ok("move", "default", "--celery-app", spec + ":app", "--execute", "--yes", "--json")
    )
    assert done["tasks"][ACTIVATE]["skipped"] == {"no-target": 1}
    assert "onion-gone" in done["no_target"]["reason"]
    assert done["tasks"][IBFT]["targets"] == {"onion": 2}, "no route: the default queue"
    # Issue 22, 15: the advice is a way that works, not --to the queue that is missing.
    assert done["no_target"]["candidates"] == []
    text = cli.ok("move", "default", "--celery-app", spec + ":app").output
    line = next(line for line in text.splitlines() if "skipped as no-target" in line)
    assert "--to QUEUE (one of: onion-gone)" not in line and "--to onion-gone" not in line
    assert "create queue onion-gone" in line and "pass --route source" in line
    assert "pass --to an existing queue" in line


def test_a_router_that_raises_is_one_sentence_of_advice(
    project: Path, all_families: dict[str, Family], cli: Cli
) -> None:
    extra = (
        "def broken(name, args, kwargs, options, task=None, **kw):\n"
        "    raise ValueError('no route table')\n"
        "app.conf.task_routes = (broken,)\n"
    )
    spec = write_app(project, SPLIT_APP.format(extra=extra))
    seed_before_the_split(all_families["default"])
    text = cli.ok("move", "default", "--celery-app", spec + ":app").output
    line = next(line for line in text.splitlines() if "skipped as no-target" in line)
    assert "ValueError: no route table" in line
    assert line.count("--route source") == 1 and line.count("--to QUEUE") == 1, line
    assert ": pass --to" not in line.split("--route source")[0], "no advice twice"


def test_apply_of_a_plan_whose_target_is_gone_offers_what_apply_can_do(
    project: Path, all_families: dict[str, Family], tmp_path: Path, cli: Cli
) -> None:
    spec = split_app(project)
    seed_before_the_split(all_families["default"])
    plan = tmp_path / "plan.json"
    cli.ok("move", "default", "--celery-app", spec, "--plan-out", str(plan))
    progress = all_families["progress"]
    progress.client.delete_queue(QueueUrl=progress.queue_url)
    text = cli.ok("apply", str(plan)).output
    line = next(line for line in text.splitlines() if "skipped as no-target" in line)
    assert "create queue onion-progress" in line and "--route source" in line
    assert "pass --to" not in line, "apply has no --to"
    assert "--plan-out" in line


def test_inspect_shows_routes_to_and_unregistered_per_group(
    project: Path, all_families: dict[str, Family], cli: Cli
) -> None:
    spec = split_app(project)
    seed_before_the_split(all_families["default"])
    seen = as_json(cli.ok("inspect", "default", "--celery-app", spec, "--json"))
    groups = {g["task"]: g for g in seen["groups"]}
    assert groups[IBFT]["routes_to"] == "onion-checkout" and groups[IBFT]["unregistered"] == 0
    assert groups[LESSON]["routes_to"] == "onion-progress"
    assert groups[ACTIVATE]["routes_to"] is None, "routes to its source: not shown"
    assert groups[DELETED]["unregistered"] == 1
    assert "unregistered" not in groups["(unknown)"], "a body no Celery wrote has no task"
    text = cli.ok("inspect", "default", "--celery-app", spec, "--wide").output
    header = next(line for line in text.splitlines() if line.startswith("task"))
    assert "routes to" in header and "unregistered" in header
    assert "move skips them as unregistered" in text
    plain = cli.ok("inspect", "default", "--wide").output
    assert "routes to" not in plain, "without an app inspect is as it was"


def test_a_plan_records_each_target_and_apply_sends_there(
    project: Path, all_families: dict[str, Family], tmp_path: Path, cli: Cli
) -> None:
    spec = split_app(project)
    default = all_families["default"]
    seed_before_the_split(default)
    plan = tmp_path / "plan.json"
    cli.ok("move", "default", "--celery-app", spec, "--plan-out", str(plan))
    data = json.loads(plan.read_text())
    targets = {i["task"]: i["target"].rsplit("/", 1)[1] for i in data["items"]}
    assert targets[IBFT] == "onion-checkout" and targets[LESSON] == "onion-progress"
    assert data["options"]["route"] == "task"
    routed = {i["task"]: i.get("routed_from") for i in data["items"]}
    assert routed[IBFT] == "onion" and routed[LESSON] == "onion" and routed[ACTIVATE] is None
    # A plan made without routes applies as made, even with the app named now.
    plain = tmp_path / "plain.json"
    cli.ok("move", "default", "--plan-out", str(plain))
    again = as_json(cli.ok("apply", str(plain), "--celery-app", spec, "--json"))
    assert again["tasks"][IBFT]["targets"] == {"onion": 2}
    assert again["tasks"][DELETED]["skipped"] == {"unregistered": 1}, "no worker knows it"
    # Applied without the app: each message goes where the reviewed plan says.
    done = as_json(cli.ok("apply", str(plan), "--execute", "--yes", "--json"))
    assert done["moved"] == 4
    assert bodies_in(default, all_families["checkout"].queue_url) == {IBFT: 2}
    assert bodies_in(default, all_families["progress"].queue_url) == {LESSON: 1}


def test_replay_without_to_sends_each_task_where_it_routes(
    project: Path, all_families: dict[str, Family], tmp_path: Path, cli: Cli
) -> None:
    spec = split_app(project)
    default = all_families["default"]
    seed_before_the_split(default)
    archive = tmp_path / "default.jsonl.gz"
    cli.ok("archive", "default", "--archive", str(archive))
    refused = cli("replay", str(archive))
    assert refused.exit_code == 2 and "replay needs --to QUEUE" in refused.output
    done = as_json(
        cli.ok("replay", str(archive), "--celery-app", spec, "--execute", "--yes", "--json")
    )
    assert done["replayed"] == 4, done
    # A body no Celery wrote has no route, and an archive no source queue to go back to.
    assert done["skipped_by_reason"] == {"unregistered": 1, "no-target": 1}
    assert bodies_in(default, all_families["checkout"].queue_url) == {IBFT: 2}
    assert bodies_in(default, all_families["progress"].queue_url) == {LESSON: 1}
    assert bodies_in(default, default.queue_url) == {ACTIVATE: 1}
    # Issue 22, 15: an archive is not a queue anything dead-letters into.
    text = cli.ok("replay", str(archive), "--celery-app", spec).output
    line = next(line for line in text.splitlines() if "skipped as no-target" in line)
    assert str(archive.name) not in line and "dead-letters into" not in line
    assert "not Celery tasks" in line and "pass --to QUEUE" in line
    assert "--route source" not in line


# -- 4. check --celery: each finding from a real app configured that way ---------------------

# What check --celery asks for (the sandbox app has the same): no findings.
GOOD = """
app.conf.task_acks_late = True
app.conf.task_acks_on_failure_or_timeout = False
app.conf.task_time_limit = 25
app.conf.broker_transport_options = {"visibility_timeout": 300}
app.conf.task_routes = {
    "apps.webhooks.tasks.save_checkout_ibft": {"queue": "onion-checkout"},
    "apps.engagements.tasks.save_progress_*": {"queue": "onion-progress"},
}
"""

# The settings the installed Celery reads: 5.7 reads task_acks_on_failure and
# task_acks_on_timeout apart; 5.5 (the floor) reads task_acks_on_failure_or_timeout for both.
ON_FAILURE, ON_TIMEOUT = acks_on_failure_setting(), acks_on_timeout_setting()
SPLIT_ACKS = ON_FAILURE == "task_acks_on_failure"
NAME_57 = "acks_on_failure, Celery 5.7's name"

MISCONFIGURED = {
    "task_acks_late": ("app.conf.task_acks_late = False", "task_acks_late = False"),
    "acks_on_failure": (
        "app.conf.task_acks_on_failure_or_timeout = True",
        # Issue 37, 5: the setting the installed Celery reads, and a dead worker too.
        f"{ON_FAILURE} = True: a task that fails (it raises, or its worker process "
        "dies and task_reject_on_worker_lost is unset) is acknowledged all the same",
    ),
    NAME_57: (
        "app.conf.task_acks_on_failure = True",
        "task_acks_on_failure = True",
    ),
    "no time limit": ("app.conf.task_time_limit = None", "task_time_limit = None"),
    "one task's own acks_late": (
        "\n@app.task(name='apps.reports.tasks.export_csv', acks_late=False, shared=False)\n"
        "def export(*args):\n    pass\n",
        "task_acks_late = False: a task is acknowledged when a worker receives it, so one "
        "that fails is never received again and never reaches the DLQ: set task_acks_late = "
        "True (task apps.reports.tasks.export_csv)",
    ),
    "one task's own time limit": (
        "\n@app.task(name='apps.reports.tasks.export_csv', time_limit=120, shared=False)\n"
        "def export(*args):\n    pass\n",
        "task_time_limit = 120s: longer than the deploy's stop timeout (30s): a run still "
        "going when a deploy stops the worker is SIGKILLed and delivered again after every "
        "deploy (task apps.reports.tasks.export_csv)",
    ),
    "time limit over the stop timeout": (
        "app.conf.task_time_limit = 600\n"
        "app.conf.broker_transport_options = {'visibility_timeout': 900}",
        "task_time_limit = 600s: longer than the deploy's stop timeout (30s)",
    ),
    "visibility under the time limit": (
        "app.conf.broker_transport_options = {'visibility_timeout': 20}",
        "visibility_timeout = 20s: shorter than the task's time limit",
    ),
    "visibility under a retry countdown": (
        "app.conf.broker_transport_options = {'visibility_timeout': 60}",
        # Issue 22: the countdown is stated (Celery's default_retry_delay: 3 minutes).
        "visibility_timeout = 60s: shorter than the task's retry countdown (180s, "
        "default_retry_delay): a worker holds the retried message that long, and SQS "
        "delivers it again after 60s (every task)",
    ),
    "visibility under a backoff's countdown": (
        "\n@app.task(name='apps.reports.tasks.export_csv', retry_backoff=True, "
        "retry_backoff_max=900, shared=False)\ndef export(*args):\n    pass\n",
        "visibility_timeout = 300s: shorter than the task's retry countdown (up to 900s, "
        "retry_backoff_max): a worker holds the retried message that long, and SQS delivers "
        "it again after 300s (task apps.reports.tasks.export_csv)",
    ),
    "no time limit, without acks_late": (
        "app.conf.task_time_limit = None\n"
        "\n@app.task(name='apps.reports.tasks.export_csv', acks_late=False, shared=False)\n"
        "def export(*args):\n    pass\n",
        # Issue 22: acknowledged on receipt, a SIGKILLed run is lost, not delivered again.
        "task_time_limit = None: no hard time limit: a run longer than the deploy's stop "
        "timeout (30s) is SIGKILLed by every deploy and lost: acknowledged when a worker "
        "received it (task_acks_late = False), it is never delivered again and never reaches "
        "the DLQ; set task_time_limit below 30s (config [celery] deploy_stop_timeout) (task "
        "apps.reports.tasks.export_csv)",
    ),
    "a predefined queue under another family's name": (
        "app.conf.broker_transport_options = {'visibility_timeout': 300, 'predefined_queues': "
        "{'onion-progress': {'url': 'https://sqs.us-east-1.amazonaws.com/1/onion-checkout'}}}",
        "predefined_queues = onion-progress = https://sqs.us-east-1.amazonaws.com/1/"
        "onion-checkout: family checkout's queue, though the Celery queue onion-progress is "
        "family progress's: tasks routed to onion-progress are sent to onion-checkout, not to "
        "onion-progress",
    ),
    "route outside the families": (
        "app.conf.task_routes = {**app.conf.task_routes, 'apps.users.*': 'onion-users'}",
        "task_routes = onion-users: routes task apps.users.tasks.activate_user to a queue "
        "outside the configured families",
    ),
    "family queue no route uses": (
        "app.conf.task_routes = {}",
        "family checkout's queue: no task routes to it",
    ),
    "predefined queue elsewhere": (
        "app.conf.broker_transport_options = {'visibility_timeout': 300, 'predefined_queues': "
        "{'onion': {'url': 'https://sqs.eu-west-1.amazonaws.com/1/atlas-default'}}}",
        "predefined_queues = onion = https://sqs.eu-west-1.amazonaws.com/1/atlas-default: not "
        "the queue of any configured family",
    ),
}


def test_a_well_configured_app_gives_no_finding(
    project: Path, all_families: dict[str, Family], cli: Cli
) -> None:
    spec = split_app(project, extra=GOOD)
    report = as_json(cli.ok("check", "--celery", "--celery-app", spec, "--json"))
    assert report["findings"] == []
    # Issue 22: the sentence is finished (it ended "and the Celery app's settings").
    assert cli.ok("check", "--celery", "--celery-app", spec).output == (
        "no findings: the layout matches what SQS says, and the settings of the Celery app "
        f"{spec} let failing tasks reach the DLQs redrive watches\n"
        "broker: SQS at https://sqs.us-east-1.amazonaws.com\n"  # issue 39: what it read
    )
    sandbox_app = "redrive.sandbox.celery_app:app"
    assert (
        as_json(cli.ok("check", "--celery", "--celery-app", sandbox_app, "--json"))["findings"]
        == []
    )


@pytest.mark.parametrize("case", list(MISCONFIGURED), ids=list(MISCONFIGURED))
def test_each_misconfiguration_is_a_finding(case: str, project: Path) -> None:
    from redrive.reporting.check import check_celery

    setting, expected = MISCONFIGURED[case]
    spec = split_app(project, extra=GOOD + setting)
    app = load_app(spec)
    findings = check_celery(app, spec, AppRoutes(app, spec), built_in_layout({}))
    problems = [f.problem for f in findings]
    if case == NAME_57 and not SPLIT_ACKS:
        # A Celery before 5.7 has no such setting and ignores it: nor does redrive judge it.
        assert not any("acknowledged all the same" in p for p in problems), problems
        return
    assert any(expected in p for p in problems), problems
    assert all(f.setting and f.queue == f"app {spec}" for f in findings)


def test_a_dead_workers_task_is_judged_as_the_installed_celery_handles_it(project: Path) -> None:
    """Issue 37, 5: with acks_late and failures not acknowledged, Celery rejects a dead pool
    process's task without requeue (dead-lettered): no finding, where check --celery said it
    was lost and asked for task_reject_on_worker_lost, which requeues it (a task that always
    kills its worker then loops on a classic queue: that is the finding now, on RabbitMQ;
    kombu's SQS transport leaves a requeued message for SQS as a rejected one).
    tests/test_celery_worker_lost_e2e.py checks each fate against a real worker."""
    from redrive.reporting.check import check_celery

    def lost_findings(extra: str, *, rabbitmq: bool) -> list[str]:
        spec = split_app(project, extra=GOOD + extra)
        app = load_app(spec)
        findings = check_celery(
            app, spec, AppRoutes(app, spec), built_in_layout({}), declared_by_workers=rabbitmq
        )
        return [f.problem for f in findings if f.setting == "task_reject_on_worker_lost"]

    for rabbitmq in (False, True):
        assert lost_findings("", rabbitmq=rabbitmq) == []
        assert lost_findings("app.conf.task_reject_on_worker_lost = False", rabbitmq=rabbitmq) == []
    assert lost_findings("app.conf.task_reject_on_worker_lost = True", rabbitmq=False) == []
    (requeued,) = lost_findings("app.conf.task_reject_on_worker_lost = True", rabbitmq=True)
    assert requeued.startswith(
        "task_reject_on_worker_lost = True: a task whose worker process dies (OOM, SIGKILL) is "
        "requeued, never dead-lettered: one that kills its worker every time is delivered "
        "again without end on a classic queue"
    ), requeued
    assert f"unset it: with {ON_FAILURE} = False" in requeued


def test_no_time_limit_on_rabbitmq_says_a_classic_queue_never_dead_letters(
    project: Path,
) -> None:
    """Issue 37, 5: "delivered again, toward the DLQ" holds where the broker counts
    deliveries (SQS, a quorum queue); a classic RabbitMQ queue delivers it again without end."""
    from redrive.reporting.check import check_celery

    spec = split_app(project, extra=GOOD + "app.conf.task_time_limit = None\n")
    app = load_app(spec)
    for rabbitmq, words in ((False, "toward the DLQ;"), (True, "a classic queue delivers")):
        findings = check_celery(
            app, spec, AppRoutes(app, spec), built_in_layout({}), declared_by_workers=rabbitmq
        )
        (limit,) = [f.problem for f in findings if f.setting == "task_time_limit"]
        assert words in limit, limit


def test_an_overrunning_task_is_judged_as_the_installed_celery_handles_it(
    project: Path,
) -> None:
    """Issue 37, 5: Celery 5.7 acknowledges a run killed at its hard time limit where
    task_acks_on_timeout is True (its default, whatever task_acks_on_failure says), and
    requeues it where it is False (a classic RabbitMQ queue never dead-letters it); a soft
    limit below the hard one makes it a failure. tests/test_celery_worker_lost_e2e.py
    checks each against a real worker."""
    from redrive.reporting.check import check_celery

    def overrun(extra: str, *, rabbitmq: bool) -> dict[str, str]:
        spec = split_app(project, extra=GOOD + extra)
        app = load_app(spec)
        findings = check_celery(
            app, spec, AppRoutes(app, spec), built_in_layout({}), declared_by_workers=rabbitmq
        )
        return {
            f"{f.setting} = {f.value}": f.problem
            for f in findings
            if f.setting in (ON_TIMEOUT, "task_soft_time_limit")
        }

    # GOOD: a hard limit of 25 s, failures and timeouts not acknowledged.
    assert overrun("", rabbitmq=False) == {}
    (requeued,) = overrun("", rabbitmq=True).items()
    assert requeued[0] == "task_soft_time_limit = None"
    assert f"is requeued ({ON_TIMEOUT} = False), never dead-lettered" in requeued[1]
    assert "set task_soft_time_limit below task_time_limit" in requeued[1]
    (late,) = overrun("app.conf.task_soft_time_limit = 30\n", rabbitmq=True)
    assert late == "task_soft_time_limit = not below task_time_limit"
    for rabbitmq in (False, True):
        assert overrun("app.conf.task_soft_time_limit = 20\n", rabbitmq=rabbitmq) == {}
        if not SPLIT_ACKS:
            continue  # before 5.7, one setting acks failures and timeouts alike
        lost = overrun(
            "app.conf.task_acks_on_failure_or_timeout = None\n"
            "app.conf.task_acks_on_failure = False\n",
            rabbitmq=rabbitmq,
        )
        assert list(lost) == ["task_acks_on_timeout = True"], lost
        assert "acknowledged all the same: it is lost" in lost["task_acks_on_timeout = True"]
        assert ("task_acks_on_timeout = False" in lost["task_acks_on_timeout = True"]) is (
            not rabbitmq
        )


def test_the_sandbox_app_gives_no_finding_on_either_broker() -> None:
    """Issue 37, 9: on RabbitMQ the sandbox's own app failed check --celery (task_queues =
    None): it now declares each family's queue with its DLX, and each DLQ."""
    from redrive.reporting.check import check_celery

    spec = "redrive.sandbox.celery_app:app"
    app = load_app(spec)
    for rabbitmq in (False, True):
        findings = check_celery(
            app, spec, AppRoutes(app, spec), built_in_layout({}), declared_by_workers=rabbitmq
        )
        assert findings == [], findings


def test_no_time_limit_says_per_acks_late_what_a_deploy_does(project: Path) -> None:
    """Issue 22: tasks with acks_late are delivered again, those without it are lost; each
    finding names its own tasks (it said "delivered again" of every task)."""
    from redrive.reporting.check import check_celery

    spec = split_app(
        project,
        extra=GOOD
        + "app.conf.task_time_limit = None\n"
        + "\n@app.task(name='apps.reports.tasks.export_csv', acks_late=False, shared=False)\n"
        + "def export(*args):\n    pass\n",
    )
    app = load_app(spec)
    findings = check_celery(app, spec, AppRoutes(app, spec), built_in_layout({}))
    limits = [f.problem for f in findings if f.setting == "task_time_limit"]
    assert len(limits) == 2, limits
    again, lost = limits
    assert "delivered again, toward the DLQ" in again and "export_csv" not in again
    assert f"tasks {LESSON}, {ACTIVATE}, {IBFT})" in again
    assert "lost" in lost and "delivered again, toward" not in lost
    assert lost.endswith("(task apps.reports.tasks.export_csv)")


def test_a_familys_dlq_in_predefined_queues_is_no_finding(project: Path) -> None:
    """Issue 22: an app that lists the families' DLQs (named by convention or by the config)
    in predefined_queues lists queues redrive watches: no finding. A queue of no family is
    still one, said without claiming the workers consume it."""
    from redrive.config import Family as LayoutFamily
    from redrive.config import Layout
    from redrive.reporting.check import check_celery

    base = "https://sqs.us-east-1.amazonaws.com/123456789012"
    queues = {
        "onion-checkout": "onion-checkout",
        "onion-checkout-dlq": "onion-checkout-dlq",
        "onion-dlq": "onion-dlq",
        "progress-dead": "progress-dead",
        "onion-archive": "onion-archive",
    }
    predefined = {name: {"url": f"{base}/{queue}"} for name, queue in queues.items()}
    spec = split_app(
        project,
        extra=GOOD
        + "app.conf.broker_transport_options = "
        + repr({"visibility_timeout": 300, "predefined_queues": predefined}),
    )
    layout = Layout(
        families=(
            LayoutFamily("checkout", "onion-checkout"),
            LayoutFamily("default", "onion"),
            LayoutFamily("progress", "onion-progress", dlq="progress-dead"),
        ),
        source="test.toml",
    )
    app = load_app(spec)
    findings = check_celery(app, spec, AppRoutes(app, spec), layout)
    predefined_findings = [
        f for f in findings if f.setting == "broker_transport_options.predefined_queues"
    ]
    assert [f.value for f in predefined_findings] == [f"onion-archive = {base}/onion-archive"]
    (stray,) = predefined_findings
    assert "not the queue of any configured family" in stray.problem
    assert "the workers consume" not in stray.problem
    assert "may send tasks to it or consume it" in stray.problem


def test_check_celery_exits_1_with_findings_in_json_and_the_table(
    project: Path, all_families: dict[str, Family], cli: Cli
) -> None:
    spec = split_app(project, extra=GOOD + "app.conf.task_acks_late = False")
    result = cli("check", "--celery", "--celery-app", spec, "--json")
    assert result.exit_code == 1, result.output
    (finding,) = as_json(result)["findings"]
    assert finding["setting"] == "task_acks_late" and finding["value"] == "False"
    assert "never reaches the DLQ" in finding["problem"]
    text = cli("check", "--celery", "--celery-app", spec, "--wide")
    assert text.exit_code == 1 and "task_acks_late = False" in text.output


def test_check_celery_needs_an_app_and_plain_check_ignores_the_settings(
    project: Path, all_families: dict[str, Family], cli: Cli
) -> None:
    result = cli("check", "--celery")
    assert result.exit_code == 2 and "check --celery needs the Celery app" in result.output
    spec = split_app(project, extra="app.conf.task_acks_late = False")
    assert as_json(cli.ok("check", "--celery-app", spec, "--json"))["findings"] == []


# -- 5. the sandbox -----------------------------------------------------------------------------


def test_the_sandbox_seeds_the_default_dlq_as_the_split_found_it() -> None:
    from datetime import UTC, datetime, timedelta

    from redrive.celery.registry import Registry
    from redrive.sandbox.seeding import sample_dlq

    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    messages = sample_dlq("default", 40, now=now, queue="onion")
    split = {IBFT, LESSON, DELETED}
    found = Counter(decode(m.body).task for m in messages if decode(m.body).task in split)
    assert set(found) == split
    for message in messages:
        if decode(message.body).task in split:
            assert message.story == "split" and message.sent_at <= now - timedelta(days=3)
    spec = "redrive.sandbox.celery_app:app"
    app = load_app(spec)
    routes, registry = AppRoutes(app, spec), Registry(app, spec)
    assert routes.queue_for(IBFT) == "onion-checkout"
    assert routes.queue_for(LESSON) == "onion-progress"
    assert routes.queue_for(ACTIVATE) == "onion"
    assert registry.is_unregistered(DELETED) and not registry.is_unregistered(IBFT)


def test_the_new_options_are_in_help(cli: Cli) -> None:
    assert "--celery-app" in cli.ok("--help").output
    for command in ("move", "replay", "apply"):
        text = cli.ok(command, "--help").output
        for option in ("--route", "--include-unregistered", "--celery-app"):
            assert option in text, (command, option)
    assert "--celery" in cli.ok("check", "--help").output
    assert "--celery-app" in cli.ok("inspect", "--help").output


def test_native_refuses_to_ignore_the_routes(project: Path, family: Family, cli: Cli) -> None:
    spec = split_app(project)
    for args in (("--route", "task"), ("--include-unregistered",), ("--celery-app", spec)):
        result = cli("move", "checkout", "--native", *args)
        assert result.exit_code == 2 and "--native" in result.output, (args, result.output)
    assert "--route source" in cli("move", "checkout", "--native", "--celery-app", spec).output
    # Accepted (in-process moto has no message move tasks, so it goes no further here);
    # global options after the command were refused with --native before (click's UNSET).
    for args in (("--celery-app", spec, "--route", "source"), ("--region", "us-east-1")):
        result = cli("move", "checkout", "--native", *args)
        assert result.exit_code != 2 and "--native" not in result.output, result.output


def test_config_routes_and_celery_tables_are_checked(tmp_path: Path) -> None:
    from redrive.config import parse_config
    from redrive.errors import ConfigError

    families = {"families": {"default": {"queue": "onion"}}}
    with pytest.raises(ConfigError, match=r"'routes\.apps\.x' must be a family name or a queue"):
        parse_config({**families, "routes": {"apps.x": 3}}, "f.toml")
    with pytest.raises(ConfigError, match=r"unknown key 'celery\.broker'"):
        parse_config({**families, "celery": {"broker": "sqs://"}}, "f.toml")
    with pytest.raises(ConfigError, match=r"celery\.deploy_stop_timeout"):
        parse_config({**families, "celery": {"deploy_stop_timeout": "soon"}}, "f.toml")
    layout = parse_config(
        {**families, "celery": {"app": "proj:app", "deploy_stop_timeout": "2m"}}, "f.toml"
    )
    assert layout.celery_app == "proj:app" and layout.deploy_stop_timeout == 120
