"""What the service is doing now, from one read of the cluster: ``python -m webhook status``.

Pure: the caller reads the cluster (``webhook.kube.status``) and passes the time. For
each node, the reservations its ledger holds (entries still holding room: not expired, not
spent) and the loans they made or will make, and the loans its lenders record that no
entry holds any more (orphans, given back by the worker when room allows); the pods whose
resize the kubelet Deferred and why each waits, as the reconciler would judge it now
(:meth:`Reconciler.consider` over :mod:`webhook.engine.memory`'s ledger, which keeps its
writes to itself: the same plans, nothing written); the leader.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.checkpoint import (
    RESTORED_FROM_ANNOTATION,
    CheckpointRecord,
    Phase,
    only_its_node,
)
from webhook.core.lending import Loan, loan_state
from webhook.core.model import Pod, PodRef
from webhook.core.objects import parse_pod
from webhook.core.plan import Plan
from webhook.core.resources import format_amount
from webhook.core.snapshot import Snapshot
from webhook.engine.ledger import LedgerEntry
from webhook.engine.lifecycle.give_back import orphans
from webhook.engine.lifecycle.states import room_holders
from webhook.engine.memory import FixedClusterView, MemoryLedger
from webhook.engine.reconciler import Reconciler

#: What each reason the reconciler gives means to a person (a plan's own reason is used
#: when there is a plan).
REASON_TEXT: Final[Mapping[str, str]] = {
    "not-bound": "not bound to a node",
    "leaving": "the pod is terminating",
    "preemption-disabled": "preemption is disabled for this pod (PodResizePreemptionDisabled)",
    "giving-back": "a loan given back: never preempted for; the kubelet actuates it when "
    "room appears",
    "node-unknown": "its node is not in the cluster",
    "error": "could not be planned (the service log says why)",
}


@dataclass(frozen=True, slots=True)
class Leader:
    """The leader-election Lease: who holds it and when it was renewed (epoch seconds,
    ``None`` when never)."""

    holder: str
    renewed_at: float | None
    lease_seconds: int
    transitions: int

    def expired(self, now: float) -> bool:
        if not self.holder or self.renewed_at is None:
            return True
        return now > self.renewed_at + self.lease_seconds


@dataclass(frozen=True, slots=True)
class LoanStatus:
    loan: Loan
    borrower: PodRef
    #: lent, pending or void (:func:`webhook.core.lending.loan_state`); a loan returning
    #: is shown pending, as its lender's spec reads.
    state: str
    #: Recorded on its lender, held by no ledger entry (its entry was lost).
    orphan: bool = False


def _shown(state: str) -> str:
    """A loan's state as ``status`` prints it: one not made (again) yet is pending."""
    return "pending" if state in ("to-lend", "returning") else state


@dataclass(frozen=True, slots=True)
class NodeStatus:
    name: str
    reservations: tuple[LedgerEntry, ...]
    loans: tuple[LoanStatus, ...]


@dataclass(frozen=True, slots=True)
class Waiting:
    """A pod whose resize the kubelet Deferred. ``reason``: one of
    :data:`webhook.engine.reconciler.DEFERRED_REASONS`; ``detail``: the plan's reason or
    what the reason means; ``victims``: who would go or is going for it."""

    pod: Pod
    waited: float | None
    reason: str
    detail: str
    victims: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Paused:
    """A checkpointed victim still to come back, and where it may: ``node`` (its own,
    or the one its restored pod is bound to while ``restoring``), or, when
    ``elsewhere``, any other node able to restore it; ``why`` says why not elsewhere."""

    record: CheckpointRecord
    node: str
    elsewhere: bool
    why: str

    @property
    def where(self) -> str:
        if self.record.phase is Phase.RESTORING:
            return f"{self.node} (restoring)"
        return f"{self.node} or any able node" if self.elsewhere else self.node


def paused(record: CheckpointRecord, now_pod: Pod | None) -> Paused:
    """Where ``record``'s pod may come back, as the restorer would judge it
    (:func:`~webhook.core.checkpoint.comes_back_on`); ``now_pod``: the pod of its name."""
    ours = now_pod is not None and now_pod.annotations.get(RESTORED_FROM_ANNOTATION) == record.name
    if ours and now_pod is not None and now_pod.node:
        return Paused(record, now_pod.node, False, "its restored pod is bound there")
    try:
        why = only_its_node(record, parse_pod(dict(record.pod)))
    except ValueError:
        why = "its stored pod does not parse"
    if not record.images:
        why = "its images are not made yet"
    return Paused(record, record.node, not why, why)


