"""Fixtures for end-to-end tests against a real local control plane.

* ``cluster`` (session): etcd, kube-apiserver, kube-controller-manager (disruption,
  deployment and replicaset controllers), kube-scheduler and ``node-1`` (8 CPU, 16Gi, 110
  pods): a hollow kubelet (the v1.37.2 kubelet without containers, :mod:`harness.nodes`)
  whose containers stop within 1 s. Logs stay under pytest's basetemp.
* ``namespace``: a fresh namespace per test; its pods are removed (and gone from the node)
  before the next test starts, so every test finds node-1 empty.
* ``kubectl``: runs the real kubectl against the cluster, in the test's namespace.
* ``api_client`` / ``core_v1`` / ``policy_v1``: the official client on its own
  Configuration (never the process-global one).
* ``webhook``: the webhook service started and registered (for tests of the service; the
  harness's own tests do not use it).
* ``service_mode``: how the API server reaches the service that ``start_service`` (and
  the reconciler tests' replicas) start. ``client-ca`` (the default):
  the service requires kube-apiserver's client certificate; ``managed``: it asks for none,
  as on GKE, EKS or AKS, where nobody configures the API server's client certificate for
  webhooks. A test (or module) marked ``service_modes`` that starts a service runs in both,
  or in the modes the mark names, the mode in its id (``[client-ca]``, ``[managed]``).
* Version keys: ``@pytest.mark.needs_kube(minor, why)`` and
  ``@pytest.mark.needs_gate(gate, why)`` skip, with a reason naming the cluster's version,
  a test the binaries under test cannot run (:func:`missing_requirement`); nothing is
  skipped without one.
* ``real_cluster`` (session): the same control plane with ``node-1`` as the real kubelet on
  containerd and the webhook installed by its Helm chart from the locally built image
  (:class:`harness.realcluster.RealCluster`: ``exec``, ``cpu_quota``, ``image``,
  ``install_chart`` ...). Skipped, with the preflight's reason, only on a machine that cannot
  run a real node. ``real_namespace``: a fresh namespace on it per test.
"""

from __future__ import annotations

import functools
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from harness.binaries import Binaries, ensure_binaries
from harness.kubeapi import ApiError, KubeClient
from harness.kubectl import Kubectl
from harness.launcher import ControlPlane, ControlPlaneConfig
from harness.nodes import HollowNodes, NodeOptions, default_nodes
from harness.processes import install_signal_handlers
from harness.realcluster import RealCluster, RealClusterOptions
from harness.realnode import (
    ensure_images,
    ensure_node_stack,
    machine_facts,
    preflight,
    preflight_message,
)
from harness.webhook_process import WebhookProcess, start_webhook

NODE = "node-1"
GRACE_CAP = 1.0
#: The service's modes (see the module's docstring); the first is the default.
SERVICE_MODES = ("client-ca", "managed")
#: The scheduler's resize preemption (KEP-5836), alpha in v1.37 and absent before.
SCHEDULER_GATE = "InPlacePodVerticalScalingSchedulerPreemption"
#: Why a test of upstream's resize preemption needs that gate.
UPSTREAM_WHY = f"the scheduler's {SCHEDULER_GATE} gate (upstream's resize preemption)"


def pytest_configure(config: pytest.Config) -> None:
    for line in (
        "service_modes(*modes): each test that starts the service runs in each of modes "
        "(default: client-ca and managed, no client certificate), the mode in its id",
        "needs_kube(minor, why): skipped, with why, on Kubernetes versions before 1.<minor>",
        "needs_gate(gate, why): skipped, with why, where the binaries lack the feature gate "
        "or RPW_FEATURE_GATES_OFF holds it off",
        "image_store: writes the image store the real node's images come from; runs in "
        "the machine's xdist group",
    ):
        config.addinivalue_line("markers", line)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    mark = metafunc.definition.get_closest_marker("service_modes")
    if mark is not None and "service_mode" in metafunc.fixturenames:
        modes = mark.args or SERVICE_MODES
        assert set(modes) <= set(SERVICE_MODES), f"unknown service modes {modes}"
        metafunc.parametrize("service_mode", modes, indirect=True)


