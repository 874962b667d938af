"""A quorum DLQ with a delivery limit of its own (issue 24 item 4): every read by redrive is
a delivery counted toward it, so redrive refuses to receive from it (exit 2, one line) until
``--allow-delivery-limit``; the refusal says the limit, the highest delivery count redrive
saw there and how many of the deliveries were redrive's own (the receive log). On real 3.10.8
and 4.0.5 nodes (4.0's implicit limit of 20: tests/test_rabbitmq_versions.py)."""

from __future__ import annotations

import urllib.parse
from dataclasses import replace
from typing import Any

import pytest
from conftest import on_both_rabbitmq
from test_rabbitmq_e2e import drain, ok_json, redrive

from redrive.broker.rabbitmq.api import ManagementApi
from redrive.broker.rabbitmq.queues import Queues
from redrive.sandbox.rabbitmq_layout import (
    fill_layout,
    open_connection,
    rabbit_families,
    raw_channel,
)
from redrive.sandbox.rabbitmq_node import Vhost, management_request

pytestmark = [pytest.mark.e2e, on_both_rabbitmq]


def test_a_quorum_dlq_with_a_delivery_limit_is_refused_until_allowed(
    rabbitmq_vhost: Vhost, rabbitmq_version: str
) -> None:
    families = [
        replace(f, dlq_delivery_limit=4) if f.name == "checkout" else f
        for f in rabbit_families(dlq_type="quorum")
    ]
    fill_layout(rabbitmq_vhost.amqp_url, families, 5)
    checkout = next(f for f in families if f.name == "checkout")

    for args in (["inspect", "checkout"], ["move", "checkout"], ["purge", "checkout"]):
        refused = redrive(rabbitmq_vhost, *args)
        assert refused.returncode == 2, (args, refused.stdout, refused.stderr)
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        assert "x-delivery-limit 4 as its own argument: " in lines[0]
        assert "not known (redrive never read it)" in lines[0]
        assert "rabbitmqctl set_policy" in lines[0] and "--allow-delivery-limit" in lines[0]
    # Nothing was delivered: every message is there, none counted.
    held = drain(rabbitmq_vhost, checkout.dlq)
    assert len(held) == 5

    # Allowed, twice (before and after the command): the second read sees the first's count.
    ok_json(redrive(rabbitmq_vhost, "--allow-delivery-limit", "inspect", "checkout", "--json"))
    ok_json(redrive(rabbitmq_vhost, "inspect", "checkout", "--json", "--allow-delivery-limit"))
    refused = redrive(rabbitmq_vhost, "inspect", "checkout")
    assert refused.returncode == 2
    line = refused.stderr.strip()
    # drain() above delivered each once too (not redrive: not counted as its own).
    assert "highest delivery count redrive saw there is 2" in line, line
    assert "up to 2 of a message's receives were redrive's own" in line, line

    # A report names the family refused and goes on with the others.
    report = redrive(rabbitmq_vhost, "report", "--format", "json")
    assert report.returncode == 1, report.stderr
    assert "x-delivery-limit 4" in report.stderr
    assert_the_other_family(rabbitmq_vhost, rabbitmq_version)


# -- a limit from a policy ----------------------------------------------------------------------


def put_policy(
    vhost: Vhost, name: str, pattern: str, definition: dict[str, Any], **more: Any
) -> None:
    kind = more.pop("kind", "policies")
    management_request(
        vhost.api_url,
        "PUT",
        f"/api/{kind}/{urllib.parse.quote(vhost.vhost, safe='')}/{name}",
        {"pattern": pattern, "definition": definition, "apply-to": "queues", **more},
    )


def test_a_policys_delivery_limit_is_refused_at_once_as_the_arguments_is(
    rabbitmq_vhost: Vhost, rabbitmq_version: str
) -> None:
    """The policy is set, then the quorum DLQ declared (no x-delivery-limit argument) and
    filled, and redrive runs at once: the management API's statistic of the queue's policy
    (``effective_policy_definition``) does not show it yet (it lags by the statistics
    interval), so redrive works the policy out from the vhost's policies."""
    put_policy(rabbitmq_vhost, "dlq-limit", "^onion-checkout-dlq$", {"delivery-limit": 4})
    families = rabbit_families(dlq_type="quorum")
    fill_layout(rabbitmq_vhost.amqp_url, families, 5)
    for args in (["inspect", "checkout"], ["move", "checkout"]):
        refused = redrive(rabbitmq_vhost, *args)
        assert refused.returncode == 2, (args, refused.stdout, refused.stderr)
        (line,) = refused.stderr.strip().splitlines()
        assert "DLQ onion-checkout-dlq has x-delivery-limit 4 from policy dlq-limit: " in line, line
        assert "rabbitmqctl set_policy" in line and "--allow-delivery-limit" in line
    assert_the_other_family(rabbitmq_vhost, rabbitmq_version)


def assert_the_other_family(vhost: Vhost, version: str) -> None:
    """Another family's quorum DLQ, declared without a limit: read as ever on 3.10; refused
    for 4.x's default of 20 on 4.0."""
    other = redrive(vhost, "inspect", "default", "--json")
    if version == "3.10":
        assert ok_json(other)["total"] == 5
    else:
        assert other.returncode == 2 and "4.x's default of 20" in other.stderr, other.stderr


