"""The real-node comparison scales the comparison's scenarios (:mod:`harness.compare`) to
the CPU node-1 has free, as the real-node walkthrough is scaled, lending floors included."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness import quantity
from harness.compare import scenarios as sc
from harness.compare.realnode import scaled, sizes
from harness.walkthrough import scaled_walkthrough
from webhook.core.model import FLOOR_ANNOTATION


@pytest.mark.parametrize(
    ("scenario", "free", "expected_pods", "expected_resizes"),
    [
        pytest.param(
            sc.walkthrough(), 1800,
            {"low-priority-pod": "670m", "high-priority-pod": "900m"},
            {"high-priority-pod": "1350m"},
            id="walkthrough-on-2-cpus-less-the-chart",
        ),
        pytest.param(
            sc.mixed_priorities(), 1800,
            {"p100-old": "220m", "p300": "220m", "p200": "220m", "p100-new": "220m",
             "p50": "110m", "peer": "220m", "high": "450m"},
            {"high": "1120m"},
            id="mixed-priorities-rounded-down-to-10m",
        ),
        pytest.param(
            sc.walkthrough(), 8000,
            {"low-priority-pod": "3000m", "high-priority-pod": "4000m"},
            {"high-priority-pod": "6000m"},
            id="the-scenarios-own-node-size-changes-nothing",
        ),
    ],
)  # fmt: skip
def test_every_size_is_scaled_to_the_free_cpu(
    scenario: sc.Scenario,
    free: int,
    expected_pods: dict[str, str],
    expected_resizes: dict[str, str],
) -> None:
    actual = sizes(scaled(scenario, free))
    assert (expected_pods, expected_resizes) == (actual["pods"], actual["resizes"])


def test_the_lending_floor_is_scaled_with_the_pods() -> None:
    lender = {p.name: p for p in scaled(sc.lending(), 1800).pods}["low-priority-pod"]
    assert {"app": {"cpu": "220m"}} == json.loads(lender.annotations[FLOOR_ANNOTATION])


def test_a_scenario_of_several_nodes_is_refused() -> None:
    with pytest.raises(ValueError, match="one node"):
        scaled(sc.scale(nodes=2, pods_per_node=5, concurrent=1), 1800)


@given(free=st.integers(min_value=1000, max_value=64_000))
def test_the_walkthrough_scales_as_the_real_node_demo_does(free: int) -> None:
    walk = scaled_walkthrough(free, 0)
    scenario = scaled(sc.walkthrough(), free)
    pods = {p.name: quantity.milli_value(p.cpu) for p in scenario.pods}
    assert (walk.low, walk.high, walk.target) == (
        pods["low-priority-pod"],
        pods["high-priority-pod"],
        quantity.milli_value(scenario.resizes[0].cpu),
    )