@dataclass(frozen=True, slots=True)
class ServiceStatus:
    now: float
    leader: Leader | None
    nodes: tuple[NodeStatus, ...]
    deferred: tuple[Waiting, ...]
    #: Checkpointed victims still to come back (phases archived, imaged, restoring).
    checkpoints: tuple[Paused, ...] = ()


def service_status(
    snapshot: Snapshot,
    entries: Iterable[LedgerEntry],
    leader: Leader | None,
    config: Config,
    *,
    now: float,
    node: str | None = None,
    checkpoints: Iterable[CheckpointRecord] = (),
) -> ServiceStatus:
    """The :class:`ServiceStatus` of ``snapshot`` and the ledger's ``entries`` at ``now``; with
    ``node``, that node's only. Nodes appear when their ledger holds something."""
    view = FixedClusterView.from_snapshot(snapshot)
    ledger = MemoryLedger(entries)
    nodes = []
    names = {e.node for e in ledger.all_entries()} | {p.node for p in view.lenders() if p.node}
    for name in sorted(names):
        if node is not None and name != node:
            continue
        pods = view.pods_on(name)
        by_uid = {p.uid: p for p in pods}
        held = ledger.entries(name)
        lost = orphans(held, pods)
        loans = tuple(
            LoanStatus(
                loan,
                e.pod,
                _shown(loan_state(loan, by_uid.get(loan.pod.uid))),
                orphan=e in lost,
            )
            for e in (*held, *lost)
            for loan in e.loans
        )
        live = room_holders(held, pods, now)
        if live or any(s.state == "lent" for s in loans):
            nodes.append(NodeStatus(name, tuple(live), loans))
    reconciler = Reconciler(config, view, ledger, metrics=Metrics(), clock=lambda: now)
    deferred = []
    for pod in sorted(view.pending_resizes(), key=lambda p: (-p.priority, p.key)):
        if pod.resize != "deferred" or (node is not None and pod.node != node):
            continue
        reason, outcome = reconciler.consider(pod)
        waited = None if pod.resize_pending_since is None else now - pod.resize_pending_since
        live = room_holders(ledger.entries(pod.node), view.pods_on(pod.node), now)
        deferred.append(_waiting(pod, waited, reason, outcome.plan if outcome else None, live))
    waiting = tuple(
        paused(r, view.pod(r.namespace, r.pod_name))
        for r in checkpoints
        if r.phase.waiting and (node is None or r.node == node)
    )
    return ServiceStatus(now, leader, tuple(nodes), tuple(deferred), waiting)


def _waiting(
    pod: Pod, waited: float | None, reason: str, plan: Plan | None, live: Sequence[LedgerEntry]
) -> Waiting:
    """``live``: the entries holding room on the pod's node."""
    if plan is not None:
        detail = plan.reason
        if plan.verdict == "preempt":
            detail += "; the reconciler admits this on its next pass"
        return Waiting(pod, waited, reason, detail, plan.victim_keys)
    if reason == "preempt":
        entry = next((e for e in live if e.pod.uid == pod.uid), None)
        victims = tuple(v.key for v in entry.pending_victims) if entry else ()
        return Waiting(pod, waited, reason, "preemption under way (a ledger entry)", victims)
    return Waiting(pod, waited, reason, REASON_TEXT.get(reason, reason))


# -- rendering ---------------------------------------------------------------------------


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _loan_dict(s: LoanStatus) -> dict[str, Any]:
    r = s.loan.resource
    return {
        "lender": s.loan.pod.key,
        "container": s.loan.container,
        "resource": r,
        "from": format_amount(r, s.loan.before),
        "to": format_amount(r, s.loan.after),
        "state": s.state,
        "borrower": s.borrower.key,
        "orphan": s.orphan,
    }


