"""--group-by beside a Celery app (--celery-app): groups by a value are not tasks, so the
app's routes and registry annotate none of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Family
from test_celery_app import project, seed_before_the_split, split_app
from test_where import as_json, ok

pytest.importorskip("celery", minversion="5.0")

_ = project  # the fixture, imported: the user's project directory for --celery-app


def test_groups_by_a_value_are_not_tasks_so_celery_annotations_stay_out(
    project: Path, all_families: dict[str, Family]
) -> None:
    spec = split_app(project)
    seed_before_the_split(all_families["default"])
    by_task = as_json(ok("inspect", "default", "--celery-app", spec, "--json"))
    assert any(g.get("unregistered") for g in by_task["groups"])  # the app is asked
    grouped = as_json(
        ok("inspect", "default", "--celery-app", spec, "--group-by", "retries", "--json")
    )
    assert {g["task"] for g in grouped["groups"]} == {0, None}
    assert all("unregistered" not in g and "routes_to" not in g for g in grouped["groups"])
