"""``make demo NODE=real CHECKPOINT=1``: the walkthrough with a victim that is paused, not
killed.

The same cluster as ``make demo NODE=real`` (:mod:`harness.realdemo`), the chart installed
with ``checkpoint.enabled`` (the service's setting and the node agent's DaemonSet). The
low-priority pod is bare, opts in with ``resize-preemption.io/on-preempt: checkpoint``
and counts in a shell variable, writing the count to a file each second. The output
shows kubectl's two warnings, ``Checkpointed`` and ``Preempted`` on the victim, the resize
actuated, ``status`` listing the checkpoint waiting for room; then the high-priority pod
shrinks back, and the victim comes back under its name, ``Restored``, its count going on
from where it stopped. Exits non-zero when any of that did not happen.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from harness.chart import NAMESPACE
from harness.demo import PRIORITY_CLASSES, Terminal
from harness.realcluster import RealCluster
from harness.realnode import NODE_NAME
from harness.walkthrough import Walkthrough, resize_patch, scaled_walkthrough
from webhook.core.checkpoint import RESTORED_FROM_ANNOTATION

#: Counts in a shell variable (the process's memory) and writes the count each second.
COUNTER = "trap 'exit 0' TERM; n=0; while true; do n=$((n+1)); echo $n > /tmp/count; sleep 1; done"
TIMEOUT = 120.0


def manifests(walk: Walkthrough, image: str) -> str:
    """The walkthrough's PriorityClasses and pods; the low one opted in to checkpoints."""

    def pod(name: str, priority: str, cpu: int, command: list[str], extra: str = "") -> str:
        return f"""\
---
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default{extra}
spec:
  priorityClassName: {priority}
  nodeName: {NODE_NAME}
  terminationGracePeriodSeconds: 5
  dnsPolicy: Default
  containers:
  - name: app
    image: {image}
    command: {json.dumps(command)}
    resources:
      requests: {{cpu: {cpu}m, memory: 64Mi}}
      limits: {{cpu: {cpu}m, memory: 64Mi}}
"""

    opt_in = "\n  annotations:\n    resize-preemption.io/on-preempt: checkpoint"
    return (
        PRIORITY_CLASSES
        + pod("low-priority-pod", "low-priority", walk.low, ["sh", "-c", COUNTER], opt_in)
        + pod("high-priority-pod", "high-priority", walk.high, ["sh", "-c", "sleep infinity"])
    )


def run(cluster: RealCluster, term: Terminal) -> int:
    """The demo on a started cluster; 0 when the victim came back counting on."""
    print("# the chart again, with checkpoint.enabled: the service and the node agent", flush=True)
    cluster.uninstall_chart()
    cluster.install_chart(cluster.checkpoint_values())
    if not _wait(lambda: _ability(term), "the node agent to say what node-1 can do"):
        return 1
    term.run("-n", NAMESPACE, "get", "checkpointnode", NODE_NAME, "-o", "jsonpath={.status}")
    cluster.settle()  # the replaced release's pods leave node-1 first
    walk = scaled_walkthrough(cluster.allocatable_millicores(), cluster.requested_millicores())
    term.run("apply", "-f", "-", stdin=manifests(walk, cluster.image("workload")))
    term.run("wait", "--for=condition=Ready", "pod/low-priority-pod", "pod/high-priority-pod")
    time.sleep(5)
    before = _count(term)
    print(f"# low-priority-pod has counted to {before}\n", flush=True)
    term.run("patch", "pod", "high-priority-pod", "--subresource", "resize",
             "--patch", resize_patch(walk.target))  # fmt: skip
    if not _wait(lambda: _cpu(term) == walk.target, f"the resize to {walk.target}m"):
        return 1
    term.run("get", "events", "--field-selector", "involvedObject.name=low-priority-pod")
    _status(cluster)
    print("# room returns: high-priority-pod shrinks back\n", flush=True)
    listed = term.quiet("get", "podcheckpoints", "-n", NAMESPACE, "-o", "json")
    recorded = json.loads(listed or "{}")
    if not recorded.get("items"):
        print("# nothing was checkpointed: the resize found room without a victim", flush=True)
        return 1
    term.run("patch", "pod", "high-priority-pod", "--subresource", "resize",
             "--patch", resize_patch(walk.high))  # fmt: skip
    if not _wait(lambda: _restored(term, recorded), "low-priority-pod restored"):
        return 1
    time.sleep(1.5)
    after = _count(term)
    term.run("get", "pod", "low-priority-pod", "-o", "wide")
    term.run(
        "get", "events", "--field-selector", "involvedObject.name=low-priority-pod,reason=Restored"
    )
    print(f"# low-priority-pod counted to {before} before its checkpoint, {after} now", flush=True)
    if after >= before:
        print("# its process came back with its memory: the count went on", flush=True)
        return 0
    print("# the count started again: the process did NOT keep its memory", flush=True)
    return 1


def _wait(condition: Any, what: str) -> bool:
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.25)
    print(f"# timed out waiting for {what}", flush=True)
    return False


def _ability(term: Terminal) -> bool:
    out = term.quiet("-n", NAMESPACE, "get", "checkpointnode", NODE_NAME,
                     "-o", "jsonpath={.status.checkpoint}")  # fmt: skip
    return out.strip() == "true"


def _count(term: Terminal) -> int:
    out = term.quiet("exec", "low-priority-pod", "--", "cat", "/tmp/count").strip()
    return int(out) if out.isdigit() else 0


def _cpu(term: Terminal) -> int | None:
    from harness.realcluster import millicores

    path = "jsonpath={.status.containerStatuses[0].resources.requests.cpu}"
    out = term.quiet("get", "pod", "high-priority-pod", "-o", path).strip()
    return millicores(out) if out else None


def _restored(term: Terminal, before: dict[str, Any]) -> bool:
    names = [i["metadata"]["name"] for i in before.get("items", [])]
    annotation = RESTORED_FROM_ANNOTATION.replace(".", "\\.")
    path = f"jsonpath={{.metadata.annotations.{annotation}}} {{.status.phase}}"
    out = term.quiet("get", "pod", "low-priority-pod", "-o", path)
    parts = out.split()
    return len(parts) == 2 and parts[0] in names and parts[1] == "Running"


def _status(cluster: RealCluster) -> None:
    command = [sys.executable, "-m", "webhook", "status", "--kubeconfig",
               str(cluster.kubeconfig), "--service-namespace", NAMESPACE]  # fmt: skip
    print("$ python -m webhook status", flush=True)
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    print(result.stdout or result.stderr, flush=True)
