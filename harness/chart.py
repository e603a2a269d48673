"""Installing the product with its Helm chart, as an operator does: ``helm install`` of
``deploy/helm/resize-preemption-webhook`` with the chart's own certificates, then waiting
until its pods serve behind the Service.

Only a node with containers runs the chart's pods (:mod:`harness.realnode`); helm itself
comes from ``scripts/build-tools.sh``.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from harness.binaries import REPO_ROOT
from harness.kubeapi import ApiError, KubeClient
from harness.launcher import webhook_client_files

CHART = REPO_ROOT / "deploy" / "helm" / "resize-preemption-webhook"
BUILD_TOOLS = REPO_ROOT / "scripts" / "build-tools.sh"
#: The release name the docs install (``helm install rpw ... -n resize-preemption-system``).
RELEASE = "rpw"
NAMESPACE = "rpw-system"
#: The chart's name, which is the pods' ``app.kubernetes.io/name`` label.
NAME = "resize-preemption-webhook"
#: Every object is named ``<release>-<chart>``: the release name does not contain the chart's.
FULLNAME = f"{RELEASE}-{NAME}"


class ChartError(RuntimeError):
    """helm failed, or the release's pods did not become ready; the message says why."""


@cache
def helm_binary() -> Path:
    """Path of helm, built on first use by scripts/build-tools.sh (then cached)."""
    result = subprocess.run(
        ["bash", str(BUILD_TOOLS)], capture_output=True, text=True, timeout=1800, check=False
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise ChartError(f"{BUILD_TOOLS.name} failed:\n{result.stderr}")
    return Path(lines[-1]) / "helm"


def set_args(values: Mapping[str, Any]) -> list[str]:
    """``--set-json key=value`` for each dotted key (values go in as JSON, typed)."""
    out: list[str] = []
    for key, value in values.items():
        out += ["--set-json", f"{key}={json.dumps(value)}"]
    return out


def operator_values(pin_node: str | None, client_ca: bytes | None = None) -> dict[str, Any]:
    """What an operator sets on this cluster, and nothing more: the chart's own certificates
    (no cert-manager here), the image built and imported locally, reviews only from kube-apiserver
    (``client_ca``: the CA of the client certificate it presents to webhooks) and - when
    some nodes run no containers - the pods pinned to the node that does."""
    # The image is the local build, imported into the node's containerd by name.
    values: dict[str, Any] = {"certificates.mode": "self-signed", "image.localBuild": True}
    if client_ca is not None:
        values["clientAuth.enabled"] = True
        values["clientAuth.caBundle"] = client_ca.decode()
    if pin_node is not None:
        values["nodeSelector"] = {"kubernetes.io/hostname": pin_node}
    return values


@dataclass(frozen=True)
class Release:
    """An installed release: its namespace and how long the install took until ready."""

    namespace: str
    replicas: int
    ready_in: float

    @property
    def service(self) -> str:
        return f"{FULLNAME}.{self.namespace}.svc"


def install(
    client: KubeClient,
    kubeconfig: Path,
    *,
    pin_node: str | None = None,
    extra_values: Mapping[str, Any] | None = None,
    namespace: str = NAMESPACE,
    timeout: float = 180.0,
) -> Release:
    """``helm upgrade --install`` the chart and wait until every replica is ready and listed
    in the Service's EndpointSlices (what kube-apiserver calls); raises ChartError."""
    began = time.monotonic()
    files = webhook_client_files(kubeconfig.parent)
    client_ca = files.ca.read_bytes() if files.ca.is_file() else None
    values = {**operator_values(pin_node, client_ca), **(extra_values or {})}
    run_helm(
        kubeconfig,
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", namespace,
        "--create-namespace", *set_args(values),
    )  # fmt: skip
    replicas = wait_ready(client, namespace, timeout)
    # kube-apiserver's webhook informer has to see the new configuration too.
    time.sleep(1.0)
    return Release(namespace, replicas, time.monotonic() - began)


def agent_daemonset(
    kubeconfig: Path, node: str, values: Mapping[str, Any], namespace: str = NAMESPACE
) -> dict[str, Any]:
    """The chart's node agent DaemonSet rendered with ``values`` (``helm template``), for
    ``node`` alone: named ``<agent>-<node>``, selecting its own pods, pinned to the node.

    For a node whose paths differ from those the release's agent has (another real node
    of this machine): the release's DaemonSet stays on its own node, this one runs beside
    it with the same account, Secret and CA."""
    rendered = run_helm(
        kubeconfig,
        "template", RELEASE, str(CHART), "--namespace", namespace,
        "--show-only", "templates/checkpoint-agent.yaml",
        *set_args({**values, "checkpoint.nodeSelector": {"kubernetes.io/hostname": node}}),
    )  # fmt: skip
    (daemonset,) = (d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "DaemonSet")
    daemonset["metadata"]["name"] = f"{daemonset['metadata']['name']}-{node}"
    for labels in (
        daemonset["spec"]["selector"]["matchLabels"],
        daemonset["spec"]["template"]["metadata"]["labels"],
    ):
        labels["resize-preemption.io/node"] = node
    return dict(daemonset)


def uninstall(kubeconfig: Path, namespace: str = NAMESPACE) -> None:
    run_helm(kubeconfig, "uninstall", RELEASE, "--namespace", namespace, "--ignore-not-found")


def run_helm(kubeconfig: Path, *args: str, timeout: float = 180) -> str:
    result = subprocess.run(
        [str(helm_binary()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        check=False,
    )
    if result.returncode != 0:
        raise ChartError(f"helm {' '.join(args[:2])} failed:\n{result.stderr.strip()}")
    return result.stdout


def wait_ready(client: KubeClient, namespace: str, timeout: float) -> int:
    """Wait until the Deployment's replicas are all available and ready behind the Service;
    returns how many there are."""
    deadline = time.monotonic() + timeout
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{FULLNAME}"
    while True:
        deployment = client.get_or_none(path) or {}
        wanted = deployment.get("spec", {}).get("replicas")
        status = deployment.get("status", {})
        ready = wanted is not None and status.get("availableReplicas") == wanted
        if ready and ready_endpoints(client, namespace) >= wanted:
            return int(wanted)
        if _crashing(client, namespace):
            raise ChartError("the chart's pods keep exiting:\n" + describe_pods(client, namespace))
        if time.monotonic() > deadline:
            raise ChartError(
                f"the chart's pods were not ready after {timeout:.0f} s:\n"
                + describe_pods(client, namespace)
            )
        time.sleep(0.5)


def _crashing(client: KubeClient, namespace: str, restarts: int = 2) -> bool:
    """A container of the release restarted ``restarts`` times: waiting longer shows nothing
    new."""
    pods = client.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    return any(
        c.get("restartCount", 0) >= restarts
        for p in pods
        for c in p.get("status", {}).get("containerStatuses") or []
    )


def ready_endpoints(client: KubeClient, namespace: str) -> int:
    """Ready endpoints of the Service's https port, over its EndpointSlices."""
    slices = client.get(
        f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
        labelSelector=f"kubernetes.io/service-name={FULLNAME}",
    )["items"]
    return sum(
        1
        for s in slices
        for e in s.get("endpoints") or []
        if (e.get("conditions") or {}).get("ready")
    )


def describe_pods(client: KubeClient, namespace: str) -> str:
    """One line per pod of the namespace: phase, and why a container is not running."""
    lines = []
    for pod in client.get(f"/api/v1/namespaces/{namespace}/pods")["items"]:
        status = pod.get("status", {})
        reasons = []
        for c in status.get("containerStatuses") or []:
            for state in (c.get("state") or {}).values():
                if state.get("reason"):
                    reasons.append(f"{state['reason']}: {state.get('message', '')}".strip())
        for condition in status.get("conditions") or []:
            if condition.get("status") == "False" and condition.get("message"):
                reasons.append(condition["message"])
        lines.append(f"  {pod['metadata']['name']}: {status.get('phase')} {'; '.join(reasons)}")
        if any(c.get("restartCount") for c in status.get("containerStatuses") or []):
            lines.append(_last_log(client, namespace, pod["metadata"]["name"]))
    return "\n".join(lines) or "  (no pods)"


def _last_log(client: KubeClient, namespace: str, name: str) -> str:
    """The tail of the previous run's log of a restarted container, indented."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}/log"
    try:
        text = str(client.request("GET", path, query={"previous": "true", "tailLines": "15"}))
    except (ApiError, OSError) as e:
        text = f"(no log: {e})"
    return "\n".join(f"    | {line}" for line in text.splitlines())
