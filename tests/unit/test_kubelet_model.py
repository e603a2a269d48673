"""The node emulator's kubelet model against the v1.37.2 kubelet's rules."""

from __future__ import annotations

from typing import Any

import pytest

from harness import kubelet_model as km
from harness import quantity
from harness.kubelet_model import Decision, Outcome, Resources

GI = 2**30
MI = 2**20


def container(
    name: str,
    cpu: str | None = None,
    memory: str | None = None,
    *,
    limits: bool = True,
    sidecar: bool = False,
) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    c: dict[str, Any] = {"name": name, "image": "pause"}
    if requests:
        c["resources"] = {"requests": requests, **({"limits": dict(requests)} if limits else {})}
    if sidecar:
        c["restartPolicy"] = "Always"
    return c


def make_pod(
    *containers: dict[str, Any],
    init: list[dict[str, Any]] | None = None,
    uid: str = "uid-1",
    priority: int | None = None,
    qos: str = "Guaranteed",
    generation: int = 1,
    overhead: dict[str, str] | None = None,
    pod_level: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers), "nodeName": "node-1"}
    if init:
        spec["initContainers"] = init
    if priority is not None:
        spec["priority"] = priority
    if overhead:
        spec["overhead"] = overhead
    if pod_level:
        spec["resources"] = pod_level
    return {
        "metadata": {"name": uid, "uid": uid, "generation": generation},
        "spec": spec,
        "status": {"qosClass": qos, **(status or {})},
    }


def node(cpu: str = "8", memory: str = "16Gi", pods: int = 110, **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "node-1", **extra.get("metadata", {})},
        "spec": extra.get("spec", {}),
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": str(pods)}},
    }


def admitted(pod: dict[str, Any]) -> tuple[dict[str, Any], km.PodAllocation]:
    return pod, km.allocation_from_spec(pod)


def resized(pod: dict[str, Any], name: str, cpu: str) -> dict[str, Any]:
    """The pod after a resize request of one container's cpu (requests = limits)."""
    out = {**pod, "metadata": {**pod["metadata"], "generation": pod["metadata"]["generation"] + 1}}
    out["spec"] = {
        **pod["spec"],
        "containers": [
            {
                **c,
                "resources": {
                    "requests": {**c["resources"]["requests"], "cpu": cpu},
                    "limits": {**c["resources"]["limits"], "cpu": cpu},
                },
            }
            if c["name"] == name
            else c
            for c in pod["spec"]["containers"]
        ],
    }
    return out


# --- quantities ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "millis", "value"),
    [
        pytest.param("500m", 500, 1, id="milli-rounds-up-to-one"),
        pytest.param("2", 2000, 2, id="plain"),
        pytest.param("0.5", 500, 1, id="decimal"),
        pytest.param("1Gi", GI * 1000, GI, id="binary"),
        pytest.param("4500Mi", 4500 * MI * 1000, 4500 * MI, id="mebibytes"),
        pytest.param("1e3", 1_000_000, 1000, id="exponent"),
        pytest.param("100k", 100_000_000, 100_000, id="kilo"),
        pytest.param("1n", 1, 1, id="nano-rounds-up"),
    ],
)
def test_quantities_round_up_like_resource_quantity(text: str, millis: int, value: int) -> None:
    assert quantity.milli_value(text) == millis
    assert quantity.value(text) == value


@pytest.mark.parametrize("text", ["", "1.2.3", "Gi", "5 Gi", "1KiB"])
def test_malformed_quantities_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match="not a resource quantity"):
        quantity.parse(text)


@pytest.mark.parametrize(
    ("millis", "text"),
    [pytest.param(6000, "6", id="whole"), pytest.param(4500, "4500m", id="milli")],
)
def test_cpu_is_formatted_canonically(millis: int, text: str) -> None:
    assert quantity.format_cpu(millis) == text


