"""Pause, don't kill, with the checkpoint image in a registry, end to end on the real node:
the webhook from its image, the node agent from the chart's DaemonSet with
``checkpoint.registry`` (the repository, the registry's CA inline, a
``kubernetes.io/dockerconfigjson`` Secret), and a real registry (CNCF Distribution, TLS
from its own CA, basic authentication) on the node's address.

containerd pulls through ``hosts.toml`` (:meth:`harness.realnode.RealNode.trust_registry`:
the CA and the credentials as a header), as docs/checkpoint.md tells an operator to give
their nodes.

A bare opted-in pod counting in a shell variable is checkpointed; its image is pushed to
the registry, and is not in containerd's image store before the restore; the restored pod
names the registry's reference and the kubelet pulls it; the count goes on; afterwards the
record is gone, the registry answers 404 for the manifest and containerd holds no copy
under any of the names the CRI gives a pulled image (tag, digest, image id).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from harness.chart import NAMESPACE as SERVICE_NAMESPACE
from harness.realcluster import RealCluster
from harness.realnode import NODE_IP, NODE_NAME
from harness.registry import TestRegistry
from tests.e2e.conftest import Waiter
from tests.e2e.records_support import nodes_path
from tests.e2e.test_realnode import (
    classes,  # noqa: F401 - the module's PriorityClasses
    cpu_running,
    events,
    read,
)
from tests.e2e.test_realnode_checkpoint import capability_of, terminating
from tests.e2e.test_realnode_pause import (
    COUNTER,
    PREEMPTOR,
    VICTIM,
    count,
    records,
    resize,
    restored_counting_on,
    start_walkthrough,
)
from webhook.agent.runtime import Containerd
from webhook.core.checkpoint import RESTORED_FROM_ANNOTATION

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

AUTH_SECRET = "rpw-registry-push"
PATH = "rpw-checkpoints"


@pytest.fixture(scope="module")
def registry(
    real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TestRegistry]:
    """The registry on the node's address (the agent's pod reaches it there, containerd
    too), trusted by the node's containerd."""
    node = real_cluster.node
    assert node is not None
    with TestRegistry(tmp_path_factory.mktemp("registry"), address=NODE_IP) as running:
        hosts = node.trust_registry(
            running.host, running.ca_file.read_bytes(), running.basic_header()
        )
        try:
            yield running
        finally:
            hosts.unlink(missing_ok=True)


def push_secret(registry: TestRegistry) -> dict[str, Any]:
    config = json.dumps(registry.docker_config()).encode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": AUTH_SECRET, "namespace": SERVICE_NAMESPACE},
        "data": {".dockerconfigjson": base64.b64encode(config).decode()},
    }


@contextmanager
def chart_pushing_to(
    cluster: RealCluster, registry: TestRegistry, extra_values: dict[str, Any] | None = None
) -> Iterator[str]:
    """The chart installed with checkpoints pushed to the registry (``extra_values`` over
    it), node-1's agent able, node-1's pods settled; the repository. Uninstalled
    afterwards, with its Secret and node-1's abilities."""
    client = cluster.client
    secrets = f"/api/v1/namespaces/{SERVICE_NAMESPACE}/secrets"
    cluster.uninstall_chart()
    repository = f"{registry.host}/{PATH}"
    try:
        if client.get_or_none(f"/api/v1/namespaces/{SERVICE_NAMESPACE}") is None:
            cluster.create_namespace(SERVICE_NAMESPACE)
        if client.get_or_none(f"{secrets}/{AUTH_SECRET}") is not None:
            client.delete(f"{secrets}/{AUTH_SECRET}")
        client.create(secrets, push_secret(registry))
        cluster.install_chart({
            **cluster.checkpoint_values(),
            **registry_values(registry, repository),
            **(extra_values or {}),
        })  # fmt: skip
        deadline = time.monotonic() + 120
        while (capability := capability_of(cluster, SERVICE_NAMESPACE)) is None:
            assert time.monotonic() < deadline, "the node agent published no abilities"
            time.sleep(0.5)
        time.sleep(2.0)  # every replica lists the abilities each second: it has read them
        assert ("true", "true") == (capability["checkpoint"], capability["restore"]), capability
        # The walkthrough sizes its pods to the CPU the node's pods request: the release
        # uninstalled above must have left it, or the preemptor's room shows up later.
        while terminating(cluster):
            assert time.monotonic() < deadline, f"pods still terminating: {terminating(cluster)}"
            time.sleep(0.5)
        yield repository
    finally:
        cluster.uninstall_chart()
        for path in (
            f"{nodes_path(SERVICE_NAMESPACE)}/{NODE_NAME}",
            f"{secrets}/{AUTH_SECRET}",
        ):
            if client.get_or_none(path) is not None:
                client.delete(path)


