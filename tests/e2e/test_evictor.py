"""The evictor against a real API server: Eviction API, upstream's delete, uid safety.

Pods on ``node-1`` are run by its kubelet (terminating pods vanish within a second or two).
Pods bound to ``ghost-node`` have no kubelet: once deleted they stay terminating for their
grace period, which lets a test look at them while they leave.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from harness.kubeapi import ApiError
from tests.e2e.conftest import NODE, Cluster, Kubectl, Waiter
from webhook.base.metrics import Metrics
from webhook.core.model import PodRef
from webhook.kube.client import make_api_client
from webhook.kube.events import NOTE_LIMIT, EventRecorder, rfc3339
from webhook.kube.evictor import (
    DISRUPTION_TARGET,
    PREEMPTION_BY_SCHEDULER,
    EvictionResult,
    Evictor,
)

pytestmark = pytest.mark.e2e

GHOST = "ghost-node"
SCHEDULER = "resize-preemption-webhook"


def pod_body(
    name: str,
    cpu: str = "1",
    *,
    node: str = NODE,
    labels: dict[str, str] | None = None,
    grace: int | None = None,
    finalizers: list[str] | None = None,
) -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": "128Mi"}
    spec: dict[str, Any] = {
        "nodeName": node,
        "containers": [
            {
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": resources, "limits": resources},
            }
        ],
    }
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    meta: dict[str, Any] = {"name": name, "labels": labels or {"app": name}}
    if finalizers:
        meta["finalizers"] = finalizers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def create_pod(cluster: Cluster, namespace: str, body: dict[str, Any]) -> PodRef:
    created = cluster.client.create(f"/api/v1/namespaces/{namespace}/pods", body)
    return PodRef(namespace, created["metadata"]["name"], created["metadata"]["uid"])


def read_pod(cluster: Cluster, ref: PodRef) -> dict[str, Any] | None:
    try:
        pod: dict[str, Any] = cluster.client.get(
            f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}"
        )
    except ApiError as e:
        if e.status == 404:
            return None
        raise
    return pod


def running(cluster: Cluster, ref: PodRef) -> bool:
    pod = read_pod(cluster, ref)
    return bool(pod and pod.get("status", {}).get("phase") == "Running")


def running_victim(
    cluster: Cluster, namespace: str, wait_until: Waiter, body: dict[str, Any]
) -> tuple[PodRef, PodRef]:
    """The victim from ``body`` (waited running) and a high-priority-pod preemptor."""
    victim = create_pod(cluster, namespace, body)
    preemptor = create_pod(cluster, namespace, pod_body("high-priority-pod"))
    wait_until(lambda: running(cluster, victim), what="the victim to run")
    return victim, preemptor


def kubectl_events(kubectl: Kubectl, name: str) -> list[dict[str, Any]]:
    """Events about pod ``name`` except the kubelet's own (Pulled, Created, Started...)."""
    out = kubectl("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json")
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return [e for e in items if (e.get("source") or {}).get("component") != "kubelet"]


def count(metrics: Metrics, result: str) -> float:
    value = metrics.registry.get_sample_value("resize_preemption_victims_total", {"result": result})
    return value or 0.0


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


@pytest.fixture
def recorder(api_client: k8s.ApiClient, metrics: Metrics) -> EventRecorder:
    return EventRecorder(api_client, controller=SCHEDULER, instance="e2e-test", metrics=metrics)


def make_evictor(
    api_client: k8s.ApiClient,
    recorder: EventRecorder | None,
    metrics: Metrics,
    **kwargs: Any,
) -> Evictor:
    kwargs.setdefault("method", "evict")
    kwargs.setdefault("scheduler_name", SCHEDULER)
    return Evictor(api_client, recorder, metrics, **kwargs)


@pytest.fixture
def release_finalizers(cluster: Cluster) -> Iterator[list[PodRef]]:
    """Pods listed here get their finalizers removed after the test."""
    held: list[PodRef] = []
    yield held
    for ref in held:
        try:
            cluster.client.patch(
                f"/api/v1/namespaces/{ref.namespace}/pods/{ref.name}",
                {"metadata": {"finalizers": None}},
            )
        except ApiError as e:
            if e.status != 404:
                raise


