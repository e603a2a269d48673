"""Size figures of the product package, for docs/comparison.md.

    python scripts/code_figures.py [ROOT]      # ROOT: a checkout (default: this one)

Prints the lines of ``webhook/`` (every line of every ``.py`` file), its classes, the
modules that mention loans (``grep -ril loan webhook``, as a file count), the lines of
each package by kind (blank, comment, docstring, code) and the longest functions (``def``
to its last line, decorators left out), longest first.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from collections import Counter
from pathlib import Path
from typing import NamedTuple


class Function(NamedTuple):
    name: str
    path: str
    lines: int


def functions(root: Path) -> list[Function]:
    """Every function and method of ``root/webhook``, longest first."""
    found = []
    for path in sorted((root / "webhook").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                owner = parents.get(node)
                name = f"{owner.name}.{node.name}" if isinstance(owner, ast.ClassDef) else node.name
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append(Function(name, str(path.relative_to(root)), length))
    return sorted(found, key=lambda f: (-f.lines, f.path, f.name))


#: What a docstring documents: a module, a class, a function.
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def kinds(source: str) -> Counter[str]:
    """Lines of ``source`` by kind: a docstring's lines are ``docstring``, a line with
    nothing but a comment ``comment``, an empty one ``blank``, every other ``code``."""
    lines = source.splitlines()
    kind = ["code" if line.strip() else "blank" for line in lines]
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and not lines[tok.start[0] - 1][: tok.start[1]].strip():
            kind[tok.start[0] - 1] = "comment"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, _DOCUMENTED) and ast.get_docstring(node, clean=False) is not None:
            first = node.body[0]
            for n in range(first.lineno - 1, first.end_lineno or first.lineno):
                kind[n] = "docstring"
    return Counter(kind)


def by_package(root: Path) -> dict[str, Counter[str]]:
    """Line kinds per package of ``root/webhook`` (its top-level modules as ``webhook``)."""
    out: dict[str, Counter[str]] = {}
    for path in sorted((root / "webhook").rglob("*.py")):
        rel = path.relative_to(root / "webhook")
        package = f"webhook/{rel.parts[0]}" if len(rel.parts) > 1 else "webhook"
        out.setdefault(package, Counter()).update(kinds(path.read_text()))
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent
    files = sorted((root / "webhook").rglob("*.py"))
    packages = by_package(root)
    lines = sum(n.total() for n in packages.values())
    classes = sum(
        isinstance(n, ast.ClassDef) for p in files for n in ast.walk(ast.parse(p.read_text()))
    )
    loans = [p for p in files if "loan" in p.read_text().lower()]
    print(f"modules {len(files)}, lines {lines}, classes {classes}, mention loans {len(loans)}")
    total: Counter[str] = Counter()
    print(f"{'package':16s}{'lines':>7s}{'code':>7s}{'docstring':>10s}{'comment':>8s}{'blank':>7s}")
    for package, n in packages.items():
        total.update(n)
        print(_kinds_row(package, n))
    print(_kinds_row("all", total))
    for f in functions(root)[:12]:
        print(f"{f.lines:4d}  {f.name}  ({f.path})")
    return 0


def _kinds_row(name: str, n: Counter[str]) -> str:
    row = (n.total(), n["code"], n["docstring"], n["comment"], n["blank"])
    return f"{name:16s}{row[0]:7d}{row[1]:7d}{row[2]:10d}{row[3]:8d}{row[4]:7d}"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
