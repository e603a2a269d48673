"""The decision: for this resize of this pod on its node, who (if anyone) must go.

:func:`plan_resize` walks fixed, numbered steps; its victim selection,
:func:`select_victims`, is kube-scheduler's DefaultPreemption ``SelectVictimsOnNode``
(which KEP-5836 reuses for resizes) on the kubelet's fit model, with lending: pods that
opted in shrink in place to their floors before anyone is evicted
(:mod:`webhook.core.lending`, docs/lending.md).
:class:`~webhook.core.policy.PreemptionPolicy` supplies the tunable parts. It is pure:
same inputs, same :class:`Plan`, whatever order the pods come in.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import groupby
from typing import Literal, NamedTuple, Protocol

from webhook.core import accounting
from webhook.core.accounting import (
    Holdings,
    NodeUsage,
    Reservation,
    active_on,
    node_usage,
    pod_requests,
)
from webhook.core.checkpoint import Pause
from webhook.core.lending import Loan, borrow, room
from webhook.core.model import DisruptionBudget, Node, Pod, PodRef
from webhook.core.movable import Move, Room, claim, movable_among
from webhook.core.policy import (
    DefaultPolicy,
    PreemptionPolicy,
    Ranking,
    movable_first,
    rank,
    split_by_violation,
)
from webhook.core.resources import (
    RESOURCE_NAMES,
    ZERO,
    ResourceName,
    Resources,
    amounts_text,
    format_amount,
    total,
)

Verdict = Literal["fits", "preempt", "infeasible", "not-eligible"]
ReasonCode = Literal[
    "fits",
    "fits-once-terminated",
    "preempt",
    "lend",
    "exceeds-allocatable",
    "insufficient-after-preemption",
    "pdb-violation",
    "too-many-victims",
    "preemption-policy-never",
    "preemptor-not-allowed",
    "node-opted-out",
    "no-growth",
    "not-bound",
    "admitted",
]


@dataclass(frozen=True, slots=True)
class ResourceFigures:
    """One resource's numbers for the messages a person reads."""

    requested: int  # the resizing pod's new requests
    in_use: int  # held by every other pod and by reservations
    freeing: int  # part of in_use already on its way out
    allocatable: int
    shortfall: int  # missing before preemption, counting what is freeing as free
    unmet: int = 0  # still missing after the plan's victims (infeasible plans)


@dataclass(frozen=True, slots=True)
class Victim:
    pod: PodRef
    priority: int
    frees: Resources
    violates_pdb: bool = False
    #: Whether its work moves to another node (victim order ``movable-first``); ``None``
    #: when not judged (victim order ``upstream``).
    move: Move | None = None
    #: Whether it is checkpointed before it goes (:func:`~webhook.core.checkpoint.pause_of`);
    #: ``None`` when it did not opt in.
    pause: Pause | None = None


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
    loans: tuple[Loan, ...] = ()  # in the order taken, least important lender first
    #: Candidates whose floor annotation is malformed, with why: they lent nothing.
    floor_errors: tuple[tuple[PodRef, str], ...] = ()

    @property
    def victim_keys(self) -> tuple[str, ...]:
        return tuple(v.pod.key for v in self.victims)

    @property
    def moves(self) -> tuple[tuple[str, Resources], ...]:
        """Room on other nodes the movable victims' replacements count on: (node, what
        the replacement asks for), in eviction order."""
        return tuple((v.move.node, v.move.needs) for v in self.victims if v.move and v.move.movable)

    @property
    def lender_keys(self) -> tuple[str, ...]:
        """The lenders, each once, in the order their loans were taken."""
        return lender_keys(self.loans)

    @property
    def lent(self) -> Resources:
        """What the loans free together."""
        return lent(self.loans)

    @property
    def shortfall(self) -> Resources:
        """What preemption must free (``fits``: zero)."""
        f = self.figures or {}
        return Resources(*(f[n].shortfall if n in f else 0 for n in RESOURCE_NAMES))

    @property
    def unmet(self) -> Resources:
        """What is missing even after the plan (non-zero only for infeasible plans)."""
        f = self.figures or {}
        return Resources(*(f[n].unmet if n in f else 0 for n in RESOURCE_NAMES))


