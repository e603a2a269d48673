"""The real node's pure pieces: the preflight's decisions, the configuration it writes, the
images' roles, the CPU quota a container reports and the scaled walkthrough's sizes."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.binaries import Binaries
from harness.chart import operator_values
from harness.launcher import REAL_NODE_CONTROLLERS, ControlPlane, ControlPlaneConfig
from harness.realcluster import (
    CPU_QUOTA_COMMAND,
    MEMORY_COMMAND,
    CpuQuota,
    MemoryUse,
    parse_cpu_quota,
    parse_memory,
)
from harness.realdemo import manifests
from harness.realnode import (
    NODE_IP,
    POD_BRIDGE,
    Images,
    MachineFacts,
    NodePaths,
    NodeStack,
    PreflightError,
    clean_leftovers,
    cni_config,
    containerd_config,
    kubelet_config,
    nat_rules,
    preflight,
    preflight_message,
    registry_hosts_toml,
)
from harness.walkthrough import Walkthrough, scaled_walkthrough

CAPABLE = MachineFacts(
    root=True,
    filesystems=frozenset({"ext4", "overlay", "tmpfs"}),
    cgroup_controllers=frozenset({"cpu", "memory", "pids", "cpuset"}),
    commands=frozenset({"ip", "iptables"}),
    bridge_links=True,
)


@dataclass(frozen=True)
class PreflightCase:
    id: str
    facts: MachineFacts
    problems: list[str]


PREFLIGHT_CASES = [
    PreflightCase("capable machine", CAPABLE, []),
    PreflightCase(
        "no overlayfs",
        replace(CAPABLE, filesystems=frozenset({"ext4"})),
        ["no overlay filesystem in /proc/filesystems (containerd's snapshotter)"],
    ),
    PreflightCase(
        "no memory and pids controllers",
        replace(CAPABLE, cgroup_controllers=frozenset({"cpu"})),
        ["no memory cgroup controller mounted", "no pids cgroup controller mounted"],
    ),
    PreflightCase(
        "no ip command: the bridge probe is not judged",
        replace(CAPABLE, commands=frozenset({"iptables"}), bridge_links=False),
        ["no `ip` command on PATH"],
    ),
    PreflightCase(
        "no bridge link type",
        replace(CAPABLE, bridge_links=False),
        ["cannot create a bridge link (`ip link add ... type bridge` fails)"],
    ),
    PreflightCase(
        "not root",
        replace(CAPABLE, root=False, bridge_links=False),
        ["not running as root (containerd, runc and the kubelet need it)"],
    ),
    PreflightCase(
        "no iptables",
        replace(CAPABLE, commands=frozenset({"ip"})),
        ["no `iptables` command on PATH"],
    ),
]


@pytest.mark.parametrize("case", PREFLIGHT_CASES, ids=lambda c: c.id)
def test_preflight_names_what_the_machine_lacks(case: PreflightCase) -> None:
    assert case.problems == preflight(case.facts)


def test_preflight_message_says_what_is_missing_and_which_node_to_use() -> None:
    message = preflight_message(["no pids cgroup controller mounted"])
    assert "  - no pids cgroup controller mounted" in message.splitlines()
    assert message.splitlines()[-1].startswith("Use NODE=hollow")


def stack(tmp_path: Path) -> NodeStack:
    return NodeStack(tmp_path / "node-stack")


def test_containerd_config_is_the_one_this_machine_needs(tmp_path: Path) -> None:
    paths = NodePaths(tmp_path / "state")
    config = tomllib.loads(containerd_config(paths, stack(tmp_path), "registry.k8s.io/pause:3.10"))
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert (3, str(paths.containerd_root), str(paths.containerd_state)) == (
        config["version"],
        config["root"],
        config["state"],
    )
    assert str(paths.containerd_socket) == config["grpc"]["address"]
    assert True is runtime["restrict_oom_score_adj"]
    assert True is runtime["netns_mounts_under_state_dir"]
    assert True is runtime["enable_experimental_restore_via_create"]
    assert [str(tmp_path / "node-stack" / "cni")] == runtime["cni"]["bin_dirs"]
    assert str(paths.cni_conf_dir) == runtime["cni"]["conf_dir"]
    assert {"BinaryName": str(tmp_path / "node-stack" / "runc"), "SystemdCgroup": False} == (
        runc["options"]
    )
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert ("overlayfs", {"sandbox": "registry.k8s.io/pause:3.10"}) == (
        images["snapshotter"],
        images["pinned_images"],
    )
    assert {"config_path": str(paths.registry_hosts)} == images["registry"]


def test_a_registrys_hosts_file_names_its_ca_and_the_nodes_credentials(tmp_path: Path) -> None:
    hosts = tomllib.loads(registry_hosts_toml("198.18.0.1:5000", tmp_path / "ca.crt", "Basic dTpw"))
    assert {
        "server": "https://198.18.0.1:5000",
        "host": {"https://198.18.0.1:5000": {
            "capabilities": ["pull", "resolve"], "ca": str(tmp_path / "ca.crt"),
            "header": {"Authorization": ["Basic dTpw"]},
        }},
    } == hosts  # fmt: skip


def test_everything_the_node_writes_is_under_its_state_dir(tmp_path: Path) -> None:
    paths = NodePaths(tmp_path / "state")
    config = tomllib.loads(containerd_config(paths, stack(tmp_path), "pause"))
    cni = cni_config(paths)
    written = [
        config["root"],
        config["state"],
        config["grpc"]["address"],
        config["plugins"]["io.containerd.internal.v1.opt"]["path"],
        cni["plugins"][0]["ipam"]["dataDir"],
        str(paths.kubelet_root),
        str(paths.kubelet_config),
    ]
    assert [] == [p for p in written if not p.startswith(f"{tmp_path / 'state'}/")]


def test_kubelet_config_for_a_cgroup_v1_machine_without_systemd(tmp_path: Path) -> None:
    config = kubelet_config(
        NodePaths(tmp_path),
        port=10250,
        healthz_port=10248,
        max_pods=110,
        feature_gates={"A": True},
        status_update_frequency=4.0,
        client_ca=tmp_path / "ca.crt",
    )
    assert {
        "address": NODE_IP,
        "port": 10250,
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "resolvConf": "",
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{tmp_path}/containerd/containerd.sock",
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "featureGates": {"A": True},
    } == {k: config[k] for k in (
        "address", "port", "cgroupDriver", "failCgroupV1", "failSwapOn", "resolvConf",
        "evictionHard", "imageGCHighThresholdPercent", "imageGCLowThresholdPercent",
        "authorization", "containerRuntimeEndpoint", "nodeStatusUpdateFrequency",
        "syncFrequency", "featureGates",
    )}  # fmt: skip
    assert {
        "anonymous": {"enabled": False},
        "webhook": {"enabled": True},
        "x509": {"clientCAFile": f"{tmp_path}/ca.crt"},
    } == config["authentication"]


def test_cni_config_puts_pods_on_our_bridge(tmp_path: Path) -> None:
    plugin = cni_config(NodePaths(tmp_path))["plugins"][0]
    assert (POD_BRIDGE, True, False) == (plugin["bridge"], plugin["isGateway"], plugin["ipMasq"])
    assert [[{"subnet": "198.18.1.0/24", "gateway": "198.18.1.1"}]] == plugin["ipam"]["ranges"]


def test_nat_rule_sends_the_kubernetes_service_to_the_apiserver_port() -> None:
    rules = nat_rules(6443)
    dnat = rules[1]
    assert "10.0.0.1/32" == dnat[dnat.index("-d") + 1]
    assert "127.0.0.1:6443" == dnat[dnat.index("--to-destination") + 1]
    assert ["-I", "PREROUTING", "-j", "RPW-REALNODE"] == rules[-1]


def test_images_are_found_by_role(tmp_path: Path) -> None:
    (tmp_path / "images.tsv").write_text(
        "registry.k8s.io/pause:3.10\tpause.tar\tsandbox\n"
        "example.test/busybox:1\tbusybox.tar\tworkload\n"
        "example.test/product:1\tproduct.tar\tproduct\n"
    )
    for name in ("pause.tar", "busybox.tar", "product.tar"):
        (tmp_path / name).write_bytes(b"")
    images = Images(tmp_path)
    assert "example.test/busybox:1" == images.reference("workload")
    assert [
        ("registry.k8s.io/pause:3.10", tmp_path / "pause.tar", "sandbox"),
        ("example.test/busybox:1", tmp_path / "busybox.tar", "workload"),
        ("example.test/product:1", tmp_path / "product.tar", "product"),
    ] == images.entries()


@dataclass(frozen=True)
class QuotaCase:
    id: str
    printed: str
    quota: CpuQuota
    millicores: int | None


QUOTA_CASES = [
    QuotaCase("cgroup v1", "150000\n100000\n", CpuQuota(150000, 100000), 1500),
    QuotaCase("cgroup v2", "80000 100000\n", CpuQuota(80000, 100000), 800),
    QuotaCase("v1 unlimited", "-1\n100000\n", CpuQuota(None, 100000), None),
    QuotaCase("v2 unlimited", "max 100000\n", CpuQuota(None, 100000), None),
]


@pytest.mark.parametrize("case", QUOTA_CASES, ids=lambda c: c.id)
def test_cpu_quota_as_the_container_prints_it(case: QuotaCase) -> None:
    quota = parse_cpu_quota(case.printed)
    assert (case.quota, case.millicores) == (quota, quota.millicores)


def test_cpu_quota_refuses_what_is_not_one() -> None:
    with pytest.raises(ValueError, match="not a CPU quota"):
        parse_cpu_quota("cat: can't open '/sys/fs/cgroup/cpu.max'")


def test_cpu_quota_command_reads_v1_files_when_v2_is_absent(tmp_path: Path) -> None:
    # The command as a shell runs it, against a v1 layout made here.
    v1 = tmp_path / "sys" / "fs" / "cgroup" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    command = CPU_QUOTA_COMMAND.replace("/sys/", f"{tmp_path}/sys/")
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert 500 == parse_cpu_quota(out.stdout).millicores


@pytest.mark.parametrize(
    ("printed", "expected"),
    [
        pytest.param("536870912\n314572800\n", MemoryUse(536870912, 314572800), id="v1-limit"),
        pytest.param("9223372036854771712\n1048576\n", MemoryUse(None, 1048576), id="v1-unlimited"),
        pytest.param("1073741824\n2048\n", MemoryUse(1073741824, 2048), id="v2-limit"),
        pytest.param("max\n1048576\n", MemoryUse(None, 1048576), id="v2-unlimited"),
    ],
)
def test_memory_as_the_container_prints_it(printed: str, expected: MemoryUse) -> None:
    assert expected == parse_memory(printed)


def test_memory_refuses_what_is_not_one() -> None:
    with pytest.raises(ValueError, match="not a memory limit"):
        parse_memory("cat: can't open '/sys/fs/cgroup/memory.max'")


def test_memory_command_reads_v1_files_when_v2_is_absent(tmp_path: Path) -> None:
    v1 = tmp_path / "sys" / "fs" / "cgroup" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("536870912\n")
    (v1 / "memory.usage_in_bytes").write_text("314572800\n")
    command = MEMORY_COMMAND.replace("/sys/", f"{tmp_path}/sys/")
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert MemoryUse(536870912, 314572800) == parse_memory(out.stdout)


@dataclass(frozen=True)
class WalkCase:
    id: str
    allocatable: int
    requested: int
    walk: Walkthrough


WALK_CASES = [
    WalkCase("the seed's 8-CPU node", 8000, 0, Walkthrough(3000, 4000, 6000)),
    WalkCase("2 CPUs, two webhook pods", 2000, 200, Walkthrough(670, 900, 1350)),
    WalkCase("2 CPUs, nothing else", 2000, 0, Walkthrough(750, 1000, 1500)),
]


@pytest.mark.parametrize("case", WALK_CASES, ids=lambda c: c.id)
def test_walkthrough_scaled_to_the_free_cpu(case: WalkCase) -> None:
    assert case.walk == scaled_walkthrough(case.allocatable, case.requested)


def test_walkthrough_refuses_a_node_without_room() -> None:
    with pytest.raises(ValueError, match="100m CPU free"):
        scaled_walkthrough(2000, 1900)


@given(st.integers(min_value=0, max_value=64_000), st.integers(min_value=0, max_value=64_000))
def test_scaled_walkthrough_keeps_the_story(allocatable: int, requested: int) -> None:
    free = allocatable - requested
    try:
        walk = scaled_walkthrough(allocatable, requested)
    except ValueError:
        assert free < 400  # only nodes too small to tell the story are refused
        return
    assert walk.low + walk.high <= free  # both pods fit
    assert walk.high < walk.target <= free  # the grown pod fits on its own
    assert walk.low + walk.target > free  # but not next to the victim
    assert 0 == walk.low % 10 == walk.high % 10 == walk.target % 10


def test_walkthrough_pods_run_the_workload_image_and_trap_sigterm() -> None:
    import yaml

    docs = [d for d in yaml.safe_load_all(manifests(Walkthrough(670, 900, 1350), "w:1")) if d]
    pods = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Pod"}
    low = pods["low-priority-pod"]["containers"][0]
    assert ("w:1", {"cpu": "670m", "memory": "500Mi"}) == (low["image"], low["resources"]["limits"])
    assert "trap" in low["command"][-1] and "TERM" in low["command"][-1]
    assert {"cpu": "900m", "memory": "1Gi"} == pods["high-priority-pod"]["containers"][0][
        "resources"
    ]["requests"]


def apiserver_of(version: str, directory: Path) -> Binaries:
    """Binaries whose kube-apiserver only says its version."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "kube-apiserver"
    script.write_text(f"#!/bin/sh\necho 'Kubernetes {version}'\n")
    script.chmod(0o755)
    return Binaries(directory)


