"""Markdown tables of the results files, for the docs: a doc quotes figures only from here.

A doc holds each table between two markers, the files it renders named in the first::

    <!-- generated: bench/results/cache-before.json bench/results/cache.json -->
    ...
    <!-- end generated -->

Each table is headed by its files, the commit each was measured on, its date, the load
and the command (their ``provenance``, :mod:`harness.provenance`). The comparison's files
give the comparison's table (:func:`bench.compare.runner.table`), one per file; other
files give one row per figure and a column per file.

``python -m bench.report`` rewrites every generated block of the docs from the files;
``--check`` only says which differ; ``python -m bench.report --show FILE...`` prints the
table of those files. ``tests/unit/test_doc_figures.py`` fails when a doc differs.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.compare.runner import table as compare_table
from harness.provenance import figures, read

REPO = Path(__file__).resolve().parents[1]
#: The docs whose generated blocks ``python -m bench.report`` keeps current.
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))
BLOCK = re.compile(
    r"(?P<open><!-- generated: (?P<files>[^>]+?) -->\n)"
    r"(?P<body>.*?)(?P<close><!-- end generated -->)",
    re.S,
)
COMMAND = "python -m bench.report"

Figures = list[tuple[str, Any]]


def _get(data: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _number(value: Any) -> str:
    return _plain(value).replace("|", "\\|")


def _plain(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else ("yes" if value else "no")
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def provenance_line(name: str, document: dict[str, Any]) -> str:
    """``name``: the commit, date, load and command its figures come from."""
    p = document.get("provenance") or {}
    commit = (p.get("commit") or "unknown")[:7] + (
        " (uncommitted changes)" if p.get("dirty") else ""
    )
    date = (p.get("date") or "undated")[:10]
    load = p.get("load")
    if load is None:
        measured = "load not recorded"
    else:
        start, end = load.get("start") or [None], load.get("end") or [None]
        measured = f"load {_number(start[0])} -> {_number(end[0])} on {load.get('nproc')} CPUs"
    command = p.get("command") or "unknown"
    command = " ".join(command) if isinstance(command, list) else command
    if p.get("recorded") == "from git history":
        # The commit that last wrote the file: the tree measured is that one or older.
        return f"`{name}`: committed in `{commit}`, {date}, {measured}; `{command}`"
    return f"`{name}`: measured at `{commit}`, {date}, {measured}; `{command}`"


# --- the figures of each kind of file -----------------------------------------------------


def cache_figures(d: dict[str, Any]) -> Figures:
    return [
        ("pods / nodes", f"{_number(d['pods'])} / {_number(d['nodes_with_pods'])}"),
        ("List size", f"{_number(d['list_bytes_mb'])} MB"),
        ("RSS growth", f"{_number(d['rss_growth_mb'])} MB ({d['bytes_per_pod']} B/pod)"),
        ("peak RSS", f"{_number(d['peak_rss_mb'])} MB"),
        ("first sync", f"{_number(d['sync_seconds'])} s ({_number(d['pods_per_second'])} pods/s)"),
        ("relist", f"{_number(d['relist_seconds'])} s"),
        ("`pods_on(node)`", f"{_number(d['pods_on_ns'])} ns"),
    ]


def _endpoints(d: dict[str, Any] | None) -> str:
    if not d:
        return "-"
    v, n = d["validate"], d["noop"]
    return (
        f"p50 {v['p50_ms']:.2f} / {n['p50_ms']:.2f} ms, p99 {v['p99_ms']:.1f} / "
        f"{n['p99_ms']:.1f} ms, {_number(v['reviews_per_s'])} / {_number(n['reviews_per_s'])}/s"
    )


def _ratios(d: dict[str, Any] | None) -> str:
    r = _get(d, "ratio_validate_over_noop")
    if not r:
        return "-"
    return f"x{r['p50']}, x{r['p99']}, x{r['throughput']}, x{r['server_cpu']}"


def _at_rate(d: dict[str, Any] | None) -> str:
    if not d:
        return "-"
    timed_out = d["counts"].get("timed out", 0)
    return (
        f"{_number(d['full_per_s'])}/s decided, {_number(timed_out)} of "
        f"{_number(d['offered'])} timed out, p99 {_number(d['p99_ms'])} ms"
    )


def review_figures(d: dict[str, Any]) -> Figures:
    two = d.get("two_workers")
    return [
        ("1 worker, 4 connections: validate / no-op", _endpoints(d)),
        ("1 worker: ratios p50, p99, throughput, server CPU", _ratios(d)),
        ("1 worker: server CPU per review", f"{_get(d, 'validate', 'server_cpu_ms')} ms"),
        ("1 worker, 1 connection: validate / no-op", _endpoints(d.get("single_connection"))),
        ("1 worker at 1,000 reviews/s offered", _at_rate(d.get("at_target_rate"))),
        ("2 workers, 4 connections: validate / no-op", _endpoints(two)),
        ("2 workers: ratios p50, p99, throughput, server CPU", _ratios(two)),
        ("2 workers at 1,000 reviews/s offered", _at_rate(_get(two, "at_target_rate"))),
        ("2 workers, 8 connections: validate / no-op", _endpoints(_get(two, "wider"))),
        ("2 workers under fire: validate / no-op", _endpoints(_get(two, "under_fire"))),
        ("client certificates", _number(d.get("client_certificates"))),
        ("targets met: p99, throughput, ratio", _targets(_get(d, "targets", "met"))),
    ]


def _targets(met: dict[str, Any] | None) -> str:
    return "-" if not met else ", ".join(_number(met[k]) for k in ("p99", "throughput", "ratio"))


def plan_figures(d: dict[str, Any]) -> Figures:
    """Per node size: warm median, p90 and minimum; cold, one pod changed, lending and
    movable-first medians (ms per call)."""
    rows: Figures = []
    for r in d["results"]:
        pods = f"{_number(r['pods'])} pods"
        rows.append(
            (f"{pods}: warm median, p90, min", f"{r['median_ms']}, {r['p90_ms']}, {r['min_ms']} ms")
        )
        for key, label in (
            ("cold", "cold"),
            ("one_pod_changed", "one pod changed"),
            ("lending", "lending"),
        ):
            if key in r:
                rows.append((f"{pods}: {label} median", f"{r[key]['median_ms']} ms"))
        mf = r.get("movable_first")
        if mf:
            paired = mf.get("paired") or {}
            rows.append((f"{pods}: movable-first median", f"{mf['median_ms']} ms"))
            if paired:
                rows.append(
                    (f"{pods}: movable-first / upstream, timed in turns", f"x{paired.get('ratio')}")
                )
    return rows


IMAGES = {"product": "Python (the product image)", "workload": "busybox"}


def _victim(summary: dict[str, Any]) -> str:
    return (
        f"evicted {summary['actuated_evicted_s']} s, checkpointed "
        f"{summary['actuated_checkpointed_s']} s, added {summary['added_s']} s "
        f"(checkpoint call {summary['checkpoint_s_median']} s)"
    )


def checkpoint_figures(d: dict[str, Any]) -> Figures:
    """Patch -> actuated with the victim evicted or checkpointed, medians per image."""
    summary = _get(d, "actuation", "summary") or {}
    rows: Figures = [
        (f"{IMAGES.get(image, image)}: actuated", _victim(s)) for image, s in summary.items()
    ]
    rows += [
        (f"{IMAGES.get(image, image)}: at most 1 s added", _number(s.get("target_met")))
        for image, s in summary.items()
    ]
    if d.get("runs"):
        rows.append(("checkpoints of `python -m bench.checkpoint`", len(d["runs"])))
    return rows


def overlay_diff_figures(d: dict[str, Any]) -> Figures:
    return [
        (f"{stack} containerd, {IMAGES.get(image, image)}", _victim(s))
        for stack, images in d["summary"].items()
        for image, s in images.items()
    ]


def generic_figures(d: dict[str, Any], prefix: str = "", depth: int = 0) -> Figures:
    """Every number, string and flag of ``d`` to two levels down; lists left out."""
    rows: Figures = []
    for key, value in d.items():
        if key in ("provenance", "command"):
            continue
        label = f"{prefix}{key}"
        if isinstance(value, dict) and depth < 2:
            rows += generic_figures(value, f"{label}.", depth + 1)
        elif not isinstance(value, (dict, list)) and "\n" not in str(value):
            rows.append((f"`{label}`", value))
    return rows


def _faults(s: dict[str, Any]) -> str:
    def n(key: str) -> str:
        return _number(s.get(key))

    return (
        f"{n('runs')} runs: {n('actuated')} actuated, {n('released')} released, "
        f"{n('double_evictions')} double and {n('unneeded_evictions')} unneeded evictions, "
        f"{n('ready_after')} ready after, {n('failed_open')} failed open, "
        f"{n('reconciler_planned')} planned by the reconciler; "
        f"median {n('median_seconds')} s, at most {n('max_seconds')} s"
    )


def faults_figures(d: dict[str, Any]) -> Figures:
    """Per fault: what the runs came to (``summary`` when there is one kind)."""
    by_fault = d.get("by_fault") or {"replica": d["summary"]}
    rows: Figures = [(f"{kind}", _faults(s)) for kind, s in by_fault.items()]
    rows.append(("every run as it must be", d["summary"].get("all_ok")))
    rows.append(("seed", str(d["summary"].get("seed"))))
    reviews = d.get("reviews")
    if reviews:
        rows.append(
            ("reviews answered, web errors", f"{reviews['reviews']}, {reviews['web_errors']}")
        )
        verdicts = ", ".join(f"{k} {v}" for k, v in sorted(reviews["by_verdict"].items()))
        rows.append(("reviews by verdict", verdicts))
    return rows


def realnode_figures(d: dict[str, Any]) -> Figures:
    sizes, medians = d["sizes"], d["medians"]
    return [
        ("image", f"`{sizes['reference']}`"),
        ("archive", f"{sizes['archive_bytes'] / 1e6:.1f} MB"),
        ("in containerd", sizes["containerd_content"]),
        ("unpacked", f"{sizes['unpacked_bytes'] / 2**20:.1f} MiB"),
        ("cold starts", len(d["cold_starts"])),
        *((f"median s from the POST to {stage}", medians[stage]) for stage in medians),
    ]


def vpa_figures(d: dict[str, Any]) -> Figures:
    """Per case: when the resize was sent and actuated (s from the recommendation), the
    resizes sent, restarts and victims."""
    rows: Figures = [("VPA, Kubernetes", f"{d.get('vpa')}, {d.get('kubernetes')}")]
    for c in d["cases"]:
        waited = f"never (waited {c['waited']} s)"
        actuated = waited if c["actuated_at"] is None else f"{c['actuated_at']} s"
        evicted = f", `web` evicted at {c['evicted_web_at']} s" if c.get("evicted_web_at") else ""
        rows.append(
            (
                f"`{c['case']}`",
                f"sent {c['resized_at']} s, actuated {actuated}, {c['resizes_sent']} sent, "
                f"{c['restarts']} restarts, victims {', '.join(c['victims']) or 'none'}{evicted}",
            )
        )
    return rows


def lender_memory_figures(d: dict[str, Any]) -> Figures:
    """Per scenario: the resize actuated (and how soon), then what the watch saw."""
    rows: Figures = [("kubelet, cgroup, watch", f"{d['kubelet']}, {d['cgroup']}, {d['watch_s']} s")]
    for name, sc in d["scenarios"].items():
        resize, outcome = sc.get("resize") or {}, sc.get("outcome") or {}
        actuated = (
            f"actuated in {resize['actuated_in_s']} s" if resize.get("actuated") else "not actuated"
        )
        oom = "OOM-killed" if outcome.get("oom_killed") else "no OOM kill of the container"
        rows.append(
            (f"`{name}`", f"{actuated}; {oom}, {_number(outcome.get('restarts'))} restarts")
        )
    return rows


def flood_figures(d: dict[str, Any]) -> Figures:
    """The flood's settings, then each run's figures (the overload answer on, then off)."""
    rows = generic_figures({k: v for k, v in d.items() if k != "runs"})
    for i, run in enumerate(d.get("runs") or [], 1):
        answer = "off" if run.get("shed_delay_s") == 0 else "on"
        rows += generic_figures(run, f"run {i} (overload answer {answer}): ")
    return rows


#: File name prefix -> its figures; the first that matches.
KINDS: tuple[tuple[str, Callable[[dict[str, Any]], Figures]], ...] = (
    ("cache", cache_figures),
    ("review", review_figures),
    ("plan", plan_figures),
    ("flood.json", flood_figures),
    ("faults", faults_figures),
    ("realnode", realnode_figures),
    ("vpa", vpa_figures),
    ("lender_memory", lender_memory_figures),
    ("checkpoint-overlay-diff", overlay_diff_figures),
    ("checkpoint", checkpoint_figures),
)


def _figures_of(name: str, data: dict[str, Any]) -> Figures:
    for prefix, kind in KINDS:
        if name.startswith(prefix):
            return kind(data)
    return generic_figures(data)


# --- tables ---------------------------------------------------------------------------------


def _compare(name: str, document: dict[str, Any]) -> str:
    data = figures(document)
    if isinstance(data, list):
        return compare_table(data)
    # The real node's comparison: a table per grace period.
    parts = [
        f"Victims' grace {grace} s, medians of {data.get('repeat')}:\n\n{compare_table(rows)}"
        for grace, rows in data["grace"].items()
    ]
    return "\n\n".join(parts)


def render(paths: Sequence[Path]) -> str:
    """The markdown of ``paths``: a line per file on where its figures come from, then the
    comparison's table of each file, or one table with a column per file."""
    documents = [(path.name, read(path)) for path in paths]
    head = "\n".join(f"- {provenance_line(name, d)}" for name, d in documents)
    if all(name.startswith("compare") for name, _ in documents):
        tables = "\n\n".join(
            (f"`{name}`:\n\n" if len(documents) > 1 else "") + _compare(name, d)
            for name, d in documents
        )
        return f"{head}\n\n{tables}\n"
    columns = [dict(_figures_of(name, _as_object(figures(d)))) for name, d in documents]
    labels = list(dict.fromkeys(label for c in columns for label in c))
    lines = [
        "| | " + " | ".join(f"`{name}`" for name, _ in documents) + " |",
        "|---|" + "---|" * len(documents),
        *(
            f"| {label} | " + " | ".join(_number(c.get(label)) for c in columns) + " |"
            for label in labels
        ),
    ]
    return f"{head}\n\n" + "\n".join(lines) + "\n"


