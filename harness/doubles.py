"""Test doubles of the engine's ports: the in-memory ones of :mod:`webhook.engine.memory`
with the knobs a test turns (a view that is not synced or has gone stale, a count of the
ledger's writes), an evictor and a lenders' resizer that act on the world a cluster view
shows, and a recorder of abandoned plans; and of the node agent's ports: its checkpoint
store and its container runtime.

For unit tests and benchmarks. Nothing in the product imports this module. Each double
passes its port's contract suite (``tests/e2e/test_*_contract.py``) beside the real
implementation against the real API server.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from webhook.agent.oci import IMAGE_NAME_ANNOTATION, REF_NAME_ANNOTATION
from webhook.agent.runtime import RuntimeFacts, RuntimeFailure, restore_enabled, version_tuple
from webhook.core.checkpoint import CheckpointRecord, NodeCheckpointing
from webhook.core.lending import Loan, LoanRecord, lender_step, loan_key, records, records_text
from webhook.core.model import (
    LOANS_ANNOTATION,
    Container,
    DisruptionBudget,
    Namespace,
    Node,
    Pod,
    PodRef,
    PriorityClass,
)
from webhook.core.snapshot import Snapshot, load_snapshot
from webhook.engine.ledger import ClusterView, EvictionResult, LedgerChange, LedgerEntry, R
from webhook.engine.loans import LoanResult
from webhook.engine.memory import FixedClusterView, MemoryLedger
from webhook.engine.pauses import Checkpointed


class StaticClusterView(FixedClusterView):
    """A :class:`FixedClusterView` whose ``synced``, ``age`` and ``staleness`` a test sets
    (``synced=False`` to see readiness fail, ``stale_for`` to make it stale and fresh
    again)."""

    def __init__(
        self,
        nodes: Iterable[Node] = (),
        pods: Iterable[Pod] = (),
        budgets: Iterable[DisruptionBudget] = (),
        priority_classes: Iterable[PriorityClass] = (),
        *,
        namespaces: Iterable[Namespace] | None = None,
        synced: bool = True,
        age: float = 0.0,
        staleness: float = 0.0,
    ) -> None:
        super().__init__(nodes, pods, budgets, priority_classes, namespaces)
        self._synced = synced
        self._age = age
        self.stale_for = staleness

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, *, synced: bool = True) -> StaticClusterView:
        return cls(
            snapshot.nodes.values(),
            snapshot.pods,
            snapshot.budgets,
            snapshot.priority_classes,
            namespaces=snapshot.namespaces,
            synced=synced,
        )

    @classmethod
    def from_objects(
        cls, documents: Iterable[Mapping[str, Any] | None], *, synced: bool = True
    ) -> StaticClusterView:
        return cls.from_snapshot(load_snapshot(documents), synced=synced)

    def synced(self) -> bool:
        return self._synced

    def age(self) -> float:
        return self._age

    def staleness(self) -> float:
        return self.stale_for


class InMemoryLedger(MemoryLedger):
    """A :class:`MemoryLedger` that counts its writes (``writes``): a change that
    returned entries and was stored (one the store refused, :class:`LedgerFull`, counts
    for nothing, as it changes no Lease)."""

    def __init__(self, entries: Iterable[LedgerEntry] = ()) -> None:
        super().__init__(entries)
        self.writes = 0
        self._count_lock = threading.Lock()

    def update(self, node: str, change: LedgerChange[R]) -> R:
        wrote = False

        def counted(entries: tuple[LedgerEntry, ...]) -> tuple[tuple[LedgerEntry, ...] | None, R]:
            nonlocal wrote
            new, result = change(entries)
            wrote = new is not None
            return new, result

        result = super().update(node, counted)
        if wrote:
            with self._count_lock:
                self.writes += 1
        return result


class FakeEvictor:
    """A :class:`~webhook.engine.ledger.VictimEvictor` over ``view``, the world it
    answers of as the Eviction API answers of the stored pod: ``gone`` for a victim the
    view does not hold under its uid, ``skipped-terminating`` for one leaving (or evicted
    by this double) when the caller has not just seen it live, ``blocked-by-pdb`` for a
    running victim a budget of its namespace selects with no disruption allowed,
    ``evicted`` otherwise (it is leaving from then on). Never raises of itself.

    Records every call (``calls``, ``seen_live``); ``results`` (victim name -> result)
    answers in its place, for what the view cannot show (a throttled API server, a
    budget a test does not build); ``on_evict`` runs before answering (to change the
    world mid-pass, or raise to crash it). ``view`` may be bound after construction
    (``make_worker`` does); without one there is no world to reach (``failed``)."""

    def __init__(self, view: ClusterView | None = None) -> None:
        self.view = view
        self.calls: list[tuple[str, str, str]] = []
        self.seen_live: list[bool] = []
        #: Each call's ``grace_seconds`` (what a checkpoint left of the grace period).
        self.graces: list[int | None] = []
        self.results: dict[str, EvictionResult] = {}
        self.on_evict: Callable[[PodRef], None] | None = None
        self.called = threading.Event()
        #: Uids this double evicted: leaving from then on, whatever the view still shows.
        self.evicted: set[str] = set()
        self._lock = threading.Lock()

    def evict(
        self,
        victim: PodRef,
        preemptor: PodRef,
        node: str,
        *,
        seen_live: bool = False,
        grace_seconds: int | None = None,
    ) -> EvictionResult:
        with self._lock:
            self.calls.append((victim.name, preemptor.name, node))
            self.seen_live.append(seen_live)
            self.graces.append(grace_seconds)
        self.called.set()
        if self.on_evict is not None:
            self.on_evict(victim)
        scripted = self.results.get(victim.name)
        if scripted is not None:
            return scripted
        return self._judge(victim, seen_live=seen_live)

    def _judge(self, victim: PodRef, *, seen_live: bool) -> EvictionResult:
        if self.view is None:
            return EvictionResult.FAILED  # no world to reach
        pod = self.view.pod(victim.namespace, victim.name)
        if pod is None or (victim.uid and pod.uid != victim.uid):
            return EvictionResult.GONE
        with self._lock:
            leaving = pod.terminating or pod.uid in self.evicted
            if leaving and not seen_live:
                return EvictionResult.SKIPPED_TERMINATING
            if not leaving and pod.phase == "Running" and self._budget_forbids(pod):
                return EvictionResult.BLOCKED_BY_PDB
            self.evicted.add(pod.uid)
        return EvictionResult.EVICTED

    def _budget_forbids(self, pod: Pod) -> bool:
        assert self.view is not None
        return any(
            b.selector is not None and b.selector.matches(pod.labels) and b.disruptions_allowed <= 0
            for b in self.view.budgets((pod.namespace,))
        )


class _Unreachable(Exception):
    """A write of a :class:`FakeResizer` whose API server cannot be reached."""


class FakeResizer:
    """A :class:`~webhook.engine.loans.LenderResizer` over ``view``: judges each lender
    as the view holds it (or as this double last wrote it, while the view still holds
    the copy it wrote over) with the core's :func:`~webhook.core.lending.lender_step`, as
    the real resizer judges the cache's copy, and writes the loan's record and the
    lender's spec into its own copy. Never raises.

    Logs every call in order in ``log`` (shared with a :class:`LoggingEvictor`, to see
    loans and evictions interleave), loans made in ``calls``; ``results`` (lender name ->
    result) answers ``lend`` and ``give_back`` in its place. ``view`` may be bound after
    construction (``make_worker`` does); without one there is no lender to act on
    (``void``). ``reachable=False``: every write fails (``failed``), as the real
    resizer's when its API server cannot be reached."""

    def __init__(
        self,
        view: ClusterView | None = None,
        log: list[str] | None = None,
        *,
        reachable: bool = True,
    ) -> None:
        self.view = view
        self.reachable = reachable
        self.log: list[str] = [] if log is None else log
        self.calls: list[tuple[str, str, str]] = []
        self.results: dict[str, LoanResult] = {}
        #: "namespace/name" -> (the view's copy written over, the copy written).
        self.written: dict[str, tuple[Pod, Pod]] = {}
        self._lock = threading.Lock()

    def lend(self, loan: Loan, borrower: PodRef, node: str) -> LoanResult:
        self.calls.append((loan.pod.name, borrower.name, node))
        self.log.append(f"lend {loan.pod.name}")
        scripted = self.results.get(loan.pod.name)
        if scripted is not None:
            return scripted
        try:
            return self._lend(loan, borrower)
        except _Unreachable:
            return LoanResult.FAILED

    def _lend(self, loan: Loan, borrower: PodRef) -> LoanResult:
        with self._lock:
            base, pod = self._read(loan.pod)
            step = lender_step(loan, pod, back=False)
            if base is None or pod is None or step == "void":
                return LoanResult.VOID
            if all(loan_key(r.loan) != loan_key(loan) for r in records(pod)):
                made = LoanRecord(loan, borrower, time.time())
                pod = self._write(base, with_records(pod, (*records(pod), made)))
            if step == "done":
                return LoanResult.DONE
            self._write(base, with_request(pod, loan, loan.after))
        return LoanResult.LENT

    def give_back(self, loan: Loan, borrower: PodRef, node: str) -> LoanResult:
        self.log.append(f"give back {loan.pod.name} {loan.after}->{loan.before}")
        scripted = self.results.get(loan.pod.name)
        return scripted if scripted is not None else self._back(loan)

    def put_back(self, loan: Loan, borrower: PodRef, node: str, why: str) -> LoanResult:
        self.log.append(f"put back {loan.pod.name}: {why}")
        return self._back(loan)

    def forget(self, lender: PodRef, ended: Sequence[LoanRecord]) -> LoanResult:
        self.log.append(f"forget {lender.name}")
        try:
            return self._forget(lender, ended)
        except _Unreachable:
            return LoanResult.FAILED

    def _forget(self, lender: PodRef, ended: Sequence[LoanRecord]) -> LoanResult:
        with self._lock:
            base, pod = self._read(lender)
            if base is None or pod is None or pod.uid != lender.uid:
                return LoanResult.VOID
            gone = {loan_key(r.loan) for r in ended}
            kept = tuple(r for r in records(pod) if loan_key(r.loan) not in gone)
            if len(kept) == len(records(pod)):
                return LoanResult.DONE
            self._write(base, with_records(pod, kept))
        return LoanResult.LENT

    def lender(self, ref: PodRef) -> Pod | None:
        """The lender as this double reads it: its own copy while the view still holds
        the one it wrote over, else the view's."""
        return self._read(ref)[1]

    def _read(self, ref: PodRef) -> tuple[Pod | None, Pod | None]:
        """(the view's copy, the lender as read)."""
        if self.view is None:
            return None, None
        cached = self.view.pod(ref.namespace, ref.name)
        written = self.written.get(f"{ref.namespace}/{ref.name}")
        if written is not None and cached is written[0]:
            return cached, written[1]
        return cached, cached

    def _back(self, loan: Loan) -> LoanResult:
        try:
            return self._raise_back(loan)
        except _Unreachable:
            return LoanResult.FAILED

    def _raise_back(self, loan: Loan) -> LoanResult:
        with self._lock:
            base, pod = self._read(loan.pod)
            step = lender_step(loan, pod, back=True)
            if base is None or pod is None or step == "void":
                return LoanResult.VOID
            if step == "done":
                return LoanResult.DONE
            self._write(base, with_request(pod, loan, loan.before))
        return LoanResult.LENT

    def _write(self, base: Pod, new: Pod) -> Pod:
        """``new`` written over the view's copy ``base``."""
        if not self.reachable:
            raise _Unreachable
        self.written[base.key] = (base, new)
        return new


