"""Checkpoint and restore on the real node, the node side alone: the test does what the
service does (calls the kubelet's checkpoint API, writes the record, deletes and recreates
the pod), the node agent runs as a host process, as its DaemonSet would on a node.

* a pod counting in a shell variable is checkpointed; the agent turns the archive into an
  image (``imaged``: images, commands, sizes) and deletes the archive; the pod created again
  under its name from that image and command goes on counting from where it was, not from 1;
  once the record says ``restored``, the image (under its id too), the archive and the
  record are gone;
* the same with the agent of the chart's DaemonSet (``checkpoint.enabled``), reading the
  records of the webhook's namespace;
* the agent on a node without CRIU publishes ``checkpoint: "false"`` and says why.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.chart import FULLNAME
from harness.chart import NAMESPACE as CHART_NAMESPACE
from harness.kubectl import Kubectl
from harness.realcluster import RealCluster
from harness.realnode import NODE_IP, NODE_NAME
from tests.e2e.conftest import Waiter
from tests.e2e.records_support import nodes_path, put_record, records_path
from tests.e2e.service_support import account_kubeconfig
from webhook.agent.runtime import Containerd
from webhook.core.checkpoint import (
    RESTORED_FROM_ANNOTATION,
    CheckpointRecord,
    Phase,
    image_reference,
    record_object,
)

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]
#: Counts in a shell variable (process memory, not a file) and writes the count each second.
COUNTER = "n=0; while true; do n=$((n+1)); echo $n > /tmp/count; sleep 1; done"
POD = "counter"
CONTAINER = "main"


def counter_pod(image: str, command: list[str], *, pull: str = "IfNotPresent") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "labels": {"app": POD}},
        "spec": {
            "nodeName": NODE_NAME,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": CONTAINER,
                    "image": image,
                    "imagePullPolicy": pull,
                    "command": command,
                    "args": [],
                    "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}},
                }
            ],
        },
    }


def agent_command(cluster: RealCluster, namespace: str, *extra: str) -> list[str]:
    """``python -m webhook node-agent`` as the node's root process, on this node's paths."""
    node = cluster.node
    assert node is not None
    stack, paths = node.stack, node.paths
    return [
        sys.executable, "-m", "webhook", "node-agent",
        "--node", NODE_NAME,
        "--namespace", namespace,
        "--checkpoint-dir", str(paths.kubelet_root / "checkpoints"),
        "--ctr", str(stack.path("ctr")),
        "--criu", str((stack.criu_dir or Path("/nonexistent")) / "criu"),
        "--containerd-address", str(paths.containerd_socket),
        "--containerd-config", str(paths.containerd_config),
        "--kubeconfig", str(cluster.kubeconfig),
        "--poll-interval", "0.5",
        *extra,
    ]  # fmt: skip


@pytest.fixture
def agent(real_cluster: RealCluster, real_namespace: str, tmp_path: Path) -> Iterator[Path]:
    log = tmp_path / "agent.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            agent_command(real_cluster, real_namespace), stdout=out, stderr=subprocess.STDOUT
        )
    yield log
    process.terminate()
    process.wait(timeout=10)


def kubelet_checkpoint(cluster: RealCluster, namespace: str) -> str:
    """``POST /checkpoint/<ns>/<pod>/<container>`` on the kubelet's port, as the service
    calls it, as the admin; the archive's path."""
    node = cluster.client.get(f"/api/v1/nodes/{NODE_NAME}")
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    url = f"https://{NODE_IP}:{port}/checkpoint/{namespace}/{POD}/{CONTAINER}"
    request = urllib.request.Request(url, method="POST")
    context = cluster.kubelet_context()
    with urllib.request.urlopen(request, context=context, timeout=60) as response:
        items: list[str] = json.load(response)["items"]
    assert 1 == len(items)
    return items[0]


def count(cluster: RealCluster, namespace: str) -> int:
    return int(cluster.exec(namespace, POD, ["cat", "/tmp/count"]).strip() or 0)


def running(cluster: RealCluster, namespace: str) -> bool:
    pod = cluster.client.get_or_none(f"/api/v1/namespaces/{namespace}/pods/{POD}")
    return bool(pod) and pod["status"].get("phase") == "Running"


