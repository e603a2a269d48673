"""Resize preemption on the real node: this webhook vs kube-scheduler v1.37.2.

``python -m bench.realcompare [--repeat 3] [--grace 0 5]`` (as root, after ``make node``;
it starts its own clusters, one after the other, so not beside ``make cluster``) runs the
scenarios of ``make compare`` (:mod:`harness.compare.scenarios`) on a cluster whose
``node-1`` is the real kubelet on containerd (:class:`harness.realcluster.RealCluster`):

* ``ours``: the alpha gate off everywhere; the webhook installed by its Helm chart from the
  locally built image (two replicas on node-1, called by kube-apiserver through the
  chart's Service);
* ``upstream``: ``InPlacePodVerticalScalingSchedulerPreemption=true`` on kube-apiserver,
  kube-scheduler, kube-controller-manager and the kubelet; no webhook. Two pods with the
  chart's priority class and requests take the room the chart's replicas take on the
  other side, so both sides scale the scenarios to the same free CPU.

The scenarios (walkthrough, mixed-priorities, lending) are scaled to the CPU node-1 has
free, as :func:`harness.walkthrough.scaled_walkthrough` scales the walkthrough: every size
times free / the scenario's node size, rounded down to 10m (the lending floors too). Each
pod runs the workload image with a process that traps SIGTERM and then sleeps the pod's
grace period before it exits, so a victim's removal really takes it. For every grace
period asked (``--grace``, default 0 and 5 s) each scenario runs ``--repeat`` times on
each side, measured by :class:`harness.compare.runner.ScenarioRun` (the watch, the timings
from kubectl's return, the audit-log count); the table gives the medians.

Prints one table per grace period and writes ``bench/results/compare-realnode.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.compare import runner
from harness.binaries import REPO_ROOT
from harness.compare import scenarios as sc
from harness.compare.realnode import RealScenarioRun, RealSide, make_real_side, scaled, sizes
from harness.compare.runner import Measured, combine
from harness.compare.sides import SIDES
from harness.nodes import NodeError
from harness.processes import install_signal_handlers
from harness.provenance import Run
from harness.realnode import check_machine, ensure_images, ensure_node_stack

RESULTS = REPO_ROOT / "bench" / "results" / "compare-realnode.json"
SCENARIOS: tuple[Callable[[], sc.Scenario], ...] = (
    sc.walkthrough,
    sc.mixed_priorities,
    sc.lending,
)
GRACES = (0, 5)

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


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
    """The comparison's rows (medians of the runs) for one grace period."""
    combined = {
        side: {name: combine(runs) for name, runs in r.runs[grace].items()}
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
    run = Run()
    install_signal_handlers()
    check_machine()
    began, load_at_start = time.monotonic(), os.getloadavg()
    results = compare(chosen, graces, repeat, state_root=args.state_dir)
    data = report(results, graces, repeat)
    data["command"] = " ".join(["python -m bench.realcompare", *(argv or sys.argv[1:])])
    data["machine"]["load_average_at_start"] = load_at_start
    data["minutes"] = round((time.monotonic() - began) / 60, 1)
    out = run.write(args.out, data).resolve()
    print(f"wrote {out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out}")
    return 1 if data["unexpected_victims"] else 0


if __name__ == "__main__":
    sys.exit(main())
