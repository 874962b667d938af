"""``check``: the configured families against what SQS says (redrive.reporting.check, the CLI)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Cli, Family, make_family

from redrive.broker.sqs import SqsBroker
from redrive.cli.exit_codes import EXIT_ERROR
from redrive.config import built_in_layout, load_layout
from redrive.reporting.check import Finding, check_layout, expected_dlq_name


def findings_of(client: Any, config: str | None = None) -> list[Finding]:
    layout = load_layout(config, {}) if config else built_in_layout({})
    return check_layout(layout, lambda region=None: SqsBroker(client))


def problems(findings: list[Finding]) -> list[tuple[str | None, str, str]]:
    return [(f.family, f.queue, f.problem) for f in findings]


def test_expected_dlq_name() -> None:
    assert expected_dlq_name("onion") == "onion-dlq"
    assert expected_dlq_name("https://sqs.us-east-1.amazonaws.com/1/jobs.fifo") == "jobs-dlq.fifo"


SQS_ENDPOINT = "https://sqs.us-east-1.amazonaws.com"
#: SQS has no version to say: named by its endpoint (issue 39).
SQS_BROKER = {"kind": "sqs", "version": None, "endpoint": SQS_ENDPOINT, "tested": None}


def test_clean_layout_has_no_findings(all_families: dict[str, Family], cli: Cli) -> None:
    assert findings_of(all_families["checkout"].client) == []
    result = cli("check")
    assert result.exit_code == 0, result.output
    assert "no findings" in result.output
    assert result.output.splitlines()[-1] == f"broker: SQS at {SQS_ENDPOINT}"
    data = json.loads(cli("check", "--json").stdout)
    assert data == {"layout": "built-in", "broker": SQS_BROKER, "findings": []}


def test_source_without_redrive_policy(sqs_client: Any) -> None:
    make_family(sqs_client, "onion")
    make_family(sqs_client, "onion-progress")
    sqs_client.create_queue(QueueName="onion-checkout")
    assert problems(findings_of(sqs_client)) == [
        ("checkout", "onion-checkout", "has no RedrivePolicy (no DLQ)")
    ]


def _policy(client: Any, queue: str, dlq: str, max_receive: int = 5) -> None:
    dlq_url = client.create_queue(
        QueueName=dlq, Attributes={"MessageRetentionPeriod": str(14 * 86400)}
    )["QueueUrl"]
    arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": max_receive})
    client.create_queue(QueueName=queue, Attributes={"RedrivePolicy": policy})


def test_dlq_with_another_name(sqs_client: Any) -> None:
    make_family(sqs_client, "onion")
    make_family(sqs_client, "onion-progress")
    _policy(sqs_client, "onion-checkout", "onion-checkout-dead")
    assert problems(findings_of(sqs_client)) == [
        (
            "checkout",
            "onion-checkout",
            "RedrivePolicy points to onion-checkout-dead, expected onion-checkout-dlq",
        )
    ]


def test_max_receive_count_and_retention(sqs_client: Any) -> None:
    make_family(sqs_client, "onion-checkout", max_receive=3)
    default = make_family(sqs_client, "onion")
    make_family(sqs_client, "onion-progress")
    sqs_client.set_queue_attributes(
        QueueUrl=default.dlq_url, Attributes={"MessageRetentionPeriod": str(4 * 86400)}
    )
    assert problems(findings_of(sqs_client)) == [
        ("checkout", "onion-checkout", "maxReceiveCount is 3, expected 5"),
        ("default", "onion-dlq", "retention is 4d, expected 14d"),
    ]


def test_stray_queue_with_the_layout_prefix(all_families: dict[str, Family]) -> None:
    client = all_families["checkout"].client
    client.create_queue(QueueName="onion-legacy")
    client.create_queue(QueueName="other-app")  # not the prefix: none of ours
    assert problems(findings_of(client)) == [
        (None, "onion-legacy", "has the layout's prefix 'onion' but belongs to no family")
    ]


def test_missing_family_queue(sqs_client: Any) -> None:
    make_family(sqs_client, "onion-checkout")
    make_family(sqs_client, "onion")
    found = findings_of(sqs_client)
    assert [(f.family, f.queue) for f in found] == [("progress", "onion-progress")]
    assert "does not exist" in found[0].problem or "onion-progress" in found[0].problem


def test_cli_findings_exit_1_and_json_shape(all_families: dict[str, Family], cli: Cli) -> None:
    client = all_families["checkout"].client
    client.create_queue(QueueName="onion-legacy")
    client.set_queue_attributes(
        QueueUrl=all_families["progress"].dlq_url,
        Attributes={"MessageRetentionPeriod": str(4 * 86400)},
    )
    result = cli("check")
    assert result.exit_code == EXIT_ERROR, result.output
    assert "Traceback" not in result.output
    assert "onion-legacy" in result.output and "retention is 4d" in result.output
    data_result = cli("check", "--json")
    assert data_result.exit_code == EXIT_ERROR
    data = json.loads(data_result.stdout)
    assert data["layout"] == "built-in"
    assert data["findings"] == [
        {
            "family": "progress",
            "queue": "onion-progress-dlq",
            "problem": "retention is 4d, expected 14d",
        },
        {
            "family": None,
            "queue": "onion-legacy",
            "problem": "has the layout's prefix 'onion' but belongs to no family",
        },
    ]


CONFIG = """
[defaults]
prefix = "atlas"
max_receive_count = 3
dlq_retention = "4d"

