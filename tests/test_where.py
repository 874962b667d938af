"""--where and --group-by through the CLI (click's CliRunner, in-process moto): inspect,
report, move, purge, archive, replay and plans select exactly the messages an expression
matches, byte for byte; a bad expression is one usage error; nothing matched is 0 matched.
The record itself is tested in test_message_record.py."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import jmespath
import pytest
from click.testing import Result
from conftest import Cli, Family, as_json
from hypothesis import given, settings
from hypothesis import strategies as st

from redrive.archive import read_records
from redrive.cli.exit_codes import EXIT_USAGE
from redrive.errors import UsageProblem
from redrive.messages import decode
from redrive.sandbox.encoder import encode
from redrive.selection import Selection
from redrive.shell import shell_join, shell_quote
from redrive.where import compile_expression, compile_where

CHARGE = "apps.payments.tasks.charge"
REFUND = "apps.payments.tasks.refund"
MAIL = "apps.notifications.tasks.send_email"


# The conftest's one way to run the CLI, under the short names these tests read with.
run = Cli()
ok = run.ok


def usage_error(result: Result, *fragments: str) -> str:
    assert result.exit_code == EXIT_USAGE, (result.output, result.exception)
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.output
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


def seed(family: Family) -> dict[str, dict[str, Any]]:
    """Payments of two users through two providers, and mails: by message id, what each
    message is (its body, as sent)."""
    sent: dict[str, dict[str, Any]] = {}
    specs = [
        (CHARGE, {"user_id": 42, "provider": "stripe"}, 2),
        (CHARGE, {"user_id": 42, "provider": "adyen"}, 2),
        (CHARGE, {"user_id": 7, "provider": "stripe"}, 1),
        (REFUND, {"user_id": 42, "provider": "stripe"}, 2),
        (REFUND, {"user_id": 9, "provider": "adyen"}, 2),
        (MAIL, {"to": "a@example.com"}, 2),
    ]
    for n, (task, kwargs, protocol) in enumerate(specs):
        body = encode(task, [n], kwargs, protocol=protocol, task_id=f"t-{n}")
        attributes = {"tenant": {"DataType": "String", "StringValue": f"tenant-{n % 2}"}}
        message_id = family.send_to_dlq(body, attributes)
        sent[message_id] = {"body": body, "kwargs": kwargs, "task": task, "attributes": attributes}
    return sent


def ids_where(sent: dict[str, dict[str, Any]], **kwargs: Any) -> set[str]:
    return {m for m, s in sent.items() if all(s["kwargs"].get(k) == v for k, v in kwargs.items())}


# -- compiling -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("kwargs.user_id = 42", ["'kwargs.user_id = 42'", "column 16", "kwargs.user_id >>=<< 42"]),
        ("kwargs.", ["'kwargs.'", "kwargs.>><<", "ends too soon"]),
        ("task == 'x", ["Unclosed ' delimiter", ">>'<<x"]),
        ("nosuch(kwargs)", ["unknown function nosuch()"]),
        ("length(args, kwargs)", ["length() takes 1 argument(s), 2 given"]),
        ('kwargs.provider == "stripe"', ["is a field name in JMESPath", "write 'stripe'"]),
        ("", ["--where needs an expression"]),
    ],
)
def test_a_bad_expression_is_a_usage_error_quoting_it_and_marking_the_place(
    text: str, fragments: list[str]
) -> None:
    with pytest.raises(UsageProblem) as info:
        compile_expression(text)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_a_quoted_name_in_a_path_is_still_allowed() -> None:
    assert compile_expression("kwargs.\"user-id\" == '1'").fields == {"kwargs"}


@pytest.mark.parametrize("command", ["inspect", "move", "purge", "archive", "report"])
def test_every_command_refuses_a_bad_where_with_exit_2_before_touching_the_dlq(
    family: Family, command: str
) -> None:
    seed(family)
    args = [command] + (["checkout"] if command != "report" else [])
    usage_error(run(*args, "--where", "kwargs.user_id = 42"), "kwargs.user_id >>=<< 42")
    assert family.depth() == (6, 0)


@pytest.mark.parametrize("command", ["move", "purge", "archive"])
def test_commands_that_act_refuse_a_where_on_the_result_backends_fields(
    family: Family, command: str
) -> None:
    # They do not attach the backend to --where yet: null would match nothing, silently.
    seed(family)
    result = run(command, "checkout", "--where", "state == 'FAILURE'")
    usage_error(result, "--where reads state, which come from the result backend")
    assert family.depth() == (6, 0)


def test_replay_refuses_a_bad_where(tmp_path: Path) -> None:
    archive = tmp_path / "a.jsonl"
    archive.write_text("")
    usage_error(
        run("replay", str(archive), "--to", "onion-checkout", "--where", "args[", "--json"),
        "--where 'args['",
    )


def test_a_bad_group_by_is_a_usage_error(family: Family) -> None:
    usage_error(run("inspect", "checkout", "--group-by", "kwargs..x"), "--group-by 'kwargs..x'")


def test_truth_is_jmespaths_zero_is_true_empty_is_false() -> None:
    where = compile_where(["receive_count"])
    assert where is not None
    assert where.holds({"receive_count": 0})
    for falsy in (None, False, "", [], {}):
        assert not where.holds({"receive_count": falsy})


def test_a_type_error_in_one_messages_data_is_no_match_not_a_crash() -> None:
    expression = compile_expression("length(kwargs.email) > `3`")
    assert expression.evaluate({"kwargs": {"email": 12}}) is None
    assert expression.evaluate({"kwargs": {"email": "a@b.example"}}) is True


def test_selection_describes_its_where_only_when_it_has_one() -> None:
    assert "where" not in Selection().describe()
    selection = Selection(tasks=(CHARGE,), where=compile_where(["kwargs.user_id == `42`"]))
    assert selection.describe()["where"] == ["kwargs.user_id == `42`"]
    assert selection.is_filtered


# -- inspect and report ---------------------------------------------------------------------


def test_inspect_where_counts_only_the_matching_messages(family: Family) -> None:
    seed(family)
    data = as_json(ok("inspect", "checkout", "--where", "kwargs.user_id == `42`", "--json"))
    assert data["total"] == 3 and data["matched"] == 3 and data["scanned"] == 6
    assert data["where"] == ["kwargs.user_id == `42`"]
    assert {g["task"]: g["count"] for g in data["groups"]} == {CHARGE: 2, REFUND: 1}
    assert data["incomplete"] is False
    text = ok("inspect", "checkout", "--where", "kwargs.user_id == `42`").output
    assert "3 matched of 6 message(s) scanned (--where 'kwargs.user_id == `42`')" in text
    assert family.depth() == (6, 0)


def test_several_wheres_must_all_hold(family: Family) -> None:
    seed(family)
    data = as_json(
        ok(
            "inspect",
            "checkout",
            "--where",
            "kwargs.user_id == `42`",
            "--where",
            "kwargs.provider == 'stripe'",
            "--json",
        )
    )
    assert data["total"] == 2


def test_limit_with_where_counts_matches_and_its_note_names_the_limit(family: Family) -> None:
    # 30 mails first, then 30 charges: a limit on scanned messages would stop among the mails.
    for n in range(30):
        family.send_to_dlq(encode(MAIL, [n], {"to": f"{n}@example.com"}, task_id=f"m-{n}"))
    for n in range(30):
        family.send_to_dlq(encode(CHARGE, [n], {"user_id": n}, task_id=f"c-{n}"))
    where = ["--where", f"task == '{CHARGE}'"]
    data = as_json(ok("inspect", "checkout", *where, "--limit", "20", "--json"))
    assert (data["matched"], data["partial"], data["limit"]) == (20, True, 20)
    assert data["scanned"] >= 20
    text = ok("inspect", "checkout", *where, "--limit", "20").output
    assert "note: stopped at --limit 20; the DLQ may hold more" in text
    # Fewer matches than the limit: every message is scanned, and nothing was cut.
    data = as_json(ok("inspect", "checkout", *where, "--limit", "50", "--json"))
    assert (data["matched"], data["scanned"], data["partial"]) == (30, 60, False)
    # With no --where the limit is on messages, as before.
    data = as_json(ok("inspect", "checkout", "--limit", "7", "--json"))
    assert (data["total"], data["scanned"], data["partial"], data["limit"]) == (7, 7, True, 7)
    assert family.depth() == (60, 0)


def test_limit_with_where_counts_matches_in_an_archive_too(family: Family, tmp_path: Path) -> None:
    for n in range(10):
        family.send_to_dlq(encode(MAIL, [n], {}, task_id=f"m-{n}"))
        family.send_to_dlq(encode(CHARGE, [n], {"user_id": n}, task_id=f"c-{n}"))
    archive = str(tmp_path / "all.jsonl.gz")
    ok("archive", "checkout", "--archive", archive)
    where = ["--where", f"task == '{CHARGE}'"]
    data = as_json(ok("inspect", archive, *where, "--limit", "6", "--json"))
    assert (data["matched"], data["partial"], data["limit"]) == (6, True, 6)
    assert "stopped at --limit 6" in ok("inspect", archive, *where, "--limit", "6").output


def test_nothing_matched_is_not_an_error_and_says_0_matched(family: Family) -> None:
    seed(family)
    where = "kwargs.user_id == `1000`"
    data = as_json(ok("inspect", "checkout", "--where", where, "--json"))
    assert (data["total"], data["matched"], data["scanned"], data["groups"]) == (0, 0, 6, [])
    assert "0 matched of 6 message(s) scanned" in ok("inspect", "checkout", "--where", where).output
    moved = ok("move", "checkout", "--where", where).output
    assert "6 scanned, 0 matched" in moved


def test_a_missing_field_is_null_not_an_error(family: Family) -> None:
    seed(family)
    data = as_json(ok("inspect", "checkout", "--where", "kwargs.no_such == `null`", "--json"))
    assert data["total"] == 6
    data = as_json(ok("inspect", "checkout", "--where", "kwargs.no_such.x", "--json"))
    assert data["total"] == 0


def test_group_by_an_expression_keeps_the_columns_with_its_value_for_the_task(
    family: Family,
) -> None:
    seed(family)
    data = as_json(ok("inspect", "checkout", "--group-by", "kwargs.provider", "--json"))
    assert data["group_by"] == "kwargs.provider"
    groups = {g["task"]: g for g in data["groups"]}
    assert {k: g["count"] for k, g in groups.items()} == {"stripe": 3, "adyen": 2, None: 1}
    by_task = as_json(ok("inspect", "checkout", "--json"))["groups"][0]
    assert set(groups["stripe"]) == set(by_task)  # the same columns
    assert len(groups["stripe"]["sample_task_ids"]) == 3
    text = ok("inspect", "checkout", "--group-by", "kwargs.provider", "--wide").output
    header = next(line for line in text.splitlines() if line.startswith("kwargs.provider"))
    assert "count" in header and "consumer receives" in header
    assert any(line.startswith("stripe ") for line in text.splitlines())
    assert any(line.startswith("null ") for line in text.splitlines())


def test_group_by_with_where_and_numbers(family: Family) -> None:
    seed(family)
    data = as_json(
        ok(
            "inspect",
            "checkout",
            "--where",
            "task != 'apps.notifications.tasks.send_email'",
            "--group-by",
            "kwargs.user_id",
            "--json",
        )
    )
    assert {g["task"]: g["count"] for g in data["groups"]} == {42: 3, 7: 1, 9: 1}


def test_group_by_message_attribute_and_queue(family: Family) -> None:
    seed(family)
    data = as_json(ok("inspect", "checkout", "--group-by", "attributes.tenant", "--json"))
    assert {g["task"]: g["count"] for g in data["groups"]} == {"tenant-0": 3, "tenant-1": 3}
    data = as_json(ok("inspect", "checkout", "--group-by", "queue", "--json"))
    assert {g["task"]: g["count"] for g in data["groups"]} == {"onion-checkout": 6}


def test_report_where_and_group_by(all_families: dict[str, Family]) -> None:
    seed(all_families["checkout"])
    data = as_json(
        ok(
            "report",
            "--format",
            "json",
            "--where",
            "kwargs.user_id == `42`",
            "--group-by",
            "kwargs.provider",
        )
    )
    assert data["where"] == ["kwargs.user_id == `42`"] and data["group_by"] == "kwargs.provider"
    assert data["total"] == 3
    (checkout,) = [q for q in data["queues"] if q["family"] == "checkout"]
    assert {g["task"]: g["count"] for g in checkout["groups"]} == {"stripe": 2, "adyen": 1}
    text = ok("report", "--where", "kwargs.user_id == `42`", "--group-by", "kwargs.provider")
    assert "Only the messages that match --where 'kwargs.user_id == `42`'." in text.output
    assert "kwargs.provider" in text.output


# -- move, purge, archive, replay, plans, audit ---------------------------------------------


def test_move_by_kwarg_moves_exactly_the_matching_messages_byte_identical(
    family: Family,
) -> None:
    sent = seed(family)
    where = "kwargs.user_id == `42`"
    dry = as_json(ok("move", "checkout", "--where", where, "--json"))
    assert dry["dry_run"] and dry["matched"] == 3 and dry["moved"] == 3
    assert family.depth() == (6, 0)

    done = as_json(ok("move", "checkout", "--where", where, "--execute", "--yes", "--json"))
    assert (done["matched"], done["moved"], done["scanned"]) == (3, 3, 6)
    arrived = family.drain(family.queue_url)
    wanted = ids_where(sent, user_id=42)
    assert sorted(m["Body"] for m in arrived) == sorted(sent[i]["body"] for i in wanted)
    for m in arrived:
        original = next(s for s in sent.values() if s["body"] == m["Body"])
        assert m["MessageAttributes"]["tenant"] == original["attributes"]["tenant"]
    left = {m["Body"] for m in family.drain(family.dlq_url)}
    assert left == {sent[i]["body"] for i in set(sent) - wanted}


def test_where_combines_with_task_and_age_filters(family: Family) -> None:
    sent = seed(family)
    data = as_json(
        ok(
            "move",
            "checkout",
            "--task",
            REFUND,
            "--where",
            "kwargs.user_id == `42`",
            "--newer-than",
            "1h",
            "--json",
        )
    )
    assert data["matched"] == 1 and data["moved"] == 1
    assert list(data["by_task"]) == [REFUND]
    (planned,) = ids_where(sent, user_id=42) & {m for m, s in sent.items() if s["task"] == REFUND}
    assert planned
    # Every message is minutes old: none is over a day.
    data = as_json(ok("move", "checkout", "--where", "age_seconds > `86400`", "--json"))
    assert data["matched"] == 0
    data = as_json(ok("move", "checkout", "--where", "age_seconds < `86400`", "--json"))
    assert data["matched"] == 6


def test_purge_by_kwarg_archives_and_deletes_exactly_the_matching_messages(
    family: Family, tmp_path: Path
) -> None:
    sent = seed(family)
    archive = str(tmp_path / "adyen.jsonl.gz")
    where = "kwargs.provider == 'adyen'"
    data = as_json(
        ok(
            "purge",
            "checkout",
            "--where",
            where,
            "--archive",
            archive,
            "--execute",
            "--yes",
            "--json",
        )
    )
    assert (data["matched"], data["archived"], data["purged"]) == (2, 2, 2)
    wanted = ids_where(sent, provider="adyen")
    records = list(read_records(archive))
    assert {r.message_id for r in records} == wanted
    assert {r.body for r in records} == {sent[i]["body"] for i in wanted}
    left = {m["MessageId"] for m in family.drain(family.dlq_url)}
    assert left == set(sent) - wanted


def test_an_unarchived_purge_with_where_deletes_only_the_matches_never_purgequeue(
    family: Family,
) -> None:
    sent = seed(family)
    data = as_json(
        ok(
            "purge",
            "checkout",
            "--where",
            "kwargs.user_id == `9`",
            "--no-archive",
            "--execute",
            "--yes",
            "--json",
        )
    )
    assert (data["matched"], data["purged"]) == (1, 1)
    left = {m["MessageId"] for m in family.drain(family.dlq_url)}
    assert left == set(sent) - ids_where(sent, user_id=9)


def test_archive_and_replay_select_by_where(family: Family, tmp_path: Path) -> None:
    sent = seed(family)
    archive = str(tmp_path / "all.jsonl.gz")
    data = as_json(ok("archive", "checkout", "--archive", archive, "--json"))
    assert data["archived"] == 6
    only = str(tmp_path / "seven.jsonl.gz")
    data = as_json(
        ok("archive", "checkout", "--where", "kwargs.user_id == `7`", "--archive", only, "--json")
    )
    assert data["archived"] == 1
    assert {r.message_id for r in read_records(only)} == ids_where(sent, user_id=7)

    # Offline: the archive inspected and replayed with the same expression.
    inspected = as_json(ok("inspect", archive, "--where", "kwargs.provider == 'stripe'", "--json"))
    assert inspected["total"] == 3 and inspected["scanned"] == 6
    replayed = as_json(
        ok(
            "replay",
            archive,
            "--to",
            "onion-checkout",
            "--where",
            "kwargs.provider == 'stripe'",
            "--execute",
            "--yes",
            "--json",
        )
    )
    assert replayed["matched"] == 3 and replayed["replayed"] == 3
    bodies = sorted(m["Body"] for m in family.drain(family.queue_url))
    assert bodies == sorted(sent[i]["body"] for i in ids_where(sent, provider="stripe"))


def test_plans_record_the_where_and_apply_acts_on_the_planned_ids(
    family: Family, tmp_path: Path
) -> None:
    sent = seed(family)
    path = tmp_path / "plan.json"
    where = "kwargs.user_id == `42`"
    ok("move", "checkout", "--where", where, "--plan-out", str(path))
    plan = json.loads(path.read_text())
    assert plan["filters"]["where"] == [where]
    assert {i["message_id"] for i in plan["items"]} == ids_where(sent, user_id=42)
    # A new message that matches now is not in the plan: apply leaves it alone.
    late = family.send_to_dlq(encode(CHARGE, [], {"user_id": 42}, task_id="late"))
    done = as_json(ok("apply", str(path), "--execute", "--yes", "--json"))
    assert done["moved"] == 3
    assert {decode(m["Body"]).task_id for m in family.drain(family.queue_url)} == {
        "t-0",
        "t-1",
        "t-3",
    }
    assert late in {m["MessageId"] for m in family.drain(family.dlq_url)}

    purge_plan = tmp_path / "purge.json"
    ok("purge", "checkout", "--where", "kwargs.provider == 'adyen'", "--plan-out", str(purge_plan))
    assert json.loads(purge_plan.read_text())["filters"]["where"] == ["kwargs.provider == 'adyen'"]


def test_the_audit_records_the_where(family: Family, monkeypatch: pytest.MonkeyPatch) -> None:
    seed(family)
    args = ["move", "checkout", "--where", "kwargs.user_id == `7`", "--execute", "--yes"]
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/redrive", *args])
    ok(*args)
    (run_,) = as_json(ok("audit", "--json"))["runs"]
    assert run_["info"]["filters"]["where"] == ["kwargs.user_id == `7`"]
    shown = ok("audit", run_["run_id"]).output
    assert "--where 'kwargs.user_id == `7`'" in shown


def test_native_move_refuses_where(family: Family) -> None:
    usage_error(run("move", "checkout", "--native", "--where", "task"), "--where")


@pytest.mark.parametrize("command", ["inspect", "report", "move", "purge", "archive", "replay"])
def test_help_shows_where(command: str) -> None:
    text = ok(command, "--help").output
    assert "--where EXPR" in text
    if command in ("inspect", "report"):
        assert "--group-by EXPR" in text


def test_an_ordering_comparison_with_a_string_is_no_match_not_a_crash() -> None:
    # jmespath lets Python's TypeError escape here: it must not stop a run.
    expression = compile_expression("kwargs.amount > `100`")
    assert expression.evaluate({"kwargs": {"amount": "250.00"}}) is None
    assert expression.evaluate({"kwargs": {"amount": 250}}) is True


# -- the fast path agrees with jmespath's own interpreter -------------------------------------

NAMES = st.sampled_from(["a", "b", "kwargs", "args"])
# At the top, only the record's own fields (any other name is a usage error); below, anything.
ROOTS = st.sampled_from(["task", "retries", "kwargs", "args"])
LITERALS = st.sampled_from(
    ["`1`", "`0`", "`2.5`", "'x'", "''", "`null`", "`true`", "`false`", "`[]`"]
)
PATHS = st.builds(
    lambda first, rest, index: first + "".join(rest) + index,
    ROOTS,
    st.lists(NAMES.map(lambda n: "." + n), max_size=2),
    st.sampled_from(["", "[0]", "[-1]", "[3]"]),
)
OPERANDS = PATHS | LITERALS
COMPARISONS = st.builds(
    lambda a, op, b: f"{a} {op} {b}",
    OPERANDS,
    st.sampled_from(["==", "!=", "<", "<=", ">", ">="]),
    OPERANDS,
)
EXPRESSIONS = st.recursive(
    COMPARISONS | PATHS,
    lambda inner: (
        st.builds(lambda a, b: f"({a}) && ({b})", inner, inner)
        | st.builds(lambda a, b: f"({a}) || ({b})", inner, inner)
        | inner.map(lambda a: f"!({a})")
    ),
    max_leaves=5,
)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([2.5, "x", "", "y"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300)
@given(text=EXPRESSIONS, record=st.dictionaries(ROOTS, VALUES, max_size=4))
def test_the_fast_path_gives_what_jmespath_gives(text: str, record: dict[str, Any]) -> None:
    expression = compile_expression(text)
    assert expression.fast is not None, text
    try:
        expected = jmespath.search(text, record)
    except Exception:
        expected = None  # evaluate() makes any error no match
    got = expression.evaluate(record)
    assert got == expected and type(got) is type(expected), (text, record, got, expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("args[0:2]", [1, 2]),
        ("length(args[1:]) > `1`", True),
        ("args[?@ > `1`]", [2, 3]),
        ("kwargs.*", [1]),
        ("max(args)", 3),
    ],
)
def test_shapes_beyond_the_fast_path_go_to_jmespath(text: str, expected: Any) -> None:
    expression = compile_expression(text)
    assert expression.fast is None
    assert expression.evaluate({"args": [1, 2, 3], "kwargs": {"a": 1}}) == expected


# -- a name the record cannot have is a usage error (issue 22, point 1) ----------------------

FIELD_LIST = "(the record's fields: task, id, args, kwargs,"


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        # The quotes forgotten: compared with the record's data, a string was meant.
        (
            "kwargs.reason == duplicate",
            ["no field duplicate", "column 18", """--where "kwargs.reason == 'duplicate'\""""],
        ),
        ("duplicate != kwargs.reason", ["""--where "'duplicate' != kwargs.reason\""""]),
        ("kwargs.amount > amount", ["""--where "kwargs.amount > 'amount'\""""]),
        ("starts_with(task, apps)", ["""--where "starts_with(task, 'apps')\""""]),
        # Compared with a literal (or on its own): a path into the arguments was meant.
        ("user_id == `42`", ["did you mean --where 'kwargs.user_id == `42`'?", FIELD_LIST]),
        ("provider == 'stripe'", ["""did you mean --where "kwargs.provider == 'stripe'"?"""]),
        ("contains(['a'], tenant)", ["""did you mean --where "contains(['a'], kwargs.tenant)"?"""]),
        ("user.id == '1'", ["no field user", "kwargs.user.id"]),
        # A negation of null matched every message.
        ("!duplicate", ["no field duplicate", "did you mean --where '!kwargs.duplicate'?"]),
        ("nosuchfield.x", ["no field nosuchfield"]),
        # A field the record has in another case: that field, never kwargs.Task.
        ("Task == 'apps.x'", ["names are case-sensitive", """--where "task == 'apps.x'\""""]),
        ("kwargs.a == `1` && Retries > `2`", ["case-sensitive", "'kwargs.a == `1` && retries"]),
        # Double quotes, wherever they stand for a string.
        ('contains(kwargs.tags, "vip")', ["(double quotes)", """contains(kwargs.tags, 'vip')"""]),
        ('kwargs.provider == "stripe"', ["""--where "kwargs.provider == 'stripe'\""""]),
    ],
)
def test_a_name_the_record_cannot_have_is_a_usage_error_with_the_fix(
    text: str, fragments: list[str]
) -> None:
    with pytest.raises(UsageProblem) as info:
        compile_expression(text)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    assert "kwargs.Task" not in message and "kwargs.Retries" not in message


