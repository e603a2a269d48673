"""The overlay-diff benchmark's summary: per node stack and image, the median checkpoint
call and what a checkpointed victim added to the evicted one's median actuation."""

from __future__ import annotations

from typing import Any

from bench.experiments.containerd_overlay_diff import summarize


def run(stack: str, image: str, actuated: float, checkpoint: float | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"stack": stack, "image": image, "actuated_s": actuated}
    row["victim"] = "evicted" if checkpoint is None else "checkpointed"
    if checkpoint is not None:
        row["checkpoint_s"] = checkpoint
    return row


def test_each_stack_and_image_has_its_own_medians() -> None:
    rows = [
        run("stock", "product", 0.5), run("stock", "product", 2.25, 1.75),
        run("stock", "product", 0.75), run("stock", "product", 2.0, 1.5),
        run("stock", "product", 0.25), run("stock", "product", 3.0, 2.5),
        run("overlay-diff", "product", 0.5), run("overlay-diff", "product", 1.25, 0.75),
        run("stock", "workload", 0.25), run("stock", "workload", 1.0, 0.625),
        run("overlay-diff", "workload", 0.5), run("overlay-diff", "workload", 1.0, 0.5),
    ]  # fmt: skip

    summary = summarize(rows, ("product", "workload"))

    assert {
        "stock": {
            "product": {"checkpoint_s_median": 1.75, "actuated_evicted_s": 0.5,
                        "actuated_checkpointed_s": 2.25, "added_s": 1.75},
            "workload": {"checkpoint_s_median": 0.625, "actuated_evicted_s": 0.25,
                         "actuated_checkpointed_s": 1.0, "added_s": 0.75},
        },
        "overlay-diff": {
            "product": {"checkpoint_s_median": 0.75, "actuated_evicted_s": 0.5,
                        "actuated_checkpointed_s": 1.25, "added_s": 0.75},
            "workload": {"checkpoint_s_median": 0.5, "actuated_evicted_s": 0.5,
                         "actuated_checkpointed_s": 1.0, "added_s": 0.5},
        },
    } == summary  # fmt: skip
