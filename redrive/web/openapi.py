"""The JSON API's OpenAPI 3.1 document, written beside the CLI's ``--json`` shapes it
describes (redrive.web.reads), so the API and the CLI cannot drift apart silently: the
schemathesis test checks every answer against it."""

from __future__ import annotations

from typing import Any

from redrive import __version__

_ANY_OBJECT: dict[str, Any] = {"type": "object"}
_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}


def _answers(schema: dict[str, Any]) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": _ERROR}}}
    return {
        "200": {"description": "OK", "content": {"application/json": {"schema": schema}}},
        "400": {"description": "a bad filter", **error},
        "401": {"description": "sign in first", **error},
        "502": {"description": "the broker or the ledger failed", **error},
    }


def document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "redrive console", "version": __version__},
        "paths": {
            "/api/status": {
                "get": {"summary": "redrive status --json", "responses": _answers(_ANY_OBJECT)}
            },
            "/api/overview": {
                "get": {
                    "summary": "status and report --format json",
                    "responses": _answers(_ANY_OBJECT),
                }
            },
            "/api/runs": {
                "get": {"summary": "redrive audit --json", "responses": _answers({"type": "array"})}
            },
        },
    }
