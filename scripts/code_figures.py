"""Size figures of the product package, for docs/architecture.md.

    python scripts/code_figures.py [ROOT]      # ROOT: a checkout (default: this one)

Prints the lines of ``webhook/`` (every line of every ``.py`` file), its classes, the
modules that mention loans (``grep -ril loan webhook``, as a file count) and the longest
functions (``def`` to its last line, decorators left out), longest first.
"""

from __future__ import annotations

import ast
import sys
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


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent
    files = sorted((root / "webhook").rglob("*.py"))
    lines = sum(len(p.read_text().splitlines()) for p in files)
    classes = sum(
        isinstance(n, ast.ClassDef) for p in files for n in ast.walk(ast.parse(p.read_text()))
    )
    loans = [p for p in files if "loan" in p.read_text().lower()]
    print(f"modules {len(files)}, lines {lines}, classes {classes}, mention loans {len(loans)}")
    for f in functions(root)[:12]:
        print(f"{f.lines:4d}  {f.name}  ({f.path})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
