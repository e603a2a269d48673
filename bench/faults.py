"""Fault injection (``python -m bench faults [--runs 20] [--seed N]``): starts a local
control plane (the test harness's) and repeats :class:`harness.fault_rig.FaultRig`'s run,
a service replica SIGKILLed at a random point of a 3-victim preemption; prints a table and
writes ``bench/results/faults.json``.

``--fault`` breaks the control plane instead (``python -m bench faults-control-plane``):
``kube-apiserver``, ``etcd-stall``, ``etcd-restart``, or ``control-plane``: the three,
``--runs`` times for kube-apiserver and a third as often for each etcd fault, written to
``bench/results/faults-control-plane.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from harness.fault_rig import APISERVER_POINTS, CONTROL_PLANE_KINDS, FaultRig, RunResult
from harness.provenance import Run

RESULTS = Path(__file__).parent / "results" / "faults.json"


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
        "ready_after": sum(1 for r in results if r.ready_after),
        "patches_made_again": sum(r.patch_attempts - 1 for r in results),
        "failed_open": sum(1 for r in results if r.failed_open),
        "reconciler_planned": sum(1 for r in results if r.reconciler_planned),
        "late_admission_entries_landed": sum(1 for r in results if r.admission_entry_landed),
        "late_admission_entries_left": sum(1 for r in results if r.admission_entry_left),
        "all_ok": all(r.ok for r in results),
        "median_seconds": sorted(r.seconds for r in results)[len(results) // 2] if results else 0,
        "max_seconds": max((r.seconds for r in results), default=0),
        "median_down_seconds": (
            sorted(r.down_seconds for r in results)[len(results) // 2] if results else 0
        ),
    }


def print_table(results: Sequence[RunResult]) -> None:
    header = (
        f"{'run':>3}  {'kind':14}  {'target':8}  {'fault':22}  {'hit':3}  {'evicted':19}  "
        f"{'calls':>5}  {'double':>6}  {'unneeded':>8}  {'actuated':8}  {'released':8}  "
        f"{'ready':5}  {'patches':>7}  {'s':>5}"
    )
    print(header)
    for r in results:
        print(
            f"{r.run:>3}  {r.kind:14}  {r.target:8}  {r.fault:22}  "
            f"{'yes' if r.killed else '-':3}  "
            f"{','.join(x.removeprefix('low-') for x in r.evicted):19}  {r.eviction_calls:>5}  "
            f"{r.double_evictions:>6}  {r.unneeded_evictions:>8}  {r.actuated!s:8}  "
            f"{r.released!s:8}  {r.ready_after!s:5}  {r.patch_attempts:>7}  {r.seconds:>5.1f}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench faults", description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--fault",
        choices=("replica", *CONTROL_PLANE_KINDS, "control-plane"),
        default="replica",
        help="what is broken: a service replica (default), kube-apiserver, etcd; "
        "control-plane: kube-apiserver --runs times, then each etcd fault a third as often",
    )
    parser.add_argument("--quick", action="store_true", help="3 runs (a smoke run)")
    parser.add_argument("--no-write", action="store_true", help="do not write the results")
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="keep certificates, logs and etcd data here (default: a temporary directory)",
    )
    args = parser.parse_args(argv)
    started = Run()
    runs = 3 if args.quick else args.runs
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    if args.fault == "control-plane":
        plan = [("kube-apiserver", runs)] + [
            (k, max(1, runs // 3)) for k in CONTROL_PLANE_KINDS[1:]
        ]
    else:
        plan = [(args.fault, runs)]

    from harness.binaries import ensure_binaries
    from harness.launcher import ControlPlane, ControlPlaneConfig
    from harness.nodes import HollowNodes, NodeOptions, default_nodes

    binaries = ensure_binaries()
    results: list[RunResult] = []
    with contextlib.ExitStack() as scope:
        if args.state_dir is not None:
            state = args.state_dir
            state.mkdir(parents=True, exist_ok=True)
        else:
            state = Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="rpw-faults-")))
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
                    control_plane=cp,
                ).start()
                reviews: dict[str, Any] = {}
                try:
                    for kind, count in plan:
                        for k in range(count):
                            i = len(results)
                            if kind == "replica":
                                results.append(rig.run_once(i))
                            elif kind == "kube-apiserver":
                                # Every point of the plan, in turn, and a random delay
                                # after the resize between them.
                                fault = (
                                    APISERVER_POINTS[(k // 2) % len(APISERVER_POINTS)]
                                    if k % 2 == 0
                                    else f"delay {rig.rng.uniform(0.0, 3.0):.2f}s"
                                )
                                results.append(rig.run_control_plane(i, kind, fault=fault))
                            else:
                                results.append(rig.run_control_plane(i, kind))
                    if args.fault != "replica":
                        # Replicas that were never restarted: their counters cover it all.
                        reviews = rig.review_figures()
                finally:
                    rig.stop()
    print_table(results)
    summaries = {kind: summarize([r for r in results if r.kind == kind]) for kind, _ in plan}
    summary = summaries[plan[0][0]] if len(plan) == 1 else summarize(results)
    summary["seed"] = seed
    report: dict[str, Any] = {"summary": summary}
    if reviews:
        report["reviews"] = reviews
    if len(plan) > 1:
        report["by_fault"] = summaries
    print(json.dumps(report, indent=2))
    if not args.no_write and not args.quick:
        name = "faults.json" if args.fault == "replica" else f"faults-{args.fault}.json"
        path = RESULTS.parent / name
        started.write(
            path,
            {
                "command": f"python -m bench.faults --fault {args.fault} --runs {runs} "
                f"--seed {seed}",
                **report,
                "runs": [asdict(r) for r in results],
            },
        )
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