def test_evict_removes_the_victim_and_records_a_preempted_event(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    api_client: k8s.ApiClient,
    recorder: EventRecorder,
    metrics: Metrics,
    wait_until: Waiter,
) -> None:
    victim, preemptor = running_victim(cluster, namespace, wait_until, pod_body("low-priority-pod"))

    result = make_evictor(api_client, recorder, metrics).evict(victim, preemptor, NODE)

    assert result is EvictionResult.EVICTED
    wait_until(lambda: read_pod(cluster, victim) is None, what="the victim to be removed")
    assert read_pod(cluster, preemptor) is not None
    [event] = wait_until(
        lambda: [e for e in kubectl_events(kubectl, victim.name) if e["reason"] == "Preempted"],
        what="the Preempted event",
    )
    assert event["type"] == "Normal"
    assert event["action"] == "Preempting"
    assert event["message"] == f"Preempted by pod {preemptor.uid} on node {NODE}"
    assert event["involvedObject"]["kind"] == "Pod"
    assert event["involvedObject"]["uid"] == victim.uid
    assert event["related"]["name"] == preemptor.name
    assert event["reportingComponent"] == SCHEDULER
    assert event["reportingInstance"] == "e2e-test"
    assert event["eventTime"].endswith("Z") and "." in event["eventTime"]
    assert count(metrics, "evicted") == 1
    assert recorder.failures == 0


def test_a_victim_the_caller_saw_live_is_evicted_on_the_uid_precondition_alone(
    cluster: Cluster,
    namespace: str,
    api_client: k8s.ApiClient,
    recorder: EventRecorder,
    metrics: Metrics,
    wait_until: Waiter,
) -> None:
    victim, preemptor = running_victim(cluster, namespace, wait_until, pod_body("low-priority-pod"))

    result = make_evictor(api_client, recorder, metrics).evict(
        victim, preemptor, NODE, seen_live=True
    )

    assert EvictionResult.EVICTED is result
    wait_until(lambda: read_pod(cluster, victim) is None, what="the victim to be removed")
    assert 1 == count(metrics, "evicted")


def test_a_plan_given_up_on_gets_one_warning_naming_the_victims_left(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    recorder: EventRecorder,
) -> None:
    preemptor = create_pod(cluster, namespace, pod_body("high-priority-pod"))
    victim = PodRef(namespace, "low-priority-pod", "uid-1")

    assert recorder.abandoned(preemptor, [victim], NODE, "reservation expired 0.5s ago")

    [event] = kubectl_events(kubectl, preemptor.name)
    assert ("ResizePreemptionAbandoned", "Warning") == (event["reason"], event["type"])
    assert event["message"] == (
        f"Stopped preempting on {NODE} for this resize (reservation expired 0.5s ago); "
        f"not evicted: {namespace}/low-priority-pod"
    )


def test_an_overlong_note_is_cut_to_the_api_limit(
    cluster: Cluster, namespace: str, kubectl: Kubectl, recorder: EventRecorder
) -> None:
    preemptor = create_pod(cluster, namespace, pod_body("high-priority-pod"))
    victims = [PodRef(namespace, f"victim-{i:03d}-{'x' * 40}", f"u{i}") for i in range(60)]

    assert recorder.abandoned(preemptor, victims, NODE, "replan")

    [event] = kubectl_events(kubectl, preemptor.name)
    assert len(event["message"].encode()) <= NOTE_LIMIT
    assert event["message"].startswith(f"Stopped preempting on {NODE}")
    assert event["message"].endswith(" ...")


def test_a_failed_event_is_counted_never_raised(metrics: Metrics, cluster: Cluster) -> None:
    with make_api_client(str(cluster.kubeconfig)) as api:
        bad = EventRecorder(api, controller="not a qualified name!", instance="x", metrics=metrics)
        assert not bad.preempted(PodRef("default", "p", "u"), PodRef("default", "q", "v"), NODE)
    assert bad.failures == 1
    assert (
        metrics.registry.get_sample_value("resize_preemption_errors_total", {"where": "event"}) == 1
    )


