"""How long one resize decision takes: ``plan_resize`` on a busy node.

Two node sizes: 110 pods (the kubelet's default ``maxPods``) and 1,000 pods. Each node has
pods of mixed priorities in several namespaces (some above the resizing pod), sidecars,
PodDisruptionBudgets (two per namespace, various ``disruptionsAllowed``), terminating
pods, a mirror pod and a few reservations (one expired, one for a pod not seen yet, one
claiming victims). The resize grows enough that the plan preempts several pods, so every
step of victim selection runs.

Run ``python -m bench plan``. Figures are per call, in milliseconds, from
``time.perf_counter_ns`` after a warm-up; the machine is shared, so quote the median.

Three ways of calling it. *Warm* (the headline): as the admission engine calls it, with
its one memo (:class:`~webhook.engine.planner.NodeMemo`) of what the node's pods hold
and how they rank, with the budgets each one's eviction spends from, kept while the
cluster view hands out the same pods and budgets. *Cold*: without it, all of that
computed afresh (:class:`~webhook.core.plan.NodePods`). *One pod changed*: with the
memo, each call on another list of the node's pods, one of them in a new version, as
after that pod changed: the memo reuses what it knows of the versions the lists share
and ranks them again.

A *lending* case runs the same nodes with one in four lower-priority pods annotated to
lend CPU down to half its request (``resize-preemption.io/floor``): the plan borrows
from them and evicts fewer pods. Its figures are warm, as the headline; the targets are
for the plain case (no lenders), which must not slow down because lending exists.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.provenance import Run
from webhook.core.accounting import Reservation, active_on, node_usage
from webhook.core.model import DisruptionBudget, Node, Pod
from webhook.core.objects import parse_node, parse_pdb, parse_pod
from webhook.core.plan import NodePods, NodeView, Plan, plan_resize
from webhook.core.policy import DefaultPolicy
from webhook.core.resize import apply_resize
from webhook.core.resources import Resources
from webhook.engine.elsewhere import Elsewhere
from webhook.engine.memory import FixedClusterView, MemoryLedger
from webhook.engine.planner import NodeMemo

RESULTS = Path(__file__).resolve().parent / "results" / "plan.json"
#: Medians per call the decision core must stay under on a 110- and a 1,000-pod node.
TARGET_MS_110 = 0.3
TARGET_MS_1000 = 3.0

T0 = 1_700_000_000.0
NOW = T0 + 86_400.0
NODE = "bench-node"
PREEMPTOR_PRIORITY = 1_000_000
#: Priority tiers of the other pods, with weights; the last is above the resizing pod.
TIERS = ((0, 3), (1000, 4), (5000, 3), (100_000, 2), (2_000_000, 1))


def _time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pod_object(
    rng: random.Random, i: int, namespace: str, app: str, priority: int
) -> dict[str, Any]:
    cpu = rng.choice((50, 100, 150, 200, 250))
    memory = rng.choice((64, 128, 256, 512))
    containers = [
        {"name": "app", "resources": {"requests": {"cpu": f"{cpu}m", "memory": f"{memory}Mi"}}}
    ]
    init: list[dict[str, Any]] = []
    if rng.random() < 0.2:
        init.append(
            {
                "name": "proxy",
                "restartPolicy": "Always",
                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
            }
        )
    statuses = [
        {
            "name": c["name"],
            "allocatedResources": c["resources"]["requests"],
            "resources": {"requests": c["resources"]["requests"]},
        }
        for c in containers + init
    ]
    meta: dict[str, Any] = {
        "name": f"pod-{i}",
        "namespace": namespace,
        "uid": f"uid-{i}",
        "resourceVersion": str(1000 + i),
        "labels": {"app": app, "tier": str(priority)},
    }
    if rng.random() < 0.5:
        # Half the pods are a ReplicaSet's: victim order movable-first may move them.
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": app, "uid": f"rs-{app}",
             "controller": True}
        ]  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": NODE,
            "priority": priority,
            "containers": containers,
            "initContainers": init,
        },
        "status": {
            "phase": "Running",
            "startTime": _time(T0 + rng.randrange(0, 80_000)),
            "containerStatuses": statuses[: len(containers)],
            "initContainerStatuses": statuses[len(containers) :],
        },
    }


@dataclass(frozen=True)
class Scenario:
    pods_on_node: int
    old: Pod
    new: Pod
    node: Node
    pods: tuple[Pod, ...]
    budgets: tuple[DisruptionBudget, ...]
    reservations: tuple[Reservation, ...]

    def run(self, memo: NodeMemo | None = None, pods: tuple[Pod, ...] | None = None) -> Plan:
        """One decision; with ``memo``, as the engine makes it; on ``pods`` (default: the
        scenario's)."""
        pods = self.pods if pods is None else pods
        view: NodeView = NodePods(self.node, pods)
        if memo is not None:
            view = memo.of(self.node, pods, self.budgets, NOW)
        return plan_resize(
            self.old,
            self.new,
            view,
            now=NOW,
            budgets=self.budgets,
            reservations=self.reservations,
            policy=POLICY,
        )


POLICY = DefaultPolicy(pdb_mode="best-effort")


def build_scenario(pods_on_node: int, seed: int = 5836, *, lending: bool = False) -> Scenario:
    """A node with ``pods_on_node`` pods, the resizing one among them; with ``lending``,
    one in four pods below the resizing pod's priority lends CPU down to half."""
    rng = random.Random(seed)
    namespaces = [f"team-{k}" for k in range(max(1, pods_on_node // 11))]
    values = [v for v, _ in TIERS]
    weights = [w for _, w in TIERS]
    objects = []
    for i in range(pods_on_node - 1):
        ns = rng.choice(namespaces)
        app = f"app-{rng.randrange(3)}"
        objects.append(_pod_object(rng, i, ns, app, rng.choices(values, weights)[0]))
    objects[0]["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "x"}
    for obj in objects[1:3]:
        obj["metadata"]["deletionTimestamp"] = _time(NOW - 5)
    if lending:
        lower = [o for o in objects[3:] if o["spec"]["priority"] < PREEMPTOR_PRIORITY]
        for obj in lower[::4]:
            cpu = int(obj["spec"]["containers"][0]["resources"]["requests"]["cpu"][:-1])
            obj["metadata"]["annotations"] = {
                "resize-preemption.io/floor": json.dumps({"app": {"cpu": f"{cpu // 2}m"}})
            }
    pods = [parse_pod(o) for o in objects]

    resizing = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "resizing",
            "namespace": namespaces[0],
            "uid": "uid-resizing",
            "resourceVersion": "999",
        },
        "spec": {
            "nodeName": NODE,
            "priority": PREEMPTOR_PRIORITY,
            "containers": [
                {"name": "app", "resources": {"requests": {"cpu": "2", "memory": "2Gi"}}}
            ],
        },
        "status": {
            "phase": "Running",
            "startTime": _time(T0),
            "containerStatuses": [
                {
                    "name": "app",
                    "allocatedResources": {"cpu": "2", "memory": "2Gi"},
                    "resources": {"requests": {"cpu": "2", "memory": "2Gi"}},
                }
            ],
        },
    }
    old = parse_pod(resizing)
    # Grow by about 5% of the node's pods' worth of CPU, so several must go.
    growth = pods_on_node * 8
    patch = {
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "resources": {"requests": {"cpu": f"{2000 + growth}m", "memory": "2Gi"}},
                }
            ]
        }
    }
    new = parse_pod(apply_resize(resizing, patch))

    budgets = []
    for ns in namespaces:
        for app in ("app-0", "app-1"):
            budgets.append(
                parse_pdb(
                    {
                        "kind": "PodDisruptionBudget",
                        "metadata": {"name": f"{app}-pdb", "namespace": ns},
                        "spec": {"selector": {"matchLabels": {"app": app}}},
                        "status": {"disruptionsAllowed": rng.randrange(3)},
                    }
                )
            )

    high = [p for p in pods if p.priority > PREEMPTOR_PRIORITY] * 2
    low = [p for p in pods[3:] if p.priority < PREEMPTOR_PRIORITY]
    reservations = (
        Reservation(
            high[0].uid, high[0].key, NODE, Resources(300, 256 * 2**20), expires_at=NOW + 30
        ),
        Reservation(
            "uid-unseen", "team-0/unseen", NODE, Resources(100, 2**27), expires_at=NOW + 30
        ),
        Reservation(
            high[1].uid,
            high[1].key,
            NODE,
            Resources(400, 2**28),
            victims=frozenset(p.uid for p in low[:2]),
            expires_at=NOW + 30,
        ),
        Reservation("uid-gone", "team-0/gone", NODE, Resources(4000, 2**32), expires_at=NOW - 1),
    )

    everything = (*pods, old)
    # Size the node so that it is full: what stays (counting what is already leaving as
    # gone) plus the resizing pod's current size plus a little slack.
    roomy = Node(NODE, Resources(10**9, 2**60))
    usage = node_usage(
        roomy,
        everything,
        active_on(reservations, NODE, NOW, exclude_pod=old.uid),
        exclude_uid=old.uid,
    )
    projected = usage.in_use - usage.freeing
    node = parse_node(
        {
            "kind": "Node",
            "metadata": {"name": NODE},
            "status": {
                "allocatable": {
                    "cpu": f"{projected.cpu + 2000 + 100}m",
                    "memory": str(projected.memory + 2 * 2**30 + 2**27),
                    "pods": str(max(110, pods_on_node)),
                }
            },
        }
    )
    return Scenario(pods_on_node, old, new, node, everything, tuple(budgets), reservations)


