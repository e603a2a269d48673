"""docs/architecture.md is the one page a newcomer reads first: it names every package of
the tree, every module path it names exists, and it stays one page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "architecture.md"
#: One printed page of prose and tables, and its two drawings.
MOST_LINES = 140


def _packages() -> list[str]:
    """Every package of the product, as ``webhook/x/``, its top-level modules but the
    entry points' plumbing, and the tree's other top-level folders of code."""
    found = [
        f"webhook/{p.name}/"
        for p in sorted((ROOT / "webhook").iterdir())
        if (p / "__init__.py").exists()
    ]
    found += [
        f"webhook/{p.name}"
        for p in sorted((ROOT / "webhook").glob("*.py"))
        if p.name not in ("__init__.py", "__main__.py")
    ]
    return [*found, "harness/", "bench/", "deploy/", "tests/"]


@pytest.mark.parametrize("package", _packages())
def test_the_map_names_every_package(package: str) -> None:
    assert f"`{package}`" in MAP.read_text(), f"docs/architecture.md does not name {package}"


def test_every_module_path_the_map_names_exists() -> None:
    text = MAP.read_text()
    named = set(re.findall(r"\b((?:core|base|tls|engine|agent|kube|web)/[\w/]+\.py)\b", text))
    missing = sorted(p for p in named if not (ROOT / "webhook" / p).exists())
    assert named and missing == []


def test_the_map_is_one_page() -> None:
    assert len(MAP.read_text().splitlines()) <= MOST_LINES
