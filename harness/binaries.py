"""Locating the control-plane binaries (building them on first use).

``scripts/build-control-plane.sh`` owns the build, the cache and the overrides
(``RPW_ASSETS``, ``KUBEBUILDER_ASSETS``, ``RPW_KUBE_VERSION``, ``RPW_ETCD_VERSION``,
``RPW_CACHE``); this module runs it and checks what it printed.

``RPW_FEATURE_GATES_OFF=GateA,GateB`` holds gates off: :meth:`Binaries.settable` leaves
them out as if the version lacked them, so no component of the harness turns them on. A
v1.37 cluster with ``InPlacePodVerticalScalingSchedulerPreemption`` held off is a managed
v1.37 cluster, where nobody may turn an alpha gate on (``make matrix``'s
``v1.37.2-gate-off``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-control-plane.sh"
NAMES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "rpw-node",
)


def listed_feature_gates(help_text: str) -> frozenset[str]:
    """The gate names of a kube component's ``--feature-gates`` help: lines like
    ``kube:InPlacePodVerticalScaling=true|false (BETA - default=true)`` (the ``kube:`` prefix
    appeared in 1.31)."""
    return frozenset(re.findall(r"^\s+(?:kube:)?(\w+)=true\|false \(", help_text, re.M))


def gates_held_off(environ: Mapping[str, str] = os.environ) -> frozenset[str]:
    """The gates ``RPW_FEATURE_GATES_OFF`` (comma-separated) holds off."""
    text = environ.get("RPW_FEATURE_GATES_OFF", "")
    return frozenset(name.strip() for name in text.split(",") if name.strip())


class BinariesUnavailable(RuntimeError):
    """The binaries are missing and could not be built."""


@dataclass(frozen=True)
class Binaries:
    """The directory holding etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
    kubectl and rpw-node (the hollow kubelet of the same version, see harness/node)."""

    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def etcd(self) -> Path:
        return self.path("etcd")

    @property
    def kube_apiserver(self) -> Path:
        return self.path("kube-apiserver")

    @property
    def kube_controller_manager(self) -> Path:
        return self.path("kube-controller-manager")

    @property
    def kube_scheduler(self) -> Path:
        return self.path("kube-scheduler")

    @property
    def kubectl(self) -> Path:
        return self.path("kubectl")

    @property
    def rpw_node(self) -> Path:
        return self.path("rpw-node")

    @cached_property
    def version(self) -> str:
        """kube-apiserver's gitVersion, e.g. "v1.37.2"."""
        out = subprocess.run(
            [str(self.kube_apiserver), "--version"], capture_output=True, text=True, check=True
        ).stdout
        match = re.search(r"v\d+\.\d+\.\d+\S*", out)
        if match is None:
            raise BinariesUnavailable(f"cannot read the version of kube-apiserver: {out!r}")
        return match.group(0)

    @cached_property
    def kube_version(self) -> tuple[int, int]:
        """(major, minor) of kube-apiserver, e.g. (1, 37)."""
        major, minor = self.version.lstrip("v").split(".")[:2]
        return int(major), int(minor)

    @cached_property
    def admission_plugins(self) -> frozenset[str]:
        """Admission plugin names this kube-apiserver knows."""
        out = subprocess.run(
            [str(self.kube_apiserver), "--help"], capture_output=True, text=True, check=False
        ).stdout
        match = re.search(
            r"--enable-admission-plugins strings.*?Comma-delimited list of "
            r"admission plugins: (.*?)\. The order",
            out,
            re.S,
        )
        return frozenset(p.strip() for p in match.group(1).split(",")) if match else frozenset()

    @cached_property
    def feature_gates(self) -> frozenset[str]:
        """Feature gates this version lets a user set (kube-apiserver's ``--help``, which
        lists every gate of the kube components, the kubelet's included; gates that went GA
        and are locked on are not listed)."""
        out = subprocess.run(
            [str(self.kube_apiserver), "--help"], capture_output=True, text=True, check=False
        ).stdout
        return listed_feature_gates(out)

    def settable(self, gates: Mapping[str, bool]) -> dict[str, bool]:
        """``gates`` without those this version does not know: a gate newer than the binary
        means the feature is absent, and the binary would refuse to start with it. Nor
        those :func:`gates_held_off` holds off."""
        known = self.feature_gates - gates_held_off()
        return {name: value for name, value in gates.items() if name in known}

    def missing(self) -> list[str]:
        return [n for n in NAMES if not os.access(self.path(n), os.X_OK)]


def ensure_binaries(*, quiet: bool = False) -> Binaries:
    """Return the binaries, building them if needed (progress goes to stderr).

    A cold build takes a quarter of an hour on two cores; later calls return at once.
    """
    stderr = subprocess.DEVNULL if quiet else sys.stderr
    result = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, stderr=stderr, text=True, check=False
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise BinariesUnavailable(
            f"{BUILD_SCRIPT.name} failed (exit {result.returncode}); run it to see why"
        )
    binaries = Binaries(Path(lines[-1]))
    if missing := binaries.missing():
        raise BinariesUnavailable(f"{binaries.directory} lacks {', '.join(missing)}")
    return binaries
