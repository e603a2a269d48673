"""Pause, don't kill: checkpoint opted-in victims before their eviction, restore them
when room returns (docs/checkpoint.md). Leader only, beside the preemption worker.

Three pieces, each over ports the service wires to the cluster (:mod:`webhook.kube`):

* :class:`Pauses` judges, for plans and for the executor alike, whether a victim is
  checkpointed (:func:`~webhook.core.checkpoint.pause_of` with its node's abilities);
* :class:`PausingEvictor` is the worker's :class:`~webhook.engine.ledger.VictimEvictor`:
  for a victim to checkpoint it asks the kubelet for a checkpoint of every container,
  records it (phase ``archived``), tells the victim, and then evicts it with what the
  checkpoint left of its grace period. Any failure evicts it as any victim, with a
  Warning event saying why: the opt-in never makes a resize fail or wait longer;
* :class:`Restorer` walks the records on each worker pass and moves each one through its
  phases with :func:`step` - the one transition function - creating the pod again once
  its node agent made images of the archives and there is room for it: on its own node,
  or, when its images are in a registry, on another node able to restore it
  (:func:`~webhook.core.checkpoint.comes_back_on`).

The node agent (``python -m webhook node-agent``) writes the phases ``imaged`` and
``failed``, and deletes archives, images and records of ended checkpoints.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

from webhook.base.metrics import Metrics
from webhook.core.accounting import Reservation, pod_requests
from webhook.core.checkpoint import (
    ON_PREEMPT_ANNOTATION,
    RESTORE_PATIENCE,
    RESTORED_FROM_ANNOTATION,
    CheckpointRecord,
    NodeCheckpointing,
    Pause,
    Phase,
    comes_back_on,
    pause_of,
    remaining_grace,
    restore_refusal,
    restored_pod,
    rfc3339,
)
from webhook.core.model import Pod, PodRef
from webhook.core.movable import Room
from webhook.core.objects import parse_pod
from webhook.core.resources import ZERO, Resources
from webhook.engine.ledger import ClusterView, EvictionResult, Ledger, VictimEvictor
from webhook.engine.lifecycle.states import room_holders
from webhook.engine.rooms import NodeRooms

log = logging.getLogger(__name__)

#: How long an ``archived`` record waits for its node agent before it is given up on.
IMAGING_PATIENCE = 600.0


# -- ports --------------------------------------------------------------------------------------


class CheckpointStore(Protocol):
    """The records and the nodes' abilities. Records read back what this store wrote;
    they may lag other writers by a second. Abilities may lag what an agent published by
    a few seconds: reviews read them, and never wait on the API server for long."""

    def capability(self, node: str) -> NodeCheckpointing | None: ...

    def records(self) -> Sequence[CheckpointRecord]: ...

    def record(self, uid: str) -> CheckpointRecord | None: ...

    def capabilities(self) -> Sequence[NodeCheckpointing]:
        """Every node's abilities its agent published."""
        ...

    def write(self, record: CheckpointRecord) -> bool:
        """Create or replace ``record``; ``False`` (logged) when the API refused it."""
        ...


@dataclass(frozen=True, slots=True)
class Checkpointed:
    """What the kubelet did for one victim: its pod as read, and each container's
    archive (empty, with ``message``, when any container failed)."""

    pod: Mapping[str, Any]
    archives: Mapping[str, str]
    grace: int
    seconds: float
    message: str = ""


class Checkpointer(Protocol):
    def checkpoint(self, victim: PodRef, node: str) -> Checkpointed:
        """Checkpoint every container of ``victim`` through its node's kubelet, within
        the victim's grace period; never raises."""
        ...


class PodCreator(Protocol):
    def create(self, manifest: Mapping[str, Any]) -> str:
        """Create the pod; ``""`` when created, else why not (``AlreadyExists``...)."""
        ...


class PauseEvents(Protocol):
    def checkpointed(self, victim: PodRef, preemptor: PodRef, note: str) -> bool: ...

    def checkpoint_failed(self, victim: PodRef, preemptor: PodRef, why: str) -> bool: ...

    def restored(self, pod: PodRef, note: str) -> bool: ...


