"""Answers that are not the service's: a 2xx from something in SQS's place.

botocore parses a 2xx answer by the operation's model and forgives what does not fit: a
proxy's ``200 ok`` or HTML login page, or JSON of another shape, parse as ``{}`` (an empty
receive, no queue URL: a ``KeyError`` later, or a DLQ that looks empty), and some wrong
shapes crash the parser itself. :func:`check_answers` hooks every client the SQS adapter
uses, once, so that each such answer, to any call, raises :class:`ForeignAnswer` before
botocore parses it; :func:`redrive.aws.errors.aws_error` words it as one line. An error
status stays botocore's (retried, then a ClientError); the hook only adds the endpoint to
its response, for the message.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import botocore.exceptions

# Members redrive reads that the model leaves optional: an answer without them is not one.
_ALSO_REQUIRED: Final = {
    "GetQueueUrlResult": ("QueueUrl",),
    "Message": ("MessageId", "ReceiptHandle"),
}
_JSON_TYPES: Final[dict[str, type | tuple[type, ...]]] = {
    "string": str,
    "blob": str,
    "integer": int,
    "long": int,
    "boolean": bool,
    "float": (int, float),
    "double": (int, float),
    "timestamp": (int, float, str),
}
ENDPOINT_KEY: Final = "RedriveEndpoint"
"""Where an error answer (a ClientError's ``response``) came from."""
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_MARKUP = re.compile(r"<\s*(?:!doctype|html|head|body|title|h1)\b", re.IGNORECASE)
_TAG = re.compile(r"<[^>]*>")


class ForeignAnswer(botocore.exceptions.BotoCoreError):
    """A 2xx answer that is not the service's (see the module)."""

    fmt = "the endpoint {endpoint} answered {what}, not an {service} answer"

    def __init__(self, *, endpoint: str, what: str, service: str) -> None:
        super().__init__(endpoint=endpoint, what=what, service=service)
        self.endpoint, self.what, self.service = endpoint, what, service


def check_answers(client: Any) -> None:
    """Make every 2xx answer ``client`` gets prove it is the service's (idempotent)."""
    meta = getattr(client, "meta", None)
    if meta is None:  # not a botocore client (a test's scripted stand-in)
        return
    service_id = meta.service_model.service_id.hyphenize()
    endpoint = str(meta.endpoint_url)

    def before_parse(
        operation_model: Any,
        response_dict: Mapping[str, Any],
        customized_response_dict: dict[str, Any],
        **_: Any,
    ) -> None:
        if int(response_dict.get("status_code") or 0) >= 300:
            # Into the ClientError's response: its message can name the endpoint.
            customized_response_dict[ENDPOINT_KEY] = endpoint
            return
        what = _not_the_answer(operation_model, response_dict)
        if what is not None:
            raise ForeignAnswer(
                endpoint=endpoint,
                what=what,
                service=str(operation_model.service_model.metadata.get("serviceId", "AWS")),
            )

    meta.events.register(
        f"before-parse.{service_id}", before_parse, unique_id="redrive-foreign-answers"
    )


def _not_the_answer(operation_model: Any, response: Mapping[str, Any]) -> str | None:
    """What the answer was, when a 2xx answer is not one ``operation_model`` can have."""
    status = int(response.get("status_code") or 0)
    if not 200 <= status < 300 or operation_model.service_model.protocol != "json":
        return None
    body = response.get("body") or b""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body)
    shape = operation_model.output_shape
    if not text.strip():
        return None if shape is None else f"HTTP {status} with an empty body"
    headers = response.get("headers") or {}
    try:
        value = json.loads(text)
    except ValueError:
        return f"HTTP {status} with {_described(text, str(headers.get('content-type', '')))}"
    return json_misfit(operation_model, status, value)


def not_the_answer(operation_model: Any, response: Mapping[str, Any]) -> str | None:
    """What a 2xx answer (botocore's response dict: status_code, headers, body) was, when
    it is not one ``operation_model`` can have; None when it is one."""
    return _not_the_answer(operation_model, response)


def json_misfit(operation_model: Any, status: int, value: Any) -> str | None:
    """:func:`not_the_answer` for a body already parsed as JSON (``value``): callers that
    parse the answer themselves (the lean SQS path) need not parse it twice."""
    shape = operation_model.output_shape
    if shape is None:  # no output (PurgeQueue): nothing, or an empty object
        misfit = _misfit_nothing(value)
    else:
        misfit = _misfit(shape, value, operation_model.name, top=True)
    if misfit is None:
        return None
    return f"HTTP {status} with JSON that is no {operation_model.name} answer ({misfit})"


