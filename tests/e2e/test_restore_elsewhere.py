"""Where a checkpointed pod comes back, end to end: the service process against the real
API server and two hollow kubelets.

node-1 (8 CPU) is full: ``full`` holds 7500m of it. node-2 (4 CPU) is empty. Both nodes'
agents published that they can checkpoint and restore (the ``CheckpointNode`` of each,
docs/checkpoint.md). Each test writes a checkpoint record as the node
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

from harness.manifests import PAUSE_IMAGE
from harness.nodes import NodeSpec
from harness.webhook_process import NAMESPACE
from tests.e2e.conftest import NODE, Cluster, Kubectl, StartService, Waiter
from tests.e2e.records_support import (
    nodes_path,
    publish,
    put_record,
    records_path,
    remove,
    status_of,
)
from tests.e2e.service_support import events, sample, scrape
from tests.e2e.test_status import run_cli
from webhook.core.checkpoint import (
    IMAGE_REPOSITORY,
    RESTORED_FROM_ANNOTATION,
    CheckpointRecord,
    NodeCheckpointing,
    Phase,
    record_name,
)

pytestmark = pytest.mark.e2e

OTHER = "node-2"
UID = "0123456789ab-cdef-4000-8000-000000000001"


@pytest.fixture(scope="module")
def node_2(cluster: Cluster) -> Iterator[str]:
    cluster.nodes.add_node(NodeSpec(OTHER, cpu="4", memory="8Gi"))
    yield OTHER
    cluster.nodes.remove_node(OTHER)


def _publish_able(cluster: Cluster, node: str) -> None:
    """What the node agent of ``node`` publishes on a node with CRIU and containerd 2.3."""
    ability = NodeCheckpointing(node, True, True, "4.1.1", "containerd v2.3.7")
    publish(cluster.client, NAMESPACE, ability, time.time())


def _write_imaged(cluster: Cluster, namespace: str, image: str, **pod_spec: Any) -> None:
    """The record of pod ``paused`` (1 CPU, bare) checkpointed on node-1, as its agent
    leaves it once the archive is an image (``image``, ``{tag}`` the uid's)."""
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
            **pod_spec,
        },
    }
    record = CheckpointRecord(
        UID,
        NODE,
        Phase.IMAGED,
        pod,
        {"app": "/var/lib/kubelet/checkpoints/checkpoint-paused.tar"},
        {"app": image.replace("{tag}", UID[:12])},
        {"app": ["/pause"]},
        {"app": 270336},
        "2026-12-06T07:01:00Z",
        imaged_at="2026-12-06T07:01:02Z",
    )
    put_record(cluster.client, NAMESPACE, record)


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
    records and reports written here are removed when the test ends."""
    kubectl("apply", "-f", "-", input=json.dumps(_full_pod(namespace)))
    kubectl("wait", "--for=condition=Ready", "pod/full", "--timeout=30s")
    service = start_service("--checkpoints", "true")  # makes the service's namespace
    for node in (NODE, node_2):
        _publish_able(cluster, node)
    try:
        yield Scene(cluster, service.metrics_port)
    finally:
        remove(cluster.client, f"{records_path(NAMESPACE)}/{record_name(UID)}")
        for node in (NODE, node_2):
            remove(cluster.client, f"{nodes_path(NAMESPACE)}/{node}")


def _leading(metrics_port: int) -> bool:
    """Whether the service leads: only then does its worker pass, and restore."""
    return 1.0 == sample(scrape(metrics_port), "resize_preemption_leader_election_master_status")


def _pod(cluster: Cluster, namespace: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = cluster.client.get_or_none(
        f"/api/v1/namespaces/{namespace}/pods/paused"
    )
    return found


def _phase(cluster: Cluster) -> str:
    return str(status_of(cluster.client, NAMESPACE, record_name(UID)).get("phase", ""))


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


@pytest.mark.service_modes
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


@pytest.mark.parametrize(
    ("image", "pod_spec", "why"),
    [
        pytest.param(
            "registry.example:5000/rpw/{ns}/victim2/app:{tag}",
            {},
            "container app's image registry.example:5000/rpw/{ns}/victim2/app:0123456789ab "
            "is not its checkpoint's",
            id="another-pods-image",
        ),
        pytest.param(
            "registry.example:5000/rpw/{ns}/paused/app:{tag}",
            {"nodeName": OTHER},
            f"its pod did not run on its node {NODE}",
            id="a-pod-of-another-node",
        ),
    ],
)
def test_a_record_that_is_not_what_was_taken_is_abandoned_and_no_pod_made(
    scene: Scene, namespace: str, wait_until: Waiter, image: str, pod_spec: dict[str, Any], why: str
) -> None:
    cluster = scene.cluster

    _write_imaged(cluster, namespace, image.replace("{ns}", namespace), **pod_spec)

    wait_until(lambda: _phase(cluster) == "abandoned", timeout=20, what="the record abandoned")
    message = status_of(cluster.client, NAMESPACE, record_name(UID))["message"]
    assert f"not restored: {why.replace('{ns}', namespace)}" == message
    time.sleep(2)  # two more passes of the worker
    assert None is _pod(cluster, namespace)


def test_a_restore_never_goes_to_a_node_whose_taints_it_does_not_tolerate(
    scene: Scene, namespace: str, kubectl: Kubectl, wait_until: Waiter
) -> None:
    cluster = scene.cluster
    taint = {"key": "dedicated", "value": "control-plane", "effect": "NoSchedule"}
    image = f"{IMAGE_REPOSITORY}/{namespace}/paused/app:0123456789ab"
    kubectl("delete", "pod", "full", "--wait=true")  # node-1 has room
    cluster.client.patch(f"/api/v1/nodes/{NODE}", {"spec": {"taints": [taint]}})
    try:
        wait_until(lambda: _leading(scene.metrics_port), timeout=30, what="the service leading")
        _write_imaged(cluster, namespace, image)
        time.sleep(5)  # five passes

        assert None is _pod(cluster, namespace)
        assert "imaged" == _phase(cluster)
    finally:
        cluster.client.patch(f"/api/v1/nodes/{NODE}", {"spec": {"taints": None}})

    pod = wait_until(lambda: _pod(cluster, namespace), timeout=20, what="the restored pod")
    assert (NODE, image, "Never", record_name(UID)) == _shape(pod)
