"""Track resizes the kubelet already deferred, as kube-scheduler's queue does (KEP-5836).

The admission path sees a resize only while it is being made. Resizes made while the
webhook was down or not yet installed, evictions a PodDisruptionBudget refused until its
admitted entry expired, and room that changed since, all end up as pods with
``PodResizePending`` reason ``Deferred``. The reconciler plans for those pods exactly like
the admission path (same core, same ledger) and records an entry the preemption worker
carries out.

It skips: pods whose resize already has a live ledger entry (the worker owns those),
``Infeasible`` resizes (never preempt for them), pods with ``PodResizePreemptionDisabled``,
nodes that opted out and ``preemptionPolicy: Never`` (the plan says ``not-eligible``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from webhook.core.errors import WebhookError
from webhook.core.model import Pod
from webhook.core.plan import Plan, plan_resize
from webhook.engine.admission import desired_requests
from webhook.engine.config import Config
from webhook.engine.ledger import Ledger, LedgerEntry
from webhook.engine.metrics import Metrics
from webhook.engine.ports import ClusterView

log = logging.getLogger(__name__)


class DeferredView(ClusterView, Protocol):
    def pending_resizes(self) -> Sequence[Pod]:
        """Pods whose ``PodResizePending`` condition is Deferred or Infeasible."""
        ...


@dataclass(frozen=True, slots=True)
class Outcome:
    pod: str
    verdict: str
    admitted: bool
    plan: Plan | None = None


def review_uid_for(pod: Pod) -> str:
    """A stable id for "this pod's deferred resize at this spec generation", so a replayed
    pass records the same entry once."""
    return f"deferred/{pod.uid}/{pod.generation}"


class Reconciler:
    """One pass (:meth:`reconcile`) plans for every deferred resize without a live entry.

    Run by the leader only, beside the preemption worker; call it on pod, node and PDB
    changes and on a timer. Thread-safe as long as one thread runs passes.
    """

    def __init__(
        self,
        config: Config,
        cluster: DeferredView,
        ledger: Ledger,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        on_admitted: Callable[[LedgerEntry], None] | None = None,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.ledger = ledger
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.on_admitted = on_admitted
        self.policy = config.policy()

    def reconcile(self) -> list[Outcome]:
        """Plan for every deferred resize; returns what was decided, pod by pod."""
        outcomes = []
        for pod in sorted(self.cluster.pending_resizes(), key=_kubelet_order):
            if pod.resize != "deferred" or pod.terminating or pod.terminal or not pod.node:
                continue
            try:
                outcome = self._reconcile_pod(pod)
            except WebhookError as e:
                log.warning("deferred resize of %s not planned: %s", pod.key, e)
                self.metrics.errors.labels("reconciler").inc()
                continue
            if outcome is not None:
                self.metrics.reconciler_actions.labels(outcome.verdict).inc()
                outcomes.append(outcome)
        return outcomes

    def _reconcile_pod(self, pod: Pod) -> Outcome | None:
        now = self.clock()
        node = self.cluster.node(pod.node)
        if node is None:
            return None
        if any(e.pod.uid == pod.uid and e.expires_at > now for e in self.ledger.entries(node.name)):
            return None
        pods = tuple(self.cluster.pods_on(node.name))
        budgets = tuple(self.cluster.budgets({p.namespace for p in pods}))
        uid = review_uid_for(pod)

        def change(
            entries: tuple[LedgerEntry, ...],
        ) -> tuple[tuple[LedgerEntry, ...] | None, tuple[Plan | None, LedgerEntry | None]]:
            if any(e.pod.uid == pod.uid and e.expires_at > now for e in entries):
                return None, (None, None)  # another replica or the admission path got here
            live = tuple(e for e in entries if e.expires_at > now)
            plan = plan_resize(
                pod,
                pod,
                node,
                pods,
                now=now,
                budgets=budgets,
                reservations=[e.reservation() for e in live],
                policy=self.policy,
            )
            if plan.verdict != "preempt":
                return None, (plan, None)
            entry = LedgerEntry(
                pod=pod.ref,
                node=node.name,
                review_uid=uid,
                resources=plan.requested,
                desired=desired_requests(pod),
                victims=tuple(v.pod for v in plan.victims),
                admitted_at=now,
                expires_at=now + self.config.reservation_ttl,
                persisted=True,  # the kubelet deferred it: it is in the spec already
            )
            return (*live, entry), (plan, entry)

        plan, entry = self.ledger.update(node.name, change)
        if plan is None:
            return None
        if entry is not None:
            log.info(
                "deferred resize of %s: %s (%s)", pod.key, plan.reason, ", ".join(plan.victim_keys)
            )
            if self.on_admitted is not None:
                self.on_admitted(entry)
        return Outcome(pod.key, plan.verdict, entry is not None, plan)


def _kubelet_order(pod: Pod) -> tuple[int, float, str]:
    """Higher priority first, then longest pending: the order the kubelet retries in."""
    since = pod.resize_pending_since if pod.resize_pending_since is not None else float("inf")
    return (-pod.priority, since, pod.key)