# -- judging ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pauses:
    """Whether a victim is checkpointed, from the service's setting and its node's agent."""

    store: CheckpointStore | None
    enabled: bool

    def __call__(self, pod: Pod) -> Pause | None:
        # Plans ask of every candidate: only one that opted in reads the store.
        if ON_PREEMPT_ANNOTATION not in pod.annotations:
            return None
        node = self.store.capability(pod.node) if self.store is not None else None
        return pause_of(pod, node, enabled=self.enabled and self.store is not None)


# -- checkpoint before eviction -----------------------------------------------------------------


class PausingEvictor:
    """A :class:`~webhook.engine.ledger.VictimEvictor` that checkpoints first the victims
    :class:`Pauses` says to; idempotent as the evictor it wraps (a victim with a record
    is not checkpointed again)."""

    def __init__(
        self,
        inner: VictimEvictor,
        cluster: ClusterView,
        pauses: Pauses,
        checkpointer: Checkpointer,
        events: PauseEvents | None,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.inner, self.cluster, self.pauses = inner, cluster, pauses
        self.checkpointer, self.events, self.metrics = checkpointer, events, metrics
        self.clock = clock

    def evict(
        self,
        victim: PodRef,
        preemptor: PodRef,
        node: str,
        *,
        seen_live: bool = False,
        grace_seconds: int | None = None,
    ) -> EvictionResult:
        pod = self.cluster.pod(victim.namespace, victim.name)
        pause = self.pauses(pod) if pod is not None and pod.uid == victim.uid else None
        grace = grace_seconds
        if pause is not None and not self._recorded(victim):
            if not pause.checkpoint:
                self._refused(victim, preemptor, "refused", pause.why)
            else:
                left = self._checkpoint(victim, preemptor, node)
                grace = left if grace is None or left is None else min(grace, left)
        return self.inner.evict(victim, preemptor, node, seen_live=seen_live, grace_seconds=grace)

    def _recorded(self, victim: PodRef) -> bool:
        store = self.pauses.store
        return store is not None and store.record(victim.uid) is not None

    def _checkpoint(self, victim: PodRef, preemptor: PodRef, node: str) -> int | None:
        """Checkpoint and record ``victim``; the grace period left for its eviction, or
        ``None`` when it goes without a checkpoint (told)."""
        done = self.checkpointer.checkpoint(victim, node)
        if not done.archives:
            self._refused(victim, preemptor, "failed", done.message)
            return None
        self.metrics.checkpoint_seconds.observe(done.seconds)
        record = CheckpointRecord(
            victim.uid,
            node,
            Phase.ARCHIVED,
            done.pod,
            done.archives,
            checkpointed_at=rfc3339(self.clock()),
        )
        store = self.pauses.store
        if store is None or not store.write(record):
            self._refused(victim, preemptor, "failed", "its checkpoint record was not written")
            return None
        self.metrics.checkpoints.labels("checkpointed").inc()
        log.info(
            "checkpointed %s on %s in %.2fs for %s", victim.key, node, done.seconds, preemptor.key
        )
        if self.events is not None:
            self.events.checkpointed(
                victim,
                preemptor,
                f"Checkpointed on node {node} in {done.seconds:.2f}s before its preemption; "
                f"{record.name} restores it when room returns",
            )
        return remaining_grace(done.grace, done.seconds)

    def _refused(self, victim: PodRef, preemptor: PodRef, result: str, why: str) -> None:
        self.metrics.checkpoints.labels(result).inc()
        log.warning("not checkpointing %s, evicting it: %s", victim.key, why)
        if self.events is not None:
            self.events.checkpoint_failed(victim, preemptor, why)


# -- restore when room returns ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Later:
    """Nothing to do yet."""


@dataclass(frozen=True, slots=True)
class Create:
    """Create the pod again from its images, on ``node``."""

    manifest: Mapping[str, Any]
    node: str


@dataclass(frozen=True, slots=True)
class Advance:
    """Write the record in ``phase``, saying ``message``."""

    phase: Phase
    message: str = ""


Step = Later | Create | Advance


def step(
    record: CheckpointRecord,
    now_pod: Pod | None,
    where: Callable[[], str],
    age: float,
) -> Step:
    """The one transition of a checkpoint record, from what the cluster shows now:
    ``now_pod`` is the pod of the record's namespace and name (any incarnation),
    ``where`` the node the checkpointed pod comes back on now, ``""`` for none yet
    (:func:`~webhook.core.checkpoint.comes_back_on`; read only when needed), ``age``
    seconds since the record's phase began.

    archived -> abandoned (agent too slow); imaged -> restoring (created) or abandoned
    (the name is taken, or the record is not restored as it stands:
    :func:`~webhook.core.checkpoint.restore_refusal`); restoring -> restored (it runs,
    or gave up waiting) or abandoned (the restored pod was deleted). The other phases
    are the agent's to end."""
    if record.phase is Phase.ARCHIVED:
        if age > IMAGING_PATIENCE:
            return Advance(Phase.ABANDONED, "no image of the checkpoint was made in time")
        return Later()
    ours = now_pod is not None and now_pod.annotations.get(RESTORED_FROM_ANNOTATION) == record.name
    if record.phase is Phase.IMAGED:
        if ours:
            return Advance(Phase.RESTORING)  # created before a restart of the leader
        if now_pod is not None:
            if now_pod.uid == record.uid:
                return Later()  # the victim is still on its way out
            return Advance(Phase.ABANDONED, f"another pod {record.key} exists")
        refused = restore_refusal(record)
        if refused:
            return Advance(Phase.ABANDONED, f"not restored: {refused}")
        node = where()
        return Create(restored_pod(record, node), node) if node else Later()
    if record.phase is Phase.RESTORING:
        if not ours:
            return Advance(Phase.ABANDONED, "the restored pod was deleted")
        assert now_pod is not None
        if now_pod.phase == "Running" or now_pod.terminal:
            return Advance(Phase.RESTORED, f"the restored pod is {now_pod.phase}")
        if age > RESTORE_PATIENCE:
            return Advance(Phase.RESTORED, "the restored pod has not started in time")
    return Later()


class Restorer:
    """Moves every checkpoint record one :func:`step` on; the worker calls :meth:`run`
    on each of its passes (leader only)."""

    def __init__(
        self,
        cluster: ClusterView,
        ledger: Ledger,
        store: CheckpointStore,
        creator: PodCreator,
        events: PauseEvents | None,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cluster, self.ledger, self.store = cluster, ledger, store
        self.creator, self.events, self.metrics, self.clock = creator, events, metrics, clock
        #: When each record entered its phase, as this replica first saw it.
        self._since: dict[tuple[str, Phase], float] = {}

    def run(self) -> None:
        now = self.clock()
        seen = set()
        rooms = _PassRooms(self.cluster, self.ledger, self.store, now)
        for record in self.store.records():
            key = (record.uid, record.phase)
            seen.add(key)
            since = self._since.setdefault(key, now)
            pod = self.cluster.pod(record.namespace, record.pod_name)
            action = step(record, pod, partial(rooms.where, record), now - since)
            if self._carry_out(record, action, now - since, pod):
                assert isinstance(action, Create)
                rooms.take(action.node, _asks(record) or ZERO)
        self._since = {k: v for k, v in self._since.items() if k in seen}

    def _carry_out(
        self, record: CheckpointRecord, action: Step, age: float, pod: Pod | None
    ) -> bool:
        """Carries ``action`` out; whether it created a pod."""
        if isinstance(action, Create):
            why = self.creator.create(action.manifest)
            if why:
                log.warning("could not restore %s on %s: %s", record.key, action.node, why)
                return False
            log.info(
                "restoring %s on %s from %s (checkpointed on %s)",
                *(record.key, action.node, record.name, record.node),
            )
            self._write(replace(record, phase=Phase.RESTORING, message=""))
            return True
        if isinstance(action, Advance):
            self._write(replace(record, phase=action.phase, message=action.message))
            self._tell(record, action, age, pod)
        return False

    def _write(self, record: CheckpointRecord) -> None:
        if not self.store.write(record):
            log.warning("could not write %s in phase %s", record.name, record.phase)

    def _tell(self, record: CheckpointRecord, action: Advance, age: float, pod: Pod | None) -> None:
        if action.phase is Phase.RESTORED:
            self.metrics.checkpoints.labels("restored").inc()
            self.metrics.restore_seconds.observe(age)
            if record.size:
                self.metrics.checkpoint_bytes.observe(record.size)
            ref = PodRef(record.namespace, record.pod_name)
            node = pod.node if pod is not None and pod.node else record.node
            log.info("restored %s on %s from %s: %s", record.key, node, record.name, action.message)
            if self.events is not None:
                self.events.restored(
                    ref, f"Restored on node {node} from {record.name}: {action.message}"
                )
        elif action.phase is Phase.ABANDONED:
            self.metrics.checkpoints.labels("abandoned").inc()
            log.warning("not restoring %s: %s", record.key, action.message)


class _PassRooms:
    """The rooms one restorer pass reads, each node's at most once, and what the pass's
    restores took of them (the cluster view shows a created pod only a moment later)."""

    def __init__(
        self, cluster: ClusterView, ledger: Ledger, store: CheckpointStore, now: float
    ) -> None:
        self.cluster, self.ledger, self.store, self.now = cluster, ledger, store, now
        self.taken: dict[str, Resources] = {}
        self._rooms: dict[str, Room | None] = {}
        self._reservations: list[Reservation] | None = None
        self._able: frozenset[str] | None = None
        #: The cluster view's index of every node's room (the one count of free room).
        self._index: NodeRooms | None = None

    def take(self, node: str, asks: Resources) -> None:
        self.taken[node] = self.taken.get(node, ZERO) + asks

    def where(self, record: CheckpointRecord) -> str:
        """The node ``record``'s pod comes back on now; ``""`` for none yet."""
        stored = _stored(record)
        if stored is None:
            return ""
        if self._able is None:
            self._able = frozenset(a.node for a in self.store.capabilities() if a.able)
        others = (self.room(n) for n in sorted(self._able) if n != record.node)
        back = comes_back_on(
            record,
            stored,
            self.room(record.node),
            (r for r in others if r is not None),
            self._able,
            self.taken,
        )
        log.debug("%s comes back on %s: %s", record.key, back.node or "no node yet", back.why)
        return back.node

    def room(self, node: str) -> Room | None:
        """``node``'s room now, counted as for a new pod there: every pod, the room
        active reservations hold and what plans promised there to their victims'
        replacements."""
        if node not in self._rooms:
            if self._index is None:
                self._index = self.cluster.node_rooms()
                self._index.refresh(self.cluster)
            self._rooms[node] = self._index.room_with(node, self.reservations(), self.now)
        return self._rooms[node]

    def reservations(self) -> list[Reservation]:
        """Every ledger entry holding room, on any node (its promises elsewhere too)."""
        if self._reservations is None:
            by_node: dict[str, list[Any]] = {}
            for entry in self.ledger.all_entries():
                by_node.setdefault(entry.node, []).append(entry)
            self._reservations = [
                e.reservation()
                for node, entries in by_node.items()
                for e in room_holders(entries, self.cluster.pods_on(node), self.now)
            ]
        return self._reservations


def _stored(record: CheckpointRecord) -> Pod | None:
    """The checkpointed pod as its record keeps it; ``None`` when it does not parse."""
    try:
        return parse_pod(dict(record.pod))
    except ValueError:
        return None


def _asks(record: CheckpointRecord) -> Resources | None:
    """What the checkpointed pod asks of its node, from its stored spec."""
    stored = _stored(record)
    return None if stored is None else pod_requests(stored)
