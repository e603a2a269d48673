"""Resize preemption on the real node: this webhook vs kube-scheduler v1.37.2.

``python -m bench.realcompare [--repeat 3] [--grace 0 5]`` (as root, after ``make node``;
it starts its own clusters, one after the other, so not beside ``make cluster``) runs the
scenarios of ``bench/compare`` (:mod:`bench.compare.scenarios`) on a cluster whose
``node-1`` is the real kubelet on containerd (:class:`harness.realcluster.RealCluster`):

* ``ours``: the alpha gate off everywhere; the webhook installed by its Helm chart from the
  locally built image (two replicas on node-1, called by kube-apiserver through the
  chart's Service);
* ``upstream``: ``InPlacePodVerticalScalingSchedulerPreemption=true`` on kube-apiserver,
  kube-scheduler, kube-controller-manager and the kubelet; no webhook. Two pods with the
  chart's priority class and requests take the room the chart's replicas take on the
  other side, so both sides scale the scenarios to the same free CPU.

The scenarios (walkthrough, mixed-priorities, lending) are scaled to the CPU node-1 has
free, as :func:`harness.realdemo.scaled_walkthrough` scales the walkthrough: every size
times free / the scenario's node size, rounded down to 10m (the lending floors too). Each
pod runs the workload image with a process that traps SIGTERM and then sleeps the pod's
grace period before it exits, so a victim's removal really takes it. For every grace
period asked (``--grace``, default 0 and 5 s) each scenario runs ``--repeat`` times on
each side, measured by :class:`bench.compare.runner.ScenarioRun` (the watch, the timings
from kubectl's return, the audit-log count); the table gives the medians.

Prints one table per grace period and writes ``bench/results/compare-realnode.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

import yaml

from bench.compare import runner
from bench.compare import scenarios as sc
from bench.compare.measure import AUDIT_EVERYTHING
from bench.compare.runner import Measured, ScenarioRun
from bench.compare.sides import GATE, SIDES, Side
from harness import quantity
from harness.binaries import REPO_ROOT, ensure_binaries
from harness.chart import CHART, NAMESPACE
from harness.images import Role
from harness.kubeapi import ApiError
from harness.manifests import workload_pod
from harness.nodes import HollowNodes, NodeError
from harness.processes import install_signal_handlers
from harness.realcluster import RealCluster, RealClusterOptions
from harness.realdemo import STEP
from harness.realnode import (
    NODE_NAME,
    Images,
    NodeStack,
    check_machine,
    ensure_images,
    ensure_node_stack,
)
from webhook.core.model import FLOOR_ANNOTATION

RESULTS = REPO_ROOT / "bench" / "results" / "compare-realnode.json"
SCENARIOS: tuple[Callable[[], sc.Scenario], ...] = (
    sc.walkthrough,
    sc.mixed_priorities,
    sc.lending,
)
GRACES = (0, 5)
#: Where the upstream side keeps the room the chart's replicas take on our side.
ROOM_NAMESPACE = "chart-room"
LEADER_LEASE = "resize-preemption-webhook-leader"

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def victim_script(grace: int) -> str:
    """A process that, on SIGTERM, takes ``grace`` seconds before it exits (busybox sh runs
    the trap when ``wait`` returns, not after a whole ``sleep``)."""
    return f"trap 'sleep {grace}; exit 0' TERM; while true; do sleep 1 & wait $!; done"


# --- scaling --------------------------------------------------------------------------------


def scaled(scenario: sc.Scenario, free: int, step: int = STEP) -> sc.Scenario:
    """``scenario`` with every CPU size (pods, resizes, lending floors) times ``free``
    millicores over its node's size, rounded down to ``step``; on one node of ``free``."""
    whole = quantity.milli_value(scenario.node_cpu)

    def cpu(text: str) -> str:
        return f"{quantity.milli_value(text) * free // whole // step * step}m"

    def floors(annotations: Mapping[str, str]) -> dict[str, str]:
        out = dict(annotations)
        if FLOOR_ANNOTATION in out:
            per_container = json.loads(out[FLOOR_ANNOTATION])
            for floor in per_container.values():
                if "cpu" in floor:
                    floor["cpu"] = cpu(floor["cpu"])
            out[FLOOR_ANNOTATION] = json.dumps(per_container)
        return out

    if scenario.nodes != 1:
        raise ValueError(f"{scenario.name}: the real node is one node")
    return replace(
        scenario,
        node_cpu=f"{free}m",
        pods=tuple(
            replace(p, cpu=cpu(p.cpu), annotations=floors(p.annotations)) for p in scenario.pods
        ),
        resizes=tuple(replace(r, cpu=cpu(r.cpu)) for r in scenario.resizes),
        pending=tuple(replace(r, cpu=cpu(r.cpu)) for r in scenario.pending),
    )


