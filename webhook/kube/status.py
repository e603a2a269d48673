"""What the service is doing now, read from the API server with a viewer's rights.

``python -m webhook status`` and ``plan --kubeconfig`` read here: the objects a plan
needs (Nodes, Pods, PodDisruptionBudgets, PriorityClasses, and the Namespaces whose labels
the preemptor policy reads), the ledger's Leases and the leader-election Lease. Every
request is a GET; nothing is cached or written, and no watch is opened. The verbs and
resources are those of the ``resize-preemption-webhook-viewer`` ClusterRole
(deploy/base/rbac.yaml): ``get``/``list`` on nodes, pods, namespaces, poddisruptionbudgets,
priorityclasses, and on leases in the webhook's namespace.

Errors are :mod:`webhook.kube.errors` classes: :class:`~webhook.kube.errors.Unavailable`
when the API server cannot be reached, :class:`~webhook.kube.errors.Forbidden` when the
rights are missing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote

from kubernetes.client import ApiClient

from webhook.core.checkpoint import CheckpointRecord, NodeCheckpointing
from webhook.core.errors import InputError, ObjectError
from webhook.core.objects import parse_time
from webhook.engine.ledger import LedgerEntry
from webhook.engine.status import Leader
from webhook.kube.checkpoints import abilities_in, list_items, records_in
from webhook.kube.errors import Forbidden, NotFound
from webhook.kube.jsonapi import request_json
from webhook.kube.leader import LEADER_LEASE, LeaderRecord
from webhook.kube.ledger import LABEL_SELECTOR, parse_lease

#: Objects per page of a list: a large cluster's pods come in several pages.
PAGE: Final = 500
#: (connect, read) seconds per request: a person waits for the answer.
TIMEOUT: Final = (5.0, 30.0)

_LISTS: Final = (
    ("Node", "/api/v1/nodes"),
    ("Pod", "/api/v1/pods"),
    ("PodDisruptionBudget", "/apis/policy/v1/poddisruptionbudgets"),
    ("PriorityClass", "/apis/scheduling.k8s.io/v1/priorityclasses"),
    ("Namespace", "/api/v1/namespaces"),
)


@dataclass(frozen=True, slots=True)
class LiveState:
    """One read of the cluster. ``objects``: Nodes, Pods, PodDisruptionBudgets,
    PriorityClasses and Namespaces, each with its ``kind`` (what ``kubectl get -o json`` prints);
    ``entries``: the ledger's entries of the nodes read; ``leader``: the election
    record, ``None`` when there is no leader Lease."""

    objects: tuple[Mapping[str, Any], ...]
    entries: tuple[LedgerEntry, ...]
    leader: Leader | None
    #: Checkpoint records, and what each node's agent says its node can do: empty when
    #: there are none, or when the reader may not list the namespace's ConfigMaps.
    checkpoints: tuple[CheckpointRecord, ...] = ()
    abilities: Mapping[str, NodeCheckpointing] = field(default_factory=dict)


def _items(api: ApiClient, kind: str, path: str, query: Mapping[str, str]) -> Iterator[Any]:
    token = ""
    while True:
        page = dict(query, limit=str(PAGE))
        if token:
            page["continue"] = token
        answer = request_json(api, "GET", path, query=page, timeout=TIMEOUT)
        for item in answer.get("items") or ():
            if isinstance(item, dict):
                yield {**item, "kind": kind}
        meta = answer.get("metadata")
        token = meta.get("continue", "") if isinstance(meta, Mapping) else ""
        if not token:
            return


def read_pod(api: ApiClient, namespace: str, name: str) -> Mapping[str, Any]:
    """One Pod; raises :class:`NotFound` when there is none."""
    path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}"
    return {**request_json(api, "GET", path, timeout=TIMEOUT), "kind": "Pod"}


def read_live(api: ApiClient, *, namespace: str, node: str | None = None) -> LiveState:
    """Read everything :class:`LiveState` holds; with ``node``, only that node, the pods
    bound to it and its ledger entries (budgets and priority classes always whole); node
    ``""`` reads the pods bound to no node.
    ``namespace``: the webhook's, where its Leases are."""
    objects: list[Mapping[str, Any]] = []
    for kind, path in _LISTS:
        query: dict[str, str] = {}
        if node is not None and kind == "Node":
            query["fieldSelector"] = f"metadata.name={node}"
        if node is not None and kind == "Pod":
            query["fieldSelector"] = f"spec.nodeName={node}"
        objects.extend(_items(api, kind, path, query))
    leases = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"
    entries: list[LedgerEntry] = []
    for lease in _items(api, "Lease", leases, {"labelSelector": LABEL_SELECTOR}):
        try:
            state = parse_lease(lease)
        except ObjectError:
            continue  # not a ledger Lease the service could read either
        if node is None or state.node == node:
            entries.extend(state.entries)
    try:
        spec = request_json(api, "GET", f"{leases}/{LEADER_LEASE}", timeout=TIMEOUT).get("spec")
    except NotFound:
        leader = None
    else:
        leader = _leader(LeaderRecord.from_spec(spec if isinstance(spec, Mapping) else {}))
    records, abilities = _checkpoints(api, namespace)
    return LiveState(tuple(objects), tuple(entries), leader, records, abilities)


def _checkpoints(
    api: ApiClient, namespace: str
) -> tuple[tuple[CheckpointRecord, ...], dict[str, NodeCheckpointing]]:
    """The checkpoint records and node abilities in ``namespace``; none when the reader
    may not list them (the viewer Role grants it) or the cluster has not their kinds."""
    try:
        items = list_items(api, namespace)
    except (Forbidden, NotFound):
        return (), {}
    return tuple(records_in(items)), {a.node: a for a in abilities_in(items)}


def _leader(record: LeaderRecord) -> Leader:
    try:
        renewed = parse_time(record.renew_time or None, "leader lease", "renewTime")
    except InputError:
        renewed = None  # an unreadable time reads as never renewed: no live leader
    return Leader(record.holder, renewed, record.lease_duration_seconds, record.transitions)


__all__ = ["LiveState", "read_live", "read_pod"]
