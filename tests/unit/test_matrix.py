"""Reading pytest's junit report, writing the matrix table, and the docs' copy of it."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.binaries import BUILD_SCRIPT
from harness.matrix import (
    DOCS,
    GATE,
    NODE_BUILDS,
    PASSES,
    REAL_NODE_ROUND,
    CaseOutcome,
    VersionResult,
    build_scripts,
    commit_tested,
    docs_table,
    entry_env,
    kube_version_of,
    load,
    parse_junit,
    passes,
    pytest_argv,
    table,
    version_key,
    write_docs,
)

MATRIX_JSON = Path(__file__).resolve().parents[2] / "bench" / "results" / "matrix.json"

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.e2e.test_service" name="test_walkthrough" time="3.5"/>
<testcase classname="tests.e2e.test_service" name="test_pdb[x]" time="1.0">
  <failure message="AssertionError: assert 'Deferred' == 'Infeasible'">trace</failure>
</testcase>
<testcase classname="tests.e2e.test_reconciler" name="test_start" time="0.1">
  <error message="failed on setup">trace</error>
</testcase>
<testcase classname="tests.e2e.test_lending" name="test_lend[a@b]@tests/e2e/test_lending.py"
  time="2.0"/>
<testcase classname="tests.e2e.test_hollow_kubelet" name="test_old" time="0">
  <skipped message="no PodResizeValidator before 1.36">skip</skipped>
</testcase>
</testsuite></testsuites>
"""


def test_parse_junit_names_each_case_with_its_outcome_and_message() -> None:
    assert [
        CaseOutcome("test_service::test_walkthrough", "passed", 3.5),
        CaseOutcome(
            "test_service::test_pdb[x]",
            "failed",
            1.0,
            "AssertionError: assert 'Deferred' == 'Infeasible'",
        ),
        CaseOutcome("test_reconciler::test_start", "error", 0.1, "failed on setup"),
        # pytest-xdist's group left out, an @ among the parameters kept
        CaseOutcome("test_lending::test_lend[a@b]", "passed", 2.0),
        CaseOutcome(
            "test_hollow_kubelet::test_old", "skipped", 0.0, "no PodResizeValidator before 1.36"
        ),
    ] == parse_junit(JUNIT)


def test_a_version_is_green_only_when_built_and_nothing_failed() -> None:
    passed = CaseOutcome("m::a", "passed", 1.0)
    skipped = CaseOutcome("m::b", "skipped", 0.0, "why")
    failed = CaseOutcome("m::c", "failed", 1.0, "boom")
    assert (True, False, False, False) == (
        VersionResult("v1.36.3", built=True, tests=[passed, skipped]).green,
        VersionResult("v1.35.4", built=True, tests=[passed, failed]).green,
        VersionResult("v1.34.4", built=False).green,
        VersionResult("v1.33.13", built=True, tests=[]).green,
    )


def test_table_has_a_row_per_entry_and_lines_for_what_did_not_pass() -> None:
    results = [
        VersionResult(
            "v1.36.3",
            built=True,
            build_seconds=900,
            kubelet_version="Kubernetes v1.36.3",
            pod_resize_validator=True,
            in_place_resize_gate="GA",
            test_seconds=300,
            tests=[
                CaseOutcome("m::a", "passed", 1.0),
                CaseOutcome("m::b", "failed", 1, "boom\nx"),
                CaseOutcome("m::c", "skipped", 0, "needs v1.37+: the gate (this cluster: v1.36.3)"),
                CaseOutcome("m::d", "skipped", 0, "needs v1.37+: the gate (this cluster: v1.36.3)"),
            ],
            commit="abc1234",
            date="2026-12-07 07:00 UTC",
            load=[1.5, 2.25, 3.0],
            modules=["test_a.py", "test_b.py"],
        ),
        VersionResult("v1.33.13", error="build failed: no compat_1_33.go"),
    ]

    lines = table(results).splitlines()

    assert [
        "| v1.36.3 | v1.36.3 | on | GA | abc1234 | 2026-12-07 07:00 UTC | 1.5 / 2.2 / 3.0 "
        "| 2 modules | 1 | 1 | 2 | 300 s |",
        "| v1.33.13 |  | absent |  |  |  |  | all | 0 | 0 | 0 | 0 s |",
        "",
        "* v1.36.3 failed: `m::b`: boom",
        "* v1.36.3 skipped 2 (m::c, m::d): needs v1.37+: the gate (this cluster: v1.36.3)",
        "* v1.33.13: build failed: no compat_1_33.go",
    ] == lines[2:]