def sizes(scenario: sc.Scenario) -> dict[str, Any]:
    """The scaled sizes, as the results file records them."""
    return {
        "pods": {p.name: p.cpu for p in scenario.pods},
        "resizes": {r.pod: r.cpu for r in scenario.resizes},
        "floors": {
            p.name: json.loads(p.annotations[FLOOR_ANNOTATION])
            for p in scenario.pods
            if FLOOR_ANNOTATION in p.annotations
        },
    }


# --- the sides ------------------------------------------------------------------------------


class _RealNodeOnly:
    """What a scenario asks of a side's nodes, for a side whose one node is the real
    node-1: every scenario shares it, none adds or removes a node."""

    names: tuple[str, ...] = ()

    def add_node(self, spec: object) -> None:
        return None


@dataclass
class RealSide(Side):
    """A side of :mod:`bench.compare.sides` whose node is the real node-1."""

    stack: NodeStack | None = None
    images: Images | None = None
    cluster: RealCluster | None = None

    def start(self) -> RealSide:
        assert self.stack is not None and self.images is not None
        gates = {GATE: True} if self.name == "upstream" else {}
        options = RealClusterOptions(
            feature_gates=gates,
            with_chart=self.runs_webhook,
            state_dir=self.state_dir,
            audit_policy=AUDIT_EVERYTHING,
        )
        try:
            self.cluster = RealCluster(self.binaries, self.stack, self.images, options).start()
            self.control_plane = self.cluster.control_plane
            self.nodes = cast(HollowNodes, _RealNodeOnly())
            if self.runs_webhook:
                self._wait_leader()
            else:
                self._take_the_charts_room()
        except BaseException:
            self.stop()
            raise
        return self

    @classmethod
    def around(cls, cluster: RealCluster, name: str) -> RealSide:
        """A side on a cluster that runs already; whoever started it stops it."""
        side = cls(name, cluster.binaries, cluster.control_plane.state_dir, grace_cap=None)
        side.cluster = cluster
        side.control_plane = cluster.control_plane
        side.nodes = cast(HollowNodes, _RealNodeOnly())
        return side

    def wait_leader(self) -> None:
        self._wait_leader()

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        self.control_plane = None
        self.nodes = None
        if self._owns_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def image(self, role: Role) -> str:
        assert self.cluster is not None
        return self.cluster.image(role)

    def free_millicores(self) -> tuple[int, int]:
        """node-1's allocatable CPU and what its pods request, in millicores."""
        assert self.cluster is not None
        return self.cluster.allocatable_millicores(), self.cluster.requested_millicores()

    def _wait_leader(self, timeout: float = 120.0) -> None:
        """The chart's replicas preempt only as leader: wait until one holds the Lease."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEADER_LEASE}"
        deadline = time.monotonic() + timeout
        while not (self.client.get_or_none(path) or {}).get("spec", {}).get("holderIdentity"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no replica of the chart took the Lease {LEADER_LEASE}")
            time.sleep(0.2)

    def _take_the_charts_room(self) -> None:
        """Pods with the chart's priority class and requests, one per replica: node-1 has
        the same CPU and memory free on both sides, held by pods no resize can preempt."""
        assert self.cluster is not None
        values = yaml.safe_load((CHART / "values.yaml").read_text())
        self.cluster.create_namespace(ROOM_NAMESPACE)
        pods = [
            workload_pod(
                f"chart-room-{i}",
                self.image("workload"),
                values["priorityClassName"],
                {"requests": values["resources"]["requests"]},
                node=NODE_NAME,
                script=victim_script(0),
                grace_seconds=0,
                dns_policy="Default",
            )
            for i in range(int(values["replicaCount"]))
        ]
        self.cluster.kubectl(
            "apply", "-n", ROOM_NAMESPACE, "-f", "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}),
        )  # fmt: skip
        names = [f"pod/{p['metadata']['name']}" for p in pods]
        self.cluster.kubectl(
            "wait", "-n", ROOM_NAMESPACE, "--for=condition=Ready", *names, "--timeout=120s"
        )


def make_real_side(
    name: str, stack: NodeStack, images: Images, state_dir: Path | None = None
) -> RealSide:
    """A side not started yet; ``state_dir`` None: a temporary directory removed on stop."""
    if name not in SIDES:
        raise ValueError(f"unknown side {name!r}")
    directory = state_dir or Path(tempfile.mkdtemp(prefix=f"rpw-realcompare-{name}-"))
    side = RealSide(name, ensure_binaries(), directory, grace_cap=None, stack=stack, images=images)
    side._owns_dir = state_dir is None
    return side


class RealScenarioRun(ScenarioRun):
    """A scenario on node-1: its pods run the workload image with a process that takes
    the pod's grace period after SIGTERM."""

    def __init__(
        self, side: RealSide, scenario: sc.Scenario, tag: str, log: Log, victim_grace: int
    ) -> None:
        super().__init__(side, scenario, tag, log, victim_grace)
        self.real = side
        self.nodes = [NODE_NAME]
        self._account_ready = False

    def _pod_object(self, p: sc.PodSpec) -> dict[str, Any]:
        pod = super()._pod_object(p)
        spec = pod["spec"]
        # No cluster DNS and no kube-proxy run: the node's resolver, no Service variables.
        spec.update(dnsPolicy="Default", enableServiceLinks=False)
        container = spec["containers"][0]
        container["image"] = self.real.image("workload")
        container["command"] = ["sh", "-c", victim_script(self.victim_grace or 0)]
        return pod

    def _create(self, pod: dict[str, Any]) -> None:
        if not self._account_ready:
            # The ServiceAccount admission plugin refuses pods until the namespace's
            # default account exists.
            path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/default"
            self._wait(lambda: self.real.client.get_or_none(path), 30, "the default account")
            self._account_ready = True
        super()._create(pod)

    def cleanup(self) -> None:
        super().cleanup()
        try:
            self._wait(lambda: not self._pods(), 60, f"{self.namespace}'s pods gone")
        except (TimeoutError, ApiError) as e:
            self.log(f"  cleanup of {self.namespace}: {e}")


