"""Test doubles of the engine's ports: the in-memory ones of :mod:`webhook.engine.memory`
with the knobs a test turns (a view that is not synced or has gone stale, a count of the
ledger's writes).

For unit tests and benchmarks. Nothing in the product imports this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from webhook.core.model import DisruptionBudget, Namespace, Node, Pod, PriorityClass
from webhook.core.snapshot import Snapshot, load_snapshot
from webhook.engine.ledger import LedgerChange, LedgerEntry, R
from webhook.engine.memory import FixedClusterView, MemoryLedger


class StaticClusterView(FixedClusterView):
    """A :class:`FixedClusterView` whose ``synced``, ``age`` and ``staleness`` a test sets
    (``synced=False`` to see readiness fail, ``stale_for`` to make it stale and fresh
    again)."""

    def __init__(
        self,
        nodes: Iterable[Node] = (),
        pods: Iterable[Pod] = (),
        budgets: Iterable[DisruptionBudget] = (),
        priority_classes: Iterable[PriorityClass] = (),
        *,
        namespaces: Iterable[Namespace] | None = None,
        synced: bool = True,
        age: float = 0.0,
        staleness: float = 0.0,
    ) -> None:
        super().__init__(nodes, pods, budgets, priority_classes, namespaces)
        self._synced = synced
        self._age = age
        self.stale_for = staleness

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, *, synced: bool = True) -> StaticClusterView:
        return cls(
            snapshot.nodes.values(),
            snapshot.pods,
            snapshot.budgets,
            snapshot.priority_classes,
            namespaces=snapshot.namespaces,
            synced=synced,
        )

    @classmethod
    def from_objects(
        cls, documents: Iterable[Mapping[str, Any] | None], *, synced: bool = True
    ) -> StaticClusterView:
        return cls.from_snapshot(load_snapshot(documents), synced=synced)

    def synced(self) -> bool:
        return self._synced

    def age(self) -> float:
        return self._age

    def staleness(self) -> float:
        return self.stale_for


class InMemoryLedger(MemoryLedger):
    """A :class:`MemoryLedger` that counts its writes (``writes``)."""

    def __init__(self, entries: Iterable[LedgerEntry] = ()) -> None:
        super().__init__(entries)
        self.writes = 0

    def update(self, node: str, change: LedgerChange[R]) -> R:
        def counted(entries: tuple[LedgerEntry, ...]) -> tuple[tuple[LedgerEntry, ...] | None, R]:
            new, result = change(entries)
            if new is not None:
                self.writes += 1
            return new, result

        return super().update(node, counted)


__all__ = ["InMemoryLedger", "StaticClusterView"]