@pytest.mark.parametrize(
    ("text", "fixed"),
    [
        ("state == null", "--where 'state == `null`'"),
        ("kwargs.flag != true", "--where 'kwargs.flag != `true`'"),
        ("args[?@ == false]", "--where 'args[?@ == `false`]'"),
        ("null", "--where '`null`'"),
    ],
)
def test_bare_json_literals_need_backticks(text: str, fixed: str) -> None:
    with pytest.raises(UsageProblem) as info:
        compile_expression(text)
    message = str(info.value)
    assert "JSON literals need backticks" in message and fixed in message, message


def test_a_bare_number_is_said_to_need_backticks() -> None:
    with pytest.raises(UsageProblem) as info:
        compile_expression("kwargs.user_id == 42")
    assert "a number is a JSON literal, in backticks: `42`" in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        "kwargs.a == kwargs.b",
        "task == kwargs.task",
        "kwargs.reason == 'duplicate'",
        "contains(['acme', 'initech'], attributes.tenant)",
        "contains(kwargs.tags, 'vip') && !kwargs.test",
        "headers.Anything == json.whatever && body != `null`",
        "attributes.Task == 'x' && kwargs.null == `1` && kwargs.\"true\" == `2`",
        "args[?x == `1`] && sort_by(args, &whatever)[0].y",
        "kwargs | reason == 'x'",
        "{t: task, n: receive_count}",
        "`1` == `1`",
        "keys(@)",
    ],
)
def test_names_the_record_has_and_anything_below_them_still_compile(text: str) -> None:
    compile_expression(text)


