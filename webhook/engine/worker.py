"""The preemption worker: carries out the ledger's admitted plans. Leader only.

A :class:`~webhook.base.loop.Loop`, woken on every change of the cache or the ledger and
every ``interval`` seconds. A pass walks the ledger: up to ``NODE_PARALLELISM`` nodes side
by side, each node's entries oldest admission first. For each entry it asks the lifecycle
what to do (:func:`~webhook.engine.lifecycle.next_step.next_action`) and does it:

1. ``Release``: evict nobody; remove the entry only when readers would still count it;
2. ``Wait``: nothing;
3. ``Refuse``: record the kubelet's refusal of a loan and put the lender back;
4. ``Act``: drop victims no longer needed, make the pending loans
   (:class:`~webhook.engine.loans.Lending`), then evict the listed victims together, at
   most ``VICTIM_PARALLELISM`` at once, as kube-scheduler's executor does.

Guarantees: it evicts only pods the admitted plan names, never twice (the victim's uid is
a precondition); before each loan and each eviction the replica still leads, its cache is
current, and the entry is still current (:meth:`PreemptionWorker.current`); the ledger is
the state, so a crash loses nothing; errors are logged, counted and retried. A plan
carried out as admitted costs no ledger write here.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from itertools import islice
from math import inf

import orjson

from webhook.base.loop import Backoff, KeyedBackoff, Loop
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.errors import WebhookError
from webhook.core.model import PodRef
from webhook.engine.decision_log import emit
from webhook.engine.follow import Follow
from webhook.engine.ledger import (
    ClusterView,
    EvictionResult,
    Ledger,
    LedgerEntry,
    PreemptionEvents,
    VictimEvictor,
)
from webhook.engine.lifecycle.changes import drop_victims, release, tidy
from webhook.engine.lifecycle.next_step import Act, Action, Refuse, Release, Wait, next_action
from webhook.engine.lifecycle.states import room_holders, wanted
from webhook.engine.loans import LenderResizer, Lending

#: Releases that give up on a plan: victims still live then were never evicted for it,
#: and nobody else tells the resizing pod's owner so.
ABANDONING = frozenset({"expired", "replan", "not-eligible"})

#: Results of an eviction this worker made: the victim's controller, if any, replaces it now.
EVICTING = frozenset({EvictionResult.EVICTED, EvictionResult.DELETED})

log = logging.getLogger(__name__)

#: Nodes whose admitted resizes one pass works on side by side. Each is a chain of API
#: calls (eviction, ledger write) that mostly waits on the API server; a burst of resizes
#: across many nodes then takes about as long as its busiest node, not the sum of all.
NODE_PARALLELISM = 8
#: Victims of one plan evicted at once, at most (upstream's parallelizer default). Each
#: eviction is a request and an event that wait on the API server, not on each other.
VICTIM_PARALLELISM = 16
#: Seconds between two looks, while a pass's nodes are busy, for nodes a wake brought.
TAKE_UP = 0.05


class PreemptionWorker:
    """Runs admitted plans; the service starts it when this replica gains leadership and
    stops it when it loses it. ``restore`` runs at the end of each pass: checkpointed
    victims come back once room returns (:class:`~webhook.engine.pauses.Restorer`)."""

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
        follow: Follow | None = None,
        restore: Callable[[], None] | None = None,
    ) -> None:
        self.cluster, self.restore = cluster, restore
        #: Told of each eviction, to follow where the victim's work goes.
        self.follow = follow
        #: Nodes worked on at once in a pass (each node's entries one after another).
        self.parallelism = parallelism
        self._pool: ThreadPoolExecutor | None = None
        #: Victims of one plan evicted at once; the nodes worked on share one pool.
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
        #: Whether the last pass found an entry that lends (its figures are zeroed once),
        #: and the nodes where it found a lender carrying a loan record.
        self._lending, self._lender_nodes = False, frozenset[str]()
        #: Review uids seen not actuated yet: their actuation is timed (a new leader
        #: cannot tell when an entry it finds spent was actuated).
        self._unactuated: set[str] = set()
        self._started_at, self._budgets_changed = float("inf"), False
        #: Set by :meth:`wake`: a pass under way looks for nodes with new work.
        self._woken = threading.Event()
        #: Makes, puts back and gives back the ledger's loans.
        self.lending = Lending(
            cluster,
            ledger,
            metrics,
            clock,
            resizer,
            _Handle(self),
        )

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
        self.lending.stop()
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
        self._woken.set()
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
        self._woken.clear()
        groups = self._groups()
        now = self.clock()
        # Set here, the one place, on every pass: expired and spent entries leave the
        # count without anyone writing the Lease, and a plain set reaches every scrape,
        # whichever process serves it.
        self.metrics.ledger_entries.set(
            sum(len(room_holders(g, self.cluster.pods_on(n), now)) for n, g in groups.items())
        )
        lending = {n: g for n, g in groups.items() if any(e.lends for e in g)}
        if lending or self._lending:  # once more after the last loan, to zero its figures
            self.lending.count(lending, now)
        self._lending = bool(lending)
        if self.parallelism <= 1:
            for node in _oldest_first(groups):
                self._process_node(node, groups[node], stop)
        else:
            self._work_nodes(groups, stop)
        if stop.is_set():
            return
        self._forget_gone()
        if self.restore is not None and self._may_act():
            self.restore()

    def _groups(self) -> dict[str, list[LedgerEntry]]:
        """The ledger's entries by node, and the nodes with work but no entry: a lender
        carrying a loan record (an orphan's give-back) or a store to tidy."""
        groups: dict[str, list[LedgerEntry]] = defaultdict(list)
        for entry in self.ledger.all_entries():
            groups[entry.node].append(entry)
        self._lender_nodes = frozenset(p.node for p in self.cluster.lenders() if p.node)
        for node in self._lender_nodes | self.ledger.untidy():
            groups.setdefault(node, [])
        return groups

    def _work_nodes(self, groups: dict[str, list[LedgerEntry]], stop: threading.Event) -> None:
        """Works on ``groups``' nodes side by side, and takes up a node with new work as
        soon as a wake says so, until every node taken up has finished. Nodes are
        independent (each has its own ledger object and its own room); entries of one node
        stay in admission order, since each one's claims shape the next one's plan. A node
        is never worked on twice at once."""
        pool = self._node_pool()
        busy: dict[str, Future[None]] = {}
        while True:
            for node in _oldest_first(groups):
                if node not in busy:
                    try:
                        busy[node] = pool.submit(self._process_node, node, groups[node], stop)
                    except RuntimeError:
                        if stop.is_set():
                            return  # stop() shut the pool down while this pass was running
                        raise
            wait(busy.values(), timeout=TAKE_UP, return_when=FIRST_COMPLETED)
            if stop.is_set():
                wait(busy.values())  # each ends after its victim in progress
            for node in [n for n, f in busy.items() if f.done()]:
                busy.pop(node).result()
            if not busy or stop.is_set():
                return
            groups = {}
            if self._woken.is_set():
                self._woken.clear()  # before the read: a wake during it is not lost
                groups = self._groups()

    def _forget_gone(self) -> None:
        """Forgets state of entries no longer in the ledger, and evictions the cache shows."""
        entries = self.ledger.all_entries()
        live = {e.review_uid for e in entries}
        self.backoff.retain(live)
        self._released &= live
        self._unactuated &= live
        self._settled = {k for k in self._settled if k[0] in live}
        with self._lock:
            self._evicted = {
                v.uid
                for e in entries
                for v in e.victims
                if v.uid in self._evicted and self._live(v)
            }

    def _process_node(self, node: str, entries: list[LedgerEntry], stop: threading.Event) -> None:
        """One node's turn: its entries in admission order, then its ledger tidied when
        the store holds void entries, then the loans given back (orphans included) and
        the records of ended loans removed."""
        for entry in sorted(entries, key=lambda e: (e.admitted_at, e.review_uid)):
            if stop.is_set():
                return
            try:
                self.process(entry, stop)
            except Exception:
                self._count_error()
                log.exception("processing the resize of %s failed", entry.pod.key)
                self.backoff.failed(entry.review_uid)
        if stop.is_set() or not node:
            return
        if node in self.ledger.untidy():
            self._tidy(node)
        if any(e.lends for e in entries) or node in self._lender_nodes:
            self.lending.give_back(node, stop)

    def _tidy(self, node: str) -> None:
        """Write ``node``'s entries as the store reads them, through the keep rule: the
        store holds entries its reads leave out (a late write's void entry). Tried again
        on every pass while it fails."""
        pods = tuple(self.cluster.pods_on(node))
        try:
            self.ledger.update(node, tidy(pods, self.clock()))
        except WebhookError as e:
            log.info("ledger %s: void entries not dropped yet: %s", node, e)

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
                    max_workers=self.parallelism * self.victim_parallelism,
                    thread_name_prefix="preemption-victim",
                )
            return self._victim_pool

    def _live(self, victim: PodRef) -> bool:
        cached = self.cluster.pod(victim.namespace, victim.name)
        return cached is not None and cached.uid == victim.uid and not cached.leaving

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
        labels = None if pod is None else self.cluster.namespace_labels(pod.namespace)
        return next_action(
            self._with_evicted(entry),
            pod,
            node,
            pods,
            now=self.clock(),
            config=self.config,
            budgets=budgets,
            others=others,
            labels=labels,
        )

    def process(self, entry: LedgerEntry, stop: threading.Event | None = None) -> Action | None:
        """Decide and carry out one step for ``entry``; ``None`` when backing off."""
        if not self.backoff.ready(entry.review_uid):
            return None
        if entry.lends:
            # Refused loans are put back whatever the entry does next (also after a
            # restart between recording a refusal and putting the lender back).
            self.lending.put_back(entry)
        action = self.decide(entry)
        if not isinstance(action, Release):
            self._unactuated.add(entry.review_uid)
        if isinstance(action, Refuse):
            self.lending.refuse(entry, action)
        elif isinstance(action, Release):
            # 1. Nothing more to do for this resize.
            self._release(entry, action)
        elif isinstance(action, Wait):
            # 2. Nothing to write: victims found leaving are read from the cluster.
            self._count_settled(entry, action.settle)
        else:
            self._act(entry, action, stop or threading.Event())
        return action

    def _release(self, entry: LedgerEntry, action: Release) -> None:
        if action.write:
            pods = tuple(self.cluster.pods_on(entry.node))
            self.ledger.update(entry.node, release(entry.review_uid, pods, self.clock()))
        self.backoff.succeeded(entry.review_uid)
        if entry.review_uid in self._released:
            return
        self._released.add(entry.review_uid)
        if action.reason == "actuated":
            self._time_actuation(entry)
        if action.rule is not None:
            self._disallowed(entry, action)
        log.info("released %s on %s: %s", entry.pod.key, entry.node, action.detail)
        if action.reason not in ABANDONING or self.recorder is None:
            return
        left = [v for v in self._with_evicted(entry).pending_victims if self._live(v)]
        if left:
            self.recorder.abandoned(entry.pod, left, entry.node, action.detail)

    def _disallowed(self, entry: LedgerEntry, action: Release) -> None:
        """Counts an entry the settings and the cache did not allow, and writes its line
        in the decision log (endpoint ``worker``, docs/service.md)."""
        assert action.rule is not None
        self.metrics.disallowed_entries.labels(action.rule).inc()
        record = {
            "endpoint": "worker",
            "uid": entry.review_uid,
            "pod": entry.pod.key,
            "node": entry.node,
            "verdict": "disallowed",
            "reason": action.rule,
            "error": action.detail,
            "victims": [v.key for v in entry.pending_victims],
        }
        emit([orjson.dumps(record)])

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
        """Whether ``victim`` must still go for ``entry`` now, a batch's decision having
        been made a moment (or a wave of evictions) ago: the resizing pod still exists
        under the entry's uid, is not leaving, and its spec still asks for the admitted
        size (a resize patched back down, or the pod deleted, stops the rest of its
        batch); and the entry is still in the ledger with the victim pending (a newer
        resize of the same pod or a release stops the old plan)."""
        current = self.current(entry)
        return current is not None and victim in self._with_evicted(current).pending_victims

    def current(self, entry: LedgerEntry) -> LedgerEntry | None:
        """The one "still current" check before an API call for ``entry``: the entry as the
        ledger holds it now, while the resizing pod as cached still asks for the admitted
        size on the entry's node (:func:`~webhook.engine.lifecycle.states.wanted`)."""
        if not wanted(entry, self.cluster.pod(entry.pod.namespace, entry.pod.name)):
            return None
        return next(
            (e for e in self.ledger.entries(entry.node) if e.review_uid == entry.review_uid),
            None,
        )

    def _act(self, entry: LedgerEntry, action: Act, stop: threading.Event) -> None:
        self._count_settled(entry, action.settle)
        # 3a. Victims no longer needed leave the claim before anyone is evicted: a claimed
        # victim counts as freeing room for every other resize on the node.
        if action.drop:
            for victim in action.drop:
                log.info("victim %s no longer needed by %s", victim.key, entry.pod.key)
            pods = tuple(self.cluster.pods_on(entry.node))
            dropped = drop_victims(
                entry.review_uid, (v.uid for v in action.drop), pods, self.clock()
            )
            if not self.ledger.update(entry.node, dropped):
                return  # the entry went away meanwhile
        # 3b. Loans before evictions: one is actuated at once, an eviction waits out a
        # grace period. Nothing is written: whether a loan is made is read from the lender.
        if action.lend and not self.lending.lend(entry, action.lend, stop):
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
        waiting: Iterator[PodRef] = iter(victims)
        running: dict[Future[EvictionResult | None], PodRef] = {}
        results: dict[PodRef, EvictionResult | None] = {}
        while True:
            # At most victim_parallelism of this plan at once; the pool is the nodes'.
            for victim in islice(waiting, self.victim_parallelism - len(running)):
                try:
                    running[pool.submit(self._evict_one, entry, victim, stop)] = victim
                except RuntimeError:
                    if stop.is_set():
                        return list(results.values())  # stop() shut the pool down meanwhile
                    raise
            if not running:
                return [results[v] for v in victims]
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                results[running.pop(future)] = future.result()

    def _evict_one(
        self, entry: LedgerEntry, victim: PodRef, stop: threading.Event
    ) -> EvictionResult | None:
        """Evict one victim still pending for ``entry`` while this replica may act; a
        failure is logged here and backs the entry off in the caller."""
        if stop.is_set() or not self._may_act() or not self._still_pending(entry, victim):
            return None
        if self.follow is not None:
            self.follow.expect(entry.pod, entry.node, victim)
        # Decided on the cache a moment ago: the victim is live under this uid.
        result = self.evictor.evict(victim, entry.pod, entry.node, seen_live=True)
        if self.follow is not None:
            self.follow.evicted(victim, result in EVICTING)
        if result.done:
            with self._lock:
                self._evicted.add(victim.uid)
        else:
            log.info(
                "preempting %s for %s: %s; retrying later", victim.key, entry.pod.key, result.value
            )
        return result

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


@dataclass(frozen=True, slots=True)
class _Handle:
    """The worker as :class:`~webhook.engine.loans.Lending` sees it
    (:class:`~webhook.engine.loans.WorkerHandle`)."""

    worker: PreemptionWorker

    def may_act(self) -> bool:
        return self.worker._may_act()

    def current(self, entry: LedgerEntry) -> LedgerEntry | None:
        return self.worker.current(entry)

    def failed(self, entry: LedgerEntry) -> None:
        self.worker.backoff.failed(entry.review_uid)

    def succeeded(self, entry: LedgerEntry) -> None:
        self.worker.backoff.succeeded(entry.review_uid)

    def wake(self) -> None:
        self.worker.wake()


def _oldest_first(groups: dict[str, list[LedgerEntry]]) -> list[str]:
    """The nodes of ``groups``, the one with the oldest admission first."""
    return sorted(groups, key=lambda n: min((e.admitted_at for e in groups[n]), default=inf))


__all__ = [
    "ABANDONING",
    "NODE_PARALLELISM",
    "VICTIM_PARALLELISM",
    "PreemptionWorker",
]
