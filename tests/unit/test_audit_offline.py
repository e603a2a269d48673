"""``make audit`` against a local OSV advisory database (scripts/audit_offline.py): which
pins an advisory's ``affected`` entries cover, as the OSV schema's evaluation rules say,
what it prints and how it exits. The fixtures are small advisories written here; the run
against PyPA's real database is in docs/reliability.md ("Dependencies")."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "audit_offline", ROOT / "scripts/audit_offline.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up by name while the class is made.
    sys.modules["audit_offline"] = module
    spec.loader.exec_module(module)
    return module


audit = _load()


def advisory(
    *ranges: list[dict[str, str]],
    versions: tuple[str, ...] = (),
    name: str = "demo",
    ecosystem: str = "PyPI",
    range_type: str = "ECOSYSTEM",
    **extra: Any,
) -> dict[str, Any]:
    """One OSV record with one ``affected`` entry: a range per events list."""
    entry: dict[str, Any] = {
        "package": {"ecosystem": ecosystem, "name": name},
        "ranges": [{"type": range_type, "events": events} for events in ranges],
    }
    if versions:
        entry["versions"] = list(versions)
    return {"id": "PYSEC-0000-1", "modified": "2026-01-01T00:00:00Z", "affected": [entry], **extra}


FIXED_2 = [{"introduced": "0"}, {"fixed": "2.0.0"}]
LAST_2 = [{"introduced": "0"}, {"last_affected": "2.0.0"}]
TWO_SPANS = [{"introduced": "1.0"}, {"fixed": "1.2"}, {"introduced": "3.0"}, {"fixed": "3.2.5"}]


@pytest.mark.parametrize(
    ("expected", "record", "name", "version"),
    [
        pytest.param(True, advisory(FIXED_2), "demo", "1.9.9", id="introduced-0-below-fix"),
        pytest.param(True, advisory(FIXED_2), "demo", "0.0.1", id="introduced-0-first"),
        pytest.param(False, advisory(FIXED_2), "demo", "2.0.0", id="fixed-itself"),
        pytest.param(False, advisory(FIXED_2), "demo", "2.0", id="fixed-as-pep440-equal"),
        pytest.param(False, advisory(FIXED_2), "demo", "2.0.1", id="above-fix"),
        pytest.param(True, advisory(LAST_2), "demo", "2.0.0", id="last-affected-itself"),
        pytest.param(False, advisory(LAST_2), "demo", "2.0.0.post1", id="above-last-affected"),
        pytest.param(
            True,
            advisory([{"introduced": "1.5"}]),
            "demo",
            "99.0",
            id="introduced-without-fix-every-later",
        ),
        pytest.param(
            False, advisory([{"introduced": "1.5"}]), "demo", "1.4", id="before-introduced"
        ),
        pytest.param(True, advisory(TWO_SPANS), "demo", "1.1", id="spans-first"),
        pytest.param(False, advisory(TWO_SPANS), "demo", "2.0", id="spans-between"),
        pytest.param(True, advisory(TWO_SPANS), "demo", "3.2.4", id="spans-second"),
        pytest.param(False, advisory(TWO_SPANS), "demo", "3.2.5", id="spans-second-fixed"),
        pytest.param(
            True,
            advisory([{"introduced": "1.0"}, {"fixed": "1.2"}], [{"introduced": "3.0"}]),
            "demo",
            "3.1",
            id="several-ranges-any-one",
        ),
        pytest.param(
            True,
            advisory([{"fixed": "3.2.5"}, {"introduced": "3.0"}]),
            "demo",
            "3.1",
            id="events-unsorted",
        ),
        pytest.param(True, advisory(FIXED_2), "demo", "2.0.0rc1", id="pre-release-of-fix"),
        pytest.param(True, advisory(FIXED_2), "demo", "2.0.0.dev3", id="dev-release-of-fix"),
        pytest.param(
            False,
            advisory([{"introduced": "2.0"}, {"fixed": "2.1"}]),
            "demo",
            "2.0rc1",
            id="pre-release-before-introduced",
        ),
        pytest.param(
            True,
            advisory([{"introduced": "2.0rc1"}, {"fixed": "2.1"}]),
            "demo",
            "2.0rc2",
            id="pre-release-introduced",
        ),
        pytest.param(True, advisory(FIXED_2), "demo", "0.0.0a1", id="introduced-0-pre-release"),
        pytest.param(
            True,
            advisory([{"introduced": "1.0"}, {"limit": "1.5"}]),
            "demo",
            "1.4",
            id="below-limit",
        ),
        pytest.param(
            False,
            advisory([{"introduced": "1.0"}, {"limit": "1.5"}]),
            "demo",
            "1.5",
            id="at-limit",
        ),
        pytest.param(
            True,
            advisory([{"introduced": "1.0"}, {"limit": "*"}]),
            "demo",
            "9.9",
            id="limit-star",
        ),
        pytest.param(True, advisory(versions=("1.0", "1.1")), "demo", "1.1", id="listed"),
        pytest.param(True, advisory(versions=("1.0",)), "demo", "1.0.0", id="listed-pep440"),
        pytest.param(False, advisory(versions=("1.0", "1.1")), "demo", "1.2", id="not-listed"),
        pytest.param(
            True,
            advisory(FIXED_2, versions=("5.0",)),
            "demo",
            "5.0",
            id="listed-outside-range",
        ),
        pytest.param(
            True,
            advisory(FIXED_2, name="Zope.Interface"),
            "zope-interface",
            "1.0",
            id="name-normalized-dots",
        ),
        pytest.param(
            True, advisory(FIXED_2, name="PyYAML"), "pyyaml", "1.0", id="name-normalized-case"
        ),
        pytest.param(
            True,
            advisory(FIXED_2, name="typing_extensions"),
            "Typing.Extensions",
            "1.0",
            id="pin-name-normalized",
        ),
        pytest.param(False, advisory(FIXED_2, name="other"), "demo", "1.0", id="other-package"),
        pytest.param(
            False,
            advisory(FIXED_2, withdrawn="2026-02-01T00:00:00Z"),
            "demo",
            "1.0",
            id="withdrawn",
        ),
        pytest.param(False, advisory(FIXED_2, ecosystem="npm"), "demo", "1.0", id="npm-ignored"),
        pytest.param(
            False,
            advisory(FIXED_2, versions=("1.0",), ecosystem="crates.io"),
            "demo",
            "1.0",
            id="other-ecosystem-versions-ignored",
        ),
        pytest.param(
            False, advisory(FIXED_2, range_type="SEMVER"), "demo", "1.0", id="semver-ignored"
        ),
        pytest.param(False, advisory(FIXED_2, range_type="GIT"), "demo", "1.0", id="git-ignored"),
    ],
)
def test_an_advisory_affects_a_pin(
    expected: bool, record: dict[str, Any], name: str, version: str
) -> None:
    assert expected == audit.affects(record, name, version)


@pytest.mark.parametrize(
    ("expected", "events"),
    [
        pytest.param(True, [{"introduced": "0"}, {"fixed": "1.10"}], id="1.9-below-1.10"),
        pytest.param(False, [{"introduced": "0"}, {"fixed": "1.9"}], id="1.9-is-fixed"),
        pytest.param(False, [], id="no-events"),
    ],
)
def test_in_range_orders_as_pep440(expected: bool, events: list[dict[str, str]]) -> None:
    assert expected == audit.in_range(Version("1.9"), events)


def test_a_bound_that_is_not_pep440_cannot_be_evaluated() -> None:
    with pytest.raises(audit.Unevaluable, match="not a PEP 440 version"):
        audit.affects(advisory([{"introduced": "0"}, {"fixed": "next-release"}]), "demo", "1.0")


@pytest.mark.parametrize(
    ("expected", "record"),
    [
        pytest.param(["2.0.0"], advisory(FIXED_2), id="one"),
        pytest.param(["1.2", "3.2.5"], advisory(TWO_SPANS), id="each-span"),
        pytest.param(
            ["1.10", "2.0.0"],
            advisory(FIXED_2, [{"introduced": "1.0"}, {"fixed": "1.10"}]),
            id="version-order",
        ),
        pytest.param([], advisory(LAST_2), id="last-affected-fixes-nothing"),
        pytest.param([], advisory(FIXED_2, range_type="GIT"), id="git-not-a-version"),
    ],
)
def test_fixed_versions(expected: list[str], record: dict[str, Any]) -> None:
    assert expected == audit.fixed_versions(record, "demo")


@pytest.mark.parametrize(
    ("expected", "text"),
    [
        pytest.param([("flask", "3.1.0")], "flask==3.1.0 \\\n    --hash=sha256:aa\n", id="hashed"),
        pytest.param([("pyyaml", "6.0.2")], "PyYAML==6.0.2\n", id="normalized"),
        pytest.param([("gunicorn", "23.0")], "gunicorn[gevent]==23.0\n", id="extras"),
        pytest.param([("a", "1")], "a==1 ; python_version < '4'\n", id="marker"),
        pytest.param([("a", "1")], "# a comment\n    # via b\na==1\n", id="comments"),
    ],
)
def test_read_pins(expected: list[tuple[str, str]], text: str, tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text(text)

    assert expected == [(p.name, p.version) for p in audit.read_pins([lock])]


def test_a_pin_in_both_locks_is_checked_once(tmp_path: Path) -> None:
    (tmp_path / "a.lock").write_text("flask==3.1.0\nrich==1.0\n")
    (tmp_path / "b.lock").write_text("Flask==3.1.0\n")

    pins = audit.read_pins([tmp_path / "a.lock", tmp_path / "b.lock"])

    assert [("flask", ("a.lock", "b.lock")), ("rich", ("a.lock",))] == [
        (p.name, p.locks) for p in pins
    ]


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


DEMO_YAML = """\
id: PYSEC-2026-1
modified: '2026-03-01T00:00:00Z'
aliases: [CVE-2026-0001, GHSA-aaaa-bbbb-cccc]
affected:
- package: {name: Demo_Pkg, ecosystem: PyPI}
  ranges:
  - type: ECOSYSTEM
    events:
    - introduced: 0
    - fixed: 1.10
