"""The worker's pure decisions: what to do with one admitted resize, given the cache."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

import pytest

from webhook.base.settings import Config
from webhook.core.lending import Loan, LoanRecord, lender_step, loan_state, records_text
from webhook.core.model import (
    FLOOR_ANNOTATION,
    LOANS_ANNOTATION,
    DisruptionBudget,
    LabelSelector,
    Node,
    Pod,
    PodRef,
)
from webhook.core.objects import parse_pod
from webhook.core.resources import Resources
from webhook.engine.ledger import LedgerEntry
from webhook.engine.lifecycle.next_step import Act, Action, Release, Wait, next_action
from webhook.engine.lifecycle.states import entry_phase, persisted

GI = 1024**3
NODE = Node(name="node-1", allocatable=Resources(8000, 16 * GI))
CONFIG = Config(persist_timeout=10.0, reservation_ttl=120.0)
ADMITTED = 100.0
NOW = 105.0


def pod(
    name: str,
    *,
    cpu: str = "1",
    allocated: str | None = None,
    priority: int = 0,
    uid: str | None = None,
    start: str = "2024-01-01T00:00:00Z",
    labels: dict[str, str] | None = None,
    terminating: bool = False,
    phase: str = "Running",
    resize: str | None = None,
    node: str = "node-1",
    floor: str | None = None,
    lent: tuple[Loan, ...] = (),
) -> Pod:
    """A one-container pod; ``allocated`` (default: ``cpu``) is what the kubelet admitted;
    ``floor``: its container's cpu floor (it lends); ``lent``: the loans it records having
    made, to "high"."""
    granted = {"cpu": allocated or cpu, "memory": "1Gi"}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "uid": uid or f"uid-{name}",
        "labels": labels or {"app": name},
        "annotations": {},
    }
    if floor is not None:
        meta["annotations"][FLOOR_ANNOTATION] = json.dumps({"app": {"cpu": floor}})
    if lent:
        kept = (LoanRecord(loan, ref("high"), ADMITTED) for loan in lent)
        meta["annotations"][LOANS_ANNOTATION] = records_text(kept)
    if terminating:
        meta["deletionTimestamp"] = "2024-01-01T00:10:00Z"
    status: dict[str, Any] = {
        "phase": phase,
        "startTime": start,
        "containerStatuses": [
            {"name": "app", "allocatedResources": granted, "resources": {"requests": granted}}
        ],
    }
    if resize:
        status["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": resize}]
    return parse_pod(
        {
            "kind": "Pod",
            "metadata": meta,
            "spec": {
                "nodeName": node,
                "priority": priority,
                "containers": [
                    {"name": "app", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}
                ],
            },
            "status": status,
        }
    )


def ref(name: str, uid: str | None = None) -> PodRef:
    return PodRef("default", name, uid or f"uid-{name}")


def entry(
    *victims: str,
    desired_cpu: int = 6000,
    persisted: bool = False,
    handled: tuple[str, ...] = (),
    expires_at: float = ADMITTED + 120.0,
    pod_name: str = "high",
    review: str = "review-1",
    resources: Resources | None = None,
) -> LedgerEntry:
    desired = Resources(desired_cpu, GI)
    return LedgerEntry(
        pod=ref(pod_name),
        node="node-1",
        review_uid=review,
        resources=resources or desired,
        desired=(("app", desired),),
        victims=tuple(ref(v) for v in victims),
        admitted_at=ADMITTED,
        expires_at=expires_at,
        handled=frozenset(f"uid-{h}" for h in handled),
        persisted=persisted,
    )


# The walkthrough: an 8-CPU node; "high" (priority 1000) asks for 6 CPUs while holding 2;
# "low" (priority 0) holds 4 and "mid" (priority 2000, never a victim) holds 1.
HIGH_RESIZED = pod("high", cpu="6", allocated="2", priority=1000)
HIGH_BEFORE = pod("high", cpu="2", priority=1000)
LOW = pod("low", cpu="4")
MID = pod("mid", cpu="1", priority=2000)
SCENE = (HIGH_RESIZED, LOW, MID)
HIGH_5 = pod("high", cpu="5", allocated="2", priority=1000)
# Two victims of 2 CPUs each were needed; "low-a" started first (more important).
LOW_A = pod("low-a", cpu="2", start="2024-01-01T00:00:00Z")
LOW_B = pod("low-b", cpu="2", start="2024-01-01T01:00:00Z")


@dataclass(frozen=True)
class Expected:
    """What an action comes to: its kind, its reason (release, wait) and the victims it
    names, by pod name."""

    kind: Literal["release", "wait", "act"]
    reason: str = ""
    evict: tuple[str, ...] = ()
    settle: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    #: A release the worker must write (readers would still count the entry).
    write: bool = False


def digest(action: Action) -> Expected:
    if isinstance(action, Release):
        return Expected("release", action.reason, write=action.write)
    if isinstance(action, Wait):
        return Expected(
            "wait",
            action.reason,
            settle=tuple(v.name for v in action.settle),
        )
    assert isinstance(action, Act)
    return Expected(
        "act",
        evict=tuple(v.name for v in action.evict),
        settle=tuple(v.name for v in action.settle),
        drop=tuple(v.name for v in action.drop),
    )


@dataclass(frozen=True)
class Case:
    """An admitted entry, the resizing pod and its node as the cache shows them, and what
    the worker must do next."""

    entry: LedgerEntry
    pod: Pod | None
    expected: Expected
    node: Node | None = NODE
    pods: tuple[Pod, ...] = SCENE
    now: float = NOW
    budgets: tuple[DisruptionBudget, ...] = ()
    others: tuple[LedgerEntry, ...] = ()


LOW_PDB = DisruptionBudget("default", "low-pdb", LabelSelector((("app", "low"),)), 0)
OTHER = entry(pod_name="other", review="review-2", desired_cpu=2000)

CASES = [
    # -- 1. expiry -----------------------------------------------------------------------
    pytest.param(
        Case(entry("low", expires_at=NOW), HIGH_RESIZED, Expected("release", "expired")),
        id="expired-reservation-evicts-nobody",
    ),
    # -- 2. the pod -------------------------------------------------------------------------
    pytest.param(
        Case(entry("low"), None, Expected("release", "pod-gone", write=True), pods=(LOW, MID)),
        id="pod-deleted",
    ),
    pytest.param(
        Case(
            entry("low"),
            pod("high", cpu="6", priority=1000, uid="uid-new"),
            Expected("release", "pod-gone", write=True),
        ),
        id="pod-replaced-by-new-uid",
    ),
    pytest.param(
        Case(
            entry("low"), replace(HIGH_RESIZED, terminating=True), Expected("release", "pod-gone")
        ),
        id="pod-terminating",
    ),
    pytest.param(
        Case(entry("low"), replace(HIGH_RESIZED, phase="Failed"), Expected("release", "pod-gone")),
        id="pod-terminal",
    ),
    # -- 3. persistence -------------------------------------------------------------------
    pytest.param(
        Case(
            entry("low"),
            HIGH_BEFORE,
            Expected("wait", "not-persisted-yet"),
            pods=(HIGH_BEFORE, LOW, MID),
        ),
        id="not-persisted-yet-waits",
    ),
    pytest.param(
        Case(
            entry("low"),
            HIGH_BEFORE,
            Expected("release", "not-persisted", write=True),
            pods=(HIGH_BEFORE, LOW, MID),
            now=ADMITTED + 10.0,
        ),
        id="never-persisted-is-released-without-eviction",
    ),
    pytest.param(
        Case(
            entry("low", persisted=True),
            HIGH_BEFORE,
            Expected("release", "superseded", write=True),
            pods=(HIGH_BEFORE, LOW, MID),
        ),
        id="spec-changed-after-persisting",
    ),
    pytest.param(
        Case(
            replace(entry("low"), generation=3),
            replace(HIGH_BEFORE, generation=2),
            Expected("wait", "not-persisted-yet"),
            pods=(replace(HIGH_BEFORE, generation=2), LOW, MID),
        ),
        id="generation-not-reached-yet-waits",
    ),
    pytest.param(
        Case(
            replace(entry("low"), generation=3),
            replace(HIGH_BEFORE, generation=4),
            Expected("release", "superseded"),
            pods=(replace(HIGH_BEFORE, generation=4), LOW, MID),
        ),
        id="a-later-generation-supersedes-without-the-persisted-flag",
    ),
    pytest.param(
        Case(
            replace(entry("low"), persist_by=ADMITTED + 10.0),
            HIGH_BEFORE,
            Expected("release", "not-persisted"),
            pods=(HIGH_BEFORE, LOW, MID),
            now=ADMITTED + 10.0,
        ),
        id="never-persisted-with-its-own-deadline-needs-no-write",
    ),
    pytest.param(
        Case(
            replace(entry("low"), generation=3),
            replace(HIGH_RESIZED, generation=3),
            Expected("act", evict=("low",)),
            pods=(replace(HIGH_RESIZED, generation=3), LOW, MID),
        ),
        id="generation-reached-is-persisted",
    ),
    # -- 4. actuated or refused by the kubelet ----------------------------------------------
    pytest.param(
        Case(
            entry("low", persisted=True),
            pod("high", cpu="6", priority=1000),
            Expected("release", "actuated"),
            pods=(LOW, MID),
        ),
        id="actuated",
    ),
    pytest.param(
        Case(
            entry(handled=("low",), persisted=True),
            pod("high", cpu="6", allocated="8", priority=1000),
            Expected("release", "actuated"),
            pods=(MID,),
        ),
        id="allocated-above-desired-counts-as-actuated",
    ),
    pytest.param(
        Case(
            entry("low"),
            pod("high", cpu="6", allocated="2", priority=1000, resize="Infeasible"),
            Expected("release", "infeasible-resize"),
        ),
        id="kubelet-says-infeasible",
    ),
    # -- 5. re-plan on fresh state ------------------------------------------------------------
    pytest.param(
        Case(entry("low"), HIGH_RESIZED, Expected("act", evict=("low",))),
        id="persisted-evicts-the-planned-victim",
    ),
    pytest.param(
        Case(entry("low", persisted=True), HIGH_RESIZED, Expected("act", evict=("low",))),
        id="persisted-by-the-reconciler-evicts-the-planned-victim",
    ),
    pytest.param(
        Case(
            entry("low", persisted=True),
            HIGH_RESIZED,
            Expected("act", drop=("low",)),
            node=replace(NODE, allocatable=Resources(12000, 16 * GI)),
        ),
        id="room-appeared-evicts-nobody-and-unclaims",
    ),
    pytest.param(
        Case(
            entry("low-a", "low-b", persisted=True),
            HIGH_RESIZED,
            Expected("act", evict=("low-a", "low-b")),
            pods=(HIGH_RESIZED, LOW_A, LOW_B, MID),
        ),
        id="both-victims-still-needed-in-entry-order",
    ),
    pytest.param(
        Case(
            entry("low-a", "low-b", persisted=True),
            HIGH_RESIZED,
            Expected("act", evict=("low-b",), drop=("low-a",)),
            pods=(HIGH_RESIZED, LOW_A, LOW_B),
        ),
        id="fewer-victims-when-room-appeared",
    ),
    pytest.param(
        Case(
            entry("low", persisted=True),
            HIGH_RESIZED,
            Expected("act", settle=("low",)),
            pods=(HIGH_RESIZED, MID),
        ),
        id="victim-gone-is-settled-not-evicted",
    ),
    pytest.param(
        Case(
            entry("low", persisted=True),
            HIGH_RESIZED,
            Expected("act", settle=("low",)),
            pods=(HIGH_RESIZED, replace(LOW, terminating=True), MID),
        ),
        id="victim-terminating-is-settled-not-evicted",
    ),
    pytest.param(
        Case(
            entry("low", persisted=True),
            HIGH_RESIZED,
            Expected("wait", "cannot-fit", settle=("low",)),
            pods=(HIGH_RESIZED, pod("low", cpu="4", uid="uid-low-2"), MID),
        ),
        id="new-pod-with-victims-name-is-never-evicted",
    ),
    pytest.param(
        Case(
            entry("low-a", "low-b", handled=("low-a",), persisted=True),
            HIGH_RESIZED,
            Expected("act", evict=("low-b",)),
            pods=(HIGH_RESIZED, LOW_A, LOW_B, MID),
        ),
        id="handled-victim-not-evicted-again-even-if-cache-lags",
    ),
    pytest.param(
        # Asking for 5 CPUs: either 3-CPU pod would do. A fresh unrestricted plan would
        # take "late" (lower priority, appeared after admission); only "low" was named.
        Case(
            entry("low", persisted=True, desired_cpu=5000),
            HIGH_5,
            Expected("act", evict=("low",)),
            pods=(HIGH_5, pod("low", cpu="3", priority=100), pod("late", cpu="3")),
        ),
        id="never-a-victim-the-admitted-plan-did-not-name",
    ),
    pytest.param(
        Case(
            entry("low", persisted=True),
            HIGH_RESIZED,
            Expected("wait", "cannot-fit"),
            budgets=(LOW_PDB,),
        ),
        id="pdb-now-forbids-it-waits",
    ),
    pytest.param(
        Case(
            entry("low", persisted=True),
            HIGH_RESIZED,
            Expected("wait", "cannot-fit"),
            others=(OTHER,),
        ),
        id="another-reservation-took-the-room-waits",
    ),
    pytest.param(
        Case(
            entry("low", persisted=True),
            HIGH_RESIZED,
            Expected("act", evict=("low",)),
            others=(replace(OTHER, expires_at=NOW - 1),),
        ),
        id="expired-reservations-of-others-do-not-count",
    ),
    pytest.param(
        Case(
            entry("low", persisted=True),
            HIGH_RESIZED,
            Expected("release", "not-eligible", write=True),
            node=replace(NODE, resize_preemption_disabled=True),
        ),
        id="node-opted-out-after-admission",
    ),
    pytest.param(
        Case(
            entry("low"),
            HIGH_RESIZED,
            Expected("wait", "node-unknown"),
            node=None,
        ),
        id="node-not-cached",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_next_action(case: Case) -> None:
    action = next_action(
        case.entry,
        case.pod,
        case.node,
        case.pods,
        now=case.now,
        config=CONFIG,
        budgets=case.budgets,
        others=case.others,
    )

    assert case.expected == digest(action)


def test_next_action_is_pure() -> None:
    args = (entry("low"), HIGH_RESIZED, NODE, SCENE)
    first = next_action(*args, now=NOW, config=CONFIG)
    assert next_action(*args, now=NOW, config=CONFIG) == first


def test_act_carries_the_fresh_plan() -> None:
    action = next_action(entry("low"), HIGH_RESIZED, NODE, SCENE, now=NOW, config=CONFIG)
    assert isinstance(action, Act)
    assert action.plan.verdict == "preempt"
    assert ["default/low"] == [v.pod.key for v in action.plan.victims]
    assert () == action.drop  # nothing to write before the eviction


def test_own_reservation_is_not_counted_against_itself() -> None:
    # The entry reserves 6 CPUs for "high"; if it counted against itself nothing would fit.
    own = entry("low", persisted=True)
    action = next_action(own, HIGH_RESIZED, NODE, SCENE, now=NOW, config=CONFIG, others=(own,))
    assert Expected("act", evict=("low",)) == digest(action)


@pytest.mark.parametrize(
    ("the_pod", "in_spec", "actuated"),
    [
        pytest.param(HIGH_BEFORE, False, False, id="old-spec"),
        pytest.param(HIGH_RESIZED, True, False, id="persisted-not-allocated"),
        pytest.param(pod("high", cpu="6", priority=1000), True, True, id="allocated"),
    ],
)
def test_persisted_and_actuated(the_pod: Pod, in_spec: bool, actuated: bool) -> None:
    assert in_spec is persisted(entry("low"), the_pod)
    assert actuated is (entry_phase(entry("low"), the_pod, NOW).state == "actuated")


# -- loans ------------------------------------------------------------------------------------
# "high" asks for 6 CPUs on 8; "lender" (priority 0) holds 3 and lent 2 of them (3 -> 1),
# "mid" holds 1: with the loan the resize fits exactly, without it it does not.
LOAN = Loan(ref("lender"), 0, "app", "cpu", 3000, 1000, 2000)
LENDER = pod("lender", cpu="3", floor="1")
# Made, the kubelet not caught up yet.
LENT = pod("lender", cpu="1", allocated="3", floor="1", lent=(LOAN,))
LOAN_SCENE = (HIGH_RESIZED, LENDER, MID)


@dataclass(frozen=True)
class LoanCase:
    entry: LedgerEntry
    pods: tuple[Pod, ...]
    #: The action's kind and reason, its loans to make (lender names) and its evictions.
    expected: tuple[str, str, tuple[str, ...], tuple[str, ...]]
    others: tuple[LedgerEntry, ...] = ()


def loan_entry(*victims: str, loans: tuple[Loan, ...] = (LOAN,)) -> LedgerEntry:
    return replace(entry(*victims), loans=loans)


def loan_digest(action: Action) -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
    if isinstance(action, Act):
        lend = tuple(loan.pod.name for loan in action.lend)
        return ("act", "", lend, tuple(v.name for v in action.evict))
    return (digest(action).kind, action.reason, (), ())


LOAN_CASES = [
    pytest.param(
        LoanCase(loan_entry(), LOAN_SCENE, ("act", "", ("lender",), ())),
        id="pending-loan-is-made",
    ),
    pytest.param(
        LoanCase(loan_entry(), (HIGH_RESIZED, LENT, MID), ("act", "", (), ())),
        id="made-loan-not-repeated-while-the-kubelet-catches-up",
    ),
    pytest.param(
        LoanCase(loan_entry(), (HIGH_RESIZED, pod("lender", cpu="1"), MID), ("act", "", (), ())),
        id="actuated-loan-not-repeated",
    ),
    pytest.param(
        LoanCase(
            loan_entry(),
            (HIGH_RESIZED, pod("lender", cpu="2500m"), MID),
            ("wait", "cannot-fit", (), ()),
        ),
        id="owner-changed-the-lender-its-spec-wins",
    ),
    pytest.param(
        LoanCase(
            loan_entry(),
            (HIGH_RESIZED, pod("lender", cpu="3", uid="uid-new"), MID),
            ("wait", "cannot-fit", (), ()),
        ),
        id="lender-replaced-by-a-pod-of-the-same-name-owes-nothing",
    ),
    pytest.param(
        LoanCase(loan_entry(), (HIGH_RESIZED, MID), ("act", "", (), ())),
        id="lender-gone-room-is-there",
    ),
    pytest.param(
        LoanCase(
            loan_entry("low-b", loans=(replace(LOAN, after=2000, frees=1000),)),
            (HIGH_RESIZED, LENDER, LOW_B, pod("mid", cpu="0", priority=2000)),
            ("act", "", ("lender",), ("low-b",)),
        ),
        id="one-loan-and-one-eviction",
    ),
    pytest.param(
        LoanCase(
            loan_entry(loans=()),
            (HIGH_RESIZED, pod("lender", cpu="1", allocated="3", uid="uid-lender"), MID),
            ("act", "", (), ()),
            # The other resize's room is its own; its loan, made, frees the rest.
            others=(
                replace(
                    entry(pod_name="other", review="review-2", resources=Resources(0, 0)),
                    loans=(LOAN,),
                ),
            ),
        ),
        id="another-entry-s-loan-is-that-entry-s",
    ),
]


@pytest.mark.parametrize("case", LOAN_CASES)
def test_next_action_with_loans(case: LoanCase) -> None:
    action = next_action(
        case.entry, HIGH_RESIZED, NODE, case.pods, now=NOW, config=CONFIG, others=case.others
    )

    assert case.expected == loan_digest(action)


@pytest.mark.parametrize(
    ("expected", "lender"),
    [
        pytest.param("to-lend", LENDER, id="at-before"),
        pytest.param("lent", LENT, id="at-after"),
        pytest.param("lent", pod("lender", cpu="500m"), id="below-after"),
        pytest.param("void", pod("lender", cpu="2"), id="owner-set-another-amount"),
        pytest.param("void", pod("lender", cpu="3", terminating=True), id="leaving"),
        pytest.param("void", pod("lender", cpu="3", uid="uid-other"), id="replaced"),
        pytest.param("void", None, id="gone"),
    ],
)
def test_loan_state(expected: str, lender: Pod | None) -> None:
    assert expected == loan_state(LOAN, lender)


@dataclass(frozen=True)
class StepCase:
    id: str
    expected: str
    lender: Pod | None
    back: bool = False


STEP_CASES = [
    StepCase("lend-at-before", "resize", LENDER),
    StepCase("lend-at-after", "done", LENT),
    StepCase("lend-below-after", "done", pod("lender", cpu="500m")),
    StepCase("lend-owner-set-another-amount", "void", pod("lender", cpu="2")),
    StepCase("give-back-at-after", "resize", LENT, back=True),
    StepCase("give-back-at-before", "done", LENDER, back=True),
    StepCase("give-back-below-after", "void", pod("lender", cpu="500m"), back=True),
    StepCase("give-back-owner-set-another-amount", "void", pod("lender", cpu="2"), back=True),
    StepCase("leaving", "void", pod("lender", cpu="3", terminating=True)),
    StepCase("finished", "void", pod("lender", cpu="3", phase="Succeeded")),
    StepCase("replaced", "void", pod("lender", cpu="1", uid="uid-other"), back=True),
    StepCase("gone", "void", None),
]


@pytest.mark.parametrize("case", STEP_CASES, ids=lambda c: c.id)
def test_lender_step(case: StepCase) -> None:
    assert case.expected == lender_step(LOAN, case.lender, back=case.back)
