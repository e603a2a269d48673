"""``resize_preemption_ledger_entries``: how many admitted resizes hold room, set by the
worker on every pass (the one place), judged by the lifecycle's rule: expired and spent
entries leave the count without anyone writing the Lease."""

from __future__ import annotations

import pytest

from harness.doubles import FakeEvictor, InMemoryLedger, StaticClusterView
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.model import Node, PodRef
from webhook.core.resources import Resources
from webhook.engine.ledger import LedgerEntry
from webhook.engine.worker import PreemptionWorker

NODES = (Node("node-1", Resources(8000, 16 * 2**30)), Node("node-2", Resources(8000, 16 * 2**30)))


def entry(pod: str, node: str, expires_at: float) -> LedgerEntry:
    return LedgerEntry(
        pod=PodRef("default", pod, f"uid-{pod}"),
        node=node,
        review_uid=f"review-{pod}",
        resources=Resources(1000, 2**30),
        desired=(("app", Resources(1000, 2**30)),),
        victims=(),
        admitted_at=100.0,
        expires_at=expires_at,
    )


def counted(entries: list[LedgerEntry], now: float) -> float | None:
    """The gauge after one pass over a ledger holding ``entries``, at ``now``; the pods
    are not cached yet, so every unexpired entry holds room."""
    ledger = InMemoryLedger(entries)
    metrics = Metrics()
    view = StaticClusterView(NODES)
    worker = PreemptionWorker(
        view, ledger, FakeEvictor(view), Config(), metrics, lambda: now, interval=0.01
    )
    worker.run_once()
    return metrics.registry.get_sample_value("resize_preemption_ledger_entries")


@pytest.mark.parametrize(
    ("entries", "now", "expected"),
    [
        pytest.param([], 100.0, 0.0, id="an-empty-ledger"),
        pytest.param(
            [entry("a", "node-1", 200.0), entry("b", "node-1", 200.0), entry("c", "node-2", 200.0)],
            100.0,
            3.0,
            id="every-node-counted",
        ),
        pytest.param(
            [entry("a", "node-1", 150.0), entry("b", "node-1", 200.0)],
            150.0,
            1.0,
            id="expired-left-out-before-anyone-writes",
        ),
    ],
)
def test_the_worker_counts_the_entries_holding_room(
    entries: list[LedgerEntry], now: float, expected: float
) -> None:
    assert expected == counted(entries, now)
