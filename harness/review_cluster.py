"""The review benchmark's cluster and review, shared by the review and flood benchmarks and
their tests: a full node of 110 pods of mixed priorities (Pod objects as the API server
stores them, managed fields included), its budgets and PriorityClasses, and the
``pods/resize`` AdmissionReview kube-apiserver sends for growing one of them."""

from __future__ import annotations

import copy
import json
import random
import uuid
from datetime import UTC, datetime
from typing import Any

NODE = "bench-node"
PODS_ON_NODE = 110
T0 = 1_700_000_000.0
PREEMPTOR = "resizing-app-7d9c6b5f4-x2x9q"
#: The review's uid in the body; the client puts a fresh one in every request, so each
#: is a new admission (a ledger write), not the API server retrying one review.
REVIEW_UID = "705ab4f5-6393-11e8-b7cc-42010a800002"


def _time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _container(name: str, cpu: str, memory: str, *, limits: bool) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if limits:
        resources["limits"] = {"cpu": cpu, "memory": memory}
    return {
        "name": name,
        "image": f"registry.example.com/{name}:1.27.3",
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
        "env": [{"name": f"SETTING_{k}", "value": f"value-{k}"} for k in range(8)]
        + [
            {
                "name": "POD_NAME",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
            }
        ],
        "resources": resources,
        "resizePolicy": [
            {"resourceName": "cpu", "restartPolicy": "NotRequired"},
            {"resourceName": "memory", "restartPolicy": "NotRequired"},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
            "periodSeconds": 10,
            "timeoutSeconds": 1,
            "successThreshold": 1,
            "failureThreshold": 3,
        },
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/app"},
            {
                "name": "kube-api-access",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True,
            },
        ],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


def pod_object(
    name: str,
    namespace: str,
    priority: int,
    cpu: str,
    memory: str,
    *,
    started: float,
    sidecar: bool = False,
) -> dict[str, Any]:
    """A Pod as the API server stores it: managed fields, probes, env, volumes, status."""
    app = name.rsplit("-", 2)[0]
    containers = [_container("app", cpu, memory, limits=True)]
    if sidecar:
        containers.append(_container("proxy", "100m", "128Mi", limits=True))
    statuses = [
        {
            "name": c["name"],
            "ready": True,
            "started": True,
            "restartCount": 0,
            "image": c["image"],
            "imageID": f"{c['image']}@sha256:{'ab' * 32}",
            "containerID": f"containerd://{'cd' * 32}",
            "state": {"running": {"startedAt": _time(started)}},
            # Copies: a resize changes the spec's resources, never what the kubelet
            # reports (and the JSON the API server sends shares nothing).
            "allocatedResources": dict(c["resources"]["requests"]),
            "resources": copy.deepcopy(c["resources"]),
        }
        for c in containers
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            # Deterministic: the server and this process build the same objects.
            "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{namespace}.{name}")),
            "resourceVersion": "4817263",
            "generation": 3,
            "creationTimestamp": _time(started - 5),
            "generateName": name.rsplit("-", 1)[0] + "-",
            "labels": {
                "app.kubernetes.io/name": app,
                "app.kubernetes.io/part-of": namespace,
                "pod-template-hash": "7d9c6b5f4",
            },
            "annotations": {"kubectl.kubernetes.io/restartedAt": _time(started - 60)},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": name.rsplit("-", 1)[0],
                    "uid": "3f1c0000-0000-4000-8000-000000000001",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": _time(started - 5),
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:generateName": {}, "f:labels": {".": {}}},
                        "f:spec": {"f:containers": {'k:{"name":"app"}': {".": {}}}},
                    },
                },
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": _time(started),
                    "fieldsType": "FieldsV1",
                    "subresource": "status",
                    "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}}},
                },
            ],
        },
        "spec": {
            "nodeName": NODE,
            "priority": priority,
            "priorityClassName": f"tier-{priority}",
            "preemptionPolicy": "PreemptLowerPriority",
            "schedulerName": "default-scheduler",
            "serviceAccountName": "default",
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "enableServiceLinks": True,
            "containers": containers,
            "volumes": [
                {"name": "config", "configMap": {"name": f"{app}-config", "defaultMode": 420}},
                {
                    "name": "kube-api-access",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt"}},
                        ],
                    },
                },
            ],
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
        },
        "status": {
            "phase": "Running",
            "qosClass": "Guaranteed",
            "hostIP": "10.0.0.17",
            "podIP": "10.244.3.41",
            "startTime": _time(started),
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": _time(started)}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")
            ],
            "containerStatuses": statuses,
        },
    }


