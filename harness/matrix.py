"""``make matrix``: the end-to-end suite against the Kubernetes versions our users run.

For each entry (default: v1.33.13, v1.34.4, v1.35.4, v1.36.3, ``v1.37.2-gate-off``, the
v1.37.2 binaries with the scheduler's ``InPlacePodVerticalScalingSchedulerPreemption``
held off as on a managed v1.37 cluster, and ``v1.33.13-realnode``, the real-node round on
the oldest kubelet supported), one after the other:

1. its control plane and hollow kubelet are built, or taken from the cache, by
   ``scripts/build-control-plane.sh`` with ``RPW_KUBE_VERSION`` set and no fallback to
   another version, under ``nice`` (a cold build takes a quarter of an hour on two cores);
   a ``-realnode`` entry also builds what ``make node`` does, the real node's stack with
   that version's kubelet;
2. every module of ``tests/e2e`` runs (``--modules`` chooses fewer) with ``RPW_ASSETS``
   pointing at that version's binaries, less the tests of the real node and of the product
   image (:data:`LEFT_OUT`), the tests marked ``solo`` after the others, alone.
   A test a version cannot run skips itself with a reason naming the version
   (``needs_kube``/``needs_gate`` marks, tests/e2e/conftest.py). A ``-realnode`` entry
   runs instead the real-node round (:data:`REAL_NODE_ROUND`): the walkthrough, lending and
   checkpoints on that version's kubelet, containerd, runc and CRIU;
3. what the version offers that the tests depend on is read from the binaries (the kubelet's
   version, the ``PodResizeValidator`` admission plugin, the in-place resize gate).

Each entry's result records the commit tested, the date, the machine's load while the
tests ran, every test's outcome (with the failure message or the skip's reason) and the
wall time. Progress goes to stderr; the table (markdown) to stdout and, with ``--docs``,
into docs/control-plane.md between its ``matrix-table`` markers; every outcome to
``--json`` (default ``bench/results/matrix.json``); pytest's temporary directories (the
clusters' logs) to ``$TMPDIR/rpw-matrix-<entry>``. The exit status is 0 when every entry
built and every test passed or was skipped for a stated reason.

    .venv/bin/python -m harness.matrix [--versions v1.36.3,v1.37.2-gate-off] [--json FILE]
        [--modules test_service.py,test_lending.py] [-k EXPRESSION] [--docs]
    .venv/bin/python -m harness.matrix --docs-only   # the docs' table from --json, no run
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.binaries import BUILD_SCRIPT, REPO_ROOT, Binaries

GATE = "InPlacePodVerticalScalingSchedulerPreemption"
GATE_OFF = "-gate-off"
REAL_NODE = "-realnode"
OLDEST = "v1.33.13"
VERSIONS = ("v1.33.13", "v1.34.4", "v1.35.4", "v1.36.3", "v1.37.2" + GATE_OFF, OLDEST + REAL_NODE)
#: An entry's suffix, in the order its rows follow the version's own.
SUFFIXES = ("", GATE_OFF, REAL_NODE)
E2E = REPO_ROOT / "tests" / "e2e"
DOCS = REPO_ROOT / "docs" / "control-plane.md"
RESULTS = REPO_ROOT / "bench" / "results" / "matrix.json"
BEGIN = "<!-- matrix-table: python -m harness.matrix --docs-only writes it from the json -->"
END = "<!-- end of matrix-table -->"
#: What the real node runs besides the control plane: its stack, CRIU, its images.
NODE_BUILDS = tuple(
    REPO_ROOT / "scripts" / name for name in ("build-node.sh", "build-criu.sh", "build-images.sh")
)
BUILD_TIMEOUT = 3 * 3600.0
TEST_TIMEOUT = 2 * 3600.0
LOAD_EVERY = 30.0


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
    #: The entry: a version, or a version with ``-gate-off``.
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
    #: ``git describe``-like: the commit tested, ``+dirty`` when the tree had changes.
    commit: str = ""
    #: UTC, when the tests started.
    date: str = ""
    #: The 1-minute load average when the tests started, and its mean and maximum while
    #: they ran (sampled every LOAD_EVERY seconds).
    load: list[float] = field(default_factory=list)
    #: The modules run (file names); empty: every module of tests/e2e.
    modules: list[str] = field(default_factory=list)
    #: pytest's ``-k`` expression, if any.
    selection: str = ""
    #: pytest-xdist workers the tests ran in (0: one process), each with its own clusters.
    workers: int = 0

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


def kube_version_of(entry: str) -> str:
    """The Kubernetes version an entry runs: ``v1.37.2-gate-off`` runs v1.37.2."""
    return entry.removesuffix(GATE_OFF).removesuffix(REAL_NODE)


def pinned(version: str) -> dict[str, str]:
    """The environment that builds (and, on the real node, runs) exactly ``version``."""
    return {"RPW_KUBE_VERSION": version, "RPW_KUBE_NO_FALLBACK": "1"}


def entry_env(entry: str) -> dict[str, str]:
    """What the entry sets for the tests beyond ``RPW_ASSETS``: the gate it holds off, or
    the real node's kubelet version (the node stack is built for ``RPW_KUBE_VERSION``)."""
    if entry.endswith(GATE_OFF):
        return {"RPW_FEATURE_GATES_OFF": GATE}
    if entry.endswith(REAL_NODE):
        return pinned(kube_version_of(entry))
    return {}


