"""The decision: for this resize of this pod on its node, who (if anyone) must go.

``plan_resize`` is a fixed algorithm after kube-scheduler's DefaultPreemption
``SelectVictimsOnNode`` (which KEP-5836 reuses for resizes) with the kubelet's fit model;
:class:`~webhook.core.policy.PreemptionPolicy` supplies the tunable parts. It is pure:
same inputs, same :class:`Plan`, whatever order the pods come in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from webhook.core.accounting import pod_requests
from webhook.core.disruption import split_by_violation
from webhook.core.headroom import NodeUsage, node_usage
from webhook.core.model import TERMINAL_PHASES, DisruptionBudget, Node, Pod, PodRef
from webhook.core.nodepods import Candidates, NodePods
from webhook.core.policy import DefaultPolicy, PreemptionPolicy
from webhook.core.reservation import Reservation, active_on
from webhook.core.resources import (
    ZERO,
    ResourceName,
    Resources,
    amounts_text,
    format_amount,
    tuple_new,
)

Verdict = Literal["fits", "preempt", "infeasible", "not-eligible"]
ReasonCode = Literal[
    "fits",
    "fits-once-terminated",
    "preempt",
    "exceeds-allocatable",
    "insufficient-after-preemption",
    "pdb-violation",
    "too-many-victims",
    "preemption-policy-never",
    "node-opted-out",
    "no-growth",
    "not-bound",
]


class ResourceFigures(NamedTuple):
    """One resource's numbers for the messages a person reads (a tuple, as the other
    small values a decision builds: see :class:`~webhook.core.resources.Resources`)."""

    requested: int  # the resizing pod's new requests
    in_use: int  # held by every other pod and by reservations
    freeing: int  # part of in_use already on its way out
    allocatable: int
    shortfall: int  # missing before preemption, counting what is freeing as free
    unmet: int = 0  # still missing after the plan's victims (infeasible plans)


class Victim(NamedTuple):
    pod: PodRef
    priority: int
    frees: Resources
    violates_pdb: bool = False


@dataclass(frozen=True, slots=True)
class Plan:
    """A frozen verdict for one resize; executors carry it out, never change it."""

    pod: PodRef
    node: str
    verdict: Verdict
    code: ReasonCode
    reason: str
    requested: Resources = ZERO
    victims: tuple[Victim, ...] = ()  # in eviction order, least important first
    figures: Mapping[ResourceName, ResourceFigures] | None = None
    waiting_for: tuple[PodRef, ...] = ()  # terminating or already-claimed pods

    @property
    def victim_keys(self) -> tuple[str, ...]:
        return tuple([v.pod.key for v in self.victims])

    @property
    def shortfall(self) -> Resources:
        """What preemption must free (``fits``: zero)."""
        f = self.figures or {}
        return tuple_new(
            Resources,
            (
                f["cpu"].shortfall if "cpu" in f else 0,
                f["memory"].shortfall if "memory" in f else 0,
            ),
        )

    @property
    def unmet(self) -> Resources:
        """What is missing even after the plan (non-zero only for infeasible plans)."""
        f = self.figures or {}
        return tuple_new(
            Resources,
            (f["cpu"].unmet if "cpu" in f else 0, f["memory"].unmet if "memory" in f else 0),
        )

    def with_victims(self, victims: tuple[Victim, ...]) -> Plan:
        return replace(self, victims=victims)


def shortfall(demand: Resources, used: Resources, allocatable: Resources) -> Resources:
    """What ``demand`` lacks on a node with ``used`` of ``allocatable`` taken.

    As the scheduler's and kubelet's fit checks, only resources the pod requests are
    checked: a pod asking for no memory fits an overcommitted node's memory.
    """
    # On plain integers: every decision computes it a few times.
    cpu = demand.cpu + used.cpu - allocatable.cpu if demand.cpu else 0
    memory = demand.memory + used.memory - allocatable.memory if demand.memory else 0
    return tuple_new(Resources, (cpu if cpu > 0 else 0, memory if memory > 0 else 0))


def _fits(demand: Resources, used: Resources, allocatable: Resources) -> bool:
    """``shortfall(demand, used, allocatable).is_zero()``, without building amounts."""
    return (not demand.cpu or demand.cpu + used.cpu <= allocatable.cpu) and (
        not demand.memory or demand.memory + used.memory <= allocatable.memory
    )


def _grows(demand: Resources, current: Resources) -> bool:
    return demand.cpu > current.cpu or demand.memory > current.memory


class _Context(NamedTuple):
    preemptor: Pod
    node: Node
    demand: Resources
    usage: NodeUsage

    def figures(
        self, unmet: Resources = ZERO, short: Resources | None = None
    ) -> dict[ResourceName, ResourceFigures]:
        """The figures of a plan; ``short`` is step 2's shortfall, when it was reached."""
        u, demand = self.usage, self.demand
        in_use, freeing, allocatable = u.in_use, u.freeing, u.allocatable
        if short is None:
            short = shortfall(demand, in_use - freeing, allocatable)
        # In ResourceFigures' field order: requested, in use, freeing, allocatable,
        # shortfall, unmet.
        return {
            "cpu": tuple_new(
                ResourceFigures,
                (demand.cpu, in_use.cpu, freeing.cpu, allocatable.cpu, short.cpu, unmet.cpu),
            ),
            "memory": tuple_new(
                ResourceFigures,
                (
                    demand.memory,
                    in_use.memory,
                    freeing.memory,
                    allocatable.memory,
                    short.memory,
                    unmet.memory,
                ),
            ),
        }

    def plan(
        self,
        verdict: Verdict,
        code: ReasonCode,
        reason: str,
        victims: tuple[Victim, ...] = (),
        unmet: Resources = ZERO,
        short: Resources | None = None,
    ) -> Plan:
        return Plan(
            pod=self.preemptor.ref,
            node=self.node.name,
            verdict=verdict,
            code=code,
            reason=reason,
            requested=self.demand,
            victims=victims,
            figures=self.figures(unmet, short),
            waiting_for=self.usage.waiting_for,
        )


