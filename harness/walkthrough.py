"""The resize walkthrough's sizes on a node of any size: the seed walkthrough of an 8-CPU
node scaled to the CPU a node has free, and the resize patch that grows the preemptor.
Shared by the real-node demos (:mod:`harness.realdemo`, :mod:`harness.pausedemo`), the
real-node tests and the benchmarks that replay the walkthrough."""

from __future__ import annotations

import json
from dataclasses import dataclass

#: Rounding of the scaled sizes, in millicores: figures a person reads at a glance.
STEP = 10


@dataclass(frozen=True)
class Walkthrough:
    """The walkthrough's sizes in millicores: the victim, the preemptor, its new size."""

    low: int
    high: int
    target: int


def scaled_walkthrough(allocatable: int, requested: int, step: int = STEP) -> Walkthrough:
    """The seed walkthrough (an 8-CPU node: low 3, high 4 -> 6) scaled to the CPU the node
    has free (``allocatable - requested`` millicores), each size rounded down to ``step``.

    Keeps the story: both pods fit; the grown preemptor fits on its own; it does not fit
    next to the victim. Raises ValueError when the node is too small for that.
    """
    free = allocatable - requested

    def scaled(eighths: int) -> int:
        return free * eighths // 8 // step * step

    walk = Walkthrough(low=scaled(3), high=scaled(4), target=scaled(6))
    fits = walk.low > 0 and walk.low + walk.high <= free and walk.high < walk.target <= free
    if not fits or walk.low + walk.target <= free:
        raise ValueError(
            f"node has {free}m CPU free ({allocatable}m allocatable, {requested}m requested): "
            "too little to replay the walkthrough"
        )
    return walk


def resize_patch(millicores: int) -> str:
    cpu = f"{millicores}m"
    return json.dumps(
        {"spec": {"containers": [{"name": "app", "resources": {
            "requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}]}}
    )  # fmt: skip
