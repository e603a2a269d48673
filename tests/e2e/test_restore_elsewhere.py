"""Where a checkpointed pod comes back, end to end: the service process against the real
API server and two hollow kubelets.

node-1 (8 CPU) is full: ``full`` holds 7500m of it. node-2 (4 CPU) is empty. Both nodes'
agents published that they can checkpoint and restore (the ConfigMaps ``rpw-node-<node>``
an agent writes, docs/checkpoint.md). Each test writes a checkpoint record as the node
agent leaves it (phase ``imaged``, with images, commands and sizes) for a bare pod of
1 CPU checkpointed on node-1, then watches what the service (``serve --checkpoints
true``, its worker's restorer) does with it:

* images in a registry: the pod is created at once on node-2, with the registry image and
  ``imagePullPolicy: IfNotPresent``; the hollow kubelet runs it, the record ends
  ``restored`` and the pod's ``Restored`` event names node-2;
* images in node-1's runtime (``localhost/resize-preemption-checkpoint/...``): no pod while
  node-1 is full (five passes of the leading service's worker), whatever node-2 has; once
  ``full`` is gone, the pod is created on node-1 with ``imagePullPolicy: Never``, and the
  kubelet, whose runtime holds no such image, says ``ErrImageNeverPull`` rather than pull;
  ``status`` says meanwhile it comes back on node-1 only;
* images in a registry, node-1 full and node-2 cordoned: no pod, and ``status`` says it
  comes back on node-1 or any able node; node-2 uncordoned, the pod is created there.

A hollow kubelet runs any image, so this proves the service's side; pulling a registry
image on a real node is the node agent's side (docs/checkpoint.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from harness.kubeapi import ApiError
from harness.manifests import PAUSE_IMAGE
from harness.nodes import NodeSpec
from harness.webhook_process import NAMESPACE
from tests.e2e.conftest import NODE, Cluster, Kubectl, StartService, Waiter
from tests.e2e.service_support import events, sample, scrape
from tests.e2e.test_status import run_cli
from webhook.core.checkpoint import (
    CAPABILITY_LABEL,
    CAPABILITY_PREFIX,
    CHECKPOINT_LABEL,
    IMAGE_REPOSITORY,
    MANAGED_BY,
    NODE_LABEL,
    PHASE_LABEL,
    RESTORED_FROM_ANNOTATION,
    record_name,
)

pytestmark = pytest.mark.e2e

OTHER = "node-2"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
UID = "0123456789ab-cdef-4000-8000-000000000001"


@pytest.fixture(scope="module")
def node_2(cluster: Cluster) -> Iterator[str]:
    cluster.nodes.add_node(NodeSpec(OTHER, cpu="4", memory="8Gi"))
    yield OTHER
    cluster.nodes.remove_node(OTHER)


def _put(cluster: Cluster, name: str, labels: dict[str, str], data: dict[str, str]) -> None:
    body = {"metadata": {"name": name, "labels": {**MANAGED_BY, **labels}}, "data": data}
    try:
        cluster.client.create(CONFIGMAPS, body)
    except ApiError as e:
        if e.status != 409:
            raise
        cluster.client.replace(f"{CONFIGMAPS}/{name}", body)


def _publish_able(cluster: Cluster, node: str) -> None:
    """What the node agent of ``node`` publishes on a node with CRIU and containerd 2.3."""
    _put(
        cluster,
        CAPABILITY_PREFIX + node,
        {CAPABILITY_LABEL: "true", NODE_LABEL: node},
        {
            "checkpoint": "true",
            "restore": "true",
            "criu": "4.1.1",
            "runtime": "containerd v2.3.7",
            "message": "",
            "updatedAt": "2026-12-06T07:00:00Z",
        },
    )


def _write_imaged(cluster: Cluster, namespace: str, image: str) -> None:
    """The record of pod ``paused`` (1 CPU, bare) checkpointed on node-1, as its agent
    leaves it once the archive is an image."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "paused",
            "namespace": namespace,
            "uid": UID,
            "labels": {"app": "paused"},
            "annotations": {"resize-preemption.io/on-preempt": "checkpoint"},
        },
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "app",
                    "image": PAUSE_IMAGE,
                    "resources": {"requests": {"cpu": "1", "memory": "256Mi"}},
                }
            ],
        },
    }
    _put(
        cluster,
        record_name(UID),
        {CHECKPOINT_LABEL: "true", NODE_LABEL: NODE, PHASE_LABEL: "imaged"},
        {
            "pod": json.dumps(pod),
            "archives": json.dumps({"app": "/var/lib/kubelet/checkpoints/checkpoint-paused.tar"}),
            "phase": "imaged",
            "checkpointedAt": "2026-12-06T07:01:00Z",
            "images": json.dumps({"app": image}),
            "commands": json.dumps({"app": ["/pause"]}),
            "sizes": json.dumps({"app": 270336}),
            "imagedAt": "2026-12-06T07:01:02Z",
            "message": "",
        },
    )


def _full_pod(namespace: str) -> dict[str, Any]:
    resources = {"cpu": "7500m", "memory": "256Mi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "full", "namespace": namespace},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "app",
                    "image": PAUSE_IMAGE,
                    "resources": {"requests": resources, "limits": dict(resources)},
                }
            ],
        },
    }


@dataclass(frozen=True)
class Scene:
    cluster: Cluster
    metrics_port: int


