"""Doubles of the checkpoint ports (webhook.engine.pauses), shared by the unit tests and
the contract suite that runs them beside the cluster's implementations."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook.core.checkpoint import CheckpointRecord, NodeCheckpointing
from webhook.core.model import PodRef
from webhook.engine.pauses import Checkpointed


class MemoryCheckpoints:
    """A :class:`~webhook.engine.pauses.CheckpointStore` in memory."""

    def __init__(
        self,
        abilities: Sequence[NodeCheckpointing] = (),
        records: Sequence[CheckpointRecord] = (),
    ) -> None:
        self.abilities = {a.node: a for a in abilities}
        self.stored = {r.uid: r for r in records}
        self.writes: list[CheckpointRecord] = []
        self.refuse_writes = False

    def publish(self, ability: NodeCheckpointing) -> None:
        """What a node agent does: its node's abilities, read by the next call."""
        self.abilities[ability.node] = ability

    def capability(self, node: str) -> NodeCheckpointing | None:
        return self.abilities.get(node)

    def records(self) -> Sequence[CheckpointRecord]:
        return tuple(self.stored.values())

    def record(self, uid: str) -> CheckpointRecord | None:
        return self.stored.get(uid)

    def write(self, record: CheckpointRecord) -> bool:
        if self.refuse_writes:
            return False
        self.stored[record.uid] = record
        self.writes.append(record)
        return True


@dataclass
class FakeCheckpointer:
    """Answers every checkpoint with ``answer`` (a victim's archives by default)."""

    answer: Checkpointed | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)

    def checkpoint(self, victim: PodRef, node: str) -> Checkpointed:
        self.calls.append((victim.key, node))
        if self.answer is not None:
            return self.answer
        pod = {"metadata": {"namespace": victim.namespace, "name": victim.name}, "spec": {}}
        return Checkpointed(pod, {"main": f"/checkpoints/{victim.name}.tar"}, 30, 0.3)


@dataclass
class FakeCreator:
    answer: str = ""
    created: list[Mapping[str, Any]] = field(default_factory=list)

    def create(self, manifest: Mapping[str, Any]) -> str:
        self.created.append(manifest)
        return self.answer


@dataclass
class PauseRecorder:
    told: list[tuple[str, str, str]] = field(default_factory=list)

    def checkpointed(self, victim: PodRef, preemptor: PodRef, note: str) -> bool:
        self.told.append(("Checkpointed", victim.key, note))
        return True

    def checkpoint_failed(self, victim: PodRef, preemptor: PodRef, why: str) -> bool:
        self.told.append(("CheckpointFailed", victim.key, why))
        return True

    def restored(self, pod: PodRef, note: str) -> bool:
        self.told.append(("Restored", pod.key, note))
        return True
