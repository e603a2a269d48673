"""Configuration precedence and validation: defaults < file < environment < flags."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from webhook.core.errors import InputError
from webhook.engine.settings import SETTINGS, Config, env_name, load_config


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
        pytest.param({"max-victims": -1}, "must be >= 0", id="negative-count"),
        pytest.param({"reservation-ttl": "soon"}, "reservation-ttl='soon'", id="not-a-number"),
        pytest.param({"colour": "blue"}, "unknown setting 'colour'", id="unknown-setting"),
    ],
)
def test_bad_values_name_the_setting(flags: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
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
    with pytest.raises(InputError, match="lending='maybe' must be true or false"):
        load_config(env={"RPW_LENDING": "maybe"})
