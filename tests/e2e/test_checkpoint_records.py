"""Checkpoint records only the service writes, on the real API server with client
certificates off (as on a managed cluster; docs/checkpoint.md, "Security").

The service creates a pod from a record, so a record is a pod spec waiting to be run. The
chart's ``-checkpoint-records`` policy is rendered by helm and applied for real, with the
chart's own accounts and Roles, in namespaces of this module's own. Then:

* the service's account creates a record and writes its status;
* a node agent's account, with a token bound to a pod on node-1 (the API server adds the
  node's name to such a token, ``authentication.kubernetes.io/node-name``): writes the
  status of node-1's records and its node's report only; creating a record, changing a
  record's metadata, another node's record or report, or any of it with a token bound to
  no node, is refused;
* a user with every right on ConfigMaps and on the records (not the service's account)
  and the cluster's admin: refused, whatever they write; they may delete a record;
* a record's spec, once written, cannot be changed by anyone: the archive swap (a record
  made to name another pod's archive) is refused.

And with the service running (``serve --checkpoints true``): a record forged as a
ConfigMap in the service's namespace, in the format an older release kept its records in,
naming a privileged ``hostPath: /`` pod in kube-system, is read once, deleted and never
acted on; one forged after the service started is never read. No pod is created.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.manifests import PAUSE_IMAGE
from harness.webhook_process import NAMESPACE, ensure_namespace
from tests.e2e.conftest import NODE, Cluster, Kubectl, StartService, Waiter
from tests.e2e.helm_tools import render
from tests.e2e.records_support import records_path, remove
from webhook.core.checkpoint import (
    GROUP,
    VERSION,
    CheckpointRecord,
    Phase,
    record_object,
)

pytestmark = pytest.mark.e2e

REFUSED = "ValidatingAdmissionPolicy"
NOBODY_ELSE = "only the resize-preemption-webhook service and its node agents write"
OWN_NODE = "a node agent writes only its own node's checkpoint records"
#: RBAC's word, before any policy: the agent's Role has no such verb.
NO_RIGHT = " cannot "
STATUS_ONLY = "a node agent writes only a checkpoint record's status"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


@dataclass(frozen=True)
class Callers:
    namespace: str
    admin: Kubectl
    service: Kubectl
    #: The node agent's account, its token bound to a pod on node-1.
    agent: Kubectl
    #: The same account, a token bound to nothing (no node name).
    unbound_agent: Kubectl
    #: Every right on ConfigMaps and records of the namespace; not the service.
    intruder: Kubectl


def _record(
    uid: str, node: str = NODE, archive: str = "checkpoint-low_team-a-main-1.tar"
) -> dict[str, Any]:
    pod = {
        "metadata": {"name": f"low-{uid}", "namespace": "team-a", "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
    }
    archives = {"main": f"/var/lib/kubelet/checkpoints/{archive}"}
    return record_object(CheckpointRecord(uid, node, Phase.ARCHIVED, pod, archives))


def _node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "CheckpointNode",
        "metadata": {"name": name},
        "spec": {"node": name},
    }


def _rights(service_ns: str, agent_ns: str, rendered: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The namespaces, the chart's accounts, Roles and bindings there, the intruder's."""
    chart = [
        d
        for d in rendered
        if d["kind"] in ("ServiceAccount", "Role", "RoleBinding")
        and d["metadata"].get("namespace") in (service_ns, agent_ns)
    ]
    every = ["podcheckpoints", "podcheckpoints/status", "checkpointnodes", "checkpointnodes/status"]
    intruder = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "intruder", "namespace": service_ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "intruder", "namespace": service_ns},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]},
                   {"apiGroups": [GROUP], "resources": every, "verbs": ["*"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "intruder", "namespace": service_ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "intruder"},
         "subjects": [{"kind": "ServiceAccount", "name": "intruder", "namespace": service_ns}]},
    ]  # fmt: skip
    namespaces = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
        for n in dict.fromkeys((service_ns, agent_ns))
    ]
    return [*namespaces, *chart, *intruder]


def _token(cluster: Cluster, namespace: str, account: str, bound: dict[str, Any] | None) -> str:
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if bound is not None:
        meta = bound["metadata"]
        spec["boundObjectRef"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "uid": meta["uid"],
        }
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
    return str(cluster.client.create(path, request)["status"]["token"])


def _as(cluster: Cluster, token: str, where: Path, namespace: str) -> Kubectl:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    where.mkdir(parents=True, exist_ok=True)
    path = where / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return Kubectl(cluster.binaries.kubectl, path, namespace)


