"""Tests for redrive.repair.paths and redrive.repair.edits: the edits' words, every path form
and every refusal (one line, the fix written out), and applying edits to a task's content."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from redrive.errors import UsageProblem
from redrive.message_record import FIELDS
from redrive.repair.edits import (
    CLEAR_ETA,
    CLEAR_EXPIRES,
    Rename,
    SetValue,
    TaskContent,
    Unset,
    apply_edits,
    edits_from_options,
    parse_edit_words,
    parse_rename,
    parse_set,
    parse_unset,
)
from redrive.repair.paths import parse_path, split_assignment
from redrive.where import compile_expression

CONTENT = TaskContent(
    args=[1042, "les-9", [10, 20]],
    kwargs={
        "currency": "USD",
        "address": {"zip": "1000", "city": "Lisboa"},
        "odd key": 1,
        "a=b": 2,
        "items": [{"sku": "x1"}, {"sku": "x2"}],
        "note": None,
        "label": "plain",
    },
    eta="2026-11-30T13:00:00+00:00",
    expires="2026-11-30T12:00:00+00:00",
)


def _problem(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(UsageProblem) as caught:
        call(*args, **kwargs)
    text = str(caught.value)
    assert "\n" not in text
    return text


# --- paths ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "root", "steps"),
    [
        ("kwargs.currency", "kwargs", ("currency",)),
        ("args[0]", "args", (0,)),
        ("args[-1]", "args", (-1,)),
        ("kwargs.address.zip", "kwargs", ("address", "zip")),
        ('kwargs."odd key"', "kwargs", ("odd key",)),
        ('kwargs."a=b"', "kwargs", ("a=b",)),
        ('kwargs."a.b"', "kwargs", ("a.b",)),
        ("kwargs.items[1].sku", "kwargs", ("items", 1, "sku")),
        ("args[2][0]", "args", (2, 0)),
        ("kwargs", "kwargs", ()),
        ("args", "args", ()),
    ],
)
def test_every_path_form_parses_to_its_steps(text: str, root: str, steps: tuple[Any, ...]) -> None:
    path = parse_path(text, option="--set")
    assert (path.root, path.steps, path.text) == (root, steps, text)


@pytest.mark.parametrize(
    "text",
    [
        "kwargs.currency",
        "args[0]",
        "args[-1]",
        "kwargs.address.zip",
        'kwargs."odd key"',
        "kwargs.items[1].sku",
        "args[2][0]",
    ],
)
def test_a_path_reads_the_place_that_where_reads(text: str) -> None:
    # The same words in --where and in an edit name the same place.
    assert {"args", "kwargs"} <= set(FIELDS)
    record = {"args": CONTENT.args, "kwargs": CONTENT.kwargs}
    expected = compile_expression(text).evaluate(record)
    path = parse_path(text, option="--set")
    value: Any = record[path.root]
    for step in path.steps:
        value = value[step]
    assert value == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("kwargs.*", "not a single place"),
        ("args[0:2]", "not a single place"),
        ("kwargs.items[?sku=='x1']", "not a single place"),
        ("length(args)", "not a single place"),
        ("kwargs.[a, b]", "not a single place"),
        ("kwargs.", "is not a path"),
        ("kwargs..x", "is not a path"),
        ("[0]", "not a single place"),
    ],
)
def test_a_path_that_names_no_single_place_is_refused_with_examples(text: str, says: str) -> None:
    message = _problem(parse_path, text, option="--unset")
    assert message.startswith("--unset ")
    assert says in message
    assert "args[0], kwargs.address.zip" in message


@pytest.mark.parametrize("root", ["task", "id", "headers", "retries", "eta", "expires", "queue"])
def test_a_path_outside_args_and_kwargs_is_refused(root: str) -> None:
    message = _problem(parse_set, f"{root}.x=1" if root == "headers" else f"{root}=1")
    assert "edits reach args and kwargs only" in message
    assert "--route or --to" in message and "--clear-expires" in message


def test_a_bare_name_is_taken_for_a_kwarg_forgotten() -> None:
    message = _problem(parse_set, 'currency="EUR"')
    assert message == (
        """--set 'currency="EUR"': an edit's path starts at args or kwargs; """
        "did you mean kwargs.currency?"
    )