#: How much later than a 1.34+ kubelet a 1.33 one may retry a Deferred resize once room
#: appears. From 1.34 the allocation manager retries pending resizes when a pod is removed
#: or shrinks; 1.33 decides in ``Kubelet.canResizePod`` and leaves the retry to the pod's
#: next sync ("Let the next sync iteration retry the resize", pkg/kubelet/kubelet.go), which
#: comes syncFrequency (10 s in harness/node/main.go) plus up to 50% jitter after the last
#: one (``completeWork`` in pkg/kubelet/pod_workers.go).
SYNC_RETRY_1_33 = 15.0


def resize_retry_delay(binaries: Binaries) -> float:
    """Seconds to add to a wait for a Deferred resize to be actuated once its room is
    free: :data:`SYNC_RETRY_1_33` on a 1.33 kubelet, nothing later."""
    return SYNC_RETRY_1_33 if binaries.kube_version < (1, 34) else 0.0


def resize_events(binaries: Binaries) -> set[str]:
    """The resize events the kubelet of ``binaries`` emits for an accepted resize: none
    before 1.34, ResizeCompleted from 1.34, ResizeStarted too from 1.35."""
    minor = binaries.kube_version[1]
    if minor >= 35:
        return {"ResizeStarted", "ResizeCompleted"}
    return {"ResizeCompleted"} if minor == 34 else set()


#: Why a test that lowers a memory limit in place needs 1.34 (``needs_kube(34, ...)``).
NO_MEMORY_LIMIT_DECREASE = (
    "the API server lowers a memory limit in place (1.33 refuses it: 'memory limits cannot "
    "be decreased unless resizePolicy is RestartContainer', pkg/apis/core/validation)"
)
#: Why a test that expects the API server to refuse a resize beyond the node needs 1.36.
RESIZE_VALIDATOR = (
    "the API server refuses a resize beyond the node's allocatable (PodResizeValidator, "
    "from 1.36; before, the kubelet marks it Infeasible)"
)


@functools.cache
def binaries_under_test() -> Binaries:
    """The binaries the session's clusters run (built first if need be: RPW_ASSETS,
    RPW_KUBE_VERSION...)."""
    return ensure_binaries()


def missing_requirement(item: pytest.Item, binaries: Binaries) -> str | None:
    """Why ``item`` cannot run on ``binaries`` (its ``needs_kube``/``needs_gate`` marks), or
    None when it can."""
    version = binaries.version
    for mark in item.iter_markers("needs_kube"):
        minor, why = mark.args
        if binaries.kube_version < (1, minor):
            return f"needs v1.{minor}+: {why} (this cluster: {version})"
    for mark in item.iter_markers("needs_gate"):
        gate, why = mark.args
        if gate not in binaries.feature_gates:
            return f"needs a version with {gate}: {why} (this cluster: {version})"
        if gate not in binaries.settable({gate: True}):
            return f"{gate} held off by RPW_FEATURE_GATES_OFF: {why} (this cluster: {version})"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    marked = item.get_closest_marker("needs_kube") or item.get_closest_marker("needs_gate")
    if marked and (why := missing_requirement(item, binaries_under_test())) is not None:
        pytest.skip(why)


@dataclass(frozen=True)
class Cluster:
    """The running local cluster of a test session."""

    control_plane: ControlPlane
    nodes: HollowNodes
    binaries: Binaries

    @property
    def kubeconfig(self) -> Path:
        return self.control_plane.kubeconfig

    @property
    def client(self) -> KubeClient:
        """The harness's raw JSON client (admin)."""
        return self.control_plane.client

    def known_pods(self) -> list[tuple[str, str]]:
        return self.nodes.known_pods()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    install_signal_handlers()
    binaries = binaries_under_test()
    config = ControlPlaneConfig(
        state_dir=tmp_path_factory.mktemp("cluster"), workload_controllers=True
    )
    with ControlPlane(binaries, config) as control_plane:
        nodes = HollowNodes(control_plane, default_nodes(1), NodeOptions(stop_grace_cap=GRACE_CAP))
        with nodes:
            yield Cluster(control_plane, nodes, binaries)
            assert not nodes.errors, f"a node failed: {nodes.errors!r}"


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{slug}-{secrets.token_hex(3)}"
    cluster.client.create("/api/v1/namespaces", {"metadata": {"name": name}})
    yield name
    _remove_namespace(cluster, name)


