"""The alerting rules and the dashboard: one promtool test case per alert
(deploy/prometheus/rules-test.yaml, run by tests/e2e/test_alert_rules_promtool.py), and
every metric they read is one the service exports (webhook/base/metrics.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from webhook.base.metrics import METRICS, Metrics

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / "deploy" / "prometheus"
RULES = PROMETHEUS / "rules.yaml"
RULES_TEST = PROMETHEUS / "rules-test.yaml"
DASHBOARD = PROMETHEUS / "dashboard.json"
METRIC = re.compile(r"\bresize_preemption_[a-z_]+\b")


def alert_rules() -> list[dict[str, object]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def exported_series() -> set[str]:
    """Every series name the service's metrics produce (counters with _total, histograms
    with _bucket/_sum/_count)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names |= {family.name + suffix for suffix in suffixes[family.type]}
    return names


def dashboard_expressions() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(p["title"], t["expr"]) for p in panels for t in p["targets"]]


def test_every_alert_has_unit_tests_that_see_it_fire_and_stay_quiet() -> None:
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    cases = [case for test in tests for case in test["alert_rule_test"]]
    for rule in alert_rules():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert [c for c in mine if c["exp_alerts"]], f"{rule['alert']} never fires in a test"
        assert [c for c in mine if not c["exp_alerts"]], f"{rule['alert']} is never quiet"


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation but hyphens
    dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_every_alert_links_its_runbook_section_of_the_operations_doc() -> None:
    sections = anchors((REPO / "docs" / "operations.md").read_text())
    for rule in alert_rules():
        url = str(rule["annotations"]["runbook_url"])  # type: ignore[index]
        path, _, anchor = url.partition("#")
        assert ("docs/operations.md", str(rule["alert"]).lower()) == (path, anchor)
        assert anchor in sections, f"{rule['alert']}: no section #{anchor}"


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [("### ResizePreemptionNoLeader", "resizepreemptionnoleader"),
     ('## Install with "Helm" (opt-in)', "install-with-helm-opt-in")],
    ids=["alert", "punctuation"],
)  # fmt: skip
def test_anchors_are_githubs(heading: str, anchor: str) -> None:
    assert {anchor} == anchors(heading)


def test_the_webhook_being_gone_or_bypassed_is_an_alert() -> None:
    exprs = {str(r["alert"]): " ".join(str(r["expr"]).split()) for r in alert_rules()}
    assert exprs["ResizePreemptionWebhookAbsent"].startswith("absent(resize_preemption_")
    stopped = exprs["ResizePreemptionReviewsStopped"]
    assert 'apiserver_request_total{resource="pods",subresource="resize"' in stopped
    assert "or vector(0)) == 0" in stopped


def test_every_alert_has_a_severity_and_a_summary() -> None:
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]  # type: ignore[index]
        assert rule["annotations"]["summary"], rule["alert"]  # type: ignore[index]


@pytest.mark.parametrize(
    ("where", "expr"),
    [(str(r["alert"]), str(r["expr"])) for r in alert_rules()] + dashboard_expressions(),
    ids=lambda v: str(v)[:40],
)
def test_expressions_read_only_metrics_the_service_exports(where: str, expr: str) -> None:
    used = set(METRIC.findall(expr))
    assert used, f"{where} reads no resize_preemption_ metric"
    assert set() == used - exported_series(), where


@pytest.mark.parametrize(
    ("where", "expr"),
    [(str(r["alert"]), str(r["expr"])) for r in alert_rules()] + dashboard_expressions(),
    ids=lambda v: str(v)[:40],
)
def test_expressions_read_no_deprecated_name(where: str, expr: str) -> None:
    deprecated = {d.deprecated for d in METRICS if d.deprecated}
    series = {re.sub(r"_(bucket|sum|count)$", "", m) for m in METRIC.findall(expr)}
    assert set() == series & deprecated, where


def test_operations_doc_lists_every_alert_and_panel_with_its_expression() -> None:
    doc = (REPO / "docs" / "operations.md").read_text()
    rows = {line.split(" | ")[0].strip("| `") for line in doc.splitlines() if line.startswith("| ")}
    for rule in alert_rules():
        assert str(rule["alert"]) in rows
        assert f"`{' '.join(str(rule['expr']).split())}`" in doc, rule["alert"]
    for title, expr in dashboard_expressions():
        assert title in rows
        assert f"`{expr}`" in doc, title


def test_dashboard_panels_have_unique_ids_and_one_query_each() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len(panels) == len({p["id"] for p in panels})
    assert len(panels) == len({p["title"] for p in panels})
    for panel in panels:
        assert 1 == len(panel["targets"]), panel["title"]
        assert "${datasource}" == panel["datasource"]["uid"]
