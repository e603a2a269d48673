"""Where a victim's work goes, end to end, on two hollow nodes.

node-1 (8 CPU) is full: ``high`` (2 CPU, high priority) grows to 5 CPU, and two pods of
equal low priority hold 3 CPU each: ``web-...`` of the ReplicaSet ``web`` (started first)
and the bare pod ``bare`` (started a second later). node-2 (4 CPU) has room for either.
The admission engine, the worker and the follow run in this process on a cache of the
real API server (as ``webhook.service`` wires them); kube-scheduler and the replicaset
controller make and bind the replacement.

node-1 carries a NoSchedule taint while the test resizes, so the scheduler never binds a
replacement into the room made for the resize (the kubelet only reads NoExecute taints:
the pods bound there keep running and the resize is actuated).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from kubernetes import client as k8s

from harness.doubles import InMemoryLedger
from harness.manifests import PAUSE_IMAGE, guaranteed_pod
from harness.nodes import NodeSpec
from tests.e2e.conftest import NODE, Cluster, Kubectl, StartService, Waiter
from tests.e2e.service_support import events as service_events
from tests.e2e.service_support import resize, resize_patch, sample, scrape
from tests.e2e.test_service import walkthrough
from tests.e2e.test_worker import actual_cpu, events, get, review
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.movable import takes_pods
from webhook.engine.admission import AdmissionEngine
from webhook.engine.follow import Follow
from webhook.engine.worker import PreemptionWorker
from webhook.kube.cache import BUDGETS, ClusterCache
from webhook.kube.events import EventRecorder
from webhook.kube.evictor import Evictor
from webhook.service import follow_victims

pytestmark = pytest.mark.e2e

OTHER = "node-2"
TAINT = {"key": "rpw.test/resizing", "effect": "NoSchedule"}
OUTCOMES = "resize_preemption_victim_outcomes_total"


@dataclass
class Service:
    cache: ClusterCache
    engine: AdmissionEngine
    worker: PreemptionWorker
    follow: Follow
    metrics: Metrics

    def outcomes(self) -> dict[str, float]:
        read = self.metrics.registry.get_sample_value
        found = {o: read(OUTCOMES, {"outcome": o}) for o in ("moved", "lost", "unknown")}
        return {o: v for o, v in found.items() if v}


@pytest.fixture(scope="module")
def node_2(cluster: Cluster) -> Iterator[str]:
    cluster.nodes.add_node(NodeSpec(OTHER, cpu="4", memory="8Gi"))
    yield OTHER
    cluster.nodes.remove_node(OTHER)


@pytest.fixture
def service(
    api_client: k8s.ApiClient, node_2: str, request: pytest.FixtureRequest
) -> Iterator[Service]:
    config: Config = request.param
    metrics = Metrics()
    cache = ClusterCache(api_client, config, metrics=metrics, close_client=False)
    cache.start()
    assert cache.wait_synced(20)
    ledger = InMemoryLedger()
    recorder = EventRecorder(api_client, controller="resize-preemption-webhook", instance="e2e")
    evictor = Evictor(
        api_client,
        recorder,
        metrics,
        method=config.eviction_method,
        grace_period_cap=config.grace_period_cap,
        scheduler_name=config.scheduler_name,
    )
    follow = follow_victims(cache, metrics, recorder)
    worker = PreemptionWorker(
        cache, ledger, evictor, config, metrics, recorder=recorder, interval=0.2, follow=follow
    )
    cache.subscribe(lambda kind, *_: worker.wake(budgets_changed=kind == BUDGETS))
    engine = AdmissionEngine(config, cache, ledger, metrics=metrics)
    follow.start()
    worker.start()
    yield Service(cache, engine, worker, follow, metrics)
    worker.stop(timeout=10)
    follow.stop(timeout=5)
    cache.stop()


@pytest.fixture
def scene(cluster: Cluster, namespace: str, node_2: str, wait_until: Waiter) -> Iterator[Cluster]:
    """node-2 cordoned while ``web``'s pod is placed (on node-1), node-1 tainted after;
    both undone, and the ReplicaSet removed, when the test ends."""
    api = cluster.client
    api.patch(f"/api/v1/nodes/{node_2}", {"spec": {"unschedulable": True}})
    try:
        yield cluster
    finally:
        api.delete(f"/apis/apps/v1/namespaces/{namespace}/replicasets/web")
        api.patch(f"/api/v1/nodes/{NODE}", {"spec": {"taints": None}})
        api.patch(f"/api/v1/nodes/{node_2}", {"spec": {"unschedulable": None}})


def replicaset(cpu: str, priority_class: str) -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": "256Mi"}
    container = {
        "name": "app",
        "image": PAUSE_IMAGE,
        "resources": {"requests": resources, "limits": dict(resources)},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "priorityClassName": priority_class,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [container],
                },
            },
        },
    }


def web_pods(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    found = cluster.client.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector="app=web")
    return [p for p in found["items"] if not p["metadata"].get("deletionTimestamp")]


def fill(
    cluster: Cluster, namespace: str, kubectl: Kubectl, classes: dict[str, str], wait: Waiter
) -> str:
    """node-1 full as the module's docstring says, node-2 open; the web pod's name."""
    api = cluster.client
    kubectl("apply", "-f", "-", input=orjson.dumps(replicaset("3", classes["low"])).decode())
    [web] = wait(
        lambda: [p for p in web_pods(cluster, namespace) if p["spec"].get("nodeName") == NODE],
        timeout=20,
        what="the ReplicaSet's pod on node-1",
    )
    name: str = web["metadata"]["name"]
    kubectl("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=20s")
    api.patch(f"/api/v1/nodes/{NODE}", {"spec": {"taints": [TAINT]}})
    api.patch(f"/api/v1/nodes/{OTHER}", {"spec": {"unschedulable": None}})
    time.sleep(1.1)  # startTime has whole seconds: "bare" starts after the web pod
    pods = [
        guaranteed_pod("bare", "3", classes["low"], node=NODE),
        guaranteed_pod("high", "2", classes["high"], node=NODE),
    ]
    for pod in pods:
        kubectl("apply", "-f", "-", input=orjson.dumps(pod).decode())
    kubectl("wait", "--for=condition=Ready", "pod/bare", "pod/high", "--timeout=20s")
    return name


def seen(service: Service, namespace: str, *names: str) -> bool:
    other = service.cache.node(OTHER)
    return (
        other is not None
        and takes_pods(other)
        and all(service.cache.pod(namespace, n) is not None for n in names)
    )


def resize_high(cluster: Cluster, namespace: str, kubectl: Kubectl, wait: Waiter) -> None:
    patch = resize_patch("5")
    kubectl("patch", "pod", "high", "--subresource", "resize", "--patch", patch)
    wait(
        lambda: actual_cpu(get(cluster, namespace, "high")) == "5",
        timeout=20,
        what="the resize to be actuated",
    )


def told(kubectl: Kubectl, reason: str) -> list[str]:
    return [e["message"] for e in events(kubectl, "high") if e["reason"] == reason]


def decision_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    """The decision log's lines: the review's, then the victims' outcomes."""
    records = [r for r in caplog.records if r.name == "webhook.decisions"]
    return [orjson.loads(r.getMessage()) for r in records]


