"""One node's pods, with what every decision on that node derives from them done once.

A decision reads all of a node's pods: their usage, their ranking, which budgets cover
them. None of that depends on the resize, so a :class:`NodePods` computes it once for
one immutable tuple of pods and is handed to :func:`~webhook.core.plan.plan_resize` by
whoever keeps it (the admission engine keeps one per node, replaced as soon as the
cluster view hands out a different tuple). It is an exact shortcut: with or without it,
a plan is the same.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from webhook.core.accounting import pod_requests
from webhook.core.disruption import split_by_violation
from webhook.core.model import TERMINAL_PHASES, DisruptionBudget, PdbMode, Pod, PodRef
from webhook.core.policy import importance_key
from webhook.core.resources import Resources

#: Pod uid -> indexes of the budgets that cover the pod and have not counted it yet.
Coverage = Mapping[str, tuple[int, ...]]

#: Candidate chains kept per index (by priority, protected namespaces and PDB mode). A
#: node sees resizes of pods of a few priorities; past the bound the memo starts over.
CHAINS_KEPT = 16


class HeldBy(Mapping[str, Resources]):
    """What each pod on a node holds, by uid, as one resizing pod sees it: without that
    pod, and with some amounts raised (by reservations). A view over the index's table,
    not a copy: a decision reads a handful of a node's hundred entries, and copying them
    all touched every one of them."""

    __slots__ = ("_base", "_raised", "_without")

    def __init__(
        self,
        base: Mapping[str, Resources],
        without: str,
        raised: Mapping[str, Resources] | None = None,
    ) -> None:
        self._base = base
        self._without = without
        self._raised = raised or {}

    def __getitem__(self, uid: str) -> Resources:
        if uid == self._without:
            raise KeyError(uid)
        amount = self._raised.get(uid)
        return self._base[uid] if amount is None else amount

    def __iter__(self) -> Iterator[str]:
        without = self._without
        return (uid for uid in self._base if uid != without)

    def __len__(self) -> int:
        return len(self._base) - (self._without in self._base)


@dataclass(frozen=True, slots=True)
class Candidates:
    """A plan's candidates in the two orders it walks them (steps 4 to 7).

    ``pods`` are most important first, each freeing ``amounts[i]``; ``order`` is the
    reprieve order, as indexes into ``pods``: the pods that would violate a budget first,
    then the others, each group in importance order. ``prefix_cpu[k]`` and
    ``prefix_memory[k]`` are what the first ``k + 1`` pods of ``order`` free together.
    """

    pods: tuple[Pod, ...]
    amounts: tuple[Resources, ...]
    order: tuple[int, ...]
    prefix_cpu: tuple[int, ...]
    prefix_memory: tuple[int, ...]
    total: Resources
    uids: frozenset[str]

    @classmethod
    def build(
        cls,
        pods: Sequence[Pod],
        amounts: Sequence[Resources],
        budgets: Sequence[DisruptionBudget],
        mode: PdbMode,
        coverage: Coverage | None = None,
    ) -> Candidates:
        """``pods`` in importance order, what each frees, and the budgets that split them."""
        violating, _ = split_by_violation(pods, budgets, mode, coverage=coverage)
        # Both parts keep the input order: match the violating ones up in one pass.
        first: list[int] = []
        rest: list[int] = []
        pending = iter(violating)
        wanted = next(pending, None)
        for i, p in enumerate(pods):
            if p is wanted:
                first.append(i)
                wanted = next(pending, None)
            else:
                rest.append(i)
        order = first + rest
        cpu = [amounts[i].cpu for i in order]
        memory = [amounts[i].memory for i in order]
        prefix_cpu, prefix_memory = tuple(accumulate(cpu)), tuple(accumulate(memory))
        return cls(
            pods=tuple(pods),
            amounts=tuple(amounts),
            order=tuple(order),
            prefix_cpu=prefix_cpu,
            prefix_memory=prefix_memory,
            total=Resources(
                prefix_cpu[-1] if prefix_cpu else 0, prefix_memory[-1] if prefix_memory else 0
            ),
            uids=frozenset(p.uid for p in pods),
        )

    def reprieve(
        self, used_cpu: int, used_memory: int, room_cpu: int | None, room_memory: int | None
    ) -> list[int]:
        """Step 7 of the plan: with every candidate gone the node uses ``used_*``; add
        them back in :attr:`order` while the resize still fits (``room_*``: what the other
        pods may use, ``None`` for a resource the resize does not request). Returns the
        indexes (into :attr:`pods`) of the pods that could not come back: the victims.

        The longest run at the start of the order that fits as a whole comes back in one
        step (a binary search over the prefix sums, as amounts are never negative): the
        walk would take each of those pods back. The walk starts at the first that does
        not fit.
        """
        prefix_cpu, prefix_memory = self.prefix_cpu, self.prefix_memory
        start = len(self.order)
        if room_cpu is not None:
            start = min(start, bisect_right(prefix_cpu, room_cpu - used_cpu))
        if room_memory is not None:
            start = min(start, bisect_right(prefix_memory, room_memory - used_memory))
        if start:
            used_cpu += prefix_cpu[start - 1]
            used_memory += prefix_memory[start - 1]
        amounts = self.amounts
        chosen: list[int] = []
        for i in self.order[start:]:
            amount = amounts[i]
            with_cpu = used_cpu + amount.cpu
            with_memory = used_memory + amount.memory
            if (room_cpu is None or with_cpu <= room_cpu) and (
                room_memory is None or with_memory <= room_memory
            ):
                used_cpu, used_memory = with_cpu, with_memory
            else:
                chosen.append(i)
        return chosen


class NodePods:
    """``pods`` (the pods bound to ``node``, as a cluster view lists them), indexed.

    Immutable once built, except for the PodDisruptionBudget coverage, which depends on
    the budgets too: the last one computed is remembered with the budgets it was
    computed for and replaced as a whole, so concurrent readers never see a mix.
    """

    __slots__ = (
        "_chains",
        "_coverage",
        "_neg_priorities",
        "by_uid",
        "exact",
        "held",
        "in_use",
        "leaving",
        "leaving_usage",
        "namespaces",
        "node",
        "pods",
        "ranked",
        "unstarted",
    )

    def __init__(self, node: str, pods: tuple[Pod, ...]) -> None:
        self.node = node
        self.pods = pods
        held: dict[str, Resources] = {}
        by_uid: dict[str, Pod] = {}
        cpu = memory = leaving_cpu = leaving_memory = 0
        leaving: list[Pod] = []
        started: list[Pod] = []
        unstarted: list[Pod] = []
        counted = 0
        for p in pods:
            if p.node != node or p.phase in TERMINAL_PHASES:
                continue
            counted += 1
            usage = pod_requests(p, "other")
            held[p.uid] = usage
            by_uid[p.uid] = p
            cpu += usage.cpu
            memory += usage.memory
            if p.terminating:
                leaving_cpu += usage.cpu
                leaving_memory += usage.memory
                leaving.append(p)
            elif not p.mirror:
                (started if p.start_time is not None else unstarted).append(p)
        #: False when two counted pods share a uid: the per-uid shortcuts would merge
        #: them, so callers take the long way.
        self.exact = counted == len(held)
        #: What each counted pod (bound here, not terminal) holds, by uid.
        self.held: Mapping[str, Resources] = held
        self.by_uid: Mapping[str, Pod] = by_uid
        self.in_use = Resources(cpu, memory)
        #: Terminating pods among them and what they hold.
        self.leaving: tuple[Pod, ...] = tuple(leaving)
        self.leaving_usage = Resources(leaving_cpu, leaving_memory)
        # The ranking key needs ``now`` only for pods without a start time, so pods
        # with one are ranked here, once; the others are ranked per decision.
        started.sort(key=lambda p: importance_key(p, 0.0))
        #: Pods that may ever be victims here (not terminal, terminating or mirror) and
        #: have started, most important first (:func:`importance_key`).
        self.ranked: tuple[Pod, ...] = tuple(started)
        #: The same, not started yet (in input order).
        self.unstarted: tuple[Pod, ...] = tuple(unstarted)
        self._neg_priorities = [-p.priority for p in started]
        #: Namespaces of every pod in ``pods`` (whose budgets a decision reads).
        self.namespaces = frozenset(p.namespace for p in pods)
        self._coverage: tuple[tuple[DisruptionBudget, ...], PdbMode, Coverage] | None = None
        self._chains: dict[
            tuple[int, frozenset[str], PdbMode],
            tuple[tuple[DisruptionBudget, ...], Candidates | None],
        ] = {}

    def ranked_below(self, priority: int) -> Sequence[Pod]:
        """:attr:`ranked` pods of priority strictly lower than ``priority``, in order."""
        return self.ranked[bisect_right(self._neg_priorities, -priority) :]

    def candidates(
        self,
        priority: int,
        protected: frozenset[str],
        budgets: Sequence[DisruptionBudget],
        mode: PdbMode,
    ) -> Candidates | None:
        """The candidates of a preemptor of ``priority`` under the default policy when no
        reservation touches this node's pods: the started pods ranked below it outside
        the ``protected`` namespaces, freeing what they hold, split by ``budgets``.

        ``None`` when pods that have not started rank below it too (their rank depends
        on the time of the decision): the caller takes the long way. Kept per
        (priority, protected, mode) for the last budgets asked with.
        """
        key = (priority, protected, mode)
        budgets = tuple(budgets)
        kept = self._chains.get(key)
        # Tuple equality tries identity first: the same budget views compare in C.
        if kept is not None and kept[0] == budgets:
            return kept[1]
        chain: Candidates | None = None
        if not any(p.priority < priority for p in self.unstarted):
            pods = [p for p in self.ranked_below(priority) if p.namespace not in protected]
            held = self.held
            chain = Candidates.build(
                pods, [held[p.uid] for p in pods], budgets, mode, self.coverage(budgets, mode)
            )
        if len(self._chains) >= CHAINS_KEPT:
            self._chains = {}
        self._chains[key] = (budgets, chain)
        return chain

    def coverage(self, budgets: Sequence[DisruptionBudget], mode: PdbMode) -> Coverage:
        """Which of ``budgets`` cover each counted pod, as :func:`split_by_violation`
        decides it (indexes into ``budgets``); pods no budget covers are left out."""
        key = tuple(budgets)
        memo = self._coverage
        # Tuple equality tries identity first: the same budget views compare in C.
        if memo is not None and memo[1] == mode and memo[0] == key:
            return memo[2]
        by_namespace: dict[str, list[tuple[int, DisruptionBudget]]] = {}
        for i, b in enumerate(key):
            selector = b.selector
            if selector is None or (selector.empty and mode != "respect"):
                continue  # matches no pod
            by_namespace.setdefault(b.namespace, []).append((i, b))
        coverage: dict[str, tuple[int, ...]] = {}
        for uid, p in self.by_uid.items():
            covering = by_namespace.get(p.namespace)
            if not covering or (mode != "respect" and not p.labels):
                continue
            labels, name = p.labels, p.name
            found = tuple(
                i
                for i, b in covering
                if (b.selector is not None and (b.selector.empty or b.selector.matches(labels)))
                and name not in b.disrupted_pods
            )
            if found:
                coverage[uid] = found
        self._coverage = (key, mode, coverage)
        return coverage

    def usage_parts(self, exclude_uid: str) -> tuple[Resources, Resources, list[PodRef]]:
        """(in use, freeing, waiting for) without ``exclude_uid`` and before any
        reservation: the starting point of :func:`~webhook.core.headroom.node_usage`."""
        in_use, freeing = self.in_use, self.leaving_usage
        waiting = [p.ref for p in self.leaving if p.uid != exclude_uid]
        excluded = self.held.get(exclude_uid)
        if excluded is not None:
            in_use = in_use - excluded
            if self.by_uid[exclude_uid].terminating:
                freeing = freeing - excluded
        return in_use, freeing, waiting