def test_a_comparison_of_two_arguments_compares_them() -> None:
    expression = compile_expression("kwargs.a == kwargs.b")
    assert expression.evaluate({"kwargs": {"a": 1, "b": 1}}) is True
    assert expression.evaluate({"kwargs": {"a": 1, "b": 2}}) is False


def test_a_group_by_on_a_name_the_record_cannot_have_is_a_usage_error(family: Family) -> None:
    seed(family)
    usage_error(
        run("inspect", "checkout", "--group-by", "provider"),
        "--group-by 'provider': the record has no field provider",
        "did you mean --group-by 'kwargs.provider'?",
    )
    assert family.depth() == (6, 0)


def test_a_forgotten_quote_moves_nothing_and_exits_2(family: Family) -> None:
    # On 201bc81 this moved all 6: kwargs.reason is null in each, and so is "duplicate".
    seed(family)
    for where in ("kwargs.reason == duplicate", "kwargs.provider != null"):
        error = usage_error(run("move", "checkout", "--where", where, "--execute", "--yes"))
        assert "'duplicate'" in error or "`null`" in error, error
        assert family.depth() == (6, 0)
        assert family.depth(family.queue_url) == (0, 0)
    # As meant, it moves exactly what matches (here: nothing has a reason).
    done = as_json(
        ok(
            "move",
            "checkout",
            "--where",
            "kwargs.reason == 'duplicate'",
            "--execute",
            "--yes",
            "--json",
        )
    )
    assert (done["matched"], done["moved"]) == (0, 0)