@pytest.mark.parametrize("service", [Config(victim_order="movable-first")], indirect=True)
def test_movable_first_evicts_the_replicasets_pod_and_its_replacement_runs_on_node_2(
    scene: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    service: Service,
    wait_until: Waiter,
) -> None:
    web = fill(scene, namespace, kubectl, priority_classes, wait_until)
    wait_until(lambda: seen(service, namespace, web, "bare", "high"), what="the cache")

    decision = service.engine.validate(review(scene, namespace, "high", "5"))
    assert decision.plan is not None
    assert (f"{namespace}/{web}",) == decision.plan.victim_keys
    resize_high(scene, namespace, kubectl, wait_until)

    wait_until(lambda: service.outcomes(), timeout=20, what="the victim's outcome")
    assert {"moved": 1} == service.outcomes()
    [replacement] = web_pods(scene, namespace)
    assert OTHER == replacement["spec"]["nodeName"]
    new = replacement["metadata"]["name"]
    expected = (
        f"Preempted {namespace}/{web} moved: its replacement {namespace}/{new} runs on {OTHER}"
    )
    assert [expected] == wait_until(lambda: told(kubectl, "Moved"), what="the Moved event")
    assert get(scene, namespace, "bare") is not None


@pytest.mark.parametrize("service", [Config()], indirect=True)
def test_upstream_evicts_the_pod_started_last_and_its_work_is_lost(
    scene: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    service: Service,
    wait_until: Waiter,
) -> None:
    web = fill(scene, namespace, kubectl, priority_classes, wait_until)
    wait_until(lambda: seen(service, namespace, web, "bare", "high"), what="the cache")

    decision = service.engine.validate(review(scene, namespace, "high", "5"))
    assert decision.plan is not None
    assert (f"{namespace}/bare",) == decision.plan.victim_keys
    resize_high(scene, namespace, kubectl, wait_until)

    wait_until(lambda: service.outcomes(), timeout=20, what="the victim's outcome")
    assert {"lost": 1} == service.outcomes()
    wait_until(
        lambda: [e for e in events(kubectl, "bare") if e["reason"] == "Preempted"],
        what="the victim's Preempted event",
    )
    # Nothing recreates the bare pod: lost as under kube-scheduler, and its Preempted event
    # is the preemption's only one. The follow tells within milliseconds of counting.
    time.sleep(1.0)
    assert [] == told(kubectl, "NotMoved")
    assert [web] == [p["metadata"]["name"] for p in web_pods(scene, namespace)]


