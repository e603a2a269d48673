"""The Vertical Pod Autoscaler as the producer of resizes: VPA v1.8.1's own updater
resizes a Deployment's pod in place (``InPlace`` and ``InPlaceOrRecreate`` modes) on a
node full of lower-priority pods, against the real API server and the (hollow) v1.37.2
kubelet, with and without the webhook registered.

There is no recommender: each test writes the VPA object's ``status.recommendation``
itself (:func:`harness.vpa.write_recommendation`). The updater runs once for the module,
every 2 s, as user ``vpa-updater`` (so the audit log shows who resized).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from harness.vpa import (
    API,
    USER,
    VpaUpdater,
    deployment_manifest,
    ensure_vpa,
    remove_workloads,
    vpa_manifest,
    write_recommendation,
)
from harness.webhook_process import CONFIGURATION_NAME, CONFIGURATION_PATH
from tests.e2e.conftest import NODE, Cluster, Kubectl, StartService, Waiter
from tests.e2e.service_support import (
    actual_cpu,
    as_warning,
    decision_lines,
    entries_of,
    events,
    ledger_entries,
    pod_manifest,
    read_pod,
    resize_pending,
    run_pods,
    spec_cpu,
    terminating,
    webhook_audit,
)
from webhook.core.model import FLOOR_ANNOTATION

pytestmark = pytest.mark.e2e

WEB = "web"
MEMORY = "256Mi"


@pytest.fixture(scope="module")
def updater(cluster: Cluster) -> Iterator[VpaUpdater]:
    with VpaUpdater(cluster.control_plane, ensure_vpa()) as process:
        yield process
        process.check_alive()


@pytest.fixture
def workloads(cluster: Cluster, namespace: str, updater: VpaUpdater) -> Iterator[str]:
    """The test's namespace; its VPA objects, Deployments and ReplicaSets are removed
    before the namespace fixture removes the pods (else the ReplicaSet would recreate
    them)."""
    yield namespace
    remove_workloads(cluster.client, namespace)


# -- the scene -------------------------------------------------------------------------------


def start_web(cluster: Cluster, kubectl: Kubectl, namespace: str, priority_class: str) -> Any:
    """The Deployment ``web``: one pod at 2 CPU, running; returns the pod."""
    cluster.client.create(
        f"/apis/apps/v1/namespaces/{namespace}/deployments",
        deployment_manifest(WEB, "2", priority_class, memory=MEMORY),
    )
    kubectl("wait", "--for=condition=Available", f"deployment/{WEB}", "--timeout=30s")
    [pod] = web_pods(cluster, namespace)
    return pod


def web_pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.client.get(
        f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"app={WEB}"
    )["items"]
    return items


def autoscale(cluster: Cluster, namespace: str, mode: str, cpu: str) -> None:
    """A VPA for ``web`` in ``mode``, then a recommendation of ``cpu`` (memory unchanged)."""
    cluster.client.create(
        f"{API}/namespaces/{namespace}/verticalpodautoscalers", vpa_manifest(WEB, WEB, mode)
    )
    write_recommendation(cluster.client, namespace, WEB, {"app": {"cpu": cpu, "memory": MEMORY}})


def full_node(
    cluster: Cluster,
    kubectl: Kubectl,
    namespace: str,
    classes: dict[str, str],
    *,
    low_a: dict[str, str] | None = None,
) -> Any:
    """node-1 (8 CPU) full: ``web`` 2 CPU (high), ``low-a`` and ``low-b`` 3 CPU each (low).
    Growing ``web`` to 4 CPU needs one of them gone, or 2 CPU lent."""
    web = start_web(cluster, kubectl, namespace, classes["high"])
    run_pods(
        kubectl,
        [
            pod_manifest("low-a", "3", classes["low"], annotations=low_a),
            pod_manifest("low-b", "3", classes["low"]),
        ],
    )
    return web


def restarts(pod: dict[str, Any] | None) -> int:
    statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount", 0)) for s in statuses)


def same_pod_at(cluster: Cluster, namespace: str, uid: str, cpu: str) -> Callable[[], Any]:
    """A wait condition: the one ``web`` pod is still ``uid`` and runs at ``cpu``."""

    def check() -> Any:
        pods = web_pods(cluster, namespace)
        if len(pods) == 1 and pods[0]["metadata"]["uid"] == uid and actual_cpu(pods[0]) == cpu:
            return pods[0]
        return None

    return check


def resizes_by(cluster: Cluster, namespace: str, name: str) -> list[tuple[str, dict[str, str]]]:
    """(user, webhook audit annotations) of each completed resize of ``namespace/name``."""
    found = []
    for line in (cluster.control_plane.log_dir / "audit.log").read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if (
            ref.get("subresource") == "resize"
            and (ref.get("namespace"), ref.get("name")) == (namespace, name)
            and event.get("stage") == "ResponseComplete"
            and event.get("verb") == "patch"
        ):
            found.append((event["user"]["username"], webhook_audit(event.get("annotations") or {})))
    return found


def repeats_taking_room(resizes: list[tuple[str, dict[str, str]]]) -> list[dict[str, str]]:
    """Audits of resizes after the first that planned victims or loans: InPlace sends the
    same resize again on each loop while it is pending, and a repeat must take nothing."""
    taking = ("preempt", "lend")
    return [a for _, a in resizes[1:] if a.get("victims") or a.get("reason") in taking]


def gone_or_terminating(cluster: Cluster, namespace: str, name: str) -> bool:
    pod = read_pod(cluster, namespace, name)
    return pod is None or terminating(pod)


MODES = [pytest.param("InPlace", id="InPlace"), pytest.param("InPlaceOrRecreate", id="OrRecreate")]


# -- with the webhook ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_vpa_resize_preempts_one_lower_priority_pod_and_is_actuated_without_a_restart(
    mode: str,
    cluster: Cluster,
    workloads: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    updater: VpaUpdater,
    wait_until: Waiter,
) -> None:
    namespace = workloads
    start_service()
    web = full_node(cluster, kubectl, namespace, priority_classes)
    uid = web["metadata"]["uid"]

    autoscale(cluster, namespace, mode, "4")

    actuated = wait_until(
        same_pod_at(cluster, namespace, uid, "4"), timeout=40, what="VPA's resize actuated"
    )
    assert (0, "4") == (restarts(actuated), spec_cpu(actuated))
    name = actuated["metadata"]["name"]
    resizes = resizes_by(cluster, namespace, name)
    assert {USER} == {user for user, _ in resizes}
    audit = resizes[0][1]
    assert "preempt" == audit.get("verdict")
    [victim] = audit["victims"].split(",")
    assert [] == repeats_taking_room(resizes)
    victim_name = victim.removeprefix(f"{namespace}/")
    kept = ({"low-a", "low-b"} - {victim_name}).pop()
    wait_until(
        lambda: gone_or_terminating(cluster, namespace, victim_name), what="the victim leaving"
    )
    kept_pod = read_pod(cluster, namespace, kept)
    assert kept_pod is not None and not terminating(kept_pod)
    assert [f"Preempted by pod {uid} on node {NODE}"] == [
        e["message"] for e in events(kubectl, victim_name, "Preempted")
    ]
    # VPA's event recorder posts asynchronously.
    resized = wait_until(
        lambda: events(kubectl, name, "InPlaceResizedByVPA"), what="VPA's InPlaceResizedByVPA"
    )
    assert 1 == len(resized)
    # The updater is a client like kubectl: our warning reaches it, and it logs it.
    warning = as_warning(
        f"preempting 1 lower-priority pod on {NODE} for cpu 4: {namespace}/{victim_name}"
    )
    assert warning in updater.log_path.read_text()


def test_vpa_resize_borrows_from_a_pod_with_a_floor_and_nobody_is_evicted(
    cluster: Cluster,
    workloads: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    updater: VpaUpdater,
    wait_until: Waiter,
) -> None:
    namespace = workloads
    start_service()
    floor = {FLOOR_ANNOTATION: json.dumps({"app": {"cpu": "1"}})}
    web = full_node(cluster, kubectl, namespace, priority_classes, low_a=floor)
    uid = web["metadata"]["uid"]
    lender_uid = read_pod(cluster, namespace, "low-a")["metadata"]["uid"]  # type: ignore[index]

    autoscale(cluster, namespace, "InPlace", "4")

    actuated = wait_until(
        same_pod_at(cluster, namespace, uid, "4"), timeout=40, what="VPA's resize actuated"
    )
    assert 0 == restarts(actuated)
    lender = wait_until(
        lambda: (p := read_pod(cluster, namespace, "low-a")) and actual_cpu(p) == "1" and p,
        timeout=30,
        what="the loan actuated",
    )
    assert (lender_uid, 0, False) == (
        lender["metadata"]["uid"],
        restarts(lender),
        terminating(lender),
    )
    resizes = resizes_by(cluster, namespace, actuated["metadata"]["name"])
    assert {USER} == {user for user, _ in resizes}
    assert [] == repeats_taking_room(resizes)
    audit = resizes[0][1]
    assert ("preempt", "lend", "") == (
        audit.get("verdict"),
        audit.get("reason"),
        audit.get("victims", ""),
    )
    assert [f"lent cpu 2 to pod {uid} on {NODE}"] == [
        e["message"] for e in events(kubectl, "low-a", "Lent")
    ]
    warning = as_warning(
        f"borrowing cpu 2 from 1 lower-priority pod on {NODE}: {namespace}/low-a (cpu 3->1)"
    )
    assert warning in updater.log_path.read_text()
    for name in ("low-a", "low-b"):
        pod = read_pod(cluster, namespace, name)
        assert pod is not None and not terminating(pod), name
        assert [] == events(kubectl, name, "Preempted")


def test_vpa_resize_that_cannot_fit_even_after_preemption_evicts_nobody_and_says_why(
    cluster: Cluster,
    workloads: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    updater: VpaUpdater,
    wait_until: Waiter,
) -> None:
    """web 2 CPU and steady 4 CPU (as important), low 2 CPU: web at 5 CPU does not fit
    even without low (5 + 4 > 8)."""
    namespace = workloads
    start_service()
    web = start_web(cluster, kubectl, namespace, priority_classes["high"])
    run_pods(
        kubectl,
        [
            pod_manifest("steady", "4", priority_classes["high"]),
            pod_manifest("low", "2", priority_classes["low"]),
        ],
    )
    name = web["metadata"]["name"]

    autoscale(cluster, namespace, "InPlace", "5")

    pod = wait_until(
        lambda: (p := read_pod(cluster, namespace, name)) and resize_pending(p) and p,
        timeout=30,
        what="the kubelet to defer VPA's resize",
    )
    assert ("Deferred", "5", "2") == (resize_pending(pod), spec_cpu(pod), actual_cpu(pod))
    # InPlace sends the pending resize again on each loop: every repeat is judged again.
    seen = updater.loops()
    wait_until(lambda: updater.loops() >= seen + 2, timeout=30, what="two more updater loops")
    reason = f"cannot fit on {NODE} even after preempting every lower-priority pod: cpu short by 1"
    resizes = resizes_by(cluster, namespace, name)
    assert len(resizes) > 1
    assert ({USER}, {"infeasible"}) == (
        {user for user, _ in resizes},
        {audit.get("verdict") for _, audit in resizes},
    )
    decisions = decision_lines(service_log(cluster), namespace)
    assert {("infeasible", True, ())} == {
        (d["verdict"], d["allowed"], tuple(d.get("victims", []))) for d in decisions
    }
    assert as_warning(reason) in updater.log_path.read_text()
    assert [] == entries_of(ledger_entries(cluster), namespace)
    low = read_pod(cluster, namespace, "low")
    assert low is not None and not terminating(low)
    assert [] == events(kubectl, "low", "Preempted")


def test_in_deny_infeasible_mode_in_place_or_recreate_evicts_the_pod_at_once(
    cluster: Cluster,
    workloads: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    updater: VpaUpdater,
    wait_until: Waiter,
) -> None:
    """Why docs/vpa.md says to keep ``enforce`` with VPA: InPlaceOrRecreate takes the 403
    for an error and falls back to evicting the pod it wanted to grow, on the same loop."""
    namespace = workloads
    start_service("--mode", "deny-infeasible")
    web = start_web(cluster, kubectl, namespace, priority_classes["high"])
    run_pods(
        kubectl,
        [
            pod_manifest("steady", "4", priority_classes["high"]),
            pod_manifest("low", "2", priority_classes["low"]),
        ],
    )
    name = web["metadata"]["name"]

    autoscale(cluster, namespace, "InPlaceOrRecreate", "5")

    wait_until(
        lambda: gone_or_terminating(cluster, namespace, name),
        timeout=30,
        what="VPA to evict the pod after the denial",
    )
    [(user, audit)] = resizes_by(cluster, namespace, name)
    assert (USER, "infeasible") == (user, audit.get("verdict"))
    evictions = [
        json.loads(line)
        for line in (cluster.control_plane.log_dir / "audit.log").read_text().splitlines()
        if '"eviction"' in line
    ]
    assert [(USER, 201)] == [
        (e["user"]["username"], e["responseStatus"]["code"])
        for e in evictions
        if e.get("stage") == "ResponseComplete"
        and (e["objectRef"].get("namespace"), e["objectRef"].get("name")) == (namespace, name)
    ]
    low = read_pod(cluster, namespace, "low")
    assert low is not None and not terminating(low)


def service_log(cluster: Cluster) -> Any:
    return cluster.control_plane.state_dir / "logs" / "webhook.log"


# -- without the webhook ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_without_the_webhook_vpa_resize_stays_deferred_and_nobody_is_evicted(
    mode: str,
    cluster: Cluster,
    workloads: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    updater: VpaUpdater,
    wait_until: Waiter,
) -> None:
    namespace = workloads
    assert cluster.client.get_or_none(f"{CONFIGURATION_PATH}/{CONFIGURATION_NAME}") is None
    web = full_node(cluster, kubectl, namespace, priority_classes)
    name, uid = web["metadata"]["name"], web["metadata"]["uid"]

    autoscale(cluster, namespace, mode, "4")

    wait_until(
        lambda: resize_pending(read_pod(cluster, namespace, name)),
        timeout=30,
        what="the kubelet to defer VPA's resize",
    )
    # The updater sees the Deferred resize on its next loops and waits (InPlaceOrRecreate
    # only evicts after 5 minutes of it).
    sent = len(resizes_by(cluster, namespace, name))
    seen = updater.loops()
    wait_until(lambda: updater.loops() >= seen + 2, timeout=30, what="two more updater loops")
    pod = read_pod(cluster, namespace, name)
    assert pod is not None
    assert ("Deferred", "4", "2", uid, 0) == (
        resize_pending(pod),
        spec_cpu(pod),
        actual_cpu(pod),
        pod["metadata"]["uid"],
        restarts(pod),
    )
    resizes = resizes_by(cluster, namespace, name)
    # No webhook answered any of them. InPlace sends the same resize again on every loop
    # while it is pending; InPlaceOrRecreate sent it and waits.
    assert ({USER}, []) == ({user for user, _ in resizes}, [a for _, a in resizes if a])
    if mode == "InPlace":
        assert len(resizes) > sent
    else:
        assert sent == len(resizes)
    for low in ("low-a", "low-b"):
        other = read_pod(cluster, namespace, low)
        assert other is not None and not terminating(other), low
