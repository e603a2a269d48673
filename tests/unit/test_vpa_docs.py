"""docs/vpa.md explains every flag the harness gives VPA's updater, with the value it gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.vpa import UpdaterOptions, updater_argv

VPA_DOC = Path(__file__).resolve().parents[2] / "docs" / "vpa.md"


def documented_flags() -> dict[str, str]:
    """Flag -> its "Here" cell (without backticks), from the table under the heading."""
    text = VPA_DOC.read_text(encoding="utf-8")
    section = text.split("\n## The updater's flags\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if not line.startswith("| `--"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1].strip("`")
    return rows


def passed_flags() -> dict[str, str]:
    argv = updater_argv(Path("vpa-updater"), Path("kubeconfig"), "127.0.0.1:1", UpdaterOptions())
    flags = {}
    for arg in argv[1:]:
        name, _, value = arg.partition("=")
        flags[name] = value
    return flags


def test_every_flag_passed_is_documented_and_nothing_else() -> None:
    assert sorted(passed_flags()) == sorted(documented_flags())


@pytest.mark.parametrize(
    "flag",
    [
        "--updater-interval",
        "--min-replicas",
        "--use-admission-controller-status",
        "--v",
        "--feature-gates",
    ],
)
def test_documented_values_are_the_ones_passed(flag: str) -> None:
    assert passed_flags()[flag] == documented_flags()[flag]
