"""The JSON API's OpenAPI 3.1 document, written beside the CLI's ``--json`` shapes it
describes (redrive.web.reads), so the API and the CLI cannot drift apart silently: the
schemathesis test checks every answer against it, and tests/test_web.py each shape against
the CLI's own ``--json``."""

from __future__ import annotations

from typing import Any

from redrive import __version__
from redrive.web.reads import IN_DOUBT_PAGE


def _obj(required: dict[str, Any], **optional: Any) -> dict[str, Any]:
    """An object with these properties (the ``required`` ones always there)."""
    return {
        "type": "object",
        "required": sorted(required),
        "properties": {**required, **optional},
    }


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _null(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


STRING = {"type": "string"}
INT = {"type": "integer"}
NUMBER = {"type": "number"}
BOOL = {"type": "boolean"}
TIME = _null({"type": "string"})
COUNTS = {"type": "object", "additionalProperties": INT}
ANY_OBJECT = {"type": "object"}

SCHEMAS: dict[str, Any] = {
    "Error": _obj({"error": _null(STRING)}),
    "Person": _obj(
        {
            "name": STRING,
            "role": {"enum": ["viewer", "operator"]},
            "address": STRING,
            "via": {"enum": ["session", "proxy", "local"]},
            "email": _null(STRING),
        }
    ),
    "Session": _obj({"person": _ref("Person"), "csrf": STRING}),
    "Broker": _obj(
        {"kind": STRING, "version": _null(STRING), "endpoint": _null(STRING), "tested": _null(BOOL)}
    ),
    "QueueCounts": _obj({"visible": INT, "in_flight": INT, "delayed": INT}),
    "FamilyStatus": _obj(
        {
            "family": STRING,
            "queue": _null(STRING),
            "dlq": _null(STRING),
            "queue_counts": _null(_ref("QueueCounts")),
            "dlq_counts": _null(_ref("QueueCounts")),
            "dlq_retention_seconds": _null(INT),
            "error": _null(STRING),
        }
    ),
    "Status": _obj(
        {
            "layout": STRING,
            "broker": _null(_ref("Broker")),
            "families": {"type": "array", "items": _ref("FamilyStatus")},
        }
    ),
    "Timeline": _obj(
        {"start": TIME, "bucket_seconds": NUMBER, "counts": {"type": "array", "items": INT}}
    ),
    "Group": _obj(
        {
            "task": {},
            "count": INT,
            "oldest": TIME,
            "newest": TIME,
            "max_receive_count": INT,
            "max_consumer_receives": INT,
            "max_redrive_receives": INT,
            "expired": INT,
            "redriven": INT,
            "poison": INT,
            "leaving_within_24h": INT,
            "sample_task_ids": {"type": "array", "items": STRING},
            "sample_message_ids": {"type": "array", "items": STRING},
            "protocols": COUNTS,
            "timeline": _null(_ref("Timeline")),
        },
        states=COUNTS,
        exceptions=COUNTS,
        death_reasons=COUNTS,
        died_in=COUNTS,
        routes_to=_null(STRING),
        unregistered=INT,
        exception=STRING,
        notes=COUNTS,
    ),
    "Inspect": _obj(
        {
            "target": STRING,
            "dlq": STRING,
            "dlq_url": STRING,
            "sources": {"type": "array", "items": STRING},
            "total": INT,
            "oldest": TIME,
            "oldest_age_seconds": _null(NUMBER),
            "expired": INT,
            "poison": INT,
            "leaving_within_24h": INT,
            "groups": {"type": "array", "items": _ref("Group")},
            "scanned_at": TIME,
            "seconds": NUMBER,
            "depth_before": INT,
            "hidden_before": INT,
            "partial": BOOL,
            "limit": _null(INT),
            "incomplete": BOOL,
            "interrupted": BOOL,
            "receive_log_problem": _null(STRING),
            "scanned": INT,
            "where": {"type": "array", "items": STRING},
            "matched": _null(INT),
            "group_by": _null(STRING),
        },
        result_backend=_null(STRING),
        result_backend_problem=_null(STRING),
    ),
    "ScanNote": _obj({"scanned_at": TIME, "problem": _null(STRING), "moving": _null(STRING)}),
    "Record": _obj(
        {
            "message_id": STRING,
            "task": _null(STRING),
            "id": _null(STRING),
            "receive_count": INT,
            "sent_at": TIME,
            "group": {},
            "death": ANY_OBJECT,
        },
        args={},
        kwargs={},
        headers={},
        attributes={},
        body=_null(STRING),
        json={},
        state=_null(STRING),
        exception=_null(STRING),
    ),
    "Paging": _obj(
        {
            "page": INT,
            "per_page": INT,
            "pages": INT,
            "total": INT,
            "first": _null(INT),
            "previous": _null(STRING),
            "next": _null(STRING),
        }
    ),
    "Dlq": _obj(
        {
            "inspect": _null(_ref("Inspect")),
            "messages": {"type": "array", "items": _ref("Record")},
            "paging": _ref("Paging"),
            "scan": _ref("ScanNote"),
        }
    ),
    "Message": _obj(
        {
            "target": STRING,
            "dlq": _null(STRING),
            "revealed": BOOL,
            "arguments_kept": BOOL,
            "record": _ref("Record"),
            "scan": _ref("ScanNote"),
        }
    ),
    "FamilyReport": _obj(
        {
            "family": STRING,
            "dlq": _null(STRING),
            "messages": _null(INT),
            "groups": {"type": "array", "items": _ref("Group")},
            "error": _null(STRING),
            "coverage": {"enum": ["full", "partial", "none"]},
        },
        oldest=TIME,
        oldest_age_seconds=_null(NUMBER),
        expired=INT,
        poison=INT,
        leaving_within_24h=INT,
        depth_before=INT,
    ),
    "Change": _obj(
        {
            "family": STRING,
            "previous_report_at": _null(NUMBER),
            "previous_messages": _null(INT),
            "messages": INT,
            "delta": _null(INT),
            "new_tasks": COUNTS,
            "grown_tasks": COUNTS,
        }
    ),
    "Report": _obj(
        {
            "generated_at": TIME,
            "layout": STRING,
            "total": INT,
            "queues": {"type": "array", "items": _ref("FamilyReport")},
            "where": {"type": "array", "items": STRING},
            "group_by": _null(STRING),
            "interrupted": BOOL,
            "since_last": {"type": "array", "items": _ref("Change")},
        }
    ),
    "Overview": _obj(
        {
            "status": _ref("Status"),
            "report": _ref("Report"),
            "alerts": {"type": "array", "items": _obj({"family": STRING, "reason": STRING})},
            "scans": {"type": "object", "additionalProperties": _ref("ScanNote")},
        }
    ),
    "Run": _obj(
        {
            "run_id": STRING,
            "command": STRING,
            "started_at": TIME,
            "ended_at": TIME,
            "outcome": STRING,
            "info": ANY_OBJECT,
            "counts": ANY_OBJECT,
        }
    ),
    "Operation": _obj(
        {
            "id": STRING,
            "plan": STRING,
            "kind": STRING,
            "target": STRING,
            "person": _ref("Person"),
            "started_at": NUMBER,
            "ended_at": _null(NUMBER),
            "state": {"enum": ["running", "completed", "needs-attention", "interrupted", "failed"]},
            "progress": _null(COUNTS),
            "result": _null(ANY_OBJECT),
            "error": _null(STRING),
            "problems": {"type": "array", "items": STRING},
        }
    ),
    "Operations": _obj(
        {
            "ledger": _null(STRING),
            "live": {"type": "array", "items": _ref("Run")},
            "runs": {"type": "array", "items": _ref("Run")},
            "in_doubt": _null(_ref("InDoubt")),
        }
    ),
    "InDoubt": _obj(
        {
            "ledger": STRING,
            "dry_run": BOOL,
            "in_doubt": INT,
            "busy": INT,
            "by_action": COUNTS,
            "left_in_doubt": INT,
            "unmatched": {"type": "array", "items": STRING},
            "messages": {"type": "array", "items": ANY_OBJECT, "maxItems": IN_DOUBT_PAGE},
            "page": {"type": "integer", "minimum": 1},
            "pages": {"type": "integer", "minimum": 1},
            "page_size": INT,
        }
    ),
}

#: A family or queue name as a path segment (what `redrive inspect TARGET` takes, but a URL).
TARGET = {
    "name": "target",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,80}$"},
}
MESSAGE_ID = {
    "name": "message_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"},
}
IN_DOUBT_PAGE_NUMBER = {
    "name": "in_doubt_page",
    "in": "query",
    "required": False,
    "schema": {"type": "integer", "minimum": 1, "maximum": 1000000},
    "description": f"which page of the in-doubt messages ({IN_DOUBT_PAGE} a page; "
    "in_doubt counts them all)",
}
OP_ID = {
    "name": "op_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
}
#: What each filter takes. --where and --group-by are JMESPath over the message's record
#: (docs/where.md): the patterns describe a subset the console always accepts (a field of the
#: record compared with a literal); any other expression is tried and a bad one is a 400.
_FIELD = (
    r"(task|id|retries|receive_count|consumer_receives|age_seconds|queue|state|exception"
    r"|kwargs\.[a-z_]{1,20})"
)
_WHERE = rf"^{_FIELD} (==|!=|>=|<=|<|>) ('[A-Za-z0-9_.-]{{0,20}}'|`[0-9]{{1,6}}`)$"
FILTERS = [
    {
        "name": "task",
        "in": "query",
        "required": False,
        "style": "form",
        "explode": True,
        "schema": {"type": "array", "maxItems": 3, "items": {"type": "string", "maxLength": 80}},
        "description": "--task: a task name or glob (repeatable)",
    },
    {
        "name": "older_than",
        "in": "query",
        "required": False,
        "schema": {"type": "string", "pattern": r"^[0-9]{1,6}[smhdw]?$"},
        "description": "--older-than: a duration, e.g. 2h",
    },
    {
        "name": "where",
        "in": "query",
        "required": False,
        "style": "form",
        "explode": True,
        "schema": {"type": "array", "maxItems": 2, "items": {"type": "string", "pattern": _WHERE}},
        "description": "--where: a JMESPath expression over the message's record (repeatable)",
    },
    {
        "name": "group_by",
        "in": "query",
        "required": False,
        "schema": {"type": "string", "pattern": rf"^(exception|{_FIELD})$"},
        "description": "--group-by: task, exception, or an expression over the record",
    },
]

