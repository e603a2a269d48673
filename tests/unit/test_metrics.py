"""The metrics' names follow the conventions operators know."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import re

import pytest

from webhook.base.metrics import METRICS, MetricDef

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
