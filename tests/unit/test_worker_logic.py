"""The worker's pure decisions: what to do with one admitted resize, given the cache."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from webhook.core.model import DisruptionBudget, LabelSelector, Node, Pod, PodRef
from webhook.core.objects import parse_pod
from webhook.core.resources import Resources
from webhook.engine.config import Config
from webhook.engine.ledger import LedgerEntry
from webhook.engine.worker_logic import (
    Act,
    Action,
    Release,
    Wait,
    is_actuated,
    is_persisted,
    next_action,
)

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
) -> Pod:
    """A one-container pod; ``allocated`` (default: ``cpu``) is what the kubelet admitted."""
    granted = {"cpu": allocated or cpu, "memory": "1Gi"}
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "uid": uid or f"uid-{name}",
        "labels": labels or {"app": name},
    }
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


def summary(action: Action) -> tuple[Any, ...]:
    """A comparable digest: kind, reason and victim names."""
    if isinstance(action, Release):
        return ("release", action.reason)
    if isinstance(action, Wait):
        return (
            "wait",
            action.reason,
            tuple(v.name for v in action.settle),
            action.mark_persisted,
        )
    assert isinstance(action, Act)
    return (
        "act",
        tuple(v.name for v in action.evict),
        tuple(v.name for v in action.settle),
        tuple(v.name for v in action.drop),
        action.mark_persisted,
    )


CASES = [
    # -- 1. expiry -----------------------------------------------------------------------
    pytest.param(
        entry("low", expires_at=NOW),
        HIGH_RESIZED,
        NODE,
        SCENE,
        {},
        ("release", "expired"),
        id="expired-reservation-evicts-nobody",
    ),
    # -- 2. the pod -------------------------------------------------------------------------
    pytest.param(
        entry("low"),
        None,
        NODE,
        (LOW, MID),
        {},
        ("release", "pod-gone"),
        id="pod-deleted",
    ),
    pytest.param(
        entry("low"),
        pod("high", cpu="6", priority=1000, uid="uid-new"),
        NODE,
        SCENE,
        {},
        ("release", "pod-gone"),
        id="pod-replaced-by-new-uid",
    ),
    pytest.param(
        entry("low"),
        replace(HIGH_RESIZED, terminating=True),
        NODE,
        SCENE,
        {},
        ("release", "pod-gone"),
        id="pod-terminating",
    ),
    pytest.param(
        entry("low"),
        replace(HIGH_RESIZED, phase="Failed"),
        NODE,
        SCENE,
        {},
        ("release", "pod-gone"),
        id="pod-terminal",
    ),
    # -- 3. persistence -------------------------------------------------------------------
    pytest.param(
        entry("low"),
        HIGH_BEFORE,
        NODE,
        (HIGH_BEFORE, LOW, MID),
        {},
        ("wait", "not-persisted-yet", (), False),
        id="not-persisted-yet-waits",
    ),
    pytest.param(
        entry("low"),
        HIGH_BEFORE,
        NODE,
        (HIGH_BEFORE, LOW, MID),
        {"now": ADMITTED + 10.0},
        ("release", "not-persisted"),
        id="never-persisted-is-released-without-eviction",
    ),
    pytest.param(
        entry("low", persisted=True),
        HIGH_BEFORE,
        NODE,
        (HIGH_BEFORE, LOW, MID),
        {},
        ("release", "superseded"),
        id="spec-changed-after-persisting",
    ),
    # -- 4. actuated or refused by the kubelet ----------------------------------------------
    pytest.param(
        entry("low", persisted=True),
        pod("high", cpu="6", priority=1000),
        NODE,
        (LOW, MID),
        {},
        ("release", "actuated"),
        id="actuated",
    ),
    pytest.param(
        entry(handled=("low",), persisted=True),
        pod("high", cpu="6", allocated="8", priority=1000),
        NODE,
        (MID,),
        {},
        ("release", "actuated"),
        id="allocated-above-desired-counts-as-actuated",
    ),
    pytest.param(
        entry("low"),
        pod("high", cpu="6", allocated="2", priority=1000, resize="Infeasible"),
        NODE,
        SCENE,
        {},
        ("release", "infeasible-resize"),
        id="kubelet-says-infeasible",
    ),
    # -- 5. re-plan on fresh state ------------------------------------------------------------
    pytest.param(
        entry("low"),
        HIGH_RESIZED,
        NODE,
        SCENE,
        {},
        ("act", ("low",), (), (), True),
        id="persisted-evicts-the-planned-victim",
    ),
    pytest.param(
        entry("low", persisted=True),
        HIGH_RESIZED,
        NODE,
        SCENE,
        {},
        ("act", ("low",), (), (), False),
        id="persisted-flag-written-once",
    ),
    pytest.param(
        entry("low", persisted=True),
        HIGH_RESIZED,
        replace(NODE, allocatable=Resources(12000, 16 * GI)),
        SCENE,
        {},
        ("act", (), (), ("low",), False),
        id="room-appeared-evicts-nobody-and-unclaims",
    ),
    pytest.param(
        entry("low-a", "low-b", persisted=True),
        HIGH_RESIZED,
        NODE,
        (HIGH_RESIZED, LOW_A, LOW_B, MID),
        {},
        ("act", ("low-a", "low-b"), (), (), False),
        id="both-victims-still-needed-in-entry-order",
    ),
    pytest.param(
        entry("low-a", "low-b", persisted=True),
        HIGH_RESIZED,
        NODE,
        (HIGH_RESIZED, LOW_A, LOW_B),
        {},
        ("act", ("low-b",), (), ("low-a",), False),
        id="fewer-victims-when-room-appeared",
    ),
    pytest.param(
        entry("low", persisted=True),
        HIGH_RESIZED,
        NODE,
        (HIGH_RESIZED, MID),
        {},
        ("act", (), ("low",), (), False),
        id="victim-gone-is-settled-not-evicted",
    ),
    pytest.param(
        entry("low", persisted=True),
        HIGH_RESIZED,
        NODE,
        (HIGH_RESIZED, replace(LOW, terminating=True), MID),
        {},
        ("act", (), ("low",), (), False),
        id="victim-terminating-is-settled-not-evicted",
    ),
    pytest.param(
        entry("low", persisted=True),
        HIGH_RESIZED,
        NODE,
        (HIGH_RESIZED, pod("low", cpu="4", uid="uid-low-2"), MID),
        {},
        ("wait", "cannot-fit", ("low",), False),
        id="new-pod-with-victims-name-is-never-evicted",
    ),
    pytest.param(
        entry("low-a", "low-b", handled=("low-a",), persisted=True),
        HIGH_RESIZED,
        NODE,
        (HIGH_RESIZED, LOW_A, LOW_B, MID),
        {},
        ("act", ("low-b",), (), (), False),
        id="handled-victim-not-evicted-again-even-if-cache-lags",
    ),
    pytest.param(
        # Asking for 5 CPUs: either 3-CPU pod would do. A fresh unrestricted plan would
        # take "late" (lower priority, appeared after admission); only "low" was named.
        entry("low", persisted=True, desired_cpu=5000),
        HIGH_5,
        NODE,
        (HIGH_5, pod("low", cpu="3", priority=100), pod("late", cpu="3")),
        {},
        ("act", ("low",), (), (), False),
        id="never-a-victim-the-admitted-plan-did-not-name",
    ),
    pytest.param(
        entry("low", persisted=True),
        HIGH_RESIZED,
        NODE,
        SCENE,
        {"budgets": (DisruptionBudget("default", "low-pdb", LabelSelector((("app", "low"),)), 0),)},
        ("wait", "cannot-fit", (), False),
        id="pdb-now-forbids-it-waits",
    ),
    pytest.param(
        entry("low", persisted=True),
        HIGH_RESIZED,
        NODE,
        SCENE,
        {"others": (entry(pod_name="other", review="review-2", desired_cpu=2000),)},
        ("wait", "cannot-fit", (), False),
        id="another-reservation-took-the-room-waits",
    ),
    pytest.param(
        entry("low", persisted=True),
        HIGH_RESIZED,
        NODE,
        SCENE,
        {
            "others": (
                entry(pod_name="other", review="review-2", expires_at=NOW - 1, desired_cpu=2000),
            )
        },
        ("act", ("low",), (), (), False),
        id="expired-reservations-of-others-do-not-count",
    ),
    pytest.param(
        entry("low", persisted=True),
        HIGH_RESIZED,
        replace(NODE, resize_preemption_disabled=True),
        SCENE,
        {},
        ("release", "not-eligible"),
        id="node-opted-out-after-admission",
    ),
    pytest.param(
        entry("low"),
        HIGH_RESIZED,
        None,
        SCENE,
        {},
        ("wait", "node-unknown", (), True),
        id="node-not-cached",
    ),
]


@pytest.mark.parametrize(("the_entry", "the_pod", "node", "pods", "extra", "expected"), CASES)
def test_next_action(
    the_entry: LedgerEntry,
    the_pod: Pod | None,
    node: Node | None,
    pods: tuple[Pod, ...],
    extra: dict[str, Any],
    expected: tuple[Any, ...],
) -> None:
    action = next_action(
        the_entry,
        the_pod,
        node,
        pods,
        now=extra.get("now", NOW),
        config=CONFIG,
        budgets=extra.get("budgets", ()),
        others=extra.get("others", ()),
    )
    assert summary(action) == expected


def test_next_action_is_pure() -> None:
    args = (entry("low"), HIGH_RESIZED, NODE, SCENE)
    first = next_action(*args, now=NOW, config=CONFIG)
    assert next_action(*args, now=NOW, config=CONFIG) == first


def test_wait_for_persistence_says_when_to_look_again() -> None:
    action = next_action(entry("low"), HIGH_BEFORE, NODE, SCENE, now=NOW, config=CONFIG)
    assert isinstance(action, Wait)
    assert action.recheck_at == ADMITTED + CONFIG.persist_timeout


def test_act_carries_the_fresh_plan() -> None:
    action = next_action(entry("low"), HIGH_RESIZED, NODE, SCENE, now=NOW, config=CONFIG)
    assert isinstance(action, Act)
    assert action.plan.verdict == "preempt"
    assert [v.pod.key for v in action.plan.victims] == ["default/low"]
    assert action.bookkeeping  # the persisted flag


def test_own_reservation_is_not_counted_against_itself() -> None:
    # The entry reserves 6 CPUs for "high"; if it counted against itself nothing would fit.
    own = entry("low", persisted=True)
    action = next_action(own, HIGH_RESIZED, NODE, SCENE, now=NOW, config=CONFIG, others=(own,))
    assert summary(action) == ("act", ("low",), (), (), False)


@pytest.mark.parametrize(
    ("the_pod", "persisted", "actuated"),
    [
        pytest.param(HIGH_BEFORE, False, False, id="old-spec"),
        pytest.param(HIGH_RESIZED, True, False, id="persisted-not-allocated"),
        pytest.param(pod("high", cpu="6", priority=1000), True, True, id="allocated"),
    ],
)
def test_persisted_and_actuated(the_pod: Pod, persisted: bool, actuated: bool) -> None:
    assert is_persisted(entry("low"), the_pod) is persisted
    assert is_actuated(entry("low"), the_pod) is actuated
