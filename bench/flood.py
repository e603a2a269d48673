"""Review flood: one replica driven at a multiple of what it sustains, as the API server
would (the rig: :mod:`harness.flood`).

``python -m bench flood`` (60 s) or ``python -m bench flood --quick`` (a few seconds)
measures the replica's saturation, then offers ``--factor`` (4) times that rate for
``--seconds`` (60) from a client that behaves as the API server's webhook client does,
with and without the overload answer (``--shed-delay 0`` switches it off), and writes
``bench/results/flood.json``. ``--relist-pods N`` instead measures reviews at half
saturation while the same worker's pod reflector relists N pods over and over
(``bench/results/flood-relist.json``).

The same client floods the service itself, with its Lease ledger and a real kubelet, in
:mod:`bench.flood_cluster` (``python -m bench flood-cluster``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.flood import drive_review, flood, flood_server, review_files, run
from harness.provenance import Run

RESULTS = Path(__file__).resolve().parent / "results" / "flood.json"
RELIST_RESULTS = RESULTS.with_name("flood-relist.json")


def relist_run(
    pods: int, seconds: float, share: float, shed_delay: float | None = None
) -> dict[str, Any]:
    """Reviews at ``share`` of saturation for ``seconds``, without and then with the pod
    reflector of the same worker process relisting ``pods`` pods over and over (then that
    again without the overload answer)."""
    from bench.cache_bench import generate

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="flood-relist-") as tmp:
        files = review_files(tmp)
        pages = Path(tmp, "pods.jsonl")
        generate(pages, pods, max(1, pods // 30))
        with flood_server(files, None) as (port, _):
            saturation = drive_review(port, files, 5.0, closed=4)
        sustained = saturation["counts"].get("full", 0) / saturation["seconds"]
        rate = round(sustained * share, 1)
        quiet = flood(files, rate, seconds, shed_delay)
        busy = flood(files, rate, seconds, shed_delay, relist=pages)
        # The same without the overload answer (the server before it had one).
        unprotected = flood(files, rate, seconds, 0.0, relist=pages)
        relists = [json.loads(line) for line in pages.with_suffix(".log").read_text().splitlines()]
    return {
        "benchmark": "reviews_during_relist",
        "server": "gunicorn, the webhook's gevent worker, 1 worker, TLS; reviews decided on "
        "the review benchmark's in-process cluster while the same process's pod reflector "
        f"relists {pods} pods (bench.cache_bench's pods, pages of 100) over and over",
        "cpus": os.cpu_count(),
        "load_average_1m": {"before": load_before[0], "after": os.getloadavg()[0]},
        "saturation_per_s": round(sustained, 1),
        "offered_per_s": rate,
        "seconds": seconds,
        "without_relist": quiet,
        "with_relist": busy,
        "with_relist_unprotected": unprotected,
        "relists": {
            "count": len(relists),
            "first_sync_s": round(relists[0]["seconds"], 2) if relists else None,
            "median_s": round(statistics.median(r["seconds"] for r in relists), 2)
            if relists
            else None,
            "pods": relists[-1]["pods"] if relists else 0,
        },
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"review flood: saturation {result['saturation_per_s']} reviews/s (4 connections, "
        f"closed loop); offered x{result['factor']} for {result['seconds']} s",
        f"{'shed delay':>10} {'offered/s':>9} {'full':>7} {'overload':>8} {'timed out':>9} "
        f"{'conn err':>8} {'5xx':>4} {'p50 ms':>7} {'p99 ms':>8} {'RSS MB':>13} {'alive':>5}",
    ]
    for r in result["runs"]:
        c = r["counts"]
        shed = "off" if r["shed_delay_s"] == 0 else "default"
        lines.append(
            f"{shed:>10} {r['offered_per_s']:>9.0f} {c.get('full', 0):>7} "
            f"{c.get('overloaded', 0):>8} {c.get('timed out', 0):>9} "
            f"{c.get('connection error', 0):>8} {r['server_errors_5xx']:>4} "
            f"{r['latency_all']['p50_ms']:>7.1f} {r['latency_all']['p99_ms']:>8.1f} "
            f"{r['worker_rss_mb']['before']:>6.1f}->{r['worker_rss_mb']['after']:<6.1f}"
            f"{'yes' if r['worker_alive'] else 'NO':>5}"
        )
    load = result["load_average_1m"]
    lines.append(f"load average (1 min): {load['before']:.2f} before, {load['after']:.2f} after")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench flood")
    parser.add_argument("--quick", action="store_true", help="a few seconds, no results file")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--factor", type=float, default=4.0)
    parser.add_argument(
        "--protected-only", action="store_true", help="skip the run without the overload answer"
    )
    parser.add_argument(
        "--shed-delay", type=float, default=None, help="the server's (default: its default)"
    )
    parser.add_argument(
        "--relist-pods",
        type=int,
        default=0,
        help="instead: reviews at half saturation while the worker relists this many pods",
    )
    args = parser.parse_args(argv)
    started = Run()
    if args.relist_pods:
        result = relist_run(
            args.relist_pods, 5.0 if args.quick else args.seconds / 2, 0.5, args.shed_delay
        )
        print(json.dumps(result, indent=2))
        if not args.quick:
            started.write(RELIST_RESULTS, result)
        return 0
    seconds = 5.0 if args.quick else args.seconds
    result = run(seconds, args.factor, not args.protected_only, args.shed_delay)
    print(table(result))
    if not args.quick:
        started.write(RESULTS, result)
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