def status_to_dict(status: ServiceStatus) -> dict[str, Any]:
    """The ``status -o json`` contract: quantities in Kubernetes notation, times in
    seconds."""
    leader: dict[str, Any] | None = None
    if status.leader is not None:
        lead = status.leader
        leader = {
            "holder": lead.holder,
            "renewedSecondsAgo": None
            if lead.renewed_at is None
            else round(status.now - lead.renewed_at, 3),
            "leaseDurationSeconds": lead.lease_seconds,
            "transitions": lead.transitions,
            "expired": lead.expired(status.now),
        }
    return {
        "leader": leader,
        "nodes": [
            {
                "node": n.name,
                "reservations": [
                    {
                        "pod": e.pod.key,
                        "requests": {
                            "cpu": format_amount("cpu", e.resources.cpu),
                            "memory": format_amount("memory", e.resources.memory),
                        },
                        "victimsPending": [v.key for v in e.pending_victims],
                        "victims": [v.key for v in e.victims],
                        "admittedSecondsAgo": round(status.now - e.admitted_at, 3),
                        "expiresInSeconds": round(e.deadline - status.now, 3),
                        "review": e.review_uid,
                    }
                    for e in n.reservations
                ],
                "loans": [_loan_dict(s) for s in n.loans],
            }
            for n in status.nodes
        ],
        "deferred": [
            {
                "pod": w.pod.key,
                "node": w.pod.node,
                "priority": w.pod.priority,
                "waitingSeconds": None if w.waited is None else round(w.waited, 3),
                "reason": w.reason,
                "detail": w.detail,
                "victims": list(w.victims),
            }
            for w in status.deferred
        ],
        "checkpoints": [
            {
                "pod": p.record.key,
                "node": p.record.node,
                "phase": p.record.phase.value,
                "checkpointedAt": p.record.checkpointed_at,
                "bytes": p.record.size,
                "record": p.record.name,
                "comesBackOn": {"node": p.node, "orAnyAbleNode": p.elsewhere, "why": p.why},
            }
            for p in status.checkpoints
        ],
    }


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    if not rows:
        return ["  (none)"]
    everything = [header, *rows]
    widths = [max(len(r[i]) for r in everything) for i in range(len(header))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in everything
    ]


def status_text(status: ServiceStatus) -> str:
    """A few tables a person reads at a glance."""
    lead = status.leader
    if lead is None:
        lines = ["leader: none (no leader Lease: is the webhook running?)"]
    elif lead.expired(status.now):
        lines = [f"leader: none (the Lease of {lead.holder or '-'} has run out)"]
    else:
        renewed = _ago(None if lead.renewed_at is None else status.now - lead.renewed_at)
        lines = [f"leader: {lead.holder} (renewed {renewed} ago, lease {lead.lease_seconds}s)"]
    reservations = [
        (
            n.name,
            e.pod.key,
            e.resources.describe(),
            ", ".join(v.key for v in e.pending_victims) or "-",
            _ago(status.now - e.admitted_at),
            _ago(e.deadline - status.now),
        )
        for n in status.nodes
        for e in n.reservations
    ]
    lines += ["", "reservations:"]
    lines += _table(
        ("NODE", "POD", "REQUESTS", "VICTIMS PENDING", "AGE", "EXPIRES IN"), reservations
    )
    loans = [
        (
            n.name,
            d["lender"],
            d["container"],
            d["resource"],
            d["from"],
            d["to"],
            d["state"],
            d["borrower"] + (" (entry lost)" if d["orphan"] else ""),
        )
        for n in status.nodes
        for d in (_loan_dict(s) for s in n.loans)
    ]
    lines += ["", "loans:"]
    lines += _table(
        ("NODE", "LENDER", "CONTAINER", "RESOURCE", "FROM", "TO", "STATE", "BORROWER"), loans
    )
    deferred = [
        (w.pod.key, w.pod.node or "-", _ago(w.waited), w.reason, w.detail) for w in status.deferred
    ]
    lines += ["", "deferred resizes:"]
    lines += _table(("POD", "NODE", "WAITING", "REASON", "WHY"), deferred)
    waiting = [
        (r.key, r.node, r.phase.value, r.checkpointed_at or "-", p.where, r.name)
        for p in status.checkpoints
        for r in (p.record,)
    ]
    lines += ["", "checkpoints waiting for room:"]
    lines += _table(("POD", "NODE", "PHASE", "CHECKPOINTED", "COMES BACK ON", "RECORD"), waiting)
    return "\n".join(lines)


__all__ = [
    "Leader",
    "Paused",
    "ServiceStatus",
    "Waiting",
    "service_status",
    "status_text",
    "status_to_dict",
]
