"""Events that tell people what the webhook did, shaped like kube-scheduler's.

Upstream's preemption executor records, for every victim (``pkg/scheduler/framework/
preemption/executor.go``)::

    Eventf(victim, preemptor, Normal, "Preempted", "Preempting",
           "Preempted by pod %v on node %v", preemptor.UID, nodeName)

through client-go's ``tools/events`` recorder: an ``events.k8s.io/v1`` Event in the
victim's namespace, named ``<victim>.<unix nanoseconds in hex>``, with ``eventTime`` in
microseconds and ``reportingController``/``reportingInstance`` set. The API server shows
it as a ``core/v1`` Event too, so ``kubectl get events --field-selector
involvedObject.name=<victim>`` finds it.

We record the same event, and that is the one event of a preemption carried out: the
resizing pod's owner was told of the plan by the kubectl warning (or, for a resize the
reconciler planned, by its ``DeferredResizePreemption`` event). A plan given up on before
all its victims went (it expired, or the victims no longer sufficed) gets one Warning
``ResizePreemptionAbandoned`` on the resizing pod: nobody else would say so. Once the
leader knows where an evicted victim's work went (webhook.engine.follow), the resizing pod
gets ``Moved`` (its controller's replacement runs on another node, named) or, for a victim
its controller recreates elsewhere, ``NotMoved`` (why not); upstream says nothing of it.

Contract: recording never raises to the caller. A failure is logged and counted
(:attr:`EventRecorder.failures` and the ``resize_preemption_errors_total{where="event"}``
metric) - an event is feedback, never a reason to stop preempting.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

from webhook.base.metrics import Metrics
from webhook.core.model import PodRef
from webhook.kube.errors import ClusterError
from webhook.kube.jsonapi import request_json

log = logging.getLogger(__name__)

EventType = Literal["Normal", "Warning"]

#: Validation limits of ``events.k8s.io/v1`` (pkg/apis/core/validation/events.go); the
#: API measures bytes.
NOTE_LIMIT: Final = 1024
REASON_LIMIT: Final = 128
ACTION_LIMIT: Final = 128
INSTANCE_LIMIT: Final = 128

PREEMPTED_REASON: Final = "Preempted"
PREEMPTING_ACTION: Final = "Preempting"
ABANDONED_REASON: Final = "ResizePreemptionAbandoned"
MOVED_REASON: Final = "Moved"
NOT_MOVED_REASON: Final = "NotMoved"
FLOOR_REASON: Final = "InvalidLendingFloor"
CHECKPOINTED_REASON: Final = "Checkpointed"
CHECKPOINT_FAILED_REASON: Final = "CheckpointFailed"
RESTORED_REASON: Final = "Restored"
CHECKPOINT_ACTION: Final = "Checkpointing"

_TRUNCATED: Final = " ..."


def truncate_note(note: str, limit: int = NOTE_LIMIT) -> str:
    """``note`` cut to ``limit`` UTF-8 bytes, ending in `` ...`` when cut (as the scheduler's
    ``truncateMessage`` does), never splitting a character."""
    raw = note.encode()
    if len(raw) <= limit:
        return note
    head = raw[: limit - len(_TRUNCATED)].decode(errors="ignore")
    return head + _TRUNCATED


def micro_time(epoch: float) -> str:
    """``metav1.MicroTime`` JSON form: RFC 3339 with exactly six fractional digits."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339(epoch: float) -> str:
    """``metav1.Time`` JSON form: RFC 3339 in whole seconds, UTC."""
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_reference(pod: PodRef) -> dict[str, str]:
    """An ``ObjectReference`` to a pod (``uid`` left out when unknown)."""
    ref = {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name}
    if pod.uid:
        ref["uid"] = pod.uid
    return ref


def abandoned_note(victims: Sequence[PodRef], node: str, detail: str) -> str:
    """The note on the resizing pod, e.g. ``Stopped preempting on node-1 for this resize
    (reservation expired 0.3s ago); not evicted: default/low``, cut to the API's limit."""
    names = ", ".join(v.key for v in victims) or "none"
    return truncate_note(
        f"Stopped preempting on {node} for this resize ({detail}); not evicted: {names}"
    )


