"""Every results file under ``bench/results`` says where its figures come from: the commit
measured, when, how busy the machine was and the command that made them
(:mod:`harness.provenance`). A file older than that record carries the commit that last
wrote it, its date and the command its docs give, marked ``recorded: from git history``,
with no load: nobody may read a load that was never measured."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from harness.provenance import KEYS, Run, figures, portable, read

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
#: Written by ``python -m harness.matrix``, which reads its rows back as a list: not a
#: benchmark's figures but the e2e tests' outcome per Kubernetes version.
NOT_BENCHMARKS = {"matrix.json"}
FILES = sorted(p.name for p in RESULTS.glob("*.json") if p.name not in NOT_BENCHMARKS)


@pytest.mark.parametrize("name", FILES)
def test_every_results_file_has_its_provenance(name: str) -> None:
    document = json.loads((RESULTS / name).read_text(encoding="utf-8"))
    provenance = document.get("provenance") if isinstance(document, dict) else None

    assert isinstance(provenance, dict), f"{name} has no provenance block"
    assert set(KEYS) <= set(provenance), f"{name}: {sorted(set(KEYS) - set(provenance))}"
    assert re.fullmatch(r"[0-9a-f]{40}", provenance["commit"]), provenance["commit"]
    assert datetime.fromisoformat(provenance["date"]).tzinfo is not None
    assert provenance["command"], f"{name}: no command"
    if provenance.get("recorded") == "from git history":
        assert provenance["load"] is None
    else:
        assert {"start", "end", "nproc"} <= set(provenance["load"])


@pytest.mark.parametrize(
    ("figures_in", "expected_keys"),
    [
        pytest.param({"runs": [1, 2]}, ["provenance", "runs"], id="an-object-keeps-its-keys"),
        pytest.param([{"scenario": "walkthrough"}], ["provenance", "rows"], id="a-list-as-rows"),
        pytest.param(
            {"provenance": {"commit": "old"}, "runs": []},
            ["provenance", "runs"],
            id="a-file-read-back-gets-this-runs-provenance",
        ),
    ],
)
def test_a_run_writes_its_provenance_first(
    tmp_path: Path, figures_in: dict[str, Any] | list[Any], expected_keys: list[str]
) -> None:
    path = Run(command=["python", "-m", "bench", "plan"]).write(tmp_path / "r.json", figures_in)

    document = read(path)
    assert expected_keys == list(document)
    assert ["python", "-m", "bench", "plan"] == document["provenance"]["command"]
    assert set(KEYS) <= set(document["provenance"])
    assert {"start", "end", "nproc"} <= set(document["provenance"]["load"])
    expected = (
        figures_in
        if isinstance(figures_in, list)
        else {k: v for k, v in figures_in.items() if k != "provenance"}
    )
    assert expected == figures(document)


def test_a_part_keeps_the_provenance_of_the_other_part(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    Run(command=["first"]).update(path, "runs", [1])
    Run(command=["second"]).update(path, "actuation", {"added_s": 0.78})

    document = read(path)
    parts = document["provenance"]["parts"]
    assert (["first"], ["second"]) == (parts["runs"]["command"], parts["actuation"]["command"])
    assert ["second"] == document["provenance"]["command"]
    assert ([1], {"added_s": 0.78}) == (document["runs"], document["actuation"])


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        pytest.param(
            ["/opt/venv/bin/python3.11", "-m", "bench", "plan"],
            ["python", "-m", "bench", "plan"],
            id="the-interpreter-as-python",
        ),
        pytest.param(
            ["python", str(RESULTS.parents[1] / "bench" / "results" / "x.json")],
            ["python", "bench/results/x.json"],
            id="a-path-in-the-checkout-relative-to-it",
        ),
        pytest.param(["python", "/elsewhere/x"], ["python", "/elsewhere/x"], id="others-as-given"),
    ],
)
def test_a_command_names_no_path_of_the_machine(argv: list[str], expected: list[str]) -> None:
    assert expected == portable(argv)