def test_a_pdb_protected_victim_is_blocked_and_kept(
    cluster: Cluster,
    namespace: str,
    api_client: k8s.ApiClient,
    recorder: EventRecorder,
    metrics: Metrics,
    wait_until: Waiter,
) -> None:
    victim, preemptor = running_victim(
        cluster, namespace, wait_until, pod_body("protected", labels={"app": "db"})
    )
    cluster.client.create(
        f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets",
        {
            "metadata": {"name": "db"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
        },
    )

    def budget_settled() -> bool:
        pdb = cluster.client.get(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/db")
        status = pdb.get("status", {})
        return bool(
            status.get("observedGeneration") == pdb["metadata"]["generation"]
            and status.get("currentHealthy") == 1
            and status.get("disruptionsAllowed") == 0
        )

    wait_until(budget_settled, timeout=30, what="the disruption controller to process the PDB")
    sleeps: list[float] = []
    evictor = make_evictor(
        api_client, recorder, metrics, max_retries=3, backoff_base=0.05, sleep=sleeps.append
    )

    result = evictor.evict(victim, preemptor, NODE)

    assert result is EvictionResult.BLOCKED_BY_PDB
    assert len(sleeps) == 3  # retried with backoff, then gave up
    assert sleeps[0] < sleeps[2]
    pod = read_pod(cluster, victim)
    assert pod is not None and not pod["metadata"].get("deletionTimestamp")
    assert count(metrics, "blocked-by-pdb") == 1
    assert not [e for e in events_of(cluster, victim) if e["reason"] == "Preempted"]


def events_of(cluster: Cluster, ref: PodRef) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.client.get(
        f"/api/v1/namespaces/{ref.namespace}/events",
        fieldSelector=f"involvedObject.name={ref.name}",
    )["items"]
    return items


@pytest.mark.parametrize("method", ["evict", "delete"])
def test_an_already_deleted_victim_is_gone(
    cluster: Cluster,
    namespace: str,
    api_client: k8s.ApiClient,
    recorder: EventRecorder,
    metrics: Metrics,
    wait_until: Waiter,
    method: str,
) -> None:
    victim = create_pod(cluster, namespace, pod_body("short-lived"))
    preemptor = create_pod(cluster, namespace, pod_body("high-priority-pod"))
    cluster.client.delete(
        f"/api/v1/namespaces/{namespace}/pods/{victim.name}", {"gracePeriodSeconds": 0}
    )
    wait_until(lambda: read_pod(cluster, victim) is None, what="the victim to be removed")

    result = make_evictor(api_client, recorder, metrics, method=method).evict(
        victim, preemptor, NODE
    )

    assert result is EvictionResult.GONE
    assert count(metrics, "gone") == 1
    assert not [e for e in events_of(cluster, victim) if e["reason"] == "Preempted"]


@pytest.mark.parametrize("method", ["evict", "delete"])
def test_a_new_pod_with_the_victims_name_is_never_touched(
    cluster: Cluster,
    namespace: str,
    api_client: k8s.ApiClient,
    recorder: EventRecorder,
    metrics: Metrics,
    wait_until: Waiter,
    method: str,
) -> None:
    old = create_pod(cluster, namespace, pod_body("reused-name"))
    preemptor = create_pod(cluster, namespace, pod_body("high-priority-pod"))
    cluster.client.delete(
        f"/api/v1/namespaces/{namespace}/pods/{old.name}", {"gracePeriodSeconds": 0}
    )
    wait_until(lambda: read_pod(cluster, old) is None, what="the old pod to be removed")
    new = create_pod(cluster, namespace, pod_body("reused-name"))
    assert new.uid != old.uid
    wait_until(lambda: running(cluster, new), what="the new pod to run")
    evictor = make_evictor(api_client, recorder, metrics, method=method)

    # Through the front door: the GET sees another uid.
    assert evictor.evict(old, preemptor, NODE) is EvictionResult.GONE
    # And in the race the GET cannot see (the pod replaced between the read and the
    # write): the uid precondition of the write itself refuses.
    if method == "evict":
        # The worker's way: the victim was seen live in a (stale) cache, no read first.
        raced = evictor.evict(old, preemptor, NODE, seen_live=True)
    else:
        stale = {"metadata": {"uid": old.uid}, "status": {}}
        raced = evictor._delete(old, stale, {"preconditions": {"uid": old.uid}})
    assert raced is EvictionResult.GONE

    pod = read_pod(cluster, new)
    assert pod is not None
    assert pod["metadata"]["uid"] == new.uid
    assert not pod["metadata"].get("deletionTimestamp")
    assert not [c for c in pod["status"].get("conditions", []) if c["type"] == DISRUPTION_TARGET]


def test_a_terminating_victim_is_skipped(
    cluster: Cluster,
    namespace: str,
    api_client: k8s.ApiClient,
    recorder: EventRecorder,
    metrics: Metrics,
    release_finalizers: list[PodRef],
) -> None:
    victim = create_pod(cluster, namespace, pod_body("leaving", node=GHOST, grace=30))
    preemptor = create_pod(cluster, namespace, pod_body("high-priority-pod"))
    cluster.client.delete(f"/api/v1/namespaces/{namespace}/pods/{victim.name}")
    before = read_pod(cluster, victim)
    assert before is not None and before["metadata"].get("deletionTimestamp")

    result = make_evictor(api_client, recorder, metrics).evict(victim, preemptor, NODE)

    assert result is EvictionResult.SKIPPED_TERMINATING
    after = read_pod(cluster, victim)
    assert after is not None
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert count(metrics, "skipped-terminating") == 1


@pytest.mark.parametrize("method", ["evict", "delete"])
def test_the_grace_period_is_capped(
    cluster: Cluster,
    namespace: str,
    api_client: k8s.ApiClient,
    recorder: EventRecorder,
    metrics: Metrics,
    method: str,
) -> None:
    victim = create_pod(cluster, namespace, pod_body("slow-to-stop", node=GHOST, grace=300))
    short = create_pod(cluster, namespace, pod_body("quick-to-stop", node=GHOST, grace=2))
    preemptor = create_pod(cluster, namespace, pod_body("high-priority-pod"))
    evictor = make_evictor(api_client, recorder, metrics, method=method, grace_period_cap=7)

    assert evictor.evict(victim, preemptor, NODE).value in ("evicted", "deleted")
    assert evictor.evict(short, preemptor, NODE).value in ("evicted", "deleted")

    capped = read_pod(cluster, victim)
    assert capped is not None and capped["metadata"]["deletionGracePeriodSeconds"] == 7
    kept = read_pod(cluster, short)
    assert kept is not None and kept["metadata"]["deletionGracePeriodSeconds"] == 2


def test_delete_sets_disruption_target_then_deletes(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    api_client: k8s.ApiClient,
    recorder: EventRecorder,
    metrics: Metrics,
) -> None:
    victim = create_pod(cluster, namespace, pod_body("low-priority-pod", node=GHOST, grace=30))
    preemptor = create_pod(cluster, namespace, pod_body("high-priority-pod"))
    started = time.time()

    result = make_evictor(api_client, recorder, metrics, method="delete").evict(
        victim, preemptor, NODE
    )

    assert result is EvictionResult.DELETED
    pod = read_pod(cluster, victim)
    assert pod is not None and pod["metadata"].get("deletionTimestamp")
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 30  # no cap: the pod's own
    [condition] = [c for c in pod["status"]["conditions"] if c["type"] == DISRUPTION_TARGET]
    assert condition["status"] == "True"
    assert condition["reason"] == PREEMPTION_BY_SCHEDULER
    assert condition["message"] == f"{SCHEDULER}: preempting to accommodate a higher priority pod"
    assert condition["lastTransitionTime"]
    assert [e["reason"] for e in kubectl_events(kubectl, victim.name)] == ["Preempted"]
    assert count(metrics, "deleted") == 1
    assert time.time() - started < 5


def test_delete_again_after_a_crash_changes_nothing(
    cluster: Cluster,
    namespace: str,
    api_client: k8s.ApiClient,
    recorder: EventRecorder,
    metrics: Metrics,
    release_finalizers: list[PodRef],
) -> None:
    # The condition was written but the process died before the DELETE: a second call
    # does not write the condition again and goes on to delete. (Written a few seconds
    # ago: the disruption controller resets a DisruptionTarget older than 2 minutes on a
    # pod that is not being deleted.)
    written = rfc3339(time.time() - 5)
    victim = create_pod(
        cluster,
        namespace,
        pod_body("half-done", node=GHOST, grace=30, finalizers=["example.com/hold"]),
    )
    release_finalizers.append(victim)
    preemptor = create_pod(cluster, namespace, pod_body("high-priority-pod"))
    condition = {
        "type": DISRUPTION_TARGET,
        "status": "True",
        "reason": PREEMPTION_BY_SCHEDULER,
        "message": f"{SCHEDULER}: preempting to accommodate a higher priority pod",
        "lastTransitionTime": written,
    }
    cluster.client.patch(
        f"/api/v1/namespaces/{namespace}/pods/{victim.name}/status",
        {"status": {"conditions": [condition]}},
        kind="strategic",
    )
    evictor = make_evictor(api_client, recorder, metrics, method="delete")

    assert evictor.evict(victim, preemptor, NODE) is EvictionResult.DELETED
    assert evictor.evict(victim, preemptor, NODE) is EvictionResult.SKIPPED_TERMINATING

    pod = read_pod(cluster, victim)
    assert pod is not None and pod["metadata"].get("deletionTimestamp")
    [kept] = [c for c in pod["status"]["conditions"] if c["type"] == DISRUPTION_TARGET]
    assert kept["lastTransitionTime"] == written
    assert kept["status"] == "True"
