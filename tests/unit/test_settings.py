"""Configuration precedence and validation: defaults < file < environment < flags."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from webhook.base.settings import (
    METRICS_PORT,
    PORT,
    SETTINGS,
    Config,
    Port,
    check_ports,
    env_name,
    load_config,
)
from webhook.core.errors import InputError


def test_defaults_without_any_source() -> None:
    assert Config() == load_config()


def test_later_sources_win(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("mode: warn\nmax-victims: 3\nreservation-ttl: 60\n")

    config = load_config(
        file=str(file),
        env={"RPW_MODE": "deny-infeasible", "RPW_MAX_VICTIMS": "5"},
        flags={"max-victims": 7, "pdb-mode": None},
    )

    assert "deny-infeasible" == config.mode
    assert 7 == config.max_victims
    assert 60.0 == config.reservation_ttl
    assert "respect" == config.pdb_mode


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param(
            {"protected-namespaces": "kube-system, ,monitoring"},
            frozenset({"kube-system", "monitoring"}),
            id="comma-separated",
        ),
        pytest.param({"protected-namespaces": ["a", "b"]}, frozenset({"a", "b"}), id="yaml-list"),
    ],
)
def test_protected_namespaces_forms(source: dict[str, object], expected: frozenset[str]) -> None:
    assert expected == load_config(flags=source).protected_namespaces


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        pytest.param({"mode": "yolo"}, "mode='yolo' must be one of", id="unknown-mode"),
        pytest.param(
            {"max-victims": -1},
            "--max-victims=-1 must be a whole number of at least 0 (or unlimited)",
            id="negative-count",
        ),
        pytest.param({"reservation-ttl": "soon"}, "reservation-ttl='soon'", id="not-a-number"),
        pytest.param({"colour": "blue"}, "unknown setting 'colour'", id="unknown-setting"),
    ],
)
def test_bad_values_name_the_setting(flags: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        load_config(flags=flags)


def test_bad_file_is_a_clear_error(tmp_path: Path) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("- just\n- a list\n")
    with pytest.raises(InputError, match="must hold a mapping"):
        load_config(file=str(file))
    with pytest.raises(InputError, match="cannot read config file"):
        load_config(file=str(tmp_path / "missing.yaml"))


def test_unlimited_max_victims_from_environment() -> None:
    assert None is load_config(env={"RPW_MAX_VICTIMS": "unlimited"}).max_victims


def test_every_setting_is_documented_with_its_variable() -> None:
    rows = [(name, env_name(name), s.default) for name, s in SETTINGS.items()]
    assert ("mode", "RPW_MODE", "enforce") in rows
    assert all(env == "RPW_" + name.upper().replace("-", "_") for name, env, _ in rows)


@pytest.mark.parametrize(
    ("expected", "kwargs"),
    [
        pytest.param(True, {}, id="default-on"),
        pytest.param(False, {"env": {"RPW_LENDING": "false"}}, id="switched-off"),
        pytest.param(True, {"env": {"RPW_LENDING": "true"}}, id="environment"),
        pytest.param(True, {"flags": {"lending": "on"}}, id="flag"),
        pytest.param(
            False, {"env": {"RPW_LENDING": "true"}, "flags": {"lending": "off"}}, id="flag-wins"
        ),
    ],
)
def test_the_lending_switch_reaches_the_policy(expected: bool, kwargs: dict[str, Any]) -> None:
    config = load_config(**kwargs)

    assert (expected, expected) == (config.lending, config.policy().lending)


def test_a_lending_switch_that_is_not_one_is_refused() -> None:
    with pytest.raises(InputError, match="RPW_LENDING='maybe' must be true or false"):
        load_config(env={"RPW_LENDING": "maybe"})


RULE_CASES = [
    # (setting, value, the value it sets, or "refused")
    ("lease-duration", "1", 1.0),
    ("lease-duration", "0.99", "refused"),
    ("lease-duration", 15, 15.0),
    ("reservation-ttl", "0.1", 0.1),
    ("reservation-ttl", "0", "refused"),
    ("reservation-ttl", "-5", "refused"),
    ("reservation-ttl", "nan", "refused"),
    ("reservation-ttl", "inf", "refused"),
    ("reservation-ttl", "1e400", "refused"),
    ("reservation-ttl", True, "refused"),
    ("persist-timeout", 2.5, 2.5),
    ("resync-period", "0", "refused"),
    ("max-cache-staleness", "-inf", "refused"),
    ("max-body-bytes", "65536", 65536),
    ("max-body-bytes", "65535", "refused"),
    ("max-body-bytes", 1048576.0, 1048576),
    ("max-body-bytes", 1048576.5, "refused"),
    ("max-victims", "0", 0),
    ("max-victims", "unlimited", None),
    ("max-victims", "-1", "refused"),
    ("grace-period-cap", 0, 0),
    ("grace-period-cap", "1.5", "refused"),
    ("service-namespace", "rpw-system", "rpw-system"),
    ("service-namespace", "Bad_NS!", "refused"),
    ("service-namespace", "a" * 64, "refused"),
    ("service-namespace", "-rpw", "refused"),
    (
        "protected-namespaces",
        ["kube-system", "monitoring"],
        frozenset({"kube-system", "monitoring"}),
    ),
    ("protected-namespaces", "kube-system,Bad", "refused"),
    ("scheduler-name", "", "refused"),
    ("identity", "", ""),
]


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    RULE_CASES,
    ids=[f"{name}={value!r}"[:60] for name, value, _ in RULE_CASES],
)
def test_every_value_is_checked_by_its_settings_rule(
    name: str, value: object, expected: object
) -> None:
    setting = SETTINGS[name]
    if expected == "refused":
        with pytest.raises(InputError, match=re.escape(f"--{name}={value!r} ")):
            load_config(flags={name: value})
    else:
        assert expected == getattr(load_config(flags={name: value}), setting.field)


def test_a_former_name_on_the_command_line_is_refused_with_the_new_one() -> None:
    with pytest.raises(InputError, match=r"^command line: --namespace is now --service-namespace$"):
        load_config(flags={"namespace": "rpw"})


@pytest.mark.parametrize("where", ["environment", "file"])
def test_a_former_name_in_manifests_is_read_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str
) -> None:
    file = tmp_path / "config.yaml"
    file.write_text("namespace: rpw\n")
    source: dict[str, Any] = (
        {"env": {"RPW_NAMESPACE": "rpw"}} if where == "environment" else {"file": str(file)}
    )

    with caplog.at_level(logging.WARNING):
        assert "rpw" == load_config(**source).namespace

    said = {
        "environment": "environment: RPW_NAMESPACE is deprecated, read as RPW_SERVICE_NAMESPACE",
        "file": f"config file {file}: namespace is deprecated, read as service-namespace",
    }
    assert [said[where]] == [r.getMessage() for r in caplog.records]


def test_the_new_name_wins_over_the_former_one() -> None:
    env = {"RPW_NAMESPACE": "old", "RPW_SERVICE_NAMESPACE": "new"}

    assert "new" == load_config(env=env).namespace


@pytest.mark.parametrize(
    ("port", "metrics_port", "refused"),
    [(8443, 9090, False), (8443, 0, False), (8443, 8443, True)],
    ids=["distinct", "metrics-off", "same"],
)
def test_the_two_ports_must_differ(port: int, metrics_port: int, refused: bool) -> None:
    if refused:
        with pytest.raises(InputError, match="--metrics-port=8443 must differ from --port=8443"):
            check_ports(port, metrics_port)
    else:
        check_ports(port, metrics_port)


@pytest.mark.parametrize(
    ("rule", "text", "expected"),
    [
        (PORT, "1", 1), (PORT, "65535", 65535), (PORT, "0", None), (PORT, "65536", None),
        (METRICS_PORT, "0", 0), (METRICS_PORT, "-1", None),
    ],
    ids=["one", "highest", "zero", "above", "metrics-off", "metrics-negative"],
)  # fmt: skip
def test_port_rules(rule: Port, text: str, expected: int | None) -> None:
    if expected is None:
        with pytest.raises(ValueError, match="must be a port, 1-65535"):
            rule(text)
    else:
        assert expected == rule(text)
