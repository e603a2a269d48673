"""The preemption worker: carries out admitted plans from the ledger. Leader only.

The admission path writes a ledger entry per admitted resize (its reservation and its
plan) and answers at once; this worker does the slow part. It runs as a
:class:`~webhook.engine.loop.Loop`: woken by :meth:`~PreemptionWorker.wake` (the service
calls it on every change of the cache or the ledger, and on every admission), or every
``interval`` seconds, it walks every entry: up to ``NODE_PARALLELISM`` nodes side by side, each
node's entries one after another, oldest admission first. For each it asks
:func:`webhook.engine.worker_logic.next_action` what to do and does it:

1. ``Release`` - remove the entry (its room is no longer held); evict nobody;
2. ``Wait`` - write pending bookkeeping (persisted flag, victims found gone), nothing more;
3. ``Act`` - take victims no longer needed off the claim first, then evict the listed
   victims in order; each is marked handled in the ledger right after it is done (the
   first mark also carries the rest of the bookkeeping: persisted, victims found gone).
   ``blocked-by-pdb`` or ``failed`` stops the entry's turn and it is retried later with
   exponential backoff (:class:`~webhook.engine.loop.Backoff`), or at once when a
   PodDisruptionBudget changes (it may allow the eviction now).

Guarantees:

* never evicts a victim twice: victims handled, terminating or gone are skipped (and the
  evictor itself reads the victim before acting, by uid);
* never evicts a pod the admitted plan did not name (``next_action`` re-plans restricted
  to the entry's own pending victims, and evicts fewer when room appeared);
* before each eviction the entry must still be in the ledger with the victim pending, and
  (from the second victim on) a fresh decision on the current cache must still name it:
  a newer resize of the same pod, a release, or room that appeared stops the old plan;
* before each eviction the replica must still lead (``may_act``): a leader that lost its
  Lease stops acting before another can have taken over (renew deadline < lease
  duration);
* a crash at any point loses nothing: the ledger is the state; on restart the leader
  resumes from it, and a victim evicted just before the crash is found terminating;
* errors are logged, counted (``rpw_errors{where="worker"}``) and retried; they never end
  the thread.

Only the leader must run it: the service registers it with
:class:`~webhook.engine.loop.Runnables` as needing leader election. It reaches the
cluster only through its ports (:mod:`webhook.engine.ports`): the cache, the ledger, an
evictor and an event sink, which ``webhook.kube`` provides.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from webhook.core.model import PodRef
from webhook.engine.config import Config
from webhook.engine.ledger import Ledger, LedgerEntry
from webhook.engine.loop import Backoff, Loop
from webhook.engine.metrics import Metrics
from webhook.engine.ports import ClusterView, EvictionResult, PreemptionEvents, VictimEvictor
from webhook.engine.worker_logic import Act, Action, Release, Wait, next_action

log = logging.getLogger(__name__)

#: Nodes whose admitted resizes one pass works on side by side. Each is a chain of API
#: calls (eviction, ledger write) that mostly waits on the API server; a burst of resizes
#: across many nodes then takes about as long as its busiest node, not the sum of all.
NODE_PARALLELISM = 8

EntryChange = tuple[tuple[LedgerEntry, ...] | None, bool]


# -- pure ledger changes (a store may call them again after a conflict) ----------------------


def remove_entry(review_uid: str) -> Callable[[tuple[LedgerEntry, ...]], EntryChange]:
    """Change: drop the entry admitted by ``review_uid``; result: whether it was there."""

    def change(entries: tuple[LedgerEntry, ...]) -> EntryChange:
        kept = tuple(e for e in entries if e.review_uid != review_uid)
        return (kept, True) if len(kept) != len(entries) else (None, False)

    return change


def update_entry(
    review_uid: str,
    *,
    handled: tuple[str, ...] = (),
    drop: tuple[str, ...] = (),
    persisted: bool = False,
) -> Callable[[tuple[LedgerEntry, ...]], EntryChange]:
    """Change: mark victims handled, take victims off, and/or mark the resize persisted in
    the entry admitted by ``review_uid``; result: whether the entry was there."""

    def change(entries: tuple[LedgerEntry, ...]) -> EntryChange:
        found = False
        out = []
        for e in entries:
            if e.review_uid == review_uid:
                found = True
                new = e
                for uid in handled:
                    new = new.with_handled(uid)
                if drop:
                    new = new.with_victims([v for v in new.victims if v.uid not in drop])
                if persisted and not new.persisted:
                    new = new.with_persisted()
                e = new
            out.append(e)
        if not found:
            return None, False
        result = tuple(out)
        return (result if result != entries else None), True

    return change


class PreemptionWorker:
    """Runs admitted plans; the service starts it when this replica gains leadership and
    stops it when it loses it."""

    def __init__(
        self,
        cluster: ClusterView,
        ledger: Ledger,
        evictor: VictimEvictor,
        config: Config,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        *,
        recorder: PreemptionEvents | None = None,
        interval: float = 1.0,
        backoff_base: float = 1.0,
        backoff_cap: float = 30.0,
        rng: Callable[[], float] = random.random,
        may_act: Callable[[], bool] | None = None,
        parallelism: int = NODE_PARALLELISM,
    ) -> None:
        self.cluster = cluster
        #: Nodes worked on at once in a pass (each node's entries one after another).
        self.parallelism = parallelism
        self._pool: ThreadPoolExecutor | None = None
        #: Checked before every eviction: a replica that lost its leadership (and whose
        #: worker has not stopped yet) must not act beside the new leader.
        self.may_act = may_act
        self.ledger = ledger
        self.evictor = evictor
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.recorder = recorder
        #: Entries whose last step failed (a refused or failed eviction, an error), by
        #: review uid.
        self.backoff = Backoff(backoff_base, backoff_cap, clock=clock, rng=rng)
        self._loop = Loop(
            "preemption-worker",
            self.run_once,
            period=interval,
            error_pause=interval,
            on_error=self._count_error,
        )
        self._lock = threading.Lock()
        self._announced: set[str] = set()  # review uids whose pod got its event
        self._budgets_changed = False

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread (idempotent); its first pass resumes whatever the
        ledger holds."""
        self._loop.start()
        log.info("preemption worker started")

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop after the victim in progress (never mid-call); waits up to ``timeout``.
        Idempotent: leadership loss, then exit."""
        self._loop.stop(timeout)
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            # Its threads finish the victim in progress (they see the stop flag) and end.
            pool.shutdown(wait=False)
        log.info("preemption worker stopped")

    @property
    def running(self) -> bool:
        return self._loop.running

    def wake(self, *, budgets_changed: bool = False) -> None:
        """Ask for a pass soon; cheap and thread-safe. ``budgets_changed``: a
        PodDisruptionBudget changed, which also ends every backoff (an eviction it refused
        may be allowed now)."""
        if budgets_changed:
            self._budgets_changed = True
        self._loop.wake()

    # -- one pass --------------------------------------------------------------------------------

    def run_once(self, stop: threading.Event | None = None) -> None:
        """One pass over every ledger entry (the loop's step); ends early, between two
        victims at the latest, once ``stop`` is set."""
        stop = stop or threading.Event()
        if not self.cluster.synced():
            return  # an empty cache would make every pod look gone
        if self._budgets_changed:
            self._budgets_changed = False
            self.backoff.reset()
        groups: dict[str, list[LedgerEntry]] = defaultdict(list)
        for entry in self.ledger.all_entries():
            groups[entry.node].append(entry)
        self.metrics.ledger_entries.set(sum(len(g) for g in groups.values()))
        live = {e.review_uid for g in groups.values() for e in g}
        nodes = sorted(groups, key=lambda n: min(e.admitted_at for e in groups[n]))
        if len(nodes) == 1 or self.parallelism <= 1:
            for node in nodes:
                self._process_node(groups[node], stop)
        else:
            # Nodes are independent (each has its own ledger object and its own room), so
            # they are worked on side by side; entries of one node stay in admission
            # order, since each one's claims shape the next one's plan.
            pool = self._node_pool()
            try:
                futures = [pool.submit(self._process_node, groups[n], stop) for n in nodes]
            except RuntimeError:
                if stop.is_set():
                    return  # stop() shut the pool down while this pass was starting
                raise
            for future in futures:
                future.result()
        if stop.is_set():
            return
        # Forget state of entries no longer in the ledger.
        self.backoff.retain(live)
        self._announced &= live

    def _process_node(self, entries: list[LedgerEntry], stop: threading.Event) -> None:
        for entry in sorted(entries, key=lambda e: (e.admitted_at, e.review_uid)):
            if stop.is_set():
                return
            try:
                self.process(entry, stop)
            except Exception:
                self._count_error()
                log.exception("processing the resize of %s failed", entry.pod.key)
                self.backoff.failed(entry.review_uid)

    def _count_error(self) -> None:
        # The series appears with the first error, not before.
        self.metrics.errors.labels("worker").inc()

    def _node_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.parallelism, thread_name_prefix="preemption-node"
                )
            return self._pool

    def decide(self, entry: LedgerEntry) -> Action:
        """``next_action`` for ``entry`` on the cache's current state."""
        pod = self.cluster.pod(entry.pod.namespace, entry.pod.name)
        node = self.cluster.node(entry.node)
        pods = tuple(self.cluster.pods_on(entry.node))
        budgets = tuple(self.cluster.budgets({p.namespace for p in pods}))
        others = tuple(
            e for e in self.ledger.entries(entry.node) if e.review_uid != entry.review_uid
        )
        return next_action(
            entry,
            pod,
            node,
            pods,
            now=self.clock(),
            config=self.config,
            budgets=budgets,
            others=others,
        )

    def process(self, entry: LedgerEntry, stop: threading.Event | None = None) -> Action | None:
        """Decide and carry out one step for ``entry``; ``None`` when backing off."""
        if not self.backoff.ready(entry.review_uid):
            return None
        action = self.decide(entry)
        if isinstance(action, Release):
            # 1. Nothing more to do for this resize: its room is released.
            self.ledger.update(entry.node, remove_entry(entry.review_uid))
            self.backoff.succeeded(entry.review_uid)
            log.info("released %s on %s: %s", entry.pod.key, entry.node, action.detail)
        elif isinstance(action, Wait):
            # 2. Bookkeeping only.
            if action.mark_persisted or action.settle:
                self._settle(entry, action.settle, persisted=action.mark_persisted)
        else:
            self._act(entry, action, stop or threading.Event())
        return action

    def _settle(
        self,
        entry: LedgerEntry,
        settle: tuple[PodRef, ...],
        *,
        persisted: bool,
        drop: tuple[PodRef, ...] = (),
        handled: tuple[PodRef, ...] = (),
    ) -> bool:
        for victim in settle:
            # Found leaving or gone in the cache: done without an API call.
            cached = self.cluster.pod(victim.namespace, victim.name)
            leaving = cached is not None and cached.uid == victim.uid
            result = EvictionResult.SKIPPED_TERMINATING if leaving else EvictionResult.GONE
            self.metrics.preemptions.labels(result.value).inc()
            log.info("victim %s of %s: %s", victim.key, entry.pod.key, result.value)
        for victim in drop:
            log.info("victim %s no longer needed by %s", victim.key, entry.pod.key)
        present: bool = self.ledger.update(
            entry.node,
            update_entry(
                entry.review_uid,
                handled=tuple(v.uid for v in (*settle, *handled)),
                drop=tuple(v.uid for v in drop),
                persisted=persisted,
            ),
        )
        return present

    def _still_needed(self, entry: LedgerEntry, victim: PodRef, first: bool) -> bool:
        """Whether ``victim`` must still go for ``entry``, judged on the ledger and cache
        as they are now: the entry may have been released or superseded, the victim
        handled, or room may have appeared since the action was decided (the victims
        before it are marked handled, so they count as leaving)."""
        current = next(
            (e for e in self.ledger.entries(entry.node) if e.review_uid == entry.review_uid),
            None,
        )
        if current is None or victim not in current.pending_victims:
            return False
        if first:
            return True  # decided a moment ago on this very state
        action = self.decide(current)
        return isinstance(action, Act) and victim in action.evict

    def _act(self, entry: LedgerEntry, action: Act, stop: threading.Event) -> None:
        # 3a. Victims no longer needed leave the claim before anyone is evicted: a claimed
        # victim counts as freeing room for every other resize on the node. The rest of
        # the bookkeeping (persisted, victims found leaving) changes nothing another
        # decision reads, so it rides on the first victim's mark instead of costing a
        # ledger write before the first eviction.
        carried = action.bookkeeping and not action.drop and bool(action.evict)
        if (
            action.bookkeeping
            and not carried
            and not self._settle(
                entry, action.settle, persisted=action.mark_persisted, drop=action.drop
            )
        ):
            return  # the entry went away meanwhile
        # 3b. Victims in order; each marked handled right after it is done.
        acted: list[PodRef] = []
        for i, victim in enumerate(action.evict):
            if stop.is_set() or not self._may_act():
                break
            if not self._still_needed(entry, victim, first=i == 0):
                break
            # Decided on the cache a moment ago: the victim is live under this uid.
            result = self.evictor.evict(victim, entry.pod, entry.node, seen_live=True)
            if not result.done:
                log.info(
                    "preempting %s for %s: %s; retrying later",
                    victim.key,
                    entry.pod.key,
                    result.value,
                )
                self.backoff.failed(entry.review_uid)
                break
            # A crash right here loses only this mark: the victim is terminating or gone,
            # and the next leader settles it from the cache without another API call.
            if carried:
                carried = False
                self._settle(
                    entry, action.settle, persisted=action.mark_persisted, handled=(victim,)
                )
            else:
                self.ledger.update(
                    entry.node, update_entry(entry.review_uid, handled=(victim.uid,))
                )
            if result in (EvictionResult.EVICTED, EvictionResult.DELETED):
                acted.append(victim)
        if carried:
            # Nobody was evicted after all: the bookkeeping still has to be written.
            self._settle(entry, action.settle, persisted=action.mark_persisted)
        if acted:
            self.backoff.succeeded(entry.review_uid)
            self._announce(entry, acted)

    def _announce(self, entry: LedgerEntry, victims: list[PodRef]) -> None:
        """One event on the resizing pod, when its first victims are acted on."""
        if entry.review_uid in self._announced:
            return
        self._announced.add(entry.review_uid)
        if self.recorder is not None:
            self.recorder.preempting(entry.pod, victims, entry.node)

    def _may_act(self) -> bool:
        if self.may_act is None or self.may_act():
            return True
        log.info("not leading any more: no eviction until leadership is back")
        return False


__all__ = ["NODE_PARALLELISM", "PreemptionWorker", "remove_entry", "update_entry"]