def _misfit_nothing(value: Any) -> str | None:
    if not isinstance(value, dict):
        return "not an object"
    return f"unknown keys: {', '.join(sorted(value)[:3])}" if value else None


def page_title(text: str) -> str | None:
    """The words of an HTML page's title ("" for a page without one); None: no page."""
    if _MARKUP.search(text) is None:
        return None
    title = _TITLE.search(text)
    return " ".join(_TAG.sub(" ", title.group(1) if title else "").split())


def _described(text: str, content_type: str) -> str:
    """A body no parser took, for people: an HTML page by its title, else its start."""
    title = page_title(text)
    if title is not None:
        return f"an HTML page ({title[:80]})" if title else "an HTML page"
    kind = content_type.split(";", 1)[0].strip() or "no content type"
    start = " ".join(text.split())
    return f"{kind} ({start[:40]}{'...' if len(start) > 40 else ''})"


@functools.lru_cache(maxsize=256)
def _structure(shape: Any) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A structure's members by their names in JSON, and the names an answer must have:
    worked out once per shape, since every message of every receive is checked."""
    members = {m.serialization.get("name", n): m for n, m in shape.members.items()}
    return members, (*shape.required_members, *_ALSO_REQUIRED.get(shape.name, ()))


def _an_empty_list_left_out(name: str, members: dict[str, Any], value: dict[str, Any]) -> bool:
    """SQS's JSON protocol leaves out a batch answer's empty list (no Failed when every entry
    went through), though the model says required: another of its lists is there."""
    return members[name].type_name == "list" and any(
        other in value for other, member in members.items() if member.type_name == "list"
    )


_CONTAINERS: Final = frozenset({"structure", "list", "map"})


def _misfit(shape: Any, value: Any, where: str, *, top: bool = False) -> str | None:
    """Where ``value`` (``where``, for people) does not fit ``shape`` (the first place)."""
    kind = shape.type_name
    if kind == "structure":
        return _structure_misfit(shape, value, where, top=top)
    if kind == "list":
        if not isinstance(value, list):
            return f"{where} is not a list"
        return _items_misfit(shape.member, value, f"an item of {where}")
    if kind == "map":
        if not isinstance(value, dict):
            return f"{where} is not an object"
        return _items_misfit(shape.value, value.values(), f"a value of {where}")
    return None if _scalar_fits(kind, value) else f"{where} is not a {kind}"


def _structure_misfit(shape: Any, value: Any, where: str, *, top: bool) -> str | None:
    if not isinstance(value, dict):
        return "not an object" if top else f"{where} is not an object"
    members, required = _structure(shape)
    if top and value and not value.keys() & members.keys():
        return f"unknown keys: {', '.join(sorted(value)[:3])}"
    for name in required:
        if name not in value and not _an_empty_list_left_out(name, members, value):
            return f"no {name}" if top else f"{where} has no {name}"
    for name, item in value.items():
        member = members.get(name)
        if member is None or item is None:
            continue
        kind = member.type_name
        if kind in _CONTAINERS:
            misfit = _misfit(member, item, name)
            if misfit is not None:
                return misfit
        elif not _scalar_fits(kind, item):
            return f"{name} is not a {kind}"
    return None


def _items_misfit(shape: Any, values: Iterable[Any], where: str) -> str | None:
    """The first of ``values`` (a list's items, a map's values) that does not fit ``shape``."""
    kind = shape.type_name
    if kind in _CONTAINERS:
        return next((m for m in (_misfit(shape, v, where) for v in values) if m), None)
    # Scalars (every attribute's value of every message) checked in one loop, not a call
    # each: the check runs on every answer, on the hot path.
    expected = _JSON_TYPES.get(kind)
    if expected is None:
        return None
    strict = kind != "boolean"
    for item in values:
        if not isinstance(item, expected) or (strict and isinstance(item, bool)):
            return f"{where} is not a {kind}"
    return None


def _scalar_fits(kind: str, value: Any) -> bool:
    expected = _JSON_TYPES.get(kind)
    if expected is None:
        return True
    return isinstance(value, expected) and (kind == "boolean" or not isinstance(value, bool))
