"""Pause, don't kill: which victims are checkpointed, and when they come back.

A pod opts in with ``resize-preemption.io/on-preempt: checkpoint``. Such a victim is
checkpointed through the kubelet's checkpoint API before it is evicted, and a pod of the
same name is created again on the same node, from the checkpoint's images, once the room
it held is free again (docs/checkpoint.md).

Two records connect the service and the node agent (one per node, root, beside the
archives the kubelet writes), both plain string maps stored as ConfigMaps in the
service's namespace:

* :class:`NodeCheckpointing` - what a node can do, published by its agent;
* :class:`CheckpointRecord` - one checkpointed victim, from its checkpoint to its
  restore, in the phases of :class:`Phase`.

Who may come back: only a pod nothing else would recreate. A pod with an owner reference
marked ``controller: true`` is its controller's to recreate, wherever the scheduler puts
it: it is evicted as every victim is, and its opt-in is refused with a message. A bare
pod, or one whose owners only hold it for garbage collection (no ``controller: true``),
has no one to bring it back, so it is the one a checkpoint saves; its owner references
come back with it.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from webhook.core.model import Pod

#: A pod's choice of what happens to it when preempted: ``checkpoint`` asks to be paused.
ON_PREEMPT_ANNOTATION: Final = "resize-preemption.io/on-preempt"
CHECKPOINT: Final = "checkpoint"
#: Set on a restored pod: the name of the checkpoint record it was made from.
RESTORED_FROM_ANNOTATION: Final = "resize-preemption.io/restored-from"
RECORD_PREFIX: Final = "rpw-checkpoint-"
CAPABILITY_PREFIX: Final = "rpw-node-"
#: Labels of both kinds of ConfigMap (docs/checkpoint.md).
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "resize-preemption-webhook"}
CHECKPOINT_LABEL: Final = "resize-preemption.io/checkpoint"
CAPABILITY_LABEL: Final = "resize-preemption.io/node-capability"
NODE_LABEL: Final = "resize-preemption.io/node"
PHASE_LABEL: Final = "resize-preemption.io/phase"
#: Where checkpoint images are named: ``<repository>/<ns>/<pod>/<container>:<uid[:12]>``.
IMAGE_REPOSITORY: Final = "localhost/resize-preemption-checkpoint"
#: How long a restored pod may take to run before its record is ended anyway: its
#: images are needed only until its containers were created.
RESTORE_PATIENCE: Final = 120.0


class Phase(StrEnum):
    """Where one checkpoint is; each phase is written by one side only."""

    ARCHIVED = "archived"  # service: every container's archive is on the node
    IMAGED = "imaged"  # agent: the archives are images in the runtime
    FAILED = "failed"  # agent: an archive could not become an image
    RESTORING = "restoring"  # service: the pod was created from the images
    RESTORED = "restored"  # service: the restored pod runs; the agent cleans up
    ABANDONED = "abandoned"  # service or agent: it will not come back

    @property
    def waiting(self) -> bool:
        """Still to come back (``status`` lists these)."""
        return self in (Phase.ARCHIVED, Phase.IMAGED, Phase.RESTORING)


#: Phases whose archives and images the agent deletes, then the record.
FINISHED: Final = frozenset({Phase.RESTORED, Phase.ABANDONED, Phase.FAILED})
#: Phases holding an archive or an image for a restore yet to come, which the agent's
#: bounds count (a restoring pod needs its image until its containers were created).
PENDING: Final = frozenset({Phase.ARCHIVED, Phase.IMAGED})


@dataclass(frozen=True, slots=True)
class NodeCheckpointing:
    """What one node's agent found its node can do."""

    node: str
    checkpoint: bool
    restore: bool
    criu: str = ""
    runtime: str = ""
    message: str = ""

    @property
    def able(self) -> bool:
        return self.checkpoint and self.restore

    @classmethod
    def from_data(cls, node: str, data: Mapping[str, str]) -> NodeCheckpointing:
        return cls(
            node,
            data.get("checkpoint") == "true",
            data.get("restore") == "true",
            data.get("criu", ""),
            data.get("runtime", ""),
            data.get("message", ""),
        )


@dataclass(frozen=True, slots=True)
class Pause:
    """Whether one victim is checkpointed before it goes, and why (or why not)."""

    checkpoint: bool
    why: str


def opted_in(pod: Pod) -> bool:
    return pod.annotations.get(ON_PREEMPT_ANNOTATION, "") == CHECKPOINT


