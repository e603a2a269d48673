"""Settings of the service, with their defaults. Loading them is ``webhook.engine.settings``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from webhook.core.model import PdbMode
from webhook.core.policy import DefaultPolicy, VictimOrder

Mode = Literal["enforce", "warn", "deny-infeasible"]
EvictionMethod = Literal["evict", "delete"]


@dataclass(frozen=True, slots=True)
class Config:
    """Everything an operator can set (flags, ``RPW_*`` environment variables, a file).

    ``mode``: ``enforce`` plans, reserves and preempts; ``warn`` plans and tells but never
    reserves or evicts (trial rollouts); ``deny-infeasible`` is ``enforce`` that also
    denies (403) a resize that cannot fit even with preemption.
    """

    mode: Mode = "enforce"
    eviction_method: EvictionMethod = "evict"
    pdb_mode: PdbMode = "respect"
    protected_namespaces: frozenset[str] = frozenset()
    max_victims: int | None = None
    #: Pods annotated with a floor lend CPU and memory in place before anyone is evicted
    #: (docs/lending.md).
    lending: bool = True
    #: ``upstream``: victims by priority, then start time. ``movable-first``: on equal
    #: priority, pods whose controller can recreate them on another node with room go
    #: before pods whose work would be lost (docs/decision-core.md).
    victim_order: VictimOrder = "upstream"
    #: Seconds an admitted resize holds its room if nobody releases it earlier.
    reservation_ttl: float = 120.0
    #: Upper bound on a victim's termination grace period (seconds); None keeps the pod's.
    grace_period_cap: int | None = None
    #: Seconds the worker waits for an admitted resize to show in the pod's spec.
    persist_timeout: float = 10.0
    #: Namespace of the ledger and leader-election Leases (the webhook's own).
    namespace: str = "resize-preemption-system"
    #: Identity in leader election and in the ledger's audit fields.
    identity: str = ""
    lease_duration: float = 15.0
    #: Full resync of the cache, seconds.
    resync_period: float = 300.0
    #: Seconds a watch of the cache may be lost before nothing is decided on it: reviews
    #: fail open, the worker and the reconciler wait, readiness goes false. Above a
    #: relist of a large cluster (docs/service.md, Performance) and the reflector's
    #: longest backoff, so that neither alone makes the service fail open.
    max_cache_staleness: float = 60.0
    #: Largest AdmissionReview body accepted, bytes.
    max_body_bytes: int = 3 * 1024 * 1024
    scheduler_name: str = "resize-preemption-webhook"

    def cache_current(self, staleness: float) -> bool:
        """Whether a view that may have missed changes for ``staleness`` seconds (see
        :meth:`~webhook.engine.ledger.ClusterView.staleness`) may still be decided on:
        the one bound reviews, the worker, the reconciler and readiness all apply."""
        return staleness <= self.max_cache_staleness

    def policy(self) -> DefaultPolicy:
        return DefaultPolicy(
            pdb_mode=self.pdb_mode,
            max_victims=self.max_victims,
            protected_namespaces=self.protected_namespaces,
            lending=self.lending,
        )