# --- effective pod requests (component-helpers PodRequests) ----------------------------------


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(
            make_pod(container("a", "1", "1Gi"), container("b", "500m", "256Mi")),
            Resources(1500, GI + 256 * MI),
            id="sum-of-app-containers",
        ),
        pytest.param(
            make_pod(container("a", "1", "1Gi"), init=[container("i", "3", "100Mi")]),
            Resources(3000, GI),
            id="init-container-peak-per-resource",
        ),
        pytest.param(
            make_pod(
                container("a", "2", "1Gi"),
                init=[container("s", "500m", "100Mi", sidecar=True), container("i", "2", "100Mi")],
            ),
            Resources(2500, GI + 100 * MI),
            id="sidecar-adds-to-app-and-later-inits",
        ),
        pytest.param(
            make_pod(
                container("a", "1", "1Gi"),
                init=[container("s", "1", "100Mi", sidecar=True), container("i", "3", "100Mi")],
            ),
            Resources(4000, GI + 100 * MI),
            id="init-after-sidecar-counts-both",
        ),
        pytest.param(
            make_pod(container("a", "1", "1Gi"), overhead={"cpu": "250m", "memory": "120Mi"}),
            Resources(1250, GI + 120 * MI),
            id="overhead-added",
        ),
        pytest.param(
            make_pod(
                container("a", "1", "1Gi"),
                container("b", "1", "1Gi"),
                pod_level={"requests": {"cpu": "3"}, "limits": {"cpu": "3"}},
            ),
            Resources(3000, 2 * GI),
            id="pod-level-cpu-replaces-aggregate",
        ),
        pytest.param(make_pod(container("a")), Resources(0, 0), id="best-effort"),
    ],
)
def test_pod_requests_follow_component_helpers(pod: dict[str, Any], expected: Resources) -> None:
    assert km.pod_requests(pod) == expected


def _with_status(
    pod: dict[str, Any], allocated: str, actual: str, reason: str | None = None
) -> dict[str, Any]:
    status = {
        "containerStatuses": [
            {
                "name": "a",
                "allocatedResources": {"cpu": allocated, "memory": "1Gi"},
                "resources": {"requests": {"cpu": actual, "memory": "1Gi"}},
            }
        ],
    }
    if reason:
        status["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": reason}]
    return {**pod, "status": {**pod["status"], **status}}


@pytest.mark.parametrize(
    ("spec_cpu", "allocated", "actual", "reason", "expected_cpu"),
    [
        pytest.param("6", "4", "4", "Deferred", 6000, id="deferred-desired-counts"),
        pytest.param("6", "4", "4", "Infeasible", 4000, id="infeasible-desired-ignored"),
        pytest.param("2", "4", "3", None, 4000, id="allocated-above-spec"),
        pytest.param("2", "2", "5", None, 5000, id="actual-above-both"),
    ],
)
def test_pod_requests_with_status_take_the_max(
    spec_cpu: str, allocated: str, actual: str, reason: str | None, expected_cpu: int
) -> None:
    pod = _with_status(make_pod(container("a", spec_cpu, "1Gi")), allocated, actual, reason)
    assert km.pod_requests(pod, use_status=True).cpu == expected_cpu


def test_pod_limits_add_overhead_only_to_limited_resources() -> None:
    pod = make_pod(
        container("a", "1", "1Gi"),
        container("b", "1", "1Gi", limits=False),
        overhead={"cpu": "100m", "memory": "10Mi"},
    )
    assert km.pod_limits(pod) == {"cpu": "1100m", "memory": "1034Mi"}


# --- the fit check ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_", "others", "allowed", "expected"),
    [
        pytest.param(
            Resources(4000, GI),
            [Resources(4000, GI)],
            110,
            Decision(Outcome.ACTUATE),
            id="exactly-full-fits",
        ),
        pytest.param(
            Resources(6000, GI),
            [Resources(3000, GI)],
            110,
            Decision(
                Outcome.DEFERRED,
                "OutOfcpu",
                "Node didn't have enough resource: cpu, requested: 6000, used: 3000, "
                "capacity: 8000",
            ),
            id="cpu",
        ),
        pytest.param(
            Resources(1000, 10 * GI),
            [Resources(1000, 8 * GI)],
            110,
            Decision(
                Outcome.DEFERRED,
                "OutOfmemory",
                f"Node didn't have enough resource: memory, requested: {10 * GI}, "
                f"used: {8 * GI}, capacity: {16 * GI}",
            ),
            id="memory",
        ),
        pytest.param(
            Resources(9000, 17 * GI),
            [],
            110,
            Decision(
                Outcome.DEFERRED,
                "OutOfcpu",
                "Node didn't have enough resource: cpu, requested: 9000, used: 0, capacity: 8000",
            ),
            id="cpu-reported-before-memory",
        ),
        pytest.param(
            Resources(9000, GI),
            [Resources(), Resources()],
            2,
            Decision(
                Outcome.DEFERRED,
                "OutOfpods",
                "Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2",
            ),
            id="pods-reported-first",
        ),
        pytest.param(
            Resources(),
            [Resources(8000, 16 * GI)],
            110,
            Decision(Outcome.ACTUATE),
            id="zero-request-always-fits",
        ),
    ],
)
def test_check_fit_reports_the_first_failure_like_the_kubelet(
    request_: Resources, others: list[Resources], allowed: int, expected: Decision
) -> None:
    assert km.check_fit(request_, others, Resources(8000, 16 * GI), allowed) == expected


# --- resize decisions -----------------------------------------------------------------------


