"""Removing one victim pod, idempotently, by the Eviction API or upstream's delete.

Two methods:

* ``evict`` (default): ``POST pods/<victim>/eviction`` (policy/v1). The API server checks
  PodDisruptionBudgets and answers 429 when the eviction would violate one; it adds the
  ``DisruptionTarget`` condition (reason ``EvictionByEvictionAPI``) itself. 429 is retried
  with exponential backoff and jitter a bounded number of times (``pdb_retries`` for a
  refusal naming a budget, ``max_retries`` otherwise), then reported as
  ``blocked-by-pdb`` (the answer named a disruption budget) or ``failed`` (throttled by
  API priority and fairness), so the caller retries later.
* ``delete``: what kube-scheduler's preemption executor does (``PreemptPod`` in
  ``pkg/scheduler/framework/preemption/executor.go``): patch the victim's status with
  ``DisruptionTarget=True``, reason ``PreemptionByScheduler``, message ``"<schedulerName>:
  preempting to accommodate a higher priority pod"`` (skipped when already there), then
  DELETE. PodDisruptionBudgets are not consulted (upstream: "supported but not
  guaranteed"; the planner already preferred victims that violate none).

Both send ``preconditions.uid``: a newer pod that took the victim's name is never hit.
``gracePeriodSeconds`` is ``min(pod's, cap)`` when a cap is configured, else the pod's own
grace period applies.

Contract - idempotent, safe to call again after a crash or by another replica:

* the victim is read first; NotFound or another uid -> ``gone``; ``deletionTimestamp``
  set -> ``skipped-terminating`` (upstream skips those too). No API write in either case.
  A caller that has just seen the victim live with this uid in its watch-fed cache may
  say so (``seen_live``): for the ``evict`` method without a grace-period cap nothing
  else is needed from the pod, so the read is skipped and the uid precondition alone
  guards the eviction (upstream's executor likewise acts on its cached pod). The cache
  is a watch delay behind; the preemption worker never evicts a victim it has
  evicted already, and a new leader starts only after the old one's lease ran out, seconds after
  its last eviction reached the watch;
* NotFound (or a uid precondition conflict) at any later step -> ``gone``;
* ``evicted``/``deleted`` are followed by the upstream ``Preempted`` event on the victim;
* every outcome is counted in ``resize_preemption_victims{result=...}``; nothing is raised: API
  failures are logged and reported as ``failed``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from webhook.base.loop import Backoff
from webhook.base.metrics import Metrics
from webhook.base.settings import EvictionMethod
from webhook.core.model import PodRef
from webhook.engine.ledger import EvictionResult
from webhook.kube.errors import ClusterError, Conflict, NotFound, TooManyRequests
from webhook.kube.events import EventRecorder, rfc3339
from webhook.kube.jsonapi import patch_pod, pod_path, request_json

log = logging.getLogger(__name__)

#: ``v1.PodReasonPreemptionByScheduler`` and ``v1.DisruptionTarget``.
PREEMPTION_BY_SCHEDULER: Final = "PreemptionByScheduler"
DISRUPTION_TARGET: Final = "DisruptionTarget"
#: The API's default ``terminationGracePeriodSeconds``.
DEFAULT_GRACE_SECONDS: Final = 30


def grace_of(pod: Mapping[str, Any]) -> int:
    """The pod's own termination grace period, seconds."""
    own = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
    return own if isinstance(own, int) else DEFAULT_GRACE_SECONDS


def preemption_message(scheduler_name: str) -> str:
    """The ``DisruptionTarget`` message kube-scheduler writes."""
    return f"{scheduler_name}: preempting to accommodate a higher priority pod"