def write_record(
    cluster: RealCluster,
    namespace: str,
    pod: dict[str, Any],
    archive: str,
    service: Kubectl | None = None,
) -> str:
    """The record as the service writes it after the checkpoint (phase ``archived``), as
    ``service`` (its account, which alone may under the chart's policy) or as the admin."""
    uid = pod["metadata"]["uid"]
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    taken = {"metadata": pod["metadata"], "spec": pod["spec"]}
    record = CheckpointRecord(
        uid, NODE_NAME, Phase.ARCHIVED, taken, {CONTAINER: archive}, checkpointed_at=at
    )
    if service is None:
        put_record(cluster.client, namespace, record)
    else:
        service("create", "-f", "-", input=json.dumps(record_object(record)))
        status = json.dumps({"status": {"phase": "archived"}})
        service(
            "patch",
            "podcheckpoint",
            record.name,
            "--subresource=status",
            "--type=merge",
            "-p",
            status,
        )
    return record.name


def pause_and_resume(
    cluster: RealCluster,
    ns: str,
    records: str,
    wait_until: Waiter,
    agent: str,
    service: Kubectl | None = None,
) -> None:
    """The whole round on the node, the service's part played here: a counting pod of
    ``ns`` checkpointed, its record written to ``records`` (where the agent reads them),
    imaged by the agent, the pod made again from the image, going on counting; then the
    record says ``restored`` and the agent removes the image, the archive and the record.
    With ``service`` (the service's account, the chart's service running) the test writes
    the record and creates the pod as that account, and the service ends the record."""
    client, node = cluster.client, cluster.node
    assert node is not None
    checkpoints = node.paths.kubelet_root / "checkpoints"
    pods = f"/api/v1/namespaces/{ns}/pods"
    client.create(pods, counter_pod(cluster.image("workload"), ["sh", "-c", COUNTER]))
    wait_until(lambda: running(cluster, ns), timeout=60, what="the counter to run")
    wait_until(lambda: count(cluster, ns) >= 6, timeout=30, what="a few counts")
    before = count(cluster, ns)
    archive = kubelet_checkpoint(cluster, ns)
    pod = client.get(f"{pods}/{POD}")
    client.delete(f"{pods}/{POD}", {"gracePeriodSeconds": 0})
    assert checkpoints == Path(archive).parent
    name = write_record(cluster, records, pod, archive, service)
    record_path = f"{records_path(records)}/{name}"

    def imaged() -> dict[str, Any] | None:
        data: dict[str, Any] = client.get(record_path).get("status") or {}
        assert "failed" != data.get("phase"), data.get("message")
        return data if data.get("phase") == "imaged" else None

    data = wait_until(imaged, timeout=120, interval=0.5, what=f"the record imaged ({agent})")
    reference = image_reference(ns, POD, CONTAINER, pod["metadata"]["uid"])
    assert {CONTAINER: reference} == data["images"]
    assert {CONTAINER: ["sh", "-c", COUNTER]} == data["commands"]
    assert 0 < data["sizes"][CONTAINER]
    # The agent deletes the archive right after the record says imaged, never before.
    wait_until(lambda: not Path(archive).exists(), timeout=10, what="the archive deleted")
    runtime = Containerd(ctr=str(node.stack.path("ctr")), address=str(node.paths.containerd_socket))
    digests = runtime.image_digests()
    assert reference in digests
    target = digests[reference]

    # Deleted with no grace period, but the kubelet confirms it on its own sync: under load
    # (and with the agent importing the image meanwhile) that took more than 30 s once.
    wait_until(lambda: client.get_or_none(f"{pods}/{POD}") is None, timeout=90, what="pod gone")
    restored = counter_pod(reference, data["commands"][CONTAINER], pull="Never")
    restored["metadata"]["annotations"] = {RESTORED_FROM_ANNOTATION: name}
    if service is None:
        client.create(pods, restored)
    else:
        service("create", "-n", ns, "-f", "-", input=json.dumps(restored))
    wait_until(lambda: running(cluster, ns), timeout=60, what="the restored pod to run")
    # /tmp/count comes back with the writable layer too: only a count past it, written by
    # the process after the restore, shows the process kept its memory. A process started
    # afresh would be at 2 or 3 by now, far below `before`.
    time.sleep(2.5)
    first = count(cluster, ns)
    assert before < first <= before + 20, (before, first)
    wait_until(lambda: count(cluster, ns) > first, timeout=10, what="the count to go on")

    if service is None:
        client.patch(f"{record_path}/status", {"status": {"phase": "restored"}})
    # else the chart's service runs with checkpoints on: it takes the pod made from the
    # record as its restore and ends the record itself once the pod runs.
    wait_until(lambda: client.get_or_none(record_path) is None, timeout=30, what="record gone")
    # Neither under its reference nor under the id the CRI named it by: that name alone
    # would keep the archive's bytes and its unpacked layer on the node.
    assert [] == [n for n, d in runtime.image_digests().items() if d == target]
    assert [] == sorted(p.name for p in checkpoints.iterdir())
    assert running(cluster, ns), "the restored pod runs on without its image"


