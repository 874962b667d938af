"""The broker a command names, with its version (redrive/broker/server.py, issue 39): the
tested RabbitMQ release lines, and the one warning line for another. Pure: the nodes' side
is tests/test_rabbitmq_versions.py's."""

from __future__ import annotations

import pytest

from redrive.broker.server import BrokerServer, release_line, untested_warning


@pytest.mark.parametrize(
    ("version", "line"),
    [("3.10.8", "3.10"), ("4.0.5", "4.0"), ("4.1.0-rc.2", "4.1"), ("3.13", "3.13"), ("4", "4")],
)
def test_a_versions_release_line(version: str, line: str) -> None:
    assert release_line(version) == line


@pytest.mark.parametrize("version", ["3.10.8", "3.10.25", "4.0.5", "4.0.9"])
def test_the_tested_release_lines_get_no_warning(version: str) -> None:
    server = BrokerServer("rabbitmq", version, "amqp://ops:***@rabbit:5672/jobs")
    assert server.tested is True and untested_warning(server) is None
    assert server.line() == f"broker: RabbitMQ {version} at amqp://ops:***@rabbit:5672/jobs"


@pytest.mark.parametrize("version", ["3.13.7", "3.9.29", "4.1.0", "4.2.0-rc.1"])
def test_another_version_gets_one_warning_line_naming_the_tested_ones(version: str) -> None:
    server = BrokerServer("rabbitmq", version, "amqp://rabbit/")
    assert server.tested is False
    warning = untested_warning(server)
    assert warning is not None and "\n" not in warning
    assert warning.startswith(f"RabbitMQ {version} is not a version redrive is tested on ")
    assert "(RabbitMQ 3.10 and 4.0)" in warning


def test_sqs_and_an_unknown_version_say_what_they_can_without_a_warning() -> None:
    sqs = BrokerServer("sqs", None, "https://sqs.eu-west-1.amazonaws.com")
    assert (sqs.name, sqs.tested, untested_warning(sqs)) == ("SQS", None, None)
    assert sqs.to_json() == {
        "kind": "sqs",
        "version": None,
        "endpoint": "https://sqs.eu-west-1.amazonaws.com",
        "tested": None,
    }
    unknown = BrokerServer("rabbitmq", None, "amqp://rabbit/")
    assert unknown.name == "RabbitMQ (version not known)" and untested_warning(unknown) is None
