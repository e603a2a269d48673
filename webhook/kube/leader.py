"""Leader election over a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Only the leader runs the preemption worker and the reconciler: the service hands the
elector the ``start_leading`` and ``stop_leading`` of its
:class:`webhook.base.loop.Runnables` as callbacks. This follows client-go's
``tools/leaderelection`` (``LeaderElector`` with a ``LeaseLock`` and ``ReleaseOnCancel``):

* **acquire**: every ``retry_period`` (jittered by up to 1.2x, ``wait.JitterUntil``) try
  to take the Lease. It is free when it does not exist (create it), when its holder is
  empty (released), or when it has expired - judged only by *local* time: the record must
  not have changed for the holder's ``leaseDurationSeconds`` since this process last saw
  it change. Clocks of other machines are never compared, so clock skew is tolerated.
* **renew**: every ``retry_period`` the leader rewrites ``renewTime``; each renewal is
  retried until ``renew_deadline``; missing that deadline means leadership is lost
  (``on_stopped_leading``), and the elector goes back to acquiring.
* **optimistic concurrency**: every write is a PUT of the Lease as last read, carrying its
  ``resourceVersion``; a concurrent writer makes it fail with 409 and nobody wins twice.
  A taking-over candidate increments ``leaseTransitions`` and sets ``acquireTime``.
* **release on stop**: after ``on_stopped_leading`` returned (the guarded work has
  stopped), the Lease is written with an empty holder and ``leaseDurationSeconds: 1``, so
  another replica takes over within one ``retry_period`` instead of a lease duration.

Requirements (client-go's): ``lease_duration > renew_deadline > 1.2 * retry_period > 0``.
``on_started_leading`` and ``on_stopped_leading`` run on the elector's thread: start
work in them, do not block in them for long.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from webhook.base.loop import Backoff
from webhook.base.metrics import Metrics
from webhook.kube.errors import ClusterError, NotFound
from webhook.kube.events import micro_time
from webhook.kube.jsonapi import request_json

log = logging.getLogger(__name__)

#: The Lease the replicas elect their leader with, in the webhook's namespace.
LEADER_LEASE: Final = "resize-preemption-webhook-leader"
#: client-go's ``leaderelection.JitterFactor``.
JITTER_FACTOR: Final = 1.2


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    """The election state a Lease's spec holds (client-go's ``LeaderElectionRecord``)."""

    holder: str = ""
    lease_duration_seconds: int = 0
    acquire_time: str = ""
    renew_time: str = ""
    transitions: int = 0

    @staticmethod
    def from_spec(spec: Mapping[str, Any]) -> LeaderRecord:
        def _int(value: object) -> int:
            return value if isinstance(value, int) and not isinstance(value, bool) else 0

        return LeaderRecord(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=_int(spec.get("leaseDurationSeconds")),
            acquire_time=str(spec.get("acquireTime") or ""),
            renew_time=str(spec.get("renewTime") or ""),
            transitions=_int(spec.get("leaseTransitions")),
        )

    def to_spec(self) -> dict[str, Any]:
        """``LeaderElectionRecordToLeaseSpec``: the whole spec, nothing else kept."""
        spec: dict[str, Any] = {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "leaseTransitions": self.transitions,
        }
        if self.acquire_time:
            spec["acquireTime"] = self.acquire_time
        if self.renew_time:
            spec["renewTime"] = self.renew_time
        return spec


class LeaderElector:
    """Campaigns for one Lease on a daemon thread; see the module docstring."""

    def __init__(
        self,
        api_client: Any,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        on_started_leading: Callable[[], None],
        on_stopped_leading: Callable[[], None],
        metrics: Metrics | None = None,
        release_on_stop: bool = True,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: Callable[[], float] = random.random,
    ) -> None:
        # The checks NewLeaderElector makes.
        if lease_duration <= renew_deadline:
            raise ValueError("lease_duration must be greater than renew_deadline")
        if renew_deadline <= JITTER_FACTOR * retry_period:
            raise ValueError("renew_deadline must be greater than retry_period * 1.2")
        if retry_period <= 0:
            raise ValueError("retry_period must be greater than zero")
        if lease_duration < 1:
            raise ValueError("lease_duration must be at least one second")
        if not identity:
            raise ValueError("identity must not be empty")
        self._api_client = api_client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._metrics = metrics
        self.release_on_stop = release_on_stop
        self._clock = clock
        self._monotonic = monotonic
        self._rng = rng
        self._timeout = max(1.0, min(renew_deadline, 10.0))
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"

        self._lock = threading.Lock()
        self._observed = LeaderRecord()
        self._observed_at = float("-inf")  # local monotonic time of the last change seen
        self._lease: dict[str, Any] | None = None  # the Lease as last read or written
        self._leading = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if metrics is not None:
            metrics.leader.set(0)

    # -- public -------------------------------------------------------------------------------

    def start(self) -> None:
        """Start campaigning on a daemon thread (idempotent)."""
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(
                target=self.run, name=f"leader-election-{self.name}", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop campaigning: the leader stops its work, then releases the Lease."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._lock:
            self._thread = None

    def is_leader(self) -> bool:
        """True while this process holds the Lease: it acquired or renewed it, and no more
        than the lease duration has passed since (by the local monotonic clock)."""
        with self._lock:
            return (
                self._leading
                and self._observed.holder == self.identity
                and self._monotonic() < self._observed_at + self.lease_duration
            )

    def leader(self) -> str:
        """Identity of the last observed holder (``""`` when none); informational."""
        with self._lock:
            return self._observed.holder

    def run(self) -> None:
        """The election loop (the thread's target); returns after :meth:`stop`."""
        try:
            while not self._stop.is_set():
                if not self._acquire():
                    break
                self._started_leading()
                self._renew()
                self._stopped_leading()
        except Exception:  # never leave a leader flag behind a crashed thread
            log.exception("leader election for %s crashed", self._describe())
            self._stopped_leading()
        if self.release_on_stop:
            self._release()

    # -- the loops ----------------------------------------------------------------------------

    def _describe(self) -> str:
        return f"{self.namespace}/{self.name}"

    def _acquire(self) -> bool:
        """Try until the Lease is ours (True) or :meth:`stop` was called (False)."""
        log.info("%s: attempting to acquire leader lease %s", self.identity, self._describe())
        # wait.JitterUntil(retryPeriod, JitterFactor): a period plus up to 1.2 periods.
        every_period = Backoff(
            initial=self.retry_period, factor=1.0, jitter=(1.0, 1.0 + JITTER_FACTOR)
        )
        acquired = every_period.retry(
            self._try_acquire_or_renew, wait=self._stop.wait, rng=self._rng
        )
        if acquired:
            log.info("%s: acquired leader lease %s", self.identity, self._describe())
        return acquired

    def _renew(self) -> None:
        """Renew every retry period until a renewal misses its deadline or stop."""
        # wait.PollImmediateUntil(retryPeriod, tryAcquireOrRenew, renewDeadline).
        poll = Backoff(initial=self.retry_period, factor=1.0)
        while not self._stop.is_set():
            deadline = (self._monotonic, self._monotonic() + self.renew_deadline)
            renewed = poll.retry(
                self._try_acquire_or_renew, wait=self._stop.wait, deadline=deadline
            )
            if self._stop.is_set():
                return
            if not renewed:
                log.warning("%s: failed to renew lease %s", self.identity, self._describe())
                return
            self._stop.wait(self.retry_period)

    def _started_leading(self) -> None:
        with self._lock:
            self._leading = True
        if self._metrics is not None:
            self._metrics.leader.set(1)
        try:
            self._on_started()
        except Exception:
            log.exception("on_started_leading failed")

    def _stopped_leading(self) -> None:
        with self._lock:
            was_leading, self._leading = self._leading, False
        if self._metrics is not None:
            self._metrics.leader.set(0)
        if not was_leading:
            return
        log.info("%s: stopped leading %s", self.identity, self._describe())
        try:
            self._on_stopped()
        except Exception:
            log.exception("on_stopped_leading failed")

    # -- one attempt (tryAcquireOrRenew) ----------------------------------------------------

    def _set_observed(self, record: LeaderRecord) -> None:
        with self._lock:
            self._observed = record
            self._observed_at = self._monotonic()

    def _lease_valid(self, now: float) -> bool:
        with self._lock:
            return self._observed_at + self._observed.lease_duration_seconds > now

    def _write(self, record: LeaderRecord) -> None:
        """PUT the cached Lease with ``record`` as its spec (carries its resourceVersion)."""
        assert self._lease is not None
        body = {**self._lease, "spec": record.to_spec()}
        self._lease = request_json(
            self._api_client, "PUT", self._path, body=body, timeout=self._timeout
        )

    def _try_acquire_or_renew(self) -> bool:
        """One attempt at holding the Lease (client-go's ``tryAcquireOrRenew``): whether
        this replica holds it now."""
        now = micro_time(self._clock())
        record = LeaderRecord(
            holder=self.identity,
            lease_duration_seconds=max(1, int(self.lease_duration)),
            acquire_time=now,
            renew_time=now,
        )
        observed = self.leader_record()
        # 1. Fast path: the leader updates optimistically, assuming the Lease it last wrote
        #    is still the current version.
        if self._holding(observed) and self._put(self._renewal(record, observed), "renew"):
            return True
        # 2. Obtain or create the Lease.
        try:
            current = self._read()
        except NotFound:
            return self._create(record)
        if current is None:
            return False
        # 3. A change of the record restarts the local expiry clock; a valid Lease of
        #    another holder is not ours to take.
        if current != observed:
            self._set_observed(current)
        others = bool(current.holder) and current.holder != self.identity
        if others and self._lease_valid(self._monotonic()):
            return False
        # 4. Take over (one more transition) or keep our own acquire time.
        if current.holder == self.identity:
            return self._put(self._renewal(record, current), "update")
        return self._put(replace(record, transitions=current.transitions + 1), "update")

    def _holding(self, observed: LeaderRecord) -> bool:
        """Whether this replica held the Lease as last observed, and it has not expired."""
        return (
            observed.holder == self.identity
            and self._lease is not None
            and self._lease_valid(self._monotonic())
        )

    @staticmethod
    def _renewal(record: LeaderRecord, held: LeaderRecord) -> LeaderRecord:
        """``record`` keeping the acquire time and transitions of the Lease ``held``."""
        return replace(record, acquire_time=held.acquire_time, transitions=held.transitions)

    def _put(self, record: LeaderRecord, what: str) -> bool:
        """Write ``record`` over the Lease as last read; whether it was written (a
        concurrent writer makes it fail with 409)."""
        try:
            self._write(record)
        except ClusterError as e:
            log.info("%s: could not %s lease %s: %s", self.identity, what, self._describe(), e)
            return False
        self._set_observed(record)
        return True

    def _read(self) -> LeaderRecord | None:
        """The Lease's record as read now, keeping the Lease for the next write; ``None``
        when the API server failed. Raises :class:`NotFound` when there is no Lease."""
        try:
            lease = request_json(self._api_client, "GET", self._path, timeout=self._timeout)
        except NotFound:
            raise
        except ClusterError as e:
            log.info("%s: could not read lease %s: %s", self.identity, self._describe(), e)
            return None
        self._lease = lease
        return LeaderRecord.from_spec(lease.get("spec") or {})

    def _create(self, record: LeaderRecord) -> bool:
        """Create the Lease holding ``record``; whether it was created."""
        try:
            self._lease = request_json(
                self._api_client,
                "POST",
                f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases",
                body={
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": record.to_spec(),
                },
                timeout=self._timeout,
            )
        except ClusterError as e:
            log.info("%s: could not create lease %s: %s", self.identity, self._path, e)
            return False
        self._set_observed(record)
        return True

    def leader_record(self) -> LeaderRecord:
        """The election record as last observed."""
        with self._lock:
            return self._observed

    def _release(self) -> bool:
        """Give the Lease up if we hold it (client-go ``release``)."""
        observed = self.leader_record()
        if observed.holder != self.identity or self._lease is None:
            return True
        now = micro_time(self._clock())
        record = LeaderRecord(
            holder="",
            lease_duration_seconds=1,
            acquire_time=now,
            renew_time=now,
            transitions=observed.transitions,
        )
        try:
            self._write(record)
        except ClusterError as e:
            log.warning("%s: failed to release lease %s: %s", self.identity, self._describe(), e)
            return False
        self._set_observed(record)
        log.info("%s: released leader lease %s", self.identity, self._describe())
        return True


__all__ = ["JITTER_FACTOR", "LeaderElector", "LeaderRecord"]