def test_assignment_splits_at_the_first_equals_outside_quotes() -> None:
    assert split_assignment('kwargs."a=b"=1') == ('kwargs."a=b"', "1")
    assert split_assignment('kwargs.x="a=b"') == ("kwargs.x", '"a=b"')
    assert split_assignment('kwargs."a\\"=b"=2') == ('kwargs."a\\"=b"', "2")
    assert split_assignment("kwargs.x") is None


# --- parsing edits ----------------------------------------------------------------------


def test_set_parses_json_values() -> None:
    assert parse_set('kwargs.currency="EUR"').value == "EUR"
    assert parse_set("args[0]=7").value == 7
    assert parse_set('kwargs.address={"zip": "2000"}').value == {"zip": "2000"}
    assert parse_set("kwargs.note=null").value is None
    assert parse_set('kwargs."a=b"=[1, true]').value == [1, True]
    assert parse_set("kwargs.x=1", create=True).create


def test_set_of_a_bare_word_says_strings_are_in_double_quotes() -> None:
    assert _problem(parse_set, "kwargs.currency=EUR") == (
        """--set 'kwargs.currency=EUR': 'EUR' is not JSON; a string is in double quotes: """
        """--set 'kwargs.currency="EUR"'"""
    )
    assert "is not JSON" in _problem(parse_set, "kwargs.x={'a': 1}")
    assert "is not JSON" in _problem(parse_set, "kwargs.x=")


def test_set_without_a_value_shows_the_form() -> None:
    assert _problem(parse_set, "kwargs.currency") == (
        """--set 'kwargs.currency': needs PATH=JSON; write --set 'kwargs.currency="VALUE"' """
        """(e.g. --set 'kwargs.currency="EUR"')"""
    )


def test_set_of_a_whole_root_must_keep_its_shape() -> None:
    assert parse_set("args=[1, 2]").value == [1, 2]
    assert parse_set('kwargs={"a": 1}').value == {"a": 1}
    assert "args is always a list" in _problem(parse_set, "args={}")
    assert "kwargs is always an object" in _problem(parse_set, "kwargs=[]")


def test_unset_refuses_a_whole_root_and_says_how_to_empty_it() -> None:
    assert parse_unset("kwargs.currency") == Unset(parse_path("kwargs.currency", option="x"))
    assert _problem(parse_unset, "kwargs") == (
        "--unset 'kwargs': kwargs itself cannot be removed; to empty it: --set 'kwargs={}'"
    )


def test_rename_renames_a_key_within_its_object() -> None:
    edit = parse_rename("kwargs.address.zip=kwargs.address.postcode")
    assert (edit.old.steps, edit.new.steps) == (("address", "zip"), ("address", "postcode"))
    assert "needs OLD=NEW" in _problem(parse_rename, "kwargs.a")
    assert "not a key of an object" in _problem(parse_rename, "args[0]=args[1]")
    assert "not a key of an object" in _problem(parse_rename, "kwargs=kwargs.x")
    assert "the same key" in _problem(parse_rename, "kwargs.a=kwargs.a")
    assert _problem(parse_rename, "kwargs.address.zip=kwargs.postcode") == (
        "--rename 'kwargs.address.zip=kwargs.postcode': OLD and NEW must be keys of the same "
        "object; --rename 'kwargs.address.zip=kwargs.address.postcode'"
    )
    assert "edits reach args and kwargs only" in _problem(parse_rename, "kwargs.a=headers.a")


def test_create_without_a_set_is_refused() -> None:
    assert _problem(edits_from_options, unsets=["kwargs.a"], create=True) == (
        "--create applies to --set: add --set PATH=JSON, or drop --create"
    )


