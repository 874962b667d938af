"""Loading the user's Celery app as ``celery -A`` does, with one line for every way it fails.

``MODULE:ATTR`` names the app (``proj.celery:app``); a bare ``MODULE`` is looked up as
``celery -A`` looks it up (``MODULE.app``, ``MODULE.celery``, the ``celery`` submodule, else
the module's one Celery instance). The current directory comes first on ``sys.path``, as
for ``celery -A``. Errors raised by the user's code are the user's: they are reported with
their type and message, never as a traceback.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import types
import warnings
from typing import Any

from redrive.celery.streams import users_code
from redrive.errors import CeleryAppError

_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*(:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*)?$")
INSTALL_HINT = "pip install 'redrive[celery]'"


def load_app(spec: str, *, named_by: str | None = None, cwd: str | None = None) -> Any:
    """The Celery app ``spec`` names, finalized (its tasks registered); raises
    :class:`CeleryAppError` with one line saying what is wrong and what to do. ``named_by``
    is how the messages name where the spec came from (``--celery-app SPEC`` by default;
    the config's ``[celery] app``, REDRIVE_CELERY_APP). What the app's code writes while it
    loads goes to stderr (:mod:`redrive.celery.streams`)."""
    spec = spec.strip()
    label = named_by or f"--celery-app {spec}"
    if not _SPEC.match(spec):
        raise CeleryAppError(
            f"{label} is not MODULE:ATTR (e.g. proj.celery:app): a dotted module path, "
            "optionally ':' and the app's attribute"
        )
    celery_class = _celery_class(label)
    _put_first_on_path(cwd or os.getcwd())
    module_name, _, attr = spec.partition(":")
    # The project's own warnings (a deprecated setting, say) stay warnings: never errors.
    with warnings.catch_warnings(), users_code():
        warnings.simplefilter("default")
        module = _import(module_name, label)
        app = _attribute(module, attr, label) if attr else _find_app(module, label, celery_class)
        if not isinstance(app, celery_class):
            raise _not_an_app(app, spec if attr else module_name, label)
        _finalize(app, label)
    return app


def _celery_class(label: str) -> type:
    try:
        from celery import Celery
    except ImportError as exc:
        raise CeleryAppError(
            f"{label}: the Celery app needs Celery, which cannot be imported here "
            f"({_one_line(exc)}): {INSTALL_HINT}"
        ) from None
    celery_class: type = Celery
    return celery_class


def _put_first_on_path(directory: str) -> None:
    if directory not in sys.path:
        sys.path.insert(0, directory)


def _import(module_name: str, label: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise CeleryAppError(
                f"{label}: no module named {missing!r} (looked in the current "
                "directory and sys.path): run redrive from the project's directory, or set "
                "PYTHONPATH"
            ) from None
        raise _raised(label, module_name, exc) from None
    except (Exception, SystemExit) as exc:
        raise _raised(label, module_name, exc) from None


def _attribute(module: Any, attr: str, label: str) -> Any:
    value = module
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise CeleryAppError(
                f"{label}: {module.__name__} has no attribute {attr!r}: name the "
                "Celery app's variable after ':'"
            ) from None
    return value


def _find_app(module: Any, label: str, celery_class: type) -> Any:
    """``celery -A MODULE``: MODULE.app, MODULE.celery, MODULE.celery:app, else the one app."""
    for name in ("app", "celery"):
        value = getattr(module, name, None)
        if isinstance(value, celery_class):
            return value
    if getattr(module, "__path__", None) is not None:
        with_celery = f"{module.__name__}.celery"
        try:
            sub = importlib.import_module(with_celery)
        except ModuleNotFoundError as exc:
            if exc.name != with_celery:
                raise _raised(label, with_celery, exc) from None
        except (Exception, SystemExit) as exc:
            raise _raised(label, with_celery, exc) from None
        else:
            return _find_app(sub, label, celery_class)
    apps = [v for v in vars(module).values() if isinstance(v, celery_class)]
    if len(apps) == 1:
        return apps[0]
    raise CeleryAppError(
        f"{label}: {module.__name__} has "
        f"{'no Celery app' if not apps else f'{len(apps)} Celery apps'}: name it as "
        f"{module.__name__}:ATTR"
    )


def _finalize(app: Any, label: str) -> None:
    """Register the app's tasks now (autodiscovery imports the project's task modules), so
    that a failure there is reported here, in one line, and not in the middle of a move."""
    try:
        app.loader.import_default_modules()
        app.finalize()
    except (Exception, SystemExit) as exc:
        raise CeleryAppError(
            f"{label}: loading its tasks raised {_one_line(exc)}: fix the app "
            "(`celery -A ... inspect registered` shows the same error)"
        ) from None


def _raised(label: str, module_name: str, exc: BaseException) -> CeleryAppError:
    return CeleryAppError(
        f"{label}: importing {module_name} raised {_one_line(exc)}: fix the "
        f"import (`python -c 'import {module_name}'` shows the traceback)"
    )


_NAME_THE_APP = (
    "name the Celery app itself, the `app = Celery(...)` its tasks are registered on, as "
    "`celery -A` takes it (e.g. proj.celery:app)"
)


def _not_an_app(value: Any, named: str, label: str) -> CeleryAppError:
    """``named`` is something else than the app: say what, in words, and what to name."""
    what, hint = _what(value)
    return CeleryAppError(f"{label}: {named} is {what}, not a Celery app: {hint}")


def _what(value: Any) -> tuple[str, str]:
    """What ``value`` is, for people, and what to name instead."""
    from celery.app.task import Task
    from celery.local import Proxy

    if issubclass(type(value), Proxy):
        # @shared_task and a not yet finalized @app.task are Celery's lazy proxies.
        try:
            value = value._get_current_object()
        except Exception:
            return "a Celery task (a @shared_task or @app.task)", _NAME_THE_APP
    if isinstance(value, Task):
        name = getattr(value, "name", None) or type(value).__name__
        return f"the Celery task {name}", _NAME_THE_APP
    if isinstance(value, types.ModuleType):
        return f"the module {value.__name__}", f"name the app in it: {value.__name__}:ATTR"
    if isinstance(value, type):
        return f"the class {value.__name__}", _NAME_THE_APP
    if isinstance(value, types.FunctionType):
        return (
            f"the function {value.__name__}",
            f"redrive does not call it: name the app it makes, made at import "
            f"(app = {value.__name__}())",
        )
    return _a(type(value).__name__), _NAME_THE_APP


def _one_line(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    if len(message) > 300:
        message = message[:297] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"
