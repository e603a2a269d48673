"""``make demo NODE=real``: the resize walkthrough on a node that runs containers.

Starts the control plane and ``node-1`` as the real kubelet on containerd
(:mod:`harness.realcluster`), installs the webhook with its Helm chart from the locally
built image, shows its pods and image, then replays the walkthrough of ``make demo``
scaled to the CPU node-1 has left (:func:`scaled_walkthrough`): a low-priority pod and a
high-priority pod fill seven eighths of it, and the high one asks to grow by half. Both
run the workload image; the low-priority one is a process that traps SIGTERM, so its
eviction ends when the process exits. The output shows kubectl's warning, ``Preempted``
on the victim, the kubelet's ``ResizeDeferred`` then ``ResizeCompleted``, the new size in
the pod's status and the container's CFS quota before and after, read inside the
container. Exits non-zero when the resize was not actuated or the quota did not follow.
"""

from __future__ import annotations

import json
import sys
import time

from harness.binaries import BinariesUnavailable, ensure_binaries
from harness.chart import NAMESPACE, ChartError
from harness.demo import PRIORITY_CLASSES, Terminal, preempted
from harness.nodes import NodeError
from harness.processes import install_signal_handlers
from harness.realcluster import CPU_QUOTA_COMMAND, RealCluster, parse_cpu_quota
from harness.realnode import (
    NODE_NAME,
    NodeStackUnavailable,
    PreflightError,
    check_machine,
    ensure_images,
    ensure_node_stack,
)
from harness.walkthrough import Walkthrough, resize_patch, scaled_walkthrough

ACTUATION_TIMEOUT = 60.0
#: A real process that ends at once on SIGTERM (busybox sh: the trap runs when ``wait``
#: returns, not after a whole ``sleep``).
TRAPPING_COMMAND = [
    "sh", "-c",
    "trap 'echo SIGTERM received, exiting; exit 0' TERM; "
    "echo started; while true; do sleep 1 & wait $!; done",
]  # fmt: skip


def manifests(walk: Walkthrough, image: str) -> str:
    """PriorityClasses and the two Guaranteed pods of the walkthrough, on node-1."""

    def pod(name: str, priority: str, container: str, cpu: int, memory: str) -> str:
        return f"""\
---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  priorityClassName: {priority}
  nodeSelector:
    kubernetes.io/hostname: {NODE_NAME}
  terminationGracePeriodSeconds: 30
  # No cluster DNS runs: the node's (empty) resolver configuration, said so.
  dnsPolicy: Default
  containers:
  - name: {container}
    image: {image}
    command: {json.dumps(TRAPPING_COMMAND)}
    resources:
      requests: {{cpu: {cpu}m, memory: {memory}}}
      limits: {{cpu: {cpu}m, memory: {memory}}}
"""

    return (
        PRIORITY_CLASSES
        + pod("low-priority-pod", "low-priority", "worker", walk.low, "500Mi")
        + pod("high-priority-pod", "high-priority", "app", walk.high, "1Gi")
    )


