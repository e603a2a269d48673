"""Review flood against the service itself (``python -m bench flood-cluster``; 60 s,
``--quick``: 12 s): starts the local control plane (the test harness's: kube-apiserver,
etcd, a v1.37.2 kubelet as hollow node ``node-1``) and the service process, runs
:class:`harness.cluster_flood.ClusterFlood`, prints its figures and what did not hold, and
writes ``bench/results/flood-cluster.json``."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from harness.cluster_flood import CLEAR_WITHIN, ClusterFlood, FloodRun, failures
from harness.flood import API_SERVER_TIMEOUT
from harness.provenance import Run

RESULTS = Path(__file__).resolve().parent / "results" / "flood-cluster.json"


def table(run: FloodRun) -> str:
    c = run.counts
    lines = [
        f"review flood, real ledger: saturation {run.saturation_per_s} reviews/s "
        f"(4 connections); offered x{run.factor:g}, {run.offered_per_s:.0f}/s for "
        f"{run.seconds:g} s",
        f"{'offered':>8} {'decided':>7} {'fail-open':>9} {'overload':>8} {'timed out':>9} "
        f"{'conn err':>8} {'5xx':>4} {'p50 ms':>7} {'p99 ms':>8} {'RSS MB':>13} {'alive':>5}",
        f"{run.offered:>8} {c.get('full', 0):>7} {c.get('failed open', 0):>9} "
        f"{c.get('overloaded', 0):>8} {c.get('timed out', 0):>9} "
        f"{c.get('connection error', 0):>8} {run.server_errors_5xx:>4} "
        f"{run.latency_all.get('p50_ms', 0):>7.1f} {run.latency_all.get('p99_ms', 0):>8.1f} "
        f"{run.rss_mb_before:>6.1f}->{run.rss_mb_after:<6.1f}"
        f"{'yes' if run.worker_alive else 'NO':>5}",
        f"grower entries: none holding room {run.grower_entries_cleared_after_s} s after the "
        f"flood (bound {CLEAR_WITHIN:g} s), at most {run.grower_entries_stored_max} stored",
        f"real resize at {run.resize_at_s} s: planned by {run.planned_by or 'nobody'}, "
        f"victims {run.plan_victims}, evicted {run.evicted}, actuated {run.actuated} "
        f"({run.actuated_after_flood_s} s after the flood), released {run.real_entry_released}",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench flood-cluster", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="12 s, no results file")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--factor", type=float, default=4.0)
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    seconds = 12.0 if args.quick else args.seconds
    started = Run()

    import secrets

    from harness.binaries import ensure_binaries
    from harness.launcher import ControlPlane, ControlPlaneConfig
    from harness.nodes import HollowNodes, NodeOptions, default_nodes
    from harness.webhook_process import NAMESPACE, start_webhook

    binaries = ensure_binaries()
    with contextlib.ExitStack() as scope:
        state = Path(scope.enter_context(tempfile.TemporaryDirectory(prefix="rpw-flood-")))
        cp = scope.enter_context(ControlPlane(binaries, ControlPlaneConfig(state_dir=state)))
        scope.enter_context(HollowNodes(cp, default_nodes(1), NodeOptions(stop_grace_cap=1.0)))
        suffix = secrets.token_hex(3)
        classes = {"high": f"high-{suffix}", "low": f"low-{suffix}"}
        for key, value in (("high", 1_000_000), ("low", 1_000)):
            cp.client.create(
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                {"metadata": {"name": classes[key]}, "value": value},
            )
        namespace = f"flood-{suffix}"
        cp.client.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        service = start_webhook(cp.client, cp.kubeconfig, cp.state_dir)
        scope.callback(service.stop)
        rig = ClusterFlood(
            cp.client,
            binaries.kubectl,
            cp.kubeconfig,
            cp.log_dir / "audit.log",
            service,
            cp.state_dir / "logs" / "webhook.log",
            namespace=namespace,
            classes=classes,
            ledger_namespace=NAMESPACE,
            workdir=state,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
        run = rig.run(seconds, args.factor, saturation_seconds=5.0 if args.quick else 10.0)
    print(table(run))
    failed = failures(run)
    for message in failed:
        print(f"FAILED: {message}")
    if not args.quick:
        report = {
            "benchmark": "review_flood_cluster",
            "command": f"python -m bench flood-cluster --seconds {seconds:g} "
            f"--factor {args.factor:g}",
            "server": "python -m webhook serve, its defaults (one gevent worker, TLS), against "
            "kube-apiserver v1.37.2 and etcd on loopback, one hollow v1.37.2 kubelet; ledger "
            "in node-1's Lease",
            "client": "harness.flood's open-loop client (25 idle connections, each call given "
            f"up after {API_SERVER_TIMEOUT} s), reviews of 3 live pods in turn",
            "cpus": os.cpu_count(),
            "failures": failed,
            **run.summary(),
        }
        started.write(RESULTS, report)
        print(f"wrote {RESULTS}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