def lender_keys(loans: Iterable[Loan]) -> tuple[str, ...]:
    """The pods ``loans`` borrow from, each once, in the order given."""
    return tuple(dict.fromkeys(loan.pod.key for loan in loans))


def lent(loans: Iterable[Loan]) -> Resources:
    """What ``loans`` free together."""
    freed = ZERO
    for loan in loans:
        freed = freed.replace(loan.resource, freed.get(loan.resource) + loan.frees)
    return freed


def shortfall(demand: Resources, used: Resources, allocatable: Resources) -> Resources:
    """What ``demand`` lacks on a node with ``used`` of ``allocatable`` taken.

    As the scheduler's and kubelet's fit checks, only resources the pod requests are
    checked: a pod asking for no memory fits an overcommitted node's memory.
    """
    missing = (demand + used - allocatable).clamp()
    return Resources(missing.cpu if demand.cpu else 0, missing.memory if demand.memory else 0)


def most_held(demand: Resources, allocatable: Resources) -> tuple[float, float]:
    """The most cpu and memory a node may hold beside ``demand`` for it to fit: a resource
    ``demand`` does not ask for has no bound (see :func:`shortfall`)."""
    return (
        allocatable.cpu - demand.cpu if demand.cpu else math.inf,
        allocatable.memory - demand.memory if demand.memory else math.inf,
    )


def fits(demand: Resources, used: Resources, allocatable: Resources) -> bool:
    """True when :func:`shortfall` is zero: ``demand`` fits next to ``used``."""
    most_cpu, most_memory = most_held(demand, allocatable)
    return used.cpu <= most_cpu and used.memory <= most_memory


@dataclass(frozen=True, slots=True)
class Selection:
    """What :func:`select_victims` found: victims in eviction order and loans, or
    (``unmet`` non-zero) that even every candidate would not make room."""

    victims: tuple[Victim, ...] = ()
    unmet: Resources = ZERO
    loans: tuple[Loan, ...] = ()
    floor_errors: tuple[tuple[PodRef, str], ...] = ()


def _borrow(lenders: Iterable[Pod], needed: Resources, limits: bool) -> tuple[Loan, ...]:
    """Loans covering ``needed``, taken from ``lenders`` in the order given, each lender
    lending only what is still needed after the ones before it (``limits``: the policy's
    ``lend_memory_limits``)."""
    loans: list[Loan] = []
    for pod in lenders:
        if needed.is_zero():
            break
        taken, freed = borrow(pod, needed, limits=limits)
        loans += taken
        needed = (needed - freed).clamp()
    return tuple(loans)


def _lenders(
    candidates: Sequence[Pod],
    usage: NodeUsage,
    reserved: frozenset[str],
    policy: PreemptionPolicy,
) -> tuple[dict[str, Resources], tuple[tuple[PodRef, str], ...]]:
    """What each candidate that lends holds once it lends every floor, by uid, and the
    candidates whose floor annotation is malformed (they lend nothing and are named in
    the plan). A pod that holds nothing (never admitted) has nothing to lend; one
    holding a reservation of its own (``reserved``) keeps its size for its own resize."""
    annotated = [p for p in candidates if p.floors or p.floor_error] if policy.lending else []
    floor_errors = tuple((p.ref, p.floor_error) for p in annotated if p.floor_error)
    at_floor: dict[str, Resources] = {}
    for p in annotated:
        lendable = room(p, limits=policy.lend_memory_limits)
        if p.uid not in reserved and not usage.held[p.uid].is_zero() and not lendable.is_zero():
            at_floor[p.uid] = usage.held[p.uid] - lendable
    return at_floor, floor_errors


