"""Writes to one node's Lease from one process take turns: no conflict between them, a
bounded queue, a bounded wait, and a change that writes nothing never waits."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import pytest

from tests.unit.lease_server import LeaseServer, add, entry
from tests.unit.web_fixtures import walkthrough_review, walkthrough_view
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.engine.admission import AdmissionEngine
from webhook.kube.errors import ClusterError
from webhook.kube.ledger import Busy, LeaseLedger


@dataclass
class SlowLeaseServer(LeaseServer):
    """A Lease endpoint whose writes take a while, as the API server's do under load."""

    delay: float = 0.02
    requests: int = 0

    def call_api(self, method: str, path: str, body: Any, **kwargs: Any) -> Any:
        self.requests += 1
        if method != "GET":
            time.sleep(self.delay)
        return super().call_api(method, path, body, **kwargs)


def test_writers_of_one_node_take_turns_and_never_conflict() -> None:
    server, metrics = SlowLeaseServer(), Metrics()
    ledger = LeaseLedger(server, metrics=metrics)
    pods = [f"pod-{i}" for i in range(8)]
    threads = [
        threading.Thread(target=ledger.update, args=("node-1", add(entry(p, "node-1", 1e12))))
        for p in pods
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted(pods) == sorted(e.pod.name for e in ledger.entries("node-1"))
    assert 0.0 == metrics.registry.get_sample_value("resize_preemption_ledger_conflicts_total")
    # One POST and seven PUTs: no GET after a conflict, no second try.
    assert len(pods) == server.requests


@dataclass(frozen=True)
class BusyCase:
    id: str
    max_queued: int
    queue_wait: float
    expected: str
    #: Seconds the refused write may take at most.
    within: float


BUSY_CASES = [
    BusyCase("no-turn-within-the-wait", 5, 0.05, "no turn to write within 0.05s", 1.0),
    BusyCase("queue-full-fails-at-once", 0, 10.0, "0 writes already waiting", 1.0),
]


@pytest.mark.parametrize("case", BUSY_CASES, ids=[c.id for c in BUSY_CASES])
def test_a_write_that_cannot_have_its_turn_fails_without_a_request(case: BusyCase) -> None:
    server = SlowLeaseServer()
    ledger = LeaseLedger(server, max_queued=case.max_queued, queue_wait=case.queue_wait)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            ledger.update("node-1", add(entry("late", "node-1", 1e12)))
        except BaseException as e:
            errors.append(e)

    with ledger._turns.turn("node-1"):  # another writer's turn, going on
        started = time.monotonic()
        waiter = threading.Thread(target=write)
        waiter.start()
        waiter.join(case.within)
        took = time.monotonic() - started

    assert not waiter.is_alive(), "the write waited past its bound"
    assert took < case.within
    (error,) = errors
    assert isinstance(error, Busy) and isinstance(error, ClusterError)
    assert f"ledger of node node-1 busy: {case.expected}" == error.message
    assert 0 == server.requests
    assert "node-1" not in ledger._turns._nodes  # no writer holds or waits for the turn


def test_a_change_that_writes_nothing_never_waits() -> None:
    ledger = LeaseLedger(SlowLeaseServer(), max_queued=0, queue_wait=10.0)
    with ledger._turns.turn("node-1"):
        started = time.monotonic()
        assert "as is" == ledger.update("node-1", lambda entries: (None, "as is"))
        assert time.monotonic() - started < 1.0


def test_a_busy_ledger_fails_the_review_open() -> None:
    ledger = LeaseLedger(SlowLeaseServer(), max_queued=0, queue_wait=10.0)
    engine = AdmissionEngine(Config(), walkthrough_view(), ledger)
    with ledger._turns.turn("node-1"):
        decision = engine.validate(walkthrough_review()["request"])

    assert (True, "error") == (decision.allowed, decision.verdict)
    assert decision.error.startswith("could not plan this resize: ledger of node node-1 busy")
    assert () == ledger.entries("node-1")
