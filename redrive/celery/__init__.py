"""What redrive knows of the user's Celery app (``--celery-app MODULE:ATTR``): where each task
routes to now (:mod:`~redrive.celery.routes`, also from a ``[routes]`` config table without an
app), which task names the app registers (:mod:`~redrive.celery.registry`), and the settings
that decide whether failing tasks reach a DLQ (:mod:`~redrive.celery.settings_audit`); and
what its result backend says of each task id (:mod:`~redrive.celery.results`, read-only).

Celery is optional (``pip install 'redrive[celery]'``): only :mod:`~redrive.celery.app` and the
modules that read a loaded app touch it, and only once an app is asked for. Nothing here
imports Celery at import time, so redrive runs without it installed.
"""
