"""VPA's in-place updates on a full node, with the webhook and without.

``python -m bench vpa`` (or ``python -m bench.vpa [--wait 60] [--wait-fallback]``) starts a
local control plane with the deployment and replicaset controllers, node-1 (8 CPU, a
hollow v1.37.2 kubelet whose containers stop within 1 s) and VPA v1.8.1's updater (every
2 s, :mod:`harness.vpa`), and runs one scene per case:

node-1 full: Deployment ``web`` (one pod, high priority, 2 CPU), ``low-a`` and ``low-b``
(low priority, 3 CPU each); a VPA for ``web`` in ``InPlace`` or ``InPlaceOrRecreate`` mode;
then the recommendation (written by the benchmark: no recommender runs) of 4 CPU, which
fits only once one low pod is gone.

For each case it measures, from the moment the recommendation is written: when the
updater's resize reached the API server (the audit log's timestamp), when the pod was
seen running at 4 CPU (polled every 50 ms), the pod's restarts, whether it is the same
pod, and who was evicted. Without the webhook the resize never fits: the case waits
``--wait`` seconds and reports that it did not happen.

``--wait-fallback`` adds ``InPlaceOrRecreate`` without the webhook, waited out: the
updater gives a Deferred resize 5 minutes (a constant in VPA v1.8.1, no flag shortens
it), then evicts the pod it was trying to grow; the case records when, and the pod that
replaced it. It takes about 6 minutes.

Prints a table and writes ``bench/results/vpa.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.kubeapi import ApiError, KubeClient
from harness.launcher import ControlPlane
from harness.manifests import guaranteed_pod
from harness.provenance import Run

RESULTS = Path(__file__).parent / "results" / "vpa.json"
NODE = "node-1"
WEB = "web"
MEMORY = "256Mi"
POLL = 0.05


@dataclass
class CaseResult:
    """One case; times in seconds from the recommendation written."""

    case: str
    mode: str
    webhook: bool
    resized_at: float | None = None
    actuated_at: float | None = None
    evicted_web_at: float | None = None
    waited: float = 0.0
    final_cpu: str | None = None
    condition: str | None = None
    resizes_sent: int = 0
    same_pod: bool = True
    restarts: int = 0
    victims: list[str] = field(default_factory=list)
    lows_kept: list[str] = field(default_factory=list)
    replacement: dict[str, Any] | None = None


class Rig:
    """The cluster, the updater and the priority classes every case uses."""

    def __init__(self, control_plane: ControlPlane, nodes: Any, updater: Any) -> None:
        self.cp = control_plane
        self.client: KubeClient = control_plane.client
        self.nodes = nodes
        self.updater = updater
        suffix = secrets.token_hex(3)
        self.classes = {"high": f"high-{suffix}", "low": f"low-{suffix}"}
        for key, value in (("high", 1_000_000), ("low", 1_000)):
            self.client.create(
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                {"metadata": {"name": self.classes[key]}, "value": value},
            )

    @contextlib.contextmanager
    def namespace(self, case: str) -> Iterator[str]:
        from harness.vpa import remove_workloads

        name = f"vpa-{case.lower()}-{secrets.token_hex(2)}"
        self.client.create("/api/v1/namespaces", {"metadata": {"name": name}})
        try:
            yield name
        finally:
            remove_workloads(self.client, name)
            self.client.request(
                "DELETE", f"/api/v1/namespaces/{name}/pods", body={"gracePeriodSeconds": 0}
            )
            deadline = time.monotonic() + 30
            while any(ns == name for ns, _ in self.nodes.known_pods()):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"pods of {name} were not removed from the node")
                time.sleep(0.1)
            with contextlib.suppress(ApiError):
                self.client.delete(f"/api/v1/namespaces/{name}")
                ns = self.client.get(f"/api/v1/namespaces/{name}")
                ns["spec"]["finalizers"] = []
                self.client.replace(f"/api/v1/namespaces/{name}/finalize", ns)

    # -- the scene ---------------------------------------------------------------------------

    def web_pods(self, namespace: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.client.get(
            f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"app={WEB}"
        )["items"]
        return [p for p in items if not p["metadata"].get("deletionTimestamp")]

    def wait_ready(self, namespace: str, names: Sequence[str] | None, timeout: float = 60) -> None:
        """Wait until the pods ``names`` (None: the one ``web`` pod) are Ready."""
        deadline = time.monotonic() + timeout
        while True:
            if names is None:
                pods = self.web_pods(namespace)
                ok = len(pods) == 1 and _ready(pods[0])
            else:
                pods = [self.pod(namespace, n) for n in names]
                ok = all(p is not None and _ready(p) for p in pods)
            if ok:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"pods of {namespace} not ready in {timeout} s")
            time.sleep(0.1)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod: dict[str, Any] | None = self.client.get_or_none(
            f"/api/v1/namespaces/{namespace}/pods/{name}"
        )
        return pod

    def full_node(self, namespace: str) -> dict[str, Any]:
        from harness.vpa import deployment_manifest

        self.client.create(
            f"/apis/apps/v1/namespaces/{namespace}/deployments",
            deployment_manifest(WEB, "2", self.classes["high"], memory=MEMORY),
        )
        self.wait_ready(namespace, None)
        for low in ("low-a", "low-b"):
            self.client.create(f"/api/v1/namespaces/{namespace}/pods", _low_pod(low, self.classes))
        self.wait_ready(namespace, ["low-a", "low-b"])
        [web] = self.web_pods(namespace)
        return web

    def run(self, mode: str, *, webhook: bool, wait: float, fallback: bool = False) -> CaseResult:
        from harness.vpa import API, vpa_manifest, write_recommendation
        from harness.webhook_process import start_webhook

        case = f"{mode}-{'webhook' if webhook else 'none'}{'-fallback' if fallback else ''}"
        result = CaseResult(case=case, mode=mode, webhook=webhook)
        service = (
            start_webhook(self.client, self.cp.kubeconfig, self.cp.state_dir) if webhook else None
        )
        try:
            with self.namespace(mode) as namespace:
                web = self.full_node(namespace)
                uid, name = web["metadata"]["uid"], web["metadata"]["name"]
                self.client.create(
                    f"{API}/namespaces/{namespace}/verticalpodautoscalers",
                    vpa_manifest(WEB, WEB, mode),
                )
                wall0 = time.time()
                began = time.monotonic()
                write_recommendation(
                    self.client, namespace, WEB, {"app": {"cpu": "4", "memory": MEMORY}}
                )
                deadline = began + wait
                while time.monotonic() < deadline:
                    pod = self.pod(namespace, name)
                    if fallback:
                        if pod is None or pod["metadata"].get("deletionTimestamp"):
                            result.evicted_web_at = time.monotonic() - began
                            break
                    elif pod is not None and _actual_cpu(pod) == "4":
                        result.actuated_at = time.monotonic() - began
                        break
                    time.sleep(POLL)
                result.waited = round(time.monotonic() - began, 2)
                if result.actuated_at is not None:
                    result.actuated_at = round(result.actuated_at, 2)
                if result.evicted_web_at is not None:
                    result.evicted_web_at = round(result.evicted_web_at, 2)
                resized = _audit_times(self.cp.log_dir / "audit.log", namespace, name, "resize")
                result.resizes_sent = len(resized)
                if resized:
                    result.resized_at = round(resized[0] - wall0, 2)
                pod = self.pod(namespace, name)
                if pod is not None:
                    result.final_cpu = _actual_cpu(pod)
                    result.condition = _resize_pending(pod)
                    result.restarts = _restarts(pod)
                for low in ("low-a", "low-b"):
                    low_pod = self.pod(namespace, low)
                    if low_pod is None or low_pod["metadata"].get("deletionTimestamp"):
                        result.victims.append(low)
                    else:
                        result.lows_kept.append(low)
                if fallback:
                    result.same_pod = result.evicted_web_at is None
                    result.replacement = self._replacement(namespace, uid, name)
                else:
                    result.same_pod = pod is not None and pod["metadata"]["uid"] == uid
        finally:
            if service is not None:
                service.stop()
        return result

    def _replacement(self, namespace: str, uid: str, name: str) -> dict[str, Any]:
        """Who evicted ``name``, and the pod the ReplicaSet made instead (once Ready)."""
        evictions = _audit_events(self.cp.log_dir / "audit.log", namespace, name, "eviction")
        with contextlib.suppress(TimeoutError):
            self.wait_ready(namespace, None, timeout=30)
        pods = [p for p in self.web_pods(namespace) if p["metadata"]["uid"] != uid]
        new = pods[0] if pods else None
        return {
            "evicted_by": sorted({e["user"]["username"] for e in evictions}),
            "eviction_codes": [e.get("responseStatus", {}).get("code") for e in evictions],
            "new_pod": new["metadata"]["name"] if new else None,
            "new_pod_cpu": _actual_cpu(new) if new else None,
        }


def _low_pod(name: str, classes: dict[str, str]) -> dict[str, Any]:
    return guaranteed_pod(name, "3", classes["low"], node=NODE, memory=MEMORY)


def _ready(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in pod.get("status", {}).get("conditions") or []
    )


def _actual_cpu(pod: dict[str, Any]) -> str | None:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return statuses[0].get("resources", {}).get("requests", {}).get("cpu") if statuses else None


def _resize_pending(pod: dict[str, Any]) -> str | None:
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == "PodResizePending" and c.get("status") == "True":
            return str(c.get("reason"))
    return None


def _restarts(pod: dict[str, Any]) -> int:
    return sum(
        int(s.get("restartCount", 0)) for s in pod.get("status", {}).get("containerStatuses") or []
    )


def _audit_events(log: Path, namespace: str, name: str, subresource: str) -> list[dict[str, Any]]:
    found = []
    for line in log.read_text(errors="replace").splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if (
            ref.get("subresource") == subresource
            and (ref.get("namespace"), ref.get("name")) == (namespace, name)
            and event.get("stage") == "ResponseComplete"
        ):
            found.append(event)
    return found


def _audit_times(log: Path, namespace: str, name: str, subresource: str) -> list[float]:
    """Wall-clock times (epoch seconds) the API server received each such request."""
    return [
        dt.datetime.fromisoformat(e["requestReceivedTimestamp"].replace("Z", "+00:00")).timestamp()
        for e in _audit_events(log, namespace, name, subresource)
    ]


def print_table(results: Sequence[CaseResult]) -> None:
    def s(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    print(
        f"{'case':<34} {'resize sent':>11} {'actuated':>9} {'web evicted':>11} "
        f"{'waited':>7} {'cpu':>4} {'resizes':>7} {'condition':>9} {'restarts':>8} "
        f"{'same pod':>8}  victims"
    )
    for r in results:
        print(
            f"{r.case:<34} {s(r.resized_at):>11} {s(r.actuated_at):>9} "
            f"{s(r.evicted_web_at):>11} {r.waited:>7.1f} {r.final_cpu or '-':>4} "
            f"{r.resizes_sent:>7} {r.condition or '-':>9} {r.restarts:>8} {r.same_pod!s:>8}  "
            f"{','.join(r.victims) or '-'}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench vpa", description=__doc__)
    parser.add_argument(
        "--wait", type=float, default=60.0, help="seconds a case waits for the resize (60)"
    )
    parser.add_argument(
        "--wait-fallback",
        action="store_true",
        help="also InPlaceOrRecreate without the webhook until VPA evicts the pod (~6 min)",
    )
    parser.add_argument("--quick", action="store_true", help="20 s waits (a smoke run)")
    parser.add_argument("--no-write", action="store_true", help="do not write the results")
    args = parser.parse_args(argv)
    started = Run()
    wait = 20.0 if args.quick else args.wait

    from harness.binaries import ensure_binaries
    from harness.launcher import ControlPlaneConfig
    from harness.nodes import HollowNodes, NodeOptions, default_nodes
    from harness.vpa import DEFERRED_RESIZE_TIMEOUT, VpaUpdater, ensure_vpa

    binaries = ensure_binaries()
    vpa = ensure_vpa()
    results: list[CaseResult] = []
    with tempfile.TemporaryDirectory(prefix="rpw-vpa-") as tmp:
        config = ControlPlaneConfig(state_dir=Path(tmp), workload_controllers=True)
        with (
            ControlPlane(binaries, config) as cp,
            HollowNodes(cp, default_nodes(1), NodeOptions(stop_grace_cap=1.0)) as nodes,
            VpaUpdater(cp, vpa) as updater,
        ):
            rig = Rig(cp, nodes, updater)
            cases: list[tuple[str, bool, float, bool]] = [
                ("InPlace", True, wait, False),
                ("InPlaceOrRecreate", True, wait, False),
                ("InPlace", False, wait, False),
                ("InPlaceOrRecreate", False, wait, False),
            ]
            if args.wait_fallback:
                cases.append(("InPlaceOrRecreate", False, DEFERRED_RESIZE_TIMEOUT + 90, True))
            for mode, webhook, limit, fallback in cases:
                print(f"vpa: {mode}, webhook {'on' if webhook else 'off'}...", file=sys.stderr)
                results.append(rig.run(mode, webhook=webhook, wait=limit, fallback=fallback))
                updater.check_alive()
            interval = updater.options.interval
    print_table(results)
    if not args.no_write and not args.quick:
        command = "python -m bench.vpa" + (" --wait-fallback" if args.wait_fallback else "")
        if args.wait != 60.0:
            command += f" --wait {args.wait:g}"
        started.write(
            RESULTS,
            {
                "command": command,
                "vpa": vpa.version,
                "kubernetes": binaries.version,
                "updater_interval_s": interval,
                "cases": [asdict(r) for r in results],
            },
        )
    with_webhook_ok = all(
        r.actuated_at is not None and r.same_pod and r.restarts == 0 for r in results if r.webhook
    )
    return 0 if with_webhook_ok else 1


if __name__ == "__main__":
    sys.exit(main())