def with_request(pod: Pod, loan: Loan, amount: int) -> Pod:
    """``pod`` whose spec asks ``amount`` of the loan's resource in its container (its
    limit too when ``loan.limits``), as ``pods/resize`` leaves it; the kubelet's
    allocation is unchanged."""

    def resized(c: Container) -> Container:
        if c.name != loan.container:
            return c
        limits = c.limits.replace(loan.resource, amount) if loan.limits else c.limits
        return replace(c, requests=c.requests.replace(loan.resource, amount), limits=limits)

    return pod.with_containers(
        tuple(resized(c) for c in pod.containers),
        tuple(resized(c) for c in pod.init_containers),
    )


def with_records(pod: Pod, kept: Sequence[LoanRecord]) -> Pod:
    """``pod`` carrying ``kept`` as its loan record (none: the annotation removed)."""
    annotations = {k: v for k, v in pod.annotations.items() if k != LOANS_ANNOTATION}
    if kept:
        annotations[LOANS_ANNOTATION] = records_text(kept)
    return replace(pod, annotations=annotations)


class LoggingEvictor(FakeEvictor):
    """A :class:`FakeEvictor` that logs each eviction in ``log`` (shared with a
    :class:`FakeResizer`)."""

    def __init__(self, log: list[str], view: ClusterView | None = None) -> None:
        super().__init__(view)
        self.log = log

    def evict(
        self, victim: PodRef, preemptor: PodRef, node: str, *, seen_live: bool = False
    ) -> EvictionResult:
        self.log.append(f"evict {victim.name}")
        return super().evict(victim, preemptor, node, seen_live=seen_live)