def capability_of(cluster: RealCluster, namespace: str) -> dict[str, str] | None:
    found = cluster.client.get_or_none(f"{nodes_path(namespace)}/{NODE_NAME}")
    return (found.get("status") or None) if found else None


def terminating(cluster: RealCluster) -> list[str]:
    """The pods on node-1 still leaving (a release replaced, a namespace removed)."""
    pods = cluster.client.get("/api/v1/pods", fieldSelector=f"spec.nodeName={NODE_NAME}")
    return [p["metadata"]["name"] for p in pods["items"] if p["metadata"].get("deletionTimestamp")]


def assert_capable(capability: dict[str, str] | None) -> None:
    assert capability is not None
    assert ("true", "true", "4.1.1", "") == (
        capability["checkpoint"], capability["restore"], capability["criu"], capability["message"]
    )  # fmt: skip
    assert capability["runtime"].startswith("containerd v2.3.")


def test_a_checkpointed_pod_is_restored_with_its_memory_and_then_cleaned_up(
    real_cluster: RealCluster, real_namespace: str, agent: Path, wait_until: Waiter
) -> None:
    pause_and_resume(real_cluster, real_namespace, real_namespace, wait_until, str(agent))
    assert_capable(capability_of(real_cluster, real_namespace))


def test_the_charts_daemonset_runs_the_agent_on_the_node(
    real_cluster: RealCluster, real_namespace: str, wait_until: Waiter, tmp_path: Path
) -> None:
    """The same round with the agent of the chart's DaemonSet: the host's ctr and criu
    through nsenter, the checkpoint directory its host path, the records in the webhook's
    namespace through its Role."""
    values = real_cluster.checkpoint_values()
    # Installed anew (and put back so at the end): an earlier test's write of the webhook
    # configuration's caBundle would conflict with helm's server-side apply of an upgrade.
    real_cluster.uninstall_chart()
    try:
        real_cluster.install_chart(values)
        capability = wait_until(
            lambda: capability_of(real_cluster, CHART_NAMESPACE),
            timeout=120,
            interval=0.5,
            what="the DaemonSet's agent to publish the node's capability",
        )
        assert_capable(capability)
        # With checkpoint.enabled the chart's admission policy lets only the service's
        # account create a pod from a checkpoint image: the test plays the service with it.
        account = account_kubeconfig(real_cluster, CHART_NAMESPACE, FULLNAME, tmp_path)
        as_service = Kubectl(real_cluster.binaries.kubectl, account, CHART_NAMESPACE)
        pause_and_resume(
            real_cluster,
            real_namespace,
            CHART_NAMESPACE,
            wait_until,
            "the DaemonSet's agent",
            as_service,
        )
    finally:
        real_cluster.uninstall_chart()
        real_cluster.install_chart()
        if capability_of(real_cluster, CHART_NAMESPACE) is not None:
            real_cluster.client.delete(f"{nodes_path(CHART_NAMESPACE)}/{NODE_NAME}")


def test_without_criu_the_node_says_it_cannot_checkpoint(
    real_cluster: RealCluster, real_namespace: str
) -> None:
    command = agent_command(real_cluster, real_namespace, "--once")
    command[command.index("--criu") + 1] = "/nonexistent/criu"
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert 0 == result.returncode, result.stderr
    data = capability_of(real_cluster, real_namespace)
    assert data is not None
    assert ("false", "false", "") == (data["checkpoint"], data["restore"], data["criu"])
    assert "CRIU: /nonexistent/criu not found" == data["message"]