def test_the_limit_is_the_lowest_of_the_argument_the_policy_and_the_operator_policy(
    rabbitmq_vhost: Vhost,
) -> None:
    """As RabbitMQ works a queue's policy out: the matching policy of highest priority whose
    apply-to takes the queue, merged with the operator policy (the lower number wins), and
    a quorum queue's delivery limit the lower of its argument's and its policy's."""
    connection = open_connection(rabbitmq_vhost.amqp_url)
    try:
        channel = raw_channel(connection)
        for name, arguments in (
            ("q-arg", {"x-queue-type": "quorum", "x-delivery-limit": 10}),
            ("q-policy", {"x-queue-type": "quorum"}),
            ("q-none", {"x-queue-type": "quorum"}),
            ("c-classic", {}),
        ):
            channel.queue_declare(name, durable=True, auto_delete=False, arguments=arguments)
    finally:
        connection.close()
    put_policy(rabbitmq_vhost, "low", "^q-(arg|policy)$", {"delivery-limit": 7}, priority=1)
    put_policy(rabbitmq_vhost, "lower-loses", "^q-", {"delivery-limit": 2}, priority=0)
    # Of the highest priority, but for exchanges only: no queue takes it.
    put_policy(
        rabbitmq_vhost, "exchanges", "^q-none$", {"delivery-limit": 1}, priority=9,
        **{"apply-to": "exchanges"},
    )  # fmt: skip
    put_policy(rabbitmq_vhost, "cap", "^q-policy$", {"delivery-limit": 5}, kind="operator-policies")
    queues = Queues(api(rabbitmq_vhost), rabbitmq_vhost.vhost)
    limits = {n: queues.describe(n).max_receive_count for n in ("q-arg", "q-policy", "q-none")}
    # q-arg: min(10, policy 7); q-policy: min(policy 7, operator 5); q-none: only
    # "lower-loses" matches it (priority 0 loses only where "low" matches too).
    assert limits == {"q-arg": 7, "q-policy": 5, "q-none": 2}
    assert queues.describe("c-classic").max_receive_count is None
    # Each says where it comes from (the refusal's words).
    origins = {n: queues.describe(n).receive_limit_origin for n in ("q-arg", "q-policy", "q-none")}
    assert origins == {
        "q-arg": " from policy low",
        "q-policy": " from operator policy cap",
        "q-none": " from policy lower-loses",
    }


def test_a_quorum_queue_with_no_limit_has_none_on_3x_and_20_on_4x(
    rabbitmq_vhost: Vhost, rabbitmq_version: str
) -> None:
    """The version is the management API's: 3.x sets no default, 4.x gives 20."""
    fill_layout(rabbitmq_vhost.amqp_url, rabbit_families(dlq_type="quorum")[:1], 0)
    queues = Queues(api(rabbitmq_vhost), rabbitmq_vhost.vhost)
    version = queues.server_version()
    assert version is not None and version.startswith(f"{rabbitmq_version}."), version
    dlq = queues.describe("onion-checkout-dlq")
    expected = {
        "3.10": (None, ""),
        "4.0": (20, ", RabbitMQ 4.x's default of 20 for quorum queues (none is set)"),
    }
    assert (dlq.max_receive_count, dlq.receive_limit_origin) == expected[rabbitmq_version]


def test_a_management_user_sees_the_policys_limit_too(rabbitmq_vhost: Vhost) -> None:
    """The least a user of redrive needs is the ``management`` tag (no ``policymaker``): it
    may list the vhost's policies, so the policy's limit is seen at once there too."""
    user, password = f"mgmt-{rabbitmq_vhost.vhost[-8:]}", "pw"
    management_request(
        rabbitmq_vhost.api_url,
        "PUT",
        f"/api/users/{user}",
        {"password": password, "tags": "management"},
    )
    vhost = urllib.parse.quote(rabbitmq_vhost.vhost, safe="")
    management_request(
        rabbitmq_vhost.api_url,
        "PUT",
        f"/api/permissions/{vhost}/{user}",
        {"configure": ".*", "write": ".*", "read": ".*"},
    )
    try:
        put_policy(rabbitmq_vhost, "dlq-limit", "-dlq$", {"delivery-limit": 3})
        fill_layout(rabbitmq_vhost.amqp_url, rabbit_families(dlq_type="quorum")[:1], 0)
        mine = ManagementApi(rabbitmq_vhost.api_url, user=user, password=password, masked="api")
        queues = Queues(mine, rabbitmq_vhost.vhost)
        assert queues.describe("onion-checkout-dlq").max_receive_count == 3
        source = queues.describe("onion-checkout")
        assert source.dead_letter_target == f"{rabbitmq_vhost.vhost}/onion-checkout-dlq"
        assert source.max_receive_count is None
    finally:
        management_request(rabbitmq_vhost.api_url, "DELETE", f"/api/users/{user}")


def api(vhost: Vhost) -> ManagementApi:
    return ManagementApi(vhost.api_url, user="guest", password="guest", masked=vhost.api_url)
