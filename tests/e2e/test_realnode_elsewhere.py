"""A checkpoint in a registry comes back on another real node, end to end: node-1 of the
session's real cluster and node-2, a second real kubelet on its own containerd beside it
(:meth:`harness.realcluster.RealCluster.add_real_node`), both trusting the registry.

The chart is installed as in ``test_realnode_registry.py`` (the webhook from its image, the
node agent with ``checkpoint.registry``), its pods on node-1; node-2's agent is the chart's
DaemonSet rendered on node-2's paths (:meth:`RealCluster.agent_daemonset`), since the two
nodes of one machine cannot share the host paths a real cluster's nodes would.

An opted-in bare victim on node-1 counting in a shell variable is checkpointed for a
higher-priority pod's resize, and its image pushed. Room on node-1 does not return (the
preemptor stays big) while node-2 has room and its agent says it can restore: the service
creates the pod again on node-2 from the registry's image, node-2's kubelet pulls it, CRIU
restores it there, and its count goes on. Afterwards the record is gone and the registry
has no manifest.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from harness.chart import NAMESPACE as SERVICE_NAMESPACE
from harness.realcluster import RealCluster
from harness.realnode import NODE_NAME, RealNode
from harness.registry import TestRegistry
from tests.e2e.conftest import Waiter
from tests.e2e.records_support import nodes_path
from tests.e2e.test_realnode import (
    classes,  # noqa: F401 - the module's PriorityClasses
    cpu_running,
    events,
    read,
)
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
from tests.e2e.test_realnode_registry import (
    PATH,
    chart_pushing_to,
    registry,  # noqa: F401 - the registry on node-1's address, trusted by node-1
    registry_values,
)
from webhook.agent.runtime import Containerd

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

OTHER = "node-2"


def abilities(cluster: RealCluster, node: str) -> dict[str, str] | None:
    found = cluster.client.get_or_none(f"{nodes_path(SERVICE_NAMESPACE)}/{node}")
    return dict(found.get("status") or {}) or None if found else None


@pytest.fixture(scope="module")
def elsewhere(
    real_cluster: RealCluster,
    registry: TestRegistry,  # noqa: F811
) -> Iterator[tuple[RealNode, str]]:
    """node-2 started beside node-1 and trusting the registry, the chart pushing to the
    registry with node-1's agent, node-2's agent able; (node-2, the repository). At the
    end node-2 is gone (its Node too) and the chart is back as the other tests know it."""
    try:
        node = real_cluster.add_real_node()
        node.trust_registry(registry.host, registry.ca_file.read_bytes(), registry.basic_header())
        pinned = {"checkpoint.nodeSelector": {"kubernetes.io/hostname": NODE_NAME}}
        with chart_pushing_to(real_cluster, registry, pinned) as repository:
            agent = start_agent(real_cluster, node, registry, repository)
            try:
                yield node, repository
            finally:
                real_cluster.client.delete(agent)
    finally:
        try:
            path = f"{nodes_path(SERVICE_NAMESPACE)}/{OTHER}"
            if real_cluster.client.get_or_none(path) is not None:
                real_cluster.client.delete(path)
            real_cluster.remove_real_node(OTHER)
        finally:
            real_cluster.install_chart()


def start_agent(
    cluster: RealCluster,
    node: RealNode,
    registry: TestRegistry,  # noqa: F811
    repository: str,
) -> str:
    """node-2's agent (the chart's DaemonSet on its paths) running and able; the
    DaemonSet's path. Not the release's: helm's uninstall leaves it."""
    daemonset = cluster.agent_daemonset(node, registry_values(registry, repository))
    daemonsets = f"/apis/apps/v1/namespaces/{SERVICE_NAMESPACE}/daemonsets"
    cluster.client.create(daemonsets, daemonset)
    deadline = time.monotonic() + 120
    while (capability := abilities(cluster, node.name)) is None:
        assert time.monotonic() < deadline, f"the node agent of {node.name} published nothing"
        time.sleep(0.5)
    assert ("true", "true") == (capability["checkpoint"], capability["restore"]), capability
    time.sleep(2.0)  # every replica lists the abilities each second: it has read them
    return f"{daemonsets}/{daemonset['metadata']['name']}"


