"""Pod manifests the tests, the demo's neighbours and the benchmarks create on local nodes.

The hollow nodes run no containers, so their pods are the pause image; what differs from
one caller to the next is its size, its priority and how long its stop may take. On the
real node a pod runs the workload image's shell script (:func:`workload_pod`)."""

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


def workload_pod(
    name: str,
    image: str,
    priority_class: str,
    resources: Mapping[str, Mapping[str, str]],
    *,
    node: str,
    script: str,
    container: str = "app",
    grace_seconds: int = 30,
    dns_policy: str | None = None,
) -> dict[str, Any]:
    """A pod of one container running ``script`` under ``sh -c`` in ``image``, bound to
    ``node``; ``resources`` is the container's (``requests``, ``limits``). ``dns_policy``
    ``Default`` gives it the node's resolver, for a node without cluster DNS."""
    spec: dict[str, Any] = {
        "nodeName": node,
        "priorityClassName": priority_class,
        "terminationGracePeriodSeconds": grace_seconds,
    }
    if dns_policy is not None:
        spec["dnsPolicy"] = dns_policy
    spec["containers"] = [
        {
            "name": container,
            "image": image,
            "command": ["sh", "-c", script],
            "resources": {k: dict(v) for k, v in resources.items()},
        }
    ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