@pytest.mark.parametrize("command", ["inspect", "report", "purge", "archive"])
def test_every_command_refuses_a_bare_name_before_touching_the_dlq(
    family: Family, command: str
) -> None:
    seed(family)
    args = [command] + (["checkout"] if command != "report" else [])
    usage_error(run(*args, "--where", "state == null"), "JSON literals need backticks")
    usage_error(run(*args, "--where", "Task == 'x'"), """--where "task == 'x'\"""")
    assert family.depth() == (6, 0)


# -- state and exception need a result backend, on inspect and report too (point 10) --------

NO_BACKEND = "reads Celery's result backend: give --result-backend URL"


@pytest.mark.parametrize(
    ("args", "reader"),
    [
        (
            ["inspect", "checkout", "--where", "state == 'FAILURE'"],
            """--where "state == 'FAILURE'\"""",
        ),
        (["inspect", "checkout", "--where", "exception != `null`", "--processes", "2"], "--where"),
        (["inspect", "checkout", "--group-by", "exception"], "--group-by exception"),
        (["inspect", "checkout", "--group-by", "[task, exception]"], "--group-by '[task,"),
        (["report", "--where", "state == 'FAILURE'"], """--where "state == 'FAILURE'\""""),
        (["report", "--group-by", "exception"], "--group-by 'exception'"),
    ],
)
def test_a_where_on_the_result_backend_without_one_is_a_usage_error(
    family: Family, args: list[str], reader: str
) -> None:
    # On 201bc81 --where "state == 'FAILURE'" matched 0 here, exit 0 and no word of why.
    seed(family)
    error = usage_error(run(*args), reader, NO_BACKEND, "[celery] result_backend")
    assert "--celery-app" in error
    assert family.depth() == (6, 0)


