"""Reading the API server's audit log (JSON lines) that the launcher writes."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from harness.kubeapi import KubeClient


def audit_events(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete event in the log; a line still being written is skipped."""
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


def eviction_codes(path: Path, namespace: str) -> dict[str, list[int]]:
    """Eviction requests answered in ``namespace``: pod name -> response codes, in order."""
    codes: dict[str, list[int]] = {}
    for event in audit_events(path):
        ref = event.get("objectRef") or {}
        if (
            ref.get("subresource") == "eviction"
            and ref.get("namespace") == namespace
            and event.get("stage") == "ResponseComplete"
        ):
            code = (event.get("responseStatus") or {}).get("code", 0)
            codes.setdefault(str(ref.get("name", "")), []).append(int(code))
    return codes


def deletion_time(pod: Mapping[str, Any]) -> dt.datetime | None:
    """When ``pod`` was deleted (evicted), to the second: its ``deletionTimestamp`` less its
    grace period; None while it is not terminating."""
    meta = pod.get("metadata") or {}
    if not meta.get("deletionTimestamp"):
        return None
    deadline = dt.datetime.fromisoformat(meta["deletionTimestamp"])
    return deadline - dt.timedelta(seconds=int(meta.get("deletionGracePeriodSeconds") or 0))


def evictions_made(
    audit_log: Path, namespace: str, deleted: Mapping[str, dt.datetime]
) -> Counter[str]:
    """Eviction calls that took effect, per pod name. Every call answered 2xx did. A call
    cut off by its dying client is answered 504 whether or not kube-apiserver went on to
    delete the pod (an eviction of a terminating pod is accepted again): it took effect
    when the pod was deleted (``deleted``, see :func:`deletion_time`) before any call
    answered 2xx was received. So a 504 that evicted, then a 2xx, count two."""
    calls: dict[str, list[tuple[int, dt.datetime]]] = {}
    for event in audit_events(audit_log):
        ref = event.get("objectRef") or {}
        if (ref.get("subresource"), ref.get("namespace"), event.get("stage")) == (
            "eviction", namespace, "ResponseComplete",
        ):  # fmt: skip
            code = int((event.get("responseStatus") or {}).get("code", 0))
            received = dt.datetime.fromisoformat(event["requestReceivedTimestamp"])
            calls.setdefault(str(ref.get("name")), []).append((code, received))
    made: Counter[str] = Counter()
    for name, answered in calls.items():
        accepted = sorted(t for code, t in answered if 200 <= code < 300)
        made[name] = len(accepted)
        cut_off = any(code == 504 for code, _ in answered)
        # deletionTimestamp has whole seconds: compare whole seconds.
        first = accepted[0].replace(microsecond=0) if accepted else None
        if cut_off and name in deleted and (first is None or deleted[name] < first):
            made[name] += 1
    return +made


class DeletionWatch:
    """Watches a namespace's pods in a thread and keeps when each was deleted
    (:func:`deletion_time`), through API server restarts (it lists again)."""

    def __init__(self, client: KubeClient, namespace: str) -> None:
        self.client, self.namespace = client, namespace
        self.at: dict[str, dt.datetime] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> DeletionWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _note(self, pod: Mapping[str, Any]) -> None:
        name = str((pod.get("metadata") or {}).get("name"))
        when = deletion_time(pod)
        if when is not None and name not in self.at:
            self.at[name] = when

    def _watch(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        while not self._stop.is_set():
            try:
                listed = self.client.get(path)
                for pod in listed["items"]:
                    self._note(pod)
                version = listed["metadata"]["resourceVersion"]
                for event in self.client.watch(path, version, timeout_seconds=30, stop=self._stop):
                    if self._stop.is_set():
                        return
                    self._note(event.get("object") or {})
            except Exception:  # the API server restarts under some faults: list again
                self._stop.wait(0.2)
