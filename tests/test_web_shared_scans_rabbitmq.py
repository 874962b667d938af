"""The console's shared scans on RabbitMQ (issue 41, item 4): many viewers at once of the
overview, the DLQ pages and their pages of messages cause one scan per DLQ per refresh
interval, counted by the broker itself: a quorum DLQ counts each delivery of a message
(``x-delivery-count``, on 3.10.8 and 4.0.5 alike), and a scan delivers every message once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import on_both_rabbitmq, wait_until
from test_rabbitmq_e2e import drain
from web_console import client

from redrive.aws.session import AwsSettings
from redrive.broker import BrokerSettings
from redrive.config import load_layout
from redrive.sandbox.rabbitmq_layout import fill_layout, rabbit_families
from redrive.sandbox.rabbitmq_node import Vhost
from redrive.web.console import Console
from redrive.web.scans import ScanRequest
from redrive.web.settings import ConsoleSettings
from redrive.web.shared_scans import SharedScanSource
from redrive.web.workspace import Workspace

pytestmark = [pytest.mark.e2e, on_both_rabbitmq]

REFRESH = 300.0
PER_DLQ = 8
VIEWERS = 12


class Clock:
    def __init__(self) -> None:
        self.now = time.time()  # read once: the ledger records wall-clock times

    def __call__(self) -> float:
        return self.now


def delivery_counts(vhost: Vhost, queue: str) -> Counter[int]:
    """How many times the broker delivered each message before this look (a quorum queue's
    x-delivery-count; absent: never); the look gives them back."""
    return Counter(
        int(dict(m.properties["application_headers"]).get("x-delivery-count", 0) or 0)
        for m in drain(vhost, queue)
    )


def shared_console(vhost: Vhost, clock: Clock, tmp_path: Path) -> Console:
    aws = AwsSettings(None, None, None)
    broker = BrokerSettings(url=vhost.amqp_url, rabbitmq_api=vhost.api_url)
    workspace = Workspace(
        load_layout(None),
        lambda region: broker.open(aws, region),
        broker=broker,
        # The quorum DLQs' own limit (100) is far: the console may read them, as the CLI may
        # with --allow-delivery-limit.
        allow_delivery_limit=True,
        ledger_uri=str(tmp_path / "ledger.sqlite3"),
    )
    source = SharedScanSource(workspace, refresh=REFRESH, clock=clock)
    settings = ConsoleSettings(secret=b"test-secret" * 3, refresh=REFRESH)
    return Console(settings, workspace, scans=source, clock=clock)


def test_many_viewers_cause_one_scan_per_dlq_per_interval_counted_by_rabbitmq(
    rabbitmq_vhost: Vhost, tmp_path: Path
) -> None:
    families = [replace(f, dlq_delivery_limit=100) for f in rabbit_families(dlq_type="quorum")]
    fill_layout(rabbitmq_vhost.amqp_url, families, PER_DLQ)
    clock = Clock()
    console = shared_console(rabbitmq_vhost, clock, tmp_path)
    source = console.source
    assert isinstance(source, SharedScanSource)
    barrier = threading.Barrier(VIEWERS)

    def viewer(n: int) -> None:
        barrier.wait()
        source.scan(ScanRequest(families[n % len(families)].name))

    def viewers() -> None:
        threads = [threading.Thread(target=viewer, args=(n,)) for n in range(VIEWERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)

    viewers()
    with client(console) as test:
        for _ in range(3):
            assert test.get("/").status_code == 200
            for family in families:
                assert test.get(f"/dlq/{family.name}?per_page=3&page=2").status_code == 200
                data = test.get(f"/api/dlq/{family.name}?per_page=5&page=2").json()
                assert data["paging"]["total"] == PER_DLQ and len(data["messages"]) == 3
        assert source.cache.scans == 3  # one per DLQ, for 12 + 30 views
        first = {f.dlq: delivery_counts(rabbitmq_vhost, f.dlq) for f in families}
        # The next interval: as many viewers again, one scan more per DLQ.
        clock.now += REFRESH
        viewers()
        assert source.cache.scans == 6

        def second_scans_shown() -> bool:
            # Inside the interval: asking starts nothing; each DLQ's second scan is shown
            # once it has ended (a look before would find its messages held).
            return all(source.scan(ScanRequest(f.name)).scanned_at == clock.now for f in families)

        wait_until(second_scans_shown, timeout=120, what="the second scans end")
        assert source.cache.scans == 6
        second = {f.dlq: delivery_counts(rabbitmq_vhost, f.dlq) for f in families}
    assert first == {f.dlq: Counter({1: PER_DLQ}) for f in families}
    # The second count: the first scan, the first look (drain), the second scan.
    assert second == {f.dlq: Counter({3: PER_DLQ}) for f in families}