@pytest.mark.parametrize("service", [Config(victim_order="movable-first")], indirect=True)
def test_node_2_filling_up_after_the_plan_loses_the_victim_and_the_resize_completes(
    scene: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    service: Service,
    wait_until: Waiter,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.decisions")
    web = fill(scene, namespace, kubectl, priority_classes, wait_until)
    wait_until(lambda: seen(service, namespace, web, "bare", "high"), what="the cache")
    decision = service.engine.validate(review(scene, namespace, "high", "5"))
    assert decision.plan is not None
    assert (f"{namespace}/{web}",) == decision.plan.victim_keys
    [move] = [v.move for v in decision.plan.victims]
    assert move is not None and move.movable and OTHER == move.node

    # Between the plan and the eviction, node-2 fills up (equal priority: never preempted).
    filler = guaranteed_pod("filler", "4", priority_classes["low"], node=OTHER)
    kubectl("apply", "-f", "-", input=orjson.dumps(filler).decode())
    kubectl("wait", "--for=condition=Ready", "pod/filler", "--timeout=20s")
    resize_high(scene, namespace, kubectl, wait_until)

    wait_until(lambda: service.outcomes(), timeout=30, what="the victim's outcome")
    assert {"lost": 1} == service.outcomes()
    [replacement] = web_pods(scene, namespace)
    assert "nodeName" not in replacement["spec"]
    new = f"{namespace}/{replacement['metadata']['name']}"
    why = f"the scheduler found no node for its replacement {new}"
    assert [f"Preempted {namespace}/{web} did not move: {why}"] == wait_until(
        lambda: told(kubectl, "NotMoved"), what="the NotMoved event"
    )
    [review_line, outcome_line] = decision_lines(caplog)
    # Planned as movable to node-2, then lost: both are in the log.
    assert [
        {"pod": f"{namespace}/{web}", "movable": True, "why": move.why, "node": OTHER}
    ] == review_line["moves"]
    assert {
        "victim": f"{namespace}/{web}",
        "outcome": "lost",
        "pod": f"{namespace}/high",
        "node": NODE,
        "why": why,
        "replacement": new,
    } == outcome_line
    assert get(scene, namespace, "bare") is not None


def test_the_service_process_counts_a_bare_victim_lost_with_its_preempted_event_only(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    """The README's walkthrough through the service process (its own wiring, leader
    election and /metrics): low-priority-pod is a bare pod, so its work is lost."""
    process = start_service()
    walkthrough(kubectl, priority_classes)
    assert 0 == resize(kubectl, "high-priority-pod", "6").returncode

    def lost() -> float | None:
        return sample(scrape(process.metrics_port), OUTCOMES, outcome="lost")

    assert 1 == wait_until(lost, timeout=30, what="the outcome in /metrics")
    wait_until(
        lambda: service_events(kubectl, "low-priority-pod", "Preempted"),
        what="the victim's Preempted event",
    )
    time.sleep(1.0)  # the process tells an outcome within milliseconds of counting it
    assert [] == service_events(kubectl, "high-priority-pod", "NotMoved")
