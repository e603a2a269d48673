"""The chart's tools for tests: helm (built by scripts/build-tools.sh) and helpers to render
deploy/helm/resize-preemption-webhook into objects."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from harness.chart import CHART, helm_binary, set_args

REPO = Path(__file__).resolve().parents[2]
#: The defaults reproduce the kustomize manifests under this release name and namespace.
RELEASE = "resize-preemption-webhook"
NAMESPACE = "resize-preemption-system"
KUBE_VERSION = "1.37.2"
#: The local build of ``make image``, as the harness's nodes have it: every render names
#: it unless a test says otherwise (the chart refuses an unnamed image without it).
LOCAL_BUILD = {"image.localBuild": True}
#: Labels only Helm puts on objects (``rpw.helmLabels``); everything else is deploy/'s.
HELM_LABELS = frozenset(
    {
        "app.kubernetes.io/instance",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/version",
        "helm.sh/chart",
    }
)


def helm(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm_binary()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def template(
    values: dict[str, Any] | None = None,
    *,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    extra: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    return helm(
        "template", release, str(CHART), "--kube-version", KUBE_VERSION,
        "--namespace", namespace, *set_args({**LOCAL_BUILD, **(values or {})}), *extra,
    )  # fmt: skip


def render(values: dict[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    result = template(values, **kwargs)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def without_helm_labels(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with Helm's own labels removed from its metadata (and an emptied
    ``labels`` dropped)."""
    metadata = dict(obj["metadata"])
    labels = {k: v for k, v in metadata.get("labels", {}).items() if k not in HELM_LABELS}
    if labels:
        metadata["labels"] = labels
    else:
        metadata.pop("labels", None)
    return {**obj, "metadata": metadata}


def key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def by_key(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    return {key(o): o for o in objects}