def candidates_of(
    preemptor: Pod,
    node: str,
    pods: Iterable[Pod],
    claimed: frozenset[str],
    policy: PreemptionPolicy,
) -> list[Pod]:
    """Step 1 of victim selection: the pods that may be victims of ``preemptor``'s resize
    on ``node``, in the order of ``pods`` (the ranking's, for step 3).

    Strictly lower priority (equal priority never preempts), bound to the node, not the
    preemptor itself, and removable: not finished, not already terminating (the room it
    frees is on its way), not a mirror pod (the API cannot delete it), not claimed by
    another admitted resize. The policy may rule out more.
    """
    # One comprehension rather than a predicate called per pod: this runs over every pod
    # of the node in each review.
    priority, uid = preemptor.priority, preemptor.uid
    return [
        p
        for p in pods
        if p.priority < priority
        and p.node == node
        and p.uid != uid
        and not (p.leaving or p.mirror)
        and p.uid not in claimed
        and policy.may_preempt(p, preemptor)
    ]


class Cleared(NamedTuple):
    """The node with every candidate removed (step 2 of victim selection), and what the
    lenders hold at their floors: the same whatever order the candidates come in."""

    demand: Resources
    allocatable: Resources
    #: What the node holds without the candidates, less what is already leaving.
    used: Resources
    #: What is still missing then: non-zero means nobody is preempted.
    unmet: Resources
    #: What each candidate holds now, by uid.
    held: Mapping[str, Resources]
    #: What each lender holds once it lends every floor, by uid.
    at_floor: Mapping[str, Resources]
    floor_errors: tuple[tuple[PodRef, str], ...]
    #: A Guaranteed lender's memory lends too (the policy's ``lend_memory_limits``).
    limits: bool = False


def clear_node(
    candidates: Sequence[Pod],
    demand: Resources,
    node: Node,
    usage: NodeUsage,
    policy: PreemptionPolicy,
    reserved: frozenset[str] = frozenset(),
) -> Cleared:
    """Step 2 of victim selection: remove every candidate (:func:`candidates_of`) from a
    node used as ``usage`` says; what is already leaving counts as gone. Lenders are
    candidates with floors, when the policy lends, other than pods holding a reservation
    of their own (``reserved``: their size is promised to their own resize)."""
    used = usage.in_use - usage.freeing - total(usage.held[p.uid] for p in candidates)
    at_floor, floor_errors = _lenders(candidates, usage, reserved, policy)
    return Cleared(
        demand,
        node.allocatable,
        used,
        shortfall(demand, used, node.allocatable),
        usage.held,
        at_floor,
        floor_errors,
        policy.lend_memory_limits,
    )