def run(*, checkpoint: bool = False) -> int:
    """The whole demo; 0 when the resize was actuated and the container's quota followed
    (``checkpoint``: the victim paused and restored, :mod:`harness.pausedemo`)."""
    install_signal_handlers()
    try:
        check_machine()
        binaries = ensure_binaries()
        stack = ensure_node_stack()
        images = ensure_images()
    except (PreflightError, BinariesUnavailable, NodeStackUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    began = time.monotonic()
    print(
        "# starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and node-1 "
        "(the kubelet on containerd), then installing the webhook with its Helm chart",
        flush=True,
    )
    try:
        with RealCluster(binaries, stack, images) as cluster:
            print(f"# cluster and webhook ready in {time.monotonic() - began:.1f} s\n", flush=True)
            term = Terminal(binaries.kubectl, cluster.kubeconfig)
            if checkpoint:
                from harness import pausedemo

                return pausedemo.run(cluster, term)
            return _walkthrough(cluster, term)
    except (PreflightError, NodeError, ChartError, TimeoutError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _show_installation(cluster: RealCluster, term: Terminal) -> None:
    term.run("-n", NAMESPACE, "get", "pods", "-o", "wide")
    term.run(
        "-n", NAMESPACE, "get", "pods", "-o",
        'jsonpath={range .items[*]}{.metadata.name}{"  "}{.status.containerStatuses[0].image}'
        '{"  "}{.status.containerStatuses[0].imageID}{"\\n"}{end}',
    )  # fmt: skip
    if cluster.node is not None:
        # The image as containerd holds it: its name and its manifest's digest.
        name = f"name=={cluster.image('product')}"
        print(f"$ ctr --namespace k8s.io images list {name}", flush=True)
        print(cluster.node.ctr("images", "list", name).stdout, flush=True)


def _walkthrough(cluster: RealCluster, term: Terminal) -> int:
    _show_installation(cluster, term)
    cluster.settle()  # the replaced release's pods leave node-1 first
    walk = scaled_walkthrough(cluster.allocatable_millicores(), cluster.requested_millicores())
    print(
        f"# node-1: {cluster.allocatable_millicores()}m CPU allocatable, "
        f"{cluster.requested_millicores()}m requested already; the walkthrough scaled: "
        f"low {walk.low}m, high {walk.high}m -> {walk.target}m\n",
        flush=True,
    )
    term.run("apply", "-f", "-", stdin=manifests(walk, cluster.image("workload")))
    term.run(
        "wait", "--for=condition=Ready", "pod/low-priority-pod", "pod/high-priority-pod",
        "--timeout=120s",
    )  # fmt: skip
    term.run("get", "pods", "-o", "wide")
    quota = ["exec", "high-priority-pod", "--", "sh", "-c", CPU_QUOTA_COMMAND]
    before = parse_cpu_quota(term.run(*quota).stdout)
    patched = time.monotonic()
    term.run(
        "patch", "pod", "high-priority-pod", "--subresource", "resize",
        "--patch", resize_patch(walk.target),
    )  # fmt: skip
    actuated_in = _wait_actuated(term, walk.target, patched)
    term.run("get", "events", "--field-selector", "involvedObject.name=low-priority-pod")
    term.run("get", "events", "--field-selector", "involvedObject.name=high-priority-pod")
    term.run(
        "get", "pod", "high-priority-pod", "-o",
        'jsonpath={.status.containerStatuses[0].resources}{"\\n"}',
    )  # fmt: skip
    after = parse_cpu_quota(term.run(*quota).stdout)
    term.run("get", "pods", "-o", "wide")
    return _verdict(walk, before.millicores, after.millicores, actuated_in, term)


def _wait_actuated(term: Terminal, target: int, since: float) -> float | None:
    """Seconds from the patch until the status shows ``target`` (None: not within the
    timeout)."""
    deadline = since + ACTUATION_TIMEOUT
    while time.monotonic() < deadline:
        if _actuated_millicores(term) == target:
            return time.monotonic() - since
        time.sleep(0.1)
    return None


def _actuated_millicores(term: Terminal) -> int | None:
    from harness.realcluster import millicores

    out = term.quiet(
        "get", "pod", "high-priority-pod", "-o",
        "jsonpath={.status.containerStatuses[0].resources.requests.cpu}",
    ).strip()  # fmt: skip
    return millicores(out) if out else None


def _verdict(
    walk: Walkthrough,
    before: int | None,
    after: int | None,
    actuated_in: float | None,
    term: Terminal,
) -> int:
    print(f"# CFS quota of high-priority-pod: {before}m before, {after}m after", flush=True)
    if actuated_in is not None and not preempted(term):
        print("# the resize fit without preempting anyone: the demo showed nothing", flush=True)
        return 1
    if actuated_in is not None and after == walk.target:
        print(
            f"# high-priority-pod runs with {walk.target}m CPU, actuated {actuated_in:.2f} s "
            "after the patch; its container's cgroup followed",
            flush=True,
        )
        return 0
    conditions = term.quiet(
        "get", "pod", "high-priority-pod", "-o", "jsonpath={.status.conditions}"
    )
    pending = [c for c in json.loads(conditions or "[]") if c.get("type") == "PodResizePending"]
    detail = f": {pending[0].get('reason')}, {pending[0].get('message')}" if pending else ""
    print(
        f"# the resize was NOT actuated to {walk.target}m within {ACTUATION_TIMEOUT:.0f} s{detail}",
        flush=True,
    )
    return 1


if __name__ == "__main__":
    sys.exit(run())
