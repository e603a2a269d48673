"""A cache whose watches are lost: how stale it is, and that nothing is decided on it past
``max_cache_staleness`` (reviews fail open, the worker and the reconciler wait)."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from harness.doubles import FakeEvictor, InMemoryLedger, StaticClusterView
from tests.unit.builders import make_node
from tests.unit.test_reconciler import BASE, CONFIG, NODE, high
from tests.unit.test_reflector_stream import event, list_page, pod_obj
from tests.unit.test_worker import Clock, Cluster, make_worker
from tests.unit.test_worker_logic import HIGH_RESIZED, LOW, MID, entry
from tests.unit.web_fixtures import resized, review, walkthrough_objects, walkthrough_view
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.objects import parse_pod
from webhook.engine.admission import AdmissionEngine
from webhook.engine.reconciler import Reconciler
from webhook.kube.cache import IndexedStore
from webhook.kube.reflector import Reflector, Resource, parse_list_page

BOUND = Config().max_cache_staleness
NOW = 1000.0


class Tick:
    """A monotonic clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


class FakeWatch:
    """A watch response: ``chunks`` one read at a time, then the server ends it;
    ``during`` runs before each read (to look at the reflector mid-stream)."""

    chunked = False

    def __init__(self, chunks: list[bytes], during: Any) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._during = during

    def read1(self, _n: int) -> bytes:
        self._during()
        return next(self._chunks, b"")

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


def reflector_with(watch: FakeWatch | None, tick: Tick) -> Reflector[Any]:
    def list_func(**kwargs: Any) -> Any:
        assert kwargs.get("watch"), "only watches are requested in these tests"
        return watch

    store: IndexedStore[Any] = IndexedStore()
    return Reflector(Resource("pods", list_func, parse_pod), store, clock=tick)


def test_staleness_is_zero_while_a_watch_is_open_and_grows_from_its_end() -> None:
    tick = Tick()
    seen: list[float] = []
    reflector: Reflector[Any]

    def during() -> None:
        seen.append(reflector.staleness())
        tick.now += 30.0  # a quiet stream is current however long it stays open

    watch = FakeWatch([event("ADDED", pod_obj("p", rv="11"))], during)
    reflector = reflector_with(watch, tick)
    assert float("inf") == reflector.staleness()  # never listed
    reflector.load_pages([parse_list_page(list_page([], "10"))])
    tick.now += 2.0
    assert 2.0 == reflector.staleness()  # listed, no watch yet

    reflector.watch_once()
    ended = tick.now
    tick.now += 7.5

    assert [0.0, 0.0] == seen
    assert 7.5 == reflector.staleness() == tick.now - ended


def test_a_relist_makes_a_stale_reflector_current() -> None:
    tick = Tick()
    reflector = reflector_with(None, tick)
    reflector.load_pages([parse_list_page(list_page([], "10"))])
    tick.now += BOUND * 3

    reflector.load_pages([parse_list_page(list_page([pod_obj("p", rv="12")], "12"))])

    assert 0.0 == reflector.staleness()


@dataclass(frozen=True)
class StaleCase:
    staleness: float
    verdict: str
    writes: int


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(StaleCase(0.0, "preempt", 1), id="current-plans-and-reserves"),
        pytest.param(StaleCase(BOUND, "preempt", 1), id="at-the-bound-still-plans"),
        pytest.param(StaleCase(BOUND + 0.5, "error", 0), id="past-the-bound-fails-open"),
        pytest.param(StaleCase(float("inf"), "error", 0), id="never-listed-fails-open"),
    ],
)
def test_a_review_on_a_cache_staler_than_the_bound_fails_open_with_a_reason(
    case: StaleCase,
) -> None:
    view = walkthrough_view()
    view.stale_for = case.staleness
    ledger = InMemoryLedger()
    metrics = Metrics()
    engine = AdmissionEngine(Config(), view, ledger, metrics=metrics, clock=lambda: NOW)
    high_pod = walkthrough_objects()[2]

    decision = engine.validate(review(high_pod, resized(high_pod, "6"))["request"])

    assert (True, case.verdict, case.writes) == (decision.allowed, decision.verdict, ledger.writes)
    stale_errors = metrics.registry.get_sample_value(
        "resize_preemption_errors_total", {"where": "stale-cache"}
    )
    if case.verdict == "error":
        assert 1 == stale_errors
        [warning] = decision.warnings
        assert "cluster cache out of date" in warning and "resize allowed" in warning
        assert () == ledger.all_entries()
    else:
        assert stale_errors is None


def test_the_worker_evicts_nobody_on_a_stale_cache_and_resumes_when_current() -> None:
    ledger = InMemoryLedger()
    ledger.update("node-1", lambda es: ((*es, entry("low")), None))
    cluster = Cluster(HIGH_RESIZED, LOW, MID)
    cluster.view.stale_for = BOUND + 1
    evictor = FakeEvictor()
    worker = make_worker(cluster, ledger, evictor, Clock())

    worker.run_once()
    assert [] == evictor.calls
    assert 1 == len(ledger.all_entries())  # nothing released on it either

    cluster.view.stale_for = 0.0
    worker.run_once()
    assert [("low", "high", "node-1")] == evictor.calls


def test_the_reconciler_plans_nothing_on_a_stale_cache_and_plans_when_current() -> None:
    view = StaticClusterView(
        [make_node(NODE).allocatable(cpu="8", memory="16Gi").build()],
        [p.build() for p in (high(), *BASE)],
        staleness=BOUND + 1,
    )
    ledger = InMemoryLedger()
    reconciler = Reconciler(CONFIG, view, ledger, metrics=Metrics(), clock=lambda: NOW)

    assert [] == reconciler.reconcile()
    assert 0 == ledger.writes

    view.stale_for = 0.0
    assert [("preempt", True)] == [(o.verdict, o.admitted) for o in reconciler.reconcile()]