def test_real_node_control_plane_flags(tmp_path: Path) -> None:
    real = ControlPlane(Binaries(tmp_path), ControlPlaneConfig(state_dir=tmp_path, real_nodes=True))
    hollow = ControlPlane(Binaries(tmp_path), ControlPlaneConfig(state_dir=tmp_path))
    assert [
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={tmp_path}/pki/kubelet-client.crt",
        f"--kubelet-client-key={tmp_path}/pki/kubelet-client.key",
        "--enable-aggregator-routing=true",
    ] == real._real_node_args()
    assert ["--disable-admission-plugins=ServiceAccount"] == hollow._real_node_args()


@pytest.mark.parametrize(
    ("version", "routed_by"),
    [
        pytest.param("v1.33.13", ["endpoints-controller"], id="1.33-endpoints"),
        pytest.param("v1.34.4", [], id="1.34-endpointslices"),
        pytest.param("v1.37.2", [], id="1.37-endpointslices"),
    ],
)
def test_a_real_node_cluster_keeps_what_its_apiserver_routes_webhooks_by(
    tmp_path: Path, version: str, routed_by: list[str]
) -> None:
    binaries = apiserver_of(version, tmp_path / "bin")
    real = ControlPlane(binaries, ControlPlaneConfig(state_dir=tmp_path, real_nodes=True))
    hollow = ControlPlane(binaries, ControlPlaneConfig(state_dir=tmp_path))
    assert ["disruption-controller", *REAL_NODE_CONTROLLERS, *routed_by] == real._controllers()
    assert ["disruption-controller"] == hollow._controllers()


