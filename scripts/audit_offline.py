"""Every pin of the lock files against known advisories, for ``make audit``.

    python scripts/audit_offline.py --db DIR LOCK [LOCK ...]   # a local OSV database
    python scripts/audit_offline.py [--fallback-db DIR] LOCK [LOCK ...]   # pip-audit first

With ``--db``, DIR is a checkout of an advisory database in the OSV format (PyPA's
advisory database: one YAML per advisory under ``vulns/<package>/``; the GitHub Advisory
Database: JSON under ``advisories/``). Each pin is affected by an advisory when one of its
``affected`` entries names the package in the PyPI ecosystem (names compared normalized,
PEP 503) and lists the pinned version, or when the version lies in one of its ``ECOSYSTEM``
ranges, evaluated as the OSV schema's "Evaluation" section says (events in version order;
``introduced``, ``fixed``, ``last_affected``, ``limit``; ``"0"`` before every version,
``"*"`` after). Versions compare as PEP 440 says (packaging). Withdrawn advisories are
skipped; ``SEMVER`` and ``GIT`` ranges are not used for PyPI packages and are ignored.

Without ``--db``, pip-audit asks PyPI's vulnerability service. Where that service does not
answer, pip-audit "could not audit" every pin (and would report nothing found); the pins are
then checked against the database at ``--fallback-db`` when there is one there, and
otherwise this says so and exits 2.

One line per finding: package, version, advisory id, aliases, fixed versions. Exit 0 when
there is none (with the database's commit and date), 1 when there is any or a pin could
not be checked, 2 on bad input (a lock or database missing, a directory that holds no OSV
advisory for the PyPI ecosystem, pip-audit auditing no pin and no database to fall back on).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

#: A pinned requirement line of a pip-compile lock: ``name==version``, extras and
#: environment markers allowed.
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")

#: What a database's files may be; anything else (its README, its workflows) is not read.
SUFFIXES = {".yaml", ".yml", ".json"}

# YAML's own scalars would read ``fixed: 1.10`` as the float 1.1; every scalar stays a string.
_YAML_LOADER = getattr(yaml, "CBaseLoader", yaml.BaseLoader)


class BadInput(Exception):
    """A lock or database that cannot be read as one: one line, exit 2."""


class Unevaluable(Exception):
    """A range whose bounds are not PEP 440 versions: the pin cannot be checked against it."""


def normalize(name: str) -> str:
    """A package name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    locks: tuple[str, ...]


