"""Where a result file's figures come from: the commit measured, when, how busy the machine
was, and the command that made them.

Every benchmark writes its results file through :class:`Run`: started when the benchmark
starts (the load average then), written at its end. The file is a JSON object whose
``provenance`` block holds ``commit`` (``git rev-parse HEAD``) and ``dirty`` (uncommitted
changes in the tree: the figures are of no commit), ``date`` (UTC, ISO 8601, when
written) and ``started``, ``load`` (the 1, 5 and 15 minute load averages at start and
end, and the CPUs) and ``command`` (the process's own command line). A benchmark whose
figures are a list writes them under ``rows``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: The keys every provenance block holds.
KEYS = ("commit", "date", "load", "command")


def _git(*args: str) -> str:
    out = subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=False, timeout=30
    )
    return out.stdout.strip() if out.returncode == 0 else ""


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def portable(argv: Sequence[str]) -> list[str]:
    """``argv`` as anyone could type it in a checkout: the interpreter as ``python`` and
    paths inside the repository relative to it, so a file names no machine's paths."""
    out = []
    for i, arg in enumerate(argv):
        if i == 0 and Path(arg).name.startswith("python"):
            out.append("python")
            continue
        path = Path(arg)
        if path.is_absolute() and path.is_relative_to(REPO):
            arg = str(path.relative_to(REPO))
        out.append(arg)
    return out


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass
class Run:
    """One benchmark run, from its start: :meth:`write` puts its figures in a file."""

    command: Sequence[str] = field(default_factory=lambda: portable(sys.orig_argv))
    started: str = field(default_factory=now)
    load_start: list[float] = field(default_factory=load)

    def provenance(self) -> dict[str, Any]:
        return {
            "commit": _git("rev-parse", "HEAD") or None,
            "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
            "date": now(),
            "started": self.started,
            "load": {"start": self.load_start, "end": load(), "nproc": os.cpu_count()},
            "command": list(self.command),
        }

    def document(self, figures: dict[str, Any] | list[Any]) -> dict[str, Any]:
        """``figures`` with this run's provenance first (a list under ``rows``); a
        provenance block ``figures`` already holds (a file read back) is replaced."""
        body = {"rows": figures} if isinstance(figures, list) else figures
        return {"provenance": self.provenance()} | {
            k: v for k, v in body.items() if k != "provenance"
        }

    def write(self, path: Path, figures: dict[str, Any] | list[Any]) -> Path:
        return _write(path, self.document(figures))

    def update(self, path: Path, part: str, figures: Any) -> Path:
        """``path``'s ``part`` replaced by ``figures``, its other parts kept: a file two
        benchmarks write a part each of. Its provenance is this run's, with ``parts``
        saying which run wrote each part (a part of an older file without it: that
        file's provenance, or None)."""
        old = read(path) if path.exists() else {}
        before = old.get("provenance")
        parts = dict((before or {}).get("parts") or {})
        for other in old:
            if other not in ("provenance", part) and other not in parts:
                parts[other] = {k: v for k, v in before.items() if k != "parts"} if before else None
        document = self.document({k: v for k, v in old.items() if k != "provenance"})
        parts[part] = dict(document["provenance"])
        document["provenance"]["parts"] = parts
        document[part] = figures
        return _write(path, document)


def _write(path: Path, document: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


def figures(document: dict[str, Any]) -> dict[str, Any] | list[Any]:
    """A results file's figures without its provenance: its ``rows`` when it has them."""
    if "rows" in document and set(document) <= {"provenance", "rows"}:
        rows: list[Any] = document["rows"]
        return rows
    return {k: v for k, v in document.items() if k != "provenance"}


def read(path: Path) -> dict[str, Any]:
    """A results file as written: an object with its provenance."""
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return document