@pytest.mark.parametrize(
    ("options", "place"),
    [
        ({"sets": ["kwargs.a=1", "kwargs.a=2"]}, "kwargs.a"),
        ({"sets": ["kwargs.a=1"], "unsets": ["kwargs.a"]}, "kwargs.a"),
        ({"sets": ["kwargs.a.b=1", 'kwargs.a={"b": 2}']}, "kwargs.a"),
        ({"sets": ["kwargs.b=1"], "renames": ["kwargs.a=kwargs.b"]}, "kwargs.b"),
        ({"unsets": ["args[-1]"], "sets": ["args[1]=5"]}, "args[1]"),
        ({"sets": ['kwargs={"x": 1}', "kwargs.y=2"]}, "kwargs"),
    ],
)
def test_two_edits_of_one_place_are_refused(options: dict[str, Any], place: str) -> None:
    message = _problem(edits_from_options, **options)
    assert message.endswith(f"both change {place}: give one edit per place")


@pytest.mark.parametrize(
    "options",
    [
        {"unsets": ["args[0]"], "sets": ["args[1]=5"]},
        {"unsets": ["args[0]", "args[2]"]},
        {"unsets": ["kwargs.items[0]"], "renames": ["kwargs.items[1].sku=kwargs.items[1].id"]},
    ],
)
def test_an_unset_element_is_alone_in_its_list(options: dict[str, Any]) -> None:
    message = _problem(edits_from_options, **options)
    assert "moves every element after it" in message
    assert message.endswith("give that list one edit, or set it whole")


def test_the_same_edit_twice_is_refused() -> None:
    assert _problem(edits_from_options, unsets=["kwargs.a", "kwargs.a"]) == (
        "--unset kwargs.a is given twice: give it once"
    )


def test_edits_of_different_places_combine() -> None:
    edits = edits_from_options(
        sets=["args[1]=5", 'kwargs.address.zip="2000"'],
        unsets=["kwargs.note", "kwargs.label"],
        renames=["kwargs.currency=kwargs.currency_code"],
        clear_expires=True,
        clear_eta=True,
    )
    assert [type(edit).__name__ for edit in edits] == [
        "Rename",
        "SetValue",
        "SetValue",
        "Unset",
        "Unset",
        "Clear",
        "Clear",
    ]


def test_an_edits_words_parse_back_to_it() -> None:
    edits = edits_from_options(
        sets=['kwargs."odd key"={"é": [1, 2.5, null]}', "args[0]=7"],
        unsets=["kwargs.items[0].sku"],
        renames=["kwargs.currency=kwargs.currency_code"],
        clear_expires=True,
        clear_eta=True,
        create=True,
    )
    words = [word for edit in edits for word in edit.words]
    assert parse_edit_words(words) == edits
    assert "--create" in words
    assert "is not an edit" in _problem(parse_edit_words, ["--where", "x"])
    assert "is not an edit" in _problem(parse_edit_words, ["--set"])


# --- applying ---------------------------------------------------------------------------


def _one(word_kind: str, word: str = "", *, create: bool = False) -> Any:
    if word_kind == "set":
        return parse_set(word, create=create)
    if word_kind == "unset":
        return parse_unset(word)
    return parse_rename(word)


def _apply(*edits: Any) -> tuple[TaskContent, list[tuple[str, str]]]:
    before = copy.deepcopy(CONTENT)
    after, outcomes = apply_edits(CONTENT, edits)
    assert before == CONTENT  # pure: the caller's values never change
    return after, [(outcome.status, outcome.detail) for outcome in outcomes]


def test_set_replaces_a_value_where_it_is() -> None:
    after, outcomes = _apply(_one("set", 'kwargs.currency="EUR"'))
    assert outcomes == [("changed", "")]
    assert after.kwargs["currency"] == "EUR"
    assert list(after.kwargs) == list(CONTENT.kwargs)
    after, _ = _apply(_one("set", "args[-1]=[]"), _one("set", 'kwargs.items[1].sku="y"'))
    assert after.args == [1042, "les-9", []]
    assert after.kwargs["items"] == [{"sku": "x1"}, {"sku": "y"}]
    after, _ = _apply(_one("set", 'kwargs.address.zip="2000"'))
    assert after.kwargs["address"] == {"zip": "2000", "city": "Lisboa"}


