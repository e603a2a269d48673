"""The chart's admission policy for checkpoint images, on the real API server.

A checkpoint image holds a victim's memory and containerd restores it into any pod that
names it (docs/checkpoint.md, "Security"). With ``checkpoint.enabled`` the chart ships a
ValidatingAdmissionPolicy: only the service's account creates a pod from a checkpoint
image, only the pod the checkpoint was taken of, and that account creates no pod but a
restored one. Here the policy is rendered by helm, applied for real (renamed into a
namespace of this module's own), and tried by the cluster's admin and by a token of the
service's account, each on pods bound to a node nobody serves (nothing runs). The service
creates a pod only from the images of the checkpoint its annotation names (tagged with
that checkpoint's uid), every container from its own.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Cluster, Kubectl
from tests.e2e.helm_tools import render
from tests.e2e.service_support import account_kubeconfig

pytestmark = pytest.mark.e2e

PREFIX = "localhost/resize-preemption-checkpoint"
RESTORED_FROM = "resize-preemption.io/restored-from"
#: The uid of the pods the checkpoints here were taken of; images are tagged with its
#: first 12 characters.
UID = "0123456789ab-cdef-4000-8000-000000000001"


def pod(name: str, image: str, *, restored: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if restored:
        meta["annotations"] = {RESTORED_FROM: f"rpw-checkpoint-{UID}"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": "nowhere", "containers": [{"name": "main", "image": image}]},
    }


@pytest.fixture(scope="module")
def callers(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """{"admin": Kubectl, "service": Kubectl} with the policy in force."""
    with policy_in_force(cluster, tmp_path_factory, {}) as in_force:
        yield in_force


@contextlib.contextmanager
def policy_in_force(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory, values: dict[str, Any]
) -> Iterator[dict[str, Any]]:
    """The chart's policy rendered with ``values`` (and checkpoints on) and applied, with
    the service's account allowed to create and update pods of a namespace of its own;
    {"admin": Kubectl, "service": Kubectl} in that namespace."""
    suffix = secrets.token_hex(3)
    service_ns, release, ns = f"rpw-cp-{suffix}", f"rpw-cp-{suffix}", f"team-{suffix}"
    given = {"checkpoint.enabled": True, **values}
    policy = [
        d
        for d in render(given, release=release, namespace=service_ns)
        if d["kind"].startswith("ValidatingAdmissionPolicy")
        and d["metadata"]["name"].endswith("-checkpoint-images")
    ]
    assert 2 == len(policy)
    # The chart's full name, which the policy expects of the service's account.
    account = policy[0]["metadata"]["name"].removesuffix("-checkpoint-images")
    admin = Kubectl(cluster.binaries.kubectl, cluster.kubeconfig)
    rights = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}
        for n in (service_ns, ns)
    ] + [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": account, "namespace": service_ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "pods", "namespace": ns},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "update"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "pods", "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pods"},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": service_ns}]},
    ]  # fmt: skip
    text = yaml.safe_dump_all([*rights, *policy])
    admin("apply", "-f", "-", input=text)
    config = account_kubeconfig(cluster, service_ns, account, tmp_path_factory.mktemp("policy"))
    service = Kubectl(cluster.binaries.kubectl, config, ns)
    # Probed with an image only this policy refuses when it has a registry: another
    # module's policy, deleted a moment ago, may still refuse the local ones.
    probe = values.get("checkpoint.registry.repository") or PREFIX
    _wait_in_force(Kubectl(cluster.binaries.kubectl, cluster.kubeconfig, ns), probe)
    try:
        yield {
            "admin": Kubectl(cluster.binaries.kubectl, cluster.kubeconfig, ns),
            "service": service,
        }
    finally:
        admin("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=text, check=False)


def _wait_in_force(admin: Kubectl, prefix: str = PREFIX) -> None:
    """The policy is served a moment after it is created: wait until it refuses a pod
    from a checkpoint image under ``prefix``."""
    deadline = time.monotonic() + 30
    for attempt in range(1_000_000):
        probe = pod(f"probe-{attempt}", f"{prefix}/x/probe-{attempt}/main:1")
        created = admin("apply", "-f", "-", input=yaml.safe_dump(probe), check=False)
        if "ValidatingAdmissionPolicy" in created.stderr:
            return
        admin("delete", "pod", probe["metadata"]["name"], "--wait=false", check=False)
        assert time.monotonic() < deadline, created.stdout + created.stderr
        time.sleep(0.3)


def create_as(
    callers: dict[str, Any], caller: str, manifest: dict[str, Any], refused_with: str
) -> None:
    """``caller`` creates ``manifest`` (its image's ``{ns}`` the test's namespace): refused
    with ``refused_with``, or created when that is empty."""
    namespace = callers["admin"].namespace
    image = manifest["spec"]["containers"][0]["image"]
    manifest["spec"]["containers"][0]["image"] = image.replace("{ns}", namespace)

    created = callers[caller]("create", "-f", "-", input=yaml.safe_dump(manifest), check=False)

    if refused_with:
        assert 0 != created.returncode
        assert refused_with in created.stderr, created.stderr
    else:
        assert 0 == created.returncode, created.stderr


def switch_refused(callers: dict[str, Any], repository: str) -> None:
    """A pod the admin made from another image cannot be switched to a checkpoint image
    under ``repository``."""
    admin = callers["admin"]
    admin("create", "-f", "-", input=yaml.safe_dump(pod("f", "busybox")))

    image = f"{repository}/{admin.namespace}/f/main:1"
    switched = admin("set", "image", "pod/f", f"main={image}", check=False)

    assert 0 != switched.returncode
    assert "only the resize-preemption-webhook service" in switched.stderr, switched.stderr


@pytest.mark.parametrize(
    ("caller", "manifest", "refused_with"),
    [
        pytest.param("admin", pod("a", "busybox"), "", id="admin-plain-pod"),
        pytest.param(
            "admin",
            pod("b", f"{PREFIX}/{{ns}}/b/main:1"),
            "only the resize-preemption-webhook service creates pods from checkpoint images",
            id="admin-from-a-checkpoint",
        ),
        pytest.param(
            "service",
            pod("c", f"{PREFIX}/{{ns}}/c/main:0123456789ab", restored=True),
            "",
            id="service-restores",
        ),
        pytest.param(
            "service",
            pod("g", f"{PREFIX}/{{ns}}/g/main:fedcba987654", restored=True),
            "the service creates a pod only from its own checkpoint",
            id="service-another-checkpoints-image",
        ),
        pytest.param(
            "service",
            pod("h", "busybox", restored=True),
            "the service creates a pod only from its own checkpoint",
            id="service-a-plain-image",
        ),
        pytest.param(
            "service",
            pod("d", f"{PREFIX}/{{ns}}/other/main:1", restored=True),
            "a checkpoint image restores only the pod it was taken of",
            id="service-another-pods-checkpoint",
        ),
        pytest.param(
            "service",
            pod("e", "busybox"),
            "the service creates only pods restored from a checkpoint",
            id="service-a-pod-not-restored",
        ),
    ],
)
def test_who_may_create_a_pod_from_a_checkpoint_image(
    callers: dict[str, Any], caller: str, manifest: dict[str, Any], refused_with: str
) -> None:
    create_as(callers, caller, manifest, refused_with)


def test_a_pod_already_there_cannot_be_switched_to_a_checkpoint_image(
    callers: dict[str, Any],
) -> None:
    switch_refused(callers, PREFIX)
