"""The metrics' names follow the conventions operators know; renamed ones are exported
under their former names too, marked deprecated; the attempt and pending figures."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from webhook.base.metrics import ATTEMPT_RESULTS, METRICS, PENDING_STATES, MetricDef, Metrics
from webhook.web import shared_metrics

ROOT = Path(__file__).resolve().parents[2]

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
    names = [d.name for d in METRICS] + [d.deprecated for d in METRICS if d.deprecated]
    assert len(names) == len(set(names))


@pytest.mark.parametrize("metric", METRICS, ids=lambda d: d.name)
def test_one_prefix_and_durations_end_in_duration_seconds(metric: MetricDef) -> None:
    # The review path has no prefix of its own: resize_preemption_ alone names the component.
    assert not metric.name.startswith(f"{PREFIX}webhook_")
    if metric.kind == "histogram" and metric.name.endswith("_seconds"):
        assert metric.name.endswith("_duration_seconds"), "a histogram of times is a duration"


def exposition(registry: CollectorRegistry) -> dict[str, str]:
    """Family name -> its help, as a scrape reads them."""
    return {
        f.name: f.documentation
        for f in text_string_to_metric_families(generate_latest(registry).decode())
    }


def counted(metrics: Metrics) -> None:
    metrics.reviews.labels("validate", "preempt").inc(3)
    metrics.review_latency.labels("validate").observe(0.01)
    metrics.unauthenticated.set(1)


def test_a_renamed_metric_is_exported_under_its_former_name_marked_deprecated() -> None:
    metrics = Metrics()
    counted(metrics)
    helps = exposition(metrics.registry)
    renamed = [d for d in METRICS if d.deprecated]
    assert len(renamed) >= 5
    for d in renamed:
        old, new = d.deprecated.removesuffix("_total"), d.name.removesuffix("_total")
        assert f"DEPRECATED: use {d.name}. {d.help}" == helps[old]
        assert d.help == helps[new]
    value = metrics.registry.get_sample_value
    labels = {"endpoint": "validate", "verdict": "preempt"}
    assert 3.0 == value("resize_preemption_reviews_total", labels)
    assert 3.0 == value("resize_preemption_webhook_requests_total", labels)
    assert 1.0 == value("resize_preemption_webhook_unauthenticated")


def test_worker_processes_export_the_former_names_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A registry of values written by other processes, as the master serves it.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    script = (
        "from tests.unit.test_metrics import counted; from webhook.base.metrics import Metrics;"
        " counted(Metrics())"
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, timeout=60)
    summed = shared_metrics.registry(tmp_path)
    labels = {"endpoint": "validate", "verdict": "preempt"}
    assert 3.0 == summed.get_sample_value("resize_preemption_webhook_requests_total", labels)
    assert 3.0 == summed.get_sample_value("resize_preemption_reviews_total", labels)
    helps = exposition(summed)
    assert helps["resize_preemption_webhook_requests"].startswith(
        "DEPRECATED: use resize_preemption_reviews_total."
    )


@pytest.mark.parametrize(
    ("verdicts", "counts"),
    [
        (["preempt", "preempt", "infeasible"], {"preempt": 2.0, "infeasible": 1.0}),
        (["fits", "not-eligible"], {"preempt": None, "infeasible": None}),
    ],
    ids=["attempts", "no-attempt"],
)
def test_attempts_count_the_plans_that_did_not_fit(
    verdicts: list[str], counts: dict[str, float | None]
) -> None:
    metrics = Metrics()
    for verdict in verdicts:
        metrics.count_attempt(verdict)
    assert counts == {
        r: metrics.registry.get_sample_value("resize_preemption_attempts_total", {"result": r})
        for r in ATTEMPT_RESULTS
    }


def test_every_pending_state_is_set_and_a_gone_one_drops_to_zero() -> None:
    metrics = Metrics()
    metrics.set_pending({"deferred": 2, "persisted": 1})
    metrics.set_pending({"deferred": 1})
    assert {"deferred": 1.0, "infeasible": 0.0, "admitted": 0.0, "persisted": 0.0} == {
        s: metrics.registry.get_sample_value("resize_preemption_pending_resizes", {"state": s})
        for s in PENDING_STATES
    }
