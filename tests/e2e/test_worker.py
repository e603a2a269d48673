"""The preemption worker end to end: admission engine -> ledger -> worker -> kubelet.

The cluster cache watches the real API server, the admission engine records the entry
(as the webhook's validating endpoint would), and the resize itself is made with kubectl.
The kubelet defers it until the worker's eviction made room, then actuates it.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client as k8s

from harness.doubles import InMemoryLedger
from harness.manifests import guaranteed_pod
from tests.e2e.conftest import NODE, Cluster, Kubectl, Waiter, resize_retry_delay, victim_leaves
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.resize import apply_resize
from webhook.engine.admission import AdmissionEngine
from webhook.engine.ledger import LedgerEntry
from webhook.engine.lifecycle.states import room_holders
from webhook.engine.worker import PreemptionWorker
from webhook.kube.cache import BUDGETS, ClusterCache
from webhook.kube.events import EventRecorder
from webhook.kube.evictor import Evictor

pytestmark = pytest.mark.e2e

SCHEDULER = "resize-preemption-webhook"


@dataclass
class Service:
    """The acting half of the webhook, in this process."""

    cache: ClusterCache
    ledger: InMemoryLedger
    engine: AdmissionEngine
    worker: PreemptionWorker
    metrics: Metrics


def make_service(api_client: k8s.ApiClient, config: Config) -> Service:
    metrics = Metrics()
    cache = ClusterCache(api_client, config, metrics=metrics, close_client=False)
    cache.start()
    assert cache.wait_synced(20)
    ledger = InMemoryLedger()
    recorder = EventRecorder(api_client, controller=SCHEDULER, instance="e2e", metrics=metrics)
    evictor = Evictor(
        api_client,
        recorder,
        metrics,
        method=config.eviction_method,
        grace_period_cap=config.grace_period_cap,
        scheduler_name=config.scheduler_name,
    )
    worker = PreemptionWorker(
        cache, ledger, evictor, config, metrics, recorder=recorder, interval=0.2
    )
    cache.subscribe(lambda kind, *_: worker.wake(budgets_changed=kind == BUDGETS))
    # The worker wakes on the cache's changes: an admitted resize needs it once persisted.
    engine = AdmissionEngine(config, cache, ledger, metrics=metrics)
    return Service(cache, ledger, engine, worker, metrics)


@pytest.fixture
def service(api_client: k8s.ApiClient, request: pytest.FixtureRequest) -> Iterator[Service]:
    config = getattr(request, "param", None) or Config(persist_timeout=10.0)
    svc = make_service(api_client, config)
    svc.worker.start()
    yield svc
    svc.worker.stop(timeout=10)
    svc.cache.stop()


def pod(name: str, cpu: str, priority_class: str) -> dict[str, Any]:
    return guaranteed_pod(name, cpu, priority_class, node=NODE, grace_seconds=None)


def resize_patch(cpu: str) -> dict[str, Any]:
    return {
        "spec": {
            "containers": [
                {"name": "app", "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}
            ]
        }
    }


def get(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] | None = cluster.client.get_or_none(
        f"/api/v1/namespaces/{namespace}/pods/{name}"
    )
    return pod


def actual_cpu(p: dict[str, Any] | None) -> str | None:
    statuses = (p or {}).get("status", {}).get("containerStatuses") or []
    return statuses[0].get("resources", {}).get("requests", {}).get("cpu") if statuses else None


def review(cluster: Cluster, namespace: str, name: str, cpu: str) -> dict[str, Any]:
    """The AdmissionRequest the API server would send for this resize."""
    old = get(cluster, namespace, name)
    assert old is not None
    return {
        "uid": f"review-{secrets.token_hex(4)}",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "subResource": "resize",
        "operation": "UPDATE",
        "namespace": namespace,
        "name": name,
        "object": apply_resize(old, resize_patch(cpu)),
        "oldObject": old,
        "dryRun": False,
    }


def events(kubectl: Kubectl, name: str) -> list[dict[str, Any]]:
    out = kubectl("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json")
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return items


def walkthrough(
    cluster: Cluster, namespace: str, kubectl: Kubectl, priority_classes: dict[str, str]
) -> None:
    """8 CPUs: low-priority-pod 4, high-priority-pod 2, steady 1 (as important as high)."""
    items = [
        pod("low-priority-pod", "4", priority_classes["low"]),
        pod("high-priority-pod", "2", priority_classes["high"]),
        pod("steady", "1", priority_classes["high"]),
    ]
    kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )
    kubectl("wait", "--for=condition=Ready", "pod", "--all", "--timeout=20s")


def holding(service: Service) -> tuple[LedgerEntry, ...]:
    """The ledger entries that still hold room, as every reader counts them."""
    entries = service.ledger.all_entries()
    return room_holders(entries, service.cache.pods_on(NODE), time.time())


def test_the_worker_preempts_for_an_admitted_resize_and_releases_it_once_actuated(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    service: Service,
    wait_until: Waiter,
) -> None:
    walkthrough(cluster, namespace, kubectl, priority_classes)
    wait_until(
        lambda: service.cache.pod(namespace, "steady") is not None, what="the cache to see pods"
    )

    decision = service.engine.validate(review(cluster, namespace, "high-priority-pod", "6"))
    assert decision.verdict == "preempt" and decision.reserved
    assert decision.plan is not None
    assert decision.plan.victim_keys == (f"{namespace}/low-priority-pod",)

    # Admitted, not yet persisted: nobody is evicted.
    time.sleep(0.6)
    assert get(cluster, namespace, "low-priority-pod") is not None
    [entry] = service.ledger.all_entries()
    assert not entry.persisted and not entry.handled

    patch = json.dumps(resize_patch("6"))
    kubectl("patch", "pod", "high-priority-pod", "--subresource", "resize", "--patch", patch)

    wait_until(
        lambda: actual_cpu(get(cluster, namespace, "high-priority-pod")) == "6",
        timeout=15 + resize_retry_delay(cluster.binaries),
        what="the resize to be actuated",
    )
    victim_leaves(cluster, namespace, "low-priority-pod", wait_until)
    assert get(cluster, namespace, "steady") is not None
    # Spent: nobody counts it any more, and nothing was written to say so.
    wait_until(lambda: not holding(service), what="the reservation to be spent")
    preempted = [e for e in events(kubectl, "low-priority-pod") if e["reason"] == "Preempted"]
    assert len(preempted) == 1
    high = get(cluster, namespace, "high-priority-pod")
    assert high is not None
    assert preempted[0]["message"] == f"Preempted by pod {high['metadata']['uid']} on node {NODE}"
    # The plan was told by the review's warning; the victim's event names the preemptor.
    assert [] == [
        e
        for e in events(kubectl, "high-priority-pod")
        if e["reason"] in ("PreemptingForResize", "ResizePreemptionAbandoned")
    ]


@pytest.mark.parametrize("service", [Config(persist_timeout=1.0)], indirect=True)
def test_a_resize_never_persisted_is_released_and_evicts_nobody(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    service: Service,
    wait_until: Waiter,
) -> None:
    walkthrough(cluster, namespace, kubectl, priority_classes)
    wait_until(
        lambda: service.cache.pod(namespace, "steady") is not None, what="the cache to see pods"
    )

    decision = service.engine.validate(review(cluster, namespace, "high-priority-pod", "6"))
    assert decision.verdict == "preempt" and decision.reserved
    # ... but a later webhook refused the patch: it never reaches the pod's spec.

    wait_until(lambda: not holding(service), timeout=5, what="the release")
    low = get(cluster, namespace, "low-priority-pod")
    assert low is not None and not low["metadata"].get("deletionTimestamp")
    assert not [e for e in events(kubectl, "low-priority-pod") if e["reason"] == "Preempted"]
