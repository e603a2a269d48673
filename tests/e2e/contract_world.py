"""The world the port contract suites act in: the same objects stored either in memory
(for the doubles) or in the real API server (for the real implementations).

A contract test creates its objects through a :class:`World` and reads them back through
the world's :meth:`~World.view`: a :class:`~webhook.engine.memory.FixedClusterView` of
what the memory world stores, kept current as it changes, or the watch-fed
:class:`~webhook.kube.cache.ClusterCache` of the real API server. Reads through the
real cache trail the writes by a watch event: :func:`eventually` polls.

Pods are bound to nodes by name; a node no kubelet serves (:func:`ghost`) keeps a pod
where a test puts it: Pending until the test writes its status, terminating for good once
deleted (no kubelet confirms it).
"""

from __future__ import annotations

import copy
import itertools
import secrets
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest

from harness.kubeapi import ApiError
from webhook.core.model import LOANS_ANNOTATION, Pod
from webhook.core.objects import parse_node
from webhook.core.snapshot import load_snapshot
from webhook.engine.ledger import ClusterView
from webhook.engine.memory import NAME_LABEL, FixedClusterView

#: Seconds the real cache may take to show a write.
SEEN_WITHIN = 10.0

Obj = dict[str, Any]


def ghost() -> str:
    """A node name no kubelet serves, unique to the caller."""
    return f"ghost-{secrets.token_hex(3)}"