def _agent_pod(
    cluster: Cluster, namespace: str, account: str, wait_until: Waiter
) -> dict[str, Any]:
    """A pod of the agent's account bound to node-1, as the DaemonSet's would be."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "agent-on-node-1"},
        "spec": {
            "nodeName": NODE,
            "serviceAccountName": account,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "agent", "image": PAUSE_IMAGE}],
        },
    }
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}"
    wait_until(lambda: cluster.client.get_or_none(path), timeout=10, what="the agent's account")
    created: dict[str, Any] = cluster.client.create(f"/api/v1/namespaces/{namespace}/pods", body)
    return created


@pytest.fixture(scope="module")
def callers(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callers]:
    suffix = secrets.token_hex(3)
    # The agent runs in the release's namespace, beside the service and the records.
    service_ns = agent_ns = release = f"rpw-rec-{suffix}"
    rendered = render({"checkpoint.enabled": True}, release=release, namespace=service_ns)
    policy = [
        d
        for d in rendered
        if d["kind"].startswith("ValidatingAdmissionPolicy")
        and d["metadata"]["name"].endswith("-checkpoint-records")
    ]
    assert 2 == len(policy)
    fullname = policy[0]["metadata"]["name"].removesuffix("-checkpoint-records")
    admin = Kubectl(cluster.binaries.kubectl, cluster.kubeconfig)
    text = yaml.safe_dump_all([*_rights(service_ns, agent_ns, rendered), *policy])
    admin("apply", "-f", "-", input=text)
    waiter = _Waiter()
    agent_account = f"{fullname}-node-agent"
    bound = _agent_pod(cluster, agent_ns, agent_account, waiter)
    where = tmp_path_factory.mktemp("records")
    tokens = {
        "service": _token(cluster, service_ns, fullname, None),
        "agent": _token(cluster, agent_ns, agent_account, bound),
        "unbound_agent": _token(cluster, agent_ns, agent_account, None),
        "intruder": _token(cluster, service_ns, "intruder", None),
    }
    found = Callers(
        service_ns,
        Kubectl(cluster.binaries.kubectl, cluster.kubeconfig, service_ns),
        **{k: _as(cluster, t, where / k, service_ns) for k, t in tokens.items()},
    )
    _wait_in_force(found.intruder)
    try:
        yield found
    finally:
        admin("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=text, check=False)


class _Waiter:
    def __call__(self, check: Any, *, timeout: float = 10, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while not (found := check()):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)
        return found


def _wait_in_force(intruder: Kubectl) -> None:
    """The policy is served a moment after it is created: wait until it refuses."""
    deadline = time.monotonic() + 30
    for attempt in range(1_000_000):
        made = _create(intruder, _record(f"probe-{attempt}"))
        if REFUSED in made.stderr:
            return
        intruder("delete", "podcheckpoint", f"rpw-checkpoint-probe-{attempt}", check=False)
        assert time.monotonic() < deadline, made.stdout + made.stderr
        time.sleep(0.3)


def _create(caller: Kubectl, obj: dict[str, Any]) -> Any:
    return caller("create", "-f", "-", input=json.dumps(obj), check=False)


def _status(caller: Kubectl, kind: str, name: str, status: dict[str, Any]) -> Any:
    patch = json.dumps({"status": status})
    return caller(
        "patch", kind, name, "--subresource=status", "--type=merge", "-p", patch, check=False
    )


def _refused(result: Any, *whys: str) -> None:
    """Refused, saying one of ``whys``."""
    assert 0 != result.returncode, result.stdout
    assert any(why in result.stderr for why in whys), result.stderr


def _allowed(result: Any) -> None:
    assert 0 == result.returncode, result.stderr


def test_the_agents_token_carries_its_nodes_name(callers: Callers) -> None:
    review = json.loads(callers.agent("auth", "whoami", "-o", "json").stdout)
    assert [NODE] == review["status"]["userInfo"]["extra"][NODE_NAME_EXTRA]


def test_the_service_creates_a_record_and_writes_its_status(callers: Callers) -> None:
    _allowed(_create(callers.service, _record("s-1")))
    _allowed(
        _status(callers.service, "podcheckpoint", "rpw-checkpoint-s-1", {"phase": "restoring"})
    )


def test_an_agent_writes_its_nodes_records_status_and_report_only(callers: Callers) -> None:
    _allowed(_create(callers.service, _record("a-1")))
    _allowed(_create(callers.service, _record("a-2", node="node-2")))

    _allowed(_status(callers.agent, "podcheckpoint", "rpw-checkpoint-a-1", {"phase": "imaged"}))
    _refused(
        _status(callers.agent, "podcheckpoint", "rpw-checkpoint-a-2", {"phase": "imaged"}), OWN_NODE
    )
    _refused(_create(callers.agent, _record("a-3")), STATUS_ONLY, NO_RIGHT)
    labelled = callers.agent("label", "podcheckpoint", "rpw-checkpoint-a-1", "x=y", check=False)
    _refused(labelled, STATUS_ONLY, NO_RIGHT)
    _refused(
        _status(callers.unbound_agent, "podcheckpoint", "rpw-checkpoint-a-1", {"phase": "failed"}),
        OWN_NODE,
    )
    _allowed(_create(callers.agent, _node(NODE)))
    _allowed(_status(callers.agent, "checkpointnode", NODE, {"checkpoint": "true"}))
    _refused(_create(callers.agent, _node("node-2")), OWN_NODE)
    _refused(callers.agent("delete", "podcheckpoint", "rpw-checkpoint-a-2", check=False), OWN_NODE)
    _allowed(callers.agent("delete", "podcheckpoint", "rpw-checkpoint-a-1", check=False))


@pytest.mark.parametrize("caller", ["intruder", "admin"])
def test_nobody_else_writes_a_record(callers: Callers, caller: str) -> None:
    who: Kubectl = getattr(callers, caller)
    _allowed(_create(callers.service, _record(f"n-{caller}")))
    name = f"rpw-checkpoint-n-{caller}"

    _refused(_create(who, _record(f"forged-{caller}")), NOBODY_ELSE)
    _refused(_status(who, "podcheckpoint", name, {"phase": "imaged"}), NOBODY_ELSE)
    _refused(_create(who, _node("node-9")), NOBODY_ELSE)
    _allowed(who("delete", "podcheckpoint", name, check=False))  # only loses a checkpoint


def test_the_archive_swap_is_refused(callers: Callers) -> None:
    """A record made to name another pod's archive: its spec is written once, for
    everyone; an agent's status never reaches it."""
    _allowed(_create(callers.service, _record("w-1")))
    other = {
        "spec": {
            "archives": {"main": "/var/lib/kubelet/checkpoints/checkpoint-other_team-b-main-1.tar"}
        }
    }
    for who in (callers.service, callers.admin, callers.intruder, callers.agent):
        patched = who("patch", "podcheckpoint", "rpw-checkpoint-w-1", "--type=merge",
                      "-p", json.dumps(other), check=False)  # fmt: skip
        _refused(patched, "a checkpoint's spec is written once", NO_RIGHT)
    swapped = _status(callers.agent, "podcheckpoint", "rpw-checkpoint-w-1", other["spec"])
    assert 0 == swapped.returncode, swapped.stderr  # an unknown status field is dropped
    read = json.loads(
        callers.admin("get", "podcheckpoint", "rpw-checkpoint-w-1", "-o", "json").stdout
    )
    assert "checkpoint-low_team-a-main-1.tar" in read["spec"]["archives"]["main"]


