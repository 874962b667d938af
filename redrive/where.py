"""``--where EXPR`` and ``--group-by EXPR``: JMESPath expressions over a message's record
(:mod:`redrive.message_record`), compiled once per run.

Compiling also works out which of the record's fields an expression can read, so that each
message's record holds only those (arguments are decoded only for an expression that reads
them). A malformed expression, an unknown function or a wrong number of arguments is a
usage error at compile time, naming the expression and marking the place. So is a name at
the top of the record that is none of its fields (``kwargs.reason == duplicate``, the quotes
forgotten; ``state == null``, the backticks), which would be null in every message and so
decide the same for all of them. While a run evaluates, a field a message lacks is null,
and a type error in one message's data (say ``length(retries)``) makes that message not
match instead of stopping the run.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from jmespath import exceptions as jmespath_errors
from jmespath.functions import Functions
from jmespath.parser import ParsedResult, Parser
from jmespath.visitor import TreeInterpreter

from redrive.broker.base import Delivery
from redrive.errors import UsageProblem
from redrive.message_record import FIELDS, RecordBuilder, ResultLookup
from redrive.messages import TaskInfo
from redrive.shell import shell_quote

__all__ = ["Expression", "Where", "compile_expression", "compile_where", "group_value"]

# Node types whose children all see the value the node sees.
_SAME_INPUT = frozenset(
    {
        "comparator",
        "and_expression",
        "or_expression",
        "not_expression",
        "multi_select_list",
        "multi_select_dict",
        "key_val_pair",
        "function_expression",
    }
)
# Node types whose first child sees the node's value and the others see what it yields.
_FIRST_INPUT = frozenset(
    {
        "subexpression",
        "index_expression",
        "pipe",
        "projection",
        "value_projection",
        "filter_projection",
        "flatten",
    }
)
_LEAVES = frozenset({"literal", "index", "slice", "field", "current", "identity", "expref"})
_WHOLE = frozenset({"current", "identity"})


def _nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    # A slice's children are its numbers (or None), not nodes.
    return [child for child in node.get("children", []) if isinstance(child, dict)]


_Ref = tuple[dict[str, Any], dict[str, Any] | None]
"""A field node read from the record itself, and the node it is a direct child of."""


def _root_fields(
    node: dict[str, Any], at_root: bool = True, parent: dict[str, Any] | None = None
) -> tuple[list[_Ref], bool]:
    """The field nodes of an expression's tree that read the record itself, and whether it
    can see the record whole (``@``, ``*``, ``keys(@)``: then every field is built)."""
    kind = node.get("type")
    children = _nodes(node)
    if kind == "field":
        return ([(node, parent)] if at_root else []), False
    if kind in _WHOLE:
        return [], at_root
    if kind == "expref":
        # An expression reference runs on the elements of an array, never on the record.
        return [], False
    refs: list[_Ref] = []
    whole = kind not in _LEAVES | _SAME_INPUT | _FIRST_INPUT and at_root
    for position, child in enumerate(children):
        sees_root = at_root and (kind not in _FIRST_INPUT or position == 0)
        more, sees_whole = _root_fields(child, sees_root, node)
        refs += more
        whole = whole or sees_whole
    return refs, whole


def _shown(option: str, text: str) -> str:
    """The option as given, for a message: ``--where "task == 'x'"``."""
    return f"{option} {shell_quote(text, always=True)}"


def _functions(node: dict[str, Any]) -> Iterable[tuple[str, int]]:
    if node.get("type") == "function_expression":
        yield str(node["value"]), len(node.get("children", []))
    for child in _nodes(node):
        yield from _functions(child)


def _check_functions(text: str, parsed: dict[str, Any], option: str) -> None:
    """Unknown functions and wrong arities are found by JMESPath only when it evaluates:
    a run must refuse them before it receives anything."""
    for name, given in _functions(parsed):
        spec = Functions.FUNCTION_TABLE.get(name)
        if spec is None:
            known = ", ".join(sorted(Functions.FUNCTION_TABLE))
            raise UsageProblem(
                f"{_shown(option, text)}: unknown function {name}() (JMESPath has: {known})"
            )
        signature = spec["signature"]
        variadic = bool(signature) and signature[-1].get("variadic")
        wanted = len(signature)
        if (variadic and given < wanted) or (not variadic and given != wanted):
            count = f"at least {wanted}" if variadic else str(wanted)
            raise UsageProblem(
                f"{_shown(option, text)}: {name}() takes {count} argument(s), {given} given"
            )


def _marked(text: str, position: int) -> str:
    """The expression with the place JMESPath stopped at marked: ``a >>=<< 1``."""
    position = max(0, min(position, len(text)))
    if position == len(text):
        return f"{text}>><< (it ends too soon)"
    return f"{text[:position]}>>{text[position]}<<{text[position + 1 :]}"


def _parse_error(text: str, exc: jmespath_errors.JMESPathError, option: str) -> UsageProblem:
    if isinstance(exc, jmespath_errors.EmptyExpressionError) or not text.strip():
        example = "\"kwargs.user_id == '42'\""
        return UsageProblem(f"{option} needs an expression, e.g. {option} {example}")
    if isinstance(exc, jmespath_errors.LexerError):
        position, what = exc.lexer_position, str(exc.message)
    elif isinstance(exc, jmespath_errors.IncompleteExpressionError):
        position, what = len(text), "incomplete expression"
    elif isinstance(exc, jmespath_errors.ParseError):
        token = exc.token_value
        position = exc.lex_position
        what = f"unexpected {token!r}" if token not in (None, "") else "unexpected end"
    else:
        position, what = len(text), str(exc)
    hint = ""
    if "=" in text and "==" not in text and "!=" not in text:
        hint = " (comparisons are ==, !=, <, <=, >, >=)"
    elif str(getattr(exc, "token_type", "")).lower() == "number":
        hint = f" (a number is a JSON literal, in backticks: `{exc.token_value}`)"
    elif '"' in text and "'" not in text:
        hint = " (a string literal is in single quotes: kwargs.provider == 'stripe')"
    return UsageProblem(
        f"{_shown(option, text)} is not a JMESPath expression: {what} at column "
        f"{position + 1}: {_marked(text, position)}{hint}"
    )


class _Parser(Parser):  # type: ignore[misc]  # jmespath ships no type information
    """jmespath's parser, each field node also holding where it starts and whether it was a
    quoted identifier: the checks below mark the place, and tell ``"x"`` from ``x``."""

    _CACHE: ClassVar[dict[str, ParsedResult]] = {}  # jmespath's own holds unmarked trees

    def _token_nud_unquoted_identifier(self, token: dict[str, Any]) -> dict[str, Any]:
        node: dict[str, Any] = super()._token_nud_unquoted_identifier(token)
        node["start"] = token["start"]
        return node

    def _token_nud_quoted_identifier(self, token: dict[str, Any]) -> dict[str, Any]:
        node: dict[str, Any] = super()._token_nud_quoted_identifier(token)
        node["start"], node["quoted"] = token["start"], True
        return node


def _walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in _nodes(node):
        yield from _walk(child)


def _refused(text: str, option: str, what: str, start: int, fix: str) -> UsageProblem:
    return UsageProblem(
        f"{_shown(option, text)}: {what} at column {start + 1}: {_marked(text, start)}; {fix}"
    )


def _fixed(text: str, option: str, start: int, end: int, new: str) -> str:
    """The option as it should have been: ``text`` with ``new`` for its ``[start, end)``."""
    return _shown(option, text[:start] + new + text[end:])


def _string_literal(value: str) -> str:
    # A raw string literal escapes only its quote (jmespath's lexer).
    return "'" + value.replace("'", "\\'") + "'"


def _quoted_end(text: str, start: int) -> int:
    """Where the quoted identifier at ``start`` ends (its closing quote included)."""
    at = start + 1
    while at < len(text) and text[at] != '"':
        at += 2 if text[at] == "\\" else 1
    return min(at + 1, len(text))


def _double_quoted(text: str, node: dict[str, Any], option: str) -> UsageProblem:
    value, start = str(node["value"]), int(node["start"])
    return _refused(
        text,
        option,
        f'"{value}" (double quotes) is a field name in JMESPath, not a string,',
        start,
        f"write {_string_literal(value)} (single quotes): "
        + _fixed(text, option, start, _quoted_end(text, start), _string_literal(value)),
    )


def _check_quoted_comparisons(text: str, parsed: dict[str, Any], option: str) -> None:
    """``kwargs.provider == "stripe"`` is valid JMESPath that compares with a *field* named
    stripe (null): it would match nothing, silently. Nobody means that; say so."""
    for node in _walk(parsed):
        if node["type"] == "comparator":
            for operand in _nodes(node):
                if operand["type"] == "field" and operand.get("quoted"):
                    raise _double_quoted(text, operand, option)


_LITERAL_NAMES = frozenset({"null", "true", "false"})


def _check_bare_literals(text: str, parsed: dict[str, Any], option: str) -> None:
    """``state == null`` compares with a *field* named null, as null as any missing field:
    it matched every message. Written bare anywhere but after a dot (``kwargs.null`` is a
    key), null, true and false were meant as JSON literals."""
    for node in _walk(parsed):
        name = node.get("value")
        if node["type"] != "field" or node.get("quoted") or name not in _LITERAL_NAMES:
            continue
        start = int(node["start"])
        if not text[:start].rstrip().endswith("."):
            raise _refused(
                text,
                option,
                f"{name} written bare is a field name in JMESPath (null in every message), "
                "not the JSON literal,",
                start,
                "JSON literals need backticks: "
                + _fixed(text, option, start, start + len(str(name)), f"`{name}`"),
            )


def _reads_record(node: dict[str, Any]) -> bool:
    refs, whole = _root_fields(node)
    return whole or any(field["value"] in FIELDS for field, _ in refs)


def _check_names(text: str, refs: Sequence[_Ref], option: str) -> None:
    """A name at the top of the record that is none of its fields is null in every message,
    so whatever it decides is the same for all of them: ``kwargs.reason == duplicate`` (the
    quotes forgotten) matched every message without a reason, ``!user_id`` every message.
    Nobody means that: a usage error, with the expression as it was most likely meant."""
    for node, parent in sorted(refs, key=lambda ref: int(ref[0]["start"])):
        name, start = str(node["value"]), int(node["start"])
        if name in FIELDS:
            continue
        if node.get("quoted"):
            raise _double_quoted(text, node, option)
        what = f"the record has no field {name} (it would be null in every message)"
        end = start + len(name)
        same = next((f for f in FIELDS if f.lower() == name.lower()), None)
        if same is not None:
            fix = f"names are case-sensitive: {_fixed(text, option, start, end, same)}"
        elif (
            parent is not None
            and parent["type"] in ("comparator", "function_expression")
            and any(_reads_record(peer) for peer in _nodes(parent) if peer is not node)
        ):
            # Compared with (or passed beside) the record's data: a string, its quotes lost.
            literal = _string_literal(name)
            fix = f"a string is in single quotes: {_fixed(text, option, start, end, literal)}"
        else:
            fix = (
                f"did you mean {_fixed(text, option, start, start, 'kwargs.')}? (the "
                f"record's fields: {', '.join(FIELDS)})"
            )
        raise _refused(text, option, what, start, fix)


def _truthy(value: Any) -> bool:
    # JMESPath's own truth, as its filters use it: 0 is true, empty things are false.
    return not (value is None or value is False or value == "" or value == [] or value == {})


Evaluator = Callable[[Any], Any]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fast(node: dict[str, Any]) -> Evaluator | None:
    """The expression as Python closures, for the shapes --where mostly takes (paths,
    indexes, literals, comparisons, &&, ||, !): several times faster than jmespath's tree
    walk, with its exact semantics (tests/test_where.py checks the two agree on random
    records). None for any other shape: jmespath's interpreter evaluates it."""
    kind = node["type"]
    if kind == "slice":
        return None
    children = [_fast(child) for child in _nodes(node)]
    if any(child is None for child in children):
        return None
    parts: list[Evaluator] = [c for c in children if c is not None]
    if kind == "field":
        name = node["value"]
        return lambda v: v.get(name) if isinstance(v, dict) else None
    if kind == "literal":
        constant = node["value"]
        return lambda v: constant
    if kind == "current":
        return lambda v: v
    if kind == "index":
        at = node["value"]
        return lambda v: v[at] if isinstance(v, list) and -len(v) <= at < len(v) else None
    if kind in ("subexpression", "index_expression", "pipe"):
        return _chain(parts)
    if kind == "comparator":
        return _comparator(node["value"], parts[0], parts[1])
    if kind == "and_expression":
        left, right = parts
        return lambda v: right(v) if _truthy(first := left(v)) else first
    if kind == "or_expression":
        left, right = parts
        return lambda v: first if _truthy(first := left(v)) else right(v)
    if kind == "not_expression":
        (inner,) = parts
        return lambda v: False if _is_number(x := inner(v)) and x == 0 else not x
    return None