def _remove_namespace(cluster: Cluster | RealCluster, name: str) -> None:
    """Remove pods at once, then the namespace (no namespace controller runs to do it)."""
    api = cluster.client
    api.request("DELETE", f"/api/v1/namespaces/{name}/pods", body={"gracePeriodSeconds": 0})
    deadline = time.monotonic() + 15
    while any(ns == name for ns, _ in cluster.known_pods()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"pods of namespace {name} were not removed from the node")
        time.sleep(0.05)
    try:
        api.delete(f"/api/v1/namespaces/{name}")
        namespace = api.get(f"/api/v1/namespaces/{name}")
        namespace["spec"]["finalizers"] = []
        api.replace(f"/api/v1/namespaces/{name}/finalize", namespace)
    except ApiError as e:
        if e.status != 404:
            raise


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """node-1 real, the chart installed; see :class:`harness.realcluster.RealCluster`."""
    if problems := preflight(machine_facts()):
        pytest.skip(preflight_message(problems))
    install_signal_handlers()
    # A node stack or an image that does not build fails the tests, with the build's message.
    binaries, stack, images = ensure_binaries(), ensure_node_stack(), ensure_images()
    options = RealClusterOptions(state_dir=tmp_path_factory.mktemp("real-cluster"))
    with RealCluster(binaries, stack, images, options) as cluster:
        yield cluster
        assert not cluster.errors, f"the real node failed: {cluster.errors!r}"