def _candidates(
    new: Pod,
    pods: Sequence[Pod],
    node: str,
    claimed: set[str],
    policy: PreemptionPolicy,
    now: float,
    index: NodePods | None,
) -> list[Pod]:
    """Step 4 the long way: pods of lower priority than ``new`` bound to ``node``, not
    terminal, terminating, mirror or ``claimed``, that ``policy`` lets it preempt; most
    important first."""
    priority, uid, may_preempt = new.priority, new.uid, policy.may_preempt
    importance = policy.importance
    # The index ranks pods by the default importance; another ranking sorts here.
    if index is not None and type(policy).importance is DefaultPolicy.importance:
        # Already bound here, not terminal, terminating or mirror, and in order.
        candidates = [
            p
            for p in index.ranked_below(priority)
            if p.uid != uid and p.uid not in claimed and may_preempt(p, new)
        ]
        late = [
            p
            for p in index.unstarted
            if p.priority < priority
            and p.uid != uid
            and p.uid not in claimed
            and may_preempt(p, new)
        ]
        if late:
            candidates += late
            candidates.sort(key=lambda p: importance(p, now))
        return candidates
    candidates = [
        p
        for p in pods
        if p.priority < priority
        and p.node == node
        and p.uid != uid
        and p.phase not in TERMINAL_PHASES
        and not p.terminating
        and not p.mirror
        and p.uid not in claimed
        and may_preempt(p, new)
    ]
    candidates.sort(key=lambda p: importance(p, now))
    return candidates


