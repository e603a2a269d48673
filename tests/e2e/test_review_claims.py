"""A review is a claim, and so is a ledger entry: what the service does follows only what
the API server stored and the service's own settings (docs/architecture.md, "What the
service acts on"). Against the real API server and hollow kubelets, the service run
without ``client-ca``, as on a managed control plane where anyone on the pod network can
post a review:

* a review whose ``oldObject`` is exactly the stored pod and whose ``object`` claims
  another node, namespace or priority writes nothing and names nobody;
* an entry that another writer (anyone with rights on the ledger's Leases, or a replica
  with other settings) puts in a node's Lease is acted on only as the cache and the
  service's settings allow: nobody is evicted on a node the pod does not run on, for a
  pod the preemptor policy refuses, nor shrunk for a loan its floors do not allow.

Each scene leaves the real resize deferred by the kubelet, so an entry trusted as written
would be carried out.
"""

from __future__ import annotations

import copy
import json
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest
from kubernetes import client as k8s

from harness.manifests import guaranteed_pod
from harness.nodes import NodeSpec
from harness.webhook_process import NAMESPACE, WebhookProcess
from tests.e2e.conftest import NODE, Cluster, Kubectl, StartService, Waiter
from tests.e2e.service_support import (
    clear_ledger,
    decision_lines,
    forged_review,
    ledger_entries,
    pod_manifest,
    post_review,
    read_pod,
    resize,
    resize_pending,
    run_pods,
    sample,
    scrape,
    spec_cpu,
    terminating,
    with_cpu,
)
from webhook.base.settings import Config
from webhook.core.lending import Loan
from webhook.core.model import PodRef
from webhook.core.resources import Resources, memory_bytes
from webhook.engine.ledger import LedgerEntry
from webhook.kube.ledger import LeaseLedger

pytestmark = [pytest.mark.e2e, pytest.mark.service_modes("managed")]

OTHER = "node-2"
PROD = {"rpw-test": "prod"}
DISALLOWED = "resize_preemption_entries_disallowed_total"
#: Long enough for a worker woken by a Lease change to have acted several times over.
SETTLE = 4.0


@pytest.fixture(scope="module")
def node_2(cluster: Cluster) -> Iterator[str]:
    cluster.nodes.add_node(NodeSpec(OTHER, cpu="8", memory="16Gi"))
    yield OTHER
    cluster.nodes.remove_node(OTHER)


@pytest.fixture
def ledgers(cluster: Cluster, node_2: str, api_client: k8s.ApiClient) -> Iterator[LeaseLedger]:
    """The service's ledger as anyone with rights on its Leases writes it (the test's admin
    identity); both nodes' Leases removed before and after."""
    for node in (NODE, node_2):
        clear_ledger(cluster, node)
    ledger = LeaseLedger(api_client, Config(namespace=NAMESPACE))
    yield ledger
    for node in (NODE, node_2):
        clear_ledger(cluster, node)


