"""Pod manifests the tests, the demo's neighbours and the benchmarks create on local nodes.

The local nodes run no containers, so every pod is the pause image; what differs from
one caller to the next is its size, its priority and how long its stop may take."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

PAUSE_IMAGE: Final = "registry.k8s.io/pause:3.10"


def guaranteed_pod(
    name: str,
    cpu: str,
    priority_class: str,
    *,
    node: str,
    memory: str = "256Mi",
    grace_seconds: int | None = 1,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Guaranteed pod (requests equal limits) of one ``app`` container, bound to
    ``node`` and labelled ``app=<name>``. ``grace_seconds`` is its
    ``terminationGracePeriodSeconds`` (``None``: the API server's default, 30 s)."""
    resources = {"cpu": cpu, "memory": memory}
    metadata: dict[str, Any] = {"name": name, "labels": {"app": name}}
    if annotations:
        metadata["annotations"] = dict(annotations)
    spec: dict[str, Any] = {"nodeName": node, "priorityClassName": priority_class}
    if grace_seconds is not None:
        spec["terminationGracePeriodSeconds"] = grace_seconds
    spec["containers"] = [
        {
            "name": "app",
            "image": PAUSE_IMAGE,
            "resources": {"requests": resources, "limits": dict(resources)},
        }
    ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
