"""CustomResourceDefinitions the harness installs: the project's own (the checkpoint
records and node reports the chart ships in ``crds/``, which ``helm install`` installs
and a control plane of the harness gets at its start, so that a service run as a
process finds them too) and any other manifest's (the VPA's, :mod:`harness.vpa`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from harness.binaries import REPO_ROOT
from harness.kubeapi import ApiError, KubeClient

CRDS_PATH: Final = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
#: The chart's own: PodCheckpoint and CheckpointNode (docs/checkpoint.md).
PROJECT_CRDS: Final = (
    REPO_ROOT
    / "deploy"
    / "helm"
    / "resize-preemption-webhook"
    / "crds"
    / "resize-preemption.io.yaml"
)


class CrdError(RuntimeError):
    """A CustomResourceDefinition was not established in time."""


def install_crds(client: KubeClient, manifest: Path, *, timeout: float = 30.0) -> list[str]:
    """Create the CustomResourceDefinitions of ``manifest`` (those that exist are left as
    they are) and wait until each is Established; returns their names."""
    names = []
    for crd in yaml.safe_load_all(manifest.read_text()):
        if not crd or crd.get("kind") != "CustomResourceDefinition":
            continue
        name = crd["metadata"]["name"]
        names.append(name)
        try:
            client.create(CRDS_PATH, crd)
        except ApiError as e:
            if e.status != 409:
                raise
    deadline = time.monotonic() + timeout
    for name in names:
        while not _established(client.get(f"{CRDS_PATH}/{name}")):
            if time.monotonic() > deadline:
                raise CrdError(f"CustomResourceDefinition {name} not established in {timeout} s")
            time.sleep(0.1)
    return names


def _established(crd: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Established" and c.get("status") == "True"
        for c in crd.get("status", {}).get("conditions") or []
    )
