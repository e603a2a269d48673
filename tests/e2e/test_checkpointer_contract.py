"""The checkpointer port's contract, one suite for the double and the kubelet's API.

Every test runs over each checkpointer, through the ``subject`` fixture:
:class:`harness.doubles.FakeCheckpointer` over pods kept in memory ("fixed"), and
:class:`webhook.kube.checkpoints.KubeletCheckpointer` calling the real kubelet of node-1
(containerd, CRIU) for pods that run there ("kubelet"). Together they prove that a
checkpointer (:class:`~webhook.engine.pauses.Checkpointer`):

* checkpoints every container of a running victim, each into an archive the kubelet names
  ``checkpoint-<pod>_<namespace>-<container>-<time>.tar``, and answers the pod as read
  (its uid, its spec) and its own grace period;
* checkpoints nothing for a victim gone, or replaced under its name (the uid differs);
* checkpoints nothing when the grace period leaves less than a second, and says so;
* checkpoints nothing on a node that does not exist;
* never raises: every refusal is a message.

``-k fixed`` runs the double's half without a control plane.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.doubles import FakeCheckpointer
from harness.realnode import NODE_NAME
from tests.e2e.contract_world import MemoryWorld, node_doc
from webhook.core.model import PodRef
from webhook.engine.pauses import Checkpointer

#: Counts in a shell variable, as every victim here: a process CRIU can dump.
COUNTER = "n=0; while true; do n=$((n+1)); sleep 1; done"


def pod_doc(name: str, containers: tuple[str, ...], grace: int, image: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeName": NODE_NAME,
            "terminationGracePeriodSeconds": grace,
            "containers": [
                {
                    "name": c,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", COUNTER],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                }
                for c in containers
            ],
        },
    }


@dataclass
class Subject:
    namespace: str
    checkpointer: Checkpointer
    #: Creates a pod and returns it as stored once it runs.
    run: Callable[[dict[str, Any]], dict[str, Any]]
    #: Whether an archive the checkpointer answered is there to read.
    archived: Callable[[str], bool]


def _fixed() -> Iterator[Subject]:
    world = MemoryWorld("contract")
    world.create(node_doc(NODE_NAME))

    def run(doc: dict[str, Any]) -> dict[str, Any]:
        return world.create(doc)

    def stored(namespace: str, name: str) -> Any:
        return world.stored_pod(name, namespace)

    yield Subject("contract", FakeCheckpointer(pods=stored, view=world.view()), run, bool)


def _kubelet(request: pytest.FixtureRequest) -> Iterator[Subject]:
    from webhook.kube.checkpoints import KubeletCheckpointer
    from webhook.kube.client import make_api_client

    cluster = request.getfixturevalue("real_cluster")
    namespace = request.getfixturevalue("real_namespace")
    api = make_api_client(str(cluster.kubeconfig))
    pods = f"/api/v1/namespaces/{namespace}/pods"
    archives: list[Path] = []

    def run(doc: dict[str, Any]) -> dict[str, Any]:
        cluster.client.create(pods, doc)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            pod = cluster.client.get(f"{pods}/{doc['metadata']['name']}")
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if statuses and all("running" in s.get("state", {}) for s in statuses):
                return dict(pod)
            time.sleep(0.2)
        raise TimeoutError(f"{doc['metadata']['name']} did not run in 120 s")

    def archived(path: str) -> bool:
        archives.append(Path(path))
        return Path(path).is_file()

    try:
        yield Subject(namespace, KubeletCheckpointer(api), run, archived)
    finally:
        for path in archives:
            path.unlink(missing_ok=True)
        api.close()


@pytest.fixture(
    params=[
        pytest.param("fixed", id="fixed"),
        pytest.param("kubelet", id="kubelet", marks=[pytest.mark.e2e, pytest.mark.realnode]),
    ]
)
def subject(request: pytest.FixtureRequest) -> Iterator[Subject]:
    if request.param == "fixed":
        yield from _fixed()
    else:
        yield from _kubelet(request)


@pytest.fixture
def image(subject: Subject, request: pytest.FixtureRequest) -> str:
    """busybox on the real node (root, as CRIU needs here); any name for the double."""
    if isinstance(subject.checkpointer, FakeCheckpointer):
        return "busybox"
    return str(request.getfixturevalue("real_cluster").image("workload"))


def ref(pod: dict[str, Any], uid: str | None = None) -> PodRef:
    meta = pod["metadata"]
    return PodRef(meta["namespace"], meta["name"], meta["uid"] if uid is None else uid)


def test_every_container_of_a_running_victim(subject: Subject, image: str) -> None:
    pod = subject.run(pod_doc("victim", ("main", "side"), 5, image))
    got = subject.checkpointer.checkpoint(ref(pod), NODE_NAME)
    assert "" == got.message
    assert {"main", "side"} == set(got.archives)
    for container, path in got.archives.items():
        name = Path(path).name
        assert name.startswith(f"checkpoint-victim_{subject.namespace}-{container}-"), name
        assert name.endswith(".tar"), name
        assert subject.archived(path), path
    assert pod["metadata"]["uid"] == got.pod["metadata"]["uid"]
    assert ["main", "side"] == [c["name"] for c in got.pod["spec"]["containers"]]
    assert "status" not in got.pod
    assert 5 == got.grace
    assert got.seconds >= 0


def test_a_victim_replaced_under_its_name(subject: Subject, image: str) -> None:
    pod = subject.run(pod_doc("victim", ("main",), 5, image))
    got = subject.checkpointer.checkpoint(ref(pod, uid="uid-of-an-earlier-pod"), NODE_NAME)
    assert {} == dict(got.archives)
    assert "the victim was replaced meanwhile" == got.message


def test_a_victim_gone(subject: Subject) -> None:
    got = subject.checkpointer.checkpoint(PodRef(subject.namespace, "gone", "uid"), NODE_NAME)
    assert {} == dict(got.archives)
    assert "not found" in got.message


def test_a_grace_period_with_no_time_to_checkpoint(subject: Subject, image: str) -> None:
    pod = subject.run(pod_doc("victim", ("main",), 0, image))
    got = subject.checkpointer.checkpoint(ref(pod), NODE_NAME)
    assert {} == dict(got.archives)
    assert 0 == got.grace
    assert "its grace period (0s) leaves no time to checkpoint container main" == got.message


def test_a_node_that_does_not_exist(subject: Subject, image: str) -> None:
    pod = subject.run(pod_doc("victim", ("main",), 5, image))
    got = subject.checkpointer.checkpoint(ref(pod), "no-such-node")
    assert {} == dict(got.archives)
    assert "not found" in got.message


@pytest.mark.e2e
@pytest.mark.realnode
def test_the_kubelet_authorizes_nodes_checkpoint(
    real_cluster: Any, real_namespace: str, tmp_path: Path
) -> None:
    """The kubelet asks the API server whether the caller may ``create`` on
    ``nodes/checkpoint``: an account that may read pods and nodes but not that is refused
    (the victim evicted as any, with why), one that may is served."""
    from tests.e2e.service_support import account_kubeconfig
    from webhook.kube.checkpoints import KubeletCheckpointer
    from webhook.kube.client import make_api_client

    client, ns = real_cluster.client, real_namespace
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    reads = {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get"]}
    checkpoint = {"apiGroups": [""], "resources": ["nodes/checkpoint"], "verbs": ["create"]}
    made = []
    for account, rules in (("reader", [reads]), ("checkpointer", [reads, checkpoint])):
        name = f"{ns}-{account}"
        client.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": account}})
        client.create(f"{rbac}/clusterroles", {"metadata": {"name": name}, "rules": rules})
        binding = {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
        }
        client.create(f"{rbac}/clusterrolebindings", binding)
        made.append(name)
    pods = f"/api/v1/namespaces/{ns}/pods"
    image = real_cluster.image("workload")
    try:
        client.create(pods, pod_doc("victim", ("main",), 5, image))
        deadline = time.monotonic() + 120
        while "running" not in str(client.get(f"{pods}/victim").get("status", {})):
            assert time.monotonic() < deadline, "the victim did not run in 120 s"
            time.sleep(0.2)
        uid = client.get(f"{pods}/victim")["metadata"]["uid"]
        got = {}
        for account in ("reader", "checkpointer"):
            (tmp_path / account).mkdir()
            config = account_kubeconfig(real_cluster, ns, account, tmp_path / account)
            api = make_api_client(str(config))
            got[account] = KubeletCheckpointer(api).checkpoint(PodRef(ns, "victim", uid), NODE_NAME)
            api.close()
        refused, served = got["reader"], got["checkpointer"]
        assert {} == dict(refused.archives)
        assert "the kubelet refused to checkpoint container main (HTTP 403)" in refused.message
        assert "verb=create, resource=nodes, subresource(s)=[checkpoint]" in refused.message
        assert "" == served.message
        assert ["main"] == list(served.archives)
        Path(served.archives["main"]).unlink()
    finally:
        for name in made:
            client.delete(f"{rbac}/clusterrolebindings/{name}")
            client.delete(f"{rbac}/clusterroles/{name}")
