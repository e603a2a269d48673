"""Runs every scenario on both sides and reports victims, timings and API requests.

For each side (sequentially: ``ours`` on a control plane with the alpha gate off and the
webhook registered, then ``upstream`` with the gate on and no webhook), and for each
scenario:

1. fresh node(s) for the scenario, PriorityClasses, PodDisruptionBudgets (waited until the
   disruption controller has counted them), pods (one second apart where their start
   times order them; each waited Running), then the ``pending`` resizes, each waited
   ``PodResizePending``/``Deferred``;
2. a watch on the scenario's namespace and an audit-log cursor start; then the real
   ``kubectl patch pod X --subresource resize`` for every measured resize (concurrently
   when there are several), each timed from the moment its kubectl process returns;
3. wait until every resize is actuated (60 s at most) - or, for scenarios where nothing
   should be actuated, watch for 12 s - then 2 s more for late victims;
4. victims = pods of the namespace that got a ``deletionTimestamp`` or vanished; lost =
   victims whose work runs nowhere now: a bare pod, or a ReplicaSet's whose replacement
   is not bound to a node within ``REPLACEMENT_WAIT`` seconds;
   ``first_eviction_ms`` = first such moment - kubectl's return (per resize on its own
   node; the median over resizes when there are several); ``actuated_ms`` likewise for the
   kubelet reporting the new size; ``api_requests`` = requests of the
   preempting component (by user agent) that the API server received in the window.

Before the measured scenarios each side runs the walkthrough once unrecorded (warm-up:
first-use costs of both components).
"""

from __future__ import annotations

import functools
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3

from harness import quantity
from harness.compare import scenarios as sc
from harness.compare.measure import AuditCursor, Observations, PodWatcher, count_requests
from harness.compare.sides import GRACE_CAP, SIDES, Side, make_side
from harness.kubeapi import ApiError
from harness.nodes import NodeSpec
from harness.processes import install_signal_handlers
from webhook.core.model import NODE_OPT_OUT_ANNOTATION

ACTUATION_TIMEOUT = 60.0
OBSERVE_WINDOW = 12.0
SETTLE = 2.0
#: Seconds a ReplicaSet's victim's replacement has to be bound before the work counts as lost.
REPLACEMENT_WAIT = 20.0
OPT_OUT_OWNER = "bench.resize-preemption.io/compare"

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Measured:
    victims: list[str]
    first_eviction_ms: float | None
    actuated_ms: float | None
    api_requests: int
    breakdown: dict[str, int]
    kubectl_errors: list[str]
    #: Victims whose work runs nowhere after the scenario (``namespace/name``).
    lost: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "victims": self.victims,
            "lost": self.lost,
            "first_eviction_ms": self.first_eviction_ms,
            "actuated_ms": self.actuated_ms,
            "api_requests": self.api_requests,
        }


def _resize_patch(cpu: str) -> str:
    return json.dumps(
        {"spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": cpu}}}]}}
    )


