"""Reading pytest's junit report and writing the matrix table."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from harness.matrix import CaseOutcome, VersionResult, load, parse_junit, table, version_key

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.e2e.test_service" name="test_walkthrough" time="3.5"/>
<testcase classname="tests.e2e.test_service" name="test_pdb[x]" time="1.0">
  <failure message="AssertionError: assert 'Deferred' == 'Infeasible'">trace</failure>
</testcase>
<testcase classname="tests.e2e.test_reconciler" name="test_start" time="0.1">
  <error message="failed on setup">trace</error>
</testcase>
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


def test_table_has_a_row_per_version_and_a_line_per_test_that_did_not_pass() -> None:
    results = [
        VersionResult(
            "v1.36.3",
            built=True,
            build_seconds=900,
            kubelet_version="Kubernetes v1.36.3",
            pod_resize_validator=True,
            in_place_resize_gate="GA",
            test_seconds=300,
            tests=[CaseOutcome("m::a", "passed", 1.0), CaseOutcome("m::b", "failed", 1, "boom\nx")],
        ),
        VersionResult("v1.33.13", error="build failed: no compat_1_33.go"),
    ]

    lines = table(results).splitlines()

    assert [
        "| v1.36.3 | 900 s | v1.36.3 | on | GA | 1 | 1 | 0 | 300 s |",
        "| v1.33.13 | failed |  | absent |  | 0 | 0 | 0 | 0 s |",
        "",
        "* v1.36.3 failed: `m::b`: boom",
        "* v1.33.13: build failed: no compat_1_33.go",
    ] == lines[2:]


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
