"""The scenarios both sides run: pods, budgets, node settings and the resizes to make.

A scenario is data only. Every pod is bound straight to its node (``spec.nodeName``), runs
one container ``app`` with cpu/memory requests and no limits (Burstable, so a resize of the
requests keeps the QoS class), and gets its priority from a PriorityClass named after the
value (``cmp-<value>``, ``cmp-<value>-never`` for ``preemptionPolicy: Never``). Nodes are
8 CPU / 16Gi / 110 pods unless a scenario says otherwise, and each scenario gets its own
fresh nodes, so nothing left by one scenario can change another's outcome.

A pod may belong to a ReplicaSet (``replicaset``): it is created bound like the others,
then a ReplicaSet of one replica named after it adopts it, so that evicting it makes the
ReplicaSet create a replacement, which kube-scheduler places wherever there is room.

``expected`` holds the victims the decision rules give for each side (pod names), worked
out by hand in the comments; the comparison measures what actually happens and the
end-to-end test asserts the two agree. ``lost`` likewise holds the victims whose work runs
nowhere afterwards (a bare pod evicted, or a ReplicaSet's without a bound replacement).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from webhook.core.model import FLOOR_ANNOTATION

HIGH = 1_000_000
LOW = 1_000


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    priority: int
    cpu: str
    node: int = 0  # index into the scenario's nodes
    memory: str = "64Mi"
    never: bool = False  # PriorityClass with preemptionPolicy: Never
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    #: Adopted by a ReplicaSet of one replica named after the pod (see the module).
    replicaset: bool = False


@dataclass(frozen=True, slots=True)
class Budget:
    """A PodDisruptionBudget with ``minAvailable`` over ``app=<app>`` pods."""

    name: str
    app: str
    min_available: int


@dataclass(frozen=True, slots=True)
class Resize:
    pod: str
    cpu: str


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    pods: tuple[PodSpec, ...]
    resizes: tuple[Resize, ...]
    nodes: int = 1
    node_cpu: str = "8"
    #: Resizes made (and seen Deferred) before the measured ones.
    pending: tuple[Resize, ...] = ()
    budgets: tuple[Budget, ...] = ()
    #: Opt the nodes out of resize preemption (both the 1.37 field and our annotation).
    opt_out: bool = False
    #: Create pods one second apart so their startTime (second precision) orders them.
    distinct_start_times: bool = True
    #: Whether the measured resizes should end up actuated (for the waits).
    actuates: bool = True
    #: Victims (pod names) expected on each side; None: not asserted (the big run).
    expected: Mapping[str, tuple[str, ...]] | None = None
    #: Run by tests/e2e/test_compare.py.
    victim_relevant: bool = True
    #: Victims whose work is lost on each side (pod names); None: not asserted.
    lost: Mapping[str, tuple[str, ...]] | None = None


def _pod(name: str, priority: int, cpu: str, **kw: object) -> PodSpec:
    return PodSpec(name, priority, cpu, **kw)  # type: ignore[arg-type]


def walkthrough() -> Scenario:
    # make demo: 3 + 4 CPU on 8; the high pod grows to 6 -> the low pod must go.
    return Scenario(
        "walkthrough",
        "make demo: high 4->6 CPU next to one low 3 CPU pod on an 8 CPU node",
        pods=(_pod("low-priority-pod", LOW, "3"), _pod("high-priority-pod", HIGH, "4")),
        resizes=(Resize("high-priority-pod", "6"),),
        expected={"ours": ("low-priority-pod",), "upstream": ("low-priority-pod",)},
    )


def mixed_priorities() -> Scenario:
    # high 2->5 needs 3 more CPU, 0.5 is free: 2.5 must be freed. Candidates (priority
    # below 1000, most important first): p300, p200, p100-old, p100-new, p50. With all
    # removed: 5 + 1 (equal-priority peer) = 6 <= 8. Reprieve p300 (7), p200 (8); p100-old,
    # p100-new and p50 no longer fit -> victims. Equal priority is never a victim.
    return Scenario(
        "mixed-priorities",
        "high 2->5 CPU among pods of priorities 300/200/100/100/50 and an equal-priority peer",
        pods=(
            _pod("p100-old", 100, "1"),
            _pod("p300", 300, "1"),
            _pod("p200", 200, "1"),
            _pod("p100-new", 100, "1"),
            _pod("p50", 50, "500m"),
            _pod("peer", 1000, "1"),
            _pod("high", 1000, "2"),
        ),
        resizes=(Resize("high", "5"),),
        expected={
            "ours": ("p100-new", "p100-old", "p50"),
            "upstream": ("p100-new", "p100-old", "p50"),
        },
    )


def pdb_choice() -> Scenario:
    # Two equal-priority 2 CPU candidates; the newer (normally the victim) is covered by a
    # PDB allowing no disruption, so both pick the older, unprotected one.
    return Scenario(
        "pdb-choice",
        "high 4->6 CPU; two low 2 CPU pods, the newer one under a PDB with no disruption left",
        pods=(
            _pod("free", LOW, "2", labels={"app": "free"}),
            _pod("guarded", LOW, "2", labels={"app": "guarded"}),
            _pod("high", HIGH, "4"),
        ),
        budgets=(Budget("guarded", "guarded", 1),),
        resizes=(Resize("high", "6"),),
        expected={"ours": ("free",), "upstream": ("free",)},
    )


def pdb_only() -> Scenario:
    # The only candidate is PDB-protected. kube-scheduler deletes it anyway (plain DELETE,
    # PDBs "supported but not guaranteed"); we evict through the Eviction API and, with
    # the default pdb-mode "respect", plan no victim that would violate a budget.
    return Scenario(
        "pdb-only-candidate",
        "high 4->6 CPU; the only lower-priority pod is under a PDB with no disruption left",
        pods=(
            _pod("guarded", LOW, "2", labels={"app": "guarded"}),
            _pod("peer", HIGH, "2"),
            _pod("high", HIGH, "4"),
        ),
        budgets=(Budget("guarded", "guarded", 1),),
        resizes=(Resize("high", "6"),),
        actuates=False,
        expected={"ours": (), "upstream": ("guarded",)},
    )


def pending_neighbour() -> Scenario:
    # KEP-5836 "Risk of Additional Preemption". Node 8 CPU: neighbour 2 (its resize to 4 is
    # Deferred, not allocated), low-a 2, low-b 2, high 2 -> 4. All three are priority 1000,
    # neighbour oldest, so most important.
    # Kubelet model (ours): neighbour counts 2; with all candidates removed high's 4 fits;
    # reprieve neighbour (2+4), low-a (4+4=8) -> low-b alone is the victim.
    # Scheduler model (upstream): every pod at max(desired, allocated, actual): neighbour 4;
    # reprieve neighbour (4+4=8), then low-a (10) and low-b (10) are both victims.
    return Scenario(
        "pending-neighbour",
        "high 2->4 CPU while an equal-priority neighbour's 2->4 resize is Deferred",
        pods=(
            _pod("neighbour", LOW, "2"),
            _pod("low-a", LOW, "2"),
            _pod("low-b", LOW, "2"),
            _pod("high", HIGH, "2"),
        ),
        pending=(Resize("neighbour", "4"),),
        resizes=(Resize("high", "4"),),
        expected={"ours": ("low-b",), "upstream": ("low-a", "low-b")},
    )


def infeasible() -> Scenario:
    # high 4->7 next to an equal-priority 3 CPU peer: 7 + 3 > 8 even with the low pod gone.
    return Scenario(
        "infeasible",
        "high 4->7 CPU next to an equal-priority 3 CPU peer and a low 1 CPU pod",
        pods=(
            _pod("low", LOW, "1"),
            _pod("peer", HIGH, "3"),
            _pod("high", HIGH, "4"),
        ),
        resizes=(Resize("high", "7"),),
        actuates=False,
        expected={"ours": (), "upstream": ()},
    )


def preemption_never() -> Scenario:
    return Scenario(
        "preemption-never",
        "the walkthrough with the high pod's PriorityClass preemptionPolicy: Never",
        pods=(_pod("low", LOW, "3"), _pod("high", HIGH, "4", never=True)),
        resizes=(Resize("high", "6"),),
        actuates=False,
        expected={"ours": (), "upstream": ()},
    )


def node_opt_out() -> Scenario:
    return Scenario(
        "node-opt-out",
        "the walkthrough on a node that opted out of resize preemption",
        pods=(_pod("low", LOW, "3"), _pod("high", HIGH, "4")),
        resizes=(Resize("high", "6"),),
        opt_out=True,
        actuates=False,
        expected={"ours": (), "upstream": ()},
    )


def move_dont_lose() -> Scenario:
    # Issue 27. node 0 (8 CPU) is full: high 4 -> 6 needs one of two equal-priority 2 CPU
    # pods to go. "replicated" (a ReplicaSet's, started first) and "bare" (no controller,
    # started later). kube-scheduler takes the later start time: bare, whose work is lost.
    # Ours, with --victim-order movable-first: replicated's ReplicaSet can recreate it on
    # node 1 (8 CPU free), so it goes first; its replacement is bound to node 1.
    return Scenario(
        "move-dont-lose",
        "high 4->6 CPU; equal-priority low pods, a ReplicaSet's (older) and a bare one "
        "(newer), a second node with room",
        pods=(
            _pod("replicated", LOW, "2", replicaset=True),
            _pod("bare", LOW, "2"),
            _pod("high", HIGH, "4"),
        ),
        nodes=2,
        resizes=(Resize("high", "6"),),
        expected={"ours": ("replicated",), "upstream": ("bare",)},
        lost={"ours": (), "upstream": ("bare",)},
    )


def lending() -> Scenario:
    # The walkthrough with low-priority-pod's owner allowing it to shrink to 1 CPU: we
    # borrow the 1 CPU missing (3 -> 2) and evict nobody. kube-scheduler knows no floors
    # and evicts it, as in the walkthrough. Measured with the victims' whole grace period
    # (--victim-grace 30), against the walkthrough's eviction on our side.
    return Scenario(
        "lending",
        "the walkthrough with low-priority-pod annotated with a floor of 1 CPU",
        pods=(
            _pod(
                "low-priority-pod",
                LOW,
                "3",
                annotations={FLOOR_ANNOTATION: json.dumps({"app": {"cpu": "1"}})},
            ),
            _pod("high-priority-pod", HIGH, "4"),
        ),
        resizes=(Resize("high-priority-pod", "6"),),
        expected={"ours": (), "upstream": ("low-priority-pod",)},
    )


def lending_scenarios() -> list[Scenario]:
    """Where we lend and kube-scheduler evicts: not victim scenarios (the victims differ
    by design), timed against the walkthrough's evictions."""
    return [lending()]


