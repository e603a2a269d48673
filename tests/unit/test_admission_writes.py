"""What a review writes to the ledger: one write for an admitted plan, none otherwise."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import pytest

from harness.doubles import InMemoryLedger, StaticClusterView
from tests.unit.web_fixtures import pod, resized, review, walkthrough_objects, walkthrough_view
from webhook.base.settings import Config
from webhook.core.lending import Loan
from webhook.core.model import FLOOR_ANNOTATION, PodRef
from webhook.core.resources import Resources
from webhook.engine.admission import AdmissionEngine
from webhook.engine.ledger import MAX_NODE_ENTRIES, LedgerEntry

GI = 1024**3
NOW = 1000.0


def at_generation(obj: dict, generation: int) -> dict:  # type: ignore[type-arg]
    out = copy.deepcopy(obj)
    out["metadata"]["generation"] = generation
    return out


@dataclass(frozen=True)
class Case:
    cpu: str
    verdict: str
    writes: int
    never: bool = False  # preemptionPolicy: Never


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Case("6", "preempt", 1), id="a-preempting-plan-is-one-write"),
        pytest.param(Case("5", "fits", 1), id="growth-that-fits-is-one-write"),
        pytest.param(Case("99", "infeasible", 0), id="infeasible-writes-nothing"),
        pytest.param(
            Case("6", "not-eligible", 0, never=True),
            id="not-eligible-writes-nothing",
        ),
        pytest.param(Case("2", "fits", 0), id="no-growth-writes-nothing"),
    ],
)
def test_ledger_writes_per_review(case: Case) -> None:
    ledger = InMemoryLedger()
    node, low, high = walkthrough_objects()
    if case.never:
        high["spec"]["preemptionPolicy"] = "Never"
    view = StaticClusterView.from_objects([node, low, high])
    engine = AdmissionEngine(Config(), view, ledger, clock=lambda: NOW)

    decision = engine.validate(review(high, resized(high, case.cpu))["request"])

    assert (case.verdict, case.writes) == (decision.verdict, ledger.writes)


def test_an_admitted_entry_records_its_generation_and_drops_spent_entries() -> None:
    # "peer" was admitted earlier and its resize is actuated now: spent, nobody counts it.
    node, low, high = walkthrough_objects()
    peer = pod("peer", "1", 1_000_000)
    view = StaticClusterView.from_objects((node, low, at_generation(high, 2), peer))
    ledger = InMemoryLedger()
    spent_entry = LedgerEntry(
        pod=view.pod("default", "peer").ref,  # type: ignore[union-attr]
        node="node-1",
        review_uid="review-0",
        resources=Resources(1000, GI),
        desired=(("app", Resources(1000, GI)),),
        victims=(),
        admitted_at=NOW - 5,
        expires_at=NOW + 100,
    )
    ledger.update("node-1", lambda es: ((*es, spent_entry), None))
    engine = AdmissionEngine(Config(), view, ledger, clock=lambda: NOW)
    before = ledger.writes

    decision = engine.validate(
        review(at_generation(high, 2), at_generation(resized(high, "6"), 3))["request"]
    )

    [written] = ledger.entries("node-1")
    assert ("preempt", 1) == (decision.verdict, ledger.writes - before)
    assert (3, NOW + Config().persist_timeout) == (written.generation, written.persist_by)


@pytest.mark.parametrize(
    ("expected", "lending"),
    [
        pytest.param(["default/low-priority-pod"], True, id="told-with-lending-on"),
        pytest.param([], False, id="nothing-with-lending-off"),
    ],
)
def test_a_malformed_floor_is_handed_on_after_the_answer_and_the_plan_goes_on(
    expected: list[str], lending: bool
) -> None:
    node, low, high = walkthrough_objects()
    low["metadata"]["annotations"] = {"resize-preemption.io/floor": "not json"}
    told: list[str] = []
    engine = AdmissionEngine(
        Config(lending=lending),
        StaticClusterView.from_objects((node, low, high)),
        InMemoryLedger(),
        clock=lambda: NOW,
        on_floor_errors=lambda errors: told.extend(pod.key for pod, _ in errors),
    )

    decision = engine.validate(review(high, resized(high, "6"))["request"])

    # An ordinary candidate: evicted as without the annotation.
    assert ("preempt", ("default/low-priority-pod",)) == (
        decision.verdict,
        decision.plan.victim_keys if decision.plan else (),
    )
    assert expected == told


@pytest.mark.parametrize(
    ("expected", "loans"),
    [
        pytest.param(("preempt", 0, []), True, id="a-give-back-never-preempts"),
        pytest.param(("preempt", 1, ["default/peer"]), False, id="the-same-resize-by-its-owner"),
    ],
)
def test_a_loan_given_back_is_never_preempted_for(
    expected: tuple[str, int, list[str]], loans: bool
) -> None:
    # low-priority-pod lent 1 CPU (4 -> 3); high-priority-pod 4 and peer 1 fill the node
    # since. Back to 4 only fits without peer.
    node, low, high = walkthrough_objects()
    peer = pod("peer", "1", 0)
    view = StaticClusterView.from_objects((node, low, high, peer))
    lender = view.pod("default", "low-priority-pod")
    assert lender is not None
    entry = LedgerEntry(
        pod=view.pod("default", "high-priority-pod").ref,  # type: ignore[union-attr]
        node="node-1",
        review_uid="review-0",
        resources=Resources(4000, GI),
        desired=(("app", Resources(4000, GI)),),
        victims=(),
        admitted_at=NOW - 50,
        expires_at=NOW - 1,
        loans=(Loan(lender.ref, 1000, "app", "cpu", 4000, 3000, 1000, True),) if loans else (),
    )
    ledger = InMemoryLedger()
    ledger.update("node-1", lambda es: ((*es, entry), None))
    before = ledger.writes
    engine = AdmissionEngine(Config(), view, ledger, clock=lambda: NOW)

    decision = engine.validate(review(low, resized(low, "4"))["request"])

    written = [v.key for e in ledger.entries("node-1") for v in e.victims]
    assert expected == (decision.verdict, ledger.writes - before, written)


@pytest.mark.parametrize(
    ("expected", "lent_cpu"),
    [
        pytest.param(["review-0", "review-1"], "2", id="loan-outstanding-entry-kept"),
        pytest.param(["review-1"], "3", id="loan-given-back-entry-dropped"),
    ],
)
def test_an_admission_write_keeps_an_entry_until_its_loans_are_given_back(
    expected: list[str], lent_cpu: str
) -> None:
    # "peer" borrowed 1 CPU from low-priority-pod (3 -> 2) and its resize is actuated:
    # its entry holds no room, but the loan is still out unless low is back at 3.
    node, _, high = walkthrough_objects()
    low = pod("low-priority-pod", lent_cpu, 1000)
    peer = pod("peer", "1", 1_000_000)
    view = StaticClusterView.from_objects((node, low, high, peer))
    lender = view.pod("default", "low-priority-pod")
    assert lender is not None
    spent_entry = LedgerEntry(
        pod=view.pod("default", "peer").ref,  # type: ignore[union-attr]
        node="node-1",
        review_uid="review-0",
        resources=Resources(1000, GI),
        desired=(("app", Resources(1000, GI)),),
        victims=(),
        admitted_at=NOW - 5,
        expires_at=NOW + 100,
        loans=(Loan(lender.ref, 1000, "app", "cpu", 3000, 2000, 1000, True),),
    )
    ledger = InMemoryLedger()
    ledger.update("node-1", lambda es: ((*es, spent_entry), None))
    engine = AdmissionEngine(Config(), view, ledger, clock=lambda: NOW)

    engine.validate(review(high, resized(high, "5"))["request"])

    assert expected == sorted(e.review_uid for e in ledger.entries("node-1"))


@pytest.mark.parametrize(
    ("expected", "loans"),
    [
        pytest.param(["review-2"], False, id="the-earlier-entry-is-superseded"),
        pytest.param(["review-1", "review-2"], True, id="kept-while-its-loan-is-out"),
    ],
)
def test_a_newer_admission_of_a_pod_drops_its_earlier_entry(
    expected: list[str], loans: bool
) -> None:
    # high-priority-pod is admitted at 5 CPU, then at 6 before the first is persisted:
    # the first entry still counts, but the newer resize replaces it.
    node, low, high = walkthrough_objects()
    view = StaticClusterView.from_objects((node, low, high))
    ledger = InMemoryLedger()
    engine = AdmissionEngine(Config(), view, ledger, clock=lambda: NOW)
    engine.validate(review(high, resized(high, "5"), uid="review-1")["request"])
    if loans:
        lender = view.pod("default", "low-priority-pod")
        assert lender is not None
        loan = Loan(lender.ref, 1000, "app", "cpu", 4000, 3000, 1000, True)
        ledger.update("node-1", lambda es: (tuple(replace(e, loans=(loan,)) for e in es), None))

    engine.validate(review(high, resized(high, "6"), uid="review-2")["request"])

    assert expected == sorted(e.review_uid for e in ledger.entries("node-1"))


def test_a_full_ledger_allows_the_resize_and_says_why() -> None:
    ledger = InMemoryLedger()
    filler = tuple(
        LedgerEntry(
            pod=PodRef("other", f"p-{i}", f"uid-p-{i}"),
            node="node-1",
            review_uid=f"r-{i}",
            resources=Resources(0, 0),
            desired=(),
            victims=(),
            admitted_at=NOW,
            expires_at=NOW + 100,
        )
        for i in range(MAX_NODE_ENTRIES)
    )
    ledger.update("node-1", lambda _: (filler, None))
    engine = AdmissionEngine(Config(), walkthrough_view(), ledger, clock=lambda: NOW)
    high = walkthrough_objects()[2]

    decision = engine.validate(review(high, resized(high, "6"))["request"])

    assert decision.allowed
    assert "error" == decision.verdict
    assert any(
        f"ledger of node node-1 full: {MAX_NODE_ENTRIES + 1} entries" in w
        for w in decision.warnings
    )
    assert filler == ledger.entries("node-1")


def lender_at_floor(cpu: str) -> dict:  # type: ignore[type-arg]
    """low-priority-pod (3 CPU) lending down to a floor of 1, its spec at ``cpu``: the
    kubelet has not actuated a lowered spec yet (the status still holds 3)."""
    low = pod(
        "low-priority-pod", "3", 1000, annotations={FLOOR_ANNOTATION: '{"app": {"cpu": "1"}}'}
    )
    return resized(low, cpu)


@pytest.mark.parametrize(
    ("lender", "taken", "making"),
    [
        pytest.param(
            False,
            (["default/low-priority-pod"], []),
            "waiting for 1 to leave: default/low-priority-pod",
            id="victim",
        ),
        pytest.param(
            True,
            ([], ["default/low-priority-pod"]),
            "borrowing from default/low-priority-pod",
            id="loan",
        ),
    ],
)
def test_a_resize_asked_again_before_the_kubelet_actuates_it_takes_nothing_anew(
    lender: bool, taken: tuple[list[str], list[str]], making: str
) -> None:
    # An autoscaler sends a pending resize again on each loop. high-priority-pod asks for
    # 6 CPU (4 + 3 of 8 held); the room is being made, neither the resize nor the loan is
    # actuated yet (on 1.33 the kubelet retries a deferred resize only at the pod's next
    # sync). A plan made now would count that room as missing: the loan's lender is at
    # its floor, so it would name low-priority-pod as a victim too.
    node, low, high = walkthrough_objects()
    low = lender_at_floor("3") if lender else low
    ledger = InMemoryLedger()
    first_view = StaticClusterView.from_objects((node, low, high))
    AdmissionEngine(Config(), first_view, ledger, clock=lambda: NOW).validate(
        review(high, resized(high, "6"), uid="review-1")["request"]
    )
    (first,) = ledger.entries("node-1")
    assert taken == ([v.key for v in first.victims], [loan.pod.key for loan in first.loans])
    persisted = resized(high, "6")
    lent = lender_at_floor("1") if lender else low
    view = StaticClusterView.from_objects((node, lent, persisted))
    engine = AdmissionEngine(Config(), view, ledger, clock=lambda: NOW + 2)
    before = ledger.writes

    decision = engine.validate(review(persisted, persisted, uid="review-2")["request"])

    assert (0, (first,)) == (ledger.writes - before, ledger.entries("node-1"))
    assert ("fits", "admitted", "") == (
        decision.audit["verdict"],
        decision.audit["reason"],
        decision.audit["victims"],
    )
    assert first == decision.admitted
    assert decision.plan is not None
    assert f"resize already admitted on node-1, its room held: {making}" == decision.plan.reason
    assert () == decision.warnings
