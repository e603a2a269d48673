"""Track resizes the kubelet already deferred, as kube-scheduler's queue does (KEP-5836).

The admission path sees a resize only while it is being made. Resizes made while the
webhook was down or not yet installed, evictions a PodDisruptionBudget refused until its
admitted entry expired, and room that changed since, all end up as pods with
``PodResizePending`` reason ``Deferred``. The reconciler plans for those pods exactly like
the admission path (same core, same ledger) and records an entry the preemption worker
carries out.

It skips: pods whose resize already has a live ledger entry (the worker owns those),
a lender getting its room back that the kubelet deferred (never preempted for),
``Infeasible`` resizes (never preempt for them), pods with ``PodResizePreemptionDisabled``,
nodes that opted out and ``preemptionPolicy: Never`` (the plan says ``not-eligible``).
Room already on its way out (terminating pods, victims other entries claimed) counts as
free, so a pass never adds victims for it (the plan says ``fits-once-terminated``).

Nothing here is lost in a crash: a pass holds no state a restart needs. The ledger entry
is written atomically with the check that no other live entry exists for the pod, so a
replayed pass, a second replica or a racing admission never produce two plans for one
resize.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson

from webhook.base.loop import Loop
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.checkpoint import Pause
from webhook.core.errors import WebhookError
from webhook.core.model import Node, Pod
from webhook.core.plan import Plan
from webhook.engine.decision_log import decision_logger, plan_fields
from webhook.engine.elsewhere import Elsewhere
from webhook.engine.ledger import ClusterView, Ledger, LedgerChange
from webhook.engine.lifecycle.changes import Admitted, admit
from webhook.engine.lifecycle.states import HOLDS_ROOM, answered_by, entry_phase
from webhook.engine.planner import NodeMemo, ResizePlanner

log = logging.getLogger(__name__)

#: Seconds between passes when nothing wakes the reconciler earlier.
PERIOD = 5.0
#: Changes arrive in bursts (a deletion is several watch events): one pass per burst.
DEBOUNCE = 0.05
#: Why a Deferred resize waits, as ``resize_preemption_deferred_resizes{reason}`` tells:
#: the verdict of its plan (``preempt``: victims are being made to go, by this pass or an
#: entry the worker carries out), or why the reconciler does not plan for it.
DEFERRED_REASONS = (
    "preempt",
    "fits",
    "fits-once-terminated",
    "not-eligible",
    "infeasible",
    "not-bound",
    "leaving",
    "preemption-disabled",
    "giving-back",
    "node-unknown",
    "error",
)


class DeferredView(ClusterView, Protocol):
    def pending_resizes(self) -> Sequence[Pod]:
        """Pods whose ``PodResizePending`` condition is Deferred or Infeasible."""
        ...


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one pass decided for one pod. ``verdict`` is the plan's, or ``skipped``."""

    pod: str
    verdict: str
    admitted: bool
    plan: Plan | None = None
    code: str = ""


#: ``on_decision(pod, plan, admitted)``: called when a pod's decision changes (not on
#: every pass), for events. Must not raise; keep it quick.
DecisionHook = Callable[[Pod, Plan, bool], None]


def review_uid_for(pod: Pod) -> str:
    """A stable id for "this pod's deferred resize at this spec generation", so a replayed
    pass records the same entry once."""
    return f"deferred/{pod.uid}/{pod.generation}"


def skip_reason(pod: Pod) -> str:
    """Why the reconciler leaves ``pod`` alone before planning; ``""`` when it plans.

    Node opt-out and ``preemptionPolicy: Never`` are the plan's to judge (a resize that
    fits needs no preemption, whatever they say).
    """
    if pod.resize != "deferred":
        return "infeasible" if pod.resize == "infeasible" else "not-pending"
    if not pod.node:
        return "not-bound"
    if pod.leaving:
        return "leaving"
    if pod.resize_preemption_disabled:
        return "preemption-disabled"
    return ""


