"""The comparison's report: every scenario on both sides (:mod:`harness.compare.runner`),
then a table of victims, timings and API requests, a summary, and the JSON results file
(``bench/results/compare.json`` unless ``--out``)."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.compare import scenarios as sc
from harness.compare.runner import Measured, compare
from harness.compare.sides import ALL_SIDES, GRACE_CAP, SIDES
from harness.provenance import Run

RESULTS = Path(__file__).resolve().parents[1] / "results" / "compare.json"


def rows(
    scenarios: Sequence[sc.Scenario], results: dict[str, dict[str, Measured]]
) -> list[dict[str, Any]]:
    """The JSON rows: ``{"scenario": name, "ours": {...}, "upstream": {...}}``."""
    return [
        {"scenario": s.name, **{side: results[side][s.name].as_json() for side in results}}
        for s in scenarios
        if all(s.name in results[side] for side in results)
    ]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _victims_text(victims: list[str], limit: int = 3) -> str:
    names = [v.split("/", 1)[1] for v in victims]
    if len(names) > limit:
        return f"{len(names)} pods"
    return ", ".join(names) or "none"


def _lost_count(side: dict[str, Any]) -> str:
    lost = side.get("lost")
    return "-" if lost is None else str(len(lost))


def table(data: list[dict[str, Any]]) -> str:
    header = (
        "| scenario | victims: ours | victims: upstream | pods lost: ours / upstream "
        "| first eviction ms: ours / upstream "
        "| actuated ms: ours / upstream | API requests: ours / upstream |"
    )
    lines = [header, "|---|---|---|---|---|---|---|"]
    for row in data:
        o, u = row["ours"], row["upstream"]
        lines.append(
            f"| {row['scenario']} | {_victims_text(o['victims'])} | "
            f"{_victims_text(u['victims'])} | {_lost_count(o)} / {_lost_count(u)} | "
            f"{_ms(o['first_eviction_ms'])} / {_ms(u['first_eviction_ms'])} | "
            f"{_ms(o['actuated_ms'])} / {_ms(u['actuated_ms'])} | "
            f"{o['api_requests']} / {u['api_requests']} |"
        )
    return "\n".join(lines)


def summary(data: list[dict[str, Any]]) -> str:
    lines = []
    for key, label in (("first_eviction_ms", "first eviction"), ("actuated_ms", "actuated")):
        both = [r for r in data if r["ours"][key] is not None and r["upstream"][key] is not None]
        if both:
            ours = statistics.median(r["ours"][key] for r in both)
            upstream = statistics.median(r["upstream"][key] for r in both)
            lines.append(
                f"median time to {label} over the {len(both)} scenarios where both sides "
                f"have one: ours {ours:.0f} ms, upstream {upstream:.0f} ms"
            )
    loans = lending_summary(data)
    if loans:
        lines.append(loans)
    lost = {side: sum(len(r[side].get("lost") or ()) for r in data) for side in SIDES}
    lines.append(
        f"pods lost over the {len(data)} scenarios: ours {lost['ours']}, "
        f"upstream {lost['upstream']}"
    )
    same = [r["scenario"] for r in data if r["ours"]["victims"] == r["upstream"]["victims"]]
    differ = [r["scenario"] for r in data if r["ours"]["victims"] != r["upstream"]["victims"]]
    lines.append(f"same victims: {', '.join(same) or 'none'}")
    lines.append(f"different victims: {', '.join(differ) or 'none'}")
    return "\n".join(lines)


def lending_summary(data: list[dict[str, Any]]) -> str:
    """Room from loans vs from evictions: ``lending`` on our side against the walkthrough's
    eviction on our side and ``lending`` on kube-scheduler's (which evicts); empty unless
    all three were measured."""
    by_name = {r["scenario"]: r for r in data}
    if "lending" not in by_name or "walkthrough" not in by_name:
        return ""
    loans = by_name["lending"]["ours"]["actuated_ms"]
    evictions = by_name["walkthrough"]["ours"]["actuated_ms"]
    upstream = by_name["lending"]["upstream"]["actuated_ms"]
    if loans is None or evictions is None or upstream is None:
        return ""
    return (
        f"patch -> actuated with the room from loans {loans:.0f} ms, from evictions "
        f"{evictions:.0f} ms (ratio {loans / evictions:.3f}), kube-scheduler {upstream:.0f} ms "
        f"(ratio {loans / upstream:.3f})"
    )


def breakdowns(scenarios: Sequence[sc.Scenario], results: dict[str, dict[str, Measured]]) -> str:
    lines = []
    for s in scenarios:
        for side in results:
            if s.name in results[side]:
                parts = ", ".join(f"{k}: {v}" for k, v in results[side][s.name].breakdown.items())
                lines.append(f"{s.name} [{side}]: {parts or 'no requests'}")
    return "\n".join(lines)


def _parse_scale(text: str) -> tuple[int, int, int]:
    try:
        nodes, pods, concurrent = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError("expected NODESxPODSxCONCURRENT, e.g. 50x30x20") from None
    return nodes, pods, concurrent


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare",
        description="Resize preemption: this webhook vs kube-scheduler v1.37.2 (KEP-5836).",
    )
    parser.add_argument(
        "--scale",
        type=_parse_scale,
        default=(50, 30, 20),
        metavar="NxPxC",
        help="nodes x pods per node x concurrent resizes of the big scenario (default 50x30x20)",
    )
    parser.add_argument("--no-scale", action="store_true", help="skip the big scenario")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each scenario")
    parser.add_argument("--only", nargs="*", default=None, help="scenario names to run")
    parser.add_argument("--sides", nargs="*", default=list(SIDES), choices=ALL_SIDES)
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON results file")
    parser.add_argument("--state-dir", type=Path, default=None, help="keep logs here")
    parser.add_argument(
        "--victim-grace",
        type=int,
        default=None,
        metavar="SECONDS",
        help="terminationGracePeriodSeconds of every pod, honoured in full by the kubelets "
        f"(default: the pods' 30 s, each stop capped at {GRACE_CAP:.0f} s)",
    )
    args = parser.parse_args(argv)
    run = Run()
    nodes, pods, concurrent = args.scale
    chosen = sc.all_scenarios(
        nodes=nodes, pods_per_node=pods, concurrent=concurrent, with_scale=not args.no_scale
    )
    if args.only:
        chosen = [s for s in chosen if s.name in args.only]
    results = compare(
        chosen,
        repeat=args.repeat,
        sides=args.sides,
        state_root=args.state_dir,
        victim_grace=args.victim_grace,
    )
    data = rows(chosen, results)
    if {"ours", "upstream"} <= set(results):
        print(table(data))
        print()
        print(summary(data))
    else:
        # Not the comparison (a side alone, or a variant): each side's own figures.
        for side, measured in results.items():
            for name, m in measured.items():
                print(
                    f"{side} {name}: victims={_victims_text(m.victims)} "
                    f"first_eviction={_ms(m.first_eviction_ms)} ms "
                    f"actuated={_ms(m.actuated_ms)} ms api={m.api_requests}"
                )
    print()
    print("API requests of the preempting component, by verb and resource (first run):")
    print(breakdowns(chosen, results))
    run.write(args.out, data)
    print(f"\nwrote {args.out}")
    return 0
