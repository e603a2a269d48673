"""The preemption worker making a plan's loans: before its evictions, once, and never for
a lender that changed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.doubles import FakeResizer, InMemoryLedger, LoggingEvictor
from tests.unit.test_worker import Clock, Cluster, add, make_worker
from tests.unit.test_worker_logic import (
    ADMITTED,
    HIGH_RESIZED,
    LENDER,
    LENT,
    LOAN,
    LOW_B,
    entry,
    pod,
)
from webhook.base.metrics import Metrics
from webhook.engine.ledger import LedgerEntry
from webhook.engine.loans import LoanResult
from webhook.engine.worker import PreemptionWorker

# "high" 6 CPUs on 8: "lender" lends 1 (3 -> 2) and "low-b" (2 CPUs) is evicted.
SMALL_LOAN = replace(LOAN, after=2000, frees=1000)
MID_0 = pod("mid", cpu="0", priority=2000)
SCENE = (HIGH_RESIZED, LENDER, LOW_B, MID_0)


def setup(
    cluster: Cluster, *, resizer: bool = True, metrics: Metrics | None = None
) -> tuple[PreemptionWorker, InMemoryLedger, FakeResizer, LoggingEvictor, list[str]]:
    log: list[str] = []
    ledger = InMemoryLedger()
    add(ledger, replace(entry("low-b"), loans=(SMALL_LOAN,)))
    fake = FakeResizer(log=log)
    evictor = LoggingEvictor(log)
    worker = make_worker(
        cluster, ledger, evictor, Clock(), metrics=metrics, resizer=fake if resizer else None
    )
    return worker, ledger, fake, evictor, log


def test_loans_are_made_before_the_evictions_and_cost_no_ledger_write() -> None:
    worker, ledger, _, _, log = setup(Cluster(*SCENE))
    written = ledger.writes

    worker.run_once()

    assert ["lend lender", "evict low-b"] == log
    assert 0 == ledger.writes - written


def test_a_loan_the_cache_shows_made_is_not_made_again_after_a_restart() -> None:
    cluster = Cluster(*SCENE)
    worker, ledger, _, _, log = setup(cluster)
    worker.run_once()
    cluster.set(HIGH_RESIZED, pod("lender", cpu="2", allocated="3"), LOW_B, MID_0)
    # A new leader over the same ledger; "low-b" not seen leaving yet.
    again = make_worker(cluster, ledger, LoggingEvictor(log), Clock(), resizer=FakeResizer(log=log))

    again.run_once()

    assert ["lend lender", "evict low-b", "evict low-b"] == log


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        pytest.param(LoanResult.FAILED, ["lend lender"], id="failed-evicts-nobody"),
        pytest.param(LoanResult.VOID, ["lend lender"], id="lender-changed-evicts-nobody"),
        pytest.param(LoanResult.DONE, ["lend lender", "evict low-b"], id="already-lent"),
    ],
)
def test_a_loan_not_made_stops_the_evictions(result: LoanResult, expected: list[str]) -> None:
    worker, _, resizer, _, log = setup(Cluster(*SCENE))
    resizer.results["lender"] = result

    worker.run_once()

    assert expected == log


def test_a_failed_loan_backs_off() -> None:
    worker, _, resizer, _, log = setup(Cluster(*SCENE))
    resizer.results["lender"] = LoanResult.FAILED
    worker.run_once()

    worker.run_once()  # within the backoff: nothing

    assert ["lend lender"] == log


def test_without_a_resizer_nobody_is_evicted_for_a_plan_with_loans() -> None:
    worker, _, _, _, log = setup(Cluster(*SCENE), resizer=False)

    worker.run_once()

    assert [] == log


def test_what_is_lent_is_measured_per_node() -> None:
    metrics = Metrics()
    worker, _, _, _, _ = setup(Cluster(HIGH_RESIZED, LENT, MID_0), metrics=metrics)
    worker.ledger.update("node-1", lambda es: ((replace(es[0], loans=(LOAN,), victims=()),), None))

    worker.run_once()

    assert 2.0 == metrics.registry.get_sample_value(
        "resize_preemption_lent_resources", {"node": "node-1", "resource": "cpu", "unit": "core"}
    )
    assert 0.0 == metrics.registry.get_sample_value(
        "resize_preemption_lent_resources",
        {"node": "node-1", "resource": "memory", "unit": "byte"},
    )


def test_the_oldest_loan_out_is_timed_from_its_admission_and_zero_once_none_is_out() -> None:
    metrics = Metrics()
    worker, ledger, _, _, _ = setup(Cluster(HIGH_RESIZED, LENT, MID_0), metrics=metrics)
    ledger.update("node-1", lambda es: ((replace(es[0], loans=(LOAN,), victims=()),), None))
    worker.run_once()
    # The worker's clock reads a second after the admission.
    assert 1.0 == metrics.registry.get_sample_value("resize_preemption_oldest_loan_age_seconds")

    worker.cluster.set(HIGH_RESIZED, pod("lender", cpu="3"), MID_0)  # its owner's spec won
    worker.run_once()

    assert 0.0 == metrics.registry.get_sample_value("resize_preemption_oldest_loan_age_seconds")


def giving_back(cluster: Cluster, *entries: LedgerEntry) -> tuple[PreemptionWorker, list[str]]:
    log: list[str] = []
    ledger = InMemoryLedger()
    add(ledger, *entries)
    worker = make_worker(
        cluster, ledger, LoggingEvictor(log), Clock(), resizer=FakeResizer(log=log)
    )
    return worker, log


BORROWED = replace(entry(), loans=(LOAN,), generation=1)


def test_a_loan_is_given_back_once_the_borrower_shrank_and_never_while_it_holds_the_room() -> None:
    holding = replace(pod("high", cpu="6", priority=1000), generation=1)
    cluster = Cluster(
        holding, pod("lender", cpu="1", lent=(LOAN,)), pod("mid", cpu="1", priority=2000)
    )
    worker, log = giving_back(cluster, BORROWED)
    worker.run_once()
    assert [] == log

    shrunk = replace(pod("high", cpu="4", priority=1000), generation=2)
    cluster.set(shrunk, pod("lender", cpu="1", lent=(LOAN,)), pod("mid", cpu="1", priority=2000))
    worker.run_once()

    assert ["give back lender 1000->3000"] == log


def test_a_released_entry_with_a_loan_stays_to_give_it_back() -> None:
    # The borrower is gone: its entry is released, the loan still returned.
    cluster = Cluster(pod("lender", cpu="1", lent=(LOAN,)), pod("mid", cpu="1", priority=2000))
    worker, log = giving_back(cluster, BORROWED)

    worker.run_once()

    assert ["give back lender 1000->3000"] == log
    [left] = worker.ledger.all_entries()
    assert (BORROWED.loans, ()) == (left.loans, left.victims)
    assert left.expires_at <= ADMITTED


def test_what_is_lent_drops_to_zero_once_the_node_has_no_entries() -> None:
    metrics = Metrics()
    worker, ledger, _, _, _ = setup(Cluster(HIGH_RESIZED, LENT, MID_0), metrics=metrics)
    ledger.update("node-1", lambda es: ((replace(es[0], loans=(LOAN,), victims=()),), None))
    worker.run_once()
    ledger.update("node-1", lambda es: ((), None))

    worker.run_once()

    assert 0.0 == metrics.registry.get_sample_value(
        "resize_preemption_lent_resources", {"node": "node-1", "resource": "cpu", "unit": "core"}
    )


def test_a_resize_cancelled_before_its_loan_neither_lends_nor_evicts() -> None:
    """The plan is decided, then the resize is patched back down before the loan is
    made: the loan and the evictions after it are not needed any more."""
    cluster = Cluster(*SCENE)
    worker, _, _, _, log = setup(cluster)
    decide = worker.decide

    def decided_then_cancelled(e: LedgerEntry) -> object:
        action = decide(e)
        cluster.set(pod("high", cpu="2", priority=1000), LENDER, LOW_B, MID_0)
        return action

    worker.decide = decided_then_cancelled  # type: ignore[method-assign,assignment]
    worker.run_once()

    assert [] == log