class FakeEvents:
    """A :class:`~webhook.engine.ledger.PreemptionEvents` and
    :class:`~webhook.engine.follow.MoveEvents`: records what it is told about the
    resizing pod, abandoned plans as (preemptor, victims, node) in ``events``, where a
    victim's work went as ``("Moved", victim, replacement, node)`` or ``("NotMoved",
    victim, why)`` (keys) in ``told``. With a ``view``, an event in a namespace the view
    does not know is not recorded (``False``), as the API server refuses it. Never
    raises; ``reachable=False`` is a recorder whose API server cannot be reached."""

    def __init__(self, view: ClusterView | None = None, *, reachable: bool = True) -> None:
        self.view = view
        self.reachable = reachable
        self.events: list[tuple[str, tuple[str, ...], str]] = []
        self.told: list[tuple[str, ...]] = []

    def _records(self, regarding: PodRef) -> bool:
        if not self.reachable:
            return False
        return self.view is None or self.view.namespace_labels(regarding.namespace) is not None

    def abandoned(
        self, preemptor: PodRef, victims: Sequence[PodRef], node: str, detail: str
    ) -> bool:
        if not self._records(preemptor):
            return False
        self.events.append((preemptor.name, tuple(v.name for v in victims), node))
        return True

    def moved(self, preemptor: PodRef, victim: PodRef, replacement: PodRef, node: str) -> bool:
        if not self._records(preemptor):
            return False
        self.told.append(("Moved", victim.key, replacement.key, node))
        return True

    def lost(self, preemptor: PodRef, victim: PodRef, why: str) -> bool:
        if not self._records(preemptor):
            return False
        self.told.append(("NotMoved", victim.key, why))
        return True

    # -- :class:`~webhook.engine.pauses.PauseEvents`: on the victim, or the restored pod --

    def checkpointed(self, victim: PodRef, preemptor: PodRef, note: str) -> bool:
        return self._tell(victim, ("Checkpointed", note))

    def checkpoint_failed(self, victim: PodRef, preemptor: PodRef, why: str) -> bool:
        return self._tell(victim, ("CheckpointFailed", why))

    def restored(self, pod: PodRef, note: str) -> bool:
        return self._tell(pod, ("Restored", note))

    def _tell(self, regarding: PodRef, told: tuple[str, ...]) -> bool:
        if not self._records(regarding):
            return False
        self.told.append(told)
        return True