def eventually(read: Callable[[], Any], expected: Any, what: str) -> None:
    """Polls ``read()`` until it returns ``expected``, for at most :data:`SEEN_WITHIN` s."""
    deadline = time.monotonic() + SEEN_WITHIN
    while (got := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert expected == got, what


# -- objects ---------------------------------------------------------------------------------


def pod_doc(
    name: str,
    node: str,
    *,
    cpu: str = "1",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    phase: str = "",
    priority_class: str = "",
    conditions: Sequence[Obj] = (),
) -> Obj:
    """A one-container pod bound to ``node`` (``""``: bound to none, and no scheduler
    will bind it); ``phase`` (with ``Ready`` for ``Running``) and ``conditions`` are
    written as its status, none leaves it Pending."""
    resources = {"cpu": cpu, "memory": "128Mi"}
    spec: Obj = {
        "terminationGracePeriodSeconds": 30,
        "containers": [
            {
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": resources, "limits": resources},
            }
        ],
    }
    if node:
        spec["nodeName"] = node
    else:
        spec["schedulerName"] = "no-such-scheduler"
    if priority_class:
        spec["priorityClassName"] = priority_class
    meta: Obj = {"name": name, "labels": dict(labels or {"app": name})}
    if annotations:
        meta["annotations"] = dict(annotations)
    doc: Obj = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    status: Obj = {}
    if phase:
        ready = "True" if phase == "Running" else "False"
        status = {"phase": phase, "conditions": [{"type": "Ready", "status": ready}]}
    if conditions:
        status["conditions"] = [*status.get("conditions", ()), *conditions]
    if status:
        doc["status"] = status
    return doc


def node_doc(name: str, cpu: str = "8", memory: str = "16Gi") -> Obj:
    capacity = {"cpu": cpu, "memory": memory, "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"contract": "yes"}},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pdb_doc(name: str, selector: Mapping[str, str]) -> Obj:
    """A budget allowing no disruption of the pods ``selector`` selects."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": dict(selector)}, "maxUnavailable": 0},
    }


def namespace_doc(name: str, labels: Mapping[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": dict(labels or {})},
    }


def priority_class_doc(name: str, value: int) -> Obj:
    return {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


def path_of(doc: Mapping[str, Any], namespace: str) -> str:
    """The collection ``doc`` is created in."""
    kind = doc["kind"]
    if kind == "Pod":
        return f"/api/v1/namespaces/{namespace}/pods"
    if kind == "PodDisruptionBudget":
        return f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"
    if kind == "Node":
        return "/api/v1/nodes"
    if kind == "Namespace":
        return "/api/v1/namespaces"
    if kind == "PriorityClass":
        return "/apis/scheduling.k8s.io/v1/priorityclasses"
    raise ValueError(f"no path for {kind}")


NAMESPACED = ("Pod", "PodDisruptionBudget")


# -- the two worlds -------------------------------------------------------------------------


class World(Protocol):
    #: The view's kind: "fixed", "StaticClusterView" or "cache".
    kind: str
    namespace: str

    def create(self, doc: Obj, namespace: str = "") -> Obj:
        """``doc`` stored (in ``namespace``, default the test's); the stored object."""
        ...

    def delete_pod(self, name: str, *, grace: int | None = None) -> None: ...

    def stored_pod(self, name: str, namespace: str = "") -> Obj | None: ...

    def view(self) -> ClusterView:
        """The view of this world the implementations under test read."""
        ...

    def pod(self, name: str, namespace: str = "") -> Pod | None:
        """``name`` as the view holds it once it has seen the last write to it."""
        ...

    def close(self) -> None: ...


class _Current:
    """A :class:`FixedClusterView` of the memory world as it is now (rebuilt at each
    change), as the cache is of the API server."""

    def __init__(self, world: MemoryWorld) -> None:
        self._world = world

    def __getattr__(self, name: str) -> Any:
        return getattr(self._world.fixed, name)


class MemoryWorld:
    """Objects kept in memory as the API server keeps them: a uid, a resourceVersion from
    one counter, the name label on a namespace, a deletion timestamp on a pod deleted
    with a grace period on a node no kubelet serves."""

    def __init__(self, namespace: str, view: type[FixedClusterView] = FixedClusterView) -> None:
        #: The double's class: FixedClusterView or its subclass the unit tests turn.
        self.kind = "fixed" if view is FixedClusterView else view.__name__
        self._view = view
        self.namespace = namespace
        self._objects: dict[tuple[str, str, str], Obj] = {}
        self._versions = itertools.count(1)
        self.fixed = FixedClusterView()
        self.create(namespace_doc(namespace))

    def _stamp(self, doc: Obj) -> None:
        doc["metadata"]["resourceVersion"] = str(next(self._versions))

    def _rebuild(self) -> None:
        self.fixed = self._view.from_snapshot(load_snapshot(self._objects.values()))

    def create(self, doc: Obj, namespace: str = "") -> Obj:
        stored = copy.deepcopy(doc)
        meta = stored["metadata"]
        if stored["kind"] in NAMESPACED:
            meta["namespace"] = namespace or self.namespace
        if stored["kind"] == "Namespace":
            meta.setdefault("labels", {})[NAME_LABEL] = meta["name"]
        if stored["kind"] == "PodDisruptionBudget":
            # As the disruption controller counts it: maxUnavailable 0 allows none.
            stored["status"] = {"disruptionsAllowed": 0}
        meta["uid"] = str(uuid.uuid4())
        self._stamp(stored)
        self._objects[(stored["kind"], meta.get("namespace", ""), meta["name"])] = stored
        self._rebuild()
        return stored

    def delete_pod(self, name: str, *, grace: int | None = None) -> None:
        key = ("Pod", self.namespace, name)
        stored = self._objects[key]
        if grace == 0:
            del self._objects[key]
        else:
            stored["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
            self._stamp(stored)
        self._rebuild()

    def stored_pod(self, name: str, namespace: str = "") -> Obj | None:
        return self._objects.get(("Pod", namespace or self.namespace, name))

    def view(self) -> ClusterView:
        return _Current(self)  # type: ignore[return-value]

    def pod(self, name: str, namespace: str = "") -> Pod | None:
        return self.fixed.pod(namespace or self.namespace, name)

    def close(self) -> None:
        pass


class ApiWorld:
    """Objects stored in the real API server, read back through a
    :class:`~webhook.kube.cache.ClusterCache` started on it. Cluster-scoped objects and
    namespaces it created are removed at :meth:`close`."""

    kind = "cache"

    def __init__(self, cluster: Any, namespace: str) -> None:
        from webhook.base.settings import Config
        from webhook.kube.cache import ClusterCache
        from webhook.kube.client import make_api_client

        self.cluster, self.namespace = cluster, namespace
        self._created: list[str] = []
        self.cache = ClusterCache(make_api_client(str(cluster.kubeconfig)), Config())
        self.cache.start()
        assert self.cache.wait_synced(30), "the cache did not sync"

    def create(self, doc: Obj, namespace: str = "") -> Obj:
        body = copy.deepcopy(doc)
        status = body.pop("status", None)
        path = path_of(body, namespace or self.namespace)
        stored: Obj = self.cluster.client.create(path, body)
        name = stored["metadata"]["name"]
        if body["kind"] not in NAMESPACED:
            self._created.append(f"{path}/{name}")
        if body["kind"] == "Node":
            # The API server taints a new node not-ready; the node lifecycle controller
            # (not run here) lifts it once the node is Ready, as the status written says.
            stored = self.cluster.client.patch(f"{path}/{name}", {"spec": {"taints": None}})
        if status is not None:
            stored = self.cluster.client.patch(f"{path}/{name}/status", {"status": status})
        self._seen(stored, namespace)
        return stored

    def _seen(self, stored: Obj, namespace: str) -> None:
        """Waits for the cache to hold ``stored`` (a pod or node at its version)."""
        name = stored["metadata"]["name"]
        version = stored["metadata"]["resourceVersion"]
        if stored["kind"] == "Pod":
            eventually(
                lambda: getattr(self.pod(name, namespace), "resource_version", None),
                version,
                f"the cache to see pod {name}",
            )
        elif stored["kind"] == "Node":
            node = parse_node(stored)
            eventually(lambda: self.cache.node(name), node, f"the cache to see node {name}")
        elif stored["kind"] == "Namespace":
            eventually(
                lambda: self.cache.namespace_labels(name) is not None, True, f"namespace {name}"
            )
        elif stored["kind"] == "PodDisruptionBudget":
            key = f"{namespace or self.namespace}/{name}"
            eventually(lambda: self.cache.budgets_store.get(key) is not None, True, f"budget {key}")

    def delete_pod(self, name: str, *, grace: int | None = None) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods/{name}"
        body = None if grace is None else {"gracePeriodSeconds": grace}
        self.cluster.client.delete(path, body)
        if grace == 0:
            eventually(lambda: self.pod(name) is None, True, f"the cache to lose {name}")
        else:
            eventually(
                lambda: getattr(self.pod(name), "terminating", None),
                True,
                f"the cache to see {name} terminating",
            )

    def stored_pod(self, name: str, namespace: str = "") -> Obj | None:
        found: Obj | None = self.cluster.client.get_or_none(
            f"/api/v1/namespaces/{namespace or self.namespace}/pods/{name}"
        )
        return found

    def view(self) -> ClusterView:
        return self.cache

    def pod(self, name: str, namespace: str = "") -> Pod | None:
        return self.cache.pod(namespace or self.namespace, name)

    def close(self) -> None:
        self.cache.stop()
        for path in reversed(self._created):
            if path.startswith("/api/v1/namespaces/"):
                from tests.e2e.conftest import _remove_namespace

                _remove_namespace(self.cluster, path.rsplit("/", 1)[1])
                continue
            try:
                self.cluster.client.delete(path)
            except ApiError as e:
                if e.status != 404:
                    raise


WORLDS = [
    pytest.param("fixed", id="fixed"),
    pytest.param("static", id="fixed-static"),
    pytest.param("cache", id="cache", marks=pytest.mark.e2e),
]


def make_world(request: pytest.FixtureRequest, kind: str = "") -> Iterator[World]:
    """The world of ``kind`` (default ``request.param``): in memory on a made-up
    namespace, seen through a :class:`FixedClusterView` ("fixed") or the unit tests'
    :class:`~harness.doubles.StaticClusterView` ("static"), or the real API server on
    the test's fresh namespace ("cache")."""
    kind = kind or request.param
    if kind in ("fixed", "static"):
        from harness.doubles import StaticClusterView

        view = FixedClusterView if kind == "fixed" else StaticClusterView
        subject: World = MemoryWorld(f"contract-{secrets.token_hex(3)}", view)
    else:
        subject = ApiWorld(request.getfixturevalue("cluster"), request.getfixturevalue("namespace"))
    try:
        yield subject
    finally:
        subject.close()


def names(pods: Sequence[Pod], namespace: str) -> list[str]:
    """The names of ``pods`` in ``namespace``, sorted."""
    return sorted(p.name for p in pods if p.namespace == namespace)


def loans_annotation(text: str) -> dict[str, str]:
    return {LOANS_ANNOTATION: text}


def unreachable_kubeconfig(cluster: Any, tmp: Path) -> str:
    """A copy of ``cluster``'s kubeconfig whose server nothing listens on."""
    text = cluster.kubeconfig.read_text()
    server = next(
        line.split("server:")[1].strip() for line in text.splitlines() if "server:" in line
    )
    bad = tmp / "unreachable.kubeconfig"
    bad.write_text(text.replace(server, "https://127.0.0.1:1"))
    return str(bad)
