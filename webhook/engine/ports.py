"""What the admission engine and the preemption worker need from the cluster, as
protocols (the ledger's is :class:`webhook.engine.ledger.Ledger`).

``webhook.kube`` implements them against the API server: ``ClusterCache`` is a
:class:`ClusterView` from list+watch, ``Evictor`` a :class:`VictimEvictor`,
``EventRecorder`` the :class:`PreemptionEvents` (the lenders' port is with the rest of
lending, :class:`webhook.engine.loans.LenderResizer`). ``harness.doubles`` has a
:class:`ClusterView` over a fixed set of objects.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Protocol

from webhook.core.model import DisruptionBudget, Node, Pod, PodRef
from webhook.core.objects import PriorityResolver
from webhook.engine.elsewhere import NodeRooms


class ClusterView(Protocol):
    """A read-only, in-memory view of the cluster. Every call is a memory read."""

    def node(self, name: str) -> Node | None: ...

    def all_nodes(self) -> Sequence[Node]:
        """Every node (victim order ``movable-first`` reads the others' room)."""
        ...

    def pods_on(self, node: str) -> Sequence[Pod]:
        """Pods bound to ``node``, terminal ones included (the planner skips them)."""
        ...

    def node_rooms(self) -> NodeRooms:
        """Every node's room, told which nodes changed (victim order ``movable-first``)."""
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

    def staleness(self) -> float:
        """Seconds during which the view may have missed changes: 0 while it is fed by
        open watches, growing from the moment one was lost until it is back."""
        ...


class EvictionResult(StrEnum):
    """What happened to one victim. All but ``blocked-by-pdb`` and ``failed`` are final."""

    EVICTED = "evicted"
    DELETED = "deleted"
    GONE = "gone"
    SKIPPED_TERMINATING = "skipped-terminating"
    BLOCKED_BY_PDB = "blocked-by-pdb"
    FAILED = "failed"

    @property
    def done(self) -> bool:
        """True when the victim is leaving or gone: never act on it again."""
        return self not in (EvictionResult.BLOCKED_BY_PDB, EvictionResult.FAILED)


class VictimEvictor(Protocol):
    """Removes one victim for a preemptor, idempotently; never raises (API failures are
    ``failed``). ``seen_live``: the caller has just seen the victim live under this uid."""

    def evict(
        self, victim: PodRef, preemptor: PodRef, node: str, *, seen_live: bool = False
    ) -> EvictionResult: ...


class PreemptionEvents(Protocol):
    """Tells the resizing pod when its admitted plan was given up on; never raises.

    A plan carried out needs no event on the resizing pod: the kubectl warning (or the
    reconciler's event) named the victims, and each victim gets upstream's ``Preempted``
    event, related to the resizing pod."""

    def abandoned(
        self, preemptor: PodRef, victims: Sequence[PodRef], node: str, detail: str
    ) -> bool: ...
