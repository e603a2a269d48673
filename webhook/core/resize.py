"""Applying a resize patch, as ``kubectl patch --subresource resize`` sends it, and
reading the resize a review asks for off the pod the API server stored.

The patch is a strategic merge patch restricted to what the resize subresource accepts:
``spec.containers[*].resources`` / ``resizePolicy`` and ``spec.initContainers[*]`` (matched
by name), and pod-level ``spec.resources``. ``requests`` and ``limits`` merge key by key.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from webhook.core.errors import ResizeError
from webhook.core.model import KEPT_ANNOTATION_PREFIXES, Container, Pod
from webhook.core.resources import parse_quantity

_CONTAINER_FIELDS = frozenset({"name", "resources", "resizePolicy"})
_SPEC_FIELDS = frozenset({"containers", "initContainers", "resources"})


def _merge_resources(target: dict[str, Any], patch: object, where: str) -> None:
    if not isinstance(patch, Mapping):
        raise ResizeError(f"{where} must be an object")
    for kind, values in patch.items():
        if kind not in ("requests", "limits"):
            raise ResizeError(f"{where}.{kind}: only requests and limits can be resized")
        if not isinstance(values, Mapping):
            raise ResizeError(f"{where}.{kind} must be an object")
        merged = dict(target.get(kind) or {})
        for resource, quantity in values.items():
            if quantity is None:
                raise ResizeError(f"{where}.{kind}.{resource}: a resize cannot remove it")
            if resource not in ("cpu", "memory"):
                raise ResizeError(f"{where}.{kind}.{resource}: only cpu and memory can be resized")
            merged[resource] = quantity
        target[kind] = merged


def _within_limits(resources: Mapping[str, Any], whose: str) -> None:
    """Refuse, as the API server's validation does, a request above its limit."""
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    for name in ("cpu", "memory"):
        if name not in requests or name not in limits:
            continue
        asked = parse_quantity(requests[name], where=f"{whose} requests.{name}")
        if asked > parse_quantity(limits[name], where=f"{whose} limits.{name}"):
            raise ResizeError(
                f"{whose}: requests.{name} {requests[name]} is above limits.{name} "
                f"{limits[name]}; the API server refuses a request above its limit"
            )


def _resources_of(target: dict[str, Any], where: str) -> dict[str, Any]:
    """``target["resources"]``, created when absent or null (``resources:`` left empty)."""
    resources = target.get("resources")
    if resources is None:
        resources = target["resources"] = {}
    if not isinstance(resources, dict):
        raise ResizeError(f"{where} of the pod is not an object")
    return resources


def _patch_containers(pod_spec: dict[str, Any], field: str, patches: object) -> None:
    if not isinstance(patches, list):
        raise ResizeError(f"spec.{field} must be a list")
    containers = pod_spec.get(field) or []
    by_name = {c.get("name"): c for c in containers if isinstance(c, dict)}
    for i, patch in enumerate(patches):
        where = f"spec.{field}[{i}]"
        if not isinstance(patch, Mapping):
            raise ResizeError(f"{where} must be an object")
        name = patch.get("name")
        if not isinstance(name, str) or not name:
            raise ResizeError(f"{where}: every container in a resize patch needs a name")
        target = by_name.get(name)
        if target is None:
            known = ", ".join(sorted(str(n) for n in by_name)) or "none"
            raise ResizeError(f"{where}: the pod has no {field[:-1]} named {name!r} (has: {known})")
        extra = set(patch) - _CONTAINER_FIELDS
        if extra:
            raise ResizeError(f"{where}: cannot resize {', '.join(sorted(extra))}")
        if "resources" in patch:
            resources = _resources_of(target, f"{where}.resources")
            _merge_resources(resources, patch["resources"], f"{where}.resources")
            _within_limits(resources, f"{field[:-1]} {name!r}")
        if "resizePolicy" in patch:
            target["resizePolicy"] = copy.deepcopy(patch["resizePolicy"])