class Reconciler:
    """One pass (:meth:`reconcile`) plans for every deferred resize without a live entry.

    Run by the leader only, beside the preemption worker: :meth:`start` runs passes in a
    :class:`~webhook.base.loop.Loop`, woken (:meth:`wake`) on pod, node, PDB and ledger
    changes, and every ``period`` seconds. Thread-safe as long as one thread runs passes.
    """

    def __init__(
        self,
        config: Config,
        cluster: DeferredView,
        ledger: Ledger,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        on_decision: DecisionHook | None = None,
        period: float = PERIOD,
        debounce: float = DEBOUNCE,
        pause: Callable[[Pod], Pause | None] | None = None,
    ) -> None:
        self.config = config
        self.cluster = cluster
        #: Judges which victims are checkpointed (:class:`~webhook.engine.pauses.Pauses`).
        self.pause = pause
        self.ledger = ledger
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.on_decision = on_decision
        self.policy = config.policy()
        self.preemptors = config.preemptors()
        # Deferred pods share nodes, and a pass plans them all.
        self._memo = NodeMemo(self.policy)
        self._elsewhere = Elsewhere(cluster, ledger)
        # (pod uid, generation) -> last (verdict, code): a pod left pending is looked at on
        # every pass; its metric, log line and event follow changes only.
        self._last: dict[tuple[str, int], tuple[str, str]] = {}
        self._loop = Loop(
            "reconciler",
            lambda _stop: self.reconcile(),
            period=period,
            debounce=debounce,
            on_error=self._count_error,
        )

    def start(self) -> None:
        """Run passes in a thread (idempotent); the first one at once: every deferred
        resize, on a cold start."""
        self._loop.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        self._loop.stop(timeout)
        # Another replica counts them now; a gauge left set would be counted twice.
        self._count_deferred({})
        self.metrics.set_pending({})

    def wake(self) -> None:
        """Ask for a pass soon (cheap, thread-safe)."""
        self._loop.wake()

    def reconcile(self) -> list[Outcome]:
        """Plan for every deferred resize; returns what was decided, pod by pod."""
        if not self.cluster.synced():
            # A half-listed cache misses pods and budgets: never plan victims on it.
            return []
        if not self.config.cache_current(self.cluster.staleness()):
            # Its watches are lost: the pass runs again every period, and the relist
            # that brings them back wakes it.
            return []
        outcomes = []
        seen: set[tuple[str, int]] = set()
        waiting: dict[str, list[Pod]] = {}
        pending = sorted(self.cluster.pending_resizes(), key=_kubelet_order)
        for pod in pending:
            planned = not skip_reason(pod)
            reason, outcome = self.consider(pod)
            if pod.resize == "deferred":
                waiting.setdefault(reason, []).append(pod)
            if not planned:
                continue
            seen.add((pod.uid, pod.generation))
            if outcome is not None:
                outcomes.append(outcome)
                self._report(pod, outcome)
        for key in set(self._last) - seen:
            del self._last[key]
        self._count_deferred(waiting)
        self.metrics.set_pending(self._pending_counts(pending))
        return outcomes

    def consider(self, pod: Pod) -> tuple[str, Outcome | None]:
        """Why ``pod``'s pending resize waits (one of :data:`DEFERRED_REASONS`, or
        ``infeasible``/``not-pending`` for a pod the kubelet did not defer) and what a
        pass decides for it (``None``: nothing new), through the ledger's ``update``; a
        ledger that keeps its writes to itself makes this a read-only look (``python -m
        webhook status``). Reports nothing: :meth:`reconcile` does."""
        skip = skip_reason(pod)
        if skip:
            return skip, None
        try:
            return self._reconcile_pod(pod)
        except WebhookError as e:
            log.warning("deferred resize of %s not planned: %s", pod.key, e)
            self._count_error()
            return "error", None

    def _count_deferred(self, waiting: dict[str, list[Pod]]) -> None:
        """Sets both deferred gauges for every reason (0 without pods), so a reason
        whose pods went is not left at its last count."""
        now = self.clock()
        for reason in DEFERRED_REASONS:
            pods = waiting.get(reason, [])
            since = [p.resize_pending_since for p in pods if p.resize_pending_since is not None]
            self.metrics.deferred_resizes.labels(reason).set(len(pods))
            longest = max(0.0, now - min(since)) if since else 0.0
            self.metrics.deferred_longest_wait.labels(reason).set(longest)

    def _pending_counts(self, pending: Sequence[Pod]) -> dict[str, int]:
        """Resizes not yet actuated (``resize_preemption_pending_resizes``): the kubelet's
        pending verdicts as cached, and the ledger's entries that hold room by phase."""
        counts: dict[str, int] = {}
        for pod in pending:
            counts[pod.resize] = counts.get(pod.resize, 0) + 1
        now = self.clock()
        on_node: dict[str, dict[str, Pod]] = {}
        for entry in self.ledger.all_entries():
            pods = on_node.get(entry.node)
            if pods is None:
                pods = on_node[entry.node] = {p.uid: p for p in self.cluster.pods_on(entry.node)}
            state = entry_phase(entry, pods.get(entry.pod.uid), now).state
            if state in HOLDS_ROOM:
                counts[state] = counts.get(state, 0) + 1
        return counts

    def _count_error(self) -> None:
        # The series appears with the first error, not before.
        self.metrics.errors.labels("reconciler").inc()

    def _report(self, pod: Pod, outcome: Outcome) -> None:
        key = (pod.uid, pod.generation)
        now = (outcome.verdict, outcome.code)
        if not outcome.admitted and self._last.get(key) == now:
            return
        self._last[key] = now
        self.metrics.reconciler_actions.labels(outcome.verdict).inc()
        plan = outcome.plan
        if plan is None:
            return
        self.metrics.count_attempt(plan.verdict)
        if outcome.admitted and plan.victims:
            self.metrics.victims_planned.inc(len(plan.victims))
            self.metrics.victims_per_plan.observe(len(plan.victims))
        _log_decision(pod, plan, outcome.admitted)
        # An event only when the reconciler acts: nobody was told of this plan (no
        # review, no kubectl warning). A pod it cannot help is in the decision log and the
        # metrics; its resize was answered with a warning when it was made, and the
        # kubelet's PodResizePending condition says it waits.
        if outcome.admitted and self.on_decision is not None:
            try:
                self.on_decision(pod, plan, outcome.admitted)
            except Exception:
                log.exception("reconciler decision hook failed for %s", pod.key)

    def _reconcile_pod(self, pod: Pod) -> tuple[str, Outcome | None]:
        """Why ``pod`` waits (one of :data:`DEFERRED_REASONS`) and what this pass decided
        for it (``None``: nothing new)."""
        now = self.clock()
        node = self.cluster.node(pod.node)
        if node is None:
            return "node-unknown", None
        pods = tuple(self.cluster.pods_on(node.name))
        # Cheap pre-check on the cached ledger; the update below decides atomically.
        claimed = answered_by(pod, self.ledger.entries(node.name), pods, now)
        if claimed == "held":
            return "preempt", None
        if claimed == "given-back":
            # A lender getting its room back, deferred by the kubelet: the give-back took
            # only room nobody more important waited for, and is never preempted for.
            return "giving-back", None
        plan, entry = self.ledger.update(node.name, self._admit(pod, node, pods, now))
        if plan is None:
            return "preempt", None
        if entry is not None:
            log.info(
                "deferred resize of %s: %s (%s)", pod.key, plan.reason, ", ".join(plan.victim_keys)
            )
        reason: str = plan.code if plan.code == "fits-once-terminated" else plan.verdict
        return reason, Outcome(pod.key, plan.verdict, entry is not None, plan, plan.code)

    def _admit(
        self, pod: Pod, node: Node, pods: tuple[Pod, ...], now: float
    ) -> LedgerChange[Admitted]:
        """The ledger write admitting ``pod``'s deferred resize, planned as the admission
        path plans a review (:class:`~webhook.engine.planner.ResizePlanner`)."""
        budgets = tuple(self.cluster.budgets(frozenset(p.namespace for p in pods)))
        view = self._memo.of(node, pods, budgets, now)
        planner = ResizePlanner(
            pod,
            pod,
            node,
            view,
            budgets,
            now,
            review_uid_for(pod),
            False,
            self.config,
            self.policy,
            self._elsewhere,
            # The admission path's judgement: a resize the webhook configuration never
            # showed the service is held to the same rule.
            self.preemptors.refusal(pod, self.cluster.namespace_labels(pod.namespace)),
            self.pause,
        )
        return admit(planner, pods, now)


def _log_decision(pod: Pod, plan: Plan, admitted: bool) -> None:
    """One JSON line in the admission path's decision log format, endpoint ``reconcile``."""
    record = {"endpoint": "reconcile", "pod": pod.key, "verdict": plan.verdict}
    decision_logger.info(orjson.dumps(record | plan_fields(plan, admitted)).decode())


def _kubelet_order(pod: Pod) -> tuple[int, float, str]:
    """Higher priority first, then longest pending: the order the kubelet retries in."""
    since = pod.resize_pending_since if pod.resize_pending_since is not None else float("inf")
    return (-pod.priority, since, pod.key)
