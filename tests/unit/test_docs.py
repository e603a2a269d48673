"""The operator-facing tables in docs/service.md, docs/operations.md and docs/reliability.md
match the code and the tests they describe."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric

from bench.__main__ import BENCHMARKS
from harness.doubles import InMemoryLedger
from tests.unit.web_fixtures import walkthrough_review, walkthrough_view
from webhook.base.metrics import METRICS, Metrics
from webhook.base.settings import SETTINGS, Config, env_name
from webhook.cli import main
from webhook.engine.admission import AdmissionEngine

SERVICE_DOC = Path(__file__).resolve().parents[2] / "docs" / "service.md"
OPERATIONS_DOC = SERVICE_DOC.with_name("operations.md")


def _table_rows(heading: str) -> dict[str, list[str]]:
    """First-column cell (without backticks) -> the row's cells, for the first table
    under ``## heading``."""
    text = SERVICE_DOC.read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells
    return rows


def _exported_names(family: Metric) -> str:
    # prometheus_client reports counters without their ``_total`` suffix.
    return f"{family.name}_total" if family.type == "counter" else family.name


def test_every_setting_is_documented_with_its_environment_variable() -> None:
    rows = _table_rows("Settings")
    missing = sorted(set(SETTINGS) - set(rows))
    assert [] == missing
    for name in SETTINGS:
        assert f"`{env_name(name)}`" == rows[name][1], name


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        pytest.param(name, s.field, id=name)
        for name, s in SETTINGS.items()
        if isinstance(getattr(Config(), s.field), (int, float, str))
        and not isinstance(getattr(Config(), s.field), bool)
        and getattr(Config(), s.field) != ""
    ],
)
def test_documented_defaults_are_the_real_ones(setting: str, field: str) -> None:
    default = _table_rows("Settings")[setting][2]
    assert f"`{getattr(Config(), field)}`" == default


def test_no_documented_setting_is_unknown() -> None:
    rows = _table_rows("Settings")
    assert [] == sorted(set(rows) - set(SETTINGS) - {"Setting"})


def _metrics_table(doc: Path) -> str:
    """The first table under ``## Metrics``, its lines as written."""
    section = doc.read_text(encoding="utf-8").split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        table.append(line + "\n")
    return "".join(table)


def test_the_operations_metrics_table_is_the_generated_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert 0 == main(["metrics", "--markdown"])
    generated = capsys.readouterr().out

    assert generated == _metrics_table(OPERATIONS_DOC)


def test_every_exported_metric_is_named_in_the_table_with_its_type() -> None:
    exported = {_exported_names(f): f.type for f in Metrics().registry.collect()}
    # A renamed metric is exported under its former name too, for one release.
    deprecated = {d.deprecated: d.kind for d in METRICS if d.deprecated}
    assert {**{d.name: d.kind for d in METRICS}, **deprecated} == exported


def test_the_documented_decision_log_line_has_the_fields_the_engine_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = SERVICE_DOC.read_text(encoding="utf-8")
    block = re.search(r"```json\n(\{.*\})\n```", text)
    assert block is not None
    documented = json.loads(block.group(1).replace("…", ""))
    engine = AdmissionEngine(Config(), walkthrough_view(), InMemoryLedger())
    with caplog.at_level(logging.INFO, logger="webhook.decisions"):
        engine.validate(walkthrough_review()["request"])
    logged = json.loads(caplog.records[-1].getMessage())
    assert ("preempt", sorted(logged)) == (documented["verdict"], sorted(documented))


def test_no_doc_rule_or_code_uses_a_metric_name_from_before_the_rename() -> None:
    # The old names all began with rpw_ (docs/operations.md lists them): a merge that
    # brings one back would export or query a series nobody else knows.
    repo = SERVICE_DOC.parents[1]
    files = [
        *repo.glob("docs/*.md"),
        repo / "README.md",
        *(p for p in (repo / "deploy").rglob("*") if p.is_file()),
        *(repo / "webhook").rglob("*.py"),
    ]
    old = re.compile(r"\brpw_[a-z_]+")
    found = {
        f"{path.relative_to(repo)}: {name}"
        for path in files
        for line in path.read_text(encoding="utf-8").splitlines()
        # The table of old names and their new ones.
        if not (path.name == "operations.md" and line.startswith("| `rpw_"))
        for name in old.findall(line)
    }
    assert set() == found


RELIABILITY_DOC = SERVICE_DOC.with_name("reliability.md")
REPO = SERVICE_DOC.parents[1]


def _threat_rows() -> list[list[str]]:
    text = RELIABILITY_DOC.read_text(encoding="utf-8")
    section = text.split("\n## Threat model\n", 1)[1].split("\n## ", 1)[0]
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("|") and not set(line) <= set("|-: ")
    ][1:]


def _named_tests(cell: str) -> list[Path]:
    """The test files a cell names: full paths, and bare names after one in its folder."""
    named: list[Path] = []
    folder = REPO / "tests"
    # A path opens its backticks; ``-k`` and other arguments may follow it.
    for word in re.findall(r"`([^`\s]+\.py)[`\s]", cell):
        path = REPO / word if "/" in word else folder / word
        folder = path.parent
        named.append(path)
    return named


def test_every_threat_names_tests_that_exist_and_every_metric_it_names_is_exported() -> None:
    exported = {d.name for d in METRICS}
    rows = _threat_rows()
    assert rows
    for who, misuse, stops, tested, _ in rows:
        files = _named_tests(tested)
        assert files or misuse == "-", f"no test named for {who!r}"
        assert [] == [str(f) for f in files if not f.is_file()], who
        for metric in re.findall(r"`(resize_preemption_\w+?)(?:\{[^`]*\})?`", stops):
            assert metric in exported, (who, metric)


#: Past this a table row is prose in a cell; its detail belongs in the sections below.
LONGEST_ROW = 400


def test_no_table_row_of_the_reliability_doc_is_longer_than_400_characters() -> None:
    lines = RELIABILITY_DOC.read_text(encoding="utf-8").splitlines()
    rows = [line for line in lines if line.startswith("|")]
    too_long = [f"line {lines.index(r) + 1}: {len(r)}" for r in rows if len(r) > LONGEST_ROW]

    assert rows
    assert [] == too_long


def _finding_rows() -> list[list[str]]:
    """The findings table at the head of docs/reliability.md, without its header."""
    head = RELIABILITY_DOC.read_text(encoding="utf-8").split("\n## ", 1)[0]
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in head.splitlines()
        if line.startswith("|") and not set(line) <= set("|-: ")
    ][1:]


def _bench_modules(cell: str) -> list[str]:
    """The modules a cell's ``python -m bench ...`` commands run."""
    modules = []
    for module, name in re.findall(r"`python -m (bench(?:\.\w+)?)(?: ([\w-]+))?", cell):
        modules.append(BENCHMARKS.get(name, name) if module == "bench" else module)
    return modules


@pytest.mark.parametrize("row", _finding_rows(), ids=lambda row: row[0])
def test_every_finding_names_a_test_or_benchmark_that_exists(row: list[str]) -> None:
    shown_by = row[-1]
    files = _named_tests(shown_by)
    modules = _bench_modules(shown_by)
    missing_modules = [
        m
        for m in modules
        if not (REPO / f"{m.replace('.', '/')}.py").is_file()
        and not (REPO / m.replace(".", "/") / "__main__.py").is_file()
    ]

    assert files or modules, "names neither a test nor a benchmark"
    assert [] == [str(f) for f in files if not f.is_file()]
    assert [] == missing_modules