def _stored(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    pod = read_pod(cluster, namespace, name)
    assert pod is not None
    return pod


def _deferred(
    cluster: Cluster, kubectl: Kubectl, namespace: str, cpu: str, wait_until: Waiter
) -> None:
    """high-priority-pod resized to ``cpu`` for real; the kubelet defers it."""
    assert 0 == resize(kubectl, "high-priority-pod", cpu).returncode
    wait_until(
        lambda: resize_pending(read_pod(cluster, namespace, "high-priority-pod")) == "Deferred",
        timeout=30,
        what="the resize deferred",
    )


def _planted(
    ledger: LeaseLedger, high: Mapping[str, Any], node: str, cpu: int, **fields: Any
) -> None:
    """An entry for high-priority-pod's resize to ``cpu`` millicores, written straight into
    ``node``'s Lease, its resize persisted already, held for ten minutes."""
    meta = high["metadata"]
    memory = memory_bytes(high["spec"]["containers"][0]["resources"]["requests"]["memory"])
    wanted = Resources(cpu, memory)
    now = time.time()
    entry = LedgerEntry(
        pod=PodRef(meta["namespace"], meta["name"], meta["uid"]),
        node=node,
        review_uid=f"planted-{node}",
        resources=wanted,
        desired=(("app", wanted),),
        victims=(),
        admitted_at=now,
        expires_at=now + 600,
        persisted=True,
    )
    entry = replace(entry, **fields)
    ledger.update(node, lambda entries: ((*entries, entry), None))


def _ref(pod: Mapping[str, Any]) -> PodRef:
    meta = pod["metadata"]
    return PodRef(meta["namespace"], meta["name"], meta["uid"])


def _untouched(cluster: Cluster, pod: Mapping[str, Any], cpu: str) -> None:
    meta = pod["metadata"]
    now = read_pod(cluster, meta["namespace"], meta["name"])
    assert now is not None and not terminating(now), f"{meta['name']} was removed"
    assert (meta["uid"], cpu) == (now["metadata"]["uid"], spec_cpu(now))


def _settled(cluster: Cluster, pod: Mapping[str, Any], node: str, wait_until: Waiter) -> None:
    """Once ``node``'s Lease holds no entry any more, or ``pod`` was taken or shrunk, and a
    few more of the worker's passes."""
    meta = pod["metadata"]
    cpu = spec_cpu(pod)

    def settled() -> bool:
        now = read_pod(cluster, meta["namespace"], meta["name"])
        taken = now is None or terminating(now) or spec_cpu(now) != cpu
        return taken or not ledger_entries(cluster, node)

    wait_until(settled, timeout=30, what=f"{node}'s planted entry settled")
    time.sleep(SETTLE)


def _anyone(service: WebhookProcess) -> ssl.SSLContext:
    """A TLS client with no certificate of its own: any caller on the pod network."""
    return ssl.create_default_context(cadata=service.ca_pem.decode())


def _disallowed(service: WebhookProcess, rule: str) -> float:
    return sample(scrape(service.metrics_port), DISALLOWED, rule=rule) or 0.0


# -- a node the pod does not run on ---------------------------------------------------------


@pytest.fixture
def two_nodes(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    node_2: str,
    priority_classes: dict[str, str],
) -> Callable[[], tuple[dict[str, Any], dict[str, Any]]]:
    """node-1 full of pods as important as high-priority-pod (4 CPU, to grow to 6): its
    resize can only be deferred. node-2 (8 CPU): victim2, low priority, 5 CPU."""

    def make() -> tuple[dict[str, Any], dict[str, Any]]:
        run_pods(
            kubectl,
            [
                pod_manifest("high-priority-pod", "4", priority_classes["high"]),
                pod_manifest("steady", "4", priority_classes["high"]),
                guaranteed_pod("victim2", "5", priority_classes["low"], node=node_2),
            ],
        )
        return _stored(cluster, namespace, "high-priority-pod"), _stored(
            cluster, namespace, "victim2"
        )

    return make


def test_a_review_claiming_another_node_writes_nothing_and_evicts_nobody_there(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    start_service: StartService,
    two_nodes: Callable[[], tuple[dict[str, Any], dict[str, Any]]],
    ledgers: LeaseLedger,
    wait_until: Waiter,
) -> None:
    service = start_service(client_auth=False)
    high, victim2 = two_nodes()
    claim = with_cpu(high, "6")
    claim["spec"]["nodeName"] = OTHER

    answer = post_review(service.url, _anyone(service), forged_review(high, claim))["response"]

    assert answer["allowed"] is True
    assert not [w for w in answer.get("warnings", []) if "victim2" in w or "preempting" in w]
    assert [] == ledger_entries(cluster, OTHER)
    # Its owner then resizes it for real: the kubelet defers it on node-1.
    _deferred(cluster, kubectl, namespace, "6", wait_until)
    time.sleep(SETTLE)
    _untouched(cluster, victim2, "5")
    assert [] == ledger_entries(cluster, OTHER)


def test_an_entry_planted_on_another_nodes_lease_is_removed_and_evicts_nobody(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    start_service: StartService,
    two_nodes: Callable[[], tuple[dict[str, Any], dict[str, Any]]],
    ledgers: LeaseLedger,
    wait_until: Waiter,
) -> None:
    service = start_service(client_auth=False)
    high, victim2 = two_nodes()
    _deferred(cluster, kubectl, namespace, "6", wait_until)

    _planted(ledgers, high, OTHER, 6000, victims=(_ref(victim2),))

    _settled(cluster, victim2, OTHER, wait_until)
    _untouched(cluster, victim2, "5")
    assert 1 == _disallowed(service, "node")
    [line] = decision_lines(service.process.log_path, namespace, "worker")
    assert ("disallowed", "node") == (line["verdict"], line["reason"])


# -- a namespace or priority the preemptor policy does not allow ----------------------------


@pytest.fixture
def prod_namespace(cluster: Cluster, namespace: str) -> Iterator[str]:
    """A namespace the preemptor policy selects; the test's own is not selected."""
    name = f"{namespace[:50]}-prod"
    cluster.client.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": PROD}})
    yield name
    cluster.client.delete(f"/api/v1/namespaces/{name}")


@pytest.fixture
def walkthrough(
    cluster: Cluster, kubectl: Kubectl, namespace: str, priority_classes: dict[str, str]
) -> Callable[[], tuple[dict[str, Any], dict[str, Any]]]:
    """node-1, 8 CPU: low-priority-pod 3, high-priority-pod 4 (to grow to 6)."""

    def make() -> tuple[dict[str, Any], dict[str, Any]]:
        run_pods(
            kubectl,
            [
                pod_manifest("low-priority-pod", "3", priority_classes["low"]),
                pod_manifest("high-priority-pod", "4", priority_classes["high"]),
            ],
        )
        return _stored(cluster, namespace, "high-priority-pod"), _stored(
            cluster, namespace, "low-priority-pod"
        )

    return make


POLICIES = [
    pytest.param(
        ("--preemptor-namespace-selector", json.dumps({"matchLabels": PROD})),
        lambda obj, prod: obj["metadata"].update(namespace=prod),
        id="a-claimed-namespace",
    ),
    pytest.param(
        ("--min-preemptor-priority", "1500000"),
        lambda obj, prod: obj["spec"].update(priority=2_000_000),
        id="a-claimed-priority",
    ),
]


@pytest.mark.parametrize(("policy", "claim"), POLICIES)
def test_a_claim_past_the_preemptor_policy_writes_nothing_and_names_nobody(
    cluster: Cluster,
    namespace: str,
    start_service: StartService,
    walkthrough: Callable[[], tuple[dict[str, Any], dict[str, Any]]],
    prod_namespace: str,
    ledgers: LeaseLedger,
    policy: tuple[str, str],
    claim: Callable[[dict[str, Any], str], None],
) -> None:
    service = start_service(*policy, client_auth=False)
    high, low = walkthrough()
    answers = []
    for _ in range(10):
        claimed = copy.deepcopy(with_cpu(high, "6"))
        claim(claimed, prod_namespace)
        forged = forged_review(high, claimed)
        answers.append(post_review(service.url, _anyone(service), forged)["response"])

    assert all(a["allowed"] for a in answers)
    named = [w for a in answers for w in a.get("warnings", []) if "low-priority-pod" in w]
    assert ([], []) == (named, ledger_entries(cluster))
    _untouched(cluster, low, "3")


@pytest.mark.parametrize(
    "policy",
    [
        ("--preemptor-namespace-selector", json.dumps({"matchLabels": PROD})),
        ("--min-preemptor-priority", "1500000"),
    ],
    ids=["namespace-not-selected", "priority-under-the-minimum"],
)
def test_an_entry_the_preemptor_policy_refuses_evicts_nobody_and_is_removed(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    start_service: StartService,
    walkthrough: Callable[[], tuple[dict[str, Any], dict[str, Any]]],
    ledgers: LeaseLedger,
    wait_until: Waiter,
    policy: tuple[str, str],
) -> None:
    service = start_service(*policy, client_auth=False)
    high, low = walkthrough()
    # The real resize: the review refuses it (not-eligible), the kubelet defers it.
    _deferred(cluster, kubectl, namespace, "6", wait_until)

    _planted(ledgers, high, NODE, 6000, victims=(_ref(low),))

    _settled(cluster, low, NODE, wait_until)
    _untouched(cluster, low, "3")
    assert 1 == _disallowed(service, "preemptor-policy")


# -- a loan the lender's floors do not allow ------------------------------------------------


def test_a_planted_loan_from_a_pod_without_a_floor_shrinks_nobody(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    start_service: StartService,
    priority_classes: dict[str, str],
    ledgers: LeaseLedger,
    wait_until: Waiter,
) -> None:
    """node-1, 8 CPU: high-priority-pod 4 (to grow to 6) and another pod as important, 3
    CPU, with no floor: never a victim, never a lender. An entry borrowing 2 CPU from it
    is planted once the kubelet defers the resize."""
    service = start_service(client_auth=False)
    run_pods(
        kubectl,
        [
            pod_manifest("high-priority-pod", "4", priority_classes["high"]),
            pod_manifest("peer", "3", priority_classes["high"]),
        ],
    )
    high, peer = (_stored(cluster, namespace, n) for n in ("high-priority-pod", "peer"))
    _deferred(cluster, kubectl, namespace, "6", wait_until)

    loan = Loan(_ref(peer), 0, "app", "cpu", 3000, 1000, 2000, limits=True)
    _planted(ledgers, high, NODE, 6000, loans=(loan,))

    _settled(cluster, peer, NODE, wait_until)
    _untouched(cluster, peer, "3")
    assert 1 == _disallowed(service, "lending")
