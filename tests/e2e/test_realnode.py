"""The real node: real processes in real cgroups, and the webhook from its own image as the
chart deploys it (two replicas, the chart's defaults).

* a resize rewrites the container's CPU quota;
* the image runs as 65532 on a read-only root, follows a certificate rotated in its
  Secret without a restart, answers ``/metrics`` through its Service and ``/readyz`` on
  its probe port, and refuses a client without kube-apiserver's certificate (the Service
  proxy) on its review port;
* the walkthrough: the resize waits while the victim's process takes its grace period
  after SIGTERM, then the cgroup follows;
* lending with real memory use: a Guaranteed lender whose process uses more than the loan
  would leave is refused by the kubelet, put back, and another pod lends instead;
* the replica leading the preemption is SIGKILLed mid-way: the resize is actuated, exactly
  the victims needed are gone, none evicted twice (counted from the audit log).

They run in the order written, on one session cluster and one chart install; the
rotation comes before the reviews that then reach the rotated certificate, the kill last.
These need root, overlayfs and the cpu, memory and pids cgroup controllers; the
``real_cluster`` fixture skips them, with the preflight's reason, only where those are
missing."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import secrets
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography import x509

from harness.audit import deletion_time, eviction_codes, evictions_made
from harness.chart import FULLNAME, NAME, NAMESPACE, ready_endpoints, wait_ready
from harness.kubeapi import ApiError
from harness.manifests import workload_pod
from harness.realcluster import RealCluster, millicores
from harness.realnode import NODE_NAME
from harness.walkthrough import resize_patch, scaled_walkthrough
from tests.e2e.conftest import Waiter
from webhook.core.model import FLOOR_ANNOTATION
from webhook.core.resources import format_memory, memory_bytes
from webhook.tls.certs import make_webhook_certs

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]
#: A process that ends on SIGTERM, as a workload does.
SCRIPT = "trap 'exit 0' TERM; while true; do sleep 1; done"


def pod(name: str, image: str, cpu: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE_NAME,
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "app",
                    "image": image,
                    "command": ["sh", "-c", SCRIPT],
                    "resources": {
                        "requests": {"cpu": cpu, "memory": "64Mi"},
                        "limits": {"cpu": cpu, "memory": "64Mi"},
                    },
                }
            ],
        },
    }


def test_a_resize_rewrites_the_containers_cpu_quota(
    real_cluster: RealCluster, real_namespace: str, wait_until: Waiter
) -> None:
    manifest = json.dumps(pod("grows", real_cluster.image("workload"), "500m"))
    real_cluster.kubectl("apply", "-n", real_namespace, "-f", "-", input=manifest)
    real_cluster.kubectl(
        "wait", "-n", real_namespace, "--for=condition=Ready", "pod/grows", "--timeout=60s"
    )
    # The container's command is PID 1 of its own PID namespace.
    init = real_cluster.exec(real_namespace, "grows", ["cat", "/proc/1/cmdline"])
    assert ["sh", "-c", SCRIPT] == init.split("\0")[:3]
    assert 500 == real_cluster.cpu_quota(real_namespace, "grows").millicores

    patch = {"spec": {"containers": [{"name": "app", "resources": {
        "requests": {"cpu": "800m"}, "limits": {"cpu": "800m"}}}]}}  # fmt: skip
    real_cluster.kubectl(
        "patch", "-n", real_namespace, "pod", "grows", "--subresource", "resize",
        "--patch", json.dumps(patch),
    )  # fmt: skip

    def actuated() -> bool:
        status = real_cluster.client.get(f"/api/v1/namespaces/{real_namespace}/pods/grows")
        resources = status["status"]["containerStatuses"][0].get("resources", {})
        return bool(resources.get("limits", {}).get("cpu") == "800m")

    wait_until(actuated, timeout=30, what="the kubelet to actuate 800m")
    assert 800 == real_cluster.cpu_quota(real_namespace, "grows").millicores


def test_the_webhook_runs_from_its_image_behind_its_service(real_cluster: RealCluster) -> None:
    pods = real_cluster.client.get(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        labelSelector=f"app.kubernetes.io/name={NAME}",
    )["items"]
    assert 2 == len(pods)
    product = real_cluster.image("product")
    for found in pods:
        status = found["status"]["containerStatuses"][0]
        assert (NODE_NAME, "Running", True) == (
            found["spec"]["nodeName"],
            found["status"]["phase"],
            status["ready"],
        )
        assert product == status["image"]
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", status["imageID"]), status["imageID"]
    assert 1 == len({p["status"]["containerStatuses"][0]["imageID"] for p in pods})
    assert 2 == ready_endpoints(real_cluster.client, NAMESPACE)
    # The image's user on its read-only root filesystem.
    name = pods[0]["metadata"]["name"]
    out = real_cluster.exec(NAMESPACE, name, ["python", "-c", _WHO_AND_ROOT])
    assert "65532 read-only" == out.strip()


_WHO_AND_ROOT = (
    "import os\n"
    "try:\n"
    "    open('/probe', 'w')\n"
    "    root = 'writable'\n"
    "except OSError:\n"
    "    root = 'read-only'\n"
    "print(os.getuid(), root)\n"
)


# --- the image's process: certificate rotation, readiness and metrics through the Service ---

SERVICE_PROXY = f"/api/v1/namespaces/{NAMESPACE}/services"
WEBHOOK_PORT = 8443
PROBE_PORT = 8444


def release_pods(cluster: RealCluster) -> list[dict[str, Any]]:
    return list(
        cluster.client.get(
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            labelSelector=f"app.kubernetes.io/name={NAME}",
        )["items"]
    )


def served_serial(address: str, ca_pem: bytes | None = None) -> int:
    """The serial of the certificate a replica serves at ``address``; with ``ca_pem`` the
    handshake also verifies it for the Service's name, as kube-apiserver does."""
    if ca_pem is None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    else:
        context = ssl.create_default_context(cadata=ca_pem.decode())
    with (
        socket.create_connection((address, WEBHOOK_PORT), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=f"{FULLNAME}.{NAMESPACE}.svc") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return int(x509.load_der_x509_certificate(der).serial_number)


def trust_also(cluster: RealCluster, ca_pem: bytes) -> None:
    """Add ``ca_pem`` to the caBundle of the webhook configuration, keeping the old CA:
    kube-apiserver trusts both replicas whichever certificate each serves meanwhile."""
    path = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{FULLNAME}"
    config = cluster.client.get(path)
    for hook in config["webhooks"]:
        old = base64.b64decode(hook["clientConfig"]["caBundle"])
        hook["clientConfig"]["caBundle"] = base64.b64encode(old + ca_pem).decode()
    cluster.client.replace(path, config)


def test_the_image_reloads_a_rotated_certificate_and_serves_through_its_service(
    real_cluster: RealCluster, wait_until: Waiter
) -> None:
    pods = release_pods(real_cluster)
    addresses = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods}
    restarts_before = {p["metadata"]["name"]: restarts(p) for p in pods}
    new = make_webhook_certs(service=FULLNAME, namespace=NAMESPACE)
    new_serial = x509.load_pem_x509_certificate(new.cert_pem).serial_number
    assert all(new_serial != served_serial(a) for a in addresses.values())

    trust_also(real_cluster, new.ca_pem)
    secret_path = f"/api/v1/namespaces/{NAMESPACE}/secrets/{FULLNAME}-tls"
    encoded = {
        "ca.crt": new.ca_pem, "tls.crt": new.cert_pem, "tls.key": new.key_pem,
    }  # fmt: skip
    real_cluster.client.patch(
        secret_path, {"data": {k: base64.b64encode(v).decode() for k, v in encoded.items()}}
    )

    def rotated() -> bool:
        # The kubelet rewrites a Secret volume when it syncs the pod, at the latest after
        # its sync period (a minute); a change to the pod makes it sync now.
        for name in addresses:
            real_cluster.client.patch(
                f"/api/v1/namespaces/{NAMESPACE}/pods/{name}",
                {"metadata": {"annotations": {"rotation-check": str(time.monotonic())}}},
            )
        return all(new_serial == served_serial(a) for a in addresses.values())

    wait_until(rotated, timeout=60, interval=2, what="both replicas serving the new certificate")
    # Verified against the new CA for the name kube-apiserver dials, without a restart.
    assert [new_serial] * len(addresses) == [
        served_serial(a, new.ca_pem) for a in addresses.values()
    ]
    assert restarts_before == {
        p["metadata"]["name"]: restarts(p) for p in release_pods(real_cluster)
    }

    # The review port answers kube-apiserver's webhook client certificate only (the chart's
    # clientAuth, as harness.chart installs it): its Service proxy presents none. Under TLS
    # 1.3 the client finishes its handshake before the server checks the certificate, so the
    # refusal reaches the proxy either as the server's alert or, when the proxy's request
    # meets the closed socket first, as a reset.
    with pytest.raises(ApiError, match=r"certificate required|connection reset by peer"):
        real_cluster.client.request("GET", f"{SERVICE_PROXY}/https:{FULLNAME}:https/proxy/readyz")
    # The probe port asks for none, and serves the probes.
    for name in addresses:
        ready = real_cluster.client.request(
            "GET", f"/api/v1/namespaces/{NAMESPACE}/pods/https:{name}:{PROBE_PORT}/proxy/readyz"
        )
        assert (True, True) == (ready["ready"], all(ready["checks"].values())), ready
    metrics = str(
        real_cluster.client.request("GET", f"{SERVICE_PROXY}/http:{FULLNAME}:metrics/proxy/metrics")
    )
    assert re.search(r"^resize_preemption_\w+", metrics, re.MULTILINE), metrics[:500]