# --- the run ----------------------------------------------------------------------------------


@dataclass
class SideResult:
    allocatable: int
    requested: int
    scenarios: list[sc.Scenario]
    #: grace -> scenario name -> every run
    runs: dict[int, dict[str, list[Measured]]]


def run_side(
    side: RealSide,
    chosen: Sequence[sc.Scenario],
    graces: Sequence[int],
    repeat: int,
    log: Log = _stderr,
) -> SideResult:
    """Every scenario, scaled to node-1's free CPU, ``repeat`` times per grace period
    (after one unrecorded walkthrough)."""
    allocatable, requested = side.free_millicores()
    free = allocatable - requested
    scaled_scenarios = [scaled(s, free) for s in chosen]
    log(f"[{side.name}] node-1: {allocatable}m allocatable, {requested}m requested, {free}m free")
    log(f"[{side.name}] warm-up")
    RealScenarioRun(side, scaled(sc.walkthrough(), free), "warmup", log, graces[0]).run()
    runs: dict[int, dict[str, list[Measured]]] = {}
    for grace in graces:
        runs[grace] = {}
        for scenario in scaled_scenarios:
            runs[grace][scenario.name] = []
            for i in range(repeat):
                began = time.monotonic()
                measured = RealScenarioRun(side, scenario, f"g{grace}-r{i}", log, grace).run()
                runs[grace][scenario.name].append(measured)
                log(
                    f"[{side.name}] grace {grace} s {scenario.name} #{i}: "
                    f"victims={[v.split('/', 1)[1] for v in measured.victims]} "
                    f"first_eviction={measured.first_eviction_ms} ms "
                    f"actuated={measured.actuated_ms} ms api={measured.api_requests} "
                    f"({time.monotonic() - began:.0f} s)"
                    + (
                        f" kubectl errors: {measured.kubectl_errors}"
                        if measured.kubectl_errors
                        else ""
                    )
                )
    return SideResult(allocatable, requested, scaled_scenarios, runs)


def compare(
    chosen: Sequence[sc.Scenario],
    graces: Sequence[int],
    repeat: int,
    *,
    state_root: Path | None = None,
    log: Log = _stderr,
) -> dict[str, SideResult]:
    """side -> its results, each side on its own real-node cluster, one after the other."""
    stack, images = ensure_node_stack(), ensure_images()
    out: dict[str, SideResult] = {}
    for name in SIDES:
        state_dir = state_root / name if state_root is not None else None
        if state_dir is not None:
            state_dir.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        log(
            f"[{name}] starting the control plane, node-1"
            + (" and the chart" if name == "ours" else "")
        )
        side = make_real_side(name, stack, images, state_dir)
        try:
            side.start()
            out[name] = run_side(side, chosen, graces, repeat, log)
            if side.cluster is not None and side.cluster.errors:
                raise NodeError(f"the real node failed: {side.cluster.errors!r}")
        finally:
            side.stop()
        log(f"[{name}] done in {time.monotonic() - began:.0f} s")
    return out


