"""The docs quote benchmark figures from the results files only: every generated block of a
doc is what ``python -m bench.report`` renders from its files now, so a figure cannot
outlive the file it came from."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.report import COMMAND, DOCS, REPO, blocks, regenerate, render

DOCS_WITH_BLOCKS = [doc for doc in DOCS if any(blocks(doc.read_text(encoding="utf-8")))]


def test_the_comparison_and_the_service_docs_quote_generated_figures() -> None:
    names = {doc.name for doc in DOCS_WITH_BLOCKS}

    assert {"comparison.md", "service.md"} <= names


@pytest.mark.parametrize("doc", DOCS_WITH_BLOCKS, ids=lambda d: d.name)
def test_every_generated_block_is_rendered_from_its_files_now(doc: Path) -> None:
    text = doc.read_text(encoding="utf-8")
    stale = [
        " ".join(files) for files, body in blocks(text) if body != render([REPO / f for f in files])
    ]

    assert [] == stale, f"{doc.name}: blocks differ from their files; run `{COMMAND}`"


@pytest.mark.parametrize("doc", DOCS_WITH_BLOCKS, ids=lambda d: d.name)
def test_every_block_names_results_files_that_exist(doc: Path) -> None:
    missing = [
        f
        for files, _ in blocks(doc.read_text(encoding="utf-8"))
        for f in files
        if not f.startswith("bench/results/") or not (REPO / f).is_file()
    ]

    assert [] == missing


def test_a_block_is_rendered_again_in_place() -> None:
    text = (
        "before\n<!-- generated: bench/results/cache.json -->\nold figures\n"
        "<!-- end generated -->\nafter\n"
    )

    fresh = regenerate(text)

    assert fresh.startswith("before\n<!-- generated: bench/results/cache.json -->\n- `cache.json`")
    assert fresh.endswith("<!-- end generated -->\nafter\n")
    assert "old figures" not in fresh
