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
import warnings
from typing import Any

from redrive.errors import CeleryAppError

_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*(:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*)?$")
INSTALL_HINT = "pip install 'redrive[celery]'"


def load_app(spec: str, *, cwd: str | None = None) -> Any:
    """The Celery app ``spec`` names, finalized (its tasks registered); raises
    :class:`CeleryAppError` with one line saying what is wrong and what to do."""
    spec = spec.strip()
    if not _SPEC.match(spec):
        raise CeleryAppError(
            f"--celery-app {spec!r} is not MODULE:ATTR (e.g. proj.celery:app): "
            "a dotted module path, optionally ':' and the app's attribute"
        )
    celery_class = _celery_class()
    _put_first_on_path(cwd or os.getcwd())
    module_name, _, attr = spec.partition(":")
    # The project's own warnings (a deprecated setting, say) stay warnings: never errors.
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        module = _import(module_name, spec)
        app = _attribute(module, attr, spec) if attr else _find_app(module, spec, celery_class)
        if not isinstance(app, celery_class):
            raise CeleryAppError(
                f"--celery-app {spec}: {spec if attr else module_name} is "
                f"{_a(type(app).__name__)}, not a Celery app"
            )
        _finalize(app, spec)
    return app


def _celery_class() -> type:
    try:
        from celery import Celery
    except ImportError as exc:
        raise CeleryAppError(
            f"--celery-app needs Celery, which cannot be imported here ({_one_line(exc)}): "
            f"{INSTALL_HINT}"
        ) from None
    celery_class: type = Celery
    return celery_class


def _put_first_on_path(directory: str) -> None:
    if directory not in sys.path:
        sys.path.insert(0, directory)


def _import(module_name: str, spec: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise CeleryAppError(
                f"--celery-app {spec}: no module named {missing!r} (looked in the current "
                "directory and sys.path): run redrive from the project's directory, or set "
                "PYTHONPATH"
            ) from None
        raise _raised(spec, module_name, exc) from None
    except (Exception, SystemExit) as exc:
        raise _raised(spec, module_name, exc) from None


def _attribute(module: Any, attr: str, spec: str) -> Any:
    value = module
    for part in attr.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            raise CeleryAppError(
                f"--celery-app {spec}: {module.__name__} has no attribute {attr!r}: name the "
                "Celery app's variable after ':'"
            ) from None
    return value


def _find_app(module: Any, spec: str, celery_class: type) -> Any:
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
                raise _raised(spec, with_celery, exc) from None
        except (Exception, SystemExit) as exc:
            raise _raised(spec, with_celery, exc) from None
        else:
            return _find_app(sub, spec, celery_class)
    apps = [v for v in vars(module).values() if isinstance(v, celery_class)]
    if len(apps) == 1:
        return apps[0]
    raise CeleryAppError(
        f"--celery-app {spec}: {module.__name__} has "
        f"{'no Celery app' if not apps else f'{len(apps)} Celery apps'}: name it as "
        f"{module.__name__}:ATTR"
    )


def _finalize(app: Any, spec: str) -> None:
    """Register the app's tasks now (autodiscovery imports the project's task modules), so
    that a failure there is reported here, in one line, and not in the middle of a move."""
    try:
        app.loader.import_default_modules()
        app.finalize()
    except (Exception, SystemExit) as exc:
        raise CeleryAppError(
            f"--celery-app {spec}: loading its tasks raised {_one_line(exc)}: fix the app "
            "(`celery -A ... inspect registered` shows the same error)"
        ) from None


def _raised(spec: str, module_name: str, exc: BaseException) -> CeleryAppError:
    return CeleryAppError(
        f"--celery-app {spec}: importing {module_name} raised {_one_line(exc)}: fix the "
        f"import (`python -c 'import {module_name}'` shows the traceback)"
    )


def _one_line(exc: BaseException) -> str:
    message = " ".join(str(exc).split())
    if len(message) > 300:
        message = message[:297] + "..."
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in "aeiou" else f"a {noun}"