#: Nodes in the cache besides the benchmark's, and pods on each, for movable-first.
OTHER_NODES = 5000
PODS_PER_OTHER_NODE = 20


def movable_cluster(scenario: Scenario) -> Elsewhere:
    """The room elsewhere as the service builds it: :data:`OTHER_NODES` nodes of 16 cores,
    each with :data:`PODS_PER_OTHER_NODE` of the scenario's pods (as copies bound
    there), most of them nearly full; an empty ledger."""
    rng = random.Random(27)
    templates = [p for p in scenario.pods if not p.terminating and not p.mirror][:50]
    nodes, pods = [], []
    for k in range(OTHER_NODES):
        name = f"other-{k:05d}"
        nodes.append(Node(name, Resources(rng.choice((3000, 4000, 16_000)), 64 * 2**30)))
        for j in range(PODS_PER_OTHER_NODE):
            t = templates[(k + j) % len(templates)]
            pods.append(replace(t, uid=f"{name}-{j}", name=f"{name}-{j}", node=name))
    return Elsewhere(FixedClusterView((scenario.node, *nodes), pods), MemoryLedger())


def movable_run(scenario: Scenario, memo: NodeMemo, elsewhere: Elsewhere) -> Plan:
    """One decision as the admission engine makes it with victim order movable-first:
    one plan, given the room elsewhere, which it reads only as far as it looks."""
    return plan_resize(
        scenario.old,
        scenario.new,
        memo.of(scenario.node, scenario.pods, scenario.budgets, NOW),
        now=NOW,
        budgets=scenario.budgets,
        reservations=scenario.reservations,
        policy=POLICY,
        elsewhere=elsewhere.rooms(scenario.node.name, NOW, scenario.old.uid),
    )