def plan_resize(
    old: Pod,
    new: Pod,
    node: Node,
    pods: Sequence[Pod],
    *,
    now: float,
    budgets: Sequence[DisruptionBudget] = (),
    reservations: Iterable[Reservation] = (),
    policy: PreemptionPolicy | None = None,
    index: NodePods | None = None,
) -> Plan:
    """Decide what the resize of ``old`` into ``new`` needs on ``node``.

    Contract:
    * ``old`` is the pod as stored (with the kubelet's status); ``new`` the pod with the
      desired resources (for a resize already persisted, ``new`` may equal ``old``);
    * ``pods`` are the pods bound to ``node`` (the resizing pod may be among them; pods
      bound elsewhere are ignored, so victims are never on another node);
    * ``reservations`` may hold any node's; only active ones on ``node`` of other pods count;
    * the result never names a victim with priority >= the resizing pod's, a mirror pod,
      a terminating pod, or a pod another admitted resize already claimed; it has no
      victims unless its verdict is ``preempt``; and without its victims the resize fits
      while keeping any one of them it does not.

    ``index``, if given, must be ``NodePods(node.name, pods)`` (``pods`` the same tuple):
    the plan is the same, made without walking, ranking and matching every pod again.
    """
    policy = policy or DefaultPolicy()
    if index is not None and (index.pods is not pods or index.node != node.name or not index.exact):
        index = None
    # Step 0: the pod's demand under the kubelet's model. An infeasible resize that this
    # request does not change keeps being ignored, as the kubelet ignores it.
    stale_infeasible = old.resize == "infeasible" and new.same_declared_resources(old)
    demand = pod_requests(new, "infeasible" if stale_infeasible else "resizing")
    held_now = pod_requests(old, "other")
    reserved = active_on(reservations, node.name, now, exclude_pod=new.uid)
    usage = node_usage(node, pods, reserved, exclude_uid=new.uid, index=index)
    ctx = tuple_new(_Context, (new, node, demand, usage))
    name = node.name

    # Step 1: requests that can never fit, or need nothing.
    if not new.node:
        return ctx.plan("not-eligible", "not-bound", "pod is not bound to a node")
    if not _grows(demand, held_now):
        return ctx.plan(
            "fits",
            "no-growth",
            f"resize does not grow cpu or memory beyond what {name} already holds for it",
        )
    too_big = demand.exceeds_in(node.allocatable)
    if too_big:
        detail = ", ".join(
            f"{n} {format_amount(n, demand.get(n))} > {format_amount(n, node.allocatable.get(n))}"
            for n in too_big
        )
        return ctx.plan(
            "infeasible", "exceeds-allocatable", f"requests exceed {name} allocatable: {detail}"
        )

    # Step 2: fits already, possibly once pods already leaving have gone.
    projected = usage.in_use - usage.freeing
    if _fits(demand, projected, node.allocatable):
        if _fits(demand, usage.in_use, node.allocatable):
            return ctx.plan("fits", "fits", f"fits on {name} without preemption")
        count = len(usage.waiting_for)
        return ctx.plan(
            "fits",
            "fits-once-terminated",
            f"fits on {name} once {count} pod{'s' if count != 1 else ''} already leaving "
            f"{'have' if count != 1 else 'has'} gone",
        )
    short = shortfall(demand, projected, node.allocatable)

    # Step 3: the pod or node does not allow preemption for it.
    if new.preemption_policy == "Never":
        return ctx.plan(
            "not-eligible",
            "preemption-policy-never",
            f"preemptionPolicy is Never; {amounts_text(short, ' short by ')} on {name}",
            short=short,
        )
    if node.resize_preemption_disabled or new.resize_preemption_disabled:
        return ctx.plan(
            "not-eligible",
            "node-opted-out",
            f"{name} opted out of resize preemption",
            short=short,
        )

    # Step 4: candidates - strictly lower priority, removable, not already leaving.
    # Under the default policy, with no reservation touching the node's pods, the index
    # keeps steps 4 and 6 done for the preemptor's priority.
    claimed = {uid for r in reserved.values() for uid in r.victims}
    chain = None
    if (
        index is not None
        and isinstance(policy, DefaultPolicy)
        and type(policy) is DefaultPolicy
        and not claimed
    ):
        chain = index.candidates(
            new.priority, policy.protected_namespaces, budgets, policy.pdb_mode
        )
        # A candidate's reservation changes what it frees; and a pod is never its own
        # candidate (the index may hold it at another priority than the review says).
        if chain is not None and (
            new.uid in chain.uids or any(uid in chain.uids for uid in reserved)
        ):
            chain = None
    if chain is None:
        candidates = _candidates(new, pods, name, claimed, policy, now, index)
        held = usage.held
        coverage = index.coverage(budgets, policy.pdb_mode) if index is not None else None
        # Step 6 (split by PodDisruptionBudget violation) is done here too.
        chain = Candidates.build(
            candidates,
            [held.get(p.uid, ZERO) for p in candidates],
            budgets,
            policy.pdb_mode,
            coverage,
        )

    # Step 5: remove them all; if the resize still does not fit, preempt nobody.
    used = projected - chain.total
    if not _fits(demand, used, node.allocatable):
        unmet = shortfall(demand, used, node.allocatable)
        return ctx.plan(
            "infeasible",
            "insufficient-after-preemption",
            f"cannot fit on {name} even after preempting every lower-priority pod: "
            f"{amounts_text(unmet, ' short by ')}",
            unmet=unmet,
            short=short,
        )

    # Step 6: most important first, then split by PodDisruptionBudget violation: done
    # with the candidates (``chain.order``).

    # Step 7: reprieve - add back violating pods first, then the rest, each in importance
    # order; a pod that no longer lets the resize fit becomes a victim. Only resources the
    # pod requests are checked (see :func:`shortfall`): room left is allocatable - used.
    chosen = chain.reprieve(
        used.cpu,
        used.memory,
        node.allocatable.cpu - demand.cpu if demand.cpu else None,
        node.allocatable.memory - demand.memory if demand.memory else None,
    )

    # Step 8: evict the least important first. Which victims overspend a budget is
    # decided on the victims themselves, in that order, as the Eviction API will meet
    # them: the split above counted every candidate, including more important pods of
    # the same budget that the reprieve kept and that so spend no disruption.
    chosen.sort(reverse=True)
    leaving = [chain.pods[i] for i in chosen]
    over: set[str] = set()
    if leaving and budgets:
        coverage = index.coverage(budgets, policy.pdb_mode) if index is not None else None
        over = {
            p.uid
            for p in split_by_violation(leaving, budgets, policy.pdb_mode, coverage=coverage)[0]
        }
    victims = [
        tuple_new(Victim, (p.ref, p.priority, chain.amounts[i], p.uid in over))
        for i, p in zip(chosen, leaving, strict=True)
    ]

    # Step 9: limits the policy sets.
    blocked = [v for v in victims if v.violates_pdb]
    if blocked and policy.pdb_mode == "respect":
        return ctx.plan(
            "infeasible",
            "pdb-violation",
            f"cannot fit on {name} without violating a PodDisruptionBudget of "
            + ", ".join(v.pod.key for v in blocked),
            unmet=short,
            short=short,
        )
    limit = policy.max_victims
    if limit is not None and len(victims) > limit:
        return ctx.plan(
            "infeasible",
            "too-many-victims",
            f"would need {len(victims)} victims on {name}, more than the limit of {limit}",
            unmet=short,
            short=short,
        )

    count = len(victims)
    return ctx.plan(
        "preempt",
        "preempt",
        f"preempting {count} lower-priority pod{'s' if count != 1 else ''} on {name} "
        f"to free {amounts_text(short)}",
        victims=tuple(victims),
        short=short,
    )