def scale(nodes: int = 50, pods_per_node: int = 30, concurrent: int = 20) -> Scenario:
    """``nodes`` x ``pods_per_node`` pods; ``concurrent`` high pods (one per node) grow at
    once. Per node: high 1 CPU + (pods_per_node - 1) lows of 240m with distinct priorities
    100, 101, ... (so no start-time tie decides anything); growing to 2 CPU frees nothing
    by itself and needs 4 lows (the 4 lowest priorities) to go."""
    if concurrent > nodes:
        raise ValueError("at most one resize per node")
    lows = pods_per_node - 1
    pods: list[PodSpec] = []
    for n in range(nodes):
        pods.append(_pod(f"n{n:02d}-high", HIGH, "1", node=n))
        pods.extend(_pod(f"n{n:02d}-low{j:02d}", 100 + j, "240m", node=n) for j in range(lows))
    victims_per_node = tuple(f"low{j:02d}" for j in range(4)) if lows >= 4 else ()
    expected = tuple(f"n{n:02d}-{v}" for n in range(concurrent) for v in victims_per_node)
    return Scenario(
        f"scale-{nodes}x{pods_per_node}-{concurrent}",
        f"{nodes} nodes x {pods_per_node} pods, {concurrent} concurrent resizes 1->2 CPU",
        pods=tuple(pods),
        resizes=tuple(Resize(f"n{n:02d}-high", "2") for n in range(concurrent)),
        nodes=nodes,
        distinct_start_times=False,
        expected={"ours": expected, "upstream": expected},
        victim_relevant=False,
    )


def victim_scenarios() -> list[Scenario]:
    """Every small scenario (the ones the end-to-end test asserts)."""
    return [
        walkthrough(),
        mixed_priorities(),
        pdb_choice(),
        pdb_only(),
        pending_neighbour(),
        infeasible(),
        preemption_never(),
        node_opt_out(),
        move_dont_lose(),
    ]


def all_scenarios(
    *, nodes: int = 50, pods_per_node: int = 30, concurrent: int = 20, with_scale: bool = True
) -> list[Scenario]:
    small = [*victim_scenarios(), *lending_scenarios()]
    return [*small, scale(nodes, pods_per_node, concurrent)] if with_scale else small