def test_a_registry_checkpoint_comes_back_on_the_other_real_node_and_counts_on(
    real_cluster: RealCluster,
    real_namespace: str,
    classes: dict[str, str],  # noqa: F811
    registry: TestRegistry,  # noqa: F811
    elsewhere: tuple[RealNode, str],
    wait_until: Waiter,
) -> None:
    ns = real_namespace
    other, repository = elsewhere
    # A pod of node-2 reaches the registry on node-1's address, as one of node-1 does.
    assert "connected" == connect_from(real_cluster, OTHER, registry.host)
    walk = start_walkthrough(real_cluster, ns, classes, COUNTER)
    wait_until(lambda: count(real_cluster, ns) >= 5, timeout=30, what="a few counts")
    old = read(real_cluster, ns, VICTIM)
    assert old is not None and NODE_NAME == old["spec"]["nodeName"]
    old_uid = old["metadata"]["uid"]
    before = count(real_cluster, ns)

    # The preemptor grows and stays grown: room on node-1 never returns.
    resize(real_cluster, ns, walk.target)
    wait_until(
        lambda: cpu_running(read(real_cluster, ns, PREEMPTOR)) == walk.target,
        timeout=60,
        what=f"the kubelet to actuate {walk.target}m",
    )
    reference = f"{repository}/{ns}/{VICTIM}/main:{old_uid[:12]}"
    pulls = f"GET /v2/{PATH}/{ns}/{VICTIM}/main/manifests/"

    pod, first = restored_counting_on(real_cluster, ns, old_uid, before, wait_until)
    (container,) = pod["spec"]["containers"]
    assert (OTHER, reference) == (pod["spec"]["nodeName"], container["image"])
    assert registry.log_text().count(pulls) > 0
    assert reference in runtime_of(other).image_digests()  # node-2's kubelet pulled it
    pulled = events(real_cluster, ns, VICTIM, "Pulled")
    assert [e for e in pulled if f'"{reference}"' in e["message"]], pulled
    restored = [e["message"] for e in events(real_cluster, ns, VICTIM, "Restored")]
    assert [m for m in restored if m.startswith(f"Restored on node {OTHER} from ")], restored
    assert walk.target == cpu_running(read(real_cluster, ns, PREEMPTOR))  # still grown

    wait_until(lambda: records(real_cluster) == [], timeout=60, what="the checkpoint gone")
    assert 404 == registry.manifest_status(reference)
    # Pushed, not imported, not pulled there: node-1's containerd holds no copy of it.
    assert [] == [n for n in runtime_of(real_cluster.node).image_digests() if "checkpoint" in n]
    assert count(real_cluster, ns) > first  # the restored pod runs on without its manifest


def connect_from(cluster: RealCluster, node: str, host: str) -> str:
    """What the agent's pod on ``node`` prints after a TCP connection to ``host``
    (``address:port``)."""
    pods = cluster.client.get(
        f"/api/v1/namespaces/{SERVICE_NAMESPACE}/pods", fieldSelector=f"spec.nodeName={node}"
    )["items"]
    (agent,) = (p["metadata"]["name"] for p in pods)
    address, port = host.rsplit(":", 1)
    script = (
        f"import socket; socket.create_connection(({address!r}, {port}), 5).close(); "
        "print('connected')"
    )
    return cluster.exec(SERVICE_NAMESPACE, agent, ["python", "-c", script]).strip()


def runtime_of(node: RealNode | None) -> Containerd:
    """What the agent reads of the node's containerd."""
    assert node is not None
    return Containerd(ctr=str(node.stack.path("ctr")), address=str(node.paths.containerd_socket))