def build_scripts(entry: str) -> list[Path]:
    """What an entry builds, in order; the control plane's directory is the first's output."""
    return [BUILD_SCRIPT, *NODE_BUILDS] if entry.endswith(REAL_NODE) else [BUILD_SCRIPT]


def build(entry: str, log_dir: Path) -> tuple[Path | None, float, Path]:
    """Build (or find in the cache) what ``entry`` runs, of exactly its version: the
    control plane's directory (None if a build failed), the seconds taken, the log."""
    build_log = log_dir / f"build-{entry}.log"
    env = {**os.environ, **pinned(kube_version_of(entry))}
    env.pop("RPW_ASSETS", None)
    env.pop("KUBEBUILDER_ASSETS", None)
    began = time.monotonic()
    outputs = []
    with build_log.open("w") as err:
        for script in build_scripts(entry):
            result = subprocess.run(
                ["nice", "-n", "15", "bash", str(script)],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env,
                timeout=BUILD_TIMEOUT,
                check=False,
            )
            lines = result.stdout.strip().splitlines()
            if result.returncode != 0 or not lines:
                return None, time.monotonic() - began, build_log
            outputs.append(Path(lines[-1]))
    return outputs[0], time.monotonic() - began, build_log


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


def commit_tested(root: Path = REPO_ROOT, own: Sequence[Path] = (RESULTS, DOCS)) -> str:
    """HEAD, with ``+dirty`` when a tracked file differs from it. The matrix's own outputs
    (``own``: the result file and the docs' table, written after each entry) do not count:
    an entry after the first would otherwise always say dirty."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=False
        ).stdout.strip()

    commit = git("rev-parse", "--short=7", "HEAD")
    excluded = [f":(exclude){path.relative_to(root)}" for path in own]
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", *excluded)
    return commit + ("+dirty" if changed else "")


class LoadSampler:
    """The 1-minute load average at start, then every ``every`` seconds until stopped."""

    def __init__(self, every: float = LOAD_EVERY) -> None:
        self.samples = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(every,), daemon=True)
        self._thread.start()

    def _run(self, every: float) -> None:
        while not self._stop.wait(every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> list[float]:
        """[at start, mean, maximum], two decimals."""
        self._stop.set()
        self._thread.join()
        s = self.samples
        return [round(s[0], 2), round(sum(s) / len(s), 2), round(max(s), 2)]


#: What a hollow-node entry leaves out: the real node's tests (a ``-realnode`` entry runs
#: them) and the product image's (``image_store``: the image, its platforms and its SBOM
#: are the same whatever cluster runs them).
LEFT_OUT = "not realnode and not image_store"
#: The passes of an entry's tests, as ``make test`` runs them: (marks, in the workers) the
#: parallel pass, then the tests marked ``solo`` (floods and slow clients, which measure
#: what the service takes against its saturation on this machine) alone.
PASSES = ((f"{LEFT_OUT} and not solo", True), (f"{LEFT_OUT} and solo", False))
#: The real-node round of a ``-realnode`` entry (whatever ``--modules`` and ``-k`` say):
#: the CPU quota a resize writes, the walkthrough with the victim's grace period, lending,
#: a checkpoint restored with its memory, and a paused victim back when room returns. One
#: process: the node is the machine's own.
REAL_NODE_ROUND = (
    ("test_realnode.py", "test_realnode_checkpoint.py", "test_realnode_pause.py"),
    "cpu_quota or walkthrough or lenders_memory or restored_with_its_memory"
    " or comes_back_with_its_memory",
)
REAL_NODE_PASSES = (("realnode", False),)


def passes(entry: str) -> tuple[tuple[str, bool], ...]:
    """The (marks, parallel) passes an entry's tests run in."""
    return REAL_NODE_PASSES if entry.endswith(REAL_NODE) else PASSES