def select_victims(
    candidates: Sequence[Pod], ranking: Ranking, cleared: Cleared, keep_above: int | None = None
) -> Selection:
    """Upstream ``SelectVictimsOnNode``, with lending (steps 5 and 6), on the node as
    :func:`clear_node` left it for the same ``candidates``. ``ranking`` is
    :func:`~webhook.core.policy.rank` of the node's pods and budgets under the policy;
    ``candidates`` are step 1's (:func:`candidates_of`) in its order.

    The result is locally minimal: without its victims, and with its loans, the resize
    fits; keeping any single victim it does not, even with every kept lender at its
    floors. Loans free no more than the resize is short of.

    ``keep_above``, when given, is a priority no victim may have: when the reprieve
    would make a victim of a pod above it, the selection is refused (``unmet`` is the
    whole demand).
    """
    # 1. Candidates: see is_candidate, in the ranking's order, which is step 3's.

    # 2. Remove every candidate (clear_node); if the resize still does not fit, preempt
    #    nobody.
    if not cleared.unmet.is_zero():
        return Selection(unmet=cleared.unmet)
    demand, allocatable, used, held, at_floor = (
        cleared.demand, cleared.allocatable, cleared.used, cleared.held, cleared.at_floor
    )  # fmt: skip

    # 3. Most important first (MoreImportantPod, made a total order by the policy): the
    #    candidates are in the ranking's order already.

    # 4. Split by PodDisruptionBudget violation, walking in that order.
    violating, other = split_by_violation(candidates, ranking.budgets, ranking.spends)

    # 5. Reprieve: add back the violating pods first, then the others, each in importance
    #    order; a pod whose return would make the resize not fit becomes a victim. A
    #    lender comes back at its floors, so when lending alone covers the shortfall
    #    every pod comes back and nobody is evicted.
    comes_back = {**held, **at_floor} if at_floor else held
    reprieved = _reprieve(violating + other, cleared, comes_back, keep_above)
    if reprieved is None:
        return Selection(unmet=demand)
    used, leaving = reprieved

    # 6. Loans: what is still missing with the kept lenders at their full size, borrowed
    #    from them least important first, each only as much as is still needed.
    loans: tuple[Loan, ...] = ()
    if at_floor:
        gone = {p.uid for p in leaving}
        kept = [p for p in reversed(candidates) if p.uid in at_floor and p.uid not in gone]
        whole = used + total(held[p.uid] - at_floor[p.uid] for p in kept)
        loans = _borrow(kept, shortfall(demand, whole, allocatable), cleared.limits)

    # 7. Evicted least important first. Which victims overspend a budget is decided on the
    # victims themselves, in that order, as the Eviction API will meet them: step 4
    # counted every candidate, also more important pods the reprieve kept.
    leaving.sort(key=lambda p: ranking.place[p.uid], reverse=True)
    over = {p.uid for p in split_by_violation(leaving, ranking.budgets, ranking.spends)[0]}
    return Selection(
        tuple(Victim(p.ref, p.priority, held[p.uid], p.uid in over) for p in leaving),
        loans=loans,
        floor_errors=cleared.floor_errors,
    )


def _reprieve(
    walk: Sequence[Pod],
    cleared: Cleared,
    comes_back: Mapping[str, Resources],
    keep_above: int | None,
) -> tuple[Resources, list[Pod]] | None:
    """Step 5 of :func:`select_victims`: ``walk``'s pods added back in order onto the
    cleared node, each that would make the resize not fit left out; what the node then
    holds and the pods left out. ``None`` when one of a priority above ``keep_above``
    would be left out.

    Pods above ``keep_above`` come back a run at a time, checked once: what the node
    holds only grows as pods come back, so the whole run fits or one of its pods
    would not."""
    demand, allocatable, used = cleared.demand, cleared.allocatable, cleared.used
    leaving: list[Pod] = []
    # Runs of pods that must come back (True) or may be left out (False); upstream's
    # walk is one run of the latter.
    runs: Iterable[tuple[bool, Iterable[Pod]]] = (
        ((False, walk),)
        if keep_above is None
        else groupby(walk, key=lambda pod: pod.priority > keep_above)
    )
    # The walk meets every candidate in each review, so it keeps what the node holds as
    # two integers against fits' bounds rather than building a Resources per pod.
    most_cpu, most_memory = most_held(demand, allocatable)
    cpu, memory = used.cpu, used.memory
    for kept, run in runs:
        if kept:
            back = total(comes_back[p.uid] for p in run)
            cpu, memory = cpu + back.cpu, memory + back.memory
            if cpu > most_cpu or memory > most_memory:
                return None
            continue
        for pod in run:
            back = comes_back[pod.uid]
            if cpu + back.cpu <= most_cpu and memory + back.memory <= most_memory:
                cpu, memory = cpu + back.cpu, memory + back.memory
            else:
                leaving.append(pod)
    return Resources(cpu, memory), leaving


def _no_worse(chosen: Selection, upstream: Selection) -> bool:
    """Whether ``chosen`` evicts no more pods than ``upstream``, none of higher priority,
    and no more that overspend a PodDisruptionBudget."""
    a, b = chosen.victims, upstream.victims
    return (
        chosen.unmet.is_zero()
        and len(a) <= len(b)
        and max((v.priority for v in a), default=0) <= max((v.priority for v in b), default=0)
        and sum(v.violates_pdb for v in a) <= sum(v.violates_pdb for v in b)
    )