def test_no_resize_when_desired_equals_allocated() -> None:
    pod = make_pod(container("a", "4", "1Gi"))
    assert km.decide_resize(pod, km.allocation_from_spec(pod), [], node()).outcome is Outcome.NONE


def test_a_resize_that_fits_is_actuated() -> None:
    pod = make_pod(container("a", "4", "1Gi"))
    other = make_pod(container("b", "3", "1Gi"), uid="uid-2")
    decision = km.decide_resize(
        resized(pod, "a", "5"), km.allocation_from_spec(pod), [admitted(other)], node()
    )
    assert decision == Decision(Outcome.ACTUATE)


def _allocation(cpu: str) -> km.PodAllocation:
    resources = {"cpu": cpu, "memory": "1Gi"}
    return km.PodAllocation({"a": km.ContainerAllocation(resources, resources)})


@pytest.mark.parametrize(
    ("other", "allocation", "used"),
    [
        pytest.param(
            make_pod(container("a", "3", "1Gi"), uid="o"), _allocation("3"), 3000, id="allocated"
        ),
        pytest.param(
            _with_status(make_pod(container("a", "5", "1Gi"), uid="o"), "1", "2", "Deferred"),
            _allocation("1"),
            2000,
            id="other-pod-at-max-allocated-actual-not-desired",
        ),
    ],
)
def test_a_resize_that_does_not_fit_is_deferred_with_the_kubelets_message(
    other: dict[str, Any], allocation: km.PodAllocation, used: int
) -> None:
    pod = make_pod(container("a", "4", "1Gi"))
    decision = km.decide_resize(
        resized(pod, "a", "7"), km.allocation_from_spec(pod), [(other, allocation)], node()
    )
    assert decision == Decision(
        Outcome.DEFERRED,
        "OutOfcpu",
        f"Node didn't have enough resource: cpu, requested: 7000, used: {used}, capacity: 8000",
    )
    assert decision.condition_reason == "Deferred"


def test_terminal_pods_do_not_count() -> None:
    pod = make_pod(container("a", "4", "1Gi"))
    done = make_pod(container("a", "6", "1Gi"), uid="o", status={"phase": "Succeeded"})
    decision = km.decide_resize(
        resized(pod, "a", "7"), km.allocation_from_spec(pod), [admitted(done)], node()
    )
    assert decision.outcome is Outcome.ACTUATE


@pytest.mark.parametrize(
    ("legacy", "expected"),
    [
        pytest.param(
            False,
            Decision(
                Outcome.DEFERRED,
                "OutOfcpu",
                "Node didn't have enough resource: cpu, requested: 9000, used: 0, capacity: 8000",
            ),
            id="v1.37-defers",
        ),
        pytest.param(
            True,
            Decision(
                Outcome.INFEASIBLE,
                "Infeasible",
                "Node didn't have enough capacity: cpu, requested: 9000, capacity: 8000",
            ),
            id="legacy-infeasible",
        ),
    ],
)
def test_a_resize_beyond_allocatable(legacy: bool, expected: Decision) -> None:
    pod = make_pod(container("a", "4", "1Gi"))
    decision = km.decide_resize(
        resized(pod, "a", "9"),
        km.allocation_from_spec(pod),
        [],
        node(),
        legacy_infeasible_check=legacy,
    )
    assert decision == expected


def test_legacy_infeasible_reports_memory_first() -> None:
    verdict = km.legacy_infeasible(Resources(9000, 20 * GI), Resources(8000, 16 * GI))
    assert verdict is not None
    assert verdict.message == (
        f"Node didn't have enough capacity: memory, requested: {20 * GI}, capacity: {16 * GI}"
    )


def test_admission_rejects_a_pod_that_does_not_fit() -> None:
    other = make_pod(container("b", "6", "1Gi"), uid="o")
    decision = km.decide_admission(make_pod(container("a", "3", "1Gi")), [admitted(other)], node())
    assert decision.outcome is Outcome.DEFERRED
    assert decision.reason == "OutOfcpu"


def test_in_use_replaces_desired_with_the_allocation() -> None:
    pod = make_pod(container("a", "4", "1Gi"))
    allocation = km.allocation_from_spec(pod)
    assert km.in_use(resized(pod, "a", "7"), allocation) == Resources(4000, GI)


def test_allocation_survives_a_round_trip_through_status() -> None:
    pod = _with_status(make_pod(container("a", "6", "1Gi")), "4", "4")
    pod["status"]["containerStatuses"][0]["resources"]["limits"] = {"cpu": "4", "memory": "1Gi"}
    allocation = km.allocation_from_status(pod)
    assert allocation is not None
    assert allocation.containers["a"] == km.ContainerAllocation(
        {"cpu": "4", "memory": "1Gi"}, {"cpu": "4", "memory": "1Gi"}
    )
    assert km.resize_requested(pod, allocation)


