"""Checkpoint records and node reports as the tests write and read them on the API server:
``PodCheckpoint`` and ``CheckpointNode`` objects (docs/checkpoint.md), written as the
service and the node agents write them (the spec once, then the status through its
subresource)."""

from __future__ import annotations

from typing import Any

from harness.kubeapi import ApiError, KubeClient
from webhook.core.checkpoint import (
    GROUP,
    NODES,
    RECORDS,
    VERSION,
    CheckpointRecord,
    NodeCheckpointing,
    node_object,
    record_object,
)


def records_path(namespace: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{RECORDS}"


def nodes_path(namespace: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{NODES}"


def put_record(client: KubeClient, namespace: str, record: CheckpointRecord) -> None:
    """Create ``record`` (a record there already keeps its spec) and write its status."""
    path = records_path(namespace)
    try:
        client.create(path, record_object(record))
    except ApiError as e:
        if e.status != 409:
            raise
    client.patch(f"{path}/{record.name}/status", {"status": record.status()})


def publish(client: KubeClient, namespace: str, ability: NodeCheckpointing, now: float) -> None:
    """What ``ability.node``'s agent publishes."""
    try:
        client.create(nodes_path(namespace), node_object(ability.node))
    except ApiError as e:
        if e.status != 409:
            raise
    client.patch(f"{nodes_path(namespace)}/{ability.node}/status", {"status": ability.status(now)})


def status_of(client: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    """The status of record ``name``; ``{}`` when it is gone."""
    found = client.get_or_none(f"{records_path(namespace)}/{name}") or {}
    status: dict[str, Any] = found.get("status") or {}
    return status


def remove(client: KubeClient, path: str) -> None:
    """Delete ``path``; gone already is fine."""
    try:
        client.delete(path)
    except ApiError as e:
        if e.status != 404:
            raise
