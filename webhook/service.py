"""Wiring of the running service: cache, ledger, engine, worker, reconciler, leader
election and the web app. Runs inside the gunicorn worker process (watch threads must
start after the fork)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from webhook.base.loop import Backlog, Loop, Runnables
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.model import Pod
from webhook.core.plan import Plan
from webhook.core.report import deferred_note
from webhook.engine.admission import AdmissionEngine
from webhook.engine.follow import Follow
from webhook.engine.hooks import Hooks
from webhook.engine.ledger import VictimEvictor
from webhook.engine.pauses import Pauses, PausingEvictor, Restorer
from webhook.engine.reconciler import Reconciler
from webhook.engine.worker import PreemptionWorker
from webhook.kube.cache import BUDGETS, PODS, ClusterCache
from webhook.kube.certs import CertificateFollower, CertificateRotator
from webhook.kube.checkpoints import KubeletCheckpointer, PodCheckpoints, PodCreator
from webhook.kube.client import make_api_client
from webhook.kube.events import EventRecorder
from webhook.kube.evictor import Evictor
from webhook.kube.leader import LEADER_LEASE, LeaderElector
from webhook.kube.ledger import LeaseLedger
from webhook.kube.resizer import Resizer
from webhook.kube.sealing import process_sealer
from webhook.tls.rotation import ManagedTLS
from webhook.web.app import create_app
from webhook.web.server import WorkerApp

#: Reason of the event the reconciler leaves on a pod whose deferred resize it judged.
DEFERRED_REASON = "DeferredResizePreemption"


def _decision_event(recorder: EventRecorder) -> Callable[[Pod, Plan, bool], None]:
    """The event for a plan the reconciler made: what a kubectl warning is for an
    admission (the reconciler calls it only when it planned victims)."""

    def record(pod: Pod, plan: Plan, admitted: bool) -> None:
        note = deferred_note(plan)
        recorder.record(
            pod.ref, type_="Normal", reason=DEFERRED_REASON, action="Preempting", note=note
        )

    return record


def process_identity(configured: str, workers: int, pid: int) -> str:
    """This process's name in leader election and events: the configured identity (the
    pod's name in the Deployment), told apart by process id when the replica runs
    several worker processes - each competes for the lease like a replica would."""
    if not configured:
        return f"rpw-{pid}-{int(time.time())}"
    return f"{configured}-{pid}" if workers > 1 else configured


def _wake_on_changes(
    cache: ClusterCache,
    ledger: LeaseLedger,
    worker: PreemptionWorker,
    reconciler: Reconciler,
) -> None:
    """Every change of the cache or the ledger wakes the worker and the reconciler."""

    def cluster_changed(kind: str, *_: object) -> None:
        # A PodDisruptionBudget's status also ends the worker's backoff (an eviction it
        # refused may be allowed now) and lets the reconciler re-plan a resize the
        # budget made infeasible.
        worker.wake(budgets_changed=kind == BUDGETS)
        reconciler.wake()

    def ledger_changed(*_: object) -> None:
        # A released entry (expired, or victims no longer enough) hands its pod back to
        # the reconciler.
        worker.wake()
        reconciler.wake()

    cache.subscribe(cluster_changed)
    ledger.subscribe(ledger_changed)


def follow_victims(cache: ClusterCache, metrics: Metrics, recorder: EventRecorder) -> Follow:
    """Where evicted victims' work goes, read from the cache's pod changes."""
    follow = Follow(cache, metrics, recorder)

    def pod_changed(kind: str, change: str, _old: object, new: object) -> None:
        if kind == PODS and isinstance(new, Pod):
            follow.seen(new, added=change == "ADDED")

    cache.subscribe(pod_changed)
    return follow


def _evictor(api: Any, recorder: EventRecorder, metrics: Metrics, config: Config) -> VictimEvictor:
    return Evictor(
        api,
        recorder,
        metrics,
        method=config.eviction_method,
        grace_period_cap=config.grace_period_cap,
        scheduler_name=config.scheduler_name,
        pdb_retries=0,
    )


def _pausing(
    api: Any,
    cache: ClusterCache,
    ledger: Any,
    recorder: EventRecorder,
    metrics: Metrics,
    config: Config,
) -> tuple[Pauses, Restorer | None, PodCheckpoints | None]:
    """Who is checkpointed, the restores, and the store they read; without the setting
    ``checkpoints`` the opt-in is only judged (plans say such victims are evicted) and
    nothing is read."""
    if not config.checkpoints:
        return Pauses(None, False), None, None
    store = PodCheckpoints(api, config.namespace)
    creator = PodCreator(api, process_sealer())
    restorer = Restorer(cache, ledger, store, creator, recorder, metrics)
    return Pauses(store, True), restorer, store


def _checkpointing(
    evictor: VictimEvictor,
    api: Any,
    cache: ClusterCache,
    pauses: Pauses,
    recorder: EventRecorder,
    metrics: Metrics,
    config: Config,
) -> VictimEvictor:
    """``evictor`` checkpointing first the victims ``pauses`` says to."""
    kubelet = KubeletCheckpointer(
        api,
        kubelet_ca=config.kubelet_ca,
        grace_period_cap=config.grace_period_cap,
        sealer=process_sealer(),
    )
    return PausingEvictor(evictor, cache, pauses, kubelet, recorder, metrics)


def _elector(
    api: Any, config: Config, identity: str, runnables: Runnables, metrics: Metrics
) -> LeaderElector:
    """The preemption worker's leader election, with client-go's proportions of the
    lease duration."""
    return LeaderElector(
        api,
        namespace=config.namespace,
        name=LEADER_LEASE,
        identity=identity,
        lease_duration=config.lease_duration,
        renew_deadline=config.lease_duration * 2 / 3,
        retry_period=max(config.lease_duration / 7.5, 0.5),
        on_started_leading=runnables.start_leading,
        on_stopped_leading=runnables.stop_leading,
        metrics=metrics,
    )


def _readiness(
    tls: Any,
    cache: ClusterCache,
    ledger: LeaseLedger,
    config: Config,
    checkpoints: PodCheckpoints | None,
) -> Callable[[], dict[str, bool]]:
    def ready() -> dict[str, bool]:
        checks = {
            "tls": bool(tls.loaded()),
            "cache": cache.synced(),
            # Past the bound every review fails open: let the Service send them to a
            # replica whose watches are current.
            "cache-current": config.cache_current(cache.staleness()),
            "ledger": ledger.reachable(),
        }
        if checkpoints is not None:
            # Before it, a plan finds no node able to checkpoint: an opted-in victim
            # would be evicted.
            checks["checkpoints"] = checkpoints.synced()
        return checks

    return ready


def build(
    config: Config,
    kubeconfig: str | None,
    *,
    workers: int = 1,
    hooks: Hooks | None = None,
    managed_tls: ManagedTLS | None = None,
) -> Callable[[Any], WorkerApp]:
    """The app factory gunicorn calls in each of its ``workers`` worker processes.
    ``hooks`` wrap parts of what it builds (see :class:`Hooks`); ``managed_tls``: the
    service keeps its own certificates (``serve --tls-secret``)."""
    hooks = hooks or Hooks()

    def factory(tls: Any) -> WorkerApp:
        metrics = Metrics()
        metrics.unauthenticated.set(0 if tls.authenticates else 1)
        identity = process_identity(config.identity, workers, os.getpid())
        cache = ClusterCache(make_api_client(kubeconfig), config, metrics=metrics)
        lease_ledger = LeaseLedger(make_api_client(kubeconfig), config, metrics=metrics)
        ledger = hooks.ledger(lease_ledger, identity)
        act_api = make_api_client(kubeconfig)
        recorder = EventRecorder(act_api, controller=config.scheduler_name, instance=identity)
        pauses, restorer, checkpoints = _pausing(act_api, cache, ledger, recorder, metrics, config)
        evictor = _evictor(act_api, recorder, metrics, config)
        if restorer is not None:
            evictor = _checkpointing(evictor, act_api, cache, pauses, recorder, metrics, config)
        evictor = hooks.evictor(evictor, identity)
        runnables = Runnables()
        elector = _elector(act_api, config, identity, runnables, metrics)
        follow = follow_victims(cache, metrics, recorder)
        worker = PreemptionWorker(
            *(cache, ledger, evictor, config, metrics),
            recorder=recorder,
            may_act=elector.is_leader,
            resizer=Resizer(act_api, recorder, metrics, lenders=cache.pod),
            follow=follow,
            restore=restorer.run if restorer is not None else None,
        )

        # An admission wakes the worker once, through the ledger's change notification
        # of its own write (_wake_on_changes).
        reconciler = Reconciler(
            config,
            cache,
            ledger,
            metrics=metrics,
            on_decision=_decision_event(recorder),
            pause=pauses,
        )
        # Counting each review and writing its decision-log line: after the answer.
        after_review = Backlog(name="after-review")
        engine = AdmissionEngine(
            config,
            cache,
            ledger,
            metrics=metrics,
            after=after_review.submit,
            on_floor_errors=recorder.floor_errors,
            pause=pauses,
        )
        app = create_app(
            config,
            engine=engine,
            metrics=metrics,
            readiness=_readiness(tls, cache, lease_ledger, config, checkpoints),
        )
        for runnable in (after_review, cache, lease_ledger):
            runnables.add(runnable, stop_timeout=5)
        _keep_abilities(runnables, checkpoints)
        runnables.add(elector, stop_timeout=10)
        _keep_certificates(runnables, act_api, managed_tls)
        if config.mode != "warn":
            # warn mode plans and tells, and never acts.
            _wake_on_changes(cache, lease_ledger, worker, reconciler)
            _lead(runnables, follow, worker, reconciler)
        return _worker_app(app, runnables, metrics, cache)

    return factory


def _keep_abilities(runnables: Runnables, checkpoints: PodCheckpoints | None) -> None:
    """Every replica answers reviews: each lists the agents' abilities every second."""
    if checkpoints is not None:
        store = checkpoints
        runnables.add(
            Loop("checkpoint-abilities", lambda _: store.refresh(), period=1.0), stop_timeout=5
        )


def _lead(runnables: Runnables, follow: Follow, worker: Any, reconciler: Any) -> None:
    """What only the leader runs. The follow stops after the worker (newest first): an
    eviction the worker makes while stopping is still followed, then counted."""
    runnables.add(follow, leader_election=True, stop_timeout=5)
    runnables.add(worker, leader_election=True, stop_timeout=30)
    runnables.add(reconciler, leader_election=True, stop_timeout=10)


def _keep_certificates(runnables: Runnables, api: Any, managed_tls: ManagedTLS | None) -> None:
    """With ``managed_tls``, every replica serves the Secret's current pair and the leader
    renews it (in every mode: a warn-mode webhook needs a certificate too)."""
    if managed_tls is None:
        return
    runnables.add(CertificateFollower(api, managed_tls), stop_timeout=5)
    runnables.add(CertificateRotator(api, managed_tls), leader_election=True, stop_timeout=5)


def _worker_app(app: Any, runnables: Runnables, metrics: Metrics, cache: ClusterCache) -> WorkerApp:
    def start() -> Callable[[], None]:
        runnables.start()
        return runnables.stop

    return WorkerApp(
        app,
        start=start,
        registry=metrics.registry,
        ready=cache.synced,
        refused=metrics.connections_refused.inc,
    )
