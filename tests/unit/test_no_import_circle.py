"""No import circle among the modules of ``webhook/``, ``harness/`` and ``bench/``,
type-checking imports included: each module can be read knowing only what it imports.
No module there takes another's private (underscore) name: what two modules share is
public in one of them, or in a module both import."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]
TREES = ("webhook", "harness", "bench")


def test_no_module_imports_one_that_imports_it_back() -> None:
    graph = grimp.build_graph(*TREES, include_external_packages=False)
    circles = sorted(
        (module, imported)
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if graph.chain_exists(importer=imported, imported=module)
    )

    assert [] == circles


def test_harness_never_imports_a_benchmark() -> None:
    graph = grimp.build_graph(*TREES, include_external_packages=False)
    imports = sorted(
        (module, imported)
        for module in graph.modules
        if module.split(".")[0] in ("webhook", "harness")
        for imported in graph.find_modules_directly_imported_by(module)
        if imported.split(".")[0] == "bench"
    )

    assert [] == imports


def _is_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(source: str) -> list[str]:
    """Private names ``source`` takes from a module of the trees: ``from m import _x``, or
    ``m._x`` where ``m`` is such a module it imported."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in TREES:
                    modules[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in TREES:
                continue
            for alias in node.names:
                if _is_module(f"{node.module}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                elif _private(alias.name):
                    found.append(f"{node.module}.{alias.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and _private(node.attr)
        ):
            found.append(f"{modules[node.value.id]}.{node.attr}")
    return found


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param(
            "from bench.flood import _rss_kb\n", ["bench.flood._rss_kb"], id="from-import"
        ),
        pytest.param(
            "from harness.compare import runner\nrunner._combine([])\n",
            ["harness.compare.runner._combine"],
            id="attribute-of-an-imported-module",
        ),
        pytest.param("from webhook import __version__\n", [], id="dunder-names-are-public"),
        pytest.param("from os import _exit\n", [], id="outside-the-trees"),
        pytest.param("from harness.flood import drive\n", [], id="public-name"),
    ],
)
def test_private_uses_are_found(source: str, expected: list[str]) -> None:
    assert expected == private_uses(source)


def test_no_module_takes_a_private_name_of_another() -> None:
    found = sorted(
        f"{path.relative_to(REPO)}: {name}"
        for tree in TREES
        for path in (REPO / tree).rglob("*.py")
        for name in private_uses(path.read_text(encoding="utf-8"))
    )

    assert [] == found
