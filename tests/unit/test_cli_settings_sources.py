"""Every command reads the service's settings as ``serve`` does, through the one settings
table: flags over ``RPW_*`` variables over a ``--config`` file; every entry point says its
own name and version."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_cli_plan import WALKTHROUGH_PATCH, walkthrough_objects, write_yaml_list
from webhook import __version__
from webhook.cli import build_parser, console_script, kubectl_plugin, main


def _plan(tmp_path: Path, *extra: str) -> list[str]:
    """The victims of the walkthrough's plan (one JSON line), with ``extra`` arguments."""
    snapshot = write_yaml_list(tmp_path, walkthrough_objects())
    args = ["plan", "--snapshot", str(snapshot), "--pod", "default/high-priority-pod"]
    return [*args, "--resize", WALKTHROUGH_PATCH, "-o", "json", *extra]


@pytest.mark.parametrize(
    ("environment", "config", "flags", "verdict"),
    [
        pytest.param({}, None, [], "preempt", id="defaults"),
        pytest.param(
            {"RPW_PROTECTED_NAMESPACES": "default"}, None, [], "infeasible", id="rpw-variable"
        ),
        pytest.param({}, "protected-namespaces: [default]", [], "infeasible", id="config-file"),
        pytest.param(
            {"RPW_PROTECTED_NAMESPACES": "default"},
            None,
            ["--protected-namespaces", "other"],
            "preempt",
            id="a-flag-over-the-variable",
        ),
        pytest.param(
            {"RPW_PROTECTED_NAMESPACES": "other"},
            "protected-namespaces: [default]",
            [],
            "preempt",
            id="the-variable-over-the-file",
        ),
    ],
)
def test_plan_reads_the_settings_as_serve_does(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    environment: dict[str, str],
    config: str | None,
    flags: list[str],
    verdict: str,
) -> None:
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    extra = list(flags)
    if config is not None:
        path = tmp_path / "settings.yaml"
        path.write_text(config)
        extra += ["--config", str(path)]

    code = main(_plan(tmp_path, *extra))

    assert 0 == code
    assert verdict == json.loads(capsys.readouterr().out)["verdict"]


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        pytest.param("RPW_MAX_VICTIMS", "abc", id="max-victims"),
        pytest.param("RPW_VICTIM_ORDER", "sideways", id="victim-order"),
    ],
)
def test_a_bad_rpw_variable_is_one_line_and_exit_2_in_plan(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    setting: str,
    value: str,
) -> None:
    monkeypatch.setenv(setting, value)

    code = main(_plan(tmp_path))

    err = capsys.readouterr().err
    assert (2, 1) == (code, len(err.splitlines()))
    assert err.startswith("error: ") and setting in err


@pytest.mark.parametrize(
    ("entry", "name"),
    [
        pytest.param(main, "python -m webhook", id="module"),
        pytest.param(console_script, "resize-preemption-webhook", id="console-script"),
        pytest.param(kubectl_plugin, "kubectl resize-preemption", id="kubectl-plugin"),
    ],
)
def test_every_entry_point_says_its_name_and_version(
    capsys: pytest.CaptureFixture[str], entry: object, name: str
) -> None:
    with pytest.raises(SystemExit) as done:
        entry(["--version"])  # type: ignore[operator]

    assert (0, f"{name} {__version__}") == (done.value.code, capsys.readouterr().out.strip())


@pytest.mark.parametrize("command", ["status", "return-loans"])
def test_the_cluster_commands_take_a_settings_file_too(command: str) -> None:
    args = build_parser().parse_args([command, "--config", "settings.yaml"])

    assert "settings.yaml" == args.config


def test_return_loans_is_run_after_uninstalling_in_every_text() -> None:
    listing = " ".join(build_parser().format_help().split())
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    description = " ".join(sub.choices["return-loans"].format_help().split())  # type: ignore[attr-defined]

    assert "give every loan back to its lender, after uninstalling" in listing
    assert "Run it after the service is uninstalled" in description
    assert "before uninstall" not in listing + description