def pytest_argv(
    result: VersionResult, junit: Path, marks: str = PASSES[0][0], parallel: bool = True
) -> list[str]:
    paths = [str(E2E / m) for m in result.modules] or [str(E2E)]
    argv = [sys.executable, "-m", "pytest", *paths, "-m", marks, "-q", "-rfEs"]
    if result.selection:
        argv += ["-k", result.selection]
    if result.workers and parallel:
        argv += ["-n", str(result.workers), "--dist", "loadgroup"]
    return [
        *argv,
        "-p",
        "no:cacheprovider",
        f"--junitxml={junit}",
        # Short: the kubelet's unix sockets live under it (108 bytes at most).
        f"--basetemp={Path(tempfile.gettempdir()) / ('rpw-matrix-' + result.version)}",
    ]


def run_tests(result: VersionResult, directory: Path, log_dir: Path) -> None:
    """The entry's tests, in :data:`PASSES`; their outcomes together in ``result``."""
    output = log_dir / f"pytest-{result.version}.log"
    env = {**os.environ, "RPW_ASSETS": str(directory), **entry_env(result.version)}
    result.commit = commit_tested()
    result.date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    sampler = LoadSampler()
    began = time.monotonic()
    reports: list[Path] = []
    with output.open("w") as out:
        for number, (marks, parallel) in enumerate(passes(result.version)):
            junit = log_dir / f"junit-{result.version}-{number}.xml"
            junit.unlink(missing_ok=True)
            reports.append(junit)
            try:
                subprocess.run(
                    pytest_argv(result, junit, marks, parallel),
                    cwd=REPO_ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=TEST_TIMEOUT,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                result.error = f"tests did not finish within {TEST_TIMEOUT:.0f} s (see {output})"
                break
    result.test_seconds = time.monotonic() - began
    result.load = sampler.stop()
    written = [r for r in reports if r.exists()]
    result.tests = [case for r in written for case in parse_junit(r.read_text())]
    if len(written) < len(reports) and not result.error:
        result.error = f"pytest wrote no report (see {output})"


def without_group(name: str) -> str:
    """A test's name without the ``@group`` pytest-xdist's ``--dist loadgroup`` appends (an
    ``@`` inside the parameters' brackets is the test's own)."""
    at = name.rfind("@")
    return name[:at] if at > name.rfind("]") else name


def parse_junit(text: str) -> list[CaseOutcome]:
    """One outcome per test case of a pytest junit XML report."""
    outcomes = []
    for case in ET.fromstring(text).iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        name = f"{module}::{without_group(case.get('name', ''))}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            element = case.find(tag)
            if element is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (element.get("message") or element.text or "").strip()
                break
        outcomes.append(CaseOutcome(name, outcome, float(case.get("time", 0)), message[:2000]))
    return outcomes


def run_version(
    entry: str, log_dir: Path, modules: Sequence[str] = (), selection: str = "", workers: int = 0
) -> VersionResult:
    if entry.endswith(REAL_NODE):
        modules, selection = REAL_NODE_ROUND
    result = VersionResult(entry, modules=list(modules), selection=selection, workers=workers)
    log(f"{entry}: building (or reusing) its binaries; log {log_dir / f'build-{entry}.log'}")
    try:
        directory, result.build_seconds, build_log = build(entry, log_dir)
    except subprocess.TimeoutExpired:
        result.error = f"build did not finish within {BUILD_TIMEOUT:.0f} s"
        return result
    result.build_log = str(build_log)
    if directory is None:
        tail = build_log.read_text().strip().splitlines()[-5:]
        result.error = "build failed: " + " | ".join(tail)
        log(f"{entry}: build failed after {result.build_seconds:.0f} s")
        return result
    result.built = True
    result.binaries = str(directory)
    read_facts(result, Binaries(directory))
    log(
        f"{entry}: binaries ready in {result.build_seconds:.0f} s ({directory}); "
        f"kubelet {result.kubelet_version!r}, PodResizeValidator "
        f"{'on' if result.pod_resize_validator else 'absent'}; running the tests"
    )
    run_tests(result, directory, log_dir)
    log(
        f"{entry}: {result.count('passed')} passed, {result.count('failed')} failed, "
        f"{result.count('error')} errors, {result.count('skipped')} skipped "
        f"in {result.test_seconds:.0f} s{'; ' + result.error if result.error else ''}"
    )
    return result


def row(r: VersionResult) -> str:
    """One entry's line of :func:`table`."""
    modules = f"{len(r.modules)} modules" if r.modules else "all"
    if r.selection:
        modules += f", `-k {r.selection}`"
    load = " / ".join(f"{x:.1f}" for x in r.load) if r.load else ""
    return (
        f"| {r.version} | {r.kubelet_version.removeprefix('Kubernetes ')} "
        f"| {'on' if r.pod_resize_validator else 'absent'} | {r.in_place_resize_gate} "
        f"| {r.commit} | {r.date} | {load} | {modules} | {r.count('passed')} "
        f"| {r.count('failed') + r.count('error')} | {r.count('skipped')} "
        f"| {r.test_seconds:.0f} s |"
    )


def notes(r: VersionResult) -> list[str]:
    """What did not pass: each failure with its first line, skips grouped by reason."""
    lines = [f"* {r.version}: {r.error}"] if r.error else []
    skipped: dict[str, list[str]] = defaultdict(list)
    for t in r.tests:
        first = t.message.splitlines()[0][:300] if t.message else ""
        if t.outcome == "skipped":
            skipped[first].append(t.name)
        elif t.outcome != "passed":
            lines.append(f"* {r.version} {t.outcome}: `{t.name}`: {first}")
    for reason, names in skipped.items():
        lines.append(f"* {r.version} skipped {len(names)} ({', '.join(sorted(names)[:3])}"
                     f"{', ...' if len(names) > 3 else ''}): {reason}")  # fmt: skip
    return lines


def table(results: Sequence[VersionResult]) -> str:
    """The results as markdown: one row per entry, then what did not pass."""
    lines = [
        "| version | kubelet | PodResizeValidator | InPlacePodVerticalScaling | commit | date "
        "| load (start / mean / max) | modules | passed | failed | skipped | tests took |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(row(r) for r in results),
    ]
    below = [line for r in results for line in notes(r)]
    return "\n".join(lines + (["", *below] if below else []))


def docs_table(text: str) -> str:
    """The generated table in the docs' ``text`` (between the markers), stripped."""
    begin, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[begin:end].strip()


def write_docs(results: Sequence[VersionResult], path: Path = DOCS) -> None:
    text = path.read_text()
    begin, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    path.write_text(text[:begin] + "\n" + table(results) + "\n" + text[end:])


def arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m harness.matrix", description=__doc__)
    listed = lambda text: [v.strip() for v in text.split(",") if v.strip()]  # noqa: E731
    parser.add_argument("--versions", type=listed, default=list(VERSIONS),
                        help="comma-separated entries (default: %(default)s)")  # fmt: skip
    parser.add_argument("--modules", type=listed, default=[],
                        help="comma-separated tests/e2e modules (default: all; a -realnode "
                             "entry runs its round)")  # fmt: skip
    parser.add_argument("-k", dest="selection", default="", help="pytest's -k, if any")
    parser.add_argument("--workers", type=int, default=2, choices=range(9), metavar="N",
                        help="pytest-xdist workers, 0: one process (default: 2)")  # fmt: skip
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument("--log-dir", type=Path, default=REPO_ROOT / ".matrix",
                        help="build logs, pytest output")  # fmt: skip
    parser.add_argument("--docs", action="store_true", help=f"also write the table to {DOCS}")
    parser.add_argument("--docs-only", action="store_true", help="write the table, run nothing")
    args = parser.parse_args(argv)
    for entry in args.versions:
        if not re.fullmatch(r"v1\.\d+\.\d+(-gate-off|-realnode)?", entry):
            parser.error(
                f"not a Kubernetes version: {entry!r} "
                "(like v1.36.3, v1.37.2-gate-off, v1.33.13-realnode)"
            )
    for module in args.modules:
        if not (E2E / module).is_file():
            parser.error(f"no such module in tests/e2e: {module!r}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(argv)
    if args.docs_only:
        write_docs(load(args.json))
        return 0
    args.log_dir.mkdir(parents=True, exist_ok=True)
    # A run of some entries replaces their rows and keeps the others' (one version at a time
    # fits better between other work than all of them at once).
    kept = {r.version: r for r in load(args.json) if r.version not in args.versions}
    results: list[VersionResult] = []
    merged = sorted(kept.values(), key=lambda r: version_key(r.version))
    for entry in args.versions:
        results.append(run_version(entry, args.log_dir, args.modules, args.selection, args.workers))
        merged = sorted([*kept.values(), *results], key=lambda r: version_key(r.version))
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps([asdict(r) for r in merged], indent=2) + "\n")
    print(table(merged))
    if args.docs:
        write_docs(merged)
    return 0 if all(r.green for r in results) else 1


def version_key(entry: str) -> tuple[int, ...]:
    """Sorts by version; an entry with a suffix after its version, in :data:`SUFFIXES`."""
    version = kube_version_of(entry)
    numbers = tuple(int(part) for part in version.lstrip("v").split("."))
    return (*numbers, SUFFIXES.index(entry.removeprefix(version)))


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
