"""The console's JSON API against its own OpenAPI document: schemathesis generates requests
for every operation from the document and checks each answer (no 5xx, status codes, content
types and bodies as documented), against ``redrive web`` (uvicorn) started by the test over
the SQS sandbox. The examples are drawn the same way every run (derandomized)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from web_servers import redrive_web, sqs_sandbox

pytestmark = pytest.mark.e2e  # a sandbox and the console, each a process


@pytest.fixture(scope="module")
def console_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("api")
    with (
        sqs_sandbox(directory, per_family=10) as sandbox,
        redrive_web(directory, sandbox.env) as web,
    ):
        yield web.url


def test_every_answer_is_as_the_document_says(console_url: str) -> None:
    loaded = schemathesis.openapi.from_url(console_url + "/api/openapi.json")
    operations = [result.ok() for result in loaded.get_all_operations()]
    assert len(operations) == 8
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=10,
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        def check(case: Any) -> None:
            case.call_and_validate(base_url=console_url)

        check()
