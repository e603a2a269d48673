"""The largest resize that fits: what the mutating endpoint shrinks an unfittable resize to.

Only the growth is cut back, container by container from the last one, never below what
the container holds now; a container whose request equalled its limit keeps them equal,
so a Guaranteed pod stays Guaranteed and no QoS class changes. The result is checked with
:func:`~webhook.core.plan.plan_resize` itself, so it never promises what the validating
path would refuse.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from webhook.core.accounting import Reservation, active_on, container_held, node_usage, pod_requests
from webhook.core.model import DisruptionBudget, Pod
from webhook.core.plan import NodeView, Plan, candidates_of, plan_resize
from webhook.core.policy import DefaultPolicy, PreemptionPolicy
from webhook.core.resources import RESOURCE_NAMES, ResourceName, Resources, total

_INFEASIBLE_CODES = frozenset({"exceeds-allocatable", "insufficient-after-preemption"})


def _room(
    new: Pod,
    view: NodeView,
    reservations: Iterable[Reservation],
    now: float,
    policy: PreemptionPolicy,
) -> Resources:
    """The most the pod may need: allocatable minus what stays even if every pod it may
    preempt goes."""
    node, pods = view.node, view.pods
    reserved = active_on(reservations, node.name, now, exclude_pod=new.uid)
    usage = node_usage(node, pods, reserved, exclude_uid=new.uid, kept=view.holdings())
    claimed = frozenset(uid for r in reserved.values() for uid in r.victims)
    removable = total(
        usage.held[p.uid] for p in candidates_of(new, node.name, pods, claimed, policy)
    )
    stays = usage.in_use - usage.freeing - removable
    return (node.allocatable - stays).clamp()


def _shrink(new: Pod, name: ResourceName, excess: int) -> Pod | None:
    """Cut ``excess`` of resource ``name`` from the containers' growth, last first."""
    containers = list(new.containers)
    for i in range(len(containers) - 1, -1, -1):
        if excess <= 0:
            break
        c = containers[i]
        held = container_held(new, c).get(name)
        growth = c.requests.get(name) - held
        if growth <= 0:
            continue
        cut = min(growth, excess)
        wanted = c.requests.get(name) - cut
        limits = c.limits
        if c.limits.get(name) == c.requests.get(name):
            limits = limits.replace(name, wanted)
        containers[i] = replace(c, requests=c.requests.replace(name, wanted), limits=limits)
        excess -= cut
    if excess > 0:
        return None
    return new.with_containers(tuple(containers), new.init_containers)


def largest_fit(
    old: Pod,
    new: Pod,
    view: NodeView,
    *,
    now: float,
    budgets: Sequence[DisruptionBudget] = (),
    reservations: Sequence[Reservation] = (),
    policy: PreemptionPolicy | None = None,
) -> tuple[Pod, Plan] | None:
    """``new`` reduced to the largest resize that can fit, with its plan; ``None`` when
    the resize is not infeasible, or when no smaller growth fits either. ``view`` is
    the node and its pods, as :func:`~webhook.core.plan.plan_resize` takes them."""
    policy = policy or DefaultPolicy()
    plan = plan_resize(
        old, new, view, now=now, budgets=budgets, reservations=reservations, policy=policy
    )
    if plan.verdict != "infeasible" or plan.code not in _INFEASIBLE_CODES:
        return None
    room = _room(new, view, reservations, now, policy).max(pod_requests(old, "other"))
    candidate: Pod | None = new
    for name in RESOURCE_NAMES:
        if candidate is None:
            return None
        excess = pod_requests(candidate, "resizing").get(name) - room.get(name)
        if excess > 0:
            candidate = _shrink(candidate, name, excess)
    if candidate is None or candidate.same_declared_resources(old):
        return None
    reduced = plan_resize(
        old,
        candidate,
        view,
        now=now,
        budgets=budgets,
        reservations=reservations,
        policy=policy,
    )
    if reduced.verdict not in ("fits", "preempt"):
        return None
    return candidate, reduced