@pytest.mark.parametrize(
    ("entry", "version", "env"),
    [
        ("v1.33.13", "v1.33.13", {}),
        ("v1.37.2-gate-off", "v1.37.2", {"RPW_FEATURE_GATES_OFF": GATE}),
        (
            "v1.33.13-realnode",
            "v1.33.13",
            {"RPW_KUBE_VERSION": "v1.33.13", "RPW_KUBE_NO_FALLBACK": "1"},
        ),
    ],
    ids=["a-version", "gate-off", "real-node"],
)
def test_an_entry_is_a_version_and_what_it_holds_off(
    entry: str, version: str, env: dict[str, str]
) -> None:
    assert (version, env) == (kube_version_of(entry), entry_env(entry))


def test_entries_sort_by_version_the_gate_off_and_real_node_ones_after_their_version() -> None:
    entries = ["v1.37.2-gate-off", "v1.33.13-realnode", "v1.37.2", "v1.36.3", "v1.33.13"]
    assert [
        "v1.33.13",
        "v1.33.13-realnode",
        "v1.36.3",
        "v1.37.2",
        "v1.37.2-gate-off",
    ] == sorted(entries, key=version_key)


@pytest.mark.parametrize(
    ("entry", "scripts", "marks"),
    [
        ("v1.33.13", [BUILD_SCRIPT], [m for m, _ in PASSES]),
        ("v1.37.2-gate-off", [BUILD_SCRIPT], [m for m, _ in PASSES]),
        ("v1.33.13-realnode", [BUILD_SCRIPT, *NODE_BUILDS], ["realnode"]),
    ],
    ids=["a-version", "gate-off", "real-node"],
)
def test_a_real_node_entry_builds_the_node_stack_and_runs_only_the_real_nodes_tests(
    entry: str, scripts: list[Path], marks: list[str]
) -> None:
    assert scripts == build_scripts(entry)
    assert marks == [m for m, _ in passes(entry)]


def test_the_real_node_round_is_the_walkthrough_lending_and_checkpoints() -> None:
    """Each name of the round's ``-k`` picks a test of its modules (a renamed test would
    otherwise leave the round silently smaller)."""
    modules, selection = REAL_NODE_ROUND
    root = Path(__file__).resolve().parents[2] / "tests" / "e2e"
    names = [
        line.split("(")[0].removeprefix("def ")
        for module in modules
        for line in (root / module).read_text().splitlines()
        if line.startswith("def test_")
    ]
    words = selection.split(" or ")
    assert all(sum(word in name for name in names) == 1 for word in words), words
    assert {"walkthrough", "lenders_memory", "restored_with_its_memory"} <= set(words)


@pytest.mark.parametrize(
    ("modules", "selection", "paths", "k"),
    [
        ([], "", ["tests/e2e"], []),
        (["test_service.py"], "walkthrough", ["tests/e2e/test_service.py"], ["-k", "walkthrough"]),
    ],
    ids=["every-module", "chosen"],
)
def test_the_run_leaves_out_the_real_node_and_runs_the_chosen_modules(
    tmp_path: Path, modules: list[str], selection: str, paths: list[str], k: list[str]
) -> None:
    result = VersionResult("v1.33.13", modules=modules, selection=selection)

    argv = pytest_argv(result, tmp_path / "junit.xml")

    root = Path(__file__).resolve().parents[2]
    assert [str(root / p) for p in paths] == argv[3 : 3 + len(paths)]
    assert ["-m", "not realnode and not image_store and not solo"] == argv[
        3 + len(paths) : 5 + len(paths)
    ]
    assert k == argv[argv.index("-rfEs") + 1 : argv.index("-rfEs") + 1 + len(k)]