def cluster_objects(seed: int = 5836) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A full node: 109 pods of mixed priorities in 10 namespaces plus the resizing one.

    Returns (objects for the view, the resizing pod). The node's allocatable is what the
    pods hold plus 500m CPU, so growing the resizing pod by 1 CPU preempts one 500m pod.
    """
    rng = random.Random(seed)
    namespaces = [f"team-{k}" for k in range(10)]
    tiers = (0, 1000, 5000, 2_000_000_000)  # the last outranks the resizing pod
    objects: list[dict[str, Any]] = []
    held = 0
    for i in range(PODS_ON_NODE - 1):
        tier = rng.choices(tiers, (3, 4, 3, 1))[0]
        cpu = 500 if tier == 0 else rng.choice((250, 500, 750))
        held += cpu + (100 if i % 5 == 0 else 0)
        objects.append(
            pod_object(
                f"svc-{i % 17}-7d9c6b5f4-{i:05d}",
                rng.choice(namespaces),
                tier,
                f"{cpu}m",
                f"{rng.choice((256, 512, 1024))}Mi",
                started=T0 + rng.randrange(0, 80_000),
                sidecar=i % 5 == 0,
            )
        )
    resizing = pod_object(PREEMPTOR, "team-0", 1_000_000, "2", "4Gi", started=T0)
    held += 2000
    budgets = [
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": f"svc-{k}-pdb", "namespace": ns},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": f"svc-{k}"}}},
            "status": {"disruptionsAllowed": rng.randrange(3)},
        }
        for k, ns in enumerate(namespaces)
    ]
    classes = [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": f"tier-{v}"},
            "value": v,
        }
        for v in (*tiers, 1_000_000)
    ]
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {"kubernetes.io/os": "linux"}},
        "status": {
            "allocatable": {"cpu": f"{held + 500}m", "memory": "512Gi", "pods": "110"},
        },
    }
    return [node, *classes, *budgets, *objects, resizing], resizing


#: Who sends the benchmark's resize: an autoscaler's service account.
AUTOSCALER = {
    "username": "system:serviceaccount:team-0:autoscaler",
    "uid": "c1f2e3d4-0000-4000-8000-000000000002",
    "groups": [
        "system:serviceaccounts",
        "system:serviceaccounts:team-0",
        "system:authenticated",
    ],
}


def resize_review(
    old: dict[str, Any], cpu: str, user: dict[str, Any], generation: int | None = None
) -> bytes:
    """The AdmissionReview kube-apiserver sends for ``kubectl patch --subresource resize``
    of the stored pod ``old`` to ``cpu`` (requests and limits of its first container), with
    :data:`REVIEW_UID` as its uid (clients splice a fresh one into each request)."""
    new = copy.deepcopy(old)
    for section in ("requests", "limits"):
        new["spec"]["containers"][0]["resources"][section]["cpu"] = cpu
    if generation is None:
        generation = int(old["metadata"].get("generation", 1)) + 1
    new["metadata"]["generation"] = generation
    pod = {"group": "", "version": "v1", "kind": "Pod"}
    pods = {"group": "", "version": "v1", "resource": "pods"}
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": REVIEW_UID,
            "kind": pod,
            "resource": pods,
            "subResource": "resize",
            "requestKind": pod,
            "requestResource": pods,
            "requestSubResource": "resize",
            "name": old["metadata"]["name"],
            "namespace": old["metadata"]["namespace"],
            "operation": "UPDATE",
            "userInfo": user,
            "object": new,
            "oldObject": old,
            "dryRun": False,
            "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }
    return json.dumps(review, separators=(",", ":")).encode()


def review_body(resizing: dict[str, Any]) -> bytes:
    """``kubectl patch --subresource resize`` growing the pod from 2 to 3 CPU."""
    return resize_review(resizing, "3", AUTOSCALER, generation=4)