def _as_object(data: dict[str, Any] | list[Any]) -> dict[str, Any]:
    return data if isinstance(data, dict) else {"rows": len(data)}


# --- the docs -------------------------------------------------------------------------------


def blocks(text: str) -> Iterator[tuple[list[str], str]]:
    """(files, body) of each generated block of a doc's ``text``."""
    for match in BLOCK.finditer(text):
        yield match["files"].split(), match["body"]


def regenerate(text: str, root: Path = REPO) -> str:
    """``text`` with every generated block rendered again from its files."""

    def block(match: re.Match[str]) -> str:
        body = render([root / f for f in match["files"].split()])
        return f"{match['open']}{body}{match['close']}"

    return BLOCK.sub(block, text)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("docs", nargs="*", type=Path, help="default: README.md and docs/*.md")
    parser.add_argument("--check", action="store_true", help="only say which docs differ")
    parser.add_argument("--show", nargs="+", type=Path, metavar="FILE", help="print a table")
    args = parser.parse_args(argv)
    if args.show:
        print(render(args.show), end="")
        return 0
    stale = []
    for doc in args.docs or DOCS:
        text = doc.read_text(encoding="utf-8")
        fresh = regenerate(text)
        if fresh != text:
            stale.append(doc)
            if not args.check:
                doc.write_text(fresh, encoding="utf-8")
    for doc in stale:
        print(f"{'differs' if args.check else 'regenerated'}: {doc}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