__all__ = [
    "FakeEvents",
    "FakeEvictor",
    "FakeResizer",
    "InMemoryLedger",
    "LoggingEvictor",
    "RuntimeInMemory",
    "StaticClusterView",
    "with_records",
    "with_request",
]


# -- checkpoints (webhook.engine.pauses) --------------------------------------------------------


class MemoryCheckpoints:
    """The checkpoint store in memory, both sides of it: the service's
    (:class:`~webhook.engine.pauses.CheckpointStore`) and a node agent's
    (:class:`~webhook.agent.records.CheckpointStore`). Every write gives the record a new
    version, as the API server gives a record a new resourceVersion."""

    def __init__(
        self,
        abilities: Sequence[NodeCheckpointing] = (),
        records: Sequence[CheckpointRecord] = (),
    ) -> None:
        self.abilities = {a.node: a for a in abilities}
        self._versions = itertools.count(1)
        self.stored = {r.uid: self._stamp(r) for r in records}
        self.writes: list[CheckpointRecord] = []
        self.refuse_writes = False

    def _stamp(self, record: CheckpointRecord) -> CheckpointRecord:
        return replace(record, version=str(next(self._versions)))

    def publish(self, ability: NodeCheckpointing, now: float = 0.0) -> None:
        """What a node agent does: its node's abilities, read by the next call."""
        self.abilities[ability.node] = ability

    def capability(self, node: str) -> NodeCheckpointing | None:
        return self.abilities.get(node)

    def capabilities(self) -> Sequence[NodeCheckpointing]:
        return tuple(self.abilities.values())

    def records(self) -> Sequence[CheckpointRecord]:
        return tuple(self.stored.values())

    def record(self, uid: str) -> CheckpointRecord | None:
        return self.stored.get(uid)

    def write(self, record: CheckpointRecord) -> bool:
        if self.refuse_writes:
            return False
        before = self.stored.get(record.uid)
        if before is not None:  # its spec is written once: only the status changes
            record = replace(
                record,
                node=before.node,
                pod=before.pod,
                archives=before.archives,
                checkpointed_at=before.checkpointed_at,
            )
        self.stored[record.uid] = self._stamp(record)
        self.writes.append(record)
        return True