def _existing(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    status = pod.get("status") or {}
    for c in status.get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == kind:
            return c
    return None


def _unchanged(existing: Mapping[str, Any] | None, condition: Mapping[str, Any]) -> bool:
    """True when ``existing`` already says what ``condition`` says; apipod.UpdatePodCondition
    then reports no change and upstream sends no patch."""
    return existing is not None and all(
        existing.get(k) == condition[k] for k in ("status", "reason", "message")
    )


class Evictor:
    """Acts on one victim at a time; thread-safe (holds no per-call state)."""

    def __init__(
        self,
        api_client: Any,
        recorder: EventRecorder | None,
        metrics: Metrics,
        *,
        method: EvictionMethod = "evict",
        grace_period_cap: int | None = None,
        scheduler_name: str = "resize-preemption-webhook",
        max_retries: int = 5,
        pdb_retries: int | None = None,
        backoff_base: float = 0.5,
        backoff_cap: float = 8.0,
        request_timeout: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
        rng: Callable[[], float] = random.random,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if method not in ("evict", "delete"):
            raise ValueError(f"unknown eviction method {method!r}")
        self._api_client = api_client
        self.recorder = recorder
        self.metrics = metrics
        self.method: EvictionMethod = method
        self.grace_period_cap = grace_period_cap
        self.scheduler_name = scheduler_name
        self.max_retries = max_retries
        #: Retries of a 429 that names a disruption budget (default: ``max_retries``). The
        #: preemption worker sets 0: it retries with its own backoff, and at once when a
        #: budget changes, which sleeping in here would delay.
        self.pdb_retries = max_retries if pdb_retries is None else pdb_retries
        self._timeout = request_timeout
        self._sleep = sleep
        self._rng = rng
        #: Waits between two tries of a refused eviction, in one call.
        self._retries = Backoff(
            initial=backoff_base, factor=2.0, cap=backoff_cap, jitter=(0.5, 1.0)
        )
        self._clock = clock

    # -- the one public call ----------------------------------------------------------------

    def evict(
        self,
        victim: PodRef,
        preemptor: PodRef,
        node: str,
        *,
        seen_live: bool = False,
        grace_seconds: int | None = None,
    ) -> EvictionResult:
        """Remove ``victim`` to make room for ``preemptor`` on ``node``; see the module
        docstring for the contract (and for ``seen_live``). ``grace_seconds``, when
        given, caps the victim's grace period further (what a checkpoint left of it).
        Never raises."""
        try:
            result = self._evict(victim, preemptor, seen_live=seen_live, grace=grace_seconds)
        except ClusterError as e:
            log.warning("could not preempt %s for %s: %s", victim.key, preemptor.key, e)
            result = EvictionResult.FAILED
        except Exception:
            log.exception("error preempting %s for %s", victim.key, preemptor.key)
            result = EvictionResult.FAILED
        self.metrics.preemptions.labels(result.value).inc()
        if result in (EvictionResult.EVICTED, EvictionResult.DELETED):
            log.info(
                "preempted %s (%s) on %s for %s", victim.key, result.value, node, preemptor.key
            )
            if self.recorder is not None:
                self.recorder.preempted(victim, preemptor, node)
        return result

    # -- steps ------------------------------------------------------------------------------

    def _evict(
        self, victim: PodRef, preemptor: PodRef, *, seen_live: bool, grace: int | None = None
    ) -> EvictionResult:
        caps = [c for c in (self.grace_period_cap, grace) if c is not None]
        cap = min(caps) if caps else None
        if seen_live and victim.uid and self.method == "evict" and cap is None:
            # 1'. The caller's cache vouches for the victim; the API server checks the uid.
            return self._evict_api(victim, {"preconditions": {"uid": victim.uid}})
        # 1. Read the victim: gone, replaced or already leaving means nothing to do.
        try:
            pod = request_json(self._api_client, "GET", pod_path(victim), timeout=self._timeout)
        except NotFound:
            return EvictionResult.GONE
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if victim.uid and uid != victim.uid:
            return EvictionResult.GONE
        if meta.get("deletionTimestamp"):
            return EvictionResult.SKIPPED_TERMINATING
        target = PodRef(victim.namespace, victim.name, uid)
        options = self._delete_options(pod, uid, cap)
        # 2. Remove it by the configured method.
        if self.method == "evict":
            return self._evict_api(target, options)
        return self._delete(target, pod, options)

    def _delete_options(self, pod: Mapping[str, Any], uid: str, cap: int | None) -> dict[str, Any]:
        options: dict[str, Any] = {"preconditions": {"uid": uid}}
        if cap is not None:
            options["gracePeriodSeconds"] = max(0, min(grace_of(pod), cap))
        return options

    def _evict_api(self, victim: PodRef, options: dict[str, Any]) -> EvictionResult:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": victim.name, "namespace": victim.namespace},
            "deleteOptions": options,
        }
        path = pod_path(victim) + "/eviction"
        for attempt in range(self.max_retries + 1):
            try:
                request_json(self._api_client, "POST", path, body=body, timeout=self._timeout)
                return EvictionResult.EVICTED
            except NotFound:
                return EvictionResult.GONE
            except Conflict:
                # The uid precondition failed (a new pod took the name) - or a conflict
                # the API server gave up retrying; only a re-read tells them apart.
                return self._conflict(victim)
            except TooManyRequests as e:
                limit = self.pdb_retries if e.blocked_by_budget else self.max_retries
                if attempt >= limit:
                    log.info("eviction of %s refused %d times: %s", victim.key, attempt + 1, e)
                    # A PodDisruptionBudget, or API priority and fairness throttling us.
                    if e.blocked_by_budget:
                        return EvictionResult.BLOCKED_BY_PDB
                    return EvictionResult.FAILED
                # Jittered so that replicas and victims do not retry in lockstep.
                delay = self._retries.delay(attempt + 1, self._rng)
                if e.retry_after:
                    delay = max(delay, min(e.retry_after, self._retries.cap))
                self._sleep(delay)
        return EvictionResult.BLOCKED_BY_PDB  # pragma: no cover - the loop always returns

    def _delete(
        self, victim: PodRef, pod: Mapping[str, Any], options: dict[str, Any]
    ) -> EvictionResult:
        # 2a. Mark the victim as upstream does, so its controller knows why it goes.
        condition: dict[str, Any] = {
            "type": DISRUPTION_TARGET,
            "status": "True",
            "reason": PREEMPTION_BY_SCHEDULER,
            "message": preemption_message(self.scheduler_name),
        }
        existing = _existing(pod, DISRUPTION_TARGET)
        if not _unchanged(existing, condition):
            # As UpdatePodCondition: the transition time moves only when the status does.
            same_status = existing is not None and existing.get("status") == "True"
            condition["lastTransitionTime"] = (
                existing.get("lastTransitionTime") if same_status and existing is not None else None
            ) or rfc3339(self._clock())
            generation = (pod.get("metadata") or {}).get("generation")
            if isinstance(generation, int) and generation > 0:
                condition["observedGeneration"] = generation
            patch = {
                # uid in a patch is checked against the stored object: a newer pod of the
                # same name fails validation instead of being marked.
                "metadata": {"uid": victim.uid},
                "status": {"conditions": [condition]},
            }
            try:
                patch_pod(self._api_client, victim, "status", patch, timeout=self._timeout)
            except NotFound:
                return EvictionResult.GONE
            except ClusterError:
                if self._replaced(victim):
                    return EvictionResult.GONE
                raise
        # 2b. Delete it; the uid precondition protects a newer pod of the same name.
        try:
            request_json(
                self._api_client,
                "DELETE",
                pod_path(victim),
                body={"apiVersion": "v1", "kind": "DeleteOptions", **options},
                timeout=self._timeout,
            )
        except NotFound:
            return EvictionResult.GONE
        except Conflict:
            return self._conflict(victim)
        return EvictionResult.DELETED

    def _conflict(self, victim: PodRef) -> EvictionResult:
        if self._replaced(victim):
            return EvictionResult.GONE
        log.info("conflict removing %s; retrying later", victim.key)
        return EvictionResult.FAILED

    def _replaced(self, victim: PodRef) -> bool:
        """True when ``victim`` no longer exists under its uid (after a failed write)."""
        try:
            pod = request_json(self._api_client, "GET", pod_path(victim), timeout=self._timeout)
        except NotFound:
            return True
        return str((pod.get("metadata") or {}).get("uid") or "") != victim.uid


__all__ = [
    "DISRUPTION_TARGET",
    "PREEMPTION_BY_SCHEDULER",
    "EvictionResult",
    "Evictor",
    "preemption_message",
]
