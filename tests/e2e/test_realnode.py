"""The real node: a pod runs in a real container, a resize rewrites its cgroup, and the
webhook runs from its own image as the chart deploys it.

These need root, overlayfs and the cpu, memory and pids cgroup controllers; the
``real_cluster`` fixture skips them, with the preflight's reason, only where those are
missing."""

from __future__ import annotations

import json
import re

import pytest

from harness.chart import FULLNAME, NAMESPACE, ready_endpoints
from harness.realcluster import RealCluster
from harness.realnode import NODE_NAME
from tests.e2e.conftest import Waiter

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]
#: A process that ends on SIGTERM, as a workload does.
SCRIPT = "trap 'exit 0' TERM; while true; do sleep 1; done"


def pod(name: str, image: str, cpu: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE_NAME,
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "app",
                    "image": image,
                    "command": ["sh", "-c", SCRIPT],
                    "resources": {
                        "requests": {"cpu": cpu, "memory": "64Mi"},
                        "limits": {"cpu": cpu, "memory": "64Mi"},
                    },
                }
            ],
        },
    }


def test_a_resize_rewrites_the_containers_cpu_quota(
    real_cluster: RealCluster, real_namespace: str, wait_until: Waiter
) -> None:
    manifest = json.dumps(pod("grows", real_cluster.image("workload"), "500m"))
    real_cluster.kubectl("apply", "-n", real_namespace, "-f", "-", input=manifest)
    real_cluster.kubectl(
        "wait", "-n", real_namespace, "--for=condition=Ready", "pod/grows", "--timeout=60s"
    )
    # The container's command is PID 1 of its own PID namespace.
    init = real_cluster.exec(real_namespace, "grows", ["cat", "/proc/1/cmdline"])
    assert ["sh", "-c", SCRIPT] == init.split("\0")[:3]
    assert 500 == real_cluster.cpu_quota(real_namespace, "grows").millicores

    patch = {"spec": {"containers": [{"name": "app", "resources": {
        "requests": {"cpu": "800m"}, "limits": {"cpu": "800m"}}}]}}  # fmt: skip
    real_cluster.kubectl(
        "patch", "-n", real_namespace, "pod", "grows", "--subresource", "resize",
        "--patch", json.dumps(patch),
    )  # fmt: skip

    def actuated() -> bool:
        status = real_cluster.client.get(f"/api/v1/namespaces/{real_namespace}/pods/grows")
        resources = status["status"]["containerStatuses"][0].get("resources", {})
        return resources.get("limits", {}).get("cpu") == "800m"

    wait_until(actuated, timeout=30, what="the kubelet to actuate 800m")
    assert 800 == real_cluster.cpu_quota(real_namespace, "grows").millicores


def test_the_webhook_runs_from_its_image_behind_its_service(real_cluster: RealCluster) -> None:
    pods = real_cluster.client.get(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        labelSelector=f"app.kubernetes.io/name={FULLNAME}",
    )["items"]
    assert 2 == len(pods)
    product = real_cluster.image("product")
    for found in pods:
        status = found["status"]["containerStatuses"][0]
        assert (NODE_NAME, "Running", True) == (
            found["spec"]["nodeName"],
            found["status"]["phase"],
            status["ready"],
        )
        assert product == status["image"]
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", status["imageID"]), status["imageID"]
    assert 1 == len({p["status"]["containerStatuses"][0]["imageID"] for p in pods})
    assert 2 == ready_endpoints(real_cluster.client, NAMESPACE)
    # The image's user on its read-only root filesystem.
    name = pods[0]["metadata"]["name"]
    out = real_cluster.exec(NAMESPACE, name, ["python", "-c", _WHO_AND_ROOT])
    assert "65532 read-only" == out.strip()


_WHO_AND_ROOT = (
    "import os\n"
    "try:\n"
    "    open('/probe', 'w')\n"
    "    root = 'writable'\n"
    "except OSError:\n"
    "    root = 'read-only'\n"
    "print(os.getuid(), root)\n"
)
