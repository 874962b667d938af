"""Tests for redrive.selection: durations and the filters shared by move, purge and replay."""

from __future__ import annotations

import json

import pytest

from redrive import selection as selection_module
from redrive.durations import format_duration, parse_duration
from redrive.messages import UNKNOWN_TASK, TaskInfo, decode
from redrive.sandbox.encoder import encode
from redrive.selection import Selection, Sightings, near_matches

NOW = 1_800_000_000.0
CHECKOUT = "apps.webhooks.tasks.save_checkout_ibft"
EMAIL = "apps.notifications.tasks.send_email"


def info(task: str) -> TaskInfo:
    return decode(encode(task, [1], task_id="t-1"))


def passes(selection: Selection, task: str, *, age: float | None = 60.0, mid: str = "m-1") -> bool:
    sent_at = None if age is None else NOW - age
    return selection.matches(info(task), message_id=mid, sent_at=sent_at, now=NOW)


# -- durations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("6h", 21600),
        ("3d", 259200),
        ("2w", 1209600),
        ("45", 45),
        ("0", 0),
        ("1.5h", 5400),
        (" 3d ", 259200),
        ("3 d", 259200),
        ("6H", 21600),
        ("2W", 1209600),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", " ", "d", "3x", "3dd", "-5m", "1e3", "3d4h", "inf", "1,5h"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-5, "0s"),
        (59.9, "59s"),
        (60, "1m"),
        (3599, "59m"),
        (3600, "1h"),
        (3659, "1h"),
        (3660, "1h 1m"),
        (86399, "23h 59m"),
        (86400, "1d"),
        (90000, "1d 1h"),
        (14 * 86400, "14d"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@pytest.mark.parametrize("text", ["45s", "12m", "5h", "2d"])
def test_format_reads_back(text: str) -> None:
    assert format_duration(parse_duration(text)) == text


# -- task patterns ---------------------------------------------------------------------


def test_empty_selection_passes_everything() -> None:
    selection = Selection()
    assert not selection.is_filtered
    assert passes(selection, CHECKOUT)
    assert passes(selection, CHECKOUT, age=None)
    assert selection.matches(decode("not celery"), message_id="x", sent_at=None, now=NOW)


@pytest.mark.parametrize(
    ("pattern", "matches"),
    [
        (CHECKOUT, True),
        ("apps.webhooks.*", True),
        ("*save_checkout*", True),
        ("apps.webhooks.tasks.save_checkout_ibf?", True),
        ("apps.webhooks.tasks.save_checkout_[a-i]bft", True),
        ("apps.webhooks", False),  # no implicit prefix match
        ("*.send_email", False),
        # Task names are case-sensitive Python paths.
        ("apps.Webhooks.*", False),
        ("APPS.WEBHOOKS.TASKS.SAVE_CHECKOUT_IBFT", False),
        ("*SAVE_CHECKOUT*", False),
    ],
)
def test_task_globs(pattern: str, matches: bool) -> None:
    assert passes(Selection(tasks=(pattern,)), CHECKOUT) is matches


def test_any_of_several_task_patterns() -> None:
    selection = Selection(tasks=("*.send_email", "apps.webhooks.*"))
    assert passes(selection, CHECKOUT)
    assert passes(selection, EMAIL)
    assert not passes(selection, "apps.engagements.tasks.save_progress_lesson")


def test_unknown_task_is_selected_by_its_literal_name() -> None:
    odd = decode(json.dumps({"hello": "world"}))
    assert odd.task == UNKNOWN_TASK
    by_name = Selection(tasks=(UNKNOWN_TASK,))
    assert by_name.matches(odd, message_id="m", sent_at=NOW, now=NOW)
    assert not by_name.matches(info(CHECKOUT), message_id="m", sent_at=NOW, now=NOW)


def test_exclude() -> None:
    selection = Selection(exclude_tasks=("*.send_email",))
    assert passes(selection, CHECKOUT)
    assert not passes(selection, EMAIL)


def test_exclude_wins_over_include() -> None:
    selection = Selection(tasks=("apps.*",), exclude_tasks=(EMAIL,))
    assert passes(selection, CHECKOUT)
    assert not passes(selection, EMAIL)


def test_exclude_is_case_sensitive_too() -> None:
    assert passes(Selection(exclude_tasks=("*.SEND_EMAIL",)), EMAIL)


# -- age -------------------------------------------------------------------------------


def test_older_than() -> None:
    selection = Selection(older_than=3600)
    assert passes(selection, CHECKOUT, age=7200)
    assert passes(selection, CHECKOUT, age=3600)  # exactly as old: in
    assert not passes(selection, CHECKOUT, age=3599)


def test_newer_than() -> None:
    selection = Selection(newer_than=3600)
    assert passes(selection, CHECKOUT, age=10)
    assert passes(selection, CHECKOUT, age=3600)
    assert not passes(selection, CHECKOUT, age=3601)


def test_age_window() -> None:
    selection = Selection(older_than=parse_duration("1h"), newer_than=parse_duration("1d"))
    assert not passes(selection, CHECKOUT, age=60)
    assert passes(selection, CHECKOUT, age=7200)
    assert not passes(selection, CHECKOUT, age=2 * 86400)


def test_age_filter_excludes_messages_without_a_timestamp() -> None:
    # Nothing says how old it is: an age filter cannot vouch for it.
    assert not passes(Selection(older_than=0), CHECKOUT, age=None)
    assert not passes(Selection(newer_than=10**9), CHECKOUT, age=None)
    assert passes(Selection(tasks=("*",)), CHECKOUT, age=None)


# -- message ids and limit -------------------------------------------------------------


def test_message_ids() -> None:
    selection = Selection(message_ids=frozenset({"m-1", "m-3"}))
    assert passes(selection, CHECKOUT, mid="m-1")
    assert passes(selection, EMAIL, mid="m-3")
    assert not passes(selection, CHECKOUT, mid="m-2")


def test_message_ids_and_task_both_apply() -> None:
    selection = Selection(tasks=(EMAIL,), message_ids=frozenset({"m-1"}))
    assert passes(selection, EMAIL, mid="m-1")
    assert not passes(selection, CHECKOUT, mid="m-1")


def test_limit_is_left_to_the_caller() -> None:
    selection = Selection(limit=0)
    assert selection.is_filtered
    assert passes(selection, CHECKOUT)


@pytest.mark.parametrize(
    "selection",
    [
        Selection(tasks=("x",)),
        Selection(exclude_tasks=("x",)),
        Selection(older_than=0),
        Selection(newer_than=0),
        Selection(message_ids=frozenset({"m"})),
        Selection(limit=5),
    ],
)
def test_is_filtered(selection: Selection) -> None:
    assert selection.is_filtered


def test_describe() -> None:
    selection = Selection(
        tasks=("apps.*",),
        exclude_tasks=(EMAIL,),
        older_than=3600.0,
        newer_than=None,
        message_ids=frozenset({"m-2", "m-1"}),
        limit=10,
    )
    described = selection.describe()
    assert described == {
        "tasks": ["apps.*"],
        "exclude_tasks": [EMAIL],
        "older_than_seconds": 3600.0,
        "newer_than_seconds": None,
        "message_ids": ["m-1", "m-2"],
        "limit": 10,
    }
    json.dumps(described)  # plain data, for JSON output and the audit trail


def test_describe_empty() -> None:
    assert Selection().describe() == {
        "tasks": [],
        "exclude_tasks": [],
        "older_than_seconds": None,
        "newer_than_seconds": None,
        "message_ids": [],
        "limit": None,
    }


# -- a filter that matches nothing -------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "near", "suggestion"),
    [
        ("send_email", (EMAIL,), "*.send_email"),  # the last part of a dotted name
        ("apps.notifications.tasks.Send_Email", (EMAIL,), None),  # another case
        ("notifications", (EMAIL,), "*notifications*"),  # a part of a name
        ("apps.notification.tasks.send_emial", (EMAIL,), None),  # spelled alike
        ("apps.webhooks.*_ibtf", (CHECKOUT,), None),  # a glob spelled alike
        ("apps.reports.tasks.build", (), None),
    ],
)
def test_near_matches(pattern: str, near: tuple[str, ...], suggestion: str | None) -> None:
    assert near_matches(pattern, [EMAIL, CHECKOUT]) == (near, suggestion)


