"""Pause, don't kill: which victims are checkpointed, and when they come back.

A pod opts in with ``resize-preemption.io/on-preempt: checkpoint``. Such a victim is
checkpointed through the kubelet's checkpoint API before it is evicted, and a pod of the
same name is created again from the checkpoint's images once there is room for it: on its
own node, or, when its images are in a registry, on another node able to restore it
(:func:`comes_back_on`; docs/checkpoint.md).

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
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from webhook.core.accounting import pod_requests
from webhook.core.model import Pod
from webhook.core.movable import Room, allows
from webhook.core.resources import ZERO, Resources

#: A pod's choice of what happens to it when preempted: ``checkpoint`` asks to be paused.
ON_PREEMPT_ANNOTATION: Final = "resize-preemption.io/on-preempt"
CHECKPOINT: Final = "checkpoint"
#: Set on a restored pod: the name of the checkpoint record it was made from.
RESTORED_FROM_ANNOTATION: Final = "resize-preemption.io/restored-from"
RECORD_PREFIX: Final = "rpw-checkpoint-"
#: The records and the nodes' abilities are objects of the service's own API group
#: (deploy/helm/resize-preemption-webhook/crds/): a ``PodCheckpoint`` per checkpointed
#: victim, modelled on KEP-5823's, and a ``CheckpointNode`` per node. Their ``spec`` is
#: written once by its creator; the node agents write ``status`` only (docs/checkpoint.md,
#: "Security").
GROUP: Final = "resize-preemption.io"
VERSION: Final = "v1alpha1"
RECORD_KIND: Final = "PodCheckpoint"
RECORDS: Final = "podcheckpoints"
NODE_KIND: Final = "CheckpointNode"
NODES: Final = "checkpointnodes"
#: Labels of the records, to select them by phase in kubectl; the agents select theirs by
#: the field ``spec.node``, which no one can change once written.
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "resize-preemption-webhook"}
NODE_LABEL: Final = "resize-preemption.io/node"
#: The label of the ConfigMaps an older release kept its records in (read once, for
#: migration only).
CHECKPOINT_LABEL: Final = "resize-preemption.io/checkpoint"
#: Where checkpoint images kept in their node's runtime are named:
#: ``<repository>/<ns>/<pod>/<container>:<uid[:12]>``. Any other reference is in a
#: registry, which every node may pull from.
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

    def status(self, now: float) -> dict[str, str]:
        """The ``CheckpointNode``'s ``status`` as the agent publishes it at ``now``."""
        return {
            "checkpoint": str(self.checkpoint).lower(),
            "restore": str(self.restore).lower(),
            "criu": self.criu,
            "runtime": self.runtime,
            "message": self.message,
            "updatedAt": rfc3339(now),
        }

    @classmethod
    def from_object(cls, item: Mapping[str, Any]) -> NodeCheckpointing:
        """The abilities of a ``CheckpointNode``: the node its ``spec`` names (never its
        status), what its agent's ``status`` says."""
        node = str((item.get("spec") or {}).get("node") or "")
        status = item.get("status") or {}
        return cls(
            node,
            status.get("checkpoint") == "true",
            status.get("restore") == "true",
            str(status.get("criu") or ""),
            str(status.get("runtime") or ""),
            str(status.get("message") or ""),
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

    :meth:`spec`, :meth:`status` and :meth:`from_object` are its ``PodCheckpoint``
    (docs/checkpoint.md)."""

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
    #: When the agent made the images, or gave up on them (RFC 3339; the agent's).
    imaged_at: str = ""
    failed_at: str = ""
    #: The object's resourceVersion as read (in neither spec nor status): an update of the
    #: record as read fails when it changed since, instead of overwriting the other side.
    version: str = field(default="", compare=False)

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

    @property
    def portable(self) -> bool:
        """Every image is in a registry: another node can pull them, so the pod may come
        back there. A record without images (not imaged yet) is not."""
        return bool(self.images) and not any(local_image(i) for i in self.images.values())

    def spec(self) -> dict[str, Any]:
        """The record's ``spec``: what the service took, written once by the service."""
        return {
            "uid": self.uid,
            "node": self.node,
            "pod": dict(self.pod),
            "archives": dict(self.archives),
            "checkpointedAt": self.checkpointed_at,
        }

    def status(self) -> dict[str, Any]:
        """The record's ``status``: its phase and what the agent made of the archives;
        every key present, ``None`` for one it does not hold (a merge patch removes it)."""
        out: dict[str, Any] = dict.fromkeys(RECORD_OPTIONAL_KEYS)
        out["phase"] = self.phase.value
        if self.images:
            out["images"] = dict(self.images)
            out["commands"] = {k: list(v) for k, v in self.commands.items()}
            out["sizes"] = dict(self.sizes)
        for key, value in (
            ("message", self.message),
            ("imagedAt", self.imaged_at),
            ("failedAt", self.failed_at),
        ):
            if value:
                out[key] = value
        return out

    @classmethod
    def from_object(cls, item: Mapping[str, Any]) -> CheckpointRecord:
        """The record of a ``PodCheckpoint`` object as the API server returned it; raises
        ``ValueError`` for one that does not parse, or whose name is not its uid's."""
        meta = item.get("metadata") or {}
        name = str(meta.get("name") or "")
        try:
            spec, status = item.get("spec") or {}, item.get("status") or {}
            uid = str(spec["uid"])
            if record_name(uid) != name:
                raise ValueError(f"its spec names uid {uid}")
            return cls(
                uid,
                str(spec["node"]),
                Phase(status.get("phase") or Phase.ARCHIVED.value),
                _mapping(spec.get("pod")),
                {str(k): str(v) for k, v in _mapping(spec.get("archives")).items()},
                {str(k): str(v) for k, v in _mapping(status.get("images")).items()},
                {str(k): [str(a) for a in v] for k, v in _mapping(status.get("commands")).items()},
                {str(k): int(v) for k, v in _mapping(status.get("sizes")).items()},
                str(spec.get("checkpointedAt") or ""),
                str(status.get("message") or ""),
                str(status.get("imagedAt") or ""),
                str(status.get("failedAt") or ""),
                str(meta.get("resourceVersion") or ""),
            )
        except (TypeError, AttributeError, ValueError, KeyError) as e:
            raise ValueError(f"checkpoint record {name}: {e}") from None


#: The status keys :meth:`CheckpointRecord.status` sets to ``None`` when the record does
#: not hold them: a write of a record removes them, so that it reads back as written.
RECORD_OPTIONAL_KEYS: Final = (
    "images",
    "commands",
    "sizes",
    "message",
    "imagedAt",
    "failedAt",
)


def _mapping(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("not an object")
    return dict(value)


def rfc3339(moment: float) -> str:
    """``moment`` (seconds since the epoch) as RFC 3339 UTC, to the second."""
    return dt.datetime.fromtimestamp(moment, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def record_name(uid: str) -> str:
    return RECORD_PREFIX + uid


def record_object(record: CheckpointRecord) -> dict[str, Any]:
    """The ``PodCheckpoint`` the service creates for ``record`` (its status is written
    next, through the status subresource)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": RECORD_KIND,
        "metadata": {"name": record.name, "labels": {**MANAGED_BY, NODE_LABEL: record.node}},
        "spec": record.spec(),
    }


def node_object(node: str) -> dict[str, Any]:
    """The ``CheckpointNode`` an agent creates for its node, named after it."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": NODE_KIND,
        "metadata": {"name": node, "labels": {**MANAGED_BY, NODE_LABEL: node}},
        "spec": {"node": node},
    }


def image_reference(namespace: str, pod: str, container: str, uid: str) -> str:
    """``localhost/resize-preemption-checkpoint/<ns>/<pod>/<container>:<first 12 of uid>``."""
    return f"{IMAGE_REPOSITORY}/{namespace}/{pod}/{container}:{uid[:12]}".lower()


def parse_rfc3339(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time, ``None`` when it is not one."""
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def local_image(image: str) -> bool:
    """Whether ``image`` is a checkpoint image its agent kept in its node's runtime, which
    no other node has and no registry serves."""
    return image.startswith(IMAGE_REPOSITORY + "/")


def own_image(image: str, namespace: str, pod: str, container: str, uid: str) -> bool:
    """Whether ``image`` is the checkpoint image of ``container`` of pod ``uid``, as its
    agent names it: in its node's runtime (:func:`image_reference`) or under a registry
    repository, ``<repository>/<ns>/<pod>/<container>:<uid[:12]>``. Which registries a pod
    may name is the chart's pod policy's to say (the service has no such setting)."""
    local = image_reference(namespace, pod, container, uid)
    if image == local:
        return True
    path = local.removeprefix(IMAGE_REPOSITORY)
    return not local_image(image) and image.endswith(path) and len(image) > len(path) + 1


def restore_refusal(record: CheckpointRecord) -> str:
    """Why ``record`` must not be restored; ``""`` when it may. A record is restored
    only as the service took it: its pod's uid is the record's, its pod was on the
    record's node, and every container has an archive and comes back from its own
    checkpoint image, none other (an agent writes ``status.images``; what it names is
    checked here, not trusted)."""
    meta = record.pod.get("metadata") or {}
    spec = record.pod.get("spec") or {}
    if not (record.namespace and record.pod_name) or meta.get("uid") != record.uid:
        return f"its pod is not the pod {record.uid} it was taken of"
    if spec.get("nodeName") != record.node:
        return f"its pod did not run on its node {record.node}"
    names = [str(c.get("name", "")) for c in spec.get("containers") or () if isinstance(c, Mapping)]
    if not names or set(names) != set(record.archives) or set(names) != set(record.images):
        return "not every container of its pod has a checkpoint archive and image"
    for name in names:
        if not own_image(record.images[name], record.namespace, record.pod_name, name, record.uid):
            return f"container {name}'s image {record.images[name]} is not its checkpoint's"
    return ""


def pull_policy(image: str) -> str:
    """``Never`` for an image only its node's runtime holds (a pull would fail), else
    ``IfNotPresent``: pulled from its registry unless the node has it already."""
    return "Never" if local_image(image) else "IfNotPresent"


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


def restored_pod(record: CheckpointRecord, node: str) -> dict[str, Any]:
    """The pod to create again from ``record`` on ``node``: the same namespace, name,
    labels, annotations (plus :data:`RESTORED_FROM_ANNOTATION`) and spec, bound to
    ``node``, each checkpointed container started from its checkpoint image
    (:func:`pull_policy`). Raises ``ValueError`` for a node other than the record's when
    the record is not :attr:`~CheckpointRecord.portable`: no other node has its images.

    containerd restores at container creation when the image is a checkpoint image; the
    image holds no command, so the container's own process arguments (read from the
    archive by the agent) become its ``command``."""
    if node != record.node and not record.portable:
        raise ValueError(f"{record.name} can come back on {record.node} only, not on {node}")
    pod = copy.deepcopy(dict(record.pod))
    meta = {k: v for k, v in pod.get("metadata", {}).items() if k not in _SERVER_FIELDS}
    meta["annotations"] = {
        **meta.get("annotations", {}),
        RESTORED_FROM_ANNOTATION: record.name,
    }
    spec = dict(pod.get("spec", {}))
    spec["nodeName"] = node
    containers = []
    for c in spec.get("containers", []):
        c = dict(c)
        if c.get("name") in record.images:
            c["image"] = record.images[c["name"]]
            c["imagePullPolicy"] = pull_policy(c["image"])
            c["command"] = list(record.commands.get(c["name"], c.get("command", [])))
            c["args"] = []
        containers.append(c)
    spec["containers"] = containers
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


# -- where a checkpointed pod comes back ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Return:
    """Where a checkpointed pod comes back now: ``node``, or nowhere yet (``""``), and why."""

    node: str
    why: str


def only_its_node(record: CheckpointRecord, pod: Pod) -> str:
    """Why ``record``'s pod (``pod``, parsed from the record) may come back on its own
    node only; empty when any node able to restore may take it."""
    if not record.portable:
        return f"its images are in {record.node}'s runtime only"
    if pod.placement.unknown:
        return f"its {pod.placement.unknown} cannot be judged on another node"
    if _host_bound(record.pod.get("spec") or {}):
        return "its host ports cannot be judged on another node"
    return ""


def _host_bound(spec: Mapping[str, Any]) -> bool:
    """Whether the pod holds ports of its node's network, which another pod may hold on
    another node (the kubelet then rejects it): the scheduler judges that, not we."""
    if spec.get("hostNetwork"):
        return True
    containers = [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]
    return any(
        isinstance(port, Mapping) and port.get("hostPort")
        for c in containers
        if isinstance(c, Mapping)
        for port in c.get("ports") or ()
    )


def _free(room: Room, taken: Mapping[str, Resources]) -> Resources:
    return (room.free - taken.get(room.node, ZERO)).clamp()


def comes_back_on(
    record: CheckpointRecord,
    pod: Pod,
    home: Room | None,
    rooms: Iterable[Room],
    able: Collection[str],
    taken: Mapping[str, Resources] | None = None,
) -> Return:
    """Where the checkpointed pod of ``record`` (``pod``, parsed from it) comes back now.

    ``home`` is the room of its own node (``record.node``; ``None`` when that node takes
    no pods), ``rooms`` those of other nodes, all from
    :func:`~webhook.core.movable.room_on` (every pod, active reservations and what other
    plans promised their victims' replacements counted); ``able`` the nodes whose agent
    says they can checkpoint and restore (:attr:`NodeCheckpointing.able`); ``taken`` what
    restores already decided in this pass hold on each node, beyond its room.

    1. Its own node, whenever its placement still allows it there (taints it does not
       tolerate never) and the pod's requests fit: no other node is looked at.
    2. Else, only when no :func:`only_its_node` reason holds (every image in a registry,
       a placement judged from the node alone, no host ports): among ``rooms`` of nodes
       other than its own, in ``able``, that its placement allows
       (:func:`~webhook.core.movable.allows`: nodeSelector, required node affinity,
       taints) and where its requests fit, the roomiest (most free CPU, then memory, then
       the name), as kube-scheduler's default scoring spreads pods.
    3. Else nowhere yet: ``Return("", why)``; the caller asks again on its next pass.

    A portable pod does not wait for its own node first. Its node was full when it was
    paused, and room there returns only when the resize that took it shrinks back or
    another pod leaves, which may be never; every pass it waits is a pass its work does
    not run, and an operator who configured a registry asked for it to come back
    elsewhere. Its own node still wins whenever it has room in the same pass: nothing
    moves, and its image may be there already."""
    taken = taken or {}
    needs = pod_requests(pod)
    barred = home is not None and not allows(pod.placement, home)
    if home is not None and not barred and needs.fits_in(_free(home, taken)):
        return Return(record.node, f"its node {record.node} has room")
    refused = only_its_node(record, pod)
    if refused:
        held = f"{record.node} does not allow it now" if barred else f"no room on {record.node} yet"
        return Return("", f"{held}; {refused}")
    fitting = [
        (-free.cpu, -free.memory, room.node)
        for room in rooms
        if room.node != record.node and room.node in able and allows(pod.placement, room)
        for free in (_free(room, taken),)
        if needs.fits_in(free)
    ]
    if not fitting:
        return Return("", f"no room on {record.node}, nor on another node able to restore")
    node = min(fitting)[2]
    return Return(node, f"no room on {record.node}; {node} has room and can restore")