"""

WITHDRAWN_YAML = """\
id: PYSEC-2026-2
modified: '2026-04-01T00:00:00Z'
withdrawn: '2026-04-01T00:00:00Z'
affected:
- package: {name: demo-pkg, ecosystem: PyPI}
  ranges:
  - type: ECOSYSTEM
    events: [{introduced: '0'}]
"""

GHSA_JSON = {
    "id": "GHSA-xxxx-yyyy-zzzz",
    "modified": "2026-05-01T00:00:00Z",
    "aliases": ["CVE-2026-0002"],
    "affected": [
        {"package": {"ecosystem": "npm", "name": "demo-pkg"}, "versions": ["1.9"]},
        {
            "package": {"ecosystem": "PyPI", "name": "demo.pkg"},
            "ranges": [{"type": "ECOSYSTEM", "events": [{"introduced": "1.0"}, {"fixed": "2.0"}]}],
        },
    ],
}


def osv_tree(root: Path) -> Path:
    """A database of PyPA's layout (YAML, unquoted versions that YAML would take for
    numbers) and GitHub's (JSON), with a withdrawn advisory and files that are no advisory."""
    _write(root, "vulns/demo-pkg/PYSEC-2026-1.yaml", DEMO_YAML)
    _write(root, "vulns/demo-pkg/PYSEC-2026-2.yaml", WITHDRAWN_YAML)
    _write(root, "advisories/github-reviewed/2026/05/x/x.json", json.dumps(GHSA_JSON))
    _write(root, "triage/false_positives.yaml", "- PyPI: [x]\n")
    _write(root, ".github/workflows/a.yaml", "on: push  # PyPI\n")
    _write(root, "README.md", "PyPI advisories\n")
    return root


