"""The line kinds ``scripts/code_figures.py`` reports for docs/architecture.md."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("code_figures", ROOT / "scripts/code_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Case(NamedTuple):
    id: str
    source: str
    want: dict[str, int]


CASES = [
    Case("code-only", "x = 1\ny = 2\n", {"code": 2}),
    Case("blank-between", "x = 1\n\n\ny = 2\n", {"code": 2, "blank": 2}),
    Case("comment-line", "# why\nx = 1\n", {"comment": 1, "code": 1}),
    Case("trailing-comment-is-code", "x = 1  # why\n", {"code": 1}),
    Case("attribute-comment", "#: what it is\nX = 1\n", {"comment": 1, "code": 1}),
    Case(
        "module-docstring-with-blank-line",
        '"""One.\n\nTwo.\n"""\n\nx = 1\n',
        {"docstring": 4, "blank": 1, "code": 1},
    ),
    Case(
        "function-and-class-docstrings",
        'def f():\n    """Does f."""\n    return 1\n\n\nclass C:\n    """A C."""\n',
        {"code": 3, "docstring": 2, "blank": 2},
    ),
    Case("a-string-statement-later-is-code", 'x = 1\n"not a docstring"\n', {"code": 2}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kinds(case: Case) -> None:
    assert Counter(case.want) == _figures().kinds(case.source)


def test_every_line_of_the_package_has_one_kind() -> None:
    figures = _figures()
    lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "webhook").rglob("*.py"))

    assert lines == sum(n.total() for n in figures.by_package(ROOT).values())
