"""A quorum DLQ with a delivery limit of its own (issue 24 item 4): every read by redrive is
a delivery counted toward it, so redrive refuses to receive from it (exit 2, one line) until
``--allow-delivery-limit``; the refusal says the limit, the highest delivery count redrive
saw there and how many of the deliveries were redrive's own (the receive log). On a real node."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_rabbitmq_e2e import drain, ok_json, redrive

from redrive.sandbox.rabbitmq_layout import fill_layout, rabbit_families
from redrive.sandbox.rabbitmq_node import Vhost

pytestmark = pytest.mark.e2e


def test_a_quorum_dlq_with_a_delivery_limit_is_refused_until_allowed(
    rabbitmq_vhost: Vhost,
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
        assert "x-delivery-limit 4" in lines[0]
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
    assert ok_json(redrive(rabbitmq_vhost, "inspect", "default", "--json"))["total"] == 5
