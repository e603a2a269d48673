"""What the admission engine and the worker need from the cluster, as protocols.

``webhook.kube.cache.ClusterCache`` implements :class:`ClusterView` from list+watch;
tests may implement it over a fixed set of objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from webhook.core.model import DisruptionBudget, Node, Pod
from webhook.core.objects import PriorityResolver


class ClusterView(Protocol):
    """A read-only, in-memory view of the cluster. Every call is a memory read."""

    def node(self, name: str) -> Node | None: ...

    def pods_on(self, node: str) -> Sequence[Pod]:
        """Pods bound to ``node``, terminal ones included (the planner skips them)."""
        ...

    def pod(self, namespace: str, name: str) -> Pod | None: ...

    def budgets(self, namespaces: Iterable[str]) -> Sequence[DisruptionBudget]:
        """PodDisruptionBudgets in any of ``namespaces``."""
        ...

    def priority_resolver(self) -> PriorityResolver: ...

    def synced(self) -> bool:
        """True once every watched kind has been listed."""
        ...

    def age(self) -> float:
        """Seconds since the cache last heard from the API server."""
        ...
