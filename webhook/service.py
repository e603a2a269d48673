"""Wiring of the running service: cache, ledger, engine, worker, reconciler, leader
election and the web app. Runs inside the gunicorn worker process (watch threads must
start after the fork)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from webhook.engine.admission import AdmissionEngine
from webhook.engine.config import Config
from webhook.engine.metrics import Metrics
from webhook.engine.reconciler import Reconciler
from webhook.kube.cache import ClusterCache
from webhook.kube.client import make_api_client
from webhook.kube.events import EventRecorder
from webhook.kube.evictor import Evictor
from webhook.kube.leader import LeaderElector
from webhook.kube.ledger import LeaseLedger
from webhook.kube.worker import PreemptionWorker
from webhook.web.app import create_app
from webhook.web.server import WorkerApp

log = logging.getLogger(__name__)

#: Seconds between reconciler passes when nothing wakes it earlier.
RECONCILE_PERIOD = 5.0


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
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="reconciler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconciler.reconcile()
            except Exception:
                log.exception("reconciler pass failed")
            self._wake.wait(RECONCILE_PERIOD)
            self._wake.clear()


def build(config: Config, kubeconfig: str | None) -> Callable[[Any], WorkerApp]:
    """The app factory gunicorn calls in its worker process."""

    def factory(tls: Any) -> WorkerApp:
        metrics = Metrics()
        identity = config.identity or f"rpw-{threading.get_native_id()}-{int(time.time())}"
        cache = ClusterCache(make_api_client(kubeconfig), config, metrics=metrics)
        ledger_api = make_api_client(kubeconfig)
        ledger = LeaseLedger(ledger_api, config, metrics=metrics)
        act_api = make_api_client(kubeconfig)
        recorder = EventRecorder(act_api, controller=config.scheduler_name, instance=identity)
        evictor = Evictor(
            act_api,
            recorder,
            metrics,
            method=config.eviction_method,
            grace_period_cap=config.grace_period_cap,
            scheduler_name=config.scheduler_name,
        )
        worker = PreemptionWorker(cache, ledger, evictor, config, metrics, recorder=recorder)
        reconcile = _Reconcile(
            Reconciler(config, cache, ledger, metrics=metrics, on_admitted=worker.wake)
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
        engine = AdmissionEngine(config, cache, ledger, metrics=metrics, on_admitted=worker.wake)
        app = create_app(
            config,
            cluster=cache,
            ledger=ledger,
            engine=engine,
            metrics=metrics,
            readiness=lambda: {
                "tls": bool(tls.loaded()),
                "cache": cache.synced(),
                "ledger": ledger.reachable(),
            },
        )

        def start() -> Callable[[], None]:
            cache.subscribe(worker.wake)
            cache.subscribe(reconcile.wake)
            ledger.subscribe(worker.wake)
            cache.start()
            ledger.start()
            elector.start()

            def stop() -> None:
                elector.stop(10)
                stopped()
                ledger.stop()
                cache.stop()

            return stop

        return WorkerApp(app, start=start, registry=metrics.registry)

    return factory
