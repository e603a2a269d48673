"""Both preemptors on one cluster (issue 15, item 6): kube-scheduler v1.37.2 with
``InPlacePodVerticalScalingSchedulerPreemption`` on every component, and this webhook
registered in ``enforce`` beside it, on hollow kubelets that honour each victim's whole
grace period (30 s, the default of a pod; no cap).

kube-scheduler preempts for a resize once the kubelet reports it ``Deferred``
(``schedule_one.go``: ``isDeferredResize``; the ``DeferredPodScheduling`` plugin keeps the
pod on its node). The webhook evicts at admission, before the kubelet has tried; while its
victims take their grace period to stop, the kubelet still defers the resize and the
scheduler plans again. A preemption is double when a scenario loses more pods than
either preemptor would take alone (``expected`` of :mod:`harness.compare.scenarios`, which
``make compare`` measures side by side).

What was measured: none. The scheduler chooses the victims the webhook already evicted
(it does not leave terminating pods out of its candidates) and deletes them again, a
DELETE on a pod already terminating; where the two models differ (pending-neighbour,
the scheduler counting a Deferred neighbour at its desired size) the webhook's victims
are a subset of the scheduler's. So the webhook does not stand back; what running both
costs is in docs/reliability.md (a PodDisruptionBudget the webhook respects, the
scheduler's DELETE does not).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from harness.compare import scenarios as sc
from harness.compare.measure import AuditCursor
from harness.compare.runner import ScenarioRun
from harness.compare.sides import Side, make_side
from harness.webhook_process import start_webhook
from tests.e2e.conftest import SCHEDULER_GATE, UPSTREAM_WHY
from webhook.kube.client import USER_AGENT

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.needs_kube(37, UPSTREAM_WHY),
    pytest.mark.needs_gate(SCHEDULER_GATE, UPSTREAM_WHY),
]

#: Every pod's terminationGracePeriodSeconds, honoured in full by the kubelets.
VICTIM_GRACE = 30
SCHEDULER_AGENT = "kube-scheduler/"


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Side]:
    """The upstream side (the gate on everywhere) with the webhook started beside it."""
    side = make_side("upstream", tmp_path_factory.mktemp("both"), grace_cap=None)
    side.start()
    try:
        side.webhook = start_webhook(side.client, side.kubeconfig, side.state_dir)
        side._wait_leader()
        yield side
    finally:
        side.stop()


def preempted_by(audit_log: Path, cursor: AuditCursor, start: float) -> dict[str, set[str]]:
    """Pods each preemptor removed since ``start`` (wall clock): evictions and deletions in
    the audit log, by user agent."""
    out: dict[str, set[str]] = {"webhook": set(), "kube-scheduler": set()}
    for event in cursor.events():
        agent = str(event.get("userAgent", ""))
        who = (
            "webhook"
            if agent.startswith(USER_AGENT)
            else "kube-scheduler"
            if agent.startswith(SCHEDULER_AGENT)
            else None
        )
        ref = event.get("objectRef") or {}
        if who is None or ref.get("resource") != "pods" or event.get("stage") != "ResponseComplete":
            continue
        removal = (event.get("verb") == "create" and ref.get("subresource") == "eviction") or (
            event.get("verb") == "delete" and not ref.get("subresource")
        )
        if removal and int((event.get("responseStatus") or {}).get("code", 0)) < 300:
            out[who].add(str(ref.get("name")))
    return out


def run_both(side: Side, scenario: sc.Scenario, tag: str) -> dict[str, Any]:
    run = ScenarioRun(side, scenario, tag, victim_grace=VICTIM_GRACE)
    run.setup()
    try:
        cursor = AuditCursor.at_end(side.audit_log)
        start = time.time()
        measured = run.measure()
        # A victim that takes its whole grace period is still there when the resize is
        # actuated; the scheduler may act until then, not after.
        by = preempted_by(side.audit_log, cursor, start)
    finally:
        run.cleanup()
    victims = {v.split("/", 1)[1] for v in measured.victims}
    assert scenario.expected is not None
    alone = max(len(scenario.expected["ours"]), len(scenario.expected["upstream"]))
    result = {
        "scenario": scenario.name,
        "victims": sorted(victims),
        "by": {k: sorted(v) for k, v in by.items()},
        "alone": alone,
        "double": max(0, len(victims) - alone),
        "actuated_ms": measured.actuated_ms,
        "kubectl_errors": measured.kubectl_errors,
    }
    print(orjson.dumps(result).decode())
    return result


@pytest.mark.parametrize(
    "scenario",
    [sc.walkthrough(), sc.mixed_priorities(), sc.pending_neighbour()],
    ids=["walkthrough", "multi-victim", "pending-neighbour"],
)
def test_no_double_preemption_with_both_preemptors_on(both: Side, scenario: sc.Scenario) -> None:
    result = run_both(both, scenario, "both")
    assert [] == result["kubectl_errors"]
    assert result["actuated_ms"] is not None, result
    assert 0 == result["double"], result
    # The webhook's victims are the scheduler's, or fewer: the union is the scheduler's.
    assert sorted(scenario.expected["upstream"]) == result["victims"], result
