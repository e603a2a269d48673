"""Where an evicted victim's work went: its controller's replacement, followed from the
cache. Leader only.

The worker says which victim it is about to evict (:meth:`Follow.expect`, before the
eviction call, so a replacement the controller makes at once is not missed) and whether
the eviction happened (:meth:`Follow.evicted`). From then on the cache's pod changes
(:meth:`Follow.seen`, a subscriber: dictionary reads, no API call, no lock held for long)
tell where the replacement went. Each evicted victim gets one outcome:

* ``moved``: a pod of the victim's controller (same owner uid), added to the cache after
  the victim was expected, is bound to a node other than the resizing one;
* ``lost``: the victim had no controller that recreates it elsewhere (a bare pod, a
  DaemonSet's, a kind not known to recreate: :data:`~webhook.core.movable.RECREATED_BY`);
  or its replacement was bound to the resizing node, or the scheduler found it no node
  (``Unschedulable``, none nominated), or it was not bound within ``window`` seconds;
* ``unknown``: no replacement was seen within ``window`` seconds (the owner may be gone,
  or scaled down), the victim's owner uid was not known, or this replica stopped leading
  before the outcome was seen (what it followed is in memory only; a new leader does not
  follow the old one's victims, and a crashed process counts nothing).

The outcome is counted at once (``resize_preemption_victim_outcomes_total``); the event
on the resizing pod (``Moved``, ``NotMoved``) and the decision log's line are written by
this loop's own thread, so neither a resize nor an eviction ever waits on them.

``NotMoved`` is told only of a victim that could have moved (its controller recreates
it elsewhere) and did not. A victim nothing recreates elsewhere is lost by the plan
itself, as it is under kube-scheduler: the admission's warning named it to the resizing
pod's owner, it has its ``Preempted`` event, and the counter and the decision log say it
was lost; one more event would make each such preemption cost a request more than
kube-scheduler's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

import orjson

from webhook.base.loop import Loop
from webhook.base.metrics import Metrics
from webhook.core.model import Pod, PodRef
from webhook.core.movable import RECREATED_BY, judge
from webhook.engine.decision_log import emit
from webhook.engine.ledger import ClusterView

log = logging.getLogger(__name__)

Outcome = Literal["moved", "lost", "unknown"]

#: Seconds an evicted victim's replacement has to be bound before the victim counts as
#: lost (a replacement seen) or unknown (none seen). Long enough for a replacement that
#: waits on an image pull or on the scheduler's own preemption; short enough that an
#: operator reads the outcome while the resize is still news.
FOLLOW_WINDOW: Final = 300.0


@dataclass(slots=True)
class Followed:
    """One victim followed: who it made room for, on which node, and its owner."""

    victim: PodRef
    preemptor: PodRef
    node: str
    controller: str
    owner: str
    since: float
    #: Why its work is lost whatever happens next (no controller recreates it elsewhere).
    refused: str = ""
    evicted: bool = False
    replacement: PodRef | None = None


@dataclass(frozen=True, slots=True)
class Told:
    """An outcome, to be told in an event and a decision-log line."""

    followed: Followed
    outcome: Outcome
    why: str
    to: str = ""


class MoveEvents(Protocol):
    """Tells the resizing pod where a victim's work went; never raises."""

    def moved(self, preemptor: PodRef, victim: PodRef, replacement: PodRef, node: str) -> bool: ...

    def lost(self, preemptor: PodRef, victim: PodRef, why: str) -> bool: ...


def outcome_line(told: Told) -> bytes:
    """The decision log's line for an outcome (fields in docs/service.md)."""
    f = told.followed
    out: dict[str, Any] = {
        "victim": f.victim.key,
        "outcome": told.outcome,
        "pod": f.preemptor.key,
        "node": f.node,
        "why": told.why,
    }
    if f.replacement is not None:
        out["replacement"] = f.replacement.key
    if told.to:
        out["to"] = told.to
    return orjson.dumps(out)


def placed(f: Followed, pod: Pod) -> Told | None:
    """The outcome ``pod``, ``f``'s replacement as cached now, settles; ``None`` while it
    waits for the scheduler."""
    if pod.node and pod.node != f.node:
        return Told(
            f, "moved", f"its {f.controller} replaced it with {pod.key} on {pod.node}", pod.node
        )
    if pod.node:
        return Told(
            f, "lost", f"its replacement {pod.key} was bound to {f.node}, the resizing node"
        )
    if pod.unschedulable:
        return Told(f, "lost", f"the scheduler found no node for its replacement {pod.key}")
    return None