class ScenarioRun:
    """One scenario on one side."""

    def __init__(
        self,
        side: Side,
        scenario: sc.Scenario,
        tag: str,
        log: Log = _stderr,
        victim_grace: int | None = None,
    ) -> None:
        self.side = side
        self.victim_grace = victim_grace
        self.scenario = scenario
        self.namespace = f"{scenario.name}-{tag}"[:63].rstrip("-")
        self.nodes = [f"{self.namespace[:50]}-n{i}" for i in range(scenario.nodes)]
        self.log = log

    # --- setup ----------------------------------------------------------------------------

    def setup(self) -> None:
        api = self.side.client
        s = self.scenario
        api.create("/api/v1/namespaces", {"metadata": {"name": self.namespace}})
        assert self.side.nodes is not None
        annotations = {NODE_OPT_OUT_ANNOTATION: "compare"} if s.opt_out else {}
        for name in self.nodes:
            self.side.nodes.add_node(NodeSpec(name, cpu=s.node_cpu, annotations=annotations))
            if s.opt_out:
                # The 1.37 field (kept only when the API server has the alpha gate on).
                api.patch(
                    f"/api/v1/nodes/{name}",
                    {"spec": {"podPreemptionPolicy": {"disableResizePreemption": [OPT_OUT_OWNER]}}},
                )
        for budget in s.budgets:
            api.create(
                f"/apis/policy/v1/namespaces/{self.namespace}/poddisruptionbudgets",
                {
                    "metadata": {"name": budget.name},
                    "spec": {
                        "minAvailable": budget.min_available,
                        "selector": {"matchLabels": {"app": budget.app}},
                    },
                },
            )
        pods = [self._pod_object(p) for p in s.pods]
        if s.distinct_start_times:
            for pod in pods:
                self._create(pod)
                self._wait_running([pod["metadata"]["name"]])
                time.sleep(1.05)  # startTime has second precision
        else:
            for pod in pods:
                self._create(pod)
            self._wait_running([p["metadata"]["name"] for p in pods], timeout=600)
        for budget in s.budgets:
            self._wait_budget(budget)
        for p in s.pods:
            if p.replicaset:
                self._adopt(p)
        for resize in s.pending:
            self._kubectl_patch(resize)
            self._wait(
                functools.partial(self._deferred, resize.pod),
                60,
                f"{resize.pod}'s resize to be Deferred",
            )
        time.sleep(1.0)  # let every watcher (webhook cache, scheduler) catch up

    def _pod_object(self, p: sc.PodSpec) -> dict[str, Any]:
        grace = (
            {}
            if self.victim_grace is None
            else {"terminationGracePeriodSeconds": self.victim_grace}
        )
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": p.name,
                "namespace": self.namespace,
                "labels": _labels(p),
                "annotations": dict(p.annotations),
            },
            "spec": {
                "nodeName": self.nodes[p.node],
                "priorityClassName": self.side.ensure_priority_class(p.priority, p.never),
                **grace,
                "containers": [
                    {
                        "name": "app",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": p.cpu, "memory": p.memory}},
                    }
                ],
            },
        }

    def _adopt(self, p: sc.PodSpec) -> None:
        """A ReplicaSet of one replica named after ``p``, selecting it: it adopts the
        running pod, and its template (the pod unbound) makes the replacement."""
        template = self._pod_object(p)
        del template["spec"]["nodeName"]
        self.side.client.create(
            f"/apis/apps/v1/namespaces/{self.namespace}/replicasets",
            {
                "metadata": {"name": p.name},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": {REPLICASET_LABEL: p.name}},
                    "template": {"metadata": {"labels": _labels(p)}, "spec": template["spec"]},
                },
            },
        )
        path = f"/api/v1/namespaces/{self.namespace}/pods/{p.name}"

        def adopted() -> bool:
            return _controller(self.side.client.get(path)) == ("ReplicaSet", p.name)

        self._wait(adopted, 60, f"{p.name} adopted by its ReplicaSet")

    def _lost(self, victims: set[str]) -> list[str]:
        """The victims whose work runs nowhere now: bare ones, and a ReplicaSet's without
        a replacement bound to a node (waited for up to ``REPLACEMENT_WAIT`` seconds)."""
        owned = {p.name for p in self.scenario.pods if p.replicaset}
        deadline = time.monotonic() + REPLACEMENT_WAIT
        while True:
            replaced = {
                owner
                for pod in self._pods()
                if pod["spec"].get("nodeName") and not pod["metadata"].get("deletionTimestamp")
                for kind, owner in [_controller(pod)]
                if kind == "ReplicaSet" and owner in victims and pod["metadata"]["name"] != owner
            }
            lost = sorted(v for v in victims if v not in replaced)
            if not set(lost) & owned or time.monotonic() > deadline:
                return [f"{self.namespace}/{name}" for name in lost]
            time.sleep(0.2)

    def _create(self, pod: dict[str, Any]) -> None:
        self.side.client.create(f"/api/v1/namespaces/{self.namespace}/pods", pod)

    def _pods(self) -> list[dict[str, Any]]:
        return list(self.side.client.get(f"/api/v1/namespaces/{self.namespace}/pods")["items"])

    def _wait(self, condition: Callable[[], Any], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.side.name}/{self.scenario.name}: waited for {what}")
            time.sleep(0.1)

    def _wait_running(self, names: Sequence[str], timeout: float = 60) -> None:
        wanted = set(names)

        def running() -> bool:
            phases = {p["metadata"]["name"]: p.get("status", {}).get("phase") for p in self._pods()}
            return all(phases.get(n) == "Running" for n in wanted)

        self._wait(running, timeout, f"{len(wanted)} pod(s) Running")

    def _wait_budget(self, budget: sc.Budget) -> None:
        covered = sum(1 for p in self.scenario.pods if p.labels.get("app") == budget.app)
        path = f"/apis/policy/v1/namespaces/{self.namespace}/poddisruptionbudgets/{budget.name}"

        def counted() -> bool:
            status = self.side.client.get(path).get("status", {})
            return bool(status.get("observedGeneration") and status.get("expectedPods") == covered)

        self._wait(counted, 60, f"PDB {budget.name} counted by the disruption controller")

    def _deferred(self, name: str) -> bool:
        pod = self.side.client.get(f"/api/v1/namespaces/{self.namespace}/pods/{name}")
        return any(
            c.get("type") == "PodResizePending" and c.get("reason") == "Deferred"
            for c in pod.get("status", {}).get("conditions") or []
        )

    def _kubectl_patch(self, resize: sc.Resize) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                str(self.side.binaries.kubectl),
                f"--kubeconfig={self.side.kubeconfig}",
                f"--namespace={self.namespace}",
                "patch",
                "pod",
                resize.pod,
                "--subresource",
                "resize",
                "--patch",
                _resize_patch(resize.cpu),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    # --- measurement ----------------------------------------------------------------------

    def measure(self) -> Measured:
        s = self.scenario
        targets = {r.pod: quantity.milli_value(r.cpu) for r in s.resizes}
        watcher = PodWatcher(self.side.client, self.namespace, targets).start()
        cursor = AuditCursor.at_end(self.side.audit_log)
        wall_start = time.time()
        returned: dict[str, float] = {}
        errors: list[str] = []

        def patch(resize: sc.Resize) -> None:
            result = self._kubectl_patch(resize)
            returned[resize.pod] = time.monotonic()
            if result.returncode != 0:
                errors.append(f"{resize.pod}: {result.stderr.strip()}")

        threads = [threading.Thread(target=patch, args=(r,)) for r in s.resizes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + (ACTUATION_TIMEOUT if s.actuates else OBSERVE_WINDOW)
        while time.monotonic() < deadline:
            if len(watcher.snapshot().actuated) == len(targets):
                break
            time.sleep(0.05)
        time.sleep(SETTLE)
        seen = watcher.stop()
        wall_end = time.time()
        lost = self._lost(set(seen.deleted))
        requests, breakdown = count_requests(
            cursor, self.side.user_agent_prefix, wall_start, wall_end
        )
        return Measured(
            victims=sorted(f"{self.namespace}/{name}" for name in seen.deleted),
            first_eviction_ms=self._per_resize(seen, returned, first_deletion=True),
            actuated_ms=self._per_resize(seen, returned, first_deletion=False),
            api_requests=requests,
            breakdown=breakdown,
            kubectl_errors=errors,
            lost=lost,
        )

    def _per_resize(
        self, seen: Observations, returned: dict[str, float], *, first_deletion: bool
    ) -> float | None:
        """Per resize: ms from kubectl's return to the first deletion on the resizing pod's
        node (or to its actuation); the median when there are several; None if never."""
        node_of = {p.name: p.node for p in self.scenario.pods}
        values: list[float] = []
        for resize in self.scenario.resizes:
            if resize.pod not in returned:
                continue
            if first_deletion:
                node = node_of[resize.pod]
                times = [t for n, t in seen.deleted.items() if node_of.get(n) == node]
                moment = min(times) if times else None
            else:
                moment = seen.actuated.get(resize.pod)
            if moment is not None:
                values.append((moment - returned[resize.pod]) * 1000.0)
        return round(statistics.median(values), 1) if values else None

    def cleanup(self) -> None:
        try:
            if any(p.replicaset for p in self.scenario.pods):
                # First, or the ReplicaSets would recreate the pods deleted below.
                self.side.client.request(
                    "DELETE", f"/apis/apps/v1/namespaces/{self.namespace}/replicasets"
                )
            self.side.client.request(
                "DELETE",
                f"/api/v1/namespaces/{self.namespace}/pods",
                body={"gracePeriodSeconds": 0},
                timeout=300,  # a collection of 1500 pods takes a while on two cores
            )
        except (ApiError, OSError, urllib3.exceptions.HTTPError) as e:
            self.log(f"  cleanup of {self.namespace} failed: {e}")
        if self.side.nodes is not None:
            # One kubelet process per node: a side's scenarios would pile them up.
            for name in self.nodes:
                if name in self.side.nodes.names:
                    self.side.nodes.remove_node(name)

    def run(self) -> Measured:
        self.setup()
        try:
            return self.measure()
        finally:
            self.cleanup()


#: The label a ReplicaSet of the comparison selects its pod by.
REPLICASET_LABEL = "bench.resize-preemption.io/replicaset"


def _labels(p: sc.PodSpec) -> dict[str, str]:
    return {**p.labels, REPLICASET_LABEL: p.name} if p.replicaset else dict(p.labels)


def _controller(pod: dict[str, Any]) -> tuple[str, str]:
    """The kind and name of ``pod``'s controller; empty strings when it has none."""
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller"):
            return str(ref.get("kind", "")), str(ref.get("name", ""))
    return "", ""


def _victim_names(measured: Measured, namespace_prefix: str = "") -> list[str]:
    return [v.split("/", 1)[1] for v in measured.victims]


def combine(runs: list[Measured]) -> Measured:
    """Victims of the first run (later ones are checked to agree); medians of the rest."""

    def median(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return round(statistics.median(present), 1) if present else None

    first = runs[0]
    return Measured(
        victims=first.victims,
        first_eviction_ms=median([r.first_eviction_ms for r in runs]),
        actuated_ms=median([r.actuated_ms for r in runs]),
        api_requests=int(statistics.median([r.api_requests for r in runs])),
        breakdown=first.breakdown,
        kubectl_errors=[e for r in runs for e in r.kubectl_errors],
        lost=first.lost,
    )


def run_side(
    side: Side,
    scenarios: Sequence[sc.Scenario],
    repeat: int,
    log: Log = _stderr,
    victim_grace: int | None = None,
) -> dict[str, Measured]:
    """Every scenario on a started side (after one unrecorded walkthrough)."""
    log(f"[{side.name}] warm-up")
    ScenarioRun(side, sc.walkthrough(), "warmup", log, victim_grace).run()
    results: dict[str, Measured] = {}
    for scenario in scenarios:
        runs: list[Measured] = []
        for i in range(repeat):
            began = time.monotonic()
            measured = ScenarioRun(side, scenario, f"r{i}", log, victim_grace).run()
            runs.append(measured)
            log(
                f"[{side.name}] {scenario.name} #{i}: victims={_victim_names(measured)} "
                f"lost={len(measured.lost)} "
                f"first_eviction={measured.first_eviction_ms} ms "
                f"actuated={measured.actuated_ms} ms api={measured.api_requests} "
                f"({time.monotonic() - began:.0f} s)"
                + (f" kubectl errors: {measured.kubectl_errors}" if measured.kubectl_errors else "")
            )
            differing = {tuple(_victim_names(r)) for r in runs}
            if len(differing) > 1:
                log(f"[{side.name}] {scenario.name}: victims differ between runs: {differing}")
        results[scenario.name] = combine(runs)
    return results


def compare(
    scenarios: Sequence[sc.Scenario],
    *,
    repeat: int = 1,
    sides: Sequence[str] = SIDES,
    state_root: Path | None = None,
    log: Log = _stderr,
    victim_grace: int | None = None,
) -> dict[str, dict[str, Measured]]:
    """side -> scenario -> result, each side on its own control plane, one after the other.

    ``victim_grace``: every pod's ``terminationGracePeriodSeconds``, honoured in full by the
    kubelets; None leaves the default (30 s) and caps each stop at ``GRACE_CAP``."""
    install_signal_handlers()
    out: dict[str, dict[str, Measured]] = {}
    for name in sides:
        state_dir = state_root / name if state_root is not None else None
        if state_dir is not None:
            state_dir.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        log(f"[{name}] starting control plane")
        cap = GRACE_CAP if victim_grace is None else None
        with make_side(name, state_dir, grace_cap=cap) as side:
            out[name] = run_side(side, scenarios, repeat, log, victim_grace)
        log(f"[{name}] done in {time.monotonic() - began:.0f} s")
    return out