@pytest.mark.parametrize(
    ("workers", "xdist"),
    [(0, []), (2, ["-n", "2", "--dist", "loadgroup"])],
    ids=["one-process", "two-workers"],
)
def test_the_tests_run_in_the_workers_asked_for(
    tmp_path: Path, workers: int, xdist: list[str]
) -> None:
    argv = pytest_argv(VersionResult("v1.33.13", workers=workers), tmp_path / "junit.xml")
    found = argv[argv.index("-n") : argv.index("-n") + 4] if "-n" in argv else []
    assert xdist == found


def test_the_solo_tests_run_after_the_parallel_pass_in_one_process(tmp_path: Path) -> None:
    result = VersionResult("v1.33.13", workers=2)

    passes = [pytest_argv(result, tmp_path / "junit.xml", m, p) for m, p in PASSES]

    assert [
        ("not realnode and not image_store and not solo", True),
        ("not realnode and not image_store and solo", False),
    ] == [(argv[argv.index("-m", 3) + 1], "-n" in argv) for argv in passes]


def test_the_docs_table_is_the_one_generated_from_the_results_file() -> None:
    """docs/control-plane.md shows bench/results/matrix.json (``python -m harness.matrix
    --docs-only`` rewrites it)."""
    assert table(load(MATRIX_JSON)) == docs_table(DOCS.read_text())


def test_writing_the_docs_replaces_only_the_table(tmp_path: Path) -> None:
    from harness.matrix import BEGIN, END

    path = tmp_path / "doc.md"
    path.write_text(f"before\n{BEGIN}\nold\n{END}\nafter\n")
    results = [VersionResult("v1.34.4", built=True, tests=[CaseOutcome("m::a", "passed", 1)])]

    write_docs(results, path)

    assert f"before\n{BEGIN}\n{table(results)}\n{END}\nafter\n" == path.read_text()


def test_a_run_of_one_version_keeps_the_rows_of_the_others(tmp_path: Path) -> None:
    path = tmp_path / "matrix.json"
    earlier = [
        VersionResult("v1.36.3", built=True, tests=[CaseOutcome("m::a", "passed", 1.0)]),
        VersionResult("v1.33.13", error="build failed"),
    ]
    path.write_text(json.dumps([asdict(r) for r in earlier]))

    assert earlier == load(path)
    assert [] == load(tmp_path / "none.json")
    assert ["v1.33.13", "v1.34.4", "v1.36.3"] == sorted(
        ["v1.36.3", "v1.34.4", "v1.33.13"], key=version_key
    )


@pytest.mark.parametrize(
    ("changed", "dirty"),
    [
        pytest.param((), False, id="clean"),
        pytest.param(("results.json",), False, id="the-result-file"),
        pytest.param(("results.json", "table.md"), False, id="its-outputs"),
        pytest.param(("code.py",), True, id="a-tracked-file"),
        pytest.param(("results.json", "code.py"), True, id="outputs-and-a-tracked-file"),
    ],
)
def test_the_commit_tested_is_dirty_for_any_change_but_the_matrixs_own_outputs(
    tmp_path: Path, changed: tuple[str, ...], dirty: bool
) -> None:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    git("init", "-q")
    for name in ("results.json", "table.md", "code.py"):
        (tmp_path / name).write_text("before\n")
    git("add", ".")
    git("commit", "-qm", "start")
    for name in changed:
        (tmp_path / name).write_text("after\n")

    own = (tmp_path / "results.json", tmp_path / "table.md")
    head = git("rev-parse", "--short=7", "HEAD")
    assert head + ("+dirty" if dirty else "") == commit_tested(tmp_path, own)
