"""The chart's values schema is the settings table's (scripts/chart_schema.py): the file
as committed is what the script makes, every setting the pod does not give itself is a
chart value under the name the Deployment passes on, and a rule changed in one place only
is caught. helm's own verdicts on values are tests/e2e/test_helm_chart.py's."""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from webhook.base.settings import SETTINGS, env_name

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "resize-preemption-webhook"


def load_chart_schema() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_schema", ROOT / "scripts/chart_schema.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


chart_schema = load_chart_schema()


def committed() -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((CHART / "values.schema.json").read_text())
    return schema


def test_the_committed_schema_is_the_one_the_table_makes() -> None:
    assert 0 == chart_schema.main(["--check"])
    assert chart_schema.render(chart_schema.generated(committed())) == (
        (CHART / "values.schema.json").read_text()
    )


def _settings(schema: dict[str, Any]) -> dict[str, Any]:
    properties: dict[str, Any] = schema["properties"]["settings"]["properties"]
    return properties


def _server(schema: dict[str, Any]) -> dict[str, Any]:
    properties: dict[str, Any] = schema["properties"]["server"]["properties"]
    return properties


DRIFTS = [
    ("body-limit-lowered", lambda s: _settings(s)["maxBodyBytes"].update(minimum=0)),
    ("lease-zero-allowed", lambda s: _settings(s)["leaseDuration"].update(minimum=0)),
    ("setting-dropped", lambda s: _settings(s).pop("reservationTTL")),
    ("namespace-pattern-loosened",
     lambda s: _settings(s)["protectedNamespaces"]["items"].pop("pattern")),
    ("port-zero-allowed", lambda s: _server(s)["port"].update(minimum=0)),
    ("metrics-port-too-high", lambda s: _server(s)["metricsPort"].update(maximum=70000)),
    ("client-lifetime-unchecked",
     lambda s: s["properties"]["clientAuth"]["properties"]["duration"].pop("pattern")),
    ("ca-lifetime-dropped",
     lambda s: s["properties"]["certificates"]["properties"].pop("caDuration")),
]  # fmt: skip


@pytest.mark.parametrize("drift", [d for _, d in DRIFTS], ids=[i for i, _ in DRIFTS])
def test_a_rule_changed_in_the_schema_alone_is_caught(drift: Any) -> None:
    drifted = copy.deepcopy(committed())
    drift(drifted)

    assert drifted != chart_schema.generated(drifted)
    assert committed() == chart_schema.generated(drifted)


def test_every_setting_but_the_pods_own_is_a_chart_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    assert set(chart_schema.CHART_KEYS) == set(values["settings"])
    assert set(SETTINGS) - chart_schema.FROM_THE_POD - chart_schema.FROM_THE_DEPLOYMENT == set(
        chart_schema.CHART_KEYS.values()
    )


def test_the_deployment_passes_each_value_as_the_settings_variable() -> None:
    template = (CHART / "templates" / "deployment.yaml").read_text()
    passed = dict(re.findall(r'\(list "([A-Za-z]+)" "(RPW_[A-Z_]+)"\)', template))
    # The selector defaults to the webhook configuration's own (rpw.preemptorSelector).
    derived = {"preemptorNamespaceSelector"}

    assert {
        key: env_name(name) for key, name in chart_schema.CHART_KEYS.items() if key not in derived
    } == passed
    assert re.search(
        r'- name: RPW_PREEMPTOR_NAMESPACE_SELECTOR\n\s+value: \{\{ include "rpw.preemptorSelector"',
        template,
    )


@pytest.mark.parametrize("name", sorted(chart_schema.FROM_THE_POD))
def test_the_pods_own_settings_come_from_the_downward_api(name: str) -> None:
    template = (CHART / "templates" / "deployment.yaml").read_text()

    assert re.search(rf"- name: {env_name(name)}\n\s+valueFrom:\n\s+fieldRef:", template)
