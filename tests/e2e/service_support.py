"""Builders and readers shared by the end-to-end tests of the webhook service.

Everything here talks to the real API server (through kubectl or the harness's JSON
client) or reads the files the real processes write: the service's log (its JSON decision
lines), the API server's audit log and the service's ``/metrics``.
"""

from __future__ import annotations

import copy
import json
import secrets
import ssl
import subprocess
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from harness.kubeapi import ApiError
from harness.manifests import guaranteed_pod
from harness.webhook_process import NAMESPACE, WEBHOOK_NAME
from tests.e2e.conftest import NODE, Cluster, Kubectl
from webhook.core.resources import cpu_millis
from webhook.kube.ledger import LEDGER_ANNOTATION, lease_name

LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"


def account_kubeconfig(cluster: Cluster, namespace: str, account: str, where: Path) -> Path:
    """A kubeconfig of ``cluster`` holding an hour's token of ServiceAccount
    ``namespace/account``, written in directory ``where``."""
    import yaml

    token = cluster.client.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 3600}},
    )["status"]["token"]  # fmt: skip
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path = where / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def pod_manifest(
    name: str,
    cpu: str,
    priority_class: str,
    *,
    memory: str = "256Mi",
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Guaranteed pod bound to node-1, labelled ``app=<name>``."""
    return guaranteed_pod(
        name, cpu, priority_class, node=NODE, memory=memory, annotations=annotations
    )


def run_pods(kubectl: Kubectl, pods: Iterable[Mapping[str, Any]]) -> None:
    """Create the pods and wait until the kubelet reports them Ready and Running."""
    items = list(pods)
    kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )
    names = [f"pod/{p['metadata']['name']}" for p in items]
    kubectl("wait", "--for=condition=Ready", *names, "--timeout=30s")
    wait_running(kubectl, *names)


def wait_running(kubectl: Kubectl, *names: str) -> None:
    """Wait until the kubelet reports ``names`` (``pod/NAME``) Running. The hollow
    kubelet's first status of a new pod can say Ready while its phase is still Pending
    (its container waiting); the Eviction API lets a Pending pod go whatever its budget
    says (``canIgnorePDB`` in pkg/registry/core/pod/storage/eviction.go), so a test that
    expects a budget to refuse an eviction waits for Running."""
    kubectl("wait", "--for=jsonpath={.status.phase}=Running", *names, "--timeout=30s")


def resize_patch(cpu: str) -> str:
    resources = {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}
    return json.dumps({"spec": {"containers": [{"name": "app", "resources": resources}]}})


def resize(kubectl: Kubectl, name: str, cpu: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """``kubectl patch pod NAME --subresource resize`` to ``cpu`` (requests = limits).

    Never raises on a non-zero exit: the caller asserts on the outcome.
    """
    return kubectl(
        "patch",
        "pod",
        name,
        "--subresource",
        "resize",
        "--patch",
        resize_patch(cpu),
        *flags,
        check=False,
    )


def kubectl_warnings(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The ``Warning: ...`` lines kubectl printed (the AdmissionResponse's warnings)."""
    prefix = "Warning: "
    return [line[len(prefix) :] for line in result.stderr.splitlines() if line.startswith(prefix)]


def as_warning(text: str) -> str:
    """``text`` as a warning of the service: at most 120 characters, cut with "..."."""
    return text if len(text) <= 120 else text[:117] + "..."


def read_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    pod: dict[str, Any] | None = cluster.client.get_or_none(
        f"/api/v1/namespaces/{namespace}/pods/{name}"
    )
    return pod


def pods_on_node(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.client.get(f"/api/v1/namespaces/{namespace}/pods")[
        "items"
    ]
    return [p for p in items if p["spec"].get("nodeName") == NODE]


def spec_cpu(pod: Mapping[str, Any]) -> str:
    return str(pod["spec"]["containers"][0]["resources"]["requests"]["cpu"])


def actual_cpu(pod: Mapping[str, Any] | None) -> str | None:
    """``status.containerStatuses[0].resources.requests.cpu``: what the kubelet actuated."""
    statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
    return statuses[0].get("resources", {}).get("requests", {}).get("cpu") if statuses else None


def actual_millicores(pod: Mapping[str, Any]) -> int:
    """Actuated cpu requests of every container, in millicores."""
    total = 0
    for status in pod.get("status", {}).get("containerStatuses") or []:
        total += cpu_millis(status.get("resources", {}).get("requests", {}).get("cpu", "0"))
    return total


def resize_pending(pod: Mapping[str, Any] | None) -> str | None:
    """The reason of the pod's ``PodResizePending`` condition (``Deferred``...), if any."""
    for condition in (pod or {}).get("status", {}).get("conditions") or []:
        if condition.get("type") == "PodResizePending" and condition.get("status") == "True":
            return str(condition.get("reason"))
    return None


def terminating(pod: Mapping[str, Any] | None) -> bool:
    return bool(pod and pod["metadata"].get("deletionTimestamp"))


def events(kubectl: Kubectl, name: str, reason: str) -> list[dict[str, Any]]:
    """``kubectl get events --field-selector involvedObject.name=NAME`` with ``reason``."""
    out = kubectl("get", "events", "--field-selector", f"involvedObject.name={name}", "-o", "json")
    return [e for e in json.loads(out.stdout)["items"] if e.get("reason") == reason]


# -- the ledger (Leases in the service's namespace) ---------------------------------------


def ledger_entries(cluster: Cluster, node: str = NODE) -> list[dict[str, Any]]:
    """The entries of ``node``'s ledger Lease as stored in the API server (none: [])."""
    try:
        lease = cluster.client.get(f"{LEASES}/{lease_name(node)}")
    except ApiError as e:
        if e.status == 404:
            return []
        raise
    raw = (lease["metadata"].get("annotations") or {}).get(LEDGER_ANNOTATION) or "[]"
    entries: list[dict[str, Any]] = json.loads(raw)
    return entries


def entries_of(entries: Iterable[Mapping[str, Any]], namespace: str) -> list[Mapping[str, Any]]:
    return [e for e in entries if e["pod"]["namespace"] == namespace]


def clear_ledger(cluster: Cluster, node: str = NODE) -> None:
    """Remove ``node``'s ledger Lease (only while no service runs)."""
    try:
        cluster.client.delete(f"{LEASES}/{lease_name(node)}")
    except ApiError as e:
        if e.status != 404:
            raise


# -- what the processes wrote --------------------------------------------------------------


def decision_lines(log: Path, namespace: str, endpoint: str = "validate") -> list[dict[str, Any]]:
    """The service's JSON decision-log lines of ``endpoint`` (``validate``, ``mutate``,
    ``reconcile``) about pods of ``namespace``."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(record, dict)
            and record.get("endpoint") == endpoint
            and str(record.get("pod", "")).startswith(f"{namespace}/")
        ):
            found.append(record)
    return found


def audit_annotations(audit_log: Path, namespace: str, name: str) -> list[dict[str, str]]:
    """Annotations of the audit events of resizes (``patch``/``update`` of ``pods/resize``)
    of NAMESPACE/NAME."""
    found = []
    if not audit_log.exists():
        return found
    for line in audit_log.read_text(errors="replace").splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if (
            ref.get("subresource") == "resize"
            and ref.get("namespace") == namespace
            and ref.get("name") == name
            and event.get("stage") == "ResponseComplete"
            and event.get("verb") in ("patch", "update")
        ):
            found.append(event.get("annotations") or {})
    return found


def webhook_audit(annotations: Mapping[str, str]) -> dict[str, str]:
    """Our webhook's audit annotations, without the ``<webhook name>/`` prefix."""
    prefix = f"{WEBHOOK_NAME}/"
    return {k[len(prefix) :]: v for k, v in annotations.items() if k.startswith(prefix)}


def scrape(metrics_port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``GET /metrics``: sample (name, sorted labels) -> value."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def sample(
    samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


# -- reviews from callers other than the API server -------------------------------------


def forged_review(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """An AdmissionReview of ``pods/resize`` as kube-apiserver would send it, made by
    someone else: whatever ``old`` and ``new`` say (its namespace and name ``old``'s, the
    stored pod's, as the API server's would be)."""
    meta = old["metadata"]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"forged-{secrets.token_hex(4)}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "resize",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "operation": "UPDATE",
            "userInfo": {"username": "system:serviceaccount:default:default"},
            "object": new,
            "oldObject": old,
            "dryRun": False,
        },
    }


def post_review(url: str, context: ssl.SSLContext, body: Mapping[str, Any]) -> dict[str, Any]:
    """POST ``body`` to the review port at ``url`` as any caller on the pod network may;
    the AdmissionReview answered."""
    request = urllib.request.Request(
        f"{url}/validate-resize",
        data=orjson.dumps(body),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, context=context, timeout=5) as response:
        answer: dict[str, Any] = orjson.loads(response.read())
    return answer


def with_cpu(pod: Mapping[str, Any], cpu: str) -> dict[str, Any]:
    out = copy.deepcopy(dict(pod))
    for c in out["spec"]["containers"]:
        c["resources"] = {**c["resources"], "requests": {**c["resources"]["requests"], "cpu": cpu}}
        c["resources"]["limits"] = {**c["resources"]["limits"], "cpu": cpu}
    return out
