"""Apply a plan (``move/purge --plan-out``): exactly its messages, moved or purged by the
move's or the purge's own run (:mod:`.engine`: the plan's options, the result with the
messages gone meanwhile). The coordinator (:mod:`redrive.operations.coordinator`) is how a
front end runs it.
"""

from redrive.operations.apply.engine import (
    ApplyOptions,
    ApplyResult,
    apply_plan,
    plan_move_options,
    plan_purge_options,
)

__all__ = ["ApplyOptions", "ApplyResult", "apply_plan", "plan_move_options", "plan_purge_options"]
