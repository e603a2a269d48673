"""Fault injection: SIGKILL a service replica at random points of a 3-victim preemption.

``python -m bench faults [--runs 20] [--seed N]`` starts a local control plane (the test
harness's), two replicas of the service behind one front (``python -m harness.fault_hooks
serve``: the service with fault points, armed through ``RPW_FAULT_FILE``), and repeats:

1. node-1 (8 CPUs): ``high`` 2 CPUs (to grow to 5), ``steady`` 2 CPUs (as important:
   never a victim), four 1-CPU low-priority pods: exactly three must go, the fourth stays;
2. pick a replica (the leader three times in four) and a fault: a random delay after the
   resize, or an armed point in the service (after the admission's ledger write, after
   the k-th eviction, before or after the ledger write - a run has one, the admission's);
3. ``kubectl patch --subresource resize`` the pod to 5 CPUs, SIGKILL the replica at the
   fault, restart it on the same port after a random pause;
4. wait for the outcome and check it from the API server's audit log and state: every
   eviction call per pod (a second call for one pod is a double eviction), pods evicted
   beyond the three needed or other than low-priority ones (unneeded evictions),
   ``Preempted`` events per victim, the resize actuated, and the reservation released or
   spent (no entry left that the service's readers count).

It prints a table and writes ``bench/results/faults.json``. ``tests/e2e/test_faults.py``
runs the same :class:`FaultRig` for a few runs against the test session's cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness import fault_hooks
from harness.audit import eviction_codes
from harness.kubeapi import ApiError, KubeClient
from harness.replicas import Replica, ReplicaSet, start_replicas
from webhook.core.objects import parse_pod
from webhook.engine.ledger import counting, decode_entries

RESULTS = Path(__file__).parent / "results" / "faults.json"
NODE = "node-1"
LEADER_LEASE = "resize-preemption-webhook-leader"
LEASE_DURATION = 3
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
LOWS = ("low-a", "low-b", "low-c", "low-d")
NEEDED = 3
#: Armed points for the leader; the number is which arrival kills.
LEADER_POINTS = (
    "admitted:1",
    "evicted:1",
    "evicted:2",
    "evicted:3",
    "ledger-before:1",
    "ledger-write:1",
)


@dataclass
class RunResult:
    run: int
    target: str  # "leader" or "follower"
    fault: str  # "delay 0.73s" or an armed point
    killed: bool  # the process died at the fault (an armed point not reached: killed late)
    evicted: list[str] = field(default_factory=list)
    eviction_calls: int = 0
    double_evictions: int = 0
    unneeded_evictions: int = 0
    preempted_events_max: int = 0
    actuated: bool = False
    released: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (
            self.double_evictions == 0
            and self.unneeded_evictions == 0
            and self.preempted_events_max <= 1
            and self.actuated
            and self.released
        )


class FaultRig:
    """Two replicas over a running control plane, and the runs against them."""

    def __init__(
        self,
        client: KubeClient,
        kubeconfig: Path,
        kubectl: Path,
        state_dir: Path,
        audit_log: Path,
        known_pods: Any,
        *,
        rng: random.Random,
        log: Any = print,
    ) -> None:
        self.client = client
        self.kubeconfig = kubeconfig
        self.kubectl_binary = kubectl
        self.state_dir = state_dir
        self.audit_log = audit_log
        self.known_pods = known_pods
        self.rng = rng
        self.log = log
        self.service_namespace = f"rpw-faults-{secrets.token_hex(3)}"
        self.fault_dir = state_dir / "faults"
        self.fault_dir.mkdir(parents=True, exist_ok=True)
        self.classes = {
            "high": f"high-{secrets.token_hex(3)}",
            "low": f"low-{secrets.token_hex(3)}",
        }
        self.replicas: ReplicaSet | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> FaultRig:
        for key, value in (("high", 1_000_000), ("low", 1_000)):
            self.client.create(
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                {"metadata": {"name": self.classes[key]}, "value": value},
            )
        previous = os.environ.get("RPW_FAULT_FILE")
        os.environ["RPW_FAULT_FILE"] = str(self.fault_dir / "{identity}")
        try:
            self.replicas = start_replicas(
                self.client,
                self.kubeconfig,
                self.state_dir,
                count=2,
                namespace=self.service_namespace,
                extra_args=["--lease-duration", str(LEASE_DURATION)],
                command=fault_hooks.COMMAND,
            )
        finally:
            if previous is None:
                os.environ.pop("RPW_FAULT_FILE", None)
            else:
                os.environ["RPW_FAULT_FILE"] = previous
        return self

    def stop(self) -> None:
        if self.replicas is not None:
            self.replicas.stop()
        for name in self.classes.values():
            with contextlib.suppress(ApiError):
                self.client.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")

    def _restart(self, replica: Replica) -> None:
        os.environ["RPW_FAULT_FILE"] = str(self.fault_dir / "{identity}")
        try:
            replica.start()
        finally:
            os.environ.pop("RPW_FAULT_FILE", None)

    # -- helpers ----------------------------------------------------------------------------

    def kubectl(self, namespace: str, *args: str, input: str | None = None) -> str:
        result = subprocess.run(
            [str(self.kubectl_binary), "--namespace", namespace, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=90,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def leader(self) -> str:
        try:
            lease = self.client.get(
                f"/apis/coordination.k8s.io/v1/namespaces/{self.service_namespace}"
                f"/leases/{LEADER_LEASE}"
            )
        except ApiError:
            return ""
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        obj: dict[str, Any] | None = self.client.get_or_none(
            f"/api/v1/namespaces/{namespace}/pods/{name}"
        )
        return obj

    def ledger_holds(self, pod_uid: str, pod: dict[str, Any] | None) -> bool:
        """Whether an entry of the pod still holds room, by the service's own rule (an
        entry expired or spent stays in the Lease until the next write drops it)."""
        leases = self.client.get(
            f"/apis/coordination.k8s.io/v1/namespaces/{self.service_namespace}/leases"
        )["items"]
        pods = [parse_pod(pod)] if pod is not None else []
        for lease in leases:
            raw = (lease["metadata"].get("annotations") or {}).get("resize-preemption.io/ledger")
            entries = [e for e in decode_entries(raw) if e.pod.uid == pod_uid]
            if counting(entries, pods, time.time()):
                return True
        return False

    def eviction_calls(self, namespace: str) -> Counter[str]:
        codes = eviction_codes(self.audit_log, namespace)
        return Counter({name: len(answers) for name, answers in codes.items()})

    def preempted_events(self, namespace: str) -> Counter[str]:
        items = self.client.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        return Counter(e["involvedObject"]["name"] for e in items if e.get("reason") == "Preempted")

    def _manifest(self, name: str, cpu: str, cls: str) -> dict[str, Any]:
        resources = {"cpu": cpu, "memory": "128Mi"}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"app": name}},
            "spec": {
                "nodeName": NODE,
                "priorityClassName": self.classes[cls],
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {
                        "name": "app",
                        "image": PAUSE_IMAGE,
                        "resources": {"requests": resources, "limits": dict(resources)},
                    }
                ],
            },
        }

    def _wait(self, condition: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.1)
        return bool(condition())

    def _cleanup(self, namespace: str) -> None:
        self.client.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods", body={"gracePeriodSeconds": 0}
        )
        self._wait(lambda: not any(ns == namespace for ns, _ in self.known_pods()), 30)
        try:
            self.client.delete(f"/api/v1/namespaces/{namespace}")
            obj = self.client.get(f"/api/v1/namespaces/{namespace}")
            obj["spec"]["finalizers"] = []
            self.client.replace(f"/api/v1/namespaces/{namespace}/finalize", obj)
        except ApiError as e:
            if e.status != 404:
                raise

    # -- one run ------------------------------------------------------------------------------

    def run_once(self, index: int, *, role: str = "", fault: str = "") -> RunResult:
        """One run; ``role`` (``leader``/``follower``) and ``fault`` (an armed point, or
        ``delay <seconds>s``) are drawn at random unless given."""
        assert self.replicas is not None
        namespace = f"faults-{index}-{secrets.token_hex(3)}"
        self.client.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        try:
            return self._run(index, namespace, self.rng, role, fault)
        finally:
            self._cleanup(namespace)

    def _run(
        self, index: int, namespace: str, rng: random.Random, role: str, fault: str
    ) -> RunResult:
        assert self.replicas is not None
        items = [
            self._manifest("high", "2", "high"),
            self._manifest("steady", "2", "high"),
            *(self._manifest(name, "1", "low") for name in LOWS),
        ]
        self.kubectl(
            namespace,
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )
        self.kubectl(namespace, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=60s")
        high = self.pod(namespace, "high")
        assert high is not None
        uid = high["metadata"]["uid"]

        if not self._wait(lambda: self.leader() != "", 30):
            raise RuntimeError("no leader")
        leader = self.leader()
        by_role = {
            "leader": [r for r in self.replicas.replicas if r.identity == leader],
            "follower": [r for r in self.replicas.replicas if r.identity != leader],
        }
        role = role or ("leader" if rng.random() < 0.75 else "follower")
        [target] = by_role[role] or self.replicas.replicas[:1]
        if not fault:
            armed = role == "leader" and rng.random() < 0.6
            fault = rng.choice(LEADER_POINTS) if armed else f"delay {rng.uniform(0.0, 2.5):.2f}s"
        armed = not fault.startswith("delay ")
        fault_file = self.fault_dir / target.identity
        if armed:
            fault_file.write_text(fault)

        started = time.monotonic()
        patch = {
            "spec": {
                "containers": [
                    {"name": "app", "resources": {"requests": {"cpu": "5"}, "limits": {"cpu": "5"}}}
                ]
            }
        }
        self.kubectl(
            namespace,
            "patch",
            "pod",
            "high",
            "--subresource",
            "resize",
            "--patch",
            json.dumps(patch),
        )
        if armed:
            died = self._wait(lambda: not target.running(), 15)
        else:
            time.sleep(max(0.0, float(fault.split()[1][:-1]) - (time.monotonic() - started)))
            died = False
        if fault_file.exists():
            fault_file.unlink()
        target.kill(signal.SIGKILL)
        time.sleep(rng.uniform(0.0, 1.0))
        self._restart(target)

        def actuated() -> bool:
            statuses = (self.pod(namespace, "high") or {}).get("status", {}).get(
                "containerStatuses"
            ) or []
            cpu = (
                statuses[0].get("resources", {}).get("requests", {}).get("cpu")
                if statuses
                else None
            )
            return cpu == "5"

        done = self._wait(actuated, 60)
        released = self._wait(lambda: not self.ledger_holds(uid, self.pod(namespace, "high")), 30)
        seconds = time.monotonic() - started
        time.sleep(1.0)  # late, wrong evictions would show by now
        calls = self.eviction_calls(namespace)
        gone = [n for n in ("high", "steady", *LOWS) if self.pod(namespace, n) is None]
        evicted_lows = [n for n in LOWS if n in gone or calls.get(n)]
        wrong = [n for n in ("high", "steady") if n in gone or calls.get(n)]
        events = self.preempted_events(namespace)
        result = RunResult(
            run=index,
            target=role,
            fault=fault,
            killed=died,
            evicted=sorted(set(evicted_lows) | set(wrong)),
            eviction_calls=sum(calls.values()),
            double_evictions=sum(c - 1 for c in calls.values() if c > 1),
            unneeded_evictions=max(0, len(evicted_lows) - NEEDED) + len(wrong),
            preempted_events_max=max(events.values(), default=0),
            actuated=done,
            released=released,
            seconds=round(seconds, 2),
        )
        self.log(
            f"run {index:2d}: {role:8s} {fault:16s} killed-at-point={died!s:5s} "
            f"evicted={','.join(result.evicted)} calls={result.eviction_calls} "
            f"double={result.double_evictions} unneeded={result.unneeded_evictions} "
            f"actuated={done} released={released} {seconds:.1f}s"
        )
        return result


def summarize(results: Sequence[RunResult]) -> dict[str, Any]:
    return {
        "runs": len(results),
        "leader_killed": sum(1 for r in results if r.target == "leader"),
        "armed_points_hit": sum(1 for r in results if r.killed),
        "double_evictions": sum(r.double_evictions for r in results),
        "unneeded_evictions": sum(r.unneeded_evictions for r in results),
        "max_preempted_events_per_victim": max(
            (r.preempted_events_max for r in results), default=0
        ),
        "actuated": sum(1 for r in results if r.actuated),
        "released": sum(1 for r in results if r.released),
        "all_ok": all(r.ok for r in results),
        "median_seconds": sorted(r.seconds for r in results)[len(results) // 2] if results else 0,
        "max_seconds": max((r.seconds for r in results), default=0),
    }


def print_table(results: Sequence[RunResult]) -> None:
    header = (
        f"{'run':>3}  {'target':8}  {'fault':16}  {'hit':3}  {'evicted':19}  {'calls':>5}  "
        f"{'double':>6}  {'unneeded':>8}  {'actuated':8}  {'released':8}  {'s':>5}"
    )
    print(header)
    for r in results:
        print(
            f"{r.run:>3}  {r.target:8}  {r.fault:16}  {'yes' if r.killed else '-':3}  "
            f"{','.join(x.removeprefix('low-') for x in r.evicted):19}  {r.eviction_calls:>5}  "
            f"{r.double_evictions:>6}  {r.unneeded_evictions:>8}  {r.actuated!s:8}  "
            f"{r.released!s:8}  {r.seconds:>5.1f}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench faults", description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="3 runs (a smoke run)")
    parser.add_argument("--no-write", action="store_true", help="do not write the results")
    args = parser.parse_args(argv)
    runs = 3 if args.quick else args.runs
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)

    from harness.binaries import ensure_binaries
    from harness.launcher import ControlPlane, ControlPlaneConfig
    from harness.nodes import HollowNodes, NodeOptions, default_nodes

    binaries = ensure_binaries()
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory(prefix="rpw-faults-") as tmp:
        state = Path(tmp)
        with ControlPlane(binaries, ControlPlaneConfig(state_dir=state)) as cp:
            options = NodeOptions(stop_grace_cap=1.0)
            with HollowNodes(cp, default_nodes(1), options) as nodes:
                rig = FaultRig(
                    cp.client,
                    cp.kubeconfig,
                    binaries.kubectl,
                    cp.state_dir,
                    cp.log_dir / "audit.log",
                    nodes.known_pods,
                    rng=random.Random(seed),
                    log=lambda line: print(line, file=sys.stderr, flush=True),
                ).start()
                try:
                    for i in range(runs):
                        results.append(rig.run_once(i))
                finally:
                    rig.stop()
    print_table(results)
    summary = summarize(results)
    summary["seed"] = seed
    print(json.dumps(summary, indent=2))
    if not args.no_write and not args.quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(
            json.dumps(
                {
                    "command": f"python -m bench.faults --runs {runs} --seed {seed}",
                    "summary": summary,
                    "runs": [asdict(r) for r in results],
                },
                indent=2,
            )
            + "\n"
        )
    return 0 if summary["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
