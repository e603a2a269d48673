"""``make demo``: the resize walkthrough on a fresh local cluster, printed like a terminal.

Starts the control plane, one node (node-1: 8 CPU, 16Gi, 110 pods; the v1.37.2 kubelet,
hollow: no containers, see :mod:`harness.nodes`) and the webhook; applies two PriorityClasses
and two pods (3 + 4 CPU); asks for the high-priority pod to grow to 6 CPU with ``kubectl
patch --subresource resize``; shows kubectl's answer (warnings included), the events of both
pods (the webhook's ``Preempted``, the kubelet's own resize events) and the resources the
kubelet actuated. Exits non-zero when the resize was not actuated.

Containers stop within 1 s (the victim's 30 s grace period is capped) so the walkthrough
does not sit idle; ``make cluster`` honours grace periods in full.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from harness.binaries import BinariesUnavailable, ensure_binaries
from harness.launcher import ControlPlane
from harness.nodes import HollowNodes, NodeOptions, default_nodes
from harness.processes import install_signal_handlers
from harness.webhook_process import WebhookProcess, WebhookUnavailable, start_webhook

#: The walkthrough's two PriorityClasses (the real-node walkthrough has them too).
PRIORITY_CLASSES = """\
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata:
  name: high-priority
value: 1000000
description: Latency-critical workloads.
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata:
  name: low-priority
value: 1000
description: Batch work that can be restarted.
"""
MANIFESTS = (
    PRIORITY_CLASSES
    + """\
---
apiVersion: v1
kind: Pod
metadata:
  name: low-priority-pod
  namespace: default
spec:
  priorityClassName: low-priority
  nodeSelector:
    kubernetes.io/hostname: node-1
  containers:
  - name: worker
    image: registry.k8s.io/pause:3.10
    resources:
      requests: {cpu: "3", memory: 500Mi}
      limits: {cpu: "3", memory: 500Mi}
---
apiVersion: v1
kind: Pod
metadata:
  name: high-priority-pod
  namespace: default
spec:
  priorityClassName: high-priority
  nodeSelector:
    kubernetes.io/hostname: node-1
  containers:
  - name: app
    image: registry.k8s.io/pause:3.10
    resources:
      requests: {cpu: "4", memory: 1Gi}
      limits: {cpu: "4", memory: 1Gi}
"""
)
RESIZE_PATCH = (
    '{"spec":{"containers":[{"name":"app", "resources":{"requests":{"cpu":"6"}, '
    '"limits":{"cpu":"6"}}}]}}'
)
ACTUATION_TIMEOUT = 30.0
STOP_GRACE_CAP = 1.0


class Terminal:
    """Runs the real kubectl and prints each command and its output like a shell session."""

    def __init__(self, kubectl: Path, kubeconfig: Path) -> None:
        self.kubectl = kubectl
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig)}

    def run(
        self, *args: str, stdin: str | None = None, show_stdin: bool = False
    ) -> subprocess.CompletedProcess[str]:
        shown = "kubectl " + " ".join(shlex.quote(a) for a in args)
        if stdin is not None and show_stdin:
            shown = f"{shown} <<'EOF'\n{stdin.rstrip()}\nEOF"
        print(f"$ {shown}", flush=True)
        result = subprocess.run(
            [str(self.kubectl), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
            check=False,
        )
        # kubectl writes warnings to stderr; a terminal shows both streams.
        for stream in (result.stderr, result.stdout):
            if stream:
                print(stream, end="" if stream.endswith("\n") else "\n", flush=True)
        print(flush=True)
        return result

    def quiet(self, *args: str) -> str:
        return subprocess.run(
            [str(self.kubectl), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
            check=False,
        ).stdout


def _actuated_cpu(term: Terminal) -> str:
    out = term.quiet(
        "get",
        "pod",
        "high-priority-pod",
        "-o",
        "jsonpath={.status.containerStatuses[0].resources.requests.cpu}",
    )
    return out.strip()


def run(*, with_webhook: bool = True) -> int:
    """Run the walkthrough; 0 when the high-priority pod ended up with 6 CPU actuated."""
    install_signal_handlers()
    try:
        binaries = ensure_binaries()
    except BinariesUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    began = time.monotonic()
    print(
        "# starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and node-1",
        flush=True,
    )
    with (
        ControlPlane(binaries) as cp,
        HollowNodes(cp, default_nodes(1), NodeOptions(stop_grace_cap=STOP_GRACE_CAP)),
    ):
        webhook: WebhookProcess | None = None
        if with_webhook:
            try:
                webhook = start_webhook(cp.client, cp.kubeconfig, cp.state_dir)
                print(f"# webhook serving at {webhook.url}, registered for pods/resize", flush=True)
            except WebhookUnavailable as e:
                print(
                    f"# webhook NOT running, continuing without it: {str(e).splitlines()[0]}",
                    flush=True,
                )
        print(f"# cluster ready in {time.monotonic() - began:.1f} s\n", flush=True)
        try:
            return _walkthrough(Terminal(binaries.kubectl, cp.kubeconfig))
        finally:
            if webhook is not None:
                webhook.stop()


def _walkthrough(term: Terminal) -> int:
    term.run("apply", "-f", "-", stdin=MANIFESTS)
    term.run(
        "wait",
        "--for=condition=Ready",
        "pod/low-priority-pod",
        "pod/high-priority-pod",
        "--timeout=60s",
    )
    term.run("get", "pods", "-o", "wide")
    term.run(
        "patch", "pod", "high-priority-pod", "--subresource", "resize", "--patch", RESIZE_PATCH
    )

    deadline = time.monotonic() + ACTUATION_TIMEOUT
    while _actuated_cpu(term) != "6" and time.monotonic() < deadline:
        time.sleep(0.2)
    actuated = _actuated_cpu(term) == "6"

    term.run("get", "events", "--field-selector", "involvedObject.name=low-priority-pod")
    term.run("get", "events", "--field-selector", "involvedObject.name=high-priority-pod")
    term.run(
        "get",
        "pod",
        "high-priority-pod",
        "-o",
        'jsonpath={.status.containerStatuses[0].resources}{"\\n"}',
    )
    term.run("get", "pods")
    if actuated and preempted(term):
        print("# high-priority-pod runs with 6 CPU; low-priority-pod was preempted", flush=True)
        return 0
    if actuated:
        print("# the resize fit without preempting anyone: the demo showed nothing", flush=True)
        return 1
    conditions = term.quiet(
        "get", "pod", "high-priority-pod", "-o", "jsonpath={.status.conditions}"
    )
    pending = [c for c in json.loads(conditions or "[]") if c.get("type") == "PodResizePending"]
    detail = f": {pending[0].get('reason')}, {pending[0].get('message')}" if pending else ""
    print(f"# the resize was NOT actuated within {ACTUATION_TIMEOUT:.0f} s{detail}", flush=True)
    return 1


def preempted(term: Terminal) -> bool:
    """Whether the webhook's ``Preempted`` event names low-priority-pod."""
    selector = "involvedObject.name=low-priority-pod,reason=Preempted"
    return bool(term.quiet("get", "events", "--field-selector", selector, "-o", "name").strip())


if __name__ == "__main__":
    sys.exit(run())
