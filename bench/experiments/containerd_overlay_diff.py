"""A checkpointed victim's cost with containerd's stock walking differ, against the same
containerd reading an overlay container's changes from its upper directory.

``python -m bench.experiments.containerd_overlay_diff [--repeat 3]`` (as root, after
``make node``; it starts its own node, so not beside ``make cluster``) builds the node stack of
``bench/experiments/containerd/build-overlay-diff.sh`` (containerd of the same version with
``walking-overlay.patch``), then alternates the two stacks ``--repeat`` times, each round
a fresh node running :func:`bench.checkpoint_actuation.measure` once per image and kind of
victim. Its table: per stack and image, the medians of the kubelet's checkpoint call (the
``Checkpointed`` event's time) and of what the checkpoint added to actuation. Figures go to
``bench/results/checkpoint-overlay-diff.json``.

Why: containerd's checkpoint diffs the container's writable layer with the walking differ,
which compares the content of every file of the image whose time has no sub-second part
(docs/checkpoint.md, "Where the checkpoint's time goes"); this measures what reading only
overlayfs's upper directory changes, for a large image (the product's, Python) and a small
one (busybox).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from bench.checkpoint_actuation import IMAGES, measure
from harness.binaries import REPO_ROOT
from harness.processes import install_signal_handlers
from harness.provenance import Run
from harness.realnode import check_machine
from webhook.core.resources import memory_bytes

RESULTS = REPO_ROOT / "bench" / "results" / "checkpoint-overlay-diff.json"
BUILD = REPO_ROOT / "bench" / "experiments" / "containerd" / "build-overlay-diff.sh"
STACKS = ("stock", "overlay-diff")
KEYS = ("checkpoint_s", "actuated_s")


def build() -> str:
    """The patched node stack's directory (built on first use, progress on stderr)."""
    result = subprocess.run(["bash", str(BUILD)], stdout=subprocess.PIPE, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise SystemExit(f"{BUILD.name} failed (exit {result.returncode}); run it to see why")
    return lines[-1]


def _median(rows: list[dict[str, Any]], **match: str) -> dict[str, float]:
    chosen = [r for r in rows if all(r[k] == v for k, v in match.items())]
    return {
        key: round(statistics.median(r[key] for r in chosen if key in r), 3)
        for key in KEYS
        if any(key in r for r in chosen)
    }


def summarize(rows: list[dict[str, Any]], images: Sequence[str]) -> dict[str, Any]:
    """Per stack and image: the checkpoint call's median, and the checkpointed victims'
    median actuation less the evicted ones'."""
    summary: dict[str, Any] = {}
    for stack in STACKS:
        for image in images:
            evicted = _median(rows, stack=stack, image=image, victim="evicted")
            checkpointed = _median(rows, stack=stack, image=image, victim="checkpointed")
            summary.setdefault(stack, {})[image] = {
                "checkpoint_s_median": checkpointed["checkpoint_s"],
                "actuated_evicted_s": evicted["actuated_s"],
                "actuated_checkpointed_s": checkpointed["actuated_s"],
                "added_s": round(checkpointed["actuated_s"] - evicted["actuated_s"], 3),
            }
    return summary


def _print(summary: dict[str, Any]) -> None:
    heads = ("stack", "image", "checkpoint_s", "evicted_s", "checkpointed_s", "added_s")
    print("  ".join(f"{h:>14}" for h in heads))
    for stack, images in summary.items():
        for image, s in images.items():
            cells = (stack, image, s["checkpoint_s_median"], s["actuated_evicted_s"],
                     s["actuated_checkpointed_s"], s["added_s"])  # fmt: skip
            print("  ".join(f"{c!s:>14}" for c in cells))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.experiments.containerd_overlay_diff",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds of both stacks")
    parser.add_argument("--size", default="100Mi", help="the victim's memory to hold")
    args = parser.parse_args(argv)
    started = Run()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    install_signal_handlers()
    check_machine()
    patched, size = build(), memory_bytes(args.size)
    rows: list[dict[str, Any]] = []
    loads = [os.getloadavg()]
    for round_ in range(args.repeat):
        for stack, assets in zip(STACKS, (None, patched), strict=True):
            os.environ.pop("RPW_NODE_ASSETS", None)
            if assets is not None:
                os.environ["RPW_NODE_ASSETS"] = assets
            _, runs, _ = measure(size, IMAGES, 1)
            rows += [r | {"stack": stack, "round": round_} for r in runs]
    os.environ.pop("RPW_NODE_ASSETS", None)
    loads.append(os.getloadavg())
    summary = summarize(rows, IMAGES)
    _print(summary)
    figures = {"size": args.size, "repeat": args.repeat, "load_average_before": loads[0],
               "load_average_after": loads[1], "runs": rows, "summary": summary}  # fmt: skip
    started.write(RESULTS, figures)
    print(f"load average (1, 5, 15 min): before {loads[0]}, after {loads[1]}")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