def _reordered(candidates: Sequence[Pod], movable: frozenset[str]) -> bool:
    """Whether a movable candidate comes before a candidate of its priority that is not
    (``candidates`` in the ranking's order): only then does movable-first change it."""
    seen = None  # the priority of the last movable candidate met
    for p in candidates:
        if p.uid in movable:
            seen = p.priority
        elif p.priority == seen:
            return True
    return False


def movable_selection(
    upstream: Selection,
    candidates: Sequence[Pod],
    elsewhere: Sequence[Room],
    ranking: Ranking,
    cleared: Cleared,
    asks: Callable[[Pod], Resources],
    paused: frozenset[str] = frozenset(),
) -> Selection:
    """Victim order ``movable-first`` (docs/decision-core.md): the selection made with
    movable ``candidates`` less important than the others of their priority, when it is
    no worse than ``upstream`` (:func:`_no_worse`: the reprieve is greedy, and another
    order may need more victims); else ``upstream``. Either way its victims carry their
    :class:`~webhook.core.movable.Move`, claimed in eviction order so that two never
    count on the same room. ``cleared`` is :func:`clear_node` of the same candidates.

    Only candidates of a priority up to ``upstream``'s highest victim's are judged, and
    the second selection refuses to evict a more important one (``keep_above``): a
    selection no worse than upstream's never does, so those keep upstream's order and
    come back whole. ``asks(pod)`` is what a candidate's replacement asks for
    (:meth:`~webhook.core.accounting.Holdings.asks`). ``paused`` (uids) are candidates
    that will be checkpointed and restored: they keep their work as movable ones do, and
    are preferred alike."""
    top = max(v.priority for v in upstream.victims)
    movable = movable_among([p for p in candidates if p.priority <= top], elsewhere, asks)
    movable |= paused
    chosen = upstream
    by_uid = {p.uid: p for p in candidates}
    if _reordered(candidates, movable):
        order = movable_first(ranking, movable)
        other = select_victims([p for p in order.pods if p.uid in by_uid], order, cleared, top)
        if _no_worse(other, upstream):
            chosen = other
    claimed = claim([by_uid[v.pod.uid] for v in chosen.victims], elsewhere, asks)
    victims = tuple(replace(v, move=m) for v, m in zip(chosen.victims, claimed, strict=True))
    return replace(chosen, victims=victims)


def _pauses(
    candidates: Sequence[Pod], pause: Callable[[Pod], Pause | None] | None
) -> dict[str, Pause]:
    """Each opted-in candidate's :class:`~webhook.core.checkpoint.Pause`, by uid."""
    if pause is None:
        return {}
    judged = ((p.uid, pause(p)) for p in candidates)
    return {uid: p for uid, p in judged if p is not None}


class NodeView(Protocol):
    """A node and the pods bound to it, as a plan reads them: what the pods hold and how
    they rank. Both depend on the pods alone (and the ranking on the budgets, the policy
    and, for pods not started, the time), never on the resize, so a caller deciding many
    resizes on the same pods may keep them between decisions and answer from what it
    kept (:class:`~webhook.engine.planner.NodeMemo` does); :class:`NodePods` computes
    them when asked.

    Whatever it keeps, a view's answers must equal :class:`NodePods`'s for its
    :attr:`node` and :attr:`pods`: ``holdings()`` is
    :func:`~webhook.core.accounting.holdings` of them, ``ranking(budgets, policy, now)``
    is :func:`~webhook.core.policy.rank` of them for exactly those arguments."""

    @property
    def node(self) -> Node: ...

    @property
    def pods(self) -> Sequence[Pod]:
        """The pods bound to :attr:`node` (terminal ones may be among them)."""
        ...

    def holdings(self) -> Holdings: ...

    def ranking(
        self, budgets: Sequence[DisruptionBudget], policy: PreemptionPolicy, now: float
    ) -> Ranking: ...