def test_inspecting_an_archive_refuses_what_reads_the_result_backend(
    family: Family, tmp_path: Path
) -> None:
    seed(family)
    archive = str(tmp_path / "all.jsonl.gz")
    ok("archive", "checkout", "--archive", archive)
    for option in (["--where", "state == 'FAILURE'"], ["--group-by", "exception"]):
        usage_error(run("inspect", archive, *option), "inspecting an archive does not")
    assert as_json(ok("inspect", archive, "--where", "task != `null`", "--json"))["total"] == 6


def test_with_a_result_backend_a_where_on_state_runs(
    all_families: dict[str, Family], tmp_path: Path
) -> None:
    family = all_families["checkout"]
    pytest.importorskip("celery")
    pytest.importorskip("sqlalchemy")
    from redrive.config import built_in_layout
    from redrive.sandbox.results import write_results

    seed(family)
    # Celery's own table, with no record: every state is null (no task has a record).
    url = write_results(tmp_path / "results.sqlite3", built_in_layout({}), per_family=0, seed=1)
    assert url is not None
    where = "state == 'FAILURE'"
    data = as_json(ok("inspect", "checkout", "--where", where, "--result-backend", url, "--json"))
    assert (data["total"], data["scanned"]) == (0, 6)
    data = as_json(ok("report", "--format", "json", "--where", where, "--result-backend", url))
    assert data["total"] == 0