def test_the_database_reads_each_pypi_advisory(tmp_path: Path) -> None:
    db = audit.load_database(osv_tree(tmp_path))

    assert (3, 1, "2026-05-01T00:00:00Z") == (db.advisories, db.withdrawn, db.newest_modified)
    assert ["GHSA-xxxx-yyyy-zzzz", "PYSEC-2026-1"] == sorted(
        a["id"] for a in db.by_package["demo-pkg"]
    )


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str], list[str]]:
    code = audit.main(argv)
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_a_finding_is_a_line_and_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = osv_tree(tmp_path / "db")
    (tmp_path / "a.lock").write_text("demo-pkg==1.9 \\\n    --hash=sha256:aa\nother==1.0\n")

    code, out, err = run(["--db", str(db), str(tmp_path / "a.lock")], capsys)

    assert (1, []) == (code, err)
    assert f"2 pins ({tmp_path / 'a.lock'}: 2); 2 advisories name a pinned package" == out[0]
    assert out[1].startswith("Found 2 known vulnerabilities in 1 package (advisory database ")
    assert [
        ["Name", "Version", "ID", "Aliases", "Fix", "Versions"],
        ["demo-pkg", "1.9", "GHSA-xxxx-yyyy-zzzz", "CVE-2026-0002", "2.0"],
        ["demo-pkg", "1.9", "PYSEC-2026-1", "CVE-2026-0001,GHSA-aaaa-bbbb-cccc", "1.10"],
    ] == [line.split() for line in out[2:3] + out[4:]]


def test_none_found_names_the_database_commit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = osv_tree(tmp_path / "db")
    git = ["git", "-C", str(db), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "advisories"], check=True)
    head = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    (tmp_path / "a.lock").write_text("demo-pkg==2.0\n")

    code, out, err = run(["--db", str(db), str(tmp_path / "a.lock")], capsys)

    assert (0, [], 2) == (code, err, len(out))
    assert out[1].startswith(f"No known vulnerabilities found (advisory database {db}: ")
    assert f"commit {head} of " in out[1]
    assert "3 PyPI advisories (1 withdrawn, skipped)" in out[1]