@dataclass(frozen=True, slots=True)
class NodePods:
    """The plain :class:`NodeView`: keeps nothing, computes each answer when asked."""

    node: Node
    pods: Sequence[Pod]

    def holdings(self) -> Holdings:
        return accounting.holdings(self.node, self.pods)

    def ranking(
        self, budgets: Sequence[DisruptionBudget], policy: PreemptionPolicy, now: float
    ) -> Ranking:
        return rank(self.node.name, self.pods, budgets, policy, now)


class _Need(NamedTuple):
    """Step 0's figures: the resize's demand under the kubelet's model, what the rest of
    the node holds, the other pods' active reservations on it, and what is missing."""

    demand: Resources
    usage: NodeUsage
    reserved: Mapping[str, Reservation]
    short: Resources


def _need(
    old: Pod,
    new: Pod,
    view: NodeView,
    reservations: Iterable[Reservation],
    now: float,
    holdings: Holdings,
) -> _Need:
    """Step 0. An infeasible resize that this request does not change keeps being
    ignored, as the kubelet ignores it."""
    stale_infeasible = old.resize == "infeasible" and new.same_declared_resources(old)
    demand = pod_requests(new, "infeasible" if stale_infeasible else "resizing")
    node = view.node
    reserved = active_on(reservations, node.name, now, exclude_pod=new.uid)
    usage = node_usage(node, view.pods, reserved, exclude_uid=new.uid, kept=holdings)
    short = shortfall(demand, usage.in_use - usage.freeing, node.allocatable)
    return _Need(demand, usage, reserved, short)


class _Outcome(NamedTuple):
    """A verdict and what it names, before the figures are added (:func:`_plan`)."""

    verdict: Verdict
    code: ReasonCode
    reason: str
    victims: tuple[Victim, ...] = ()
    unmet: Resources = ZERO
    loans: tuple[Loan, ...] = ()
    floor_errors: tuple[tuple[PodRef, str], ...] = ()


def _plan(new: Pod, node: Node, need: _Need, outcome: _Outcome) -> Plan:
    """The frozen :class:`Plan` of ``outcome``, with the figures a person reads."""
    usage = need.usage
    figures = {
        n: ResourceFigures(
            need.demand.get(n),
            usage.in_use.get(n),
            usage.freeing.get(n),
            node.allocatable.get(n),
            need.short.get(n),
            outcome.unmet.get(n),
        )
        for n in RESOURCE_NAMES
    }
    return Plan(
        new.ref,
        node.name,
        outcome.verdict,
        outcome.code,
        outcome.reason,
        need.demand,
        outcome.victims,
        figures,
        usage.waiting_for,
        outcome.loans,
        outcome.floor_errors,
    )