# -- options echoed back are quoted once, readably (point 18) --------------------------------


@pytest.mark.parametrize(
    ("word", "shown"),
    [
        ("task == 'apps.x'", """"task == 'apps.x'\""""),
        ("kwargs.a != 'b'", """"kwargs.a != 'b'\""""),
        ("kwargs.user_id == `42`", "'kwargs.user_id == `42`'"),
        ("task == 'a' && retries > `1`", """'task == '"'"'a'"'"' && retries > `1`'"""),
        ("""kwargs.x == 'say "hi"'""", """'kwargs.x == '"'"'say "hi"'"'"''"""),
        ("kwargs.p == '$HOME'", """'kwargs.p == '"'"'$HOME'"'"''"""),
        ("!kwargs.x || task == 'y'", """'!kwargs.x || task == '"'"'y'"'"''"""),
        ("a\\b == 'c'", """'a\\b == '"'"'c'"'"''"""),
        ("apps.payments.*", "'apps.payments.*'"),
        ("checkout", "checkout"),
        ("", "''"),
    ],
)
def test_shell_quote_is_readable_and_reads_back_as_itself(word: str, shown: str) -> None:
    assert shell_quote(word) == shown
    assert shlex.split(shell_quote(word)) == [word]
    assert shell_join(["redrive", "inspect", word]) == f"redrive inspect {shown}"