class EventRecorder:
    """Creates ``events.k8s.io/v1`` Events; thread-safe, never raises.

    ``controller`` is ``reportingController`` (a qualified name, e.g. the scheduler name
    ``resize-preemption-webhook``), ``instance`` is ``reportingInstance`` (this replica; cut
    to 128 characters).
    """

    def __init__(
        self,
        api_client: Any,
        *,
        controller: str,
        instance: str,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        request_timeout: float = 10.0,
    ) -> None:
        self._api_client = api_client
        self.controller = controller
        self.instance = (instance or controller)[:INSTANCE_LIMIT]
        self._metrics = metrics
        self._clock = clock
        self._timeout = request_timeout
        self._lock = threading.Lock()
        self._last_nanos = 0
        #: Events that could not be recorded since this recorder was made.
        self.failures = 0
        #: (pod uid, message) of malformed floors already told.
        self._floors_told: set[tuple[str, str]] = set()

    # -- the events -----------------------------------------------------------------------

    def preempted(self, victim: PodRef, preemptor: PodRef, node: str) -> bool:
        """The upstream ``Preempted`` event on ``victim``; returns whether it was recorded."""
        return self.record(
            victim,
            related=preemptor,
            type_="Normal",
            reason=PREEMPTED_REASON,
            action=PREEMPTING_ACTION,
            note=f"Preempted by pod {preemptor.uid} on node {node}",
        )

    def abandoned(
        self, preemptor: PodRef, victims: Sequence[PodRef], node: str, detail: str
    ) -> bool:
        """The Warning on the resizing pod whose admitted plan was given up on, naming the
        victims left alone."""
        return self.record(
            preemptor,
            related=victims[0] if victims else None,
            type_="Warning",
            reason=ABANDONED_REASON,
            action=PREEMPTING_ACTION,
            note=abandoned_note(victims, node, detail),
        )

    def moved(self, preemptor: PodRef, victim: PodRef, replacement: PodRef, node: str) -> bool:
        """On the resizing pod: the victim's work runs again, as ``replacement`` on ``node``."""
        return self.record(
            preemptor,
            related=replacement,
            type_="Normal",
            reason=MOVED_REASON,
            action=PREEMPTING_ACTION,
            note=f"Preempted {victim.key} moved: its replacement {replacement.key} runs on {node}",
        )

    def lost(self, preemptor: PodRef, victim: PodRef, why: str) -> bool:
        """On the resizing pod: the victim's work did not move to another node, and why."""
        return self.record(
            preemptor,
            related=victim,
            type_="Normal",
            reason=NOT_MOVED_REASON,
            action=PREEMPTING_ACTION,
            note=f"Preempted {victim.key} did not move: {why}",
        )

    def floor_errors(self, errors: Sequence[tuple[PodRef, str]]) -> int:
        """A Warning on each pod whose floor annotation is malformed (the pod lends
        nothing and may be evicted as any other), once per pod and message for the life
        of this recorder; returns how many were recorded."""
        recorded = 0
        for pod, message in errors:
            key = (pod.uid, message)
            with self._lock:
                if key in self._floors_told:
                    continue
                self._floors_told.add(key)
            recorded += self.record(
                pod,
                type_="Warning",
                reason=FLOOR_REASON,
                action="Lending",
                note=f"{message}; this pod lends nothing",
            )
        return recorded

    def checkpointed(self, victim: PodRef, preemptor: PodRef, note: str) -> bool:
        """On a victim checkpointed before its eviction: where its checkpoint waits."""
        return self.record(
            victim,
            related=preemptor,
            type_="Normal",
            reason=CHECKPOINTED_REASON,
            action=CHECKPOINT_ACTION,
            note=note,
        )

    def checkpoint_failed(self, victim: PodRef, preemptor: PodRef, why: str) -> bool:
        """On a victim that asked to be checkpointed and is evicted without one, and why."""
        return self.record(
            victim,
            related=preemptor,
            type_="Warning",
            reason=CHECKPOINT_FAILED_REASON,
            action=CHECKPOINT_ACTION,
            note=f"Not checkpointed, evicted: {why}",
        )

    def restored(self, pod: PodRef, note: str) -> bool:
        """On a pod created again from its checkpoint."""
        return self.record(
            pod, type_="Normal", reason=RESTORED_REASON, action=CHECKPOINT_ACTION, note=note
        )

    # -- the generic call ---------------------------------------------------------------------

    def event_body(
        self,
        regarding: PodRef,
        *,
        related: PodRef | None,
        type_: EventType,
        reason: str,
        action: str,
        note: str,
    ) -> dict[str, Any]:
        """The Event object ``record`` would create (as client-go's ``makeEvent``)."""
        now = self._clock()
        with self._lock:
            # Names must differ even for two events in the same nanosecond.
            nanos = max(int(now * 1e9), self._last_nanos + 1)
            self._last_nanos = nanos
        body: dict[str, Any] = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                "name": f"{regarding.name}.{nanos:x}",
                "namespace": regarding.namespace or "default",
            },
            "eventTime": micro_time(now),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": action[:ACTION_LIMIT],
            "reason": reason[:REASON_LIMIT],
            "regarding": pod_reference(regarding),
            "note": truncate_note(note),
            "type": type_,
        }
        if related is not None:
            body["related"] = pod_reference(related)
        return body

    def record(
        self,
        regarding: PodRef,
        *,
        related: PodRef | None = None,
        type_: EventType = "Normal",
        reason: str,
        action: str,
        note: str,
    ) -> bool:
        """Create one event; ``False`` (logged, counted) when the API refused it."""
        body = self.event_body(
            regarding, related=related, type_=type_, reason=reason, action=action, note=note
        )
        namespace = body["metadata"]["namespace"]
        try:
            request_json(
                self._api_client,
                "POST",
                f"/apis/events.k8s.io/v1/namespaces/{namespace}/events",
                body=body,
                timeout=self._timeout,
            )
        except ClusterError as e:
            self._failed(regarding, reason, str(e))
            return False
        except Exception as e:  # an event must never break the caller
            self._failed(regarding, reason, f"{type(e).__name__}: {e}")
            return False
        return True

    def _failed(self, regarding: PodRef, reason: str, error: str) -> None:
        with self._lock:
            self.failures += 1
        if self._metrics is not None:
            self._metrics.errors.labels("event").inc()
        log.warning("could not record %s event on pod %s: %s", reason, regarding.key, error)


__all__ = [
    "ABANDONED_REASON",
    "CHECKPOINTED_REASON",
    "CHECKPOINT_FAILED_REASON",
    "FLOOR_REASON",
    "MOVED_REASON",
    "NOTE_LIMIT",
    "NOT_MOVED_REASON",
    "PREEMPTED_REASON",
    "PREEMPTING_ACTION",
    "RESTORED_REASON",
    "EventRecorder",
    "abandoned_note",
    "micro_time",
    "pod_reference",
    "rfc3339",
    "truncate_note",
]
