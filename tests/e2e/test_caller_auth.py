"""Who may drive the service, against the real kube-apiserver (docs/reliability.md, "Threat
model").

With ``--client-ca`` (how every e2e test, ``make cluster`` and ``make demo`` run it) only
kube-apiserver, which presents the control plane's webhook client certificate through its
AdmissionConfiguration, completes a handshake. Without it, the cache check of
``webhook/engine/admission.py`` is what stands: a forged review writes nothing to the
ledger, names no other pod, and cannot make a real resize preempt anyone.
"""

from __future__ import annotations

import copy
import secrets
import socket
import ssl
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from harness.kubeapi import ApiError
from harness.webhook_process import WebhookProcess
from tests.e2e.conftest import NODE, Cluster, Kubectl, StartService, Waiter
from tests.e2e.service_support import (
    LEASES,
    actual_cpu,
    events,
    forged_review,
    kubectl_warnings,
    ledger_entries,
    pod_manifest,
    post_review,
    read_pod,
    resize,
    run_pods,
    sample,
    scrape,
    terminating,
    with_cpu,
)
from webhook.kube.ledger import lease_name

pytestmark = pytest.mark.e2e


def _forgeries(high: Mapping[str, Any], low: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(what, review) of each kind of forged review. Each asks for 2.5 CPU more than
    high-priority-pod holds (4.5 of node-1's 8, low-priority-pod 3): taken at its word,
    it would preempt, and its reservation would make the next real resize preempt too."""

    def growing(old: dict[str, Any], cpu: str = "7") -> dict[str, Any]:
        return forged_review(old, with_cpu(old, cpu))

    ghost = copy.deepcopy(dict(high))
    ghost["metadata"] = {
        **ghost["metadata"],
        "name": f"ghost-{secrets.token_hex(3)}",
        "uid": secrets.token_hex(16),
        "resourceVersion": "1",
    }
    other_uid = copy.deepcopy(dict(high))
    other_uid["metadata"] = {**other_uid["metadata"], "uid": secrets.token_hex(16)}
    smaller = with_cpu(high, "100m")
    smaller["metadata"] = {**smaller["metadata"], "resourceVersion": "1"}
    higher = copy.deepcopy(dict(low))
    higher["spec"] = {**higher["spec"], "priority": 2_000_000_000}
    higher["metadata"] = {**higher["metadata"], "resourceVersion": "1"}
    elsewhere = copy.deepcopy(dict(high))
    elsewhere["spec"] = {**elsewhere["spec"], "nodeName": "node-2"}
    elsewhere["metadata"] = {**elsewhere["metadata"], "resourceVersion": "1"}
    return [
        ("a pod that does not exist", growing(ghost)),
        ("another uid", growing(other_uid)),
        ("other resources than the cache's", growing(smaller)),
        ("another priority than the cache's", growing(higher, "5500m")),
        ("another node than the cache's", growing(elsewhere)),
    ]


def _lease_version(cluster: Cluster) -> str | None:
    try:
        lease = cluster.client.get(f"{LEASES}/{lease_name(NODE)}")
    except ApiError as e:
        if e.status == 404:
            return None
        raise
    version: str = lease["metadata"]["resourceVersion"]
    return version


@pytest.fixture
def scene(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
) -> Iterator[Callable[[], tuple[dict[str, Any], dict[str, Any]]]]:
    """node-1 (8 CPU): low-priority-pod 3 CPU, high-priority-pod 4 CPU; returns both as
    stored."""

    def make() -> tuple[dict[str, Any], dict[str, Any]]:
        run_pods(
            kubectl,
            [
                pod_manifest("low-priority-pod", "3", priority_classes["low"]),
                pod_manifest("high-priority-pod", "4", priority_classes["high"]),
            ],
        )
        high = read_pod(cluster, namespace, "high-priority-pod")
        low = read_pod(cluster, namespace, "low-priority-pod")
        assert high is not None and low is not None
        return high, low

    yield make


def test_with_authentication_only_the_api_servers_certificate_gets_past_the_handshake(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    start_service: StartService,
    scene: Callable[[], tuple[dict[str, Any], dict[str, Any]]],
    wait_until: Waiter,
) -> None:
    service: WebhookProcess = start_service()
    assert service.client_files is not None
    high, _ = scene()
    forged = _forgeries(high, high)[0][1]

    no_certificate = ssl.create_default_context(cadata=service.ca_pem.decode())
    no_certificate.maximum_version = ssl.TLSVersion.TLSv1_2  # the verdict ends the handshake
    with (
        pytest.raises(ssl.SSLError, match=r"(?i)handshake failure|certificate"),
        socket.create_connection(("127.0.0.1", service.port), timeout=5) as raw,
    ):
        no_certificate.wrap_socket(raw, server_hostname="127.0.0.1")
    # The control: the same request with kube-apiserver's certificate is answered.
    assert (
        forged["request"]["uid"]
        == post_review(service.url, service.context(), forged)["response"]["uid"]
    )
    assert 0 == sample(scrape(service.metrics_port), "resize_preemption_unauthenticated")

    # kube-apiserver itself gets through: the walkthrough preempts.
    result = resize(kubectl, "high-priority-pod", "6")
    assert 0 == result.returncode, result.stderr
    assert any("preempting 1 lower-priority pod" in w for w in kubectl_warnings(result))
    wait_until(
        lambda: actual_cpu(read_pod(cluster, namespace, "high-priority-pod")) == "6",
        timeout=30,
        what="the resize actuated",
    )


def test_without_authentication_forged_reviews_write_nothing_name_nobody_and_evict_nobody(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    start_service: StartService,
    scene: Callable[[], tuple[dict[str, Any], dict[str, Any]]],
    wait_until: Waiter,
) -> None:
    service: WebhookProcess = start_service(client_auth=False)
    assert 1 == sample(scrape(service.metrics_port), "resize_preemption_unauthenticated")
    assert "unauthenticated callers" in service.process.log_path.read_text()
    high, low = scene()
    # A real resize that fits (1 CPU free) gives the node its Lease.
    assert 0 == resize(kubectl, "high-priority-pod", "4500m").returncode
    wait_until(
        lambda: actual_cpu(read_pod(cluster, namespace, "high-priority-pod")) == "4500m",
        timeout=30,
        what="the first resize actuated",
    )
    high = read_pod(cluster, namespace, "high-priority-pod") or high
    anyone = ssl.create_default_context(cadata=service.ca_pem.decode())
    version = _lease_version(cluster)
    assert version is not None

    for what, forged in _forgeries(high, low):
        answer = post_review(service.url, anyone, forged)["response"]
        assert answer["allowed"] is True, what
        named = " ".join(answer.get("warnings", []))
        assert "low-priority-pod" not in named and NODE not in named, what
    assert version == _lease_version(cluster)
    assert not [e for e in ledger_entries(cluster) if e["pod"]["name"] != "high-priority-pod"]

    # A stream of them while a real resize that fits (0.5 CPU free) is made.
    stop = threading.Event()
    sent: list[int] = []

    def stream() -> None:
        forgeries = _forgeries(high, low)
        while not stop.is_set():
            for _, forged in forgeries:
                post_review(service.url, anyone, forged)
                sent.append(1)

    streamer = threading.Thread(target=stream, daemon=True)
    streamer.start()
    try:
        wait_until(lambda: len(sent) >= 20, timeout=30, what="forged reviews under way")
        result = resize(kubectl, "high-priority-pod", "5")
        assert 0 == result.returncode, result.stderr
        assert not [w for w in kubectl_warnings(result) if "preempting" in w]
        wait_until(
            lambda: actual_cpu(read_pod(cluster, namespace, "high-priority-pod")) == "5",
            timeout=30,
            what="the real resize actuated",
        )
    finally:
        stop.set()
        streamer.join(timeout=10)
    assert len(sent) >= 20
    survivor = read_pod(cluster, namespace, "low-priority-pod")
    assert survivor is not None and not terminating(survivor)
    assert low["metadata"]["uid"] == survivor["metadata"]["uid"]
    assert [] == events(kubectl, "low-priority-pod", "Preempted")
    unverified = sample(scrape(service.metrics_port), "resize_preemption_unverified_reviews_total")
    assert unverified is not None and unverified >= len(sent)