# --- retry order ------------------------------------------------------------------------------


def _pending(
    uid: str,
    *,
    grow: bool = True,
    priority: int = 0,
    qos: str = "Guaranteed",
    since: float | None = 1.0,
) -> tuple[dict[str, Any], km.PodAllocation, float | None]:
    pod = make_pod(container("a", "2", "1Gi"), uid=uid, priority=priority, qos=qos)
    return resized(pod, "a", "3" if grow else "1"), km.allocation_from_spec(pod), since


@pytest.mark.parametrize(
    ("entries", "order"),
    [
        pytest.param(
            [_pending("grow", priority=100), _pending("shrink", grow=False)],
            ["shrink", "grow"],
            id="non-increasing-first",
        ),
        pytest.param(
            [_pending("low", priority=1), _pending("high", priority=1000)],
            ["high", "low"],
            id="higher-priority-first",
        ),
        pytest.param(
            [_pending("burstable", qos="Burstable"), _pending("guaranteed")],
            ["guaranteed", "burstable"],
            id="guaranteed-first",
        ),
        pytest.param(
            [_pending("new", since=5.0), _pending("old", since=2.0)],
            ["old", "new"],
            id="longest-pending-first",
        ),
        pytest.param(
            [_pending("unknown", since=None), _pending("known", since=9.0)],
            ["known", "unknown"],
            id="no-pending-condition-last",
        ),
        pytest.param(
            [
                _pending("p0-new", since=3.0),
                _pending("g-shrink", grow=False, priority=-5),
                _pending("p9", priority=9, qos="Burstable", since=4.0),
            ],
            ["g-shrink", "p9", "p0-new"],
            id="criteria-in-order",
        ),
    ],
)
def test_pending_resizes_are_retried_in_the_kubelets_order(
    entries: list[tuple[dict[str, Any], km.PodAllocation, float | None]], order: list[str]
) -> None:
    ranked = sorted(entries, key=lambda e: km.retry_order_key(*e))
    assert [p["metadata"]["uid"] for p, _, _ in ranked] == order


# --- node opt-out -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "owners"),
    [
        pytest.param({}, (), id="none"),
        pytest.param(
            {"spec": {"podPreemptionPolicy": {"disableResizePreemption": ["a.io/x"]}}},
            ("a.io/x",),
            id="field",
        ),
        pytest.param(
            {"spec": {"podPreemptionPolicy": {"disableResizePreemption": []}}}, (), id="empty-field"
        ),
        pytest.param(
            {"metadata": {"annotations": {"resize-preemption.k8s.io/disabled": "true"}}},
            ("resize-preemption.k8s.io/disabled",),
            id="annotation",
        ),
        pytest.param(
            {"metadata": {"annotations": {"resize-preemption.k8s.io/disabled": "false"}}},
            (),
            id="annotation-false",
        ),
    ],
)
def test_resize_preemption_opt_out(extra: dict[str, Any], owners: tuple[str, ...]) -> None:
    assert km.resize_preemption_opt_outs(node(**extra)) == owners


# --- event messages ----------------------------------------------------------------------------


def test_deferred_event_message_matches_the_kubelets_json() -> None:
    # The expectation is upstream's (pkg/kubelet/allocation/allocation_manager_test.go).
    pod = make_pod(
        {"name": "c1", "resources": {"requests": {"cpu": "5", "memory": "4500Mi"}}}, generation=2
    )
    decision = Decision(
        Outcome.DEFERRED,
        "OutOfcpu",
        "Node didn't have enough resource: cpu, requested: 5000, used: 0, capacity: 4000",
    )
    assert km.pending_event(decision, pod) == (
        "ResizeDeferred",
        'Pod resize OutOfcpu: {"containers":[{"name":"c1","resources":{"requests":{"cpu":"5",'
        '"memory":"4500Mi"}}}],"generation":2,"error":"Node didn\'t have enough resource: cpu, '
        'requested: 5000, used: 0, capacity: 4000"}',
    )


def test_started_event_lists_init_containers_and_sorted_keys() -> None:
    pod = make_pod(
        container("app", "2", "1Gi"),
        init=[container("side", "1", None, limits=False, sidecar=True)],
    )
    assert km.resize_event_message("Pod resize started", pod) == (
        'Pod resize started: {"initContainers":[{"name":"side","resources":'
        '{"requests":{"cpu":"1"}}}],'
        '"containers":[{"name":"app","resources":{"limits":{"cpu":"2","memory":"1Gi"},'
        '"requests":{"cpu":"2","memory":"1Gi"}}}],"generation":1}'
    )