def test_without_git_the_newest_advisory_dates_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = osv_tree(tmp_path / "db")
    (tmp_path / "a.lock").write_text("demo-pkg==2.0\n")

    code, out, _ = run(["--db", str(db), str(tmp_path / "a.lock")], capsys)

    assert 0 == code
    assert "not a git checkout" in out[1]
    assert out[1].endswith("the newest modified 2026-05-01T00:00:00Z)")


@pytest.mark.parametrize(
    ("expected", "db", "lock"),
    [
        pytest.param("no such directory", "missing", "a.lock", id="database-missing"),
        pytest.param("holds no OSV advisory for the PyPI", "notosv", "a.lock", id="not-osv"),
        pytest.param("holds no OSV advisory for the PyPI", "npmonly", "a.lock", id="npm-only"),
        pytest.param("cannot read the lock", "db", "missing.lock", id="lock-missing"),
        pytest.param("pins no package", "db", "empty.lock", id="lock-empty"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    expected: str, db: str, lock: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    osv_tree(tmp_path / "db")
    _write(tmp_path, "notosv/vulns/x.yaml", "name: PyPI\nversions: [1]\n")
    _write(tmp_path, "npmonly/a.json", json.dumps({**GHSA_JSON, "affected": []}))
    (tmp_path / "a.lock").write_text("demo-pkg==2.0\n")
    (tmp_path / "empty.lock").write_text("# nothing\n")

    code, _, err = run(["--db", str(tmp_path / db), str(tmp_path / lock)], capsys)

    assert (2, 1) == (code, len(err))
    assert err[0].startswith("audit: ") and expected in err[0]


#: pip-audit's JSON where PyPI's vulnerability service does not answer (as recorded with
#: pip-audit 2.10 against a package mirror): every pin skipped.
NOT_AUDITED = {
    "dependencies": [
        {
            "name": "flask",
            "skip_reason": "Dependency not found on PyPI and could not be audited: flask (3.1.0)",
        },
        {
            "name": "rich",
            "skip_reason": "Dependency not found on PyPI and could not be audited: rich (1.0)",
        },
    ],
    "fixes": [],
}
AUDITED = {
    "dependencies": [
        {"name": "flask", "version": "3.1.0", "vulns": []},
        {
            "name": "rich",
            "version": "1.0",
            "vulns": [{"id": "PYSEC-1", "fix_versions": ["1.1"], "aliases": ["CVE-1"]}],
        },
    ],
    "fixes": [],
}
CLEAN = {"dependencies": [AUDITED["dependencies"][0]]}
PARTLY = {"dependencies": [AUDITED["dependencies"][0], NOT_AUDITED["dependencies"][1]]}


@pytest.mark.parametrize(
    ("expected_code", "expected_text", "doc", "fallback"),
    [
        pytest.param(2, "audit: pip-audit audited none of 2 pins (", NOT_AUDITED, None, id="none"),
        pytest.param(
            2,
            "and no advisory database at {tmp}/missing, give one: `make audit ADVISORY_DB=DIR`",
            NOT_AUDITED,
            "missing",
            id="none-fallback-missing",
        ),
        pytest.param(
            1,
            "could not be audited: flask (3.1.0)); the advisory database {tmp}/db instead",
            NOT_AUDITED,
            "db",
            id="none-fallback",
        ),
        pytest.param(1, "demo-pkg 1.9     PYSEC-2026-1", NOT_AUDITED, "db", id="fallback-finds"),
        pytest.param(1, "audited none of 0 pins (boom); the advisory", None, "db", id="no-answer"),
        pytest.param(1, "rich 1.0     PYSEC-1 CVE-1   1.1", AUDITED, "db", id="finding"),
        pytest.param(
            1, "could not be audited: rich: Dependency not found", PARTLY, "db", id="part"
        ),
        pytest.param(0, "No known vulnerabilities found (pip-audit, 1 pins)", CLEAN, "db", id="ok"),
    ],
)
def test_pip_audit_first(
    expected_code: int,
    expected_text: str,
    doc: dict[str, Any] | None,
    fallback: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    osv_tree(tmp_path / "db")
    (tmp_path / "a.lock").write_text("demo-pkg==1.9\n")
    monkeypatch.setattr(audit, "_pip_audit_json", lambda locks: (doc, "boom"))
    argv = [str(tmp_path / "a.lock")]
    if fallback is not None:
        argv = ["--fallback-db", str(tmp_path / fallback), *argv]

    code, out, err = run(argv, capsys)

    assert expected_code == code
    expected = expected_text.format(tmp=tmp_path)
    assert any(expected in line for line in out + err), out + err
