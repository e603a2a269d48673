"""Fault injection: SIGKILL a service replica at random points of a 3-victim preemption.

:class:`FaultRig` runs two replicas of the service behind one front over a running
control plane (``python -m harness.fault_hooks serve``: the service with fault points,
armed through ``RPW_FAULT_FILE``), and repeats:

1. node-1 (8 CPUs): ``high`` 2 CPUs (to grow to 5), ``steady`` 2 CPUs (as important:
   never a victim), four 1-CPU low-priority pods: exactly three must go, the fourth stays;
2. pick a replica (the leader three times in four) and a fault: a random delay after the
   resize, or an armed point in the service (after the admission's ledger write, after
   the k-th eviction, before or after the ledger write - a run has one, the admission's);
3. ``kubectl patch --subresource resize`` the pod to 5 CPUs, SIGKILL the replica at the
   fault, restart it on the same port after a random pause;
4. wait for the outcome and check it from the API server's audit log and state: every
   eviction call per pod (a second call for one pod is a double eviction), pods evicted
   beyond the three needed or other than low-priority ones (unneeded evictions),
   ``Preempted`` events per victim, the resize actuated, and the reservation released or
   spent (no entry left that the service's readers count).

``python -m bench faults`` (:mod:`bench.faults`) runs it on a control plane of its own and
writes ``bench/results/faults.json``; ``tests/e2e/test_faults.py`` runs it for a few runs
against the test session's cluster.

:meth:`FaultRig.run_control_plane` breaks the control plane instead (``python -m bench
faults-control-plane``, ``tests/e2e/test_control_plane_faults.py``), with the same pods,
resize and checks:

* ``kube-apiserver``: SIGKILLed at a point of the plan (the service held there by a
  ``<point>:1:pause`` fault until the kill is done) or after a delay, and started again on
  the same etcd and port; a patch in flight fails and is made again, as a client would;
* ``etcd-stall`` / ``etcd-restart``: etcd SIGSTOPped, or SIGKILLed, for ``ETCD_DOWN``
  seconds at the admission's ledger write. The review must fail open with no eviction at
  its answer, no entry of it may be left in the ledger (a stalled write lands late: it
  must be void), and the reconciler must plan the deferred resize.

Each run also checks that every replica's ``/readyz`` is 200 again (its watches back).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from prometheus_client.parser import text_string_to_metric_families

from harness import fault_hooks
from harness.audit import DeletionWatch, eviction_codes, evictions_made
from harness.kubeapi import ApiError, KubeClient
from harness.manifests import guaranteed_pod
from harness.replicas import Replica, ReplicaSet, start_replicas
from webhook.core.objects import parse_pod
from webhook.engine.ledger import decode_entries
from webhook.engine.lifecycle.states import room_holders

NODE = "node-1"
LEADER_LEASE = "resize-preemption-webhook-leader"
LEASE_DURATION = 3
LOWS = ("low-a", "low-b", "low-c", "low-d")
NEEDED = 3
#: Armed points for the leader; the number is which arrival kills.
LEADER_POINTS = (
    "admitted:1",
    "evicted:1",
    "evicted:2",
    "evicted:3",
    "ledger-before:1",
    "ledger-write:1",
)
#: Where kube-apiserver is killed when it is not after a delay: a point of the service,
#: held until the kill is done (both replicas armed; whichever gets there first).
APISERVER_POINTS = (
    "ledger-before:1:pause",
    "admitted:1:pause",
    "evicted:1:pause",
    "evicted:2:pause",
    "evicted:3:pause",
)
#: Seconds etcd stays stalled or down during an admission: longer than the webhook's
#: ``timeoutSeconds`` (5), so the review is answered while it is, and than the ledger's
#: ``LATE_AFTER`` (8), so a write that lands when etcd runs again is seen to be late.
ETCD_DOWN = 10.0
CONTROL_PLANE_KINDS = ("kube-apiserver", "etcd-stall", "etcd-restart")


@dataclass
class RunResult:
    run: int
    target: str  # "leader" or "follower"
    fault: str  # "delay 0.73s" or an armed point
    killed: bool  # the process died at the fault (an armed point not reached: killed late)
    evicted: list[str] = field(default_factory=list)
    #: Every eviction call answered, whatever its code.
    eviction_calls: int = 0
    #: Evictions accepted (2xx) beyond the first, summed over the pods.
    double_evictions: int = 0
    unneeded_evictions: int = 0
    preempted_events_max: int = 0
    actuated: bool = False
    released: bool = False
    seconds: float = 0.0
    #: What was broken: a service ``replica``, ``kube-apiserver`` (SIGKILL and start
    #: again), ``etcd-stall`` (SIGSTOP, SIGCONT) or ``etcd-restart`` (SIGKILL, start).
    kind: str = "replica"
    #: ``kubectl patch`` calls until one succeeded (a patch in flight when kube-apiserver
    #: dies fails, and is made again as a controller would).
    patch_attempts: int = 1
    #: The webhook's warning on the patch that succeeded (kubectl's stderr).
    warning: str = ""
    #: Seconds the control-plane component was down or stalled.
    down_seconds: float = 0.0
    #: Every replica's ``/readyz`` answered 200 after the run: watches back.
    ready_after: bool = True
    #: For etcd faults during admission: the review failed open (the webhook's warning
    #: on the patch in flight), no eviction had been made when it was answered, the
    #: reconciler planned the deferred resize, and no entry of the admission was left in
    #: the ledger at the end (one may land when etcd runs again: ``landed``; it must be
    #: void, never acted on, and dropped).
    failed_open: bool = False
    evictions_at_answer: int = 0
    reconciler_planned: bool = False
    admission_entry_landed: bool = False
    admission_entry_left: bool = False

    @property
    def ok(self) -> bool:
        fine = (
            self.double_evictions == 0
            and self.unneeded_evictions == 0
            and self.preempted_events_max <= 1
            and self.actuated
            and self.released
            and self.ready_after
        )
        if self.kind == "etcd-stall":
            return (
                fine
                and self.failed_open
                and self.evictions_at_answer == 0
                and self.reconciler_planned
                and not self.admission_entry_left
            )
        if self.kind == "etcd-restart":
            return fine and self.failed_open and not self.admission_entry_left
        return fine


def pod_manifest(name: str, cpu: str, priority_class: str) -> dict[str, Any]:
    """A Guaranteed pause pod of ``cpu`` bound to :data:`NODE`, its grace period 1 s."""
    return guaranteed_pod(name, cpu, priority_class, node=NODE, memory="128Mi")


class FaultRig:
    """Two replicas over a running control plane, and the runs against them."""

    def __init__(
        self,
        client: KubeClient,
        kubeconfig: Path,
        kubectl: Path,
        state_dir: Path,
        audit_log: Path,
        known_pods: Any,
        *,
        rng: random.Random,
        log: Any = print,
        control_plane: Any = None,
    ) -> None:
        #: The :class:`harness.launcher.ControlPlane`, for control-plane faults.
        self.control_plane = control_plane
        self.client = client
        self.kubeconfig = kubeconfig
        self.kubectl_binary = kubectl
        self.state_dir = state_dir
        self.audit_log = audit_log
        self.deletions: DeletionWatch | None = None
        self.known_pods = known_pods
        self.rng = rng
        self.log = log
        self.service_namespace = f"rpw-faults-{secrets.token_hex(3)}"
        self.fault_dir = state_dir / "faults"
        self.fault_dir.mkdir(parents=True, exist_ok=True)
        self.classes = {
            "high": f"high-{secrets.token_hex(3)}",
            "low": f"low-{secrets.token_hex(3)}",
        }
        self.replicas: ReplicaSet | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> FaultRig:
        for key, value in (("high", 1_000_000), ("low", 1_000)):
            self.client.create(
                "/apis/scheduling.k8s.io/v1/priorityclasses",
                {"metadata": {"name": self.classes[key]}, "value": value},
            )
        previous = os.environ.get("RPW_FAULT_FILE")
        os.environ["RPW_FAULT_FILE"] = str(self.fault_dir / "{identity}")
        try:
            self.replicas = start_replicas(
                self.client,
                self.kubeconfig,
                self.state_dir,
                count=2,
                namespace=self.service_namespace,
                extra_args=["--lease-duration", str(LEASE_DURATION)],
                command=fault_hooks.COMMAND,
            )
        finally:
            if previous is None:
                os.environ.pop("RPW_FAULT_FILE", None)
            else:
                os.environ["RPW_FAULT_FILE"] = previous
        return self

    def stop(self) -> None:
        if self.replicas is not None:
            self.replicas.stop()
        for name in self.classes.values():
            with contextlib.suppress(ApiError):
                self.client.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")

    def _restart(self, replica: Replica) -> None:
        os.environ["RPW_FAULT_FILE"] = str(self.fault_dir / "{identity}")
        try:
            replica.start()
        finally:
            os.environ.pop("RPW_FAULT_FILE", None)

    # -- helpers ----------------------------------------------------------------------------

    def kubectl(self, namespace: str, *args: str, input: str | None = None) -> str:
        result = subprocess.run(
            [str(self.kubectl_binary), "--namespace", namespace, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=90,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def leader(self) -> str:
        try:
            lease = self.client.get(
                f"/apis/coordination.k8s.io/v1/namespaces/{self.service_namespace}"
                f"/leases/{LEADER_LEASE}"
            )
        except ApiError:
            return ""
        return str((lease.get("spec") or {}).get("holderIdentity") or "")

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        obj: dict[str, Any] | None = self.client.get_or_none(
            f"/api/v1/namespaces/{namespace}/pods/{name}"
        )
        return obj

    def ledger_holds(self, pod_uid: str, pod: dict[str, Any] | None) -> bool:
        """Whether an entry of the pod still holds room, by the service's own rule (an
        entry expired or spent stays in the Lease until the next write drops it)."""
        leases = self.client.get(
            f"/apis/coordination.k8s.io/v1/namespaces/{self.service_namespace}/leases"
        )["items"]
        pods = [parse_pod(pod)] if pod is not None else []
        for lease in leases:
            raw = (lease["metadata"].get("annotations") or {}).get("resize-preemption.io/ledger")
            entries = [e for e in decode_entries(raw) if e.pod.uid == pod_uid]
            if room_holders(entries, pods, time.time()):
                return True
        return False

    def eviction_calls(self, namespace: str) -> Counter[str]:
        codes = eviction_codes(self.audit_log, namespace)
        return Counter({name: len(answers) for name, answers in codes.items()})

    def evictions_made(self, namespace: str) -> Counter[str]:
        """Eviction calls that took effect, per pod: every 2xx, and a call cut off by its
        SIGKILLed replica (504) when the pod was deleted before any 2xx was received."""
        assert self.deletions is not None
        return evictions_made(self.audit_log, namespace, self.deletions.at)

    def preempted_events(self, namespace: str) -> Counter[str]:
        items = self.client.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        return Counter(e["involvedObject"]["name"] for e in items if e.get("reason") == "Preempted")

    def _manifest(self, name: str, cpu: str, cls: str) -> dict[str, Any]:
        return pod_manifest(name, cpu, self.classes[cls])

    def _wait(self, condition: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.1)
        return bool(condition())

    def _cleanup(self, namespace: str) -> None:
        self.client.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods", body={"gracePeriodSeconds": 0}
        )
        self._wait(lambda: not any(ns == namespace for ns, _ in self.known_pods()), 30)
        try:
            self.client.delete(f"/api/v1/namespaces/{namespace}")
            obj = self.client.get(f"/api/v1/namespaces/{namespace}")
            obj["spec"]["finalizers"] = []
            self.client.replace(f"/api/v1/namespaces/{namespace}/finalize", obj)
        except ApiError as e:
            if e.status != 404:
                raise

    # -- one run ------------------------------------------------------------------------------

    def run_once(self, index: int, *, role: str = "", fault: str = "") -> RunResult:
        """One run; ``role`` (``leader``/``follower``) and ``fault`` (an armed point, or
        ``delay <seconds>s``) are drawn at random unless given."""
        assert self.replicas is not None
        namespace = f"faults-{index}-{secrets.token_hex(3)}"
        self.client.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        try:
            with DeletionWatch(self.client, namespace) as self.deletions:
                return self._run(index, namespace, self.rng, role, fault)
        finally:
            self._cleanup(namespace)

    def run_control_plane(self, index: int, kind: str, *, fault: str = "") -> RunResult:
        """One run with a control-plane fault: ``kind`` is ``kube-apiserver`` (SIGKILL and
        start again at ``fault``: an armed point of the service paused while it happens,
        or ``delay <seconds>s`` after the resize; drawn at random unless given),
        ``etcd-stall`` or ``etcd-restart`` (during the admission's ledger write)."""
        assert self.replicas is not None and self.control_plane is not None
        namespace = f"faults-{index}-{secrets.token_hex(3)}"
        self._with_api(
            lambda: self.client.create("/api/v1/namespaces", {"metadata": {"name": namespace}})
        )
        try:
            with DeletionWatch(self.client, namespace) as self.deletions:
                if kind == "kube-apiserver":
                    return self._apiserver_run(index, namespace, fault)
                if kind in ("etcd-stall", "etcd-restart"):
                    return self._etcd_run(index, namespace, kind)
            raise ValueError(f"unknown control-plane fault {kind!r}")
        finally:
            self._with_api(lambda: self._cleanup(namespace))

    def _setup(self, namespace: str) -> str:
        """The pods of a run, ready; returns the uid of ``high``."""
        items = [
            self._manifest("high", "2", "high"),
            self._manifest("steady", "2", "high"),
            *(self._manifest(name, "1", "low") for name in LOWS),
        ]
        self.kubectl(
            namespace,
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}),
        )
        self.kubectl(namespace, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=60s")
        high = self.pod(namespace, "high")
        assert high is not None
        return str(high["metadata"]["uid"])

    def _patch(self, namespace: str) -> tuple[bool, str]:
        """``kubectl patch --subresource resize`` high to 5 CPUs; (succeeded, stderr)."""
        patch = {
            "spec": {
                "containers": [
                    {"name": "app", "resources": {"requests": {"cpu": "5"}, "limits": {"cpu": "5"}}}
                ]
            }
        }
        result = subprocess.run(
            [
                str(self.kubectl_binary),
                "--namespace",
                namespace,
                "patch",
                "pod",
                "high",
                "--subresource",
                "resize",
                "--patch",
                json.dumps(patch),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            check=False,
        )
        return result.returncode == 0, result.stderr.strip()

    def _with_api(self, call: Any, timeout: float = 60.0) -> Any:
        """``call()``, again while kube-apiserver is coming back (connection errors)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return call()
            except (OSError, urllib3.exceptions.HTTPError, ApiError) as e:
                if isinstance(e, ApiError) and e.status < 500:
                    raise
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def ready(self, replica: Replica) -> bool:
        """The replica's ``/readyz`` answers 200 (its cache synced and its watches open)."""
        context = replica.context()
        url = f"https://127.0.0.1:{replica.port}/readyz"
        try:
            with urllib.request.urlopen(url, context=context, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def readiness(self, replica: Replica) -> dict[str, Any]:
        """The replica's ``/readyz`` body (its checks), whatever the status."""
        context = replica.context()
        url = f"https://127.0.0.1:{replica.port}/readyz"
        try:
            with urllib.request.urlopen(url, context=context, timeout=2) as response:
                body: dict[str, Any] = json.loads(response.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
        return body

    def _run(
        self, index: int, namespace: str, rng: random.Random, role: str, fault: str
    ) -> RunResult:
        assert self.replicas is not None
        uid = self._setup(namespace)

        if not self._wait(lambda: self.leader() != "", 30):
            raise RuntimeError("no leader")
        leader = self.leader()
        by_role = {
            "leader": [r for r in self.replicas.replicas if r.identity == leader],
            "follower": [r for r in self.replicas.replicas if r.identity != leader],
        }
        role = role or ("leader" if rng.random() < 0.75 else "follower")
        [target] = by_role[role] or self.replicas.replicas[:1]
        if not fault:
            armed = role == "leader" and rng.random() < 0.6
            fault = rng.choice(LEADER_POINTS) if armed else f"delay {rng.uniform(0.0, 2.5):.2f}s"
        armed = not fault.startswith("delay ")
        fault_file = self.fault_dir / target.identity
        if armed:
            fault_file.write_text(fault)

        started = time.monotonic()
        ok, stderr = self._patch(namespace)
        if not ok:
            raise RuntimeError(f"kubectl patch: {stderr}")
        if armed:
            died = self._wait(lambda: not target.running(), 15)
        else:
            time.sleep(max(0.0, float(fault.split()[1][:-1]) - (time.monotonic() - started)))
            died = False
        if fault_file.exists():
            fault_file.unlink()
        target.kill(signal.SIGKILL)
        time.sleep(rng.uniform(0.0, 1.0))
        self._restart(target)
        result = self._outcome(index, namespace, uid, started, RunResult(index, role, fault, died))
        return result

    def _apiserver_run(self, index: int, namespace: str, fault: str) -> RunResult:
        assert self.replicas is not None and self.control_plane is not None
        rng = self.rng
        uid = self._setup(namespace)
        if not self._wait(lambda: self.leader() != "", 30):
            raise RuntimeError("no leader")
        if not fault:
            paused = rng.random() < 0.6
            fault = (
                rng.choice(APISERVER_POINTS) if paused else f"delay {rng.uniform(0.0, 3.0):.2f}s"
            )
        paused = not fault.startswith("delay ")
        files = [self.fault_dir / r.identity for r in self.replicas.replicas]
        if paused:
            for f in files:
                f.write_text(fault)
        outcome: dict[str, Any] = {}
        started = time.monotonic()
        patcher = threading.Thread(target=lambda: outcome.update(first=self._patch(namespace)))
        patcher.start()
        hit = False
        if paused:
            hit = self._wait(lambda: bool(self._markers()), 30)
        else:
            time.sleep(float(fault.split()[1][:-1]))
        for f in files:
            f.unlink(missing_ok=True)
        self.control_plane.kill_apiserver()
        killed_at = time.monotonic()
        for marker in self._markers():
            marker.unlink(missing_ok=True)
        time.sleep(rng.uniform(0.0, 1.5))
        self.control_plane.start_apiserver()
        down = time.monotonic() - killed_at
        patcher.join(150)
        attempts = 1
        ok, stderr = outcome.get("first", (False, "no answer"))
        while not ok and attempts < 5:
            # The patch was in flight when kube-apiserver died: a client makes it again.
            attempts += 1
            ok, stderr = self._patch(namespace)
        result = RunResult(index, "leader", fault, hit, kind="kube-apiserver")
        result.patch_attempts = attempts
        result.warning = stderr
        result.down_seconds = round(down, 2)
        if not ok:
            raise RuntimeError(f"kubectl patch after {attempts} attempts: {stderr}")
        return self._outcome(index, namespace, uid, started, result)

    def _etcd_run(self, index: int, namespace: str, kind: str) -> RunResult:
        """etcd broken while the admission writes its entry: the write fails, the review
        fails open; once etcd is back the reconciler plans the deferred resize."""
        assert self.replicas is not None and self.control_plane is not None
        cp = self.control_plane
        uid = self._setup(namespace)
        if not self._wait(lambda: self.leader() != "", 30):
            raise RuntimeError("no leader")
        files = [self.fault_dir / r.identity for r in self.replicas.replicas]
        for f in files:
            f.write_text("ledger-before:1:pause")
        outcome: dict[str, Any] = {}
        landed: set[str] = set()
        watching = threading.Event()

        def admissions() -> set[str]:
            # Entries of high's that are not the reconciler's are an admission's.
            return {
                e.review_uid
                for e in self.ledger_entries()
                if e.pod.uid == uid and not e.review_uid.startswith("deferred/")
            }

        def watch_ledger() -> None:
            while not watching.is_set():
                with contextlib.suppress(Exception):
                    landed.update(admissions())
                time.sleep(0.05)

        watcher = threading.Thread(target=watch_ledger, daemon=True)
        watcher.start()
        started = time.monotonic()

        def patch() -> None:
            outcome["first"] = self._patch(namespace)
            outcome["evictions"] = sum(self.eviction_calls(namespace).values())

        patcher = threading.Thread(target=patch)
        patcher.start()
        hit = self._wait(lambda: bool(self._markers()), 30)
        broke_at = time.monotonic()
        if kind == "etcd-stall":
            cp.stall_etcd()
        else:
            cp.processes["etcd"].kill()
        for f in files:
            f.unlink(missing_ok=True)
        for marker in self._markers():
            marker.unlink(missing_ok=True)
        # Longer than the webhook's timeoutSeconds (5): the review is answered meanwhile.
        time.sleep(ETCD_DOWN)
        if kind == "etcd-stall":
            cp.resume_etcd()
        else:
            cp.restart_etcd()
        down = time.monotonic() - broke_at
        patcher.join(150)
        attempts = 1
        ok, first = outcome.get("first", (False, "no answer"))
        stderr = first
        evictions_at_answer = int(outcome.get("evictions", 0))
        # The entries of the review in flight (none, or a late one); a retry's are fine.
        in_flight = set(landed)
        while not ok and attempts < 5:
            # etcd was down when the API server persisted the resize: made again.
            attempts += 1
            time.sleep(1.0)
            ok, stderr = self._patch(namespace)
        result = RunResult(index, "any", "during-admission", hit, kind=kind)
        result.patch_attempts = attempts
        result.warning = first if attempts == 1 else f"{first} | again: {stderr}"
        result.down_seconds = round(down, 2)
        result.failed_open = "could not plan this resize" in first
        result.evictions_at_answer = evictions_at_answer
        if not ok:
            watching.set()
            raise RuntimeError(f"kubectl patch after {attempts} attempts: {stderr}")
        try:
            return self._outcome(index, namespace, uid, started, result)
        finally:
            watching.set()
            watcher.join(5)
            result.admission_entry_landed = bool(in_flight)
            result.admission_entry_left = bool(in_flight & self._with_api(admissions))
            result.reconciler_planned = "DeferredResizePreemption" in self._with_api(
                lambda: self.reasons(namespace, "high")
            )

    def reasons(self, namespace: str, name: str) -> set[str]:
        """Reasons of the events on pod ``name``."""
        items = self.client.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        return {e.get("reason", "") for e in items if e["involvedObject"]["name"] == name}

    def review_figures(self) -> dict[str, Any]:
        """What the replicas answered since they started, from their ``/metrics``: reviews
        by verdict, the web layer's errors (what would have been a 5xx) and the p99 of the
        answer time (the upper bound of its histogram bucket), summed over replicas."""
        assert self.replicas is not None
        verdicts: Counter[str] = Counter()
        buckets: Counter[float] = Counter()
        web_errors = 0.0
        for replica in self.replicas.replicas:
            url = f"http://127.0.0.1:{replica.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                text = response.read().decode()
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name == "resize_preemption_reviews_total":
                        verdicts[s.labels["verdict"]] += int(s.value)
                    elif s.name == "resize_preemption_review_duration_seconds_bucket" and (
                        s.labels.get("endpoint") == "validate"
                    ):
                        buckets[float(s.labels["le"])] += s.value
                    elif (
                        s.name == "resize_preemption_errors_total"
                        and s.labels.get("where") == "web"
                    ):
                        web_errors += s.value
        total = max(buckets.values(), default=0.0)

        def centile(q: float) -> str:
            le = next((b for b in sorted(buckets) if buckets[b] >= q * total), 0.0)
            if le == float("inf"):
                finite = max((b for b in buckets if b != float("inf")), default=0.0)
                return f"> {finite * 1000:g} ms"
            return f"<= {le * 1000:g} ms"

        return {
            "reviews": sum(verdicts.values()),
            "by_verdict": dict(verdicts),
            "web_errors": int(web_errors),
            "p50": centile(0.50),
            "p90": centile(0.90),
            "p99": centile(0.99),
        }

    def _markers(self) -> list[Path]:
        return sorted(self.fault_dir.glob("*.paused"))

    def ledger_entries(self) -> list[Any]:
        leases = self.client.get(
            f"/apis/coordination.k8s.io/v1/namespaces/{self.service_namespace}/leases"
        )["items"]
        out: list[Any] = []
        for lease in leases:
            raw = (lease["metadata"].get("annotations") or {}).get("resize-preemption.io/ledger")
            out.extend(decode_entries(raw))
        return out

    def _outcome(
        self, index: int, namespace: str, uid: str, started: float, result: RunResult
    ) -> RunResult:
        assert self.replicas is not None

        def actuated() -> bool:
            statuses = (self.pod(namespace, "high") or {}).get("status", {}).get(
                "containerStatuses"
            ) or []
            cpu = (
                statuses[0].get("resources", {}).get("requests", {}).get("cpu")
                if statuses
                else None
            )
            return cpu == "5"

        def safely(check: Any) -> Any:
            return lambda: self._with_api(check)

        done = self._wait(safely(actuated), 90)
        released = self._wait(
            safely(lambda: not self.ledger_holds(uid, self.pod(namespace, "high"))), 30
        )
        seconds = time.monotonic() - started
        time.sleep(1.0)  # late, wrong evictions would show by now
        ready = self._wait(lambda: all(self.ready(r) for r in self.replicas.replicas), 30)  # type: ignore[union-attr]
        calls = self.eviction_calls(namespace)
        gone = [n for n in ("high", "steady", *LOWS) if self.pod(namespace, n) is None]
        evicted_lows = [n for n in LOWS if n in gone or calls.get(n)]
        wrong = [n for n in ("high", "steady") if n in gone or calls.get(n)]
        events = self.preempted_events(namespace)
        result.evicted = sorted(set(evicted_lows) | set(wrong))
        result.eviction_calls = sum(calls.values())
        made = self.evictions_made(namespace)
        result.double_evictions = sum(c - 1 for c in made.values() if c > 1)
        result.unneeded_evictions = max(0, len(evicted_lows) - NEEDED) + len(wrong)
        result.preempted_events_max = max(events.values(), default=0)
        result.actuated = done
        result.released = released
        result.ready_after = ready
        result.seconds = round(seconds, 2)
        self.log(
            f"run {index:2d}: {result.kind:14s} {result.target:8s} {result.fault:22s} "
            f"hit={result.killed!s:5s} evicted={','.join(result.evicted)} "
            f"calls={result.eviction_calls} double={result.double_evictions} "
            f"unneeded={result.unneeded_evictions} actuated={done} released={released} "
            f"ready={ready} patches={result.patch_attempts} down={result.down_seconds}s "
            f"{seconds:.1f}s"
        )
        return result