def test_sightings_say_which_filters_matched_nothing_and_what_was_there() -> None:
    seen = Sightings(Selection(tasks=("send_email", CHECKOUT), message_ids=frozenset({"a", "z"})))
    for i in range(3):
        seen.add(EMAIL, f"m-{i}")
    seen.add(CHECKOUT, "a")

    misses = seen.misses()

    assert misses is not None
    assert [(p.pattern, p.near, p.suggestion) for p in misses.patterns] == [
        ("send_email", (EMAIL,), "*.send_email")
    ]
    assert misses.tasks_seen == ((EMAIL, 3), (CHECKOUT, 1))
    assert (misses.ids_not_seen, misses.ids_not_seen_count, misses.ids_given) == (("z",), 1, 2)
    assert json.loads(json.dumps(misses.to_json()))["tasks"][0]["suggestion"] == "*.send_email"
    everything_found = Sightings(Selection(tasks=("*",)))
    everything_found.add(EMAIL, "m")
    assert everything_found.misses() is None


def test_sightings_memory_is_capped_and_still_counts_matches_past_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(selection_module, "MAX_SEEN_TASKS", 3)
    seen = Sightings(Selection(tasks=("junk.9", "nothing")))
    for i in range(10):
        seen.add(f"junk.{i}", f"m-{i}")

    misses = seen.misses()

    assert len(seen.tasks) == 3 and seen.uncounted == 7
    assert misses is not None
    # junk.9 was never counted by name, but it matched: only "nothing" missed.
    assert [p.pattern for p in misses.patterns] == ["nothing"]
    assert misses.distinct_tasks == 4  # three names, and more