def first_room(elsewhere: Elsewhere, scenario: Scenario) -> object:
    """The roomiest other node, as a victim's judgment reads it first."""
    return next(iter(elsewhere.rooms(scenario.node.name, NOW, scenario.old.uid)))


def one_node_changed(elsewhere: Elsewhere, scenario: Scenario) -> object:
    """The roomiest other node after one node's pods changed (as a pod's status does)."""
    elsewhere.cluster.node_rooms().changed("other-00000")
    return first_room(elsewhere, scenario)


def movable_figures(scenario: Scenario, reps: int, warmup: int) -> dict[str, Any]:
    """Movable-first's figures: the whole decision (the room in a 5,000-node cache
    included), the core's part alone (the plan with every room given), the roomiest
    room with no node changed and with one changed, every room in order, and the rooms
    of every node added up from nothing (once after the cache is listed)."""
    elsewhere = movable_cluster(scenario)
    start = time.perf_counter_ns()
    rooms = tuple(elsewhere.rooms(scenario.node.name, NOW, scenario.old.uid))
    built = time.perf_counter_ns() - start
    memo = NodeMemo(POLICY)
    plan = movable_run(scenario, memo, elsewhere)
    view = memo.of(scenario.node, scenario.pods, scenario.budgets, NOW)

    def core() -> Plan:
        return plan_resize(
            scenario.old, scenario.new, view, now=NOW, budgets=scenario.budgets,
            reservations=scenario.reservations, policy=POLICY, elsewhere=rooms,
        )  # fmt: skip

    if core() != plan:
        raise SystemExit("the rooms read lazily changed the plan")
    few, fewer = max(reps // 4, 10), warmup // 4
    upstream, movable = measure_paired(
        functools.partial(scenario.run, NodeMemo(POLICY)),
        functools.partial(movable_run, scenario, memo, elsewhere),
        reps,
        warmup,
    )
    return {
        "victims": len(plan.victims),
        "moved": len(plan.moves),
        "nodes": OTHER_NODES + 1,
        "paired": {
            "upstream_median_ms": _ms(statistics.median(upstream)),
            "median_ms": _ms(statistics.median(movable)),
            "ratio": round(statistics.median(movable) / statistics.median(upstream), 2),
        },
        **_figures(
            measure(functools.partial(movable_run, scenario, memo, elsewhere), reps, warmup)
        ),
        "core": _figures(measure(core, reps, warmup)),
        "first_room": _figures(
            measure(functools.partial(first_room, elsewhere, scenario), reps, warmup)
        ),
        "first_room_one_node_changed": _figures(
            measure(functools.partial(one_node_changed, elsewhere, scenario), reps, warmup)
        ),
        "all_rooms": _figures(
            measure(
                lambda: len(elsewhere.rooms(scenario.node.name, NOW, scenario.old.uid)),
                few,
                fewer,
            )
        ),
        "rooms_built_ms": _ms(built),
    }


def measure(call: Callable[[], object], reps: int, warmup: int) -> list[int]:
    """Nanoseconds of ``reps`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        call()
    samples = []
    clock = time.perf_counter_ns
    for _ in range(reps):
        start = clock()
        call()
        samples.append(clock() - start)
    return samples


def measure_paired(
    one: Callable[[], object], other: Callable[[], object], reps: int, warmup: int
) -> tuple[list[int], list[int]]:
    """Nanoseconds of ``reps`` calls of each, one after the other in turns (after
    ``warmup`` untimed turns): on a shared machine both meet the same moments, so their
    ratio holds when the load changes between the separate measurements."""
    for _ in range(warmup):
        one()
        other()
    ones, others = [], []
    clock = time.perf_counter_ns
    for _ in range(reps):
        start = clock()
        one()
        middle = clock()
        other()
        others.append(clock() - middle)
        ones.append(middle - start)
    return ones, others


def measure_changed(scenario: Scenario, reps: int, warmup: int) -> list[int]:
    """Like :func:`measure` with the engine's memo, but every call sees another tuple of
    the node's pods, one pod replaced by a new version of it (another resourceVersion
    and generation, as after its spec changed in a way no plan reads): the memo keeps the
    amounts of the versions the tuples share."""
    memo = NodeMemo(POLICY)
    one = len(scenario.pods) // 2
    copy = tuple(
        replace(p, resource_version=f"{p.resource_version}-next", generation=p.generation + 1)
        if i == one
        else p
        for i, p in enumerate(scenario.pods)
    )
    calls = [
        functools.partial(scenario.run, memo),
        functools.partial(scenario.run, memo, copy),
    ]
    samples = []
    clock = time.perf_counter_ns
    for k in range(warmup + reps):
        start = clock()
        calls[k % 2]()
        if k >= warmup:
            samples.append(clock() - start)
    return samples


def _ms(ns: float) -> float:
    return round(ns / 1e6, 4)


def _figures(samples: list[int]) -> dict[str, float]:
    return {
        "median_ms": _ms(statistics.median(samples)),
        "p90_ms": _ms(statistics.quantiles(samples, n=10)[8]),
        "min_ms": _ms(min(samples)),
    }


def run(sizes: Sequence[tuple[int, int]], warmup: int) -> dict[str, Any]:
    rows = []
    for pods_on_node, reps in sizes:
        scenario = build_scenario(pods_on_node)
        plan = scenario.run()
        if plan.verdict != "preempt":
            raise SystemExit(f"benchmark scenario does not preempt: {plan.verdict} {plan.reason}")
        memo = NodeMemo(POLICY)
        if scenario.run(memo) != plan:
            raise SystemExit("the memo changed the plan")
        warm = _figures(measure(functools.partial(scenario.run, memo), reps, warmup))
        cold = _figures(measure(scenario.run, max(reps // 4, 10), warmup // 4))
        changed = _figures(measure_changed(scenario, max(reps // 4, 10), warmup // 4))
        lenders = build_scenario(pods_on_node, lending=True)
        lent = lenders.run()
        if not lent.loans:
            raise SystemExit(f"lending scenario borrows nothing: {lent.reason}")
        lending_memo = NodeMemo(POLICY)
        lending = _figures(measure(functools.partial(lenders.run, lending_memo), reps, warmup))
        movable = movable_figures(scenario, max(reps // 4, 10), warmup // 4)
        rows.append(
            {
                "movable_first": movable,
                "pods": pods_on_node,
                "reps": reps,
                "victims": len(plan.victims),
                "budgets": len(scenario.budgets),
                "reservations": len(scenario.reservations),
                **warm,
                "cold": cold,
                "one_pod_changed": changed,
                "lending": {
                    "victims": len(lent.victims),
                    "loans": len(lent.loans),
                    "lenders": len(lent.lender_keys),
                    **lending,
                },
            }
        )
    by_size = {r["pods"]: r for r in rows}
    result: dict[str, Any] = {
        "benchmark": "plan_resize",
        "command": "python -m bench plan",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "target_median_ms_at_110": TARGET_MS_110,
        "target_median_ms_at_1000": TARGET_MS_1000,
        "results": rows,
    }
    if 110 in by_size and 1000 in by_size:
        result["ratio_1000_over_110"] = round(
            by_size[1000]["median_ms"] / by_size[110]["median_ms"], 2
        )
        result["cold_ratio_1000_over_110"] = round(
            by_size[1000]["cold"]["median_ms"] / by_size[110]["cold"]["median_ms"], 2
        )
    return result


def table(result: dict[str, Any]) -> str:
    lines = [
        f"plan_resize, ms per call (python {result['python']}, {result['machine']}, "
        f"{result['cpus']} cpus)",
        f"{'pods':>5} {'victims':>7} {'budgets':>7} {'reps':>5} "
        f"{'median':>8} {'p90':>8} {'min':>8}   {'cold median':>11} {'cold p90':>8}"
        f"   {'1-changed median':>16}   {'lending median':>14} {'victims':>7} {'loans':>5}",
    ]
    for r in result["results"]:
        lines.append(
            f"{r['pods']:>5} {r['victims']:>7} {r['budgets']:>7} {r['reps']:>5} "
            f"{r['median_ms']:>8.4f} {r['p90_ms']:>8.4f} {r['min_ms']:>8.4f}   "
            f"{r['cold']['median_ms']:>11.4f} {r['cold']['p90_ms']:>8.4f}   "
            f"{r['one_pod_changed']['median_ms']:>16.4f}   "
            f"{r['lending']['median_ms']:>14.4f} {r['lending']['victims']:>7} "
            f"{r['lending']['loans']:>5}"
        )
    if "ratio_1000_over_110" in result:
        lines.append(
            f"median ratio 1000/110 pods: {result['ratio_1000_over_110']:.2f} "
            f"(cold {result['cold_ratio_1000_over_110']:.2f}; linear would be 9.09)"
        )
    lines.append("movable-first, ms per call, with the cache's other nodes as room elsewhere:")
    for r in result["results"]:
        m = r["movable_first"]
        lines.append(
            f"{r['pods']:>5} pods, {m['nodes']} nodes: decision median {m['median_ms']:.4f} "
            f"(upstream {r['median_ms']:.4f}, x{m['median_ms'] / r['median_ms']:.2f}); "
            f"core alone {m['core']['median_ms']:.4f}; "
            f"roomiest room {m['first_room']['median_ms']:.4f}, "
            f"one node changed {m['first_room_one_node_changed']['median_ms']:.4f}; "
            f"every room {m['all_rooms']['median_ms']:.4f}; "
            f"built {m['rooms_built_ms']:.1f}; victims {m['victims']}, moved {m['moved']}"
        )
        p = m["paired"]
        lines.append(
            f"{r['pods']:>5} pods, timed in turns: movable-first {p['median_ms']:.4f}, "
            f"upstream {p['upstream_median_ms']:.4f}: x{p['ratio']:.2f}"
        )
    for pods, target in ((110, TARGET_MS_110), (1000, TARGET_MS_1000)):
        row = next((r for r in result["results"] if r["pods"] == pods), None)
        if row is not None:
            verdict = "met" if row["median_ms"] <= target else "MISSED"
            lines.append(f"target median <= {target} ms at {pods} pods: {verdict}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench plan", description="Time plan_resize on 110- and 1000-pod nodes."
    )
    parser.add_argument("--quick", action="store_true", help="few repetitions, no results file")
    parser.add_argument("--reps-110", type=int, default=2000)
    parser.add_argument("--reps-1000", type=int, default=300)
    args = parser.parse_args(argv)
    started = Run()
    if args.quick:
        sizes, warmup = [(110, 60), (1000, 12)], 5
    else:
        sizes, warmup = [(110, args.reps_110), (1000, args.reps_1000)], 50
    result = run(sizes, warmup)
    print(table(result))
    if not args.quick:
        started.write(RESULTS, result)
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