def _without_preemption(
    old: Pod, new: Pod, node: Node, need: _Need, refused: str = ""
) -> _Outcome | None:
    """Steps 1-4: the verdict when no victim selection is needed or allowed; ``None``
    when the resize is short of room and may preempt. ``refused``: why the service's
    preemptor policy lets this pod take room from nobody (``""``: it may)."""
    name, demand, short = node.name, need.demand, need.short
    # Step 1: not on a node, or needs no room.
    if not new.node:
        return _Outcome("not-eligible", "not-bound", "pod is not bound to a node")
    if demand.fits_in(pod_requests(old)):
        return _Outcome(
            "fits",
            "no-growth",
            f"resize does not grow cpu or memory beyond what {name} already holds for it",
        )
    # Step 2: requests no node of this size can hold.
    too_big = demand.exceeds_in(node.allocatable)
    if too_big:
        detail = ", ".join(
            f"{n} {format_amount(n, demand.get(n))} > {format_amount(n, node.allocatable.get(n))}"
            for n in too_big
        )
        return _Outcome(
            "infeasible", "exceeds-allocatable", f"requests exceed {name} allocatable: {detail}"
        )
    # Step 3: fits already, possibly once pods already leaving have gone.
    if short.is_zero():
        if fits(demand, need.usage.in_use, node.allocatable):
            return _Outcome("fits", "fits", f"fits on {name} without preemption")
        count = len(need.usage.waiting_for)
        return _Outcome(
            "fits",
            "fits-once-terminated",
            f"fits on {name} once {count} pod{'s' if count != 1 else ''} already leaving "
            f"{'have' if count != 1 else 'has'} gone",
        )
    # Step 4: the pod or the node does not allow preemption for it.
    if new.preemption_policy == "Never":
        return _Outcome(
            "not-eligible",
            "preemption-policy-never",
            f"preemptionPolicy is Never; {amounts_text(short, ' short by ')} on {name}",
        )
    if node.resize_preemption_disabled or new.resize_preemption_disabled:
        return _Outcome("not-eligible", "node-opted-out", f"{name} opted out of resize preemption")
    if refused:
        return _Outcome(
            "not-eligible",
            "preemptor-not-allowed",
            f"{refused}; {amounts_text(short, ' short by ')} on {name}",
        )
    return None


def _within_policy(
    selection: Selection, name: str, short: Resources, policy: PreemptionPolicy
) -> _Outcome:
    """Steps 5 (its outcome) to 7: a selection that makes no room, or that the policy's
    limits refuse, is infeasible; otherwise the plan preempts (or only borrows)."""
    victims, loans, floor_errors = selection.victims, selection.loans, selection.floor_errors
    if not selection.unmet.is_zero():
        return _Outcome(
            "infeasible",
            "insufficient-after-preemption",
            f"cannot fit on {name} even after preempting every lower-priority pod: "
            f"{amounts_text(selection.unmet, ' short by ')}",
            unmet=selection.unmet,
        )
    # Step 6: limits the policy sets.
    blocked = [v for v in victims if v.violates_pdb]
    if blocked and policy.pdb_mode == "respect":
        return _Outcome(
            "infeasible",
            "pdb-violation",
            f"cannot fit on {name} without violating a PodDisruptionBudget of "
            + ", ".join(v.pod.key for v in blocked),
            unmet=short,
            floor_errors=floor_errors,
        )
    limit = policy.max_victims
    if limit is not None and len(victims) > limit:
        return _Outcome(
            "infeasible",
            "too-many-victims",
            f"would need {len(victims)} victims on {name}, more than the limit of {limit}",
            unmet=short,
            floor_errors=floor_errors,
        )
    # Step 7: preempt, borrowing first.
    count = len(victims)
    preempting = f"preempting {count} lower-priority pod{'s' if count != 1 else ''} on {name}"
    freeing = f"to free {amounts_text(short)}"
    if loans:
        lenders = len(lender_keys(loans))
        borrowing = f"borrowing {amounts_text(lent(loans))} from {lenders}"
        if not victims:
            return _Outcome(
                "preempt",
                "lend",
                f"{borrowing} lower-priority pod{'s' if lenders != 1 else ''} on {name}",
                loans=loans,
                floor_errors=floor_errors,
            )
        freeing = f"and {borrowing} {freeing}"
    return _Outcome(
        "preempt",
        "preempt",
        f"{preempting} {freeing}",
        victims,
        loans=loans,
        floor_errors=floor_errors,
    )