#: Which page of the DLQ's messages (of the groups the task filter picks): read from the
#: scan's spool, never a new read of the broker. ``paging.next`` and ``paging.previous``
#: are the query strings of the pages beside it, filters kept.
PAGING = [
    {
        "name": "page",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": 1_000_000},
        "description": "the page, from 1 (a page past the last is empty)",
    },
    {
        "name": "per_page",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": 500},
        "description": "messages per page (50 unless given)",
    },
]


def _answers(schema: str, *errors: int) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": _ref("Error")}}}
    said = {
        400: "a filter the CLI would refuse, or no page number",
        401: "sign in first",
        403: "a viewer, or no CSRF token",
        404: "no such DLQ, message or operation",
        502: "the broker, the result backend or the ledger failed",
    }
    out: dict[str, Any] = {
        "200": {"description": "OK", "content": {"application/json": {"schema": _ref(schema)}}}
    }
    for code in (401, 502, *errors):
        out[str(code)] = {"description": said[code], **error}
    return out


def _get(summary: str, schema: str, *errors: int, parameters: list[Any] | None = None) -> Any:
    operation: dict[str, Any] = {"summary": summary, "responses": _answers(schema, *errors)}
    if parameters:
        operation["parameters"] = parameters
    return {"get": operation}


def document() -> dict[str, Any]:
    message = _get(
        "a message's --where record, arguments withheld",
        "Message",
        400,
        404,
        parameters=[TARGET, MESSAGE_ID, *FILTERS],
    )
    reveal = {
        "post": {
            "summary": "the message with its arguments; the reveal is audited (X-CSRF-Token)",
            "parameters": [TARGET, MESSAGE_ID, *FILTERS],
            "responses": _answers("Message", 400, 403, 404),
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "redrive console", "version": __version__},
        "paths": {
            "/api/session": _get("who you are, and your CSRF token", "Session"),
            "/api/status": _get("redrive status --json", "Status"),
            "/api/overview": _get("status, and report --format json --since-last", "Overview"),
            "/api/dlq/{target}": _get(
                "inspect --json, and a page of its messages (arguments withheld)",
                "Dlq",
                400,
                404,
                parameters=[TARGET, *FILTERS, *PAGING],
            ),
            "/api/dlq/{target}/messages/{message_id}": message,
            "/api/dlq/{target}/messages/{message_id}/reveal": reveal,
            "/api/operations": _get(
                "live runs, audit --json, and ledger resolve --json a page at a time",
                "Operations",
                400,
                parameters=[IN_DOUBT_PAGE_NUMBER],
            ),
            "/api/operations/{op_id}": _get(
                "one of this console's operations: its state and counts so far",
                "Operation",
                404,
                parameters=[OP_ID],
            ),
        },
        "components": {"schemas": SCHEMAS},
    }