def apply_resize(pod: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ``pod`` (a Pod object) with the resize ``patch`` applied.

    Raises :class:`ResizeError` for a patch naming a container the pod lacks, removing a
    request, or touching anything a resize cannot change.
    """
    if not isinstance(patch, Mapping):
        raise ResizeError("the resize patch must be a JSON object")
    extra = set(patch) - {"spec", "metadata"}
    if extra:
        raise ResizeError(f"a resize patch can only change spec, not {', '.join(sorted(extra))}")
    spec_patch = patch.get("spec") or {}
    if not isinstance(spec_patch, Mapping):
        raise ResizeError("spec must be an object")
    extra = set(spec_patch) - _SPEC_FIELDS
    if extra:
        raise ResizeError(f"a resize cannot change spec.{', spec.'.join(sorted(extra))}")
    result = copy.deepcopy(dict(pod))
    spec = result.setdefault("spec", {})
    if not isinstance(spec, dict):
        raise ResizeError("the pod's spec is not an object")
    for field in ("containers", "initContainers"):
        if field in spec_patch:
            _patch_containers(spec, field, spec_patch[field])
    if "resources" in spec_patch:
        resources = _resources_of(spec, "spec.resources")
        _merge_resources(resources, spec_patch["resources"], "spec.resources")
        _within_limits(resources, "the pod's spec.resources")
    return result


def _kept(annotations: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in annotations.items() if k.startswith(KEPT_ANNOTATION_PREFIXES)}


def _names(containers: tuple[Container, ...]) -> tuple[tuple[str, bool], ...]:
    return tuple((c.name, c.sidecar) for c in containers)


def _owner(pod: Pod) -> tuple[str, str]:
    return pod.controller, pod.controller_uid


def _differences(stored: Pod, claimed: Pod) -> list[str]:
    """What ``claimed`` says of the pod that ``stored`` does not, resources aside."""
    fields = (
        ("uid", stored.uid, claimed.uid),
        ("namespace", stored.namespace, claimed.namespace),
        ("name", stored.name, claimed.name),
        ("node", stored.node, claimed.node),
        ("priority", stored.priority, claimed.priority),
        ("preemption policy", stored.preemption_policy, claimed.preemption_policy),
        ("owner", _owner(stored), _owner(claimed)),
        ("annotations", _kept(stored.annotations), _kept(claimed.annotations)),
        ("containers", _names(stored.containers), _names(claimed.containers)),
        ("init containers", _names(stored.init_containers), _names(claimed.init_containers)),
        ("overhead", stored.overhead, claimed.overhead),
    )
    out = [name for name, ours, theirs in fields if ours != theirs]
    # The API server raises the generation once when a resize changes the spec; a review
    # claiming another would set when the entry counts as superseded.
    if claimed.generation not in (stored.generation, stored.generation + 1):
        out.append("generation")
    return out


def resize_of(stored: Pod, claimed: Pod) -> Pod | str:
    """The resize a review asks for, on the pod the API server stored: ``stored`` (as
    the cluster view holds it) with the container and pod-level requests and limits of
    ``claimed`` (the review's ``object``), and its generation. A review's body is a claim:
    anything else it says is read from ``stored``, and a ``claimed`` pod that differs from
    it in anything but those resources is not this pod's resize: the text says in what.

    Annotations compare as far as a cached pod keeps them
    (:data:`~webhook.core.model.KEPT_ANNOTATION_PREFIXES`): the only ones a decision reads.
    """
    differs = _differences(stored, claimed)
    if differs:
        return "the review's object differs from the stored pod in " + ", ".join(differs)
    return replace(
        stored,
        containers=claimed.containers,
        init_containers=claimed.init_containers,
        pod_requests=claimed.pod_requests,
        pod_limits=claimed.pod_limits,
        generation=claimed.generation,
    )