def registry_values(registry: TestRegistry, repository: str) -> dict[str, Any]:
    """The chart's values of the agent's registry: where, its CA, the push credentials."""
    return {
        "checkpoint.registry.repository": repository,
        "checkpoint.registry.ca": registry.ca_file.read_text(),
        "checkpoint.registry.authSecret": AUTH_SECRET,
    }


@pytest.fixture(scope="module")
def pushing(real_cluster: RealCluster, registry: TestRegistry) -> Iterator[str]:
    """The chart installed with checkpoints pushed to the registry; the repository. Put
    back as the other tests know it afterwards."""
    try:
        with chart_pushing_to(real_cluster, registry) as repository:
            yield repository
    finally:
        real_cluster.install_chart()


def containerd_images(cluster: RealCluster) -> list[str]:
    node = cluster.node
    assert node is not None
    return list(node.ctr("images", "list", "--quiet").stdout.split())


def test_a_checkpoint_pushed_to_the_registry_is_pulled_back_and_goes_on_counting(
    real_cluster: RealCluster,
    real_namespace: str,
    classes: dict[str, str],  # noqa: F811
    registry: TestRegistry,
    pushing: str,
    wait_until: Waiter,
) -> None:
    ns = real_namespace
    walk = start_walkthrough(real_cluster, ns, classes, COUNTER)
    wait_until(lambda: count(real_cluster, ns) >= 5, timeout=30, what="a few counts")
    old = read(real_cluster, ns, VICTIM)
    assert old is not None
    old_uid = old["metadata"]["uid"]
    before = count(real_cluster, ns)

    resize(real_cluster, ns, walk.target)

    wait_until(
        lambda: cpu_running(read(real_cluster, ns, PREEMPTOR)) == walk.target,
        timeout=60,
        what=f"the kubelet to actuate {walk.target}m",
    )
    story = [
        (e["reason"], e["message"])
        for e in real_cluster.client.get(
            f"/api/v1/namespaces/{ns}/events", fieldSelector=f"involvedObject.name={VICTIM}"
        )["items"]
    ]
    assert 1 == [reason for reason, _ in story].count("Checkpointed"), story

    def imaged() -> dict[str, Any] | None:
        (record,) = records(real_cluster)
        status: dict[str, Any] = record.get("status") or {}
        return status if status.get("phase") == "imaged" else None

    data = wait_until(imaged, timeout=60, interval=0.5, what="the record imaged")
    reference = f"{pushing}/{ns}/{VICTIM}/main:{old_uid[:12]}"
    assert {"main": reference} == data["images"]
    assert 200 == registry.manifest_status(reference)
    image_id = registry.manifest(reference)["config"]["digest"]
    # Pushed, not imported: the node holds no image of it until a kubelet pulls it.
    assert [] == [r for r in containerd_images(real_cluster) if "checkpoint" in r]
    pulls_before = registry.log_text().count(f"GET /v2/{PATH}/{ns}/{VICTIM}/main/manifests/")

    # Room returns: the preemptor back to its size. The victim comes back from the registry.
    resize(real_cluster, ns, walk.high)

    pod, first = restored_counting_on(real_cluster, ns, old_uid, before, wait_until)
    (container,) = pod["spec"]["containers"]
    assert reference == container["image"]
    assert "Never" != container["imagePullPolicy"]
    assert f"rpw-checkpoint-{old_uid}" == pod["metadata"]["annotations"][RESTORED_FROM_ANNOTATION]
    pulled = events(real_cluster, ns, VICTIM, "Pulled")
    assert [e for e in pulled if f'"{reference}"' in e["message"]], pulled
    pulls = registry.log_text().count(f"GET /v2/{PATH}/{ns}/{VICTIM}/main/manifests/")
    assert pulls > pulls_before

    wait_until(lambda: records(real_cluster) == [], timeout=60, what="the checkpoint gone")
    # What the agent's sweep reads of containerd: each image's manifest digest.
    node = real_cluster.node
    assert node is not None
    runtime = Containerd(ctr=str(node.stack.path("ctr")), address=str(node.paths.containerd_socket))
    workload = real_cluster.image("workload")
    digests = runtime.image_digests()
    assert digests[workload].startswith("sha256:"), digests
    assert {d for n, d in digests.items() if n.startswith(f"{workload.split(':')[0]}@")} <= {
        digests[workload]
    }
    assert 404 == registry.manifest_status(reference)
    # Neither the pulled copy's names (tag, name@digest) nor its image id are left.
    listed = containerd_images(real_cluster)
    assert ([], False) == ([r for r in listed if "checkpoint" in r], image_id in listed)
    assert [] == sorted(p.name for p in (node.paths.kubelet_root / "checkpoints").iterdir())
    assert count(real_cluster, ns) > first  # the restored pod runs on without its image