# --- the walkthrough: a victim that takes its grace period --------------------------------

#: How long the victim's process takes to exit after SIGTERM, in seconds.
VICTIM_GRACE = 3
#: A process that, on SIGTERM, takes VICTIM_GRACE seconds before it exits (busybox sh runs
#: the trap when ``wait`` returns, not after a whole ``sleep``).
SLOW_EXIT = f"trap 'sleep {VICTIM_GRACE}; exit 0' TERM; while true; do sleep 1 & wait $!; done"


@pytest.fixture(scope="module")
def classes(real_cluster: RealCluster) -> Iterator[dict[str, str]]:
    """PriorityClasses with unique names: {"high", "low", "lowest"}."""
    suffix = secrets.token_hex(3)
    values = {"high": 1_000_000, "low": 1_000, "lowest": 500}
    names = {key: f"{key}-{suffix}" for key in values}
    for key, value in values.items():
        real_cluster.client.create(
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {"metadata": {"name": names[key]}, "value": value},
        )
    yield names
    for name in names.values():
        real_cluster.client.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")


def workload(
    name: str,
    image: str,
    priority: str,
    resources: dict[str, dict[str, str]],
    *,
    script: str = SCRIPT,
    container: str = "app",
) -> dict[str, Any]:
    return workload_pod(
        name, image, priority, resources, node=NODE_NAME, script=script, container=container
    )


