"""The one planner of a resize, for the admission path and the reconciler alike: the
node's facts kept between decisions (:class:`NodeMemo`) and the plan of one resize against
the node's entries holding room (:class:`ResizePlanner`, the
:class:`~webhook.engine.lifecycle.changes.Planner` of
:func:`~webhook.engine.lifecycle.changes.admit`).

The memo is what a decision reads of a recently planned node's pods alone, kept between
decisions and handed to the core as the node's view.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from webhook.base.settings import Config
from webhook.core.accounting import Holdings, holdings, pod_requests
from webhook.core.checkpoint import Pause
from webhook.core.model import DisruptionBudget, Node, Pod
from webhook.core.plan import NodeView, Plan, already_admitted, lender_keys, plan_resize
from webhook.core.policy import PreemptionPolicy, Ranking, rank, spending
from webhook.core.resources import Resources
from webhook.engine.elsewhere import Elsewhere
from webhook.engine.ledger import LedgerEntry

#: Nodes kept. Decisions come in bursts on the nodes being resized; the bound keeps a
#: large cluster's worth of them out of memory.
NODES_KEPT = 256

#: One version of a pod: its uid and ``metadata.resourceVersion``.
Version = tuple[str, str]


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the memo keeps of one node for one list of its pods and of its budgets: the
    :class:`~webhook.core.plan.NodeView` of :attr:`node` and :attr:`pods` that answers
    from it.

    ``amounts``: ``pod_requests`` of each pod that carries a resource version, by
    :data:`Version`, for the next list of pods to reuse. ``held``:
    :func:`~webhook.core.accounting.holdings` of the pods; ``ranked``:
    :func:`~webhook.core.policy.rank` of them with :attr:`budgets` under :attr:`policy`
    at :attr:`ranked_at`.
    """

    node: Node
    pods: tuple[Pod, ...]
    budgets: tuple[DisruptionBudget, ...]
    policy: PreemptionPolicy
    amounts: Mapping[Version, Resources]
    held: Holdings
    ranked: Ranking
    ranked_at: float

    def holdings(self) -> Holdings:
        return self.held

    def ranking(
        self, budgets: Sequence[DisruptionBudget], policy: PreemptionPolicy, now: float
    ) -> Ranking:
        """The kept ranking when asked for the budgets and policy it was made with, at a
        time it holds for (:meth:`ranked_for`); ranked afresh otherwise."""
        if self.ranked_for(now) and policy == self.policy and tuple(budgets) == self.budgets:
            return self.ranked
        return rank(self.node.name, self.pods, budgets, policy, now)

    def ranked_for(self, now: float) -> bool:
        """Whether :attr:`ranked` is the ranking at ``now`` too: the importance order
        reads the time only for pods not started yet, as starting then, so it is the same
        at any two times after the latest start time (:attr:`Ranking.settled`; at it, a
        pod not started ties with the last one started)."""
        return now == self.ranked_at or min(now, self.ranked_at) > self.ranked.settled

    def current(
        self, node: Node, pods: tuple[Pod, ...], budgets: tuple[DisruptionBudget, ...]
    ) -> bool:
        """Whether these are the facts of ``pods`` and ``budgets`` on a node of ``node``'s
        size: compared by value, so a view that hands out a new but equal list reuses
        them, and one that changes a pod in any way gets fresh ones."""
        return (
            self.node.allocatable == node.allocatable
            and self.budgets == budgets
            and self.pods == pods
        )