class PodCheckpointsInMemory:
    """A node agent's :class:`~webhook.agent.records.CheckpointStore` over
    ``PodCheckpoint`` objects kept in memory, as the API server keeps them: each record's
    ``spec`` (never changed after its creation) and ``status`` by name, and a version that
    every update changes; the abilities as published ``status`` by node. ``stale`` names
    records an update finds changed meanwhile; the agent reads its node's records only
    (by ``spec.node``)."""

    def __init__(self, items: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.items = {
            name: {"spec": dict(o.get("spec") or {}), "status": dict(o.get("status") or {})}
            for name, o in (items or {}).items()
        }
        self._versions = itertools.count(1)
        self.versions = {name: str(next(self._versions)) for name in self.items}
        self.capabilities: dict[str, dict[str, str]] = {}
        self.stale: set[str] = set()

    def put(self, record: CheckpointRecord) -> None:
        """What the service does: writes ``record`` (a new version)."""
        self.items[record.name] = {"spec": record.spec(), "status": _set(record.status())}
        self.versions[record.name] = str(next(self._versions))

    def records_on(self, node: str) -> list[CheckpointRecord]:
        found = []
        for name in sorted(self.items):
            if self.items[name]["spec"].get("node") != node:
                continue
            meta = {"name": name, "resourceVersion": self.versions.get(name, "")}
            with contextlib.suppress(ValueError):  # as the API server's store, left out
                found.append(CheckpointRecord.from_object({**self.items[name], "metadata": meta}))
        return found

    def update(self, record: CheckpointRecord) -> bool:
        name = record.name
        if name not in self.items or name in self.stale:
            return False
        if record.version and record.version != self.versions.get(name):
            return False
        self.items[name]["status"] = _set(record.status())  # the status subresource only
        self.versions[name] = str(next(self._versions))
        return True

    def delete(self, name: str) -> None:
        for held in (self.items, self.versions):
            held.pop(name, None)

    def publish(self, ability: NodeCheckpointing, now: float) -> None:
        self.capabilities[ability.node] = ability.status(now)


def _set(status: Mapping[str, Any]) -> dict[str, Any]:
    """A status as the API server keeps it after a merge patch: ``None`` removes."""
    return {k: v for k, v in status.items() if v is not None}


@dataclass
class FakeCheckpointer:
    """A :class:`~webhook.engine.pauses.Checkpointer` over stored pods: ``pods`` answers a
    pod's document by (namespace, name), ``view`` which nodes exist. It answers as the
    kubelet's checkpoint API does (tests/e2e/test_checkpointer_contract.py): an archive per
    container named as the kubelet names it, nothing for a pod gone or replaced, for a node
    that does not exist, or for a grace period under a second. Without ``pods`` every victim
    is checkpointed; ``answer``, when set, answers in its place."""

    answer: Checkpointed | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)
    pods: Callable[[str, str], Mapping[str, Any] | None] | None = None
    view: ClusterView | None = None

    def checkpoint(self, victim: PodRef, node: str) -> Checkpointed:
        self.calls.append((victim.key, node))
        if self.answer is not None:
            return self.answer
        if self.pods is None:
            pod = {"metadata": {"namespace": victim.namespace, "name": victim.name}, "spec": {}}
            return Checkpointed(pod, {"main": f"/checkpoints/{victim.name}.tar"}, 30, 0.3)
        return self._as_kubelet(victim, node, self.pods(victim.namespace, victim.name))

    def _as_kubelet(self, victim: PodRef, node: str, doc: Mapping[str, Any] | None) -> Checkpointed:
        if doc is None:
            return Checkpointed({}, {}, 0, 0.0, f"pods {victim.name!r} not found")
        meta = {k: v for k, v in (doc.get("metadata") or {}).items() if k != "managedFields"}
        if victim.uid and meta.get("uid") != victim.uid:
            return Checkpointed({}, {}, 0, 0.0, "the victim was replaced meanwhile")
        spec = doc.get("spec") or {}
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
        grace = spec.get("terminationGracePeriodSeconds", 30)
        if self.view is not None and self.view.node(node) is None:
            return Checkpointed(pod, {}, grace, 0.0, f"nodes {node!r} not found")
        names = [c["name"] for c in spec.get("containers") or ()]
        if names and grace < 1:
            why = f"its grace period ({grace}s) leaves no time to checkpoint container {names[0]}"
            return Checkpointed(pod, {}, grace, 0.0, why)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        full = f"{victim.name}_{victim.namespace}"
        archives = {
            n: f"/var/lib/kubelet/checkpoints/checkpoint-{full}-{n}-{stamp}.tar" for n in names
        }
        return Checkpointed(pod, archives, grace, 0.3)


