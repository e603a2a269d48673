"""The checkpoint-actuation benchmark's summary: medians of each kind of victim, the time a
checkpointed victim adds and whether that meets the 1 s target, and the restored counts."""

from __future__ import annotations

from typing import Any

import pytest

from bench.checkpoint_actuation import counts_after, victim_summary


def evicted(actuated: float) -> dict[str, Any]:
    return {"victim": "evicted", "actuated_s": actuated}


def checkpointed(actuated: float, checkpoint: float, before: int, after: int) -> dict[str, Any]:
    return {
        "victim": "checkpointed", "actuated_s": actuated, "checkpoint_s": checkpoint,
        "imaged_s": 4.0, "restore_running_s": 1.5, "restore_counting_s": 1.75,
        "count_before": before, "count_after": after,
    }  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        pytest.param(
            [evicted(0.5), checkpointed(2.0, 1.5, 2, 3), evicted(1.5),
             checkpointed(2.5, 1.75, 2, 3), evicted(0.25), checkpointed(3.0, 2.0, 4, 5)],
            {"actuated_evicted_s": 0.5, "actuated_checkpointed_s": 2.5, "added_s": 2.0,
             "ratio": 5.0, "target_met": False, "checkpoint_s_median": 1.75,
             "counts_went_on": True},
            id="medians-not-means-and-the-target-missed",
        ),
        pytest.param(
            [evicted(0.5), checkpointed(1.5, 0.75, 2, 3)],
            {"actuated_evicted_s": 0.5, "actuated_checkpointed_s": 1.5, "added_s": 1.0,
             "ratio": 3.0, "target_met": True, "checkpoint_s_median": 0.75,
             "counts_went_on": True},
            id="one-second-added-meets-the-target",
        ),
        pytest.param(
            [evicted(0.5), checkpointed(1.0, 0.5, 7, 1)],
            {"actuated_evicted_s": 0.5, "actuated_checkpointed_s": 1.0, "added_s": 0.5,
             "ratio": 2.0, "target_met": True, "checkpoint_s_median": 0.5,
             "counts_went_on": False},
            id="a-count-started-afresh-is-told",
        ),
    ],
)  # fmt: skip
def test_summary(rows: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    summary = victim_summary(rows)
    assert expected == {key: summary[key] for key in expected}


@pytest.mark.parametrize(
    ("counts", "since", "expected"),
    [
        pytest.param([(1, 10.0), (2, 10.5), (3, 30.0)], 20.0, [3], id="after-the-shrink"),
        pytest.param([(1, 10.0), (2, 10.5)], 20.0, None, id="none-yet"),
        pytest.param([], 20.0, None, id="unreadable"),
    ],
)
def test_counts_after(counts: list[tuple[int, float]], since: float, expected: Any) -> None:
    assert expected == counts_after(counts, since)
