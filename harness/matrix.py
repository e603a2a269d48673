"""``make matrix``: the end-to-end tests that matter most, against the Kubernetes versions our
users run.

For each version (default: v1.33.13, v1.34.4, v1.35.4, v1.36.3), one after the other:

1. its control plane and hollow kubelet are built, or taken from the cache, by
   ``scripts/build-control-plane.sh`` with ``RPW_KUBE_VERSION`` set and no fallback to
   another version, under ``nice`` (a cold build takes a quarter of an hour on two cores);
2. the walkthrough, infeasible, dry-run, PDB and reconciler tests and the hollow kubelet's
   own tests (:data:`SELECTION`) run with ``RPW_ASSETS`` pointing at that version's binaries;
3. what the version offers that the tests depend on is read from the binaries (the kubelet's
   version, the ``PodResizeValidator`` admission plugin, the in-place resize gate).

Progress goes to stderr; the table (markdown) to stdout; every outcome, with the failure
messages, to ``--json`` (default ``bench/results/matrix.json``). The exit status is 0 when
every version built and every selected test passed or was skipped for a stated reason.

    .venv/bin/python -m harness.matrix [--versions v1.36.3,v1.35.4] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.binaries import BUILD_SCRIPT, REPO_ROOT, Binaries

VERSIONS = ("v1.33.13", "v1.34.4", "v1.35.4", "v1.36.3")
TEST_FILES = (
    "tests/e2e/test_service.py",
    "tests/e2e/test_reconciler.py",
    "tests/e2e/test_hollow_kubelet.py",
)
# Of test_service.py: the walkthrough, the infeasible resizes (warned, denied, reduced, and
# one beyond the node, which the API server or the kubelet refuses by version), the dry runs
# and the PodDisruptionBudget cases; the other two files whole.
SELECTION = (
    "test_reconciler or test_hollow_kubelet"
    " or walkthrough or infeasible or beyond_the_node or only_told_about_preemption or pdb"
)
BUILD_TIMEOUT = 3 * 3600.0
TEST_TIMEOUT = 45 * 60.0


def log(message: str) -> None:
    print(f"[matrix] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


@dataclass
class CaseOutcome:
    name: str
    outcome: str  # passed, failed, error, skipped
    seconds: float
    message: str = ""


@dataclass
class VersionResult:
    version: str
    built: bool = False
    build_seconds: float = 0.0
    build_log: str = ""
    binaries: str = ""
    kubelet_version: str = ""
    pod_resize_validator: bool = False
    in_place_resize_gate: str = ""
    test_seconds: float = 0.0
    tests: list[CaseOutcome] = field(default_factory=list)
    error: str = ""

    def count(self, outcome: str) -> int:
        return sum(1 for t in self.tests if t.outcome == outcome)

    @property
    def green(self) -> bool:
        return (
            self.built
            and not self.error
            and bool(self.tests)
            and all(t.outcome in ("passed", "skipped") for t in self.tests)
        )


def build(version: str, log_dir: Path) -> tuple[Path | None, float, Path]:
    """Build (or find in the cache) the binaries of exactly ``version``."""
    build_log = log_dir / f"build-{version}.log"
    env = {**os.environ, "RPW_KUBE_VERSION": version, "RPW_KUBE_NO_FALLBACK": "1"}
    env.pop("RPW_ASSETS", None)
    env.pop("KUBEBUILDER_ASSETS", None)
    began = time.monotonic()
    with build_log.open("w") as err:
        result = subprocess.run(
            ["nice", "-n", "15", "bash", str(BUILD_SCRIPT)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
    seconds = time.monotonic() - began
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        return None, seconds, build_log
    return Path(lines[-1]), seconds, build_log


def read_facts(result: VersionResult, binaries: Binaries) -> None:
    result.kubelet_version = subprocess.run(
        [str(binaries.rpw_node), "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    result.pod_resize_validator = "PodResizeValidator" in binaries.admission_plugins
    help_text = subprocess.run(
        [str(binaries.kube_apiserver), "--help"], capture_output=True, text=True, check=False
    ).stdout
    match = re.search(r"InPlacePodVerticalScaling=true\|false \(([^)]*)\)", help_text)
    # Gone from the help once GA: locked on.
    result.in_place_resize_gate = match.group(1) if match else "GA"


def run_tests(result: VersionResult, directory: Path, log_dir: Path) -> None:
    junit = log_dir / f"junit-{result.version}.xml"
    output = log_dir / f"pytest-{result.version}.log"
    env = {**os.environ, "RPW_ASSETS": str(directory)}
    argv = [
        sys.executable,
        "-m",
        "pytest",
        *TEST_FILES,
        "-k",
        SELECTION,
        "-q",
        "-rfEs",
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        f"--basetemp={log_dir / ('tmp-' + result.version)}",
    ]
    began = time.monotonic()
    with output.open("w") as out:
        try:
            subprocess.run(
                argv,
                cwd=REPO_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=TEST_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired:
            result.error = f"tests did not finish within {TEST_TIMEOUT:.0f} s (see {output})"
    result.test_seconds = time.monotonic() - began
    if junit.exists():
        result.tests = parse_junit(junit.read_text())
    elif not result.error:
        result.error = f"pytest wrote no report (see {output})"


def parse_junit(text: str) -> list[CaseOutcome]:
    """One outcome per test case of a pytest junit XML report."""
    outcomes = []
    for case in ET.fromstring(text).iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        name = f"{module}::{case.get('name', '')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            element = case.find(tag)
            if element is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (element.get("message") or element.text or "").strip()
                break
        outcomes.append(CaseOutcome(name, outcome, float(case.get("time", 0)), message[:2000]))
    return outcomes


def run_version(version: str, log_dir: Path) -> VersionResult:
    result = VersionResult(version)
    log(f"{version}: building (or reusing) its binaries; log {log_dir / f'build-{version}.log'}")
    try:
        directory, result.build_seconds, build_log = build(version, log_dir)
    except subprocess.TimeoutExpired:
        result.error = f"build did not finish within {BUILD_TIMEOUT:.0f} s"
        return result
    result.build_log = str(build_log)
    if directory is None:
        tail = build_log.read_text().strip().splitlines()[-5:]
        result.error = "build failed: " + " | ".join(tail)
        log(f"{version}: build failed after {result.build_seconds:.0f} s")
        return result
    result.built = True
    result.binaries = str(directory)
    binaries = Binaries(directory)
    read_facts(result, binaries)
    log(
        f"{version}: binaries ready in {result.build_seconds:.0f} s ({directory}); "
        f"kubelet {result.kubelet_version!r}, PodResizeValidator "
        f"{'on' if result.pod_resize_validator else 'absent'}; running the tests"
    )
    run_tests(result, directory, log_dir)
    log(
        f"{version}: {result.count('passed')} passed, {result.count('failed')} failed, "
        f"{result.count('error')} errors, {result.count('skipped')} skipped "
        f"in {result.test_seconds:.0f} s{'; ' + result.error if result.error else ''}"
    )
    return result


def table(results: Sequence[VersionResult]) -> str:
    """The results as markdown: one row per version, then what did not pass."""
    lines = [
        "| version | build | kubelet | PodResizeValidator | InPlacePodVerticalScaling "
        "| passed | failed | skipped | tests took |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        build_cell = f"{r.build_seconds:.0f} s" if r.built else "failed"
        failed = r.count("failed") + r.count("error")
        lines.append(
            f"| {r.version} | {build_cell} | {r.kubelet_version.removeprefix('Kubernetes ')} "
            f"| {'on' if r.pod_resize_validator else 'absent'} | {r.in_place_resize_gate} "
            f"| {r.count('passed')} | {failed} | {r.count('skipped')} | {r.test_seconds:.0f} s |"
        )
    notes = []
    for r in results:
        if r.error:
            notes.append(f"* {r.version}: {r.error}")
        for t in r.tests:
            if t.outcome != "passed":
                first = t.message.splitlines()[0] if t.message else ""
                notes.append(f"* {r.version} {t.outcome}: `{t.name}`: {first[:300]}")
    return "\n".join(lines + (["", *notes] if notes else []))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.matrix", description=__doc__)
    parser.add_argument(
        "--versions",
        type=lambda text: [v.strip() for v in text.split(",") if v.strip()],
        default=list(VERSIONS),
        help="comma-separated Kubernetes versions (default: %(default)s)",
    )
    parser.add_argument(
        "--json", type=Path, default=REPO_ROOT / "bench" / "results" / "matrix.json"
    )
    parser.add_argument(
        "--log-dir", type=Path, default=REPO_ROOT / ".matrix", help="build logs, pytest output"
    )
    args = parser.parse_args(argv)
    for version in args.versions:
        if not re.fullmatch(r"v1\.\d+\.\d+", version):
            parser.error(f"not a Kubernetes version: {version!r} (like v1.36.3)")
    args.log_dir.mkdir(parents=True, exist_ok=True)
    # A run of some versions replaces their rows and keeps the others' (one version at a time
    # fits better between other work than all four at once).
    kept = {r.version: r for r in load(args.json) if r.version not in args.versions}
    results: list[VersionResult] = []
    merged = sorted(kept.values(), key=lambda r: version_key(r.version))
    for version in args.versions:
        results.append(run_version(version, args.log_dir))
        merged = sorted([*kept.values(), *results], key=lambda r: version_key(r.version))
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in merged], indent=2) + "\n")
    print(table(merged))
    return 0 if all(r.green for r in results) else 1


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.lstrip("v").split("."))


def load(path: Path) -> list[VersionResult]:
    """The results a former run wrote to ``path`` (none when there is no such file)."""
    if not path.exists():
        return []
    results = []
    for raw in json.loads(path.read_text()):
        tests = [CaseOutcome(**t) for t in raw.pop("tests", [])]
        results.append(VersionResult(**raw, tests=tests))
    return results


if __name__ == "__main__":
    sys.exit(main())
