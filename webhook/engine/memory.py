"""The engine's ports over memory: a cluster view of fixed objects and a ledger that keeps
its entries in this process.

``python -m webhook status`` plans each Deferred resize as the reconciler would over them,
from one read of the cluster, with nothing written back; the tests and benchmarks use the
same two (:mod:`harness.doubles` adds the knobs a test turns). The running service never
does: it wires the watch-fed cache and the Lease ledger (``webhook.service``).

:class:`FixedClusterView` answers from dictionaries built once in its constructor, so
reads are as cheap as the live cache's and it is safe to share between threads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence

from webhook.core.model import (
    LOANS_ANNOTATION,
    DisruptionBudget,
    Namespace,
    Node,
    Pod,
    PriorityClass,
)
from webhook.core.objects import PriorityResolver
from webhook.core.snapshot import Snapshot
from webhook.core.versions import at_least, latest
from webhook.engine.ledger import LedgerChange, LedgerEntry, R, check_size, encode_entries
from webhook.engine.rooms import NodeRooms

#: The label the API server sets on every namespace, its name.
NAME_LABEL = "kubernetes.io/metadata.name"


class FixedClusterView:
    """A :class:`~webhook.engine.ledger.ClusterView` (with the reconciler's
    ``pending_resizes``) over nodes, pods, PodDisruptionBudgets, PriorityClasses and
    Namespaces that never change: always synced, never stale. ``namespaces=None`` is a
    view that was given none: a namespace that holds one of its pods or budgets exists,
    and reads as having only the label the API server sets on each
    (``kubernetes.io/metadata.name``); any other reads as unknown, as the cache reads a
    namespace that does not exist."""

    def __init__(
        self,
        nodes: Iterable[Node] = (),
        pods: Iterable[Pod] = (),
        budgets: Iterable[DisruptionBudget] = (),
        priority_classes: Iterable[PriorityClass] = (),
        namespaces: Iterable[Namespace] | None = None,
    ) -> None:
        self._nodes = {n.name: n for n in nodes}
        self._namespaces = None if namespaces is None else {n.name: n for n in namespaces}
        self._pods = {p.key: p for p in pods}
        # Read at once: the view holds every write up to its newest pod's.
        self._version = latest(p.resource_version for p in self._pods.values())
        by_node: dict[str, list[Pod]] = {}
        for p in self._pods.values():
            if p.node:
                by_node.setdefault(p.node, []).append(p)
        # Tuples: callers get the same immutable sequence every time, no copy per read.
        self._by_node = {name: tuple(group) for name, group in by_node.items()}
        self._pending = tuple(p for p in self._pods.values() if p.resize != "none")
        self._lenders = tuple(p for p in self._pods.values() if LOANS_ANNOTATION in p.annotations)
        by_namespace: dict[str, list[DisruptionBudget]] = {}
        for b in budgets:
            by_namespace.setdefault(b.namespace, []).append(b)
        self._budgets = {ns: tuple(group) for ns, group in by_namespace.items()}
        self._holding = frozenset(p.namespace for p in self._pods.values()) | frozenset(
            self._budgets
        )
        # Every review asks for the budgets of its node's namespaces: remembered.
        self._budgets_by_set: dict[frozenset[str], tuple[DisruptionBudget, ...]] = {}
        self._resolver = PriorityResolver(priority_classes)
        # Nothing changes: the rooms are added up once, when first read.
        self._rooms = NodeRooms()

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> FixedClusterView:
        return cls(
            snapshot.nodes.values(),
            snapshot.pods,
            snapshot.budgets,
            snapshot.priority_classes,
            snapshot.namespaces,
        )

    def node(self, name: str) -> Node | None:
        return self._nodes.get(name)

    def all_nodes(self) -> Sequence[Node]:
        return tuple(self._nodes.values())

    def pods_on(self, node: str) -> Sequence[Pod]:
        return self._by_node.get(node, ())

    def node_rooms(self) -> NodeRooms:
        return self._rooms

    def pod(self, namespace: str, name: str) -> Pod | None:
        return self._pods.get(f"{namespace}/{name}")

    def lenders(self) -> Sequence[Pod]:
        return self._lenders

    def budgets(self, namespaces: Iterable[str]) -> Sequence[DisruptionBudget]:
        key = namespaces if type(namespaces) is frozenset else frozenset(namespaces)
        found = self._budgets_by_set.get(key)
        if found is None:
            if len(self._budgets_by_set) >= 8192:
                self._budgets_by_set = {}
            # Sorted: the same answer whatever order the caller's namespaces come in.
            found = self._budgets_by_set[key] = tuple(
                b for ns in sorted(key) for b in self._budgets.get(ns, ())
            )
        return found

    def priority_resolver(self) -> PriorityResolver:
        return self._resolver

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        if self._namespaces is None:
            return {NAME_LABEL: name} if name in self._holding else None
        found = self._namespaces.get(name)
        return None if found is None else found.labels

    def synced(self) -> bool:
        return True

    def age(self) -> float:
        return 0.0

    def staleness(self) -> float:
        # Read at once: there are no watches to lose.
        return 0.0

    def caught_up(self, version: str, timeout: float) -> bool:
        # Nothing arrives later: no wait. Objects given without versions (the tests'
        # builders) are all there is.
        return not self._version or at_least(self._version, version) is True

    def pending_resizes(self) -> Sequence[Pod]:
        """Pods whose ``PodResizePending`` is Deferred or Infeasible (as the live cache)."""
        return self._pending


class MemoryLedger:
    """A :class:`~webhook.engine.ledger.Ledger` in this process's memory, starting from
    ``entries``: a plan admitted for one resize holds its room for the next, and nothing
    reaches the cluster."""

    def __init__(self, entries: Iterable[LedgerEntry] = ()) -> None:
        # Reentrant: a change may read other nodes' entries (the room elsewhere).
        self._lock = threading.RLock()
        self._nodes: dict[str, tuple[LedgerEntry, ...]] = {}
        for e in entries:
            self._nodes[e.node] = (*self._nodes.get(e.node, ()), e)

    def entries(self, node: str) -> tuple[LedgerEntry, ...]:
        with self._lock:
            return self._nodes.get(node, ())

    def all_entries(self) -> tuple[LedgerEntry, ...]:
        with self._lock:
            return tuple(e for group in self._nodes.values() for e in group)

    def update(self, node: str, change: LedgerChange[R]) -> R:
        with self._lock:
            new, result = change(self._nodes.get(node, ()))
            if new is not None:
                check_size(node, encode_entries(new), len(new))
                self._nodes[node] = new
            return result

    def reachable(self) -> bool:
        return True

    def untidy(self) -> frozenset[str]:
        return frozenset()  # its reads leave nothing out


__all__ = ["FixedClusterView", "MemoryLedger"]
