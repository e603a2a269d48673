"""Wiring of the running service: cache, ledger, engine, worker, reconciler, leader
election and the web app. Runs inside the gunicorn worker process (watch threads must
start after the fork)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from webhook.core.model import Pod, PodRef
from webhook.core.plan import Plan
from webhook.engine.admission import AdmissionEngine
from webhook.engine.backlog import Backlog
from webhook.engine.config import Config
from webhook.engine.ledger import Change, Ledger, LedgerEntry, R
from webhook.engine.metrics import Metrics
from webhook.engine.reconciler import Reconciler
from webhook.kube.cache import ClusterCache
from webhook.kube.client import make_api_client
from webhook.kube.events import EventRecorder
from webhook.kube.evictor import EvictionResult, Evictor
from webhook.kube.leader import LeaderElector
from webhook.kube.ledger import LeaseLedger
from webhook.kube.worker import PreemptionWorker
from webhook.web.app import create_app
from webhook.web.server import WorkerApp

log = logging.getLogger(__name__)

#: Seconds between reconciler passes when nothing wakes it earlier.
RECONCILE_PERIOD = 5.0
#: Changes arrive in bursts (a deletion is several watch events): one pass per burst.
RECONCILE_DEBOUNCE = 0.05
#: Reason of the event the reconciler leaves on a pod whose deferred resize it judged.
DEFERRED_REASON = "DeferredResizePreemption"

#: Fault injection for restart-safety tests, off unless set. ``RPW_FAULT=<point>:<n>``
#: makes the process SIGKILL itself the n-th time it reaches ``point``;
#: ``RPW_FAULT_FILE=<path>`` (``{identity}`` is replaced) reads the same ``<point>:<n>``
#: from a file whenever a point is reached, so a test can arm a running process (the file
#: is removed before the kill). Points: ``admitted`` (an entry was just recorded, before
#: the answer or the worker's turn), ``evicted`` (an eviction call returned, before the
#: victim is marked handled), ``ledger-before`` (a ledger write is about to be sent) and
#: ``ledger-write`` (a ledger write returned, before its caller goes on).
FAULT_ENV = "RPW_FAULT"
FAULT_FILE_ENV = "RPW_FAULT_FILE"


class _Fault:
    """Counts arrivals at named points; kills the process at the armed one."""

    def __init__(self, spec: str = "", path: str = "") -> None:
        self.spec = spec
        self.path = path
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def _armed(self) -> str:
        if self.spec:
            return self.spec
        try:
            with open(self.path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError:
            return ""

    def reached(self, point: str) -> None:
        armed = self._armed()
        target, _, count = armed.partition(":")
        if target.strip() != point:
            return
        with self._lock:
            # Counted per arming: a new file content starts again from zero.
            self._counts[armed] = seen = self._counts.get(armed, 0) + 1
            if seen < int(count or "1"):
                return
            if self.path:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
        log.warning("fault injection: killing the process group at %s", point)
        # The whole group, gunicorn's master included: a dead pod, not a worker the
        # master would fork again.
        os.killpg(os.getpgrp(), signal.SIGKILL)


class _FaultLedger:
    """A ledger whose writes are fault points (``ledger-write``)."""

    def __init__(self, ledger: Ledger, fault: _Fault) -> None:
        self._ledger = ledger
        self._fault = fault

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    def entries(self, node: str) -> tuple[LedgerEntry, ...]:
        return self._ledger.entries(node)

    def all_entries(self) -> tuple[LedgerEntry, ...]:
        return self._ledger.all_entries()

    def reachable(self) -> bool:
        return self._ledger.reachable()

    def update(self, node: str, change: Change[R]) -> R:
        wrote = False

        def counted(entries: tuple[LedgerEntry, ...]) -> Any:
            nonlocal wrote
            new, result = change(entries)
            wrote = new is not None
            return new, result

        def before(entries: tuple[LedgerEntry, ...]) -> Any:
            new, result = counted(entries)
            if new is not None:
                self._fault.reached("ledger-before")
            return new, result

        result: R = self._ledger.update(node, before)
        if wrote:
            self._fault.reached("ledger-write")
        return result


class _FaultEvictor:
    """An evictor whose calls are fault points (``evicted``)."""

    def __init__(self, evictor: Evictor, fault: _Fault) -> None:
        self._evictor = evictor
        self._fault = fault

    def evict(
        self, victim: PodRef, preemptor: PodRef, node: str, *, seen_live: bool = False
    ) -> EvictionResult:
        result = self._evictor.evict(victim, preemptor, node, seen_live=seen_live)
        self._fault.reached("evicted")
        return result


class _Reconcile:
    """Runs reconciler passes in a thread while this replica leads."""

    def __init__(self, reconciler: Reconciler) -> None:
        self.reconciler = reconciler
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wake(self, *_: Any) -> None:
        self._wake.set()

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        # A fresh flag per thread, as the worker does: a thread that outlived stop()'s
        # join still sees its own flag set and ends.
        self._stop = threading.Event()
        self._wake.set()  # cold start: every deferred resize at once
        self._thread = threading.Thread(
            target=self._run, args=(self._stop,), name="reconciler", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
        self._thread = None

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._wake.wait(RECONCILE_PERIOD)
            stop.wait(RECONCILE_DEBOUNCE)
            self._wake.clear()
            if stop.is_set():
                return
            try:
                self.reconciler.reconcile()
            except Exception:
                self.reconciler.metrics.errors.labels("reconciler").inc()
                log.exception("reconciler pass failed")


def _decision_event(recorder: EventRecorder) -> Callable[[Pod, Plan, bool], None]:
    """Events for the reconciler's decisions: what a kubectl warning is for an admission."""

    def record(pod: Pod, plan: Plan, admitted: bool) -> None:
        if admitted:
            note = f"Deferred resize: {plan.reason}: {', '.join(plan.victim_keys)}"
        else:
            note = f"Deferred resize not preempted for: {plan.reason}"
        recorder.record(
            pod.ref,
            type_="Normal" if plan.verdict in ("preempt", "fits") else "Warning",
            reason=DEFERRED_REASON,
            action="Preempting" if admitted else "Planning",
            note=note,
        )

    return record