def guaranteed(cpu: str, memory: str) -> dict[str, dict[str, str]]:
    both = {"cpu": cpu, "memory": memory}
    return {"requests": dict(both), "limits": dict(both)}


def start(cluster: RealCluster, namespace: str, pods: list[dict[str, Any]]) -> None:
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest)
    names = [f"pod/{p['metadata']['name']}" for p in pods]
    cluster.kubectl("wait", "-n", namespace, "--for=condition=Ready", *names, "--timeout=90s")


def read(cluster: RealCluster, namespace: str, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = cluster.client.get_or_none(
        f"/api/v1/namespaces/{namespace}/pods/{name}"
    )
    return found


def actuated(pod: dict[str, Any] | None, resource: str, kind: str = "limits") -> str | None:
    """What the kubelet reports running for the first container (None: nothing yet)."""
    if not pod:
        return None
    status = (pod.get("status", {}).get("containerStatuses") or [{}])[0]
    value = status.get("resources", {}).get(kind, {}).get(resource)
    return str(value) if value is not None else None


def cpu_running(pod: dict[str, Any] | None) -> int | None:
    running = actuated(pod, "cpu")
    return None if running is None else millicores(running)


def memory_running(pod: dict[str, Any] | None, kind: str = "limits") -> int | None:
    running = actuated(pod, "memory", kind)
    return None if running is None else memory_bytes(running)


def memory_of(pod: dict[str, Any] | None) -> tuple[int, int, int | None]:
    """The first container's memory limit: in its spec, allocated, running."""
    if not pod:
        return (0, 0, None)
    limits = pod["spec"]["containers"][0]["resources"].get("limits", {})
    status = (pod.get("status", {}).get("containerStatuses") or [{}])[0]
    allocated = status.get("allocatedResources", {}).get("memory", "0")
    return (memory_bytes(limits.get("memory", "0")), memory_bytes(allocated), memory_running(pod))


def restarts(pod: dict[str, Any]) -> int:
    return int((pod.get("status", {}).get("containerStatuses") or [{}])[0].get("restartCount", 0))


def events(cluster: RealCluster, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return list(
        cluster.client.get(
            f"/api/v1/namespaces/{namespace}/events",
            fieldSelector=f"involvedObject.name={name},reason={reason}",
        )["items"]
    )


def warnings(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("Warning:")]


def test_the_walkthrough_waits_for_the_victims_grace_period(
    real_cluster: RealCluster, real_namespace: str, classes: dict[str, str], wait_until: Waiter
) -> None:
    walk = scaled_walkthrough(
        real_cluster.allocatable_millicores(), real_cluster.requested_millicores()
    )
    image = real_cluster.image("workload")
    start(real_cluster, real_namespace, [
        workload("low-priority-pod", image, classes["low"], guaranteed(f"{walk.low}m", "64Mi"),
                 script=SLOW_EXIT, container="worker"),
        workload("high-priority-pod", image, classes["high"],
                 guaranteed(f"{walk.high}m", "64Mi")),
    ])  # fmt: skip
    assert walk.high == real_cluster.cpu_quota(real_namespace, "high-priority-pod").millicores

    patched = time.monotonic()
    result = real_cluster.kubectl(
        "patch", "-n", real_namespace, "pod", "high-priority-pod", "--subresource", "resize",
        "--patch", resize_patch(walk.target),
    )  # fmt: skip
    assert [f"Warning: preempting 1 lower-priority pod on {NODE_NAME}"] == [
        w.split(" for ")[0] for w in warnings(result)
    ], result.stderr
    # The victim's process is still stopping: the resize waits, the cgroup is unchanged.
    time.sleep(max(0.0, patched + VICTIM_GRACE / 2 - time.monotonic()))
    assert (walk.high, walk.high) == (
        cpu_running(read(real_cluster, real_namespace, "high-priority-pod")),
        real_cluster.cpu_quota(real_namespace, "high-priority-pod").millicores,
    )
    wait_until(
        lambda: cpu_running(read(real_cluster, real_namespace, "high-priority-pod")) == walk.target,
        timeout=60,
        what=f"the kubelet to actuate {walk.target}m",
    )
    actuated_in = time.monotonic() - patched

    assert actuated_in >= VICTIM_GRACE, f"actuated {actuated_in:.2f} s after the patch"
    assert walk.target == real_cluster.cpu_quota(real_namespace, "high-priority-pod").millicores
    assert 1 == len(events(real_cluster, real_namespace, "low-priority-pod", "Preempted"))
    wait_until(
        lambda: read(real_cluster, real_namespace, "low-priority-pod") is None,
        timeout=30,
        what="the victim gone",
    )


# --- lending with real memory use ------------------------------------------------------------

MI = 1024**2
#: What batch-1's process really holds: a file on a memory-backed volume, charged to its
#: container's memory cgroup.
FILL_MI = 300
FILL = f"dd if=/dev/zero of=/fill/data bs={MI} count={FILL_MI} 2>/dev/null; " + SCRIPT


def test_a_guaranteed_lenders_memory_is_never_lowered_another_lends(
    real_cluster: RealCluster, real_namespace: str, classes: dict[str, str], wait_until: Waiter
) -> None:
    # web grows by SHORT, exactly what the node lacks. batch-1 (Guaranteed, the least
    # important, a 64Mi memory floor) holds 300Mi in a memory-backed volume: a loan would
    # lower its limit with its request, and memory it grew into later would be
    # OOM-killed (docs/lending.md, "A lender's memory"). So by default its memory does
    # not lend: batch-2 (Burstable) lends instead, its request only, and nobody is
    # evicted.
    short, batch_1_memory, web_memory = 384 * MI, 512 * MI, 256 * MI
    free = real_cluster.allocatable_memory() - real_cluster.requested_memory()
    # batch-2 takes every byte left: the node is full.
    batch_2_memory = free - batch_1_memory - web_memory
    image = real_cluster.image("workload")
    # A quarter core: at 50m the CFS quota and the small cpu.weight leave dd writing its
    # 300Mi for seconds on a quiet node and far longer on a busy one.
    batch_1 = workload("batch-1", image, classes["lowest"], guaranteed("250m", "512Mi"),
                       script=FILL)  # fmt: skip
    batch_1["metadata"]["annotations"] = {FLOOR_ANNOTATION: json.dumps({"app": {"memory": "64Mi"}})}
    batch_1["spec"]["containers"][0]["volumeMounts"] = [{"name": "fill", "mountPath": "/fill"}]
    batch_1["spec"]["volumes"] = [{"name": "fill", "emptyDir": {"medium": "Memory"}}]
    batch_2 = workload("batch-2", image, classes["low"],
                       {"requests": {"cpu": "50m", "memory": f"{batch_2_memory}"}})  # fmt: skip
    batch_2["metadata"]["annotations"] = {FLOOR_ANNOTATION: json.dumps({"app": {"memory": "64Mi"}})}
    start(real_cluster, real_namespace, [
        workload("web", image, classes["high"], guaranteed("100m", "256Mi")), batch_1, batch_2,
    ])  # fmt: skip
    wait_until(
        lambda: real_cluster.memory(real_namespace, "batch-1").usage >= FILL_MI * MI,
        timeout=60,
        what="batch-1's process holding its memory",
    )
    uids = {
        n: (read(real_cluster, real_namespace, n) or {})["metadata"]["uid"]
        for n in ("batch-1", "batch-2")
    }

    target = web_memory + short
    grow = {"requests": {"memory": str(target)}, "limits": {"memory": str(target)}}
    result = real_cluster.kubectl(
        "patch", "-n", real_namespace, "pod", "web", "--subresource", "resize", "--patch",
        json.dumps({"spec": {"containers": [{"name": "app", "resources": grow}]}}),
    )  # fmt: skip

    # The warning is clipped to 120 characters: the lender's name may not fit.
    assert [
        f"Warning: borrowing memory {format_memory(short)} from 1 lower-priority pod on "
        f"{NODE_NAME}: {real_namespace}/batch-2"[:60]
    ] == [w[:60] for w in warnings(result)], result.stderr
    wait_until(
        lambda: memory_running(read(real_cluster, real_namespace, "web")) == target,
        timeout=60,
        what="web's resize actuated",
    )
    wait_until(
        lambda: (
            memory_running(read(real_cluster, real_namespace, "batch-2"), "requests")
            == batch_2_memory - short
        ),
        timeout=60,
        what="batch-2's loan actuated",
    )
    batch_1_now, batch_2_now = (
        read(real_cluster, real_namespace, n) or {} for n in ("batch-1", "batch-2")
    )
    # The cgroups as the containers see them: web's limit grew, batch-1's never moved.
    web_cgroup, batch_1_cgroup = (
        real_cluster.memory(real_namespace, n) for n in ("web", "batch-1")
    )
    assert (target, batch_1_memory) == (web_cgroup.limit, batch_1_cgroup.limit)
    assert (batch_1_memory,) * 3 == memory_of(batch_1_now)
    assert [] == events(real_cluster, real_namespace, "batch-1", "Lent")
    assert (uids["batch-1"], 0, uids["batch-2"], 0) == (
        batch_1_now["metadata"]["uid"], restarts(batch_1_now),
        batch_2_now["metadata"]["uid"], restarts(batch_2_now),
    )  # fmt: skip
    assert {} == eviction_codes(real_cluster.control_plane.log_dir / "audit.log", real_namespace)


# --- two replicas, the leader killed mid-preemption ----------------------------------------

#: How long each low-priority pod's process takes to exit after SIGTERM, in seconds.
LOW_GRACE = 2
LEADER_LEASE = (
    f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/resize-preemption-webhook-leader"
)


def leader_pod(cluster: RealCluster) -> str:
    """The release's pod whose process holds the leader Lease (its identity starts with the
    pod's name)."""
    holder = str(cluster.client.get(LEADER_LEASE)["spec"].get("holderIdentity") or "")
    [name] = [p["metadata"]["name"] for p in release_pods(cluster)
              if holder.startswith(p["metadata"]["name"])]  # fmt: skip
    return str(name)


class Deletions:
    """When each pod of a namespace was deleted (evicted), noted while it is terminating."""

    def __init__(self, cluster: RealCluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.at: dict[str, dt.datetime] = {}

    def look(self) -> dict[str, dict[str, Any]]:
        """The namespace's pods by name, noting any newly terminating one."""
        pods = self.cluster.client.get(f"/api/v1/namespaces/{self.namespace}/pods")["items"]
        for pod in pods:
            when = deletion_time(pod)
            if when is not None:
                self.at.setdefault(pod["metadata"]["name"], when)
        return {p["metadata"]["name"]: p for p in pods}


def test_a_leader_killed_mid_preemption_loses_nothing_and_evicts_nobody_twice(
    real_cluster: RealCluster, real_namespace: str, classes: dict[str, str], wait_until: Waiter
) -> None:
    # high (2 units) grows to 5 on a node that is full: steady (2 units, as important)
    # stays, three of the four 1-unit low pods must go, the fourth stays.
    unit = (real_cluster.allocatable_millicores() - real_cluster.requested_millicores()) // 8
    image = real_cluster.image("workload")
    slow = f"trap 'sleep {LOW_GRACE}; exit 0' TERM; while true; do sleep 1 & wait $!; done"
    lows = [f"low-{i}" for i in range(1, 5)]
    start(real_cluster, real_namespace, [
        workload("high", image, classes["high"], guaranteed(f"{2 * unit}m", "32Mi")),
        workload("steady", image, classes["high"], guaranteed(f"{2 * unit}m", "32Mi")),
        *(workload(n, image, classes["low"], guaranteed(f"{unit}m", "32Mi"), script=slow)
          for n in lows),
    ])  # fmt: skip
    leader = leader_pod(real_cluster)
    leader_restarts = restarts(read(real_cluster, NAMESPACE, leader) or {})
    deletions = Deletions(real_cluster, real_namespace)

    real_cluster.kubectl(
        "patch", "-n", real_namespace, "pod", "high", "--subresource", "resize",
        "--patch", resize_patch(5 * unit),
    )  # fmt: skip
    wait_until(lambda: deletions.look() and deletions.at, timeout=15, interval=0.02,
               what="the first eviction")  # fmt: skip
    real_cluster.kill_container(NAMESPACE, leader)
    # Mid-preemption: the victims are still stopping, the resize not yet actuated.
    assert 2 * unit == cpu_running(read(real_cluster, real_namespace, "high"))

    def done() -> bool:
        pods = deletions.look()
        gone = [n for n in lows if n not in pods]
        return cpu_running(pods.get("high")) == 5 * unit and len(gone) >= 3

    wait_until(done, timeout=90, interval=0.1, what="high's resize actuated, three victims gone")
    pods = deletions.look()
    assert ["high", "steady"] == sorted(n for n in pods if n not in lows)
    [left] = [n for n in lows if n in pods]
    assert None is pods[left]["metadata"].get("deletionTimestamp")
    made = evictions_made(
        real_cluster.control_plane.log_dir / "audit.log", real_namespace, deletions.at
    )
    assert {n: 1 for n in lows if n != left} == dict(made)
    # The killed replica came back and serves again.
    assert 2 == wait_ready(real_cluster.client, NAMESPACE, timeout=120)
    assert leader_restarts + 1 == restarts(read(real_cluster, NAMESPACE, leader) or {})
