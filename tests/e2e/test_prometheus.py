"""The dashboard and the alerts against a real Prometheus server: it scrapes a running
webhook (loopback only) after the README's walkthrough, and every panel's and alert's
expression is evaluated through the HTTP API without error; the main panels return data."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.launcher import free_port
from harness.processes import ManagedProcess, spawn
from harness.webhook_process import WebhookProcess, start_webhook
from tests.e2e.conftest import Cluster, Kubectl, Waiter
from tests.e2e.service_support import clear_ledger, resize
from tests.e2e.test_service import expect_preempted_and_actuated, walkthrough

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "rules.yaml"
DASHBOARD = REPO / "deploy" / "prometheus" / "dashboard.json"
INSTALL = REPO / "scripts" / "install-test-tools.sh"
#: Panels that must show something after one preempting resize.
MAIN_PANELS = (
    "Reviews by verdict",
    "Review latency",
    "Review latency p50",
    "Preemptions by result",
    "Victims planned",
    "Ledger size",
    "Cache age",
    "Leader",
    "Time to actuation p90",
    "Deferred resizes",
)
SCRAPE_INTERVAL = 1.0


def prometheus_binary() -> str:
    if shutil.which("prometheus") is None:
        subprocess.run(["bash", str(INSTALL)], check=True, timeout=900)
    found = shutil.which("prometheus")
    assert found, f"{INSTALL.name} did not install prometheus"
    return found


def query(port: int, expr: str) -> dict[str, Any]:
    """``/api/v1/query`` at the newest sample; the whole answer (status, data or error)."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            answer: dict[str, Any] = json.load(response)
    except urllib.error.HTTPError as e:
        answer = json.load(e)
    except urllib.error.URLError as e:
        answer = {"status": "error", "error": f"prometheus not reachable: {e.reason}"}
    return answer


@pytest.fixture
def service(cluster: Cluster, namespace: str) -> Iterator[WebhookProcess]:
    clear_ledger(cluster)
    process = start_webhook(cluster.client, cluster.kubeconfig, cluster.control_plane.state_dir)
    yield process
    process.stop()
    clear_ledger(cluster)


@pytest.fixture
def prometheus(service: WebhookProcess, tmp_path: Path) -> Iterator[tuple[ManagedProcess, int]]:
    """Prometheus on 127.0.0.1 scraping the service's metrics every second, with the
    alerting rules loaded (so they are evaluated too)."""
    port = free_port()
    shutil.copy(RULES, tmp_path / "rules.yaml")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "scrape_configs": [
            {
                "job_name": "resize-preemption-webhook",
                "static_configs": [{"targets": [f"127.0.0.1:{service.metrics_port}"]}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    process = spawn(
        "prometheus",
        [
            prometheus_binary(),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        tmp_path / "prometheus.log",
    )
    yield process, port
    process.stop()


def scraped(port: int, samples: int) -> bool:
    """True once ``up`` of the service has ``samples`` samples, all 1."""
    answer = query(port, f"up[{int(samples * SCRAPE_INTERVAL * 3)}s]")
    if answer.get("status") != "success" or not answer["data"]["result"]:
        return False
    values = answer["data"]["result"][0]["values"]
    return len(values) >= samples and all(v == "1" for _, v in values)


def expressions() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    return [(p["title"], t["expr"]) for p in panels for t in p["targets"]] + [
        (f"alert {r['alert']}", r["expr"]) for r in rules
    ]


def test_every_panel_and_alert_evaluates_and_the_main_panels_show_the_walkthrough(
    kubectl: Kubectl,
    namespace: str,
    cluster: Cluster,
    priority_classes: dict[str, str],
    prometheus: tuple[ManagedProcess, int],
    wait_until: Waiter,
) -> None:
    process, port = prometheus
    # A scrape before the walkthrough: rate() and increase() need the counts from before.
    wait_until(lambda: scraped(port, 1), timeout=30, interval=0.2, what="a first scrape")
    walkthrough(kubectl, priority_classes)
    expect_preempted_and_actuated(
        cluster, namespace, resize(kubectl, "high-priority-pod", "6"), wait_until, cpu="6"
    )
    # Two samples after the walkthrough's counts: enough for rate() and increase().
    time.sleep(0.1)
    wait_until(lambda: scraped(port, 3), timeout=30, interval=0.5, what="three scrapes")
    if not process.running():
        pytest.fail(f"prometheus exited:\n{process.log_tail()}")

    # The worker times the actuation on its next pass (a second), then a scrape sees it.
    timed = dict(expressions())["Time to actuation p90"]
    wait_until(lambda: actuation_seconds(port, timed) > 0, timeout=30, what="actuation timed")
    answers = {where: query(port, expr) for where, expr in expressions()}

    failed = {w: a.get("error") for w, a in answers.items() if a.get("status") != "success"}
    assert {} == failed
    empty = [w for w in MAIN_PANELS if not answers[w]["data"]["result"]]
    assert [] == empty
    verdicts = {s["metric"]["verdict"] for s in answers["Reviews by verdict"]["data"]["result"]}
    assert "preempt" in verdicts
    results = {
        s["metric"]["result"]: s["value"][1]
        for s in answers["Preemptions by result"]["data"]["result"]
    }
    assert "evicted" in results
    (leaders,) = answers["Leader"]["data"]["result"]
    assert "1" == leaders["value"][1]
    # Prometheus evaluated each loaded rule itself, once a second: all healthy.
    unhealthy = wait_until(lambda: rule_health(port), timeout=10, what="every rule evaluated")
    assert {} == {name: health for name, health in unhealthy.items() if health != ("ok", "")}


def actuation_seconds(port: int, expr: str) -> float:
    """The panel's value, 0 while there is none (no sample, or NaN: nothing timed yet)."""
    answer = query(port, expr)
    result = answer.get("data", {}).get("result") or []
    value = float(result[0]["value"][1]) if result else 0.0
    return value if value == value else 0.0


def rule_health(port: int) -> dict[str, tuple[str, str]] | None:
    """alert name -> (health, lastError) once every rule has been evaluated; else None."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5) as response:
        groups = json.load(response)["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    if not rules or any(r["health"] == "unknown" for r in rules):
        return None
    return {r["name"]: (r["health"], r.get("lastError", "")) for r in rules}