def process_identity(configured: str, workers: int, pid: int) -> str:
    """This process's name in leader election and events: the configured identity (the
    pod's name in the Deployment), told apart by process id when the replica runs
    several worker processes - each competes for the lease like a replica would."""
    if not configured:
        return f"rpw-{pid}-{int(time.time())}"
    return f"{configured}-{pid}" if workers > 1 else configured


def build(
    config: Config, kubeconfig: str | None, *, workers: int = 1
) -> Callable[[Any], WorkerApp]:
    """The app factory gunicorn calls in each of its ``workers`` worker processes."""

    def factory(tls: Any) -> WorkerApp:
        metrics = Metrics()
        identity = process_identity(config.identity, workers, os.getpid())
        cache = ClusterCache(make_api_client(kubeconfig), config, metrics=metrics)
        ledger_api = make_api_client(kubeconfig)
        lease_ledger = LeaseLedger(ledger_api, config, metrics=metrics)
        act_api = make_api_client(kubeconfig)
        recorder = EventRecorder(act_api, controller=config.scheduler_name, instance=identity)
        evictor: Any = Evictor(
            act_api,
            recorder,
            metrics,
            method=config.eviction_method,
            grace_period_cap=config.grace_period_cap,
            scheduler_name=config.scheduler_name,
            pdb_retries=0,
        )
        ledger: Any = lease_ledger
        fault_spec = os.environ.get(FAULT_ENV, "")
        fault_file = os.environ.get(FAULT_FILE_ENV, "").replace("{identity}", identity)
        fault = _Fault(fault_spec, fault_file) if fault_spec or fault_file else None
        if fault is not None:
            log.warning("fault injection on: %s", fault_spec or fault_file)
            ledger = _FaultLedger(lease_ledger, fault)
            evictor = _FaultEvictor(evictor, fault)

        def admitted(entry: LedgerEntry) -> None:
            if fault is not None:
                fault.reached("admitted")
            worker.wake()

        leading: list[LeaderElector] = []
        worker = PreemptionWorker(
            cache,
            ledger,
            evictor,
            config,
            metrics,
            recorder=recorder,
            may_act=lambda: bool(leading) and leading[0].is_leader(),
        )
        reconcile = _Reconcile(
            Reconciler(
                config,
                cache,
                ledger,
                metrics=metrics,
                on_admitted=admitted,
                on_decision=_decision_event(recorder),
            )
        )
        acting = config.mode != "warn"

        def started() -> None:
            if acting:
                worker.start()
                reconcile.start()

        def stopped() -> None:
            reconcile.stop()
            worker.stop()

        elector = LeaderElector(
            act_api,
            namespace=config.namespace,
            name="resize-preemption-webhook-leader",
            identity=identity,
            lease_duration=config.lease_duration,
            renew_deadline=config.lease_duration * 2 / 3,
            retry_period=max(config.lease_duration / 7.5, 0.5),
            on_started_leading=started,
            on_stopped_leading=stopped,
            metrics=metrics,
        )
        leading.append(elector)
        # Counting each review and writing its decision-log line: after the answer.
        after_review = Backlog(name="after-review")
        engine = AdmissionEngine(
            config, cache, ledger, metrics=metrics, on_admitted=admitted, after=after_review.submit
        )
        app = create_app(
            config,
            cluster=cache,
            ledger=ledger,
            engine=engine,
            metrics=metrics,
            readiness=lambda: {
                "tls": bool(tls.loaded()),
                "cache": cache.synced(),
                "ledger": lease_ledger.reachable(),
            },
        )

        def start() -> Callable[[], None]:
            # Every change wakes both: a PodDisruptionBudget's status also ends the
            # worker's backoff (an eviction it refused may be allowed now) and lets the
            # reconciler re-plan a resize the budget made infeasible.
            cache.subscribe(worker.wake)
            cache.subscribe(reconcile.wake)
            lease_ledger.subscribe(worker.wake)
            # A released entry (expired, or victims no longer enough) hands its pod back
            # to the reconciler.
            lease_ledger.subscribe(reconcile.wake)
            after_review.start()
            cache.start()
            lease_ledger.start()
            elector.start()

            def stop() -> None:
                elector.stop(10)
                stopped()
                lease_ledger.stop()
                cache.stop()
                after_review.stop()

            return stop

        return WorkerApp(app, start=start, registry=metrics.registry, ready=cache.synced)

    return factory
