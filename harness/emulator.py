"""Node emulator: a test double of the kubelet's part in in-place pod resize.

There is no kubelet and no container runtime here. The emulator registers Node objects and
acts for them against the real API server, the way a kubelet would:

* pods bound to an emulated node are admitted (or rejected) and reported Running;
* a change of a pod's desired resources is decided with :mod:`harness.kubelet_model`:
  actuated at once when it fits, otherwise ``PodResizePending`` (``Deferred``) with the
  kubelet's message and a ``ResizeDeferred`` event;
* deferred resizes are retried, in the kubelet's order, when a pod leaves the node, turns
  terminal or shrinks, when another resize arrives, and periodically;
* a pod with a deletionTimestamp is removed (DELETE with grace 0) after its grace period,
  optionally capped so tests do not wait 30 s.

Everything is driven by list+watch, so reactions take milliseconds. All decisions happen on
one worker thread (the kubelet serialises them with a mutex as well); watch threads only
feed it.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from harness import kubelet_model as km
from harness import kubelet_objects as ko
from harness.kubeapi import ApiError, KubeClient, WatchExpired
from harness.kubelet_objects import NodeSpec

__all__ = ["EmulatorOptions", "NodeEmulator", "NodeSpec", "default_nodes"]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class EmulatorOptions:
    """Knobs of the emulator; the defaults behave like a v1.37.2 kubelet.

    ``deletion_grace_cap``: seconds after which a terminating pod is removed even if its
    grace period is longer (None: honour it fully).
    ``retry_period``: the kubelet also retries pending resizes on a ticker (30 s, then every
    3 min); None disables it, event-driven retries still happen.
    ``legacy_infeasible_check``: report resizes above allocatable as Infeasible, like
    kubelets before 1.36.
    ``report_preemption_disabled``: add ``PodResizePreemptionDisabled=True`` to deferred pods
    on nodes that opted out of resize preemption. Not in v1.37.2 (KEP-5836 rejected it), off
    by default.
    """

    deletion_grace_cap: float | None = None
    retry_period: float | None = 180.0
    legacy_infeasible_check: bool = False
    report_preemption_disabled: bool = False
    emit_events: bool = True


def default_nodes(
    count: int = 1, cpu: str = "8", memory: str = "16Gi", pods: int = 110
) -> list[NodeSpec]:
    """``node-1`` .. ``node-N``, all the same size."""
    return [NodeSpec(f"node-{i}", cpu, memory, pods) for i in range(1, count + 1)]


class NodeEmulator:
    """Registers nodes and plays their kubelets; use as a context manager or start()/stop()."""

    def __init__(
        self,
        client: KubeClient,
        nodes: Sequence[NodeSpec],
        options: EmulatorOptions | None = None,
    ) -> None:
        self.client = client
        self.options = options or EmulatorOptions()
        self.specs = {n.name: n for n in nodes}
        self._index = {n.name: i for i, n in enumerate(nodes)}
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._timers: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._responses: dict[str, Any] = {}
        self._synced = {"pods": threading.Event(), "nodes": threading.Event()}
        # Worker-thread state: the latest objects and the kubelet's private memory.
        self._nodes: dict[str, dict[str, Any]] = {}
        self._pods: dict[str, dict[str, Any]] = {}
        self._alloc: dict[str, km.PodAllocation] = {}
        self._pending: dict[str, list[str]] = {name: [] for name in self.specs}
        self._pending_since: dict[str, float] = {}
        self._resize_conditions: dict[str, dict[str, Any]] = {}
        self._opt_out_conditions: dict[str, dict[str, Any]] = {}
        self._finalizing: set[str] = set()
        self._ips: dict[str, str] = {}
        self._next_ip: dict[str, int] = dict.fromkeys(self.specs, 0)
        self.errors: list[BaseException] = []

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> NodeEmulator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 30.0) -> None:
        """Register the nodes, start watching and wait for the first list of pods."""
        for spec in self.specs.values():
            self._register(spec)
        for name, target in (("pods", self._watch_pods), ("nodes", self._watch_nodes)):
            t = threading.Thread(
                target=self._guard(target), name=f"emulator-watch-{name}", daemon=True
            )
            t.start()
            self._threads.append(t)
        if self.options.retry_period:
            self._schedule(30.0, "periodic", None)  # the kubelet's first tick comes after 30 s
        worker = threading.Thread(
            target=self._guard(self._work), name="emulator-worker", daemon=True
        )
        worker.start()
        self._threads.append(worker)
        deadline = time.monotonic() + timeout
        for event in self._synced.values():
            if not event.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError("node emulator did not sync with the API server")

    def stop(self) -> None:
        """Stop all threads (idempotent). Nodes and pods stay in the API."""
        self._stop.set()
        self._queue.put(("stop", None))
        for response in list(self._responses.values()):
            with contextlib.suppress(Exception):
                response.shutdown()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until the worker has processed everything queued so far."""
        self._ask(lambda: None, timeout)

    def _guard(self, target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except Exception as exc:  # surfaced through .errors; a dead thread is silent
                if not self._stop.is_set():
                    log.exception("node emulator thread failed")
                    self.errors.append(exc)

        return run

    # --- node registration ----------------------------------------------------------------

    def _register(self, spec: NodeSpec) -> None:
        body = ko.node_object(spec, self._index[spec.name])
        try:
            created = self.client.create("/api/v1/nodes", body)
        except ApiError as e:
            if e.status != 409:
                raise
            created = self.client.get(f"/api/v1/nodes/{spec.name}")
            created["status"] = body["status"]
            created = self.client.replace(f"/api/v1/nodes/{spec.name}/status", created)
        # The TaintNodesByCondition admission plugin taints new nodes not-ready; the node
        # lifecycle controller would lift it once Ready, and that controller is not running.
        if created.get("spec", {}).get("taints"):
            self.client.patch(f"/api/v1/nodes/{spec.name}", {"spec": {"taints": None}})
        try:
            # Created once, never renewed: nothing here watches node heartbeats.
            self.client.create(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                ko.lease_object(created),
            )
        except ApiError as e:
            if e.status not in (404, 409):  # namespace not created yet / already there
                raise

    def add_node(self, spec: NodeSpec) -> None:
        """Register one more node while running (its kubelet starts acting at once)."""
        if spec.name in self.specs:
            raise ValueError(f"node {spec.name} is already emulated")
        done = threading.Event()

        def adopt() -> None:
            self._index[spec.name] = len(self._index)
            self._pending[spec.name] = []
            self._next_ip[spec.name] = 0
            self.specs[spec.name] = spec
            done.set()

        # The worker owns these maps; let it adopt the node before the API sees it.
        self._queue.put(("call", adopt))
        if not done.wait(10):
            raise TimeoutError("node emulator worker is stuck")
        self._register(spec)

    def set_allocatable(
        self,
        node: str,
        *,
        cpu: str | None = None,
        memory: str | None = None,
        pods: int | None = None,
    ) -> None:
        """Change a node's capacity/allocatable (an in-place node resize)."""
        current = self.client.get(f"/api/v1/nodes/{node}")
        for key in ("capacity", "allocatable"):
            values = current["status"][key]
            if cpu is not None:
                values["cpu"] = cpu
            if memory is not None:
                values["memory"] = memory
            if pods is not None:
                values["pods"] = str(pods)
        self.client.replace(f"/api/v1/nodes/{node}/status", current)

    # --- watches --------------------------------------------------------------------------

    def _watch_pods(self) -> None:
        self._list_and_watch("pods", "/api/v1/pods")

    def _watch_nodes(self) -> None:
        self._list_and_watch("nodes", "/api/v1/nodes")

    def _list_and_watch(self, kind: str, path: str) -> None:
        version = ""
        while not self._stop.is_set():
            if not version:
                listing = self._retrying(lambda: self.client.get(path))
                if listing is None:
                    return
                version = listing["metadata"]["resourceVersion"]
                self._queue.put((f"{kind}-sync", listing["items"]))
                self._queue.put(("call", self._synced[kind].set))
            try:
                for event in self.client.watch(
                    path,
                    version,
                    timeout_seconds=240,
                    stop=self._stop,
                    on_response=lambda r, k=kind: self._responses.__setitem__(k, r),
                ):
                    obj = event["object"]
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event["type"] != "BOOKMARK":
                        self._queue.put((kind, (event["type"], obj)))
            except WatchExpired:
                version = ""
            except (ApiError, OSError) as e:
                if self._stop.is_set():
                    return
                log.warning("watch %s failed, relisting: %s", path, e)
                version = ""
                self._stop.wait(0.5)

    def _retrying(self, call: Callable[[], Any]) -> Any:
        while not self._stop.is_set():
            try:
                return call()
            except (ApiError, OSError) as e:
                log.warning("emulator request failed, retrying: %s", e)
                self._stop.wait(0.5)
        return None

    # --- worker ---------------------------------------------------------------------------

    def _schedule(self, delay: float, kind: str, payload: Any) -> None:
        """Queue a timed task; only called from the worker or before it starts."""
        heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), kind, payload))

    def _work(self) -> None:
        handlers: dict[str, Callable[[Any], None]] = {
            "pods": self._on_pod_event,
            "nodes": self._on_node_event,
            "pods-sync": self._on_pods_sync,
            "nodes-sync": self._on_nodes_sync,
            "call": lambda fn: fn(),
        }
        while not self._stop.is_set():
            timeout = None
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - time.monotonic())
            try:
                kind, payload = self._queue.get(timeout=timeout)
            except queue.Empty:
                kind, payload = "", None
            if kind == "stop":
                return
            if kind:
                self._safely(handlers[kind], payload)
            while self._timers and self._timers[0][0] <= time.monotonic():
                _, _, timer_kind, timer_payload = heapq.heappop(self._timers)
                self._safely(self._on_timer, (timer_kind, timer_payload))

    def _safely(self, handler: Callable[[Any], None], payload: Any) -> None:
        try:
            handler(payload)
        except (ApiError, OSError) as e:
            # One failed call must not stop the kubelet; the next event or retry repairs it.
            log.warning("node emulator: %s", e)

    def _on_timer(self, item: tuple[str, Any]) -> None:
        kind, payload = item
        if kind == "finalize":
            self._finalize(payload)
        elif kind == "periodic":
            for node in self.specs:
                self._retry_pending(node)
            if self.options.retry_period:
                self._schedule(self.options.retry_period, "periodic", None)

    # --- node events ----------------------------------------------------------------------

    def _on_nodes_sync(self, items: list[dict[str, Any]]) -> None:
        for node in items:
            self._on_node_event(("MODIFIED", node))

    def _on_node_event(self, payload: tuple[str, dict[str, Any]]) -> None:
        kind, node = payload
        name = node["metadata"]["name"]
        if name not in self.specs:
            return
        if kind == "DELETED":
            self._nodes.pop(name, None)
            return
        previous = self._nodes.get(name)
        self._nodes[name] = node
        if previous is None:
            # Pods listed before their node was known were only stored: act on them now.
            for pod in [p for p in self._pods.values() if p["spec"]["nodeName"] == name]:
                self._on_pod_event(("MODIFIED", pod))
            return
        changed_capacity = previous["status"].get("allocatable") != node["status"].get(
            "allocatable"
        )
        changed_opt_out = km.resize_preemption_opt_outs(previous) != km.resize_preemption_opt_outs(
            node
        )
        if changed_capacity:
            self._retry_pending(name)
        elif changed_opt_out and self.options.report_preemption_disabled:
            for uid in list(self._pending[name]):
                self._sync_status(uid)

    # --- pod events -----------------------------------------------------------------------

    def _on_pods_sync(self, items: list[dict[str, Any]]) -> None:
        seen = set()
        for pod in items:
            if pod.get("spec", {}).get("nodeName") in self.specs:
                seen.add(pod["metadata"]["uid"])
                self._on_pod_event(("MODIFIED", pod))
        for uid in [u for u in self._pods if u not in seen]:
            self._on_pod_event(("DELETED", self._pods[uid]))

    def _on_pod_event(self, payload: tuple[str, dict[str, Any]]) -> None:
        kind, pod = payload
        node = pod.get("spec", {}).get("nodeName")
        if node not in self.specs:
            return
        uid = pod["metadata"]["uid"]
        if kind == "DELETED":
            self._forget(uid)
            self._retry_pending(node)  # TriggerReasonPodsRemoved
            return
        previous = self._pods.get(uid)
        self._pods[uid] = pod
        if node not in self._nodes:
            return  # the node list arrives first in practice; the pod sync replays it
        if pod["metadata"].get("deletionTimestamp"):
            self._schedule_finalize(pod)
            return
        if km.is_terminal(pod):
            if previous is not None and not km.is_terminal(previous):
                self._retry_pending(node)  # TriggerReasonPodTerminated
            return
        if uid not in self._alloc:
            self._admit(pod)
            return
        if km.resize_requested(pod, self._alloc[uid]):
            # Like HandlePodUpdates: act on a new resize request (spec changes bump the
            # generation), not on every echo of our own status writes.
            new_request = previous is None or _generation(previous) != _generation(pod)
            if uid not in self._pending[node]:
                self._pending[node].append(uid)
                new_request = True
            if new_request:
                self._retry_pending(node)  # TriggerReasonPodUpdated
        else:
            if uid in self._pending[node]:
                self._pending[node].remove(uid)
            self._resize_conditions.pop(uid, None)  # a reverted resize clears Pending
            self._pending_since.pop(uid, None)
            self._sync_status(uid)

    def _forget(self, uid: str) -> None:
        pod = self._pods.pop(uid, None)
        self._alloc.pop(uid, None)
        self._resize_conditions.pop(uid, None)
        self._opt_out_conditions.pop(uid, None)
        self._pending_since.pop(uid, None)
        self._finalizing.discard(uid)
        self._ips.pop(uid, None)
        if pod is not None:
            node = pod["spec"]["nodeName"]
            if uid in self._pending.get(node, []):
                self._pending[node].remove(uid)

    def _others(self, node: str, uid: str) -> list[tuple[dict[str, Any], km.PodAllocation]]:
        """Admitted pods on ``node`` other than ``uid`` with their allocation."""
        return [
            (p, self._alloc[u])
            for u, p in self._pods.items()
            if u != uid and u in self._alloc and p["spec"]["nodeName"] == node
        ]

    def _admit(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        node = pod["spec"]["nodeName"]
        restored = km.allocation_from_status(pod)
        if restored is not None and pod.get("status", {}).get("phase") == "Running":
            # Already running under an earlier emulator: its allocation is the checkpoint and
            # its resize conditions are backfilled (BackfillPodResizeConditions).
            self._alloc[uid] = restored
            pending = next(
                (c for c in pod["status"].get("conditions") or [] if c["type"] == km.PENDING),
                None,
            )
            if pending is not None:
                self._resize_conditions[uid] = dict(pending)
                self._pending_since[uid] = time.monotonic()
            self._on_pod_event(("MODIFIED", pod))
            return
        decision = km.decide_admission(pod, self._others(node, uid), self._nodes[node])
        if decision.outcome is not km.Outcome.ACTUATE:
            self._reject(pod, decision)
            return
        self._alloc[uid] = km.allocation_from_spec(pod)
        self._sync_status(uid)

    def _reject(self, pod: dict[str, Any], decision: km.Decision) -> None:
        self._event(pod, "Warning", decision.reason, decision.message)
        self._write_status(pod["metadata"]["uid"], lambda p: ko.rejected_status(p, decision))

    # --- resizes --------------------------------------------------------------------------

    def _retry_pending(self, node: str) -> None:
        """``retryPendingResizes``: every pending resize on the node, in the kubelet's order."""
        pending = [u for u in self._pending.get(node, []) if u in self._pods and u in self._alloc]
        pending.sort(
            key=lambda u: km.retry_order_key(
                self._pods[u], self._alloc[u], self._pending_since.get(u)
            )
        )
        still_pending: list[str] = []
        for uid in pending:
            pod = self._pods[uid]
            if pod["metadata"].get("deletionTimestamp") or km.is_terminal(pod):
                continue
            decision = km.decide_resize(
                pod,
                self._alloc[uid],
                self._others(node, uid),
                self._nodes[node],
                legacy_infeasible_check=self.options.legacy_infeasible_check,
            )
            if decision.outcome is km.Outcome.ACTUATE:
                self._actuate(uid)
            elif decision.outcome is km.Outcome.NONE:
                self._resize_conditions.pop(uid, None)
                self._pending_since.pop(uid, None)
                self._sync_status(uid)
            else:
                self._set_pending(uid, decision)
                if decision.outcome is km.Outcome.DEFERRED:
                    still_pending.append(uid)
        self._pending[node] = still_pending

    def _actuate(self, uid: str) -> None:
        pod = self._pods[uid]
        node = pod["spec"]["nodeName"]
        before = km.in_use(pod, self._alloc[uid])
        self._alloc[uid] = km.allocation_from_spec(pod)
        self._resize_conditions.pop(uid, None)
        self._opt_out_conditions.pop(uid, None)
        self._pending_since.pop(uid, None)
        self._event(
            pod, "Normal", km.EVENT_STARTED, km.resize_event_message("Pod resize started", pod)
        )
        self._sync_status(uid)
        self._event(
            pod, "Normal", km.EVENT_COMPLETED, km.resize_event_message("Pod resize completed", pod)
        )
        after = km.pod_requests(pod)
        if after.cpu < before.cpu or after.memory < before.memory:
            # A shrink frees room: the kubelet retries on "pod_resized". Queued so the
            # current retry pass finishes first.
            self._queue.put(("call", lambda: self._retry_pending(node)))

    def _set_pending(self, uid: str, decision: km.Decision) -> None:
        """``SetPodResizePendingCondition`` + event when the reason or generation changed."""
        pod = self._pods[uid]
        generation = _generation(pod)
        reason = decision.condition_reason
        old = self._resize_conditions.get(uid)
        now = ko.now()
        changed = old is None or old["reason"] != reason or old["observedGeneration"] != generation
        same = not changed and old is not None and old["message"] == decision.message
        transition = old["lastTransitionTime"] if old and old["reason"] == reason else now
        if old is None or old["reason"] != reason:
            self._pending_since[uid] = time.monotonic()
        self._resize_conditions[uid] = {
            "type": km.PENDING,
            "status": "True",
            # Unchanged verdicts keep their probe time: no status write for a no-op retry.
            "lastProbeTime": old["lastProbeTime"] if same and old else now,
            "lastTransitionTime": transition,
            "observedGeneration": generation,
            "reason": reason,
            "message": decision.message,
        }
        if changed:
            event_reason, message = km.pending_event(decision, pod)
            self._event(pod, "Warning", event_reason, message)
        self._sync_status(uid)

    # --- deletion -------------------------------------------------------------------------

    def _schedule_finalize(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if uid in self._finalizing:
            return
        self._finalizing.add(uid)
        grace = float(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
        # deletionTimestamp = time of the DELETE + grace period (second precision).
        remaining = ko.parse_time(pod["metadata"]["deletionTimestamp"]) - time.time()
        delay = max(0.0, min(grace, remaining))
        if self.options.deletion_grace_cap is not None:
            delay = min(delay, self.options.deletion_grace_cap)
        self._schedule(delay, "finalize", uid)

    def _finalize(self, uid: str) -> None:
        pod = self._pods.get(uid)
        if pod is None:
            return
        meta = pod["metadata"]
        try:
            self.client.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}},
            )
        except ApiError as e:
            if e.status not in (404, 409):  # gone already, or replaced by a new pod
                log.warning("removing pod %s failed, retrying: %s", meta["name"], e)
                self._schedule(1.0, "finalize", uid)

    # --- status ---------------------------------------------------------------------------

    def _sync_status(self, uid: str) -> None:
        """Write the kubelet's view of the pod's status if it differs from the API's."""
        if uid not in self._alloc:
            return
        self._write_status(uid, self._render_status)

    def _write_status(self, uid: str, render: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        for _ in range(5):
            pod = self._pods.get(uid)
            if pod is None:
                return
            status = render(pod)
            if ko.semantic_equal(status, pod.get("status", {})):
                return
            meta = pod["metadata"]
            body = {**pod, "status": status}
            try:
                self._pods[uid] = self.client.replace(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status", body
                )
                return
            except ApiError as e:
                if e.status == 404:
                    return
                if e.status != 409:
                    raise
                fresh = self.client.get(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
                )
                if fresh["metadata"]["uid"] != uid:
                    return
                self._pods[uid] = fresh
        log.warning("gave up writing the status of pod %s after repeated conflicts", uid)

    def _render_status(self, pod: dict[str, Any]) -> dict[str, Any]:
        uid = pod["metadata"]["uid"]
        node = pod["spec"]["nodeName"]
        conditions: list[dict[str, Any]] = []
        if uid in self._resize_conditions:
            conditions.append(self._resize_conditions[uid])
            if (opt_out := self._opt_out_condition(uid, node)) is not None:
                conditions.append(opt_out)
        return ko.running_status(
            pod,
            self._alloc[uid],
            node_ip=ko.host_ip(self._index[node]),
            ip=self._pod_ip(uid, node, pod.get("status", {})),
            resize_conditions=conditions,
        )

    def _opt_out_condition(self, uid: str, node: str) -> dict[str, Any] | None:
        if not self.options.report_preemption_disabled:
            return None
        pending = self._resize_conditions.get(uid)
        owners = km.resize_preemption_opt_outs(self._nodes.get(node, {}))
        if not owners or pending is None or pending["reason"] != km.DEFERRED:
            self._opt_out_conditions.pop(uid, None)
            return None
        cached = self._opt_out_conditions.get(uid)
        fresh = ko.preemption_disabled_condition(node, owners)
        if cached is None or cached["message"] != fresh["message"]:
            self._opt_out_conditions[uid] = cached = fresh
        return cached

    def _pod_ip(self, uid: str, node: str, old: dict[str, Any]) -> str:
        if uid not in self._ips:
            if old.get("podIP"):
                self._ips[uid] = old["podIP"]
            else:
                self._ips[uid] = ko.pod_ip(self._index[node], self._next_ip[node])
                self._next_ip[node] += 1
        return self._ips[uid]

    def _event(self, pod: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """Record a core/v1 Event as the kubelet does: best effort."""
        if not self.options.emit_events:
            return
        namespace = pod["metadata"]["namespace"]
        try:
            self.client.create(
                f"/api/v1/namespaces/{namespace}/events",
                ko.event_object(pod, kind, reason, message),
            )
        except ApiError as e:
            log.debug("event %s for %s not recorded: %s", reason, pod["metadata"]["name"], e)

    # --- read-only views for tests --------------------------------------------------------

    def _ask(self, question: Callable[[], T], timeout: float = 10.0) -> T:
        """Evaluate ``question`` on the worker thread, after everything queued before it."""
        answer: list[T] = []
        done = threading.Event()

        def call() -> None:
            answer.append(question())
            done.set()

        self._queue.put(("call", call))
        if not done.wait(timeout):
            raise TimeoutError("node emulator worker is stuck")
        return answer[0]

    def pending_resizes(self, node: str) -> list[str]:
        """Names of the pods whose resize is deferred on ``node``, in no particular order."""
        return self._ask(
            lambda: [
                self._pods[u]["metadata"]["name"]
                for u in self._pending.get(node, [])
                if u in self._pods
            ]
        )

    def known_pods(self) -> list[tuple[str, str]]:
        """(namespace, name) of every pod the emulated kubelets currently account for."""
        return self._ask(
            lambda: sorted(
                (p["metadata"]["namespace"], p["metadata"]["name"]) for p in self._pods.values()
            )
        )


def _generation(obj: dict[str, Any]) -> int:
    return int(obj["metadata"].get("generation") or 0)
