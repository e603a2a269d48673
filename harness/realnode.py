"""A real node: the upstream kubelet on containerd, runc and CNI, as ``node-1``.

Unlike :mod:`harness.nodes` (the kubelet's code with a fake runtime), containers start here:
containerd runs them with runc in cgroups of this machine, pods get addresses from a CNI
bridge, and a resize writes the container's CPU quota. What it needs comes from two
directories built by the project's scripts:

* the node stack (``scripts/build-node.sh``, :class:`NodeStack`): kubelet, containerd, ctr,
  containerd-shim-runc-v2, runc and the CNI plugins under ``cni/``;
* the images (``scripts/build-images.sh``, :class:`Images`): OCI archives listed in
  ``images.tsv`` with their role (sandbox, workload, product); nothing is ever pulled.

Everything the node writes lives under one state directory (:data:`STATE_DIR`), and the
network pieces have fixed names of ours (:data:`NODE_BRIDGE`, :data:`POD_BRIDGE`,
:data:`NAT_CHAIN`): whatever a killed run left behind is found and removed by
:func:`clean_leftovers` - the same teardown :meth:`RealNode.stop` runs. A second real node
may run beside node-1 (``node-2``, :class:`NodeSlot`): its own state directory, bridges,
node address, pod subnet, NAT chain, cgroup root and pod log directory, and a teardown that
takes only what is its own.

How the node reaches the control plane, and the control plane the node:

* the kubelet's address is :data:`NODE_IP` on a bridge of ours (the kubelet refuses
  loopback, and the machine's own address is not ours to use);
* pods reach kube-apiserver at the ``kubernetes`` Service (``10.0.0.1:443``, what in-cluster
  clients read from their environment) through one DNAT rule to its loopback port, since no
  kube-proxy runs; the control plane's side is :attr:`ControlPlaneConfig.real_nodes`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from harness.binaries import REPO_ROOT
from harness.images import ImagesUnavailable, Role, read_images
from harness.launcher import ControlPlane, free_port
from harness.nodes import NodeError, NodeSpec, wait_node_ready
from harness.processes import ManagedProcess, spawn

STATE_DIR = Path(os.environ.get("RPW_REALNODE_DIR", "/var/lib/rpw-realnode"))
NODE_NAME = "node-1"
NODE_BRIDGE = "rpwnode0"
POD_BRIDGE = "rpwpods0"
NAT_CHAIN = "RPW-REALNODE"
#: From the benchmark range 198.18.0.0/15: never routed anywhere, so nothing of the
#: machine's own networks is shadowed.
NODE_IP = "198.18.0.1"
POD_SUBNET = "198.18.1.0/24"
POD_GATEWAY = "198.18.1.1"
#: The ``kubernetes`` Service's address, the first of the service range.
API_SERVICE_IP = "10.0.0.1"
#: The cgroup (below each hierarchy's root) of the kubelet of node-2 and on: its
#: ``cgroupRoot``, under which it makes ``kubepods``. node-1's pods live in ``/kubepods``.
CGROUP_ROOT_PREFIX = "rpw-node-"
CGROUP_CONTROLLERS = ("cpu", "memory", "pids")
NODE_STACK_NAMES = ("kubelet", "containerd", "ctr", "containerd-shim-runc-v2", "runc")
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")
BUILD_NODE = REPO_ROOT / "scripts" / "build-node.sh"
BUILD_IMAGES = REPO_ROOT / "scripts" / "build-images.sh"
BUILD_CRIU = REPO_ROOT / "scripts" / "build-criu.sh"
OWNER_FILE = "owner.json"

__all__ = [
    "Images",
    "MachineFacts",
    "NodeSlot",
    "NodeStack",
    "PreflightError",
    "RealNode",
    "RealNodeOptions",
    "clean_leftovers",
    "containerd_config",
    "ensure_criu",
    "ensure_images",
    "ensure_node_stack",
    "kubelet_config",
    "machine_facts",
    "make_cgroup_root",
    "preflight",
    "registry_hosts_toml",
]


class PreflightError(RuntimeError):
    """The real node cannot start on this machine; the message says what is missing."""


class NodeStackUnavailable(RuntimeError):
    """The node stack or the images are missing and could not be built."""


# --- what the node runs ---------------------------------------------------------------------


@dataclass(frozen=True)
class NodeStack:
    """The directory ``scripts/build-node.sh`` printed (kubelet, containerd, ctr, the runc
    shim, runc, ``cni/<plugin>``) and the one ``scripts/build-criu.sh`` printed (``criu``,
    which runc runs to checkpoint and restore; None: the node cannot)."""

    directory: Path
    criu_dir: Path | None = None

    def search_path(self, rest: str) -> str:
        """containerd's ``PATH``: CRIU's directory first (an older ``criu`` of the machine,
        e.g. Debian's in ``/usr/sbin``, must not shadow it; the shim and runc inherit this
        PATH), then the node stack (the shim), then ``rest``."""
        first = [str(self.criu_dir)] if self.criu_dir else []
        return ":".join([*first, str(self.directory), *([rest] if rest else [])])

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def cni_dir(self) -> Path:
        return self.directory / "cni"

    def missing(self) -> list[str]:
        names = [*NODE_STACK_NAMES, *(f"cni/{p}" for p in CNI_PLUGINS)]
        return [n for n in names if not os.access(self.path(n), os.X_OK)]


@dataclass(frozen=True)
class Images:
    """The directory ``scripts/build-images.sh`` printed, read by
    :func:`harness.images.read_images` (every role present, every archive there)."""

    directory: Path

    def entries(self) -> list[tuple[str, Path, Role]]:
        """(reference, archive, role) of every image."""
        return [
            (a.reference, self.directory / a.file, a.role)
            for a in read_images(self.directory).values()
        ]

    def reference(self, role: Role) -> str:
        """The image reference of ``role``: sandbox, workload or product."""
        return read_images(self.directory)[role].reference


def _last_line_of(script: Path, what: str) -> Path:
    if not script.exists():
        raise NodeStackUnavailable(f"{script.relative_to(REPO_ROOT)} is missing: {what}")
    result = subprocess.run(
        ["bash", str(script)], stdout=subprocess.PIPE, text=True, check=False, timeout=3600
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise NodeStackUnavailable(
            f"{script.name} failed (exit {result.returncode}); run it to see why ({what})"
        )
    return Path(lines[-1])


def ensure_node_stack() -> NodeStack:
    """The node stack, built on first use by ``scripts/build-node.sh`` (progress on stderr;
    ``RPW_NODE_ASSETS=/dir`` uses a prepared directory)."""
    stack = NodeStack(
        _last_line_of(BUILD_NODE, "the kubelet, containerd, runc, CNI"), criu_dir=ensure_criu()
    )
    if missing := stack.missing():
        raise NodeStackUnavailable(f"{stack.directory} lacks {', '.join(missing)}")
    return stack


def ensure_criu() -> Path:
    """CRIU's directory, built on first use by ``scripts/build-criu.sh``
    (``RPW_CRIU_DIR=/dir`` uses a prepared one)."""
    directory = _last_line_of(BUILD_CRIU, "CRIU, for checkpoint and restore")
    if not os.access(directory / "criu", os.X_OK):
        raise NodeStackUnavailable(f"{directory} holds no executable criu")
    return directory


def ensure_images() -> Images:
    """The images, built on first use by ``scripts/build-images.sh``."""
    images = Images(_last_line_of(BUILD_IMAGES, "the sandbox, workload and product images"))
    try:
        images.entries()
    except ImagesUnavailable as e:
        raise NodeStackUnavailable(str(e)) from None
    return images


# --- preflight: can this machine run it? ------------------------------------------------------


@dataclass(frozen=True)
class MachineFacts:
    """What the real node needs from the machine, as found (:func:`machine_facts`)."""

    root: bool
    filesystems: frozenset[str]
    cgroup_controllers: frozenset[str]
    commands: frozenset[str]
    bridge_links: bool


def machine_facts() -> MachineFacts:
    """Read the facts :func:`preflight` decides on (creates and deletes one bridge to
    learn whether the kernel has them)."""
    commands = frozenset(c for c in ("ip", "iptables") if shutil.which(c))
    root = os.geteuid() == 0
    return MachineFacts(
        root=root,
        filesystems=frozenset(_proc_filesystems()),
        cgroup_controllers=frozenset(_cgroup_controllers()),
        commands=commands,
        bridge_links=root and "ip" in commands and _bridge_links_work(),
    )


def _proc_filesystems() -> list[str]:
    try:
        text = Path("/proc/filesystems").read_text()
    except OSError:
        return []
    return [line.split()[-1] for line in text.splitlines() if line.split()]


def _cgroup_controllers() -> set[str]:
    """Controllers enabled in a mounted hierarchy: v1 (one mount per controller set) or v2
    (``cgroup.controllers`` of the unified root)."""
    found: set[str] = set()
    for mount in _mounts():
        if mount.fstype == "cgroup":
            found.update(o for o in mount.options if o in {"cpu", "memory", "pids", "cpuset"})
        elif mount.fstype == "cgroup2" and mount.target == "/sys/fs/cgroup":
            with contextlib.suppress(OSError):
                found.update((Path(mount.target) / "cgroup.controllers").read_text().split())
    return found


def _bridge_links_work() -> bool:
    probe = "rpwprobe0"
    made = _ip("link", "add", probe, "type", "bridge", check=False).returncode == 0
    if made:
        _ip("link", "del", probe, check=False)
    return made


def preflight(facts: MachineFacts) -> list[str]:
    """What this machine lacks to run a real node, one line each (empty: nothing)."""
    problems = []
    if not facts.root:
        problems.append("not running as root (containerd, runc and the kubelet need it)")
    if "overlay" not in facts.filesystems:
        problems.append("no overlay filesystem in /proc/filesystems (containerd's snapshotter)")
    for controller in CGROUP_CONTROLLERS:
        if controller not in facts.cgroup_controllers:
            problems.append(f"no {controller} cgroup controller mounted")
    for command in ("ip", "iptables"):
        if command not in facts.commands:
            problems.append(f"no `{command}` command on PATH")
    if facts.root and "ip" in facts.commands and not facts.bridge_links:
        problems.append("cannot create a bridge link (`ip link add ... type bridge` fails)")
    return problems


def preflight_message(problems: Sequence[str]) -> str:
    """The one error a person reads: what is missing and what to run instead."""
    lines = "\n".join(f"  - {p}" for p in problems)
    return (
        f"the real node cannot start on this machine:\n{lines}\n"
        "Use NODE=hollow (the default: the same kubelet without containers) instead."
    )


def check_machine() -> None:
    """Raise :class:`PreflightError` when the machine cannot run a real node."""
    if problems := preflight(machine_facts()):
        raise PreflightError(preflight_message(problems))


# --- configuration files (pure) -----------------------------------------------------------------


@dataclass(frozen=True)
class NodeSlot:
    """What sets one real node of this machine apart from the others: ``index`` 1 is
    ``node-1`` with the names and places above (:data:`STATE_DIR`, :data:`NODE_BRIDGE`,
    :data:`POD_BRIDGE`, :data:`NAT_CHAIN`, :data:`NODE_IP`, :data:`POD_SUBNET`, pods in
    ``/kubepods``, their logs in the kubelet's default ``/var/log/pods``); ``index`` N
    the same numbered N, its pods in the cgroup ``/rpw-node-N`` and their logs under its
    state directory. Two kubelets must not share those: each removes the log directories
    of pods it does not know, and sweeps the pod cgroups under its own root."""

    index: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.index <= 200:
            raise ValueError(f"a real node's index is 1 to 200, not {self.index}")

    @property
    def first(self) -> bool:
        return self.index == 1

    @property
    def name(self) -> str:
        return f"node-{self.index}"

    @property
    def state_dir(self) -> Path:
        return STATE_DIR if self.first else STATE_DIR.with_name(f"{STATE_DIR.name}-{self.index}")

    @property
    def node_bridge(self) -> str:
        return NODE_BRIDGE if self.first else f"rpwnode{self.index - 1}"

    @property
    def pod_bridge(self) -> str:
        return POD_BRIDGE if self.first else f"rpwpods{self.index - 1}"

    @property
    def nat_chain(self) -> str:
        return NAT_CHAIN if self.first else f"{NAT_CHAIN}-{self.index}"

    @property
    def node_ip(self) -> str:
        return NODE_IP if self.first else f"198.18.0.{self.index}"

    @property
    def pod_subnet(self) -> str:
        return POD_SUBNET if self.first else f"198.18.{self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        return POD_GATEWAY if self.first else f"198.18.{self.index}.1"

    @property
    def cgroup_root(self) -> str | None:
        """The kubelet's ``cgroupRoot`` (None: its default, ``/``)."""
        return None if self.first else f"/{CGROUP_ROOT_PREFIX}{self.index}"

    @property
    def pod_cgroup(self) -> str:
        """The cgroup, below each hierarchy's root, holding every pod cgroup of the node
        (for node-2 and on, the kubelet's ``cgroupRoot`` itself, which the harness makes)."""
        return "kubepods" if self.cgroup_root is None else self.cgroup_root.lstrip("/")

    def pod_logs_dir(self, paths: NodePaths) -> Path | None:
        """The kubelet's ``podLogsDir`` (None: its default, ``/var/log/pods``)."""
        return None if self.first else paths.root / "pod-logs"


NODE_1 = NodeSlot(1)


@dataclass(frozen=True)
class NodePaths:
    """Where everything of the node lives, under ``root`` (sockets keep it short)."""

    root: Path

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def registry_hosts(self) -> Path:
        """containerd's ``config_path``: ``<host[:port]>/hosts.toml`` per registry."""
        return self.root / "containerd" / "certs.d"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "conf"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def owner(self) -> Path:
        return self.root / OWNER_FILE


def _toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def containerd_config(
    paths: NodePaths, stack: NodeStack, sandbox_image: str, *, opt_dir: Path | None = None
) -> str:
    """containerd's configuration (version 3).

    * ``restrict_oom_score_adj``: the kubelet asks sandboxes for -998, which only a process
      with CAP_SYS_RESOURCE may set; without it every sandbox fails to start.
    * runc is ours (``BinaryName``), with cgroupfs (``SystemdCgroup = false``): the kubelet
      runs with the cgroupfs driver, as no systemd manages this machine's cgroups.
    * the sandbox image is pinned (never garbage-collected: it cannot be pulled again).
    * network namespaces are mounted under the state directory, where teardown finds them.
    * ``enable_experimental_restore_via_create``: CreateContainer restores a container whose
      image is a checkpoint image (off by default since containerd v2.3.4); the kubelet's
      checkpoint API (the ``ContainerCheckpoint`` gate, on by default) makes the archives.
    * the registries' hosts files under ``registry_hosts`` (:func:`registry_hosts_toml`),
      read at each pull: how a test registry's CA and credentials reach the node.
    """
    q = _toml_string
    runtime = '[plugins."io.containerd.cri.v1.runtime"'
    return f"""\
version = 3
root = {q(str(paths.containerd_root))}
state = {q(str(paths.containerd_state))}

[grpc]
  address = {q(str(paths.containerd_socket))}

[plugins."io.containerd.internal.v1.opt"]
  path = {q(str(opt_dir or paths.root / "opt"))}

[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = {q(sandbox_image)}

[plugins."io.containerd.cri.v1.images".registry]
  config_path = {q(str(paths.registry_hosts))}

{runtime}]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_experimental_restore_via_create = true
  cdi_spec_dirs = [{q(str(paths.root / "cdi"))}]

{runtime}.cni]
  bin_dirs = [{q(str(stack.cni_dir))}]
  conf_dir = {q(str(paths.cni_conf_dir))}
  max_conf_num = 1

{runtime}.containerd]
  default_runtime_name = "runc"

{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

{runtime}.containerd.runtimes.runc.options]
  BinaryName = {q(str(stack.path("runc")))}
  SystemdCgroup = false
"""


def registry_hosts_toml(host: str, ca_file: Path, authorization: str) -> str:
    """containerd's ``hosts.toml`` for the registry ``host`` (``address:port``): HTTPS,
    its certificate verified with ``ca_file``, and ``authorization`` (an ``Authorization``
    header's value) sent with every request, as the pull credentials of the node."""
    q = _toml_string
    server = f"https://{host}"
    return f"""\
server = {q(server)}

[host.{q(server)}]
  capabilities = ["pull", "resolve"]
  ca = {q(str(ca_file))}

[host.{q(server)}.header]
  Authorization = [{q(authorization)}]
"""


def cni_config(paths: NodePaths, slot: NodeSlot = NODE_1) -> dict[str, Any]:
    """Pods on the slot's pod bridge (node-1: :data:`POD_BRIDGE`), addresses from its pod
    subnet (:data:`POD_SUBNET`; host-local, its state under ours), the bridge their gateway
    and default route."""
    return {
        "cniVersion": "1.0.0",
        "name": "rpw-pods",
        "plugins": [
            {
                "type": "bridge",
                "bridge": slot.pod_bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(paths.cni_ipam_dir),
                    "ranges": [[{"subnet": slot.pod_subnet, "gateway": slot.pod_gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(
    paths: NodePaths,
    *,
    port: int,
    healthz_port: int,
    max_pods: int,
    feature_gates: Mapping[str, bool],
    status_update_frequency: float,
    client_ca: Path,
    slot: NodeSlot = NODE_1,
) -> dict[str, Any]:
    """The kubelet's KubeletConfiguration for this machine, on the slot's node address.

    * ``failCgroupV1: false``: the kubelet refuses cgroup v1 hosts otherwise;
    * cgroupfs driver, as containerd's runc (no systemd manages cgroups here);
    * ``failSwapOn: false``, ``resolvConf: ""`` (pods resolve nothing; no cluster DNS);
    * no eviction thresholds and image GC at 100/99 %: images cannot be pulled again, and
      a test's node must not evict on its own;
    * authentication and authorization as a production node has them: no anonymous
      callers; client certificates of the control plane's CA (``client_ca``: kube-apiserver's
      ``exec``/``logs`` calls, the tests as the admin) and bearer tokens (a TokenReview: the
      service's account), each request authorized by a SubjectAccessReview (``Webhook``),
      so that a call to ``/checkpoint`` needs ``create`` on ``nodes/checkpoint``;
    * ``syncFrequency: 10s``, the hollow node's: a 1.33 kubelet retries a Deferred resize
      only at the pod's next sync (``canResizePod``), 60-90 s apart by default; from 1.34 a
      pod leaving or shrinking retries it at once;
    * beside node-1, its own ``cgroupRoot`` and ``podLogsDir`` (:class:`NodeSlot`).
    """
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": slot.node_ip,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "resolvConf": "",
        "evictionHard": {},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "maxPods": max_pods,
        "nodeStatusUpdateFrequency": f"{status_update_frequency:g}s",
        "syncFrequency": "10s",
        "serializeImagePulls": False,
        "featureGates": dict(feature_gates),
    }
    if slot.cgroup_root is not None:
        config["cgroupRoot"] = slot.cgroup_root
    if (logs := slot.pod_logs_dir(paths)) is not None:
        config["podLogsDir"] = str(logs)
    return config


def nat_rules(apiserver_port: int, slot: NodeSlot = NODE_1) -> list[list[str]]:
    """iptables arguments (nat table) sending the ``kubernetes`` Service traffic of the
    slot's pods to kube-apiserver's loopback port: the one Service a pod needs without
    kube-proxy. One chain per node, matching its pod bridge only."""
    chain = slot.nat_chain
    return [
        ["-N", chain],
        [
            "-A", chain, "-i", slot.pod_bridge, "-d", f"{API_SERVICE_IP}/32", "-p", "tcp",
            "--dport", "443", "-j", "DNAT", "--to-destination", f"127.0.0.1:{apiserver_port}",
        ],
        ["-I", "PREROUTING", "-j", chain],
    ]  # fmt: skip


# --- the node ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RealNodeOptions:
    """How the real node runs.

    ``feature_gates``: the kubelet's (less those its version does not know).
    ``status_update_frequency``: seconds between the kubelet's Node status syncs.
    ``slot``: which real node of this machine (:class:`NodeSlot`: node-1 by default).
    ``state_dir``: everything the node writes (None: the slot's, for node-1
    :data:`STATE_DIR`); a fixed place so that a later run finds what a killed one left.
    """

    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    max_pods: int = 110
    status_update_frequency: float = 4.0
    ready_timeout: float = 120.0
    start_timeout: float = 30.0
    state_dir: Path | None = None
    verbosity: int = 1
    slot: NodeSlot = NODE_1


class RealNode:
    """``node-1`` (or the node of ``options.slot``) on containerd: use as a context manager
    or start()/stop().

    :meth:`start` checks the machine (:class:`PreflightError`), removes what an earlier run
    left, creates the bridges and the NAT rule, starts containerd, imports every image of
    ``images`` into its ``k8s.io`` namespace, starts the kubelet and waits until the Node is
    Ready, untainted and has its CSINode (:func:`harness.nodes.wait_node_ready`).
    :meth:`stop` removes all of it again, pods' processes included.
    """

    def __init__(
        self,
        control_plane: ControlPlane,
        stack: NodeStack,
        images: Images,
        options: RealNodeOptions | None = None,
        spec: NodeSpec | None = None,
    ) -> None:
        self.control_plane = control_plane
        self.stack = stack
        self.images = images
        self.options = options or RealNodeOptions()
        self.slot = self.options.slot
        self.spec = spec or NodeSpec(self.slot.name)
        self.paths = NodePaths(self.options.state_dir or self.slot.state_dir)
        self.processes: dict[str, ManagedProcess] = {}
        self.started_in: float | None = None
        self.imported_in: float | None = None
        self._stopping = False

    @property
    def name(self) -> str:
        return self.spec.name

    def __enter__(self) -> RealNode:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> RealNode:
        began = time.monotonic()
        check_machine()
        clean_leftovers(self.paths.root, slot=self.slot)
        try:
            self._prepare()
            self._start_containerd()
            self._import_images()
            self._start_kubelet()
            wait_node_ready(
                self.control_plane.client,
                self.spec,
                timeout=self.options.ready_timeout,
                check_alive=self.check_alive,
                log_tail=lambda: self.processes["kubelet"].log_tail(),
            )
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stop the kubelet and containerd and remove every container, mount, network
        namespace, bridge, NAT rule and empty pod cgroup of the node; idempotent."""
        self._stopping = True
        for name in ("kubelet", "containerd"):
            process = self.processes.pop(name, None)
            if process is not None:
                process.stop(timeout=10)
        clean_leftovers(self.paths.root, stack=self.stack, slot=self.slot)

    @property
    def errors(self) -> list[str]:
        return [
            f"{self.name}: {name} exited with {p.popen.returncode}"
            for name, p in self.processes.items()
            if not self._stopping and not p.running()
        ]

    def check_alive(self) -> None:
        for name, process in self.processes.items():
            if not self._stopping and not process.running():
                raise NodeError(
                    f"{name} of {self.name} exited with {process.popen.returncode}:\n"
                    f"{process.log_tail()}"
                )

    def pid(self, name: str = "kubelet") -> int:
        return self.processes[name].pid

    def ctr(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """``ctr --address <ours> --namespace k8s.io args...`` (raises on failure)."""
        argv = [
            str(self.stack.path("ctr")),
            "--address",
            str(self.paths.containerd_socket),
            "--namespace",
            "k8s.io",
            *args,
        ]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise NodeError(f"`ctr {' '.join(args)}` failed: {result.stderr.strip()}")
        return result

    # --- steps --------------------------------------------------------------------------------

    def _prepare(self) -> None:
        paths = self.paths
        for directory in (
            paths.root,
            paths.containerd_root,
            paths.containerd_state,
            paths.cni_conf_dir,
            paths.cni_ipam_dir,
            paths.kubelet_root,
        ):
            directory.mkdir(parents=True, exist_ok=True)
        self._write_owner()
        sandbox = self.images.reference("sandbox")
        paths.containerd_config.write_text(containerd_config(paths, self.stack, sandbox))
        (paths.cni_conf_dir / "10-rpw-pods.conflist").write_text(
            json.dumps(cni_config(paths, self.slot), indent=2)
        )
        self._prepare_network()
        if self.slot.cgroup_root is not None:
            make_cgroup_root(self.slot)

    def _prepare_network(self) -> None:
        slot = self.slot
        _ip("link", "add", slot.node_bridge, "type", "bridge")
        _ip("addr", "add", f"{slot.node_ip}/32", "dev", slot.node_bridge)
        _ip("link", "set", slot.node_bridge, "up")
        # Made here, not by the CNI plugin at the first pod, so that the sysctl below (on this
        # interface only) lets the NAT rule hand pods' packets to a loopback address.
        _ip("link", "add", slot.pod_bridge, "type", "bridge")
        _ip("addr", "add", f"{slot.pod_gateway}/24", "dev", slot.pod_bridge)
        _ip("link", "set", slot.pod_bridge, "up")
        Path(f"/proc/sys/net/ipv4/conf/{slot.pod_bridge}/route_localnet").write_text("1")
        for rule in nat_rules(self.control_plane.ports["apiserver"], slot):
            _iptables(*rule)

    def trust_registry(self, host: str, ca_pem: bytes, authorization: str) -> Path:
        """Let containerd pull from the registry ``host`` (its CA, and ``authorization``
        with every request); the hosts file written. containerd reads it at the next pull."""
        directory = self.paths.registry_hosts / host
        directory.mkdir(parents=True, exist_ok=True)
        ca_file = directory / "ca.crt"
        ca_file.write_bytes(ca_pem)
        hosts = directory / "hosts.toml"
        hosts.write_text(registry_hosts_toml(host, ca_file, authorization))
        hosts.chmod(0o600)  # the credentials
        return hosts

    def _write_owner(self) -> None:
        owner: dict[str, Any] = {
            "pid": os.getpid(),
            "stack": str(self.stack.directory),
            "slot": self.slot.index,
        }
        if self.stack.criu_dir:
            owner["criu"] = str(self.stack.criu_dir)
        self.paths.owner.write_text(json.dumps(owner))

    def _start_containerd(self) -> None:
        # The shim is found on containerd's PATH, runc is named in the runtime options, and
        # runc runs the criu it finds on the PATH it inherits from the shim.
        env = {**os.environ, "PATH": self.stack.search_path(os.environ.get("PATH", ""))}
        log = self.control_plane.log_dir / f"containerd-{self.name}.log"
        argv = [
            str(self.stack.path("containerd")),
            "--config",
            str(self.paths.containerd_config),
            "--log-level",
            "warn",
        ]
        self.processes["containerd"] = spawn(f"containerd-{self.name}", argv, log, env=env)
        deadline = time.monotonic() + self.options.start_timeout
        while True:
            self.check_alive()
            probe = subprocess.run(
                [str(self.stack.path("ctr")), "--address", str(self.paths.containerd_socket),
                 "version"],
                capture_output=True, check=False, timeout=10,
            )  # fmt: skip
            if probe.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise NodeError(
                    f"containerd not serving after {self.options.start_timeout:.0f} s:\n"
                    f"{self.processes['containerd'].log_tail()}"
                )
            time.sleep(0.1)

    def _import_images(self) -> None:
        began = time.monotonic()
        for reference, archive, role in self.images.entries():
            try:
                self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive))
            except NodeError as e:
                raise NodeError(f"the {role} image {reference} did not import: {e}") from None
            listed = self.ctr("images", "list", "--quiet").stdout.split()
            if reference not in listed:
                raise NodeError(
                    f"{archive.name} imported, but not as {reference} (it holds {listed})"
                )
        self.imported_in = time.monotonic() - began

    def _start_kubelet(self) -> None:
        paths = self.paths
        options = self.options
        binaries = self.control_plane.binaries
        gates = binaries.settable(options.feature_gates) if options.feature_gates else {}
        config = kubelet_config(
            paths,
            port=free_port(),
            healthz_port=free_port(),
            max_pods=options.max_pods,
            feature_gates=gates,
            status_update_frequency=options.status_update_frequency,
            client_ca=self.control_plane.pki_dir / "ca.crt",
            slot=self.slot,
        )
        paths.kubelet_config.write_text(yaml.safe_dump(config, sort_keys=False))
        argv = [
            str(self.stack.path("kubelet")),
            f"--config={paths.kubelet_config}",
            f"--kubeconfig={self.control_plane.kubeconfig}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.slot.node_ip}",
            f"--root-dir={paths.kubelet_root}",
            f"--cert-dir={paths.root / 'kubelet-pki'}",
            f"--v={options.verbosity}",
        ]
        env = {**os.environ, "PATH": self.stack.search_path(os.environ.get("PATH", ""))}
        log = self.control_plane.log_dir / f"kubelet-{self.name}.log"
        self.processes["kubelet"] = spawn(f"kubelet-{self.name}", argv, log, env=env)


# --- teardown (also of what a killed run left) -------------------------------------------------


def clean_leftovers(
    root: Path = STATE_DIR, *, stack: NodeStack | None = None, slot: NodeSlot | None = None
) -> list[str]:
    """Remove every piece of the real node of ``slot`` (None: the one its owner file
    names, node-1 for a file that names none) under ``root`` unless a live process owns it.

    In this order: the kubelet and containerd, the shims (reparented away from containerd,
    found by their executable's path) and every process in the slot's pod cgroups; then
    mounts under ``root`` (overlay root filesystems, shm, volumes, network namespaces), the
    slot's bridges, its NAT rule and its pod cgroups once empty. Processes of the node stack
    count as the node's only when their command line or working directory is under
    ``root``: another real node of this machine keeps its own. Returns one line per thing
    removed.
    """
    owner = _read_owner(root)
    if owner is None:
        return []  # written before anything else: without it, nothing here is ours
    if owner.get("pid") != os.getpid() and _alive(int(owner.get("pid", 0))):
        raise PreflightError(
            f"a real node of process {owner['pid']} runs already (state in {root}); only one "
            "runs per machine: stop it first (`make cluster-down`)"
        )
    directory = stack.directory if stack else Path(owner["stack"])
    slot = slot or NodeSlot(int(owner.get("slot", 1)))
    removed: list[str] = []
    names = ("kubelet", "containerd", "containerd-shim-runc-v2", "runc")
    removed += _kill_by_executable([directory / n for n in names], root)
    removed += _kill_cgroup_processes(slot)
    removed += _remove_shim_sockets(root)
    removed += _unmount_under(root)
    for bridge in (slot.pod_bridge, slot.node_bridge):
        if _ip("link", "del", bridge, check=False).returncode == 0:
            removed.append(f"bridge {bridge}")
    removed += _remove_nat_chain(slot.nat_chain)
    removed += _remove_pod_cgroups(slot)
    # The images and snapshots of a run are not reused: the next run starts clean.
    shutil.rmtree(root, ignore_errors=True)
    if root.exists():
        removed.append(f"could not remove {root}")
    return removed


def _read_owner(root: Path) -> dict[str, Any] | None:
    try:
        owner: dict[str, Any] = json.loads((root / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return owner


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_by_executable(executables: Iterable[Path], root: Path) -> list[str]:
    wanted = {str(p.resolve()) for p in executables if p.exists()}
    if not wanted:
        return []
    killed = []
    for pid in _pids():
        try:
            exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
        except OSError:
            continue
        if exe in wanted and _works_under(pid, root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(f"{Path(exe).name} {pid}")
    _wait_gone([int(k.split()[-1]) for k in killed])
    return killed


def _works_under(pid: int, root: Path) -> bool:
    """Whether the process names ``root`` on its command line (the kubelet's and
    containerd's configuration, a shim's containerd socket, runc's log file) or works in
    it (a shim in its task's bundle)."""
    prefixes = {f"{root}/", f"{root.resolve()}/"}
    with contextlib.suppress(OSError):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        if any(prefix in arg for arg in argv for prefix in prefixes):
            return True
    with contextlib.suppress(OSError):
        cwd = os.readlink(f"/proc/{pid}/cwd") + "/"
        return any(cwd.startswith(prefix) for prefix in prefixes)
    return False


def _pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _wait_gone(pids: Sequence[int], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _remove_shim_sockets(root: Path) -> list[str]:
    """The shims' sockets, which live outside our state directory (containerd keeps them
    in a short system path); each task's bundle names its socket in ``bootstrap.json``."""
    removed = []
    for bootstrap in root.glob("containerd/state/io.containerd.runtime.v2.task/*/*/bootstrap.json"):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            address = json.loads(bootstrap.read_text())["address"]
            socket = Path(address.removeprefix("unix://"))
            socket.unlink()
            removed.append(f"shim socket {socket}")
    return removed


def _cgroup_hierarchies() -> list[Path]:
    """The root of every mounted cgroup hierarchy (v1: one per controller set; v2: one)."""
    return [Path(m.target) for m in _mounts() if m.fstype in ("cgroup", "cgroup2")]


def _pod_cgroup_roots(slot: NodeSlot) -> list[Path]:
    """The slot's pod cgroup (:attr:`NodeSlot.pod_cgroup`) in every mounted hierarchy."""
    candidates = (hierarchy / slot.pod_cgroup for hierarchy in _cgroup_hierarchies())
    return [candidate for candidate in candidates if candidate.is_dir()]


def make_cgroup_root(slot: NodeSlot) -> list[Path]:
    """The kubelet's ``cgroupRoot`` of ``slot`` in every mounted hierarchy: the kubelet
    refuses to start unless it exists. A new v1 cpuset takes its parent's CPUs and memory
    nodes (it has none, and no process could join it otherwise)."""
    made = []
    for hierarchy in _cgroup_hierarchies():
        directory = hierarchy / slot.pod_cgroup
        directory.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / name).exists() and not (directory / name).read_text().strip():
                (directory / name).write_text((hierarchy / name).read_text())
        made.append(directory)
    return made


def _kill_cgroup_processes(slot: NodeSlot) -> list[str]:
    pids: set[int] = set()
    for root in _pod_cgroup_roots(slot):
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _wait_gone(sorted(pids))
    return [f"pod process {pid}" for pid in sorted(pids)]


def _remove_pod_cgroups(slot: NodeSlot) -> list[str]:
    removed = []
    for root in _pod_cgroup_roots(slot):
        # Deepest first: a cgroup directory goes only once its children have.
        for directory in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()
            removed.append(f"cgroup {root}")
    return removed


@dataclass(frozen=True)
class _Mount:
    target: str
    fstype: str
    options: frozenset[str]


def _mounts() -> list[_Mount]:
    """This process's mounts from /proc/self/mountinfo (octal escapes decoded)."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    mounts = []
    for line in text.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        target = fields[4].encode().decode("unicode_escape")
        options = frozenset(tail[2].split(",")) | frozenset(fields[5].split(","))
        mounts.append(_Mount(target, tail[0], options))
    return mounts


def _unmount_under(root: Path) -> list[str]:
    prefix = str(root.resolve()) + "/"
    targets = sorted({m.target for m in _mounts() if m.target.startswith(prefix)}, reverse=True)
    removed = []
    for target in targets:
        # Lazy: a mount still busy (a namespace held by a dying process) goes when freed.
        if subprocess.run(["umount", "-l", target], capture_output=True, check=False).returncode:
            continue
        removed.append(f"mount {target}")
    return removed


def _remove_nat_chain(chain: str) -> list[str]:
    if not shutil.which("iptables"):
        return []
    removed = []
    while _iptables("-D", "PREROUTING", "-j", chain, check=False).returncode == 0:
        removed.append(f"iptables jump to {chain}")
    if _iptables("-F", chain, check=False).returncode == 0:
        _iptables("-X", chain, check=False)
        removed.append(f"iptables chain {chain}")
    return removed


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _command(["ip", *args], check)


def _iptables(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return _command(["iptables", "-w", "-t", "nat", *args], check)


def _command(argv: list[str], check: bool) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if check and result.returncode != 0:
        raise NodeError(f"`{' '.join(argv)}` failed: {result.stderr.strip()}")
    return result