def read_pins(paths: Sequence[Path]) -> list[Pin]:
    """Every ``name==version`` of the lock files, once per (normalized name, version)."""
    seen: dict[tuple[str, str], list[str]] = {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise BadInput(f"cannot read the lock {path}: {e.strerror}") from e
        found = [m for m in map(PIN.match, text.splitlines()) if m]
        if not found:
            raise BadInput(f"{path} pins no package (no name==version line)")
        for m in found:
            seen.setdefault((normalize(m.group(1)), m.group(2)), []).append(path.name)
    return [Pin(name, version, tuple(locks)) for (name, version), locks in sorted(seen.items())]


# A bound's place in the version order: "0" (introduced) before every version, "*"
# (limit) after every one, anything else where PEP 440 puts it.
_BEFORE_ALL, _AT, _AFTER_ALL = -1, 0, 1


def _key(kind: str, value: str) -> tuple[int, Version]:
    if kind == "introduced" and value == "0":
        return (_BEFORE_ALL, Version("0"))
    if kind == "limit" and "*" in value:
        return (_AFTER_ALL, Version("0"))
    try:
        return (_AT, Version(value))
    except InvalidVersion as e:
        raise Unevaluable(f"{kind} {value!r} is not a PEP 440 version") from e


def _events(events: Iterable[Mapping[str, str]]) -> list[tuple[str, tuple[int, Version]]]:
    out = []
    for event in events:
        for kind in ("introduced", "fixed", "last_affected", "limit"):
            if kind in event:
                out.append((kind, _key(kind, str(event[kind]))))
    return out


def in_range(version: Version, events: Iterable[Mapping[str, str]]) -> bool:
    """Whether ``version`` lies in one OSV range (its events), as IncludedInRanges does."""
    at = (_AT, version)
    parsed = _events(events)
    limits = [key for kind, key in parsed if kind == "limit"]
    if limits and not any(at < key for key in limits):
        return False
    vulnerable = False
    for kind, key in sorted((e for e in parsed if e[0] != "limit"), key=lambda e: e[1]):
        if kind == "introduced" and at >= key:
            vulnerable = True
        elif (kind == "fixed" and at >= key) or (kind == "last_affected" and at > key):
            vulnerable = False
    return vulnerable


def _listed(version: Version, raw: str, versions: Iterable[Any]) -> bool:
    for listed in versions:
        if str(listed) == raw:
            return True
        try:
            if Version(str(listed)) == version:
                return True
        except InvalidVersion:
            continue
    return False


def _entries(advisory: Mapping[str, Any], name: str) -> list[Mapping[str, Any]]:
    """The advisory's ``affected`` entries for the PyPI package ``name`` (normalized)."""
    out = []
    for entry in advisory.get("affected") or []:
        package = entry.get("package") or {}
        if package.get("ecosystem") == "PyPI" and normalize(str(package.get("name"))) == name:
            out.append(entry)
    return out


def affects(advisory: Mapping[str, Any], name: str, raw_version: str) -> bool:
    """Whether the advisory affects PyPI package ``name`` at ``raw_version`` (OSV's
    IsVulnerable); raises :class:`Unevaluable` when a range of it cannot be read."""
    if advisory.get("withdrawn"):
        return False
    try:
        version = Version(raw_version)
    except InvalidVersion as e:
        raise Unevaluable(f"the pin {raw_version!r} is not a PEP 440 version") from e
    for entry in _entries(advisory, normalize(name)):
        if _listed(version, raw_version, entry.get("versions") or []):
            return True
        for r in entry.get("ranges") or []:
            if r.get("type") == "ECOSYSTEM" and in_range(version, r.get("events") or []):
                return True
    return False


def fixed_versions(advisory: Mapping[str, Any], name: str) -> list[str]:
    """The ``fixed`` events of the advisory's ECOSYSTEM ranges for ``name``, in order."""
    found = {
        str(event["fixed"])
        for entry in _entries(advisory, normalize(name))
        for r in entry.get("ranges") or []
        if r.get("type") == "ECOSYSTEM"
        for event in r.get("events") or []
        if "fixed" in event
    }
    return sorted(found, key=_order)


def _order(value: str) -> tuple[int, Version | str]:
    """Sorts versions, any that is not PEP 440 last."""
    try:
        return (0, Version(value))
    except InvalidVersion:
        return (1, value)


@dataclass
class Database:
    """The PyPI advisories of an OSV tree, by normalized package name."""

    root: Path
    by_package: dict[str, list[Mapping[str, Any]]] = field(default_factory=dict)
    advisories: int = 0
    withdrawn: int = 0
    newest_modified: str = ""


def _records(path: Path) -> list[Any]:
    text = path.read_text(encoding="utf-8", errors="replace")
    if "PyPI" not in text:
        return []
    try:
        doc = json.loads(text) if path.suffix == ".json" else yaml.load(text, Loader=_YAML_LOADER)
    except (ValueError, yaml.YAMLError):
        return []
    return doc if isinstance(doc, list) else [doc]


def _files(root: Path) -> Iterable[Path]:
    for path in sorted(root.rglob("*")):
        hidden = any(part.startswith(".") for part in path.relative_to(root).parts)
        if path.suffix in SUFFIXES and not hidden and path.is_file():
            yield path


def load_database(root: Path) -> Database:
    """Every OSV record of ``root`` with an ``affected`` entry in the PyPI ecosystem."""
    if not root.is_dir():
        raise BadInput(f"advisory database {root}: no such directory")
    db = Database(root)
    for path in _files(root):
        for record in _records(path):
            if not (isinstance(record, dict) and isinstance(record.get("id"), str)):
                continue
            names = {
                normalize(str((e.get("package") or {}).get("name")))
                for e in record.get("affected") or []
                if isinstance(e, dict) and (e.get("package") or {}).get("ecosystem") == "PyPI"
            }
            if not names or "modified" not in record:
                continue
            db.advisories += 1
            db.newest_modified = max(db.newest_modified, str(record["modified"]))
            if record.get("withdrawn"):
                db.withdrawn += 1
                continue
            for name in names:
                db.by_package.setdefault(name, []).append(record)
    if not db.advisories:
        raise BadInput(f"{root} holds no OSV advisory for the PyPI ecosystem")
    return db


def describe(db: Database) -> str:
    """Where the database's advisories come from: its commit and date, when a git checkout."""
    stamp = "not a git checkout"
    if (db.root / ".git").exists():
        got = subprocess.run(
            ["git", "-C", str(db.root), "log", "-1", "--format=commit %H of %cI"],
            capture_output=True,
            text=True,
            check=False,
        )
        stamp = got.stdout.strip() or stamp
    return (
        f"advisory database {db.root}: {stamp}; {db.advisories} PyPI advisories "
        f"({db.withdrawn} withdrawn, skipped), the newest modified {db.newest_modified}"
    )


@dataclass(frozen=True)
class Finding:
    name: str
    version: str
    id: str
    aliases: tuple[str, ...]
    fixed: tuple[str, ...]


def audit(pins: Sequence[Pin], db: Database) -> tuple[list[Finding], list[str]]:
    """The findings, and a line per (pin, advisory) that could not be evaluated."""
    findings, unchecked = [], []
    for pin in pins:
        for advisory in db.by_package.get(pin.name, []):
            try:
                hit = affects(advisory, pin.name, pin.version)
            except Unevaluable as e:
                unchecked.append(f"{pin.name} {pin.version}: {advisory['id']}: {e}")
                continue
            if hit:
                aliases = tuple(sorted(str(a) for a in advisory.get("aliases") or []))
                fixed = tuple(fixed_versions(advisory, pin.name))
                findings.append(Finding(pin.name, pin.version, advisory["id"], aliases, fixed))
    return sorted(findings, key=lambda f: (f.name, f.id)), unchecked


def table(findings: Sequence[Finding]) -> list[str]:
    """pip-audit's columns, aliases included."""
    rows = [["Name", "Version", "ID", "Aliases", "Fix Versions"]]
    rows += [[f.name, f.version, f.id, ",".join(f.aliases), ",".join(f.fixed)] for f in findings]
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    rows.insert(1, ["-" * w for w in widths])
    return [" ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def report(findings: Sequence[Finding], unchecked: Sequence[str], source: str) -> int:
    """Prints the outcome as pip-audit does; the exit status."""
    for line in unchecked:
        print(f"could not be audited: {line}")
    if findings:
        n, packages = len(findings), len({f.name for f in findings})
        print(
            f"Found {n} known vulnerabilit{'y' if n == 1 else 'ies'} in {packages} "
            f"package{'' if packages == 1 else 's'} ({source})"
        )
        print("\n".join(table(findings)))
        return 1
    if unchecked:
        print(f"{len(unchecked)} could not be audited ({source})")
        return 1
    print(f"No known vulnerabilities found ({source})")
    return 0


def offline(locks: Sequence[Path], db_root: Path) -> int:
    pins = read_pins(locks)
    db = load_database(db_root)
    findings, unchecked = audit(pins, db)
    each = ", ".join(f"{lock}: {sum(lock.name in p.locks for p in pins)}" for lock in locks)
    named = sum(len(db.by_package.get(p.name, [])) for p in pins)
    print(f"{len(pins)} pins ({each}); {named} advisories name a pinned package")
    return report(findings, unchecked, describe(db))


def _pip_audit_json(locks: Sequence[Path]) -> tuple[dict[str, Any] | None, str]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "audit.json"
        args = [sys.executable, "-m", "pip_audit", "--disable-pip", "--require-hashes"]
        args += [a for lock in locks for a in ("-r", str(lock))]
        args += ["--format", "json", "--aliases", "on", "--output", str(out)]
        got = subprocess.run(args, capture_output=True, text=True, check=False)
        last = (got.stderr.strip().splitlines() or ["no output"])[-1]
        if not out.exists():
            return None, last
        return json.loads(out.read_text(encoding="utf-8")), last


def online(locks: Sequence[Path], fallback: Path | None) -> int:
    """pip-audit through PyPI's vulnerability service; where it audits no pin, the
    database at ``fallback`` when there is one there, else exit 2."""
    for lock in locks:
        if not lock.is_file():
            raise BadInput(f"cannot read the lock {lock}: no such file")
    doc, last = _pip_audit_json(locks)
    deps = (doc or {}).get("dependencies") or []
    audited = [d for d in deps if "skip_reason" not in d]
    if not audited:
        reason = next((d["skip_reason"] for d in deps), last)
        cannot = f"pip-audit audited none of {len(deps)} pins ({reason})"
        if fallback is not None and fallback.is_dir():
            print(f"{cannot}; the advisory database {fallback} instead")
            return offline(locks, fallback)
        where = f"no advisory database at {fallback}, " if fallback is not None else ""
        raise BadInput(
            f"{cannot}: PyPI's vulnerability service does not answer here and {where}"
            "give one: `make audit ADVISORY_DB=DIR`, DIR a checkout of an OSV advisory "
            "database (docs/reliability.md)"
        )
    skipped = [f"{d['name']}: {d['skip_reason']}" for d in deps if "skip_reason" in d]
    findings = [
        Finding(
            d["name"], d["version"], v["id"], tuple(v.get("aliases", [])), tuple(v["fix_versions"])
        )
        for d in audited
        for v in d.get("vulns", [])
    ]
    return report(findings, skipped, f"pip-audit, {len(audited)} pins")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, help="a checkout of an OSV advisory database")
    parser.add_argument(
        "--fallback-db",
        type=Path,
        help="the database to check against where pip-audit audits no pin",
    )
    parser.add_argument("locks", type=Path, nargs="+", metavar="LOCK")
    args = parser.parse_args(argv)
    try:
        return offline(args.locks, args.db) if args.db else online(args.locks, args.fallback_db)
    except BadInput as e:
        print(f"audit: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