@pytest.fixture
def real_namespace(real_cluster: RealCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace with its ``default`` service account; its pods are gone from
    node-1 before the next test starts."""
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{slug}-{secrets.token_hex(3)}"
    real_cluster.create_namespace(name)
    yield name
    _remove_namespace(real_cluster, name)


@pytest.fixture
def kubectl(cluster: Cluster, namespace: str) -> Kubectl:
    return Kubectl(cluster.binaries.kubectl, cluster.kubeconfig, namespace)


@pytest.fixture(scope="session")
def api_client(cluster: Cluster) -> Iterator[k8s.ApiClient]:
    # new_client_from_config fills a fresh Configuration instead of the global default.
    api = k8s_config.new_client_from_config(
        config_file=str(cluster.kubeconfig), persist_config=False
    )
    yield api
    api.close()


@pytest.fixture
def core_v1(api_client: k8s.ApiClient) -> k8s.CoreV1Api:
    return k8s.CoreV1Api(api_client)


@pytest.fixture
def policy_v1(api_client: k8s.ApiClient) -> k8s.PolicyV1Api:
    return k8s.PolicyV1Api(api_client)


@pytest.fixture
def service_mode(request: pytest.FixtureRequest) -> str:
    """``client-ca`` or ``managed`` (see the module's docstring)."""
    mode: str = getattr(request, "param", SERVICE_MODES[0])
    return mode


def client_auth_of(mode: str, asked: bool = True) -> bool:
    """Whether the service requires kube-apiserver's client certificate: in ``client-ca``
    mode when the test does not ask otherwise, never in ``managed`` mode."""
    return asked and mode == "client-ca"


@pytest.fixture(scope="session")
def webhook(cluster: Cluster) -> Iterator[WebhookProcess]:
    process = start_webhook(cluster.client, cluster.kubeconfig, cluster.control_plane.state_dir)
    yield process
    process.stop()


StartService = Callable[..., WebhookProcess]


@pytest.fixture
def start_service(cluster: Cluster, service_mode: str) -> Iterator[StartService]:
    """``start_service(*serve_flags)``: the service process, started with an empty ledger
    and registered; stopped and unregistered when the test ends. ``client_auth=False``
    leaves out ``--client-ca`` (so does ``managed`` mode)."""
    # service_support builds on this module; imported here to keep the import one-way.
    from tests.e2e.service_support import clear_ledger

    started: list[WebhookProcess] = []
    clear_ledger(cluster)

    def start(*flags: str, client_auth: bool = True) -> WebhookProcess:
        process = start_webhook(
            cluster.client,
            cluster.kubeconfig,
            cluster.control_plane.state_dir,
            extra_args=flags,
            client_auth=client_auth_of(service_mode, client_auth),
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
    clear_ledger(cluster)


Waiter = Callable[..., Any]


def victim_leaves(cluster: Cluster, namespace: str, name: str, wait_until: Waiter) -> None:
    """Call once the preemptor's resize is actuated: the victim is terminating or gone then,
    and gone soon after. The kubelet retries a deferred resize as soon as the victim's
    containers have stopped, before it posts the victim's terminal status and deletes the
    object, so the object may outlive the actuation by a few hundred milliseconds."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    pod = cluster.client.get_or_none(path)
    assert pod is None or pod["metadata"].get("deletionTimestamp"), f"{name} still runs"
    wait_until(lambda: cluster.client.get_or_none(path) is None, what=f"{name} to be gone")


@pytest.fixture
def wait_until() -> Waiter:
    """``wait_until(condition, timeout=10, what="...")``: poll until ``condition()`` is truthy.

    Returns that value, or fails the test after ``timeout`` seconds.
    """

    def wait(
        condition: Callable[[], Any],
        *,
        timeout: float = 10.0,
        interval: float = 0.05,
        what: str = "",
    ) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            result = condition()
            if result:
                return result
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout} s waiting for {what or condition}")
            time.sleep(interval)

    return wait


@pytest.fixture
def priority_classes(cluster: Cluster) -> Iterator[dict[str, str]]:
    """Two PriorityClasses with unique names: {"high": ..., "low": ...}."""
    suffix = secrets.token_hex(3)
    names = {"high": f"high-{suffix}", "low": f"low-{suffix}"}
    for key, value in (("high", 1_000_000), ("low", 1_000)):
        cluster.client.create(
            "/apis/scheduling.k8s.io/v1/priorityclasses",
            {"metadata": {"name": names[key]}, "value": value},
        )
    yield names
    for name in names.values():
        cluster.client.delete(f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")


#: The pytest-xdist group (``--dist loadgroup``) of the tests that share something of the
#: machine's: the real node (its fixed state directory, bridges and NAT rules), the demos'
#: cluster directory, the image store `make image` writes. One worker runs them all, in
#: order; every other worker runs hollow clusters of its own.
MACHINE_GROUP = "machine"


def xdist_group(item: pytest.Item) -> str | None:
    """Where ``item`` runs under pytest-xdist: :data:`MACHINE_GROUP`, its module's group
    for the other end-to-end tests (a module's module-scoped clusters and scenario sets
    are set up once, in one worker), or None (any worker, unit tests)."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if (
        item.get_closest_marker("realnode")
        or item.get_closest_marker("demo")
        or item.get_closest_marker("image_store")
        or fixtures & {"real_cluster", "real_namespace"}
    ):
        return MACHINE_GROUP
    if item.get_closest_marker("e2e"):
        return item.nodeid.split("::", 1)[0]
    return None


# A wrapper, so that this comes before pytest-xdist's worker reads the groups.
@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Iterator[None]:
    """The demos first: each starts its own cluster, and a real node has one owner at a
    time, so they run before any test's session cluster holds node-1. Each test in its
    xdist group (:func:`xdist_group`)."""
    items.sort(key=lambda item: item.get_closest_marker("demo") is None)
    groups: dict[pytest.Item, str] = {}
    for item in items:
        if (group := xdist_group(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            groups[item] = group
    yield
    # pytest-xdist's worker has now put each group on its test's node id, which its
    # scheduler reads; where it could not, two workers would share the real node.
    if os.environ.get("PYTEST_XDIST_WORKER") and config.getvalue("loadgroup"):
        lost = [
            item.nodeid for item, group in groups.items() if not item.nodeid.endswith(f"@{group}")
        ]
        if lost:
            raise pytest.UsageError(
                f"pytest-xdist ignored the xdist_group of {len(lost)} tests ({lost[0]}, ...): "
                "this pytest lets no plugin change a node id (pytest-dev/pytest-xdist#1386)"
            )