@pytest.fixture
def scene(
    cluster: Cluster,
    namespace: str,
    node_2: str,
    kubectl: Kubectl,
    start_service: StartService,
) -> Iterator[Scene]:
    """node-1 full, both nodes able, the service running with checkpoints on; the
    ConfigMaps written here are removed when the test ends."""
    kubectl("apply", "-f", "-", input=json.dumps(_full_pod(namespace)))
    kubectl("wait", "--for=condition=Ready", "pod/full", "--timeout=30s")
    service = start_service("--checkpoints", "true")  # makes the service's namespace
    for node in (NODE, node_2):
        _publish_able(cluster, node)
    try:
        yield Scene(cluster, service.metrics_port)
    finally:
        for name in (record_name(UID), CAPABILITY_PREFIX + NODE, CAPABILITY_PREFIX + node_2):
            try:
                cluster.client.delete(f"{CONFIGMAPS}/{name}")
            except ApiError as e:
                if e.status != 404:
                    raise


def _leading(metrics_port: int) -> bool:
    """Whether the service leads: only then does its worker pass, and restore."""
    return 1.0 == sample(scrape(metrics_port), "resize_preemption_leader_election_master_status")


def _pod(cluster: Cluster, namespace: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = cluster.client.get_or_none(
        f"/api/v1/namespaces/{namespace}/pods/paused"
    )
    return found


def _phase(cluster: Cluster) -> str:
    record = cluster.client.get(f"{CONFIGMAPS}/{record_name(UID)}")
    return str(record["data"]["phase"])


def _comes_back_on(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """What ``python -m webhook status -o json`` says of the checkpoint of ``paused``."""
    result = run_cli(
        "status", "--kubeconfig", str(cluster.kubeconfig), "--service-namespace", NAMESPACE,
        "-o", "json",
    )  # fmt: skip
    assert 0 == result.returncode, result.stderr
    (mine,) = [
        c for c in json.loads(result.stdout)["checkpoints"] if c["pod"].startswith(namespace)
    ]
    found: dict[str, Any] = mine["comesBackOn"]
    return found


def _waiting_reason(cluster: Cluster, namespace: str) -> str:
    pod = _pod(cluster, namespace) or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return str(((statuses[0].get("state") or {}).get("waiting") or {}).get("reason") or "")


def _shape(pod: dict[str, Any]) -> tuple[str, str, str, str]:
    container = pod["spec"]["containers"][0]
    return (
        pod["spec"]["nodeName"],
        container["image"],
        container["imagePullPolicy"],
        pod["metadata"]["annotations"][RESTORED_FROM_ANNOTATION],
    )


def test_a_checkpoint_in_a_registry_comes_back_on_another_node_with_room(
    scene: Scene, namespace: str, kubectl: Kubectl, wait_until: Waiter
) -> None:
    cluster = scene.cluster
    image = f"registry.example:5000/rpw/{namespace}/paused/app:0123456789ab"

    _write_imaged(cluster, namespace, image)

    pod = wait_until(lambda: _pod(cluster, namespace), timeout=20, what="the restored pod")
    assert (OTHER, image, "IfNotPresent", record_name(UID)) == _shape(pod)
    wait_until(lambda: _phase(cluster) == "restored", timeout=20, what="the record restored")
    (restored,) = wait_until(lambda: events(kubectl, "paused", "Restored"), what="the event")
    assert restored["message"].startswith(f"Restored on node {OTHER} from {record_name(UID)}: ")
    running = _pod(cluster, namespace)
    assert running is not None
    assert (OTHER, "Running") == (running["spec"]["nodeName"], running["status"]["phase"])


def test_a_checkpoint_in_its_nodes_runtime_waits_for_its_own_node(
    scene: Scene, namespace: str, kubectl: Kubectl, wait_until: Waiter
) -> None:
    cluster = scene.cluster
    image = f"{IMAGE_REPOSITORY}/{namespace}/paused/app:0123456789ab"

    wait_until(lambda: _leading(scene.metrics_port), timeout=30, what="the service leading")
    _write_imaged(cluster, namespace, image)
    # The leader's worker passes every second: five of them leave it where it was.
    time.sleep(5)

    assert None is _pod(cluster, namespace)
    assert "imaged" == _phase(cluster)
    assert {
        "node": NODE,
        "orAnyAbleNode": False,
        "why": f"its images are in {NODE}'s runtime only",
    } == _comes_back_on(cluster, namespace)

    kubectl("delete", "pod", "full", "--wait=true")

    pod = wait_until(lambda: _pod(cluster, namespace), timeout=20, what="the restored pod")
    assert (NODE, image, "Never", record_name(UID)) == _shape(pod)
    wait_until(lambda: _phase(cluster) == "restoring", timeout=20, what="the record restoring")
    # The hollow runtime holds no image it did not pull: with Never, the kubelet says so.
    wait_until(
        lambda: "ErrImageNeverPull" == _waiting_reason(cluster, namespace),
        timeout=20,
        what="the kubelet refusing to pull",
    )


def test_a_checkpoint_in_a_registry_waits_for_room_somewhere_then_takes_it(
    scene: Scene, namespace: str, wait_until: Waiter
) -> None:
    cluster = scene.cluster
    image = f"registry.example:5000/rpw/{namespace}/paused/app:0123456789ab"
    cluster.client.patch(f"/api/v1/nodes/{OTHER}", {"spec": {"unschedulable": True}})
    try:
        wait_until(lambda: _leading(scene.metrics_port), timeout=30, what="the service leading")
        _write_imaged(cluster, namespace, image)
        time.sleep(5)  # five passes: node-1 full, node-2 cordoned

        assert None is _pod(cluster, namespace)
        assert {"node": NODE, "orAnyAbleNode": True, "why": ""} == _comes_back_on(
            cluster, namespace
        )
    finally:
        cluster.client.patch(f"/api/v1/nodes/{OTHER}", {"spec": {"unschedulable": None}})

    pod = wait_until(lambda: _pod(cluster, namespace), timeout=20, what="the restored pod")
    assert (OTHER, image, "IfNotPresent", record_name(UID)) == _shape(pod)