class Follow:
    """Follows evicted victims until each has an outcome; thread-safe. A
    :class:`~webhook.base.loop.Runnable` the service runs while this replica leads."""

    def __init__(
        self,
        cluster: ClusterView,
        metrics: Metrics,
        events: MoveEvents | None = None,
        clock: Callable[[], float] = time.time,
        *,
        window: float = FOLLOW_WINDOW,
        interval: float = 1.0,
    ) -> None:
        self.cluster = cluster
        self.metrics = metrics
        self.events = events
        self.clock = clock
        self.window = window
        self._lock = threading.Lock()
        #: Every victim followed, by uid.
        self._victims: dict[str, Followed] = {}
        #: Followed victims without a replacement yet, by owner uid, oldest first.
        self._owners: dict[str, list[Followed]] = {}
        #: Followed victims by their replacement's uid.
        self._replacements: dict[str, Followed] = {}
        self._told: deque[Told] = deque()
        self._loop = Loop(
            "victim-follow",
            self.run_once,
            period=interval,
            error_pause=interval,
            on_error=self._count_error,
        )

    # -- what the worker says ---------------------------------------------------------------

    def expect(self, preemptor: PodRef, node: str, victim: PodRef) -> None:
        """``victim`` is about to be evicted for ``preemptor``'s resize on ``node``."""
        pod = self.cluster.pod(victim.namespace, victim.name)
        if pod is None or pod.uid != victim.uid:
            return  # gone already: the eviction finds nothing to evict
        refused = "" if pod.controller in RECREATED_BY else judge(pod, ()).why
        f = Followed(
            victim, preemptor, node, pod.controller, pod.controller_uid, self.clock(), refused
        )
        with self._lock:
            self._victims[victim.uid] = f
            if not refused and f.owner:
                self._owners.setdefault(f.owner, []).append(f)

    def evicted(self, victim: PodRef, done: bool) -> None:
        """Whether the eviction of ``victim`` (expected before) happened."""
        with self._lock:
            f = self._victims.get(victim.uid)
            if f is None or f.evicted:
                return
            if not done:
                self._forget(f)
                return
            f.evicted = True
        if f.refused:
            self._settle(Told(f, "lost", f.refused))
        elif not f.owner:
            self._settle(Told(f, "unknown", f"its {f.controller} is not named by uid"))

    # -- what the cache says ----------------------------------------------------------------

    def seen(self, pod: Pod, added: bool) -> None:
        """A pod as the cache has it now; ``added``: new to the cache."""
        if not pod.controller_uid or not (self._owners or self._replacements):
            return
        with self._lock:
            f = self._replacements.get(pod.uid)
            if f is None and added and pod.uid not in self._victims:
                f = self._take(pod)
            if f is None or pod.leaving:
                return
            told = placed(f, pod)
        if told is not None:
            self._settle(told)

    def _take(self, pod: Pod) -> Followed | None:
        """The oldest victim of ``pod``'s owner still without a replacement; under the lock."""
        waiting = self._owners.get(pod.controller_uid)
        if not waiting:
            return None
        f = waiting.pop(0)
        if not waiting:
            del self._owners[pod.controller_uid]
        f.replacement = pod.ref
        self._replacements[pod.uid] = f
        return f

    # -- outcomes ------------------------------------------------------------------------------

    def _settle(self, told: Told) -> None:
        """Counts ``told`` once, and queues its event and line."""
        with self._lock:
            if self._victims.get(told.followed.victim.uid) is not told.followed:
                return  # settled already
            self._forget(told.followed)
            self._told.append(told)
        self.metrics.victim_outcomes.labels(told.outcome).inc()
        self._loop.wake()

    def _forget(self, f: Followed) -> None:
        """Under the lock."""
        self._victims.pop(f.victim.uid, None)
        waiting = self._owners.get(f.owner)
        if waiting is not None and f in waiting:
            waiting.remove(f)
            if not waiting:
                del self._owners[f.owner]
        if f.replacement is not None:
            self._replacements.pop(f.replacement.uid, None)

    def _overdue(self, now: float) -> list[Told]:
        """Outcomes of victims followed longer than the window; victims never evicted
        (the worker stopped between expect and evicted) are forgotten."""
        told = []
        with self._lock:
            for f in [f for f in self._victims.values() if now - f.since >= self.window]:
                if not f.evicted:
                    self._forget(f)
                    continue
                within = f"within {self.window:.0f}s"
                if f.replacement is not None:
                    why = f"its replacement {f.replacement.key} was not bound {within}"
                    told.append(Told(f, "lost", why))
                else:
                    told.append(Told(f, "unknown", f"no replacement seen {within}"))
        return told

    def run_once(self, stop: threading.Event | None = None) -> None:
        """Settles overdue victims, then tells every outcome not told yet."""
        for told in self._overdue(self.clock()):
            self._settle(told)
        while self._told and not (stop is not None and stop.is_set()):
            self._tell(self._told.popleft())

    def _tell(self, told: Told) -> None:
        f = told.followed
        log.info("victim %s of %s: %s, %s", f.victim.key, f.preemptor.key, told.outcome, told.why)
        emit([outcome_line(told)])
        if self.events is None:
            return
        if told.outcome == "moved" and f.replacement is not None:
            self.events.moved(f.preemptor, f.victim, f.replacement, told.to)
        elif told.outcome == "lost" and not f.refused:
            self.events.lost(f.preemptor, f.victim, told.why)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._loop.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stops following: victims evicted and not settled count as unknown (the next
        leader does not follow them); their lines are written, no event."""
        self._loop.stop(timeout)
        with self._lock:
            left = [f for f in self._victims.values() if f.evicted]
        for f in left:
            self._settle(Told(f, "unknown", "this replica stopped leading before it was seen"))
        with self._lock:
            self._victims.clear()
            self._owners.clear()
            self._replacements.clear()
            told, self._told = list(self._told), deque()
        for t in told:
            log.info("victim %s: %s, %s", t.followed.victim.key, t.outcome, t.why)
            emit([outcome_line(t)])

    @property
    def running(self) -> bool:
        return self._loop.running

    def _count_error(self) -> None:
        self.metrics.errors.labels("follow").inc()


__all__ = [
    "FOLLOW_WINDOW",
    "Follow",
    "Followed",
    "MoveEvents",
    "Outcome",
    "Told",
    "outcome_line",
    "placed",
]