def pause_of(pod: Pod, node: NodeCheckpointing | None, *, enabled: bool) -> Pause | None:
    """Whether victim ``pod`` is checkpointed; ``None`` when it did not ask to be.

    Refused, with why: checkpoints off in this service, a pod a controller recreates, a
    node whose agent has not said it can both checkpoint and restore."""
    value = pod.annotations.get(ON_PREEMPT_ANNOTATION)
    if value is None:
        return None
    if value != CHECKPOINT:
        return Pause(False, f"{ON_PREEMPT_ANNOTATION}={value!r} is not {CHECKPOINT!r}: evicted")
    if not enabled:
        return Pause(False, "checkpoints are off in this service: evicted")
    if pod.controller:
        return Pause(False, f"its {pod.controller} makes a new pod: evicted")
    if node is None:
        return Pause(False, f"no checkpoint agent reports node {pod.node}: evicted")
    if not node.able:
        why = node.message or f"node {node.node} cannot both checkpoint and restore"
        return Pause(False, f"{why}: evicted")
    return Pause(True, f"checkpointed, and restored on {pod.node} when room returns")


def remaining_grace(grace: int, spent: float) -> int:
    """The grace period left for the eviction after a checkpoint took ``spent`` seconds:
    the checkpoint never makes the victim's removal take longer than its grace period."""
    return max(0, grace - math.ceil(spent))


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    """One checkpointed victim: its pod as it was, where its archives and images are.

    ``data``/:meth:`from_data` are the ConfigMap's ``data`` (docs/checkpoint.md)."""

    uid: str
    node: str
    phase: Phase
    pod: Mapping[str, Any]
    archives: Mapping[str, str] = field(default_factory=dict)
    images: Mapping[str, str] = field(default_factory=dict)
    commands: Mapping[str, Sequence[str]] = field(default_factory=dict)
    sizes: Mapping[str, int] = field(default_factory=dict)
    checkpointed_at: str = ""
    message: str = ""

    @property
    def name(self) -> str:
        return record_name(self.uid)

    @property
    def namespace(self) -> str:
        return str(self.pod.get("metadata", {}).get("namespace", ""))

    @property
    def pod_name(self) -> str:
        return str(self.pod.get("metadata", {}).get("name", ""))

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod_name}"

    @property
    def size(self) -> int:
        return sum(self.sizes.values())

    def data(self) -> dict[str, str]:
        out = {
            "pod": json.dumps(self.pod, sort_keys=True, separators=(",", ":")),
            "archives": json.dumps(dict(self.archives), sort_keys=True),
            "phase": self.phase.value,
            "checkpointedAt": self.checkpointed_at,
        }
        if self.images:
            out["images"] = json.dumps(dict(self.images), sort_keys=True)
            out["commands"] = json.dumps({k: list(v) for k, v in self.commands.items()})
            out["sizes"] = json.dumps(dict(self.sizes), sort_keys=True)
        if self.message:
            out["message"] = self.message
        return out

    @classmethod
    def from_data(cls, uid: str, node: str, data: Mapping[str, str]) -> CheckpointRecord:
        """Raises ``ValueError`` for a record that does not parse."""
        try:
            return cls(
                uid,
                node,
                Phase(data.get("phase", "")),
                _object(data.get("pod", "{}")),
                _object(data.get("archives", "{}")),
                _object(data.get("images", "{}")),
                _object(data.get("commands", "{}")),
                {k: int(v) for k, v in _object(data.get("sizes", "{}")).items()},
                data.get("checkpointedAt", ""),
                data.get("message", ""),
            )
        except (TypeError, AttributeError, ValueError) as e:
            raise ValueError(f"checkpoint record {record_name(uid)}: {e}") from None


def _object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e.msg}") from None
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def rfc3339(moment: float) -> str:
    """``moment`` (seconds since the epoch) as RFC 3339 UTC, to the second."""
    return dt.datetime.fromtimestamp(moment, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def record_name(uid: str) -> str:
    return RECORD_PREFIX + uid


#: Metadata of the checkpointed pod that its restored incarnation does not carry over:
#: the API server sets them, or they name the old incarnation.
_SERVER_FIELDS: Final = (
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "generation",
    "managedFields",
    "selfLink",
    "finalizers",
)


def restored_pod(record: CheckpointRecord) -> dict[str, Any]:
    """The pod to create again from ``record``: the same namespace, name, labels,
    annotations (plus :data:`RESTORED_FROM_ANNOTATION`) and spec, bound to the same node,
    each checkpointed container started from its checkpoint image.

    containerd restores at container creation when the image is a checkpoint image; the
    image holds no command, so the container's own process arguments (read from the
    archive by the agent) become its ``command``."""
    pod = copy.deepcopy(dict(record.pod))
    meta = {k: v for k, v in pod.get("metadata", {}).items() if k not in _SERVER_FIELDS}
    meta["annotations"] = {
        **meta.get("annotations", {}),
        RESTORED_FROM_ANNOTATION: record.name,
    }
    spec = dict(pod.get("spec", {}))
    spec["nodeName"] = record.node
    containers = []
    for c in spec.get("containers", []):
        c = dict(c)
        if c.get("name") in record.images:
            c["image"] = record.images[c["name"]]
            c["imagePullPolicy"] = "Never"
            c["command"] = list(record.commands.get(c["name"], c.get("command", [])))
            c["args"] = []
        containers.append(c)
    spec["containers"] = containers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
