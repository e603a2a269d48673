"""Pause, don't kill, end to end on the real node: the webhook from its image and the node
agent from the chart's DaemonSet, both with ``checkpoint.enabled``.

* A bare pod that opted in counts in a shell variable and writes the count to a file each
  second. It is the victim of the walkthrough: kubectl's warning says it is checkpointed,
  the resize is actuated, the victim gets ``Checkpointed``. When the preemptor shrinks back,
  the pod comes back on node-1 under its name, labels and annotations, its count going on
  from where it stopped, not from 1; ``Restored`` says so, and its checkpoint (record,
  image, archive) is gone afterwards.
* A victim CRIU refuses (an established TCP connection, refused by default) is evicted as
  any victim: the resize is still actuated, and a Warning ``CheckpointFailed`` says why.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness.chart import NAMESPACE as SERVICE_NAMESPACE
from harness.realcluster import RealCluster
from harness.realnode import NODE_NAME
from harness.walkthrough import resize_patch, scaled_walkthrough
from tests.e2e.conftest import Waiter
from tests.e2e.records_support import nodes_path, records_path
from tests.e2e.test_realnode import (
    classes,  # noqa: F401 - the module's PriorityClasses
    cpu_running,
    events,
    guaranteed,
    read,
    start,
    warnings,
    workload,
)
from tests.e2e.test_realnode_checkpoint import capability_of, terminating
from webhook.core.checkpoint import ON_PREEMPT_ANNOTATION, RESTORED_FROM_ANNOTATION

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

#: Counts in a shell variable (process memory, not a file) and writes it each second; a
#: TERM ends it at once.
COUNTER = "trap 'exit 0' TERM; n=0; while true; do n=$((n+1)); echo $n > /tmp/count; sleep 1; done"
#: The same, holding an established TCP connection to itself: CRIU refuses to dump it
#: unless told to (containerd does not), so the checkpoint fails.
CONNECTED = "nc -l -p 7000 >/dev/null & sleep 0.5; sleep 100000 | nc 127.0.0.1 7000 & " + COUNTER
VICTIM = "low-priority-pod"
PREEMPTOR = "high-priority-pod"


@pytest.fixture(scope="module")
def checkpointing(real_cluster: RealCluster) -> Iterator[None]:
    """The chart installed with checkpoints on (the service and the node agent), and put
    back as the other tests know it afterwards."""
    real_cluster.uninstall_chart()
    try:
        real_cluster.install_chart(real_cluster.checkpoint_values())
        deadline = time.monotonic() + 120
        while (capability := capability_of(real_cluster, SERVICE_NAMESPACE)) is None:
            assert time.monotonic() < deadline, "the node agent published no abilities"
            time.sleep(0.5)
        assert ("true", "true") == (capability["checkpoint"], capability["restore"]), capability
        # The walkthrough sizes its pods to the CPU the node's pods request: the release
        # uninstalled above must have left it, or the preemptor's room shows up later.
        while terminating(real_cluster):
            assert time.monotonic() < deadline, f"still terminating: {terminating(real_cluster)}"
            time.sleep(0.5)
        time.sleep(2.0)  # every replica lists the abilities each second: it has read them
        yield
    finally:
        real_cluster.uninstall_chart()
        real_cluster.install_chart()
        path = f"{nodes_path(SERVICE_NAMESPACE)}/{NODE_NAME}"
        if real_cluster.client.get_or_none(path) is not None:
            real_cluster.client.delete(path)


SECRET = {"name": "SECRET_WORD", "value": "hunter2"}


def opted_in(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["labels"] = {"app": "counter"}
    pod["metadata"]["annotations"] = {ON_PREEMPT_ANNOTATION: "checkpoint", "team": "ml"}
    pod["spec"]["terminationGracePeriodSeconds"] = 5
    # A literal value: its record holds it sealed, its restored pod as it was.
    pod["spec"]["containers"][0].setdefault("env", []).append(SECRET)
    return pod


def restored_counting_on(
    cluster: RealCluster, ns: str, old_uid: str, before: int, wait_until: Waiter
) -> tuple[dict[str, Any], int]:
    """The victim's new incarnation once Running and its first count, after checking that
    its count goes on from ``before`` (a process started afresh would be at 1 or 2)."""

    def restored() -> dict[str, Any] | None:
        pod = read(cluster, ns, VICTIM)
        if pod is None or pod["metadata"]["uid"] == old_uid:
            return None
        return pod if pod["status"].get("phase") == "Running" else None

    pod: dict[str, Any] = wait_until(
        restored, timeout=180, interval=0.5, what="the victim restored"
    )
    first = count(cluster, ns)
    assert before <= first <= before + 30, (before, first)
    wait_until(lambda: count(cluster, ns) > first, timeout=10, what="the count to go on")
    return pod, first


def count(cluster: RealCluster, namespace: str) -> int:
    return int(cluster.exec(namespace, VICTIM, ["cat", "/tmp/count"]).strip() or 0)


def records(cluster: RealCluster) -> list[dict[str, Any]]:
    return list(cluster.client.get(records_path(SERVICE_NAMESPACE))["items"])


def start_walkthrough(
    cluster: RealCluster, namespace: str, priority: dict[str, str], script: str
) -> Any:
    """The scaled walkthrough with an opted-in victim running ``script``, both pods
    running; the walk."""
    walk = scaled_walkthrough(cluster.allocatable_millicores(), cluster.requested_millicores())
    image = cluster.image("workload")
    victim = workload(VICTIM, image, priority["low"], guaranteed(f"{walk.low}m", "64Mi"),
                      script=script, container="main")  # fmt: skip
    preemptor = workload(PREEMPTOR, image, priority["high"], guaranteed(f"{walk.high}m", "64Mi"))
    start(cluster, namespace, [opted_in(victim), preemptor])
    return walk


def resize(cluster: RealCluster, namespace: str, millicores: int) -> list[str]:
    """The preemptor's resize to ``millicores``; kubectl's warnings."""
    result = cluster.kubectl(
        "patch", "-n", namespace, "pod", PREEMPTOR, "--subresource", "resize",
        "--patch", resize_patch(millicores),
    )  # fmt: skip
    return warnings(result)


def test_a_checkpointed_victim_comes_back_with_its_memory_when_room_returns(
    real_cluster: RealCluster,
    real_namespace: str,
    classes: dict[str, str],  # noqa: F811
    checkpointing: None,
    wait_until: Waiter,
) -> None:
    ns = real_namespace
    walk = start_walkthrough(real_cluster, ns, classes, COUNTER)
    wait_until(lambda: count(real_cluster, ns) >= 5, timeout=30, what="a few counts")
    old = read(real_cluster, ns, VICTIM)
    assert old is not None
    old_uid = old["metadata"]["uid"]
    before = count(real_cluster, ns)  # the checkpoint comes after this

    told = resize(real_cluster, ns, walk.target)

    assert [
        f"Warning: preempting 1 lower-priority pod on {NODE_NAME}",
        f"Warning: checkpointing 1 of them, restored when room returns: {ns}/{VICTIM}",
    ] == [w.split(" for ")[0] for w in told]
    wait_until(
        lambda: cpu_running(read(real_cluster, ns, PREEMPTOR)) == walk.target,
        timeout=60,
        what=f"the kubelet to actuate {walk.target}m",
    )
    assert 1 == len(events(real_cluster, ns, VICTIM, "Checkpointed"))
    assert 1 == len(events(real_cluster, ns, VICTIM, "Preempted"))
    (record,) = records(real_cluster)
    assert f"rpw-checkpoint-{old_uid}" == record["metadata"]["name"]
    assert SECRET["value"] not in json.dumps(record)
    (kept,) = [e for e in record["spec"]["pod"]["spec"]["containers"][0]["env"]
               if e["name"] == SECRET["name"]]  # fmt: skip
    assert kept["value"].startswith("rpw-sealed:v1:")

    # Room returns: the preemptor back to its size. The victim comes back on node-1.
    resize(real_cluster, ns, walk.high)

    pod, _ = restored_counting_on(real_cluster, ns, old_uid, before, wait_until)
    assert NODE_NAME == pod["spec"]["nodeName"]
    assert {"app": "counter"} == pod["metadata"]["labels"]
    assert SECRET in pod["spec"]["containers"][0]["env"]
    assert {
        **old["metadata"]["annotations"],  # kubectl's last-applied-configuration too
        RESTORED_FROM_ANNOTATION: f"rpw-checkpoint-{old_uid}",
    } == pod["metadata"]["annotations"]
    assert {ON_PREEMPT_ANNOTATION: "checkpoint", "team": "ml"}.items() <= pod["metadata"][
        "annotations"
    ].items()
    wait_until(lambda: events(real_cluster, ns, VICTIM, "Restored"), timeout=30, what="Restored")
    wait_until(lambda: records(real_cluster) == [], timeout=60, what="the checkpoint gone")
    node = real_cluster.node
    assert node is not None
    listed = node.ctr("images", "list", "--quiet").stdout.split()
    assert [] == [ref for ref in listed if "resize-preemption-checkpoint" in ref]
    assert [] == sorted(p.name for p in (node.paths.kubelet_root / "checkpoints").iterdir())


def test_a_victim_that_cannot_be_checkpointed_is_evicted_and_the_resize_goes_on(
    real_cluster: RealCluster,
    real_namespace: str,
    classes: dict[str, str],  # noqa: F811
    checkpointing: None,
    wait_until: Waiter,
) -> None:
    ns = real_namespace
    walk = start_walkthrough(real_cluster, ns, classes, CONNECTED)
    patched = time.monotonic()
    told = resize(real_cluster, ns, walk.target)

    assert f"Warning: checkpointing 1 of them, restored when room returns: {ns}/{VICTIM}" in told
    wait_until(
        lambda: cpu_running(read(real_cluster, ns, PREEMPTOR)) == walk.target,
        timeout=60,
        what=f"the kubelet to actuate {walk.target}m",
    )
    actuated_in = time.monotonic() - patched
    (failed,) = events(real_cluster, ns, VICTIM, "CheckpointFailed")
    assert "Warning" == failed["type"]
    assert failed["message"].startswith("Not checkpointed, evicted: the kubelet refused"), failed
    assert 1 == len(events(real_cluster, ns, VICTIM, "Preempted"))
    assert [] == records(real_cluster)
    wait_until(lambda: read(real_cluster, ns, VICTIM) is None, timeout=30, what="victim gone")
    # The victim's grace period (5 s) and the kubelet's sync bound it; a checkpoint that
    # hung would not.
    assert actuated_in < 20, f"actuated {actuated_in:.1f} s after the patch"