class NodeMemo:
    """A bounded, thread-safe memo of :class:`NodeFacts`, one per node, under one policy.

    The policy's importance order must read the time as
    :func:`~webhook.core.policy.importance_key` does (every policy of the service
    does). The kept facts are reused only for pods and budgets equal to theirs (by
    value, whatever objects the cluster view hands out). A new list of pods reuses what
    the kept facts computed of each pod of the same :data:`Version`: a pod's uid and a
    non-empty ``resourceVersion`` name one version of the stored object, which reads the
    same every time (the API server's promise; a pod changed in this process, e.g.
    shown as lending, must not reach the memo under its stored version). A pod without
    a version is computed every time.
    """

    def __init__(self, policy: PreemptionPolicy, size: int = NODES_KEPT) -> None:
        self.policy = policy
        self.size = size
        self._kept: dict[str, NodeFacts] = {}
        self._lock = threading.Lock()

    def of(
        self,
        node: Node,
        pods: tuple[Pod, ...],
        budgets: tuple[DisruptionBudget, ...],
        now: float,
    ) -> NodeFacts:
        """The view of ``pods`` on ``node``, with their ranking with ``budgets`` at
        ``now``: the kept facts while they are :meth:`~NodeFacts.current` (ranked again
        when the ranking does not hold at ``now``), fresh ones otherwise."""
        kept = self._kept.get(node.name)
        if kept is not None and kept.current(node, pods, budgets):
            if kept.ranked_for(now) and kept.node == node:
                return kept
            facts = replace(kept, node=node)
            if not kept.ranked_for(now):
                ranked = rank(node.name, pods, budgets, self.policy, now)
                facts = replace(facts, ranked=ranked, ranked_at=now)
        else:
            facts = self._fresh(kept, node, pods, budgets, now)
        with self._lock:
            if len(self._kept) >= self.size and node.name not in self._kept:
                # The oldest insertion goes: a dict keeps insertion order.
                del self._kept[next(iter(self._kept))]
            self._kept[node.name] = facts
        return facts

    def _fresh(
        self,
        kept: NodeFacts | None,
        node: Node,
        pods: tuple[Pod, ...],
        budgets: tuple[DisruptionBudget, ...],
        now: float,
    ) -> NodeFacts:
        """The facts of ``pods``, reusing what ``kept`` computed of the same versions."""
        before = kept.amounts if kept is not None else {}
        amounts: dict[Version, Resources] = {}
        for p in pods:
            if p.resource_version:
                version = (p.uid, p.resource_version)
                amount = before.get(version)
                amounts[version] = pod_requests(p) if amount is None else amount

        def holds(p: Pod) -> Resources:
            if p.resource_version:
                return amounts[p.uid, p.resource_version]
            return pod_requests(p)

        spends = self._spends(kept, pods, budgets)
        return NodeFacts(
            node,
            pods,
            budgets,
            self.policy,
            amounts,
            holdings(node, pods, holds),
            rank(node.name, pods, budgets, self.policy, now, spends),
            now,
        )

    def _spends(
        self, kept: NodeFacts | None, pods: tuple[Pod, ...], budgets: tuple[DisruptionBudget, ...]
    ) -> dict[str, tuple[int, ...]] | None:
        """``spending`` of ``pods``: what the kept facts say of the same versions, under
        equal budgets, and computed for the others (None: nothing to share)."""
        if kept is None or kept.budgets != budgets:
            return None
        known = {
            (p.uid, p.resource_version): kept.ranked.spends[p.uid]
            for p in kept.ranked.pods
            if p.resource_version
        }
        spends: dict[str, tuple[int, ...]] = {}
        fresh: list[Pod] = []
        for p in pods:
            spent = known.get((p.uid, p.resource_version)) if p.resource_version else None
            if spent is None:
                fresh.append(p)
            else:
                spends[p.uid] = spent
        return spends | spending(fresh, budgets, self.policy.pdb_mode)

    def __len__(self) -> int:
        return len(self._kept)


@dataclass(frozen=True, slots=True)
class ResizePlanner:
    """The one :class:`~webhook.engine.lifecycle.changes.Planner` of
    :func:`~webhook.engine.lifecycle.changes.admit`, for the admission path (``review``) and for
    the reconciler (a resize the kubelet deferred): ``pod``'s resize from ``old`` planned
    on ``node`` as the memo's ``view`` has it, at ``now``; in victim order
    ``movable-first``, with the room elsewhere (read only by a plan with victims, and
    only as far as it looks). ``refused``: why the preemptor policy lets the pod take
    room from nobody (:meth:`~webhook.core.policy.Preemptors.refusal`; ``""``: it may)."""

    old: Pod
    pod: Pod
    node: Node
    view: NodeView
    budgets: tuple[DisruptionBudget, ...]
    now: float
    review_uid: str
    review: bool
    config: Config
    policy: PreemptionPolicy
    elsewhere: Elsewhere
    refused: str = ""
    #: Whether a victim is checkpointed (:class:`~webhook.engine.pauses.Pauses`).
    pause: Callable[[Pod], Pause | None] | None = None

    def plan(self, holders: Sequence[LedgerEntry]) -> Plan:
        rooms = None
        if self.config.victim_order == "movable-first":
            rooms = self.elsewhere.rooms(self.node.name, self.now, self.pod.uid)
        return plan_resize(
            self.old,
            self.pod,
            self.view,
            now=self.now,
            budgets=self.budgets,
            reservations=[e.reservation() for e in holders],
            policy=self.policy,
            elsewhere=rooms,
            refused=self.refused,
            pause=self.pause,
        )

    def reserves(self, plan: Plan) -> bool:
        """A review's plan reserves when it needs room (:func:`reserves`); a deferred
        resize's only with victims: room that appears lets the kubelet actuate by itself,
        and a reservation without victims would only hold room others may use."""
        return reserves(plan) if self.review else plan.verdict == "preempt"

    def admitted(self, entry: LedgerEntry) -> Plan:
        return already_admitted(
            self.pod,
            entry.node,
            entry.resources,
            entry.pending_victims,
            lender_keys(entry.loans),
        )

    def entry(self, plan: Plan) -> LedgerEntry:
        return LedgerEntry.for_plan(
            self.pod,
            plan,
            review_uid=self.review_uid,
            now=self.now,
            ttl=self.config.reservation_ttl,
            # A deferred resize is in the spec already: it has no deadline to persist by.
            persisted=not self.review,
            persist_timeout=self.config.persist_timeout,
        )


def reserves(plan: Plan) -> bool:
    """Whether an admitted review's plan takes a reservation: one that needs room. One
    that needs none writes nothing: an earlier entry of the pod stops holding room by
    itself once the API server persists this spec (its generation moves past the
    entry's), and the kubectl warning is what tells a person, not an event."""
    return plan.verdict in ("fits", "preempt") and plan.code != "no-growth"
