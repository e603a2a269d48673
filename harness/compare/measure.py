"""What the comparison records while a scenario runs.

* :class:`PodWatcher` watches one namespace's pods from a resourceVersion taken before the
  resizes and notes, on this process's monotonic clock, when each pod first shows a
  ``deletionTimestamp`` (or disappears: eviction and DELETE both end that way) and when
  each resizing pod's actual cpu request (``status.containerStatuses[app].resources``)
  reaches the size asked for.
* :func:`count_requests` counts the API requests of one component in the API server's
  audit log (every request is logged at ``Metadata`` level by the comparison's audit
  policy) by user agent, within a wall-clock window. Leader election's Lease traffic is
  left out of the total: it is the same whether a scenario runs or not (``bench.experiments.idle``
  measures it at rest, for both sides), and the comparison runs kube-scheduler with
  ``--leader-elect=false``, so counting ours would compare renewals with nothing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from harness import quantity
from harness.kubeapi import ApiError, KubeClient, WatchExpired

#: Logs every request once it completes (watches: also when the stream starts).
AUDIT_EVERYTHING: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


@dataclass
class Observations:
    deleted: dict[str, float] = field(default_factory=dict)  # pod name -> monotonic time
    actuated: dict[str, float] = field(default_factory=dict)


class PodWatcher:
    """Watches ``namespace``'s pods in a thread; see the module docstring."""

    def __init__(self, client: KubeClient, namespace: str, targets: dict[str, int]) -> None:
        """``targets``: resizing pod name -> the cpu millicores it asked for."""
        self.client = client
        self.namespace = namespace
        self.targets = dict(targets)
        self.seen = Observations()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._response: Any = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="compare-watch", daemon=True)

    def start(self) -> PodWatcher:
        self._thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("pod watch did not start")
        return self

    def stop(self) -> Observations:
        self._stop.set()
        if self._response is not None:
            with contextlib.suppress(Exception):  # best effort, the thread is a daemon
                self._response.shutdown()
        self._thread.join(5)
        with self._lock:
            return Observations(dict(self.seen.deleted), dict(self.seen.actuated))

    def snapshot(self) -> Observations:
        with self._lock:
            return Observations(dict(self.seen.deleted), dict(self.seen.actuated))

    def _run(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        version = ""
        while not self._stop.is_set():
            try:
                if not version:
                    listing = self.client.get(path)
                    version = listing["metadata"]["resourceVersion"]
                    for pod in listing["items"]:
                        self._note("MODIFIED", pod)
                    self._ready.set()
                for event in self.client.watch(
                    path,
                    version,
                    timeout_seconds=300,
                    stop=self._stop,
                    on_response=lambda r: setattr(self, "_response", r),
                ):
                    obj = event["object"]
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if event["type"] != "BOOKMARK":
                        self._note(event["type"], obj)
            except WatchExpired:
                version = ""
            except (ApiError, OSError):
                if self._stop.wait(0.2):
                    return

    def _note(self, kind: str, pod: dict[str, Any]) -> None:
        now = time.monotonic()
        name = pod["metadata"]["name"]
        with self._lock:
            if (kind == "DELETED" or pod["metadata"].get("deletionTimestamp")) and (
                name not in self.seen.deleted
            ):
                self.seen.deleted[name] = now
            want = self.targets.get(name)
            if want is not None and name not in self.seen.actuated and actual_cpu(pod) == want:
                self.seen.actuated[name] = now


def actual_cpu(pod: dict[str, Any]) -> int | None:
    """Millicores the kubelet reports applied to container ``app``."""
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status.get("name") == "app":
            cpu = ((status.get("resources") or {}).get("requests") or {}).get("cpu")
            return quantity.milli_value(cpu) if cpu is not None else None
    return None


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class AuditCursor:
    """A byte offset into the audit log: only lines after it are read."""

    path: Path
    offset: int = 0

    @classmethod
    def at_end(cls, path: Path) -> AuditCursor:
        return cls(path, path.stat().st_size if path.exists() else 0)

    def events(self) -> Iterable[dict[str, Any]]:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            for line in f:
                if line.strip():
                    try:
                        yield orjson.loads(line)
                    except orjson.JSONDecodeError:
                        continue  # a line still being written


#: Leader-election Leases (ours, and kube-scheduler's when it elects): idle traffic.
LEADER_LEASES = frozenset({"resize-preemption-webhook-leader", "kube-scheduler"})
#: The breakdown's label for them.
IDLE_LABEL = "leader election (idle, not in the total)"


def count_requests(
    cursor: AuditCursor,
    user_agent_prefix: str,
    start: float,
    end: float,
    *,
    leader_apart: bool = True,
) -> tuple[int, dict[str, int]]:
    """Distinct requests (audit IDs) whose user agent starts with ``user_agent_prefix`` and
    that the API server received between ``start`` and ``end`` (wall clock, seconds).
    Returns the total and a breakdown by ``verb resource[/subresource]``. Requests on a
    leader-election Lease (:data:`LEADER_LEASES`) are in the breakdown under
    :data:`IDLE_LABEL` and not in the total, unless ``leader_apart`` is false (counting
    the traffic at rest, which is mostly theirs)."""
    seen: dict[str, str] = {}
    for event in cursor.events():
        if not str(event.get("userAgent", "")).startswith(user_agent_prefix):
            continue
        received = _stamp(event["requestReceivedTimestamp"])
        if not start <= received <= end:
            continue
        ref = event.get("objectRef") or {}
        what = ref.get("resource", event.get("requestURI", "?"))
        if ref.get("subresource"):
            what += "/" + ref["subresource"]
        if leader_apart and what == "leases" and ref.get("name") in LEADER_LEASES:
            seen[event["auditID"]] = IDLE_LABEL
            continue
        seen[event["auditID"]] = f"{event.get('verb', '?')} {what}"
    breakdown: dict[str, int] = {}
    for what in seen.values():
        breakdown[what] = breakdown.get(what, 0) + 1
    total = sum(n for what, n in breakdown.items() if what != IDLE_LABEL)
    return total, dict(sorted(breakdown.items()))
