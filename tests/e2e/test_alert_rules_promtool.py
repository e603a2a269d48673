"""The alerting rules with the real promtool: `promtool check rules` and `promtool test
rules` (deploy/prometheus/rules-test.yaml).

Installs promtool (Debian's ``prometheus`` package, scripts/install-test-tools.sh) when it
is not on PATH; no cluster."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.unit.test_alert_rules import PROMETHEUS, REPO, RULES, RULES_TEST, alert_rules

pytestmark = pytest.mark.e2e

INSTALL = REPO / "scripts" / "install-test-tools.sh"


@pytest.fixture(scope="module")
def promtool() -> str:
    if shutil.which("promtool") is None:
        subprocess.run(["bash", str(INSTALL)], check=True, timeout=900)
    found = shutil.which("promtool")
    assert found, f"{INSTALL.name} did not install promtool"
    return found


def test_promtool_checks_the_rules(promtool: str) -> None:
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert 0 == result.returncode, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass(promtool: str) -> None:
    result = subprocess.run(
        [promtool, "test", "rules", str(RULES_TEST)],
        capture_output=True,
        text=True,
        cwd=PROMETHEUS,
        check=False,
    )
    assert 0 == result.returncode, result.stdout + result.stderr
