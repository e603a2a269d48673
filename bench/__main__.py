"""``python -m bench [NAME ...]``: run the named benchmarks, or all of them.

Each benchmark is a module under ``bench`` with a ``main(argv) -> int``; it prints a small
table and writes its figures to ``bench/results/NAME.json`` through
:class:`harness.provenance.Run` (the commit, date, load and command with them). The rigs
they drive live in ``harness`` (the tests drive the same ones). One-off experiments are
under ``bench.experiments``. Those that start the real node (root, one at a time per
machine: ``docs/real-node.md``) run only when named.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: Benchmark name -> module. Add new benchmarks here.
BENCHMARKS: dict[str, str] = {
    "plan": "bench.plan_bench",
    "cache": "bench.cache_bench",
    "review": "bench.review_bench",
    "faults": "bench.faults",
    "faults-control-plane": "bench.faults_control_plane",
    "flood": "bench.flood",
    "flood-cluster": "bench.flood_cluster",
    "body-flood": "bench.body_flood",
    "vpa": "bench.vpa",
    "realnode": "bench.realnode",
    "realcompare": "bench.realcompare",
    "lender-memory": "bench.experiments.lender_memory",
    "checkpoint": "bench.checkpoint",
    "checkpoint-actuation": "bench.checkpoint_actuation",
    "containerd-overlay-diff": "bench.experiments.containerd_overlay_diff",
}
#: Run only when named: they start the real node.
REAL_NODE = frozenset(
    {
        "realnode",
        "realcompare",
        "lender-memory",
        "checkpoint",
        "checkpoint-actuation",
        "containerd-overlay-diff",
    }
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="Run benchmarks (all when none is named)."
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(BENCHMARKS))
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument(
        "--quick", action="store_true", help="fewer repetitions (a smoke run, not figures)"
    )
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(BENCHMARKS))
        return 0
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark {', '.join(unknown)} (known: {', '.join(BENCHMARKS)})")
    status = 0
    for name in args.names or [n for n in BENCHMARKS if n not in REAL_NODE]:
        module = importlib.import_module(BENCHMARKS[name])
        status |= module.main(["--quick"] if args.quick else [])
    return status


if __name__ == "__main__":
    sys.exit(main())
