"""Metrics observed a batch at a time read as observed one by one (the same counts; a
sum added once per batch may differ from one added value by value in its last digits)."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from webhook.engine.metrics import LATENCY_BUCKETS_SECONDS, METRICS, MetricDef, observe_all

#: Every bound, and values just around them: where "<=" and "<" part ways.
EDGES = [b + d for b in LATENCY_BUCKETS_SECONDS for d in (-1e-9, 0.0, 1e-9)]


def samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    """Every sample but the creation times (which differ by the microsecond)."""
    return [
        (s.name, s.labels, s.value)
        for metric in registry.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    ]


def histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram(
        "h", "a histogram", ["endpoint"], buckets=LATENCY_BUCKETS_SECONDS, registry=registry
    )


@given(
    st.lists(
        st.one_of(
            st.sampled_from(EDGES),
            st.floats(min_value=-1.0, max_value=10.0, allow_nan=False),
        ),
        max_size=60,
    )
)
def test_a_batch_reads_as_each_value_observed(amounts: list[float]) -> None:
    one_by_one, each = histogram()
    child = each.labels("validate")
    for a in amounts:
        child.observe(a)
    batched, batch = histogram()

    observe_all(batch.labels("validate"), amounts)

    assert samples(one_by_one) == samples(batched)


@pytest.mark.parametrize(
    "amounts", [pytest.param([], id="empty"), pytest.param([0.001, 2.0], id="values")]
)
def test_without_the_internals_each_value_is_observed(amounts: list[float]) -> None:
    class Plain:
        def __init__(self) -> None:
            self.seen: list[Any] = []

        def observe(self, amount: float) -> None:
            self.seen.append(amount)

    plain = Plain()

    observe_all(plain, amounts)

    assert amounts == plain.seen


#: Prometheus's and controller-runtime's naming rules, as operators read them.
PREFIX = "resize_preemption_"
UNITS = ("_seconds", "_bytes", "_cores")


@pytest.mark.parametrize("metric", METRICS, ids=lambda d: d.name)
def test_metric_names_follow_the_conventions_operators_know(metric: MetricDef) -> None:
    name = metric.name
    assert name.startswith(PREFIX), "one component prefix"
    assert re.fullmatch(r"[a-z][a-z0-9_]*", name), "snake_case"
    assert (metric.kind == "counter") == name.endswith("_total"), "_total is for counters"
    if metric.kind == "histogram" and "victims" not in name:
        assert name.endswith(UNITS), "a histogram of a quantity names its unit"
    if "seconds" in metric.help.lower() or "time" in metric.help.lower().split():
        assert name.removesuffix("_total").endswith("_seconds"), "times are in seconds"
    for label in metric.labels:
        assert re.fullmatch(r"[a-z][a-z_]*", label), label


def test_every_metric_name_and_attribute_is_unique() -> None:
    assert len(METRICS) == len({d.name for d in METRICS}) == len({d.attribute for d in METRICS})