class FakeCreator:
    """A :class:`~webhook.engine.pauses.PodCreator` over ``view``: a pod of a name the view
    or an earlier create holds exists already, a namespace the view does not know is gone
    (as the API server answers); ``answer``, when set, answers in its place."""

    def __init__(self, view: ClusterView | None = None, answer: str = "") -> None:
        self.view, self.answer = view, answer
        self.created: list[Mapping[str, Any]] = []

    def create(self, manifest: Mapping[str, Any]) -> str:
        if self.answer:
            return self.answer
        meta = manifest.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
        taken = any(
            (m["metadata"].get("namespace"), m["metadata"]["name"]) == (namespace, name)
            for m in self.created
        )
        if self.view is not None:
            if self.view.namespace_labels(namespace) is None:
                return f"namespace {namespace} is gone"
            taken = taken or self.view.pod(namespace, name) is not None
        if taken:
            return "a pod of that name exists"
        self.created.append(manifest)
        return ""


# -- the node agent's container runtime (webhook.agent.runtime) -----------------------------


#: How ``ctr images import`` fails, through :class:`~webhook.agent.runtime.Containerd`.
IMPORT_FAILED = "`ctr images import` failed: {why}"


@dataclass
class RuntimeInMemory:
    """A node agent's :class:`~webhook.agent.runtime.Runtime` over images kept in memory,
    answering as containerd's CRI namespace does through ``ctr``
    (tests/e2e/test_runtime_contract.py): ``images`` maps each name to the digest of its
    manifest.

    An import reads the OCI image layout tar as ``ctr images import`` does: each image of
    ``index.json`` is listed under its ``io.containerd.image.name``, or else as
    ``import-<date>:<its ref.name>``, whatever the caller expected (then it fails, the
    other name left listed), and under its id (``sha256:`` and its config's digest) as
    the CRI names it; a file that is not a layout fails and lists nothing. Removing a name
    removes the id too once no other name holds that image. ``manifests`` keeps each
    imported image's manifest, for a test to read what the agent wrote.

    The probe reads ``config`` (containerd's configuration file; None or unreadable: not
    readable) as containerd ``version`` would; ``facts``, when set, answers in its place.
    ``fail_import_of`` names a reference whose import fails as on a full disk."""

    images: dict[str, str] = field(default_factory=dict)
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    version: str = "v2.3.7"
    config: Path | None = None
    facts: RuntimeFacts | None = None
    fail_import_of: str = ""

    def probe(self) -> RuntimeFacts:
        if self.facts is not None:
            return self.facts
        config_text: str | None = None
        if self.config is not None:
            with contextlib.suppress(OSError):
                config_text = self.config.read_text()
        restore, why = restore_enabled(version_tuple(self.version), config_text)
        return RuntimeFacts(f"containerd {self.version}", restore, why)

    def import_image(self, layout: Path, reference: str) -> None:
        if reference == self.fail_import_of:
            raise RuntimeFailure(IMPORT_FAILED.format(why="no space left on device"))
        for name, (digest, manifest) in _read_layout(layout).items():
            image_id = str(manifest.get("config", {}).get("digest", ""))
            for listed in (name, image_id) if image_id.startswith("sha256:") else (name,):
                self.images[listed] = digest
                self.manifests[listed] = manifest
        if reference not in self.images:
            raise RuntimeFailure(f"{layout.name} imported, but not as {reference}")

    def remove_image(self, reference: str) -> None:
        target = self.images.pop(reference, None)
        self.manifests.pop(reference, None)
        sharing = [name for name, digest in self.images.items() if digest == target]
        if all(name.startswith("sha256:") for name in sharing):
            for name in sharing:
                del self.images[name]
                self.manifests.pop(name, None)

    def image_names(self) -> set[str]:
        return set(self.images)

    def image_digests(self) -> dict[str, str]:
        return dict(self.images)


def _read_layout(layout: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each image the layout names, as ``ctr images import`` names it: its manifest's
    digest and the manifest."""
    try:
        with tarfile.open(layout) as tar:
            files = {m.name.removeprefix("./"): m for m in tar if m.isfile()}
            if "index.json" not in files:
                raise RuntimeFailure(IMPORT_FAILED.format(why="index.json not found"))
            index = json.load(tar.extractfile(files["index.json"]))  # type: ignore[arg-type]
            named = {}
            for entry in index.get("manifests") or ():
                annotations = entry.get("annotations") or {}
                name = annotations.get(IMAGE_NAME_ANNOTATION)
                if not name and annotations.get(REF_NAME_ANNOTATION):
                    name = f"import-{time.strftime('%Y-%m-%d')}:{annotations[REF_NAME_ANNOTATION]}"
                blob = files.get(f"blobs/sha256/{str(entry['digest']).removeprefix('sha256:')}")
                if name and blob is not None:
                    named[name] = (entry["digest"], json.load(tar.extractfile(blob)))  # type: ignore[arg-type]
            return named
    except (OSError, tarfile.TarError, ValueError, KeyError) as e:
        raise RuntimeFailure(IMPORT_FAILED.format(why=str(e).splitlines()[0])) from None