# -- records an older release kept as ConfigMaps --------------------------------------------

FORGED = "rpw-checkpoint-f0f0f0f0-0000-4000-8000-000000000001"


def _forged_configmap(name: str, pod_name: str) -> dict[str, Any]:
    """A record in an older release's ConfigMap format: a privileged pod with the host's
    root filesystem, in kube-system, bound to node-1, its images of its own path."""
    uid = name.removeprefix("rpw-checkpoint-")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": "kube-system", "uid": uid},
        "spec": {
            "nodeName": NODE,
            "hostPID": True,
            "containers": [{"name": "main", "image": "busybox",
                            "securityContext": {"privileged": True},
                            "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
        },
    }  # fmt: skip
    image = f"localhost/resize-preemption-checkpoint/kube-system/{pod_name}/main:{uid[:12]}"
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/managed-by": "resize-preemption-webhook",
                "resize-preemption.io/checkpoint": "true",
                "resize-preemption.io/node": NODE,
                "resize-preemption.io/phase": "imaged",
            },
        },
        "data": {
            "pod": json.dumps(pod),
            "archives": json.dumps({"main": "/var/lib/kubelet/checkpoints/x.tar"}),
            "phase": "imaged",
            "checkpointedAt": "2026-12-06T07:01:00Z",
            "images": json.dumps({"main": image}),
            "commands": json.dumps({"main": ["sh"]}),
            "sizes": json.dumps({"main": 1}),
        },
    }


def test_a_record_forged_as_a_configmap_is_never_acted_on(
    cluster: Cluster, start_service: StartService, wait_until: Waiter
) -> None:
    configmaps = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    ensure_namespace(cluster.client, NAMESPACE)
    cluster.client.create(configmaps, _forged_configmap(FORGED, "forged-before"))
    later = FORGED.replace("0001", "0002")
    try:
        start_service("--checkpoints", "true", client_auth=False)
        wait_until(
            lambda: cluster.client.get_or_none(f"{configmaps}/{FORGED}") is None,
            timeout=30,
            what="the older release's record read and deleted",
        )
        cluster.client.create(configmaps, _forged_configmap(later, "forged-after"))
        time.sleep(5)  # five passes of the leader's worker

        for name in ("forged-before", "forged-after"):
            assert None is cluster.client.get_or_none(f"/api/v1/namespaces/kube-system/pods/{name}")
        assert [] == cluster.client.get(records_path(NAMESPACE))["items"]
    finally:
        for name in (FORGED, later):
            remove(cluster.client, f"{configmaps}/{name}")