[families.jobs]
queue = "atlas-jobs"
dlq = "atlas-jobs-dead"

[families.mail]
queue = "atlas-mail"
max_receive_count = 5
dlq_retention = "14d"
"""


@pytest.fixture
def atlas(sqs_client: Any, tmp_path: Path) -> str:
    _policy(sqs_client, "atlas-jobs", "atlas-jobs-dead", max_receive=3)
    jobs_dlq = sqs_client.get_queue_url(QueueName="atlas-jobs-dead")["QueueUrl"]
    sqs_client.set_queue_attributes(
        QueueUrl=jobs_dlq, Attributes={"MessageRetentionPeriod": str(4 * 86400)}
    )
    make_family(sqs_client, "atlas-mail")
    path = tmp_path / "atlas.toml"
    path.write_text(CONFIG)
    return str(path)


def test_config_overrides_expectations(sqs_client: Any, atlas: str, cli: Cli) -> None:
    assert findings_of(sqs_client, atlas) == []
    result = cli("--config", atlas, "check", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"layout": atlas, "broker": SQS_BROKER, "findings": []}


def test_config_expectations_are_checked(
    sqs_client: Any, atlas: str, tmp_path: Path, cli: Cli
) -> None:
    strict = tmp_path / "strict.toml"
    strict.write_text(
        CONFIG.replace('dlq = "atlas-jobs-dead"', 'dlq = "atlas-jobs-dlq"').replace(
            'max_receive_count = 3\ndlq_retention = "4d"', ""
        )
    )
    found = problems(findings_of(sqs_client, str(strict)))
    assert found == [
        (
            "jobs",
            "atlas-jobs",
            "RedrivePolicy points to atlas-jobs-dead, expected atlas-jobs-dlq",
        ),
        ("jobs", "atlas-jobs", "maxReceiveCount is 3, expected 5"),
        ("jobs", "atlas-jobs-dead", "retention is 4d, expected 14d"),
    ]
    assert cli("--config", str(strict), "check").exit_code == EXIT_ERROR


def test_a_dlq_named_in_the_config_is_not_a_stray(sqs_client: Any, tmp_path: Path) -> None:
    # Was a bug: with no RedrivePolicy on the source, the DLQ the config names was also
    # reported as "belongs to no family".
    sqs_client.create_queue(QueueName="atlas-export")
    sqs_client.create_queue(QueueName="atlas-export-dead")
    path = tmp_path / "c.toml"
    path.write_text(
        '[defaults]\nprefix = "atlas"\n[families.export]\n'
        'queue = "atlas-export"\ndlq = "atlas-export-dead"\n'
    )
    assert problems(findings_of(sqs_client, str(path))) == [
        ("export", "atlas-export", "has no RedrivePolicy (no DLQ)")
    ]