def _chain(parts: Sequence[Evaluator]) -> Evaluator:
    if len(parts) == 2:
        first, second = parts
        return lambda v: second(first(v))

    def chained(value: Any) -> Any:
        for part in parts:
            value = part(value)
        return value

    return chained


def _comparator(op: str, left: Evaluator, right: Evaluator) -> Evaluator:
    compare = TreeInterpreter.COMPARATOR_FUNC[op]
    if op in ("eq", "ne"):
        return lambda v: compare(left(v), right(v))

    def ordered(value: Any) -> Any:
        # Ordering is for numbers (and strings, as jmespath allows); else null.
        a, b = left(value), right(value)
        if not ((_is_number(a) or isinstance(a, str)) and (_is_number(b) or isinstance(b, str))):
            return None
        return compare(a, b)

    return ordered


@dataclass(frozen=True, slots=True)
class Expression:
    """One compiled expression and the record fields it reads."""

    text: str
    parsed: ParsedResult = field(compare=False, repr=False)
    fields: frozenset[str]
    fast: Evaluator | None = field(default=None, compare=False, repr=False)
    """The closures of :func:`_fast`, when the expression has their shape."""
    names: frozenset[str] = frozenset()
    """The fields it names (``fields`` is every field when it sees the record whole)."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Compiled closures do not pickle: a process of --processes compiles the text again.
        return (compile_expression, (self.text,))

    def evaluate(self, record: dict[str, Any]) -> Any:
        """The expression's value on one record; None where JMESPath finds a type error
        (``length(retries)``, or ``kwargs.amount > `100``` with a string amount, which
        jmespath itself lets escape as Python's TypeError): one message's odd data must not
        stop a run."""
        try:
            if self.fast is not None:
                return self.fast(record)
            return _interpreter().visit(self.parsed.parsed, record)
        except Exception:  # JMESPathError, and the TypeError of `'abc' > `1``
            return None


_local = threading.local()


def _interpreter() -> TreeInterpreter:
    # One per thread, not one per evaluation (jmespath's search() makes a new one each call).
    interpreter: TreeInterpreter | None = getattr(_local, "interpreter", None)
    if interpreter is None:
        interpreter = _local.interpreter = TreeInterpreter()
    return interpreter


def compile_expression(text: str, *, option: str = "--where") -> Expression:
    """Compile ``text``; a UsageProblem (exit 2) naming it and marking the place when it
    is not a JMESPath expression."""
    try:
        parsed = _Parser().parse(text)
    except jmespath_errors.JMESPathError as exc:
        raise _parse_error(text, exc, option) from None
    _check_functions(text, parsed.parsed, option)
    _check_quoted_comparisons(text, parsed.parsed, option)
    _check_bare_literals(text, parsed.parsed, option)
    refs, whole = _root_fields(parsed.parsed)
    _check_names(text, refs, option)
    names = frozenset(str(node["value"]) for node, _ in refs)
    fields = frozenset(FIELDS) if whole else names
    return Expression(text, parsed, fields, _fast(parsed.parsed), names)


@dataclass(frozen=True, slots=True)
class Where:
    """Several ``--where`` expressions: a message matches when every one is truthy."""

    expressions: tuple[Expression, ...]
    results: ResultLookup | None = field(default=None, compare=False)
    """The result backend that answers ``state`` and ``exception`` (None: they are null)."""
    _builders: dict[tuple[str, ...], RecordBuilder] = field(
        default_factory=dict, compare=False, repr=False
    )

    @property
    def texts(self) -> tuple[str, ...]:
        return tuple(e.text for e in self.expressions)

    def __reduce__(self) -> tuple[Any, ...]:
        if self.results is not None:
            # A result backend does not cross a process boundary (--processes).
            raise TypeError("a --where that reads the result backend cannot be pickled")
        return (Where, (self.expressions,))

    @property
    def fields(self) -> frozenset[str]:
        return frozenset().union(*(e.fields for e in self.expressions))

    @property
    def names(self) -> frozenset[str]:
        return frozenset().union(*(e.names for e in self.expressions))

    def builder(self, sources: Sequence[str] = ()) -> RecordBuilder:
        """The record builder for one DLQ's messages (made once per set of sources)."""
        key = tuple(sources)
        builder = self._builders.get(key)
        if builder is None:
            fields = self.fields
            builder = self._builders[key] = RecordBuilder(
                fields=tuple(f for f in FIELDS if f in fields), sources=key, results=self.results
            )
        return builder

    def holds(self, record: dict[str, Any]) -> bool:
        return all(_truthy(e.evaluate(record)) for e in self.expressions)

    def matches(
        self, info: TaskInfo, message: Delivery, *, now: float, sources: Sequence[str] = ()
    ) -> bool:
        return self.holds(self.builder(sources).build(info, message, now=now))


def compile_where(texts: Sequence[str], *, results: ResultLookup | None = None) -> Where | None:
    """The ``--where`` options of a command line, compiled once; None when there are none."""
    if not texts:
        return None
    return Where(tuple(compile_expression(t) for t in texts), results=results)


def group_value(value: Any) -> tuple[str, str]:
    """A --group-by value as (the group's identity, the label a table shows): a string as
    itself, anything else (null, a number, a list) as its JSON text."""
    if isinstance(value, str):
        return "s:" + value, value
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return "j:" + text, text
