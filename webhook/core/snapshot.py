"""A cluster snapshot from standard Kubernetes objects, and planning a resize on it.

Accepts what ``kubectl get -o yaml|json`` prints: single objects, ``List`` objects and
typed lists (``PodList``...), already decoded. Kinds other than Node, Pod,
PodDisruptionBudget, PriorityClass and Namespace are ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from webhook.core.accounting import Reservation
from webhook.core.checkpoint import Pause
from webhook.core.errors import LookupFailed, ObjectError
from webhook.core.model import DisruptionBudget, Namespace, Node, Pod, PriorityClass
from webhook.core.movable import rooms_elsewhere
from webhook.core.objects import (
    PriorityResolver,
    parse_namespace,
    parse_node,
    parse_pdb,
    parse_pod,
    parse_priority_class,
)
from webhook.core.plan import NodePods, Plan, plan_resize
from webhook.core.policy import PreemptionPolicy, VictimOrder
from webhook.core.resize import apply_resize

_KINDS = ("Node", "Pod", "PodDisruptionBudget", "PriorityClass", "Namespace")


def _flatten(documents: Iterable[object]) -> Iterable[Mapping[str, Any]]:
    for i, doc in enumerate(documents):
        if doc is None:
            continue  # an empty YAML document, e.g. a trailing '---'
        if not isinstance(doc, Mapping):
            raise ObjectError(f"document {i + 1} is not a Kubernetes object")
        kind = doc.get("kind")
        if isinstance(kind, str) and kind.endswith("List"):
            items = doc.get("items") or []
            if not isinstance(items, list):
                raise ObjectError(f"document {i + 1}: {kind}.items must be a list")
            item_kind = kind[: -len("List")]
            for item in items:
                if isinstance(item, Mapping) and "kind" not in item and item_kind in _KINDS:
                    item = {**item, "kind": item_kind}
                yield from _flatten([item])
        else:
            yield doc


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: Mapping[str, Node]
    pods: tuple[Pod, ...]
    pod_objects: Mapping[str, Mapping[str, Any]]  # raw Pod objects by "namespace/name"
    budgets: tuple[DisruptionBudget, ...]
    priority_classes: tuple[PriorityClass, ...]
    #: ``None`` when the documents hold no Namespace (a snapshot of pods alone).
    namespaces: tuple[Namespace, ...] | None = None

    def pods_on(self, node: str) -> tuple[Pod, ...]:
        return tuple(p for p in self.pods if p.node == node)


def load_snapshot(documents: Iterable[object]) -> Snapshot:
    """Build a :class:`Snapshot`; raises :class:`ObjectError` on malformed objects."""
    by_kind: dict[str, list[Mapping[str, Any]]] = {k: [] for k in _KINDS}
    for obj in _flatten(documents):
        kind = obj.get("kind")
        if kind in by_kind:
            by_kind[str(kind)].append(obj)
    classes = tuple(parse_priority_class(o) for o in by_kind["PriorityClass"])
    resolver = PriorityResolver(classes)
    pods = tuple(parse_pod(o, resolver) for o in by_kind["Pod"])
    raw = {p.key: o for p, o in zip(pods, by_kind["Pod"], strict=True)}
    nodes = {n.name: n for n in (parse_node(o) for o in by_kind["Node"])}
    budgets = tuple(parse_pdb(o) for o in by_kind["PodDisruptionBudget"])
    namespaces = tuple(parse_namespace(o) for o in by_kind["Namespace"]) or None
    return Snapshot(nodes, pods, raw, budgets, classes, namespaces)


def plan_snapshot_resize(
    snapshot: Snapshot,
    pod_key: str,
    patch: Mapping[str, Any],
    *,
    now: float,
    policy: PreemptionPolicy | None = None,
    reservations: Iterable[Reservation] = (),
    victim_order: VictimOrder = "upstream",
    pause: Callable[[Pod], Pause | None] | None = None,
) -> Plan:
    """Plan ``patch`` (a resize patch) for pod ``namespace/name`` of ``snapshot``, with
    the snapshot's other nodes as the room elsewhere for ``movable-first``; ``pause``
    judges which victims are checkpointed."""
    raw = snapshot.pod_objects.get(pod_key)
    if raw is None:
        raise LookupFailed(f"no pod {pod_key} in the snapshot")
    resolver = PriorityResolver(snapshot.priority_classes)
    old = parse_pod(raw, resolver)
    new = parse_pod(apply_resize(raw, patch), resolver)
    node = snapshot.nodes.get(old.node)
    if old.node and node is None:
        raise LookupFailed(f"pod {pod_key} is on node {old.node}, which is not in the snapshot")
    if node is None:
        node = Node(name="", allocatable=old.overhead)
    reservations = tuple(reservations)
    elsewhere = None
    if victim_order == "movable-first":
        by_node: dict[str, list[Pod]] = {}
        for p in snapshot.pods:
            by_node.setdefault(p.node, []).append(p)
        elsewhere = rooms_elsewhere(
            snapshot.nodes.values(), by_node, reservations, now, exclude=node.name
        )
    return plan_resize(
        old,
        new,
        NodePods(node, snapshot.pods_on(node.name)),
        now=now,
        budgets=snapshot.budgets,
        reservations=reservations,
        policy=policy,
        elsewhere=elsewhere,
        pause=pause,
    )