def plan_resize(
    old: Pod,
    new: Pod,
    view: NodeView,
    *,
    now: float,
    budgets: Sequence[DisruptionBudget] = (),
    reservations: Iterable[Reservation] = (),
    policy: PreemptionPolicy | None = None,
    elsewhere: Sequence[Room] | None = None,
    refused: str = "",
    pause: Callable[[Pod], Pause | None] | None = None,
) -> Plan:
    """Decide what the resize of ``old`` into ``new`` needs on ``view``'s node.

    Contract:
    * ``old`` is the pod as stored (with the kubelet's status); ``new`` the pod with the
      desired resources (for a resize already persisted, ``new`` may equal ``old``);
    * ``view`` is the node and the pods bound to it (:class:`NodeView`; the resizing pod
      may be among them; pods bound elsewhere are ignored, so victims are never on
      another node): :class:`NodePods` for a plain node and pods;
    * ``reservations`` may hold any node's; only active ones on the node of other pods count;
    * the result never names a victim or lender with priority >= the resizing pod's, a
      mirror pod, a terminating pod, or a pod another admitted resize already claimed; it
      has no victims or loans unless its verdict is ``preempt``; without its victims and
      with its loans the resize fits, while keeping any one victim it does not (even
      with every kept lender at its floors); no loan goes below a floor, and the loans
      free no more than the resize is short of.

    ``elsewhere``, when given, is victim order ``movable-first``: the room other nodes
    have now (:func:`~webhook.core.movable.rooms_elsewhere`, the resizing node left out),
    and :func:`movable_selection` chooses; ``None`` is upstream's order.

    ``refused``, when not empty, is why the preemptor policy
    (:meth:`~webhook.core.policy.Preemptors.refusal`) lets this pod take room from nobody:
    a resize short of room is then ``not-eligible``, with no victims and no loans.

    ``pause``, when given, judges whether a victim is checkpointed
    (:func:`~webhook.core.checkpoint.pause_of` with its node's abilities): each victim
    carries its answer, and victim order ``movable-first`` prefers those checkpointed.
    """
    policy = policy or DefaultPolicy()
    node, kept = view.node, view.holdings()
    # Step 0: the pod's demand, what the rest of the node holds, what is missing.
    need = _need(old, new, view, reservations, now, kept)
    # Steps 1-4: nothing to select victims for.
    early = _without_preemption(old, new, node, need, refused)
    if early is not None:
        return _plan(new, node, need, early)
    # Step 5: victim selection, with lending.
    claimed = frozenset(uid for r in need.reserved.values() for uid in r.victims)
    ranking = view.ranking(budgets, policy, now)
    candidates = candidates_of(new, node.name, ranking.pods, claimed, policy)

    cleared = clear_node(
        candidates, need.demand, node, need.usage, policy, frozenset(need.reserved)
    )
    selection = select_victims(candidates, ranking, cleared)
    pauses = _pauses(candidates, pause)
    if elsewhere is not None and selection.victims:
        paused = frozenset(uid for uid, p in pauses.items() if p.checkpoint)
        selection = movable_selection(
            selection, candidates, elsewhere, ranking, cleared, kept.asks, paused
        )
    if pauses:
        victims = tuple(replace(v, pause=pauses.get(v.pod.uid)) for v in selection.victims)
        selection = replace(selection, victims=victims)
    # Steps 6-7: the policy's limits, then the plan.
    return _plan(new, node, need, _within_policy(selection, node.name, need.short, policy))


def already_admitted(
    new: Pod,
    node: str,
    requested: Resources,
    victims: Sequence[PodRef] = (),
    lenders: Sequence[str] = (),
) -> Plan:
    """The answer to a resize asked for again while the room an earlier admission of the
    very same resize holds is still being made (the same pod and requests, its entry
    holding room): ``fits`` with code ``admitted``. Nothing is planned and nothing taken
    anew: the kubelet has not actuated the resize yet, so a plan made now would count the
    room the admission is making as missing and take it a second time. ``victims`` and
    ``lenders`` (pod keys) are what that admission still makes the room with, for the
    message a person reads."""
    making = []
    if victims:
        making.append(f"waiting for {len(victims)} to leave: {', '.join(v.key for v in victims)}")
    if lenders:
        making.append(f"borrowing from {', '.join(lenders)}")
    how = "; ".join(making) if making else "waiting for the kubelet"
    return Plan(
        new.ref,
        node,
        "fits",
        "admitted",
        f"resize already admitted on {node}, its room held: {how}",
        requested,
    )
