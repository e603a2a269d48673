"""How fast the kubelet retries a deferred resize once the pod in the way is gone.

``python -m harness.retry_latency [--rounds 40] [--grace 0]`` starts a control plane and one
hollow node (4 CPU), then per round: a pod at 3 CPU and a victim at 1 CPU, the first resized
to 4 CPU (Deferred), the victim evicted through the Eviction API. Three moments are taken
from one watch of the namespace: the eviction's answer, the victim's object gone (the
kubelet deletes it once its containers stopped and its terminal status is posted), and the
resize actuated (``status.containerStatuses[0].resources`` at 4 CPU). Prints medians and
p95 of eviction -> actuated and victim gone -> actuated, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from typing import Any

from harness.binaries import ensure_binaries
from harness.kubeapi import KubeClient
from harness.launcher import ControlPlane, ControlPlaneConfig
from harness.nodes import HollowNodes, NodeOptions, NodeSpec
from harness.processes import install_signal_handlers

NAMESPACE = "retry-latency"


def _pod(name: str, cpu: str, grace: int) -> dict[str, Any]:
    resources = {"cpu": cpu, "memory": "128Mi"}
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": "node-1",
            "terminationGracePeriodSeconds": grace,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
        },
    }


class Moments(threading.Thread):
    """Watches the namespace and notes when each pod vanished and when the grower ran at 4."""

    def __init__(self, client: KubeClient) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.gone: dict[str, float] = {}
        self.actuated: dict[str, float] = {}
        self.stopping = threading.Event()

    def run(self) -> None:
        path = f"/api/v1/namespaces/{NAMESPACE}/pods"
        version = self.client.get(path)["metadata"]["resourceVersion"]
        while not self.stopping.is_set():
            for event in self.client.watch(path, version, timeout_seconds=30, stop=self.stopping):
                now = time.monotonic()
                pod = event["object"]
                version = pod["metadata"]["resourceVersion"]
                if event["type"] == "BOOKMARK":
                    continue
                name = pod["metadata"]["name"]
                if event["type"] == "DELETED":
                    self.gone.setdefault(name, now)
                statuses = pod.get("status", {}).get("containerStatuses") or [{}]
                cpu = (statuses[0].get("resources") or {}).get("requests", {}).get("cpu")
                if cpu == "4":
                    self.actuated.setdefault(name, now)
                if self.stopping.is_set():
                    return


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--grace", type=int, default=0, help="victims' grace period (s)")
    args = parser.parse_args(argv)
    install_signal_handlers()
    binaries = ensure_binaries()
    with (
        ControlPlane(binaries, ControlPlaneConfig(scheduler=False)) as cp,
        HollowNodes(cp, [NodeSpec("node-1", cpu="4", memory="8Gi")], NodeOptions()),
    ):
        api = cp.client
        api.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        moments = Moments(api)
        moments.start()
        from_eviction: list[float] = []
        from_gone: list[float] = []
        for i in range(args.rounds):
            eviction_ms, gone_ms = _round(api, moments, i, args.grace)
            from_eviction.append(eviction_ms)
            from_gone.append(gone_ms)
        moments.stopping.set()
    result = {
        "rounds": args.rounds,
        "victim_grace_s": args.grace,
        "eviction_to_actuated_ms": {
            "median": round(statistics.median(from_eviction), 1),
            "p95": round(_p95(from_eviction), 1),
        },
        "victim_gone_to_actuated_ms": {
            "median": round(statistics.median(from_gone), 1),
            "p95": round(_p95(from_gone), 1),
        },
    }
    print(json.dumps(result, indent=2))
    return 0


def _round(api: KubeClient, moments: Moments, i: int, grace: int) -> tuple[float, float]:
    """One round; (eviction -> actuated, victim gone -> actuated) in milliseconds."""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    grower, victim = f"grower-{i}", f"victim-{i}"
    api.create(path, _pod(grower, "3", 0))
    api.create(path, _pod(victim, "1", grace))
    _wait(lambda: _running(api, path, grower) and _running(api, path, victim))
    body = {"spec": {"containers": [{"name": "app", "resources": _cpu("4")}]}}
    api.patch(f"{path}/{grower}/resize", body, kind="strategic")
    _wait(lambda: _deferred(api, path, grower))
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": victim, "namespace": NAMESPACE},
    }
    api.create(f"{path}/{victim}/eviction", eviction)
    evicted = time.monotonic()
    _wait(lambda: grower in moments.actuated and victim in moments.gone, timeout=60 + grace)
    result = (
        (moments.actuated[grower] - evicted) * 1000,
        (moments.actuated[grower] - moments.gone[victim]) * 1000,
    )
    api.delete(f"{path}/{grower}", {"gracePeriodSeconds": 0})
    _wait(lambda: grower in moments.gone)
    return result


def _cpu(cpu: str) -> dict[str, dict[str, str]]:
    return {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}


def _running(api: KubeClient, path: str, name: str) -> bool:
    return bool(api.get(f"{path}/{name}").get("status", {}).get("phase") == "Running")


def _deferred(api: KubeClient, path: str, name: str) -> bool:
    conditions = api.get(f"{path}/{name}").get("status", {}).get("conditions") or []
    return any(
        c["type"] == "PodResizePending" and c.get("reason") == "Deferred" for c in conditions
    )


def _wait(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout} s")
        time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main())