def test_set_to_the_value_already_there_changes_nothing() -> None:
    after, outcomes = _apply(_one("set", 'kwargs.currency="USD"'))
    assert outcomes == [("unchanged", 'kwargs.currency is already "USD"')]
    assert after is CONTENT
    # 1042 and 1042.0 are equal in Python, not in the body.
    after, outcomes = _apply(_one("set", "args[0]=1042.0"))
    assert outcomes == [("changed", "")] and after.args[0] == 1042.0
    after, outcomes = _apply(_one("set", "kwargs.note=false"))
    assert outcomes == [("changed", "")] and after.kwargs["note"] is False


@pytest.mark.parametrize(
    ("word", "create", "detail"),
    [
        ('kwargs.region="eu"', False, "no kwargs.region (--create adds it)"),
        ('kwargs.address.street="x"', False, "no kwargs.address.street (--create adds it)"),
        ('kwargs.shipping.zip="x"', False, "no kwargs.shipping"),
        ('kwargs.label.x="x"', True, "kwargs.label is a string, not an object"),
        ('kwargs.note.x="x"', True, "kwargs.note is null, not an object"),
        ("kwargs.currency[0]=1", False, "kwargs.currency is a string, not a list"),
        ("kwargs.address[0]=1", True, "kwargs.address is an object, not a list"),
        ("args[3]=1", False, "no args[3] (args has 3)"),
        ("args[5]=1", True, "no args[5] (args has 3)"),
        ("args[-4]=1", True, "no args[-4] (args has 3)"),
        ("args[0].x=1", True, "args[0] is a number, not an object"),
        ("kwargs.new[0]=1", True, "no kwargs.new"),
        ("kwargs.new[0].x=1", True, "no kwargs.new"),
    ],
)
def test_set_of_a_missing_path_changes_nothing_and_says_why(
    word: str, create: bool, detail: str
) -> None:
    after, outcomes = _apply(_one("set", word, create=create))
    assert outcomes == [("missing", detail)]
    assert after is CONTENT


def test_set_with_create_adds_the_key_and_the_objects_on_the_way() -> None:
    after, outcomes = _apply(_one("set", 'kwargs.region="eu"', create=True))
    assert outcomes == [("changed", "")]
    assert list(after.kwargs)[-1] == "region"
    after, _ = _apply(_one("set", 'kwargs.shipping.address.zip="x"', create=True))
    assert after.kwargs["shipping"] == {"address": {"zip": "x"}}
    after, _ = _apply(_one("set", 'kwargs.address.street="Rua"', create=True))
    assert after.kwargs["address"] == {"zip": "1000", "city": "Lisboa", "street": "Rua"}


def test_set_with_create_appends_an_argument_at_the_end_only() -> None:
    after, outcomes = _apply(_one("set", "args[3]=true", create=True))
    assert outcomes == [("changed", "")]
    assert after.args == [1042, "les-9", [10, 20], True]
    after, _ = _apply(_one("set", "args[2][2]=30", create=True))
    assert after.args[2] == [10, 20, 30]


def test_set_of_a_whole_root() -> None:
    after, outcomes = _apply(_one("set", 'args=["x"]'))
    assert outcomes == [("changed", "")] and after.args == ["x"]
    after, outcomes = _apply(_one("set", "args=" + '[1042, "les-9", [10, 20]]'))
    assert outcomes[0][0] == "unchanged"


def test_unset_removes_a_key_or_an_element() -> None:
    after, outcomes = _apply(_one("unset", "kwargs.address.city"), _one("unset", "args[0]"))
    assert outcomes == [("changed", ""), ("changed", "")]
    assert after.kwargs["address"] == {"zip": "1000"}
    assert after.args == ["les-9", [10, 20]]
    after, _ = _apply(_one("unset", "kwargs.note"))
    assert "note" not in after.kwargs  # a key holding null is there, and goes


