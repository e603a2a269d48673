"""The preemption worker: carries out admitted plans from the ledger. Leader only.

The admission path writes a ledger entry per admitted resize (its reservation and its
plan) and answers at once; this worker does the slow part. It runs as a
:class:`~webhook.engine.loop.Loop`: woken by :meth:`~PreemptionWorker.wake` (the service
calls it on every change of the cache or the ledger, an admission's write included), or every
``interval`` seconds, it walks every entry: up to ``NODE_PARALLELISM`` nodes side by side, each
node's entries one after another, oldest admission first. For each it asks the lifecycle
(:func:`webhook.engine.lifecycle.next_action`) what to do and does it:

1. ``Release`` - evict nobody; the entry is removed from the ledger only when readers
   would still count it (``Release.write``: its pod is gone from the cache, or the plan
   was given up on). An entry whose resize was actuated, superseded or refused holds no
   room for any reader (:func:`webhook.engine.lifecycle.phase`), nor does an expired
   one; the next write to its node drops it;
2. ``Wait`` - nothing;
3. ``Act`` - take victims no longer needed off the claim first (a ledger write, only when
   room appeared), then make the plan's pending loans (``pods/resize`` on each lender,
   through a :class:`~webhook.engine.loans.LenderResizer`), then evict the listed victims
   together, as kube-scheduler's executor removes a candidate's victims (at most
   ``VICTIM_PARALLELISM`` calls at once): the resize waits for the slowest victim, not for
   the sum of them. A loan that fails stops the entry's turn before any eviction. A victim
   ``blocked-by-pdb`` or ``failed`` does not hold back the others; the entry is retried
   later with exponential backoff (:class:`~webhook.engine.loop.Backoff`), or at once when
   a PodDisruptionBudget changes (it may allow the eviction now).

So a plan carried out as admitted costs no ledger write here: the admission's write is
the only one. Which victims are done is read from the cluster (terminating, gone, or
another uid), not written: the victims this worker evicted are remembered in memory only
until its cache shows them leaving, a watch delay later.

Guarantees:

* never lends twice: a loan is made only while its lender still asks for the loan's
  ``before`` as the cache holds it, and the resizer's patch carries that copy's uid and
  resourceVersion as preconditions (a copy the lender has moved on from fails, and is
  judged again when the cache has caught up); a lender at or below ``after`` has lent,
  and one whose owner changed it owes nothing;
* never evicts a victim twice: victims terminating or gone in the cache, or evicted by
  this worker and not yet seen leaving, are skipped; the eviction carries the victim's
  uid as a precondition;
* never evicts a pod the admitted plan did not name (``next_action`` re-plans restricted
  to the entry's own pending victims, and evicts fewer when room appeared), except after
  a loan the kubelet refused: the plan made again without its lender is written into the
  entry first, and only its victims may go;
* a loan the kubelet refused is recorded (one write), put back (the lender's spec from
  the loan's ``after`` to its ``before``, with its uid and resourceVersion as
  preconditions) and counted once in ``resize_preemption_loans_total{result="refused"}``;
* the victims evicted together are the ones a decision on the current cache named a
  moment before, and before each eviction the entry must still be in the ledger with the
  victim pending: a newer resize of the same pod or a release stops the old plan;
* before each eviction the replica must still lead (``may_act``): a leader that lost its
  Lease stops acting before another can have taken over (renew deadline < lease
  duration);
* a crash at any point loses nothing: the ledger is the state; on restart the leader
  resumes from it, and a victim evicted before the crash is found terminating (a new
  leader acts only after the old one's Lease ran out, seconds after its last eviction
  reached every watch);
* errors are logged, counted (``resize_preemption_errors_total{where="worker"}``) and
  retried; they never end the thread.

Only the leader must run it: the service registers it with
:class:`~webhook.engine.loop.Runnables` as needing leader election. It reaches the
cluster only through its ports (:mod:`webhook.engine.ports`): the cache, the ledger, an
evictor and an event sink, which ``webhook.kube`` provides. The event sink hears only of
plans given up on with victims left (``abandoned``); a plan carried out is told by the
victims' ``Preempted`` events, as upstream's.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from webhook.core.model import PodRef
from webhook.engine.config import Config
from webhook.engine.ledger import Ledger, LedgerEntry
from webhook.engine.lifecycle import Act, Action, Refuse, Release, Wait, next_action, room_holders
from webhook.engine.loans import (
    LenderResizer,
    LoanResult,
    give_backs,
    lent_on,
    record_refusal,
    to_put_back,
)
from webhook.engine.loop import Backoff, KeyedBackoff, Loop
from webhook.engine.metrics import RESOURCE_UNITS, Metrics, in_base_unit
from webhook.engine.ports import (
    ClusterView,
    EvictionResult,
    PreemptionEvents,
    VictimEvictor,
)

#: Releases that give up on a plan: victims still live then were never evicted for it,
#: and nobody else tells the resizing pod's owner so.
ABANDONING = frozenset({"expired", "replan", "not-eligible"})

log = logging.getLogger(__name__)

#: Nodes whose admitted resizes one pass works on side by side. Each is a chain of API
#: calls (eviction, ledger write) that mostly waits on the API server; a burst of resizes
#: across many nodes then takes about as long as its busiest node, not the sum of all.
NODE_PARALLELISM = 8
#: Victims of one plan evicted at once, at most (upstream's parallelizer default). Each
#: eviction is a request and an event that wait on the API server, not on each other.
VICTIM_PARALLELISM = 16

EntryChange = tuple[tuple[LedgerEntry, ...] | None, bool]


# -- pure ledger changes (a store may call them again after a conflict) ----------------------


def remove_entry(review_uid: str) -> Callable[[tuple[LedgerEntry, ...]], EntryChange]:
    """Change: drop the entry admitted by ``review_uid``; result: whether it was there.

    An entry with loans is not dropped but made to hold no room (expired, no victims):
    its loans are given back from it, and the next write to the node drops it once they
    are (:func:`webhook.engine.lifecycle.to_keep`)."""

    def change(entries: tuple[LedgerEntry, ...]) -> EntryChange:
        found = False
        out = []
        for e in entries:
            if e.review_uid != review_uid:
                out.append(e)
                continue
            found = True
            if e.loans:
                out.append(replace(e, expires_at=min(e.expires_at, e.admitted_at), victims=()))
        result = tuple(out)
        return (result if result != entries else None), found

    return change


def update_entry(
    review_uid: str, *, drop: tuple[str, ...]
) -> Callable[[tuple[LedgerEntry, ...]], EntryChange]:
    """Change: take the victims ``drop`` (uids) off the entry admitted by ``review_uid``,
    so its reservation stops claiming them; result: whether the entry was there."""

    def change(entries: tuple[LedgerEntry, ...]) -> EntryChange:
        found = False
        out = []
        for e in entries:
            if e.review_uid == review_uid:
                found = True
                e = e.with_victims([v for v in e.victims if v.uid not in drop])
            out.append(e)
        if not found:
            return None, False
        result = tuple(out)
        return (result if result != entries else None), True

    return change


def refuse_entry(
    review_uid: str, action: Refuse
) -> Callable[[tuple[LedgerEntry, ...]], EntryChange]:
    """Change: record ``action``'s refused loans, and its new plan, in the entry admitted
    by ``review_uid`` (:func:`~webhook.engine.loans.record_refusal`); result:
    whether that recorded anything (the entry is there, and did not have them already)."""

    def change(entries: tuple[LedgerEntry, ...]) -> EntryChange:
        out = tuple(record_refusal(e, action) if e.review_uid == review_uid else e for e in entries)
        return (out, True) if out != entries else (None, False)

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
        victim_parallelism: int = VICTIM_PARALLELISM,
        resizer: LenderResizer | None = None,
    ) -> None:
        self.cluster = cluster
        #: Makes loans; without one a plan's loans are never made (nor its victims
        #: evicted: they were chosen to go with the loans).
        self.resizer = resizer
        #: Nodes worked on at once in a pass (each node's entries one after another).
        self.parallelism = parallelism
        self._pool: ThreadPoolExecutor | None = None
        #: Victims of one plan evicted at once (shared by the nodes worked on).
        self.victim_parallelism = victim_parallelism
        self._victim_pool: ThreadPoolExecutor | None = None
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
        self.backoff = KeyedBackoff(
            Backoff(initial=backoff_base, factor=2.0, cap=backoff_cap, jitter=(0.5, 1.0)),
            clock=clock,
            rng=rng,
        )
        self._loop = Loop(
            "preemption-worker",
            self.run_once,
            period=interval,
            error_pause=interval,
            on_error=self._count_error,
        )
        self._lock = threading.Lock()
        #: Victim uids this worker evicted that the cache may not show leaving yet.
        self._evicted: set[str] = set()
        #: (review uid, victim uid) found leaving and counted once.
        self._settled: set[tuple[str, str]] = set()
        #: Review uids released (logged, told) once; the entry may stay in the ledger.
        self._released: set[str] = set()
        #: Review uids seen not actuated yet: their actuation is timed (a new leader
        #: cannot tell when an entry it finds spent was actuated).
        self._unactuated: set[str] = set()
        self._started_at = float("inf")
        self._budgets_changed = False
        #: Nodes whose ``resize_preemption_lent_resources`` was set by the last pass.
        self._lent_nodes: set[str] = set()

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread (idempotent); its first pass resumes whatever the
        ledger holds."""
        self._started_at = min(self._started_at, self.clock())
        self._loop.start()
        log.info("preemption worker started")

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop after the victim in progress (never mid-call); waits up to ``timeout``.
        Idempotent: leadership loss, then exit."""
        self._loop.stop(timeout)
        with self._lock:
            pools = (self._pool, self._victim_pool)
            self._pool = self._victim_pool = None
        for pool in pools:
            if pool is not None:
                # Its threads finish the victim in progress (they see the stop flag) and end.
                pool.shutdown(wait=False)
        # A replica that no longer leads tells nothing of the loans out.
        self.metrics.oldest_loan_age.set(0.0)
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
        if not self._cache_current():
            return  # the pass runs again every interval: once the watches are back
        if self._budgets_changed:
            self._budgets_changed = False
            self.backoff.reset()
        groups: dict[str, list[LedgerEntry]] = defaultdict(list)
        for entry in self.ledger.all_entries():
            groups[entry.node].append(entry)
        now = self.clock()
        self.metrics.ledger_entries.set(
            sum(len(room_holders(g, self.cluster.pods_on(n), now)) for n, g in groups.items())
        )
        self._count_lent(groups, now)
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
        # Forget state of entries no longer in the ledger, and evictions the cache shows.
        self.backoff.retain(live)
        self._released &= live
        self._unactuated &= live
        self._settled = {k for k in self._settled if k[0] in live}
        with self._lock:
            self._evicted = {
                v.uid
                for g in groups.values()
                for e in g
                for v in e.victims
                if v.uid in self._evicted and self._live(v)
            }

    def _count_lent(self, groups: dict[str, list[LedgerEntry]], now: float) -> None:
        """``resize_preemption_lent_resources``: what the loans the ledger records and the
        cache shows made free, per node and resource (0 on a node whose entries are gone);
        ``resize_preemption_oldest_loan_age_seconds``: how long ago the oldest entry with a
        loan still out was admitted (a loan is made right after its admission)."""
        oldest: float | None = None
        for node in self._lent_nodes - set(groups):
            for resource in ("cpu", "memory"):
                self.metrics.lent.labels(node, resource, RESOURCE_UNITS[resource][0]).set(0)
        self._lent_nodes = set(groups)
        for node, entries in groups.items():
            lent, since = lent_on(entries, self.cluster.pods_on(node))
            if since is not None:
                oldest = since if oldest is None else min(oldest, since)
            for resource, amount in lent.items():
                unit, value = in_base_unit(resource, amount)
                self.metrics.lent.labels(node, resource, unit).set(value)
        self.metrics.oldest_loan_age.set(0.0 if oldest is None else max(0.0, now - oldest))

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
        if any(e.loans for e in entries) and not stop.is_set():
            try:
                self.give_back(entries[0].node, stop)
            except Exception:
                self._count_error()
                log.exception("giving loans back on %s failed", entries[0].node)

    def give_back(self, node_name: str, stop: threading.Event | None = None) -> int:
        """Return the loans on ``node_name`` the node has room for now
        (:func:`webhook.engine.loans.give_backs`); how many were returned. Nothing is
        written: a loan given back is read from the lender (its spec at ``before``), and
        the next write to the node drops the entry once the kubelet actuated it."""
        node = self.cluster.node(node_name)
        if node is None or self.resizer is None:
            return 0
        entries = self.ledger.entries(node_name)
        done = 0
        for give in give_backs(node, tuple(self.cluster.pods_on(node_name)), entries, self.clock()):
            if (stop is not None and stop.is_set()) or not self._may_act():
                break
            borrower = next(e.pod for e in entries if e.review_uid == give.review_uid)
            result = self.resizer.give_back(give.loan, borrower, node_name)
            if result is LoanResult.FAILED:
                break  # judged again on the next pass, on fresh state
            done += result is LoanResult.LENT
        return done

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

    def _victims_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._victim_pool is None:
                self._victim_pool = ThreadPoolExecutor(
                    max_workers=self.victim_parallelism, thread_name_prefix="preemption-victim"
                )
            return self._victim_pool

    def _live(self, victim: PodRef) -> bool:
        cached = self.cluster.pod(victim.namespace, victim.name)
        return (
            cached is not None
            and cached.uid == victim.uid
            and not (cached.terminating or cached.terminal)
        )

    def _with_evicted(self, entry: LedgerEntry) -> LedgerEntry:
        """``entry`` as this worker knows it: its victims evicted here count as handled,
        whether or not the cache has seen them leave yet (never written)."""
        with self._lock:
            done = {v.uid for v in entry.victims if v.uid in self._evicted}
        return replace(entry, handled=entry.handled | done) if done else entry

    def decide(self, entry: LedgerEntry) -> Action:
        """``next_action`` for ``entry`` on the cache's current state."""
        pod = self.cluster.pod(entry.pod.namespace, entry.pod.name)
        node = self.cluster.node(entry.node)
        pods = tuple(self.cluster.pods_on(entry.node))
        budgets = tuple(self.cluster.budgets({p.namespace for p in pods}))
        others = tuple(
            self._with_evicted(e)
            for e in self.ledger.entries(entry.node)
            if e.review_uid != entry.review_uid
        )
        return next_action(
            self._with_evicted(entry),
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
        # Refused loans are put back whatever the entry does next (also after a restart
        # between recording a refusal and putting the lender back).
        self._put_back(entry)
        action = self.decide(entry)
        if not isinstance(action, Release):
            self._unactuated.add(entry.review_uid)
        if isinstance(action, Refuse):
            self._refuse(entry, action)
        elif isinstance(action, Release):
            # 1. Nothing more to do for this resize.
            self._release(entry, action)
        elif isinstance(action, Wait):
            # 2. Nothing to write: victims found leaving are read from the cluster.
            self._count_settled(entry, action.settle)
        else:
            self._act(entry, action, stop or threading.Event())
        return action

    def _refuse(self, entry: LedgerEntry, action: Refuse) -> None:
        """Record the refusal and the new plan in one ledger write, then put the lenders
        back; the next pass carries the new plan out. The write comes first: a lender put
        back before it would look like a loan still to make."""
        if not self.ledger.update(entry.node, refuse_entry(entry.review_uid, action)):
            return  # gone meanwhile, or recorded already (counted then)
        for loan in action.loans:
            self.metrics.loans.labels("refused").inc()
            log.info(
                "the kubelet refused the loan of %s %s from %s to %s: %s; %s",
                loan.resource,
                loan.pod.key,
                loan.before,
                entry.pod.key,
                action.why,
                "planned again without it"
                if action.plan is not None
                else "no plan makes room without it",
            )
        self._put_back(record_refusal(entry, action), action.why)
        self._loop.wake()

    def _put_back(self, entry: LedgerEntry, why: str = "") -> None:
        """Put back the entry's refused loans whose lender still asks for the loan's
        ``after``; a failure backs the entry off (tried again on a later pass)."""
        if not entry.refused or self.resizer is None:
            return
        pods = tuple(self.cluster.pods_on(entry.node))
        errors = {p.uid: p.resize_error for p in pods}
        for loan in to_put_back(entry, pods):
            if not self._may_act():
                return
            reason = why or errors.get(loan.pod.uid) or "the kubelet could not actuate it"
            if self.resizer.put_back(loan, entry.pod, entry.node, reason) is LoanResult.FAILED:
                self.backoff.failed(entry.review_uid)
                return

    def _release(self, entry: LedgerEntry, action: Release) -> None:
        if action.write:
            self.ledger.update(entry.node, remove_entry(entry.review_uid))
        self.backoff.succeeded(entry.review_uid)
        if entry.review_uid in self._released:
            return
        self._released.add(entry.review_uid)
        if action.reason == "actuated":
            self._time_actuation(entry)
        log.info("released %s on %s: %s", entry.pod.key, entry.node, action.detail)
        if action.reason not in ABANDONING or self.recorder is None:
            return
        left = [v for v in self._with_evicted(entry).pending_victims if self._live(v)]
        if left:
            self.recorder.abandoned(entry.pod, left, entry.node, action.detail)

    def _time_actuation(self, entry: LedgerEntry) -> None:
        """Observes admission to actuation once per entry, for entries this worker saw
        waiting or that were admitted while it ran; up to a pass late (``interval``)."""
        if entry.review_uid in self._unactuated or entry.admitted_at >= self._started_at:
            self._unactuated.discard(entry.review_uid)
            self.metrics.time_to_actuation.observe(max(0.0, self.clock() - entry.admitted_at))

    def _count_settled(self, entry: LedgerEntry, settle: tuple[PodRef, ...]) -> None:
        """Counts each victim found leaving or gone once per entry; no API call."""
        for victim in settle:
            key = (entry.review_uid, victim.uid)
            if key in self._settled:
                continue
            self._settled.add(key)
            with self._lock:
                if victim.uid in self._evicted:
                    continue  # counted when it was evicted
            cached = self.cluster.pod(victim.namespace, victim.name)
            leaving = cached is not None and cached.uid == victim.uid
            result = EvictionResult.SKIPPED_TERMINATING if leaving else EvictionResult.GONE
            self.metrics.preemptions.labels(result.value).inc()
            log.info("victim %s of %s: %s", victim.key, entry.pod.key, result.value)

    def _still_pending(self, entry: LedgerEntry, victim: PodRef) -> bool:
        """Whether ``victim`` must still go for ``entry`` by the ledger as it is now: the
        entry may have been released or superseded since the action was decided."""
        current = next(
            (e for e in self.ledger.entries(entry.node) if e.review_uid == entry.review_uid),
            None,
        )
        return current is not None and victim in self._with_evicted(current).pending_victims

    def _act(self, entry: LedgerEntry, action: Act, stop: threading.Event) -> None:
        self._count_settled(entry, action.settle)
        # 3a. Victims no longer needed leave the claim before anyone is evicted: a claimed
        # victim counts as freeing room for every other resize on the node.
        if action.drop:
            for victim in action.drop:
                log.info("victim %s no longer needed by %s", victim.key, entry.pod.key)
            dropped = update_entry(entry.review_uid, drop=tuple(v.uid for v in action.drop))
            if not self.ledger.update(entry.node, dropped):
                return  # the entry went away meanwhile
        # 3b. Loans before evictions: one is actuated at once, an eviction waits out a
        # grace period. Nothing is written: whether a loan is made is read from the lender.
        if action.lend and not self._lend(entry, action, stop):
            return
        # 3c. The victims together. Nothing is written after an eviction: a crash right
        # after one loses only this process's memory of it, and the victim is terminating
        # or gone in every cache by the time another leader may act.
        results = self._evict_all(entry, action.evict, stop)
        if any(not r.done for r in results if r is not None):
            self.backoff.failed(entry.review_uid)
        elif any(r is not None for r in results):
            self.backoff.succeeded(entry.review_uid)

    def _evict_all(
        self, entry: LedgerEntry, victims: tuple[PodRef, ...], stop: threading.Event
    ) -> list[EvictionResult | None]:
        """Evict ``victims`` side by side (one alone on this thread); each one's result,
        ``None`` for a victim not evicted (stopped, or no longer pending)."""
        if len(victims) == 1 or self.victim_parallelism <= 1:
            return [self._evict_one(entry, v, stop) for v in victims]
        pool = self._victims_pool()
        try:
            futures = [pool.submit(self._evict_one, entry, v, stop) for v in victims]
        except RuntimeError:
            if stop.is_set():
                return []  # stop() shut the pool down meanwhile
            raise
        return [f.result() for f in futures]

    def _evict_one(
        self, entry: LedgerEntry, victim: PodRef, stop: threading.Event
    ) -> EvictionResult | None:
        """Evict one victim still pending for ``entry`` while this replica may act; a
        failure is logged here and backs the entry off in the caller."""
        if stop.is_set() or not self._may_act() or not self._still_pending(entry, victim):
            return None
        # Decided on the cache a moment ago: the victim is live under this uid.
        result = self.evictor.evict(victim, entry.pod, entry.node, seen_live=True)
        if result.done:
            with self._lock:
                self._evicted.add(victim.uid)
        else:
            log.info(
                "preempting %s for %s: %s; retrying later", victim.key, entry.pod.key, result.value
            )
        return result

    def _lend(self, entry: LedgerEntry, action: Act, stop: threading.Event) -> bool:
        """Make ``action``'s loans in order; whether all are done (made, or owed no
        more), so that the evictions may follow."""
        if self.resizer is None:
            log.warning("resize of %s needs loans and nothing can make them", entry.pod.key)
            self.backoff.failed(entry.review_uid)
            return False
        for loan in action.lend:
            if stop.is_set() or not self._may_act():
                return False
            current = next(
                (e for e in self.ledger.entries(entry.node) if e.review_uid == entry.review_uid),
                None,
            )
            if current is None:
                return False  # released meanwhile: nobody needs the room any more
            result = self.resizer.lend(loan, entry.pod, entry.node)
            if result is LoanResult.VOID:
                # The lender changed since the decision: decide again before evicting.
                self._loop.wake()
                return False
            if not result.done:
                log.info(
                    "lending from %s for %s failed; retrying later", loan.pod.key, entry.pod.key
                )
                self.backoff.failed(entry.review_uid)
                return False
        self.backoff.succeeded(entry.review_uid)
        return True

    def _may_act(self) -> bool:
        if not self._cache_current():
            return False
        if self.may_act is None or self.may_act():
            return True
        log.info("not leading any more: no eviction until leadership is back")
        return False

    def _cache_current(self) -> bool:
        """False while the cache's watches have been lost longer than
        ``max_cache_staleness``: a victim's or a lender's state read from it may be that
        old, so nothing is released, lent or evicted on it."""
        stale = self.cluster.staleness()
        if self.config.cache_current(stale):
            return True
        log.info("cache watches lost %.0fs ago: no eviction until they are back", stale)
        return False


__all__ = [
    "ABANDONING",
    "NODE_PARALLELISM",
    "VICTIM_PARALLELISM",
    "PreemptionWorker",
    "refuse_entry",
    "remove_entry",
    "update_entry",
]