# --- report -------------------------------------------------------------------------------------


def rows_for(grace: int, results: dict[str, SideResult]) -> list[dict[str, Any]]:
    """bench/compare's rows (medians of the runs) for one grace period."""
    combined = {
        side: {name: runner._combine(runs) for name, runs in r.runs[grace].items()}
        for side, r in results.items()
    }
    return runner.rows(next(iter(results.values())).scenarios, combined)


def ratios(data: list[dict[str, Any]]) -> list[str]:
    """Per scenario, ours over upstream for each time both sides have."""
    lines = []
    for row in data:
        parts = []
        for key, label in (("first_eviction_ms", "first eviction"), ("actuated_ms", "actuated")):
            ours, upstream = row["ours"][key], row["upstream"][key]
            if ours is not None and upstream:
                parts.append(f"{label} {ours / upstream:.2f}")
        lines.append(f"  {row['scenario']}: " + (", ".join(parts) or "no time on both sides"))
    return lines


def unexpected_victims(results: dict[str, SideResult]) -> list[str]:
    """Runs whose victims are not the ones the scenario's rules give (after scaling)."""
    lines = []
    for side, r in results.items():
        expected = {s.name: s.expected for s in r.scenarios}
        for grace, by_name in r.runs.items():
            for name, runs in by_name.items():
                want = sorted((expected[name] or {}).get(side, ()))
                for i, m in enumerate(runs):
                    got = sorted(v.split("/", 1)[1] for v in m.victims)
                    if got != want:
                        lines.append(f"{side} grace {grace} s {name} #{i}: {got}, expected {want}")
    return lines


def report(results: dict[str, SideResult], graces: Sequence[int], repeat: int) -> dict[str, Any]:
    """Prints the tables; returns what the results file holds."""
    by_grace: dict[str, Any] = {}
    for grace in graces:
        data = rows_for(grace, results)
        by_grace[str(grace)] = data
        print(f"victims' grace {grace} s (medians of {repeat}):")
        print(runner.table(data))
        print(runner.summary(data))
        print("ratios ours / upstream:")
        print("\n".join(ratios(data)))
        print()
    odd = unexpected_victims(results)
    print(
        "victims as the rules give, every run: " + ("no\n  " + "\n  ".join(odd) if odd else "yes")
    )
    return {
        "repeat": repeat,
        "machine": {"cpus": os.cpu_count(), "load_average_at_end": os.getloadavg()},
        "node": {
            side: {
                "allocatable_millicores": r.allocatable,
                "requested_millicores": r.requested,
                "free_millicores": r.allocatable - r.requested,
            }
            for side, r in results.items()
        },
        "scenarios": {s.name: sizes(s) for s in next(iter(results.values())).scenarios},
        "grace": by_grace,
        "runs": {
            side: {
                str(grace): {name: [m.as_json() for m in runs] for name, runs in by_name.items()}
                for grace, by_name in r.runs.items()
            }
            for side, r in results.items()
        },
        "unexpected_victims": odd,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.realcompare", description=__doc__)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each scenario")
    parser.add_argument(
        "--grace", type=int, nargs="+", default=list(GRACES), metavar="SECONDS",
        help="the pods' terminationGracePeriodSeconds, each a set of runs (default 0 5)",
    )  # fmt: skip
    parser.add_argument("--only", nargs="*", default=None, help="scenario names to run")
    parser.add_argument("--quick", action="store_true", help="one run, grace 0 only (smoke)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--state-dir", type=Path, default=None, help="keep the logs here")
    args = parser.parse_args(argv)
    repeat, graces = (1, [0]) if args.quick else (args.repeat, args.grace)
    chosen = [make() for make in SCENARIOS]
    if args.only:
        chosen = [s for s in chosen if s.name in args.only]
    install_signal_handlers()
    check_machine()
    began, load_at_start = time.monotonic(), os.getloadavg()
    results = compare(chosen, graces, repeat, state_root=args.state_dir)
    data = report(results, graces, repeat)
    data["command"] = " ".join(["python -m bench.realcompare", *(argv or sys.argv[1:])])
    data["machine"]["load_average_at_start"] = load_at_start
    data["minutes"] = round((time.monotonic() - began) / 60, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=2) + "\n")
    out = args.out.resolve()
    print(f"wrote {out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out}")
    return 1 if data["unexpected_victims"] else 0


if __name__ == "__main__":
    sys.exit(main())