def test_operator_values_pin_to_the_real_node_only_beside_hollow_ones() -> None:
    assert "nodeSelector" not in operator_values(None)
    assert {"kubernetes.io/hostname": "node-1"} == operator_values("node-1")["nodeSelector"]
    assert "self-signed" == operator_values(None)["certificates.mode"]
    # The product image is the local build the node imported, run by its name.
    assert operator_values(None)["image.localBuild"] is True


def test_operator_values_require_the_api_servers_client_certificate_given_its_ca() -> None:
    assert "clientAuth.enabled" not in operator_values(None)
    values = operator_values(None, b"-----BEGIN CERTIFICATE-----\n")
    assert values["clientAuth.enabled"] is True
    assert "-----BEGIN CERTIFICATE-----\n" == values["clientAuth.caBundle"]


def test_leftovers_of_nobody_are_left_alone(tmp_path: Path) -> None:
    (tmp_path / "keep").write_text("")
    assert [] == clean_leftovers(tmp_path)
    assert (tmp_path / "keep").exists()


def test_leftovers_of_a_live_owner_are_refused(tmp_path: Path) -> None:
    (tmp_path / "owner.json").write_text(json.dumps({"pid": os.getppid(), "stack": "/x"}))
    with pytest.raises(PreflightError, match=f"process {os.getppid()} runs already"):
        clean_leftovers(tmp_path)


@pytest.mark.parametrize(
    ("criu", "rest", "expected"),
    [
        ("/c/criu-4.1.1", "/usr/sbin:/usr/bin", "/c/criu-4.1.1:/s/node:/usr/sbin:/usr/bin"),
        (None, "/usr/bin", "/s/node:/usr/bin"),
        ("/c/criu-4.1.1", "", "/c/criu-4.1.1:/s/node"),
    ],
    ids=["criu-before-the-machine's-sbin", "no-criu", "empty-path"],
)
def test_criu_comes_first_on_containerd_path(criu: str | None, rest: str, expected: str) -> None:
    stack = NodeStack(Path("/s/node"), Path(criu) if criu else None)
    assert expected == stack.search_path(rest)