@pytest.mark.e2e  # a shell as a subprocess
def test_a_real_shell_reads_each_quoted_word_back_as_itself() -> None:
    words = [
        "task == 'apps.x'",
        "kwargs.a != 'b'",
        "task == 'a' && retries > `1`",
        "kwargs.p == '$HOME' && kwargs.q == \"x\"",
        "a\\b == 'c' || !x",
    ]
    script = "printf '%s\\n' " + shell_join(words)
    done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == words


def test_where_echoes_are_quoted_once_in_headers_commands_and_the_audit(
    all_families: dict[str, Family], monkeypatch: pytest.MonkeyPatch
) -> None:
    family = all_families["checkout"]
    # On 201bc81 each read --where 'task == '"'"'apps.payments.tasks.refund'"'"''.
    seed(family)
    where = f"task == '{REFUND}'"
    shown = f"--where \"task == '{REFUND}'\""
    assert f"({shown})" in ok("inspect", "checkout", "--where", where).stdout
    assert f"Only the messages that match {shown}." in ok("report", "--where", where).stdout
    dry = ok("move", "checkout", "--where", where).stdout.rstrip().splitlines()
    assert dry[-1].strip() == f"redrive move checkout {shown} --execute --yes"
    assert shlex.split(dry[-1]) == [
        "redrive",
        "move",
        "checkout",
        "--where",
        where,
        "--execute",
        "--yes",
    ]
    args = ["move", "checkout", "--where", where, "--execute", "--yes"]
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/redrive", *args])
    ok(*args)
    (run_,) = as_json(ok("audit", "--json"))["runs"]
    assert run_["info"]["command_line"] == f"redrive move checkout {shown} --execute --yes"
    detail = ok("audit", run_["run_id"]).stdout
    assert f"  filters:  {shown}" in detail
    assert "'\"'\"'" not in detail


def test_an_expression_with_backticks_stays_in_single_quotes_where_it_is_echoed(
    family: Family,
) -> None:
    # A shell runs `...` inside double quotes: such an expression is single-quoted.
    seed(family)
    where = f"task == '{CHARGE}' && kwargs.user_id == `42`"
    dry = ok("move", "checkout", "--where", where).stdout.rstrip().splitlines()
    command = shlex.split(dry[-1])
    assert command[3:5] == ["--where", where]
    assert "--where '" in dry[-1] and '--where "' not in dry[-1]
    text = ok("inspect", "checkout", "--where", where).stdout
    assert "--where 'task == '\"'\"'" in text and '--where "' not in text