@pytest.mark.parametrize(
    ("word", "detail"),
    [
        ("kwargs.region", "no kwargs.region"),
        ("kwargs.address.street", "no kwargs.address.street"),
        ("kwargs.label.x", "kwargs.label is a string, not an object"),
        ("args[7]", "no args[7] (args has 3)"),
    ],
)
def test_unset_of_a_missing_path_changes_nothing(word: str, detail: str) -> None:
    after, outcomes = _apply(_one("unset", word))
    assert outcomes == [("missing", detail)]
    assert after is CONTENT


def test_rename_keeps_the_keys_place_and_value() -> None:
    after, outcomes = _apply(_one("rename", "kwargs.currency=kwargs.currency_code"))
    assert outcomes == [("changed", "")]
    assert next(iter(after.kwargs)) == "currency_code"
    assert after.kwargs["currency_code"] == "USD" and "currency" not in after.kwargs
    after, _ = _apply(_one("rename", 'kwargs.address.zip=kwargs.address."post code"'))
    assert after.kwargs["address"] == {"post code": "1000", "city": "Lisboa"}


@pytest.mark.parametrize(
    ("word", "status", "detail"),
    [
        ("kwargs.region=kwargs.zone", "missing", "no kwargs.region"),
        ("kwargs.shipping.zip=kwargs.shipping.postcode", "missing", "no kwargs.shipping"),
        ("kwargs.label.a=kwargs.label.b", "missing", "kwargs.label is a string, not an object"),
        ("kwargs.currency=kwargs.label", "taken", "kwargs.label is there already"),
    ],
)
def test_rename_that_cannot_happen_changes_nothing(word: str, status: str, detail: str) -> None:
    after, outcomes = _apply(_one("rename", word))
    assert outcomes == [(status, detail)]
    assert after is CONTENT


def test_clear_sets_the_times_to_none() -> None:
    after, outcomes = _apply(CLEAR_EXPIRES)
    assert outcomes == [("changed", "")]
    assert (after.eta, after.expires) == (CONTENT.eta, None)
    after, _ = _apply(CLEAR_ETA, CLEAR_EXPIRES)
    assert (after.eta, after.expires) == (None, None)
    plain = TaskContent([], {})
    same, outcomes = apply_edits(plain, (CLEAR_EXPIRES, CLEAR_ETA))
    assert same is plain
    assert [(o.status, o.detail) for o in outcomes] == [
        ("unchanged", "no expires"),
        ("unchanged", "no eta"),
    ]


def test_a_set_value_is_not_shared_between_tasks() -> None:
    edit = parse_set('kwargs.address={"zip": "9"}')
    first, _ = apply_edits(CONTENT, [edit])
    first.kwargs["address"]["zip"] = "changed later"
    second, _ = apply_edits(CONTENT, [edit])
    assert second.kwargs["address"] == {"zip": "9"}
    assert edit == SetValue(edit.path, {"zip": "9"})


def test_outcomes_come_in_the_edits_order() -> None:
    edits = (
        parse_rename("kwargs.region=kwargs.zone"),
        parse_set('kwargs.currency="EUR"'),
        CLEAR_ETA,
    )
    _, outcomes = apply_edits(CONTENT, edits)
    assert [outcome.edit for outcome in outcomes] == list(edits)
    assert [outcome.changed for outcome in outcomes] == [False, True, True]
    assert isinstance(outcomes[0].edit, Rename)


def test_a_name_jmespath_would_not_read_bare_is_shown_quoted() -> None:
    _, outcomes = _apply(_one("set", 'kwargs."ção".x=1'), _one("unset", 'kwargs."odd key".y'))
    assert outcomes == [
        ("missing", 'no kwargs."ção"'),
        ("missing", 'kwargs."odd key" is a number, not an object'),
    ]
    message = _problem(parse_rename, 'kwargs.address.zip=kwargs."post code"')
    assert message.endswith("""--rename 'kwargs.address.zip=kwargs.address."post code"'""")
