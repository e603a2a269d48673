"""The one seam to the container runtime (:class:`Runtime`) and the CRIU probe.

Everything runtime-specific is behind :class:`Runtime`: today containerd through ``ctr``
(:class:`Containerd`), restoring through CreateContainer from a checkpoint image. The
pod-level ``CheckpointPod``/``RestorePod`` calls of the CRI (KEP-5823) replace that path
in containerd v2.4; a runtime speaking them is another implementation of this protocol.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from webhook.agent.records import MIN_CRIU
from webhook.core.checkpoint import image_reference

#: containerd releases whose CRI restores a container from a checkpoint image in
#: CreateContainer: from v2.3.4 only when enabled in its configuration; gone in v2.4.
RESTORE_OPT_IN: tuple[int, int, int] = (2, 3, 4)
RESTORE_GONE: tuple[int, int, int] = (2, 4, 0)
CRI_RUNTIME_PLUGIN = "io.containerd.cri.v1.runtime"
RESTORE_KEY = "enable_experimental_restore_via_create"


class RuntimeFailure(Exception):
    """A runtime command failed; the message is one line."""


@dataclass(frozen=True)
class RuntimeFacts:
    """What the runtime says of itself: ``version`` as ``containerd v2.3.7``; whether it
    restores from a checkpoint image, and why not."""

    version: str
    restore: bool
    message: str = ""


class Runtime(Protocol):
    def probe(self) -> RuntimeFacts: ...

    def import_image(self, layout: Path, reference: str) -> None:
        """Import the OCI image layout tar ``layout``, which names ``reference``; the
        runtime may list the image under its id (``sha256:...``) as well."""
        ...

    def remove_image(self, reference: str) -> None:
        """Remove ``reference``, and its id when no other name holds the image; absent
        already is fine."""
        ...

    def image_names(self) -> set[str]: ...

    def image_digests(self) -> dict[str, str]:
        """Every image's name and the digest of its target (its manifest)."""
        ...


class ImageStore(Protocol):
    """Where a checkpoint image goes, and how it is named: the node's runtime
    (:class:`LocalImages`) or a registry (:class:`webhook.agent.registry.RegistryImages`).
    The agent's pass does not know which."""

    def reference(self, namespace: str, pod: str, container: str, uid: str) -> str: ...

    def store(self, layout: Path, reference: str) -> None:
        """Make the OCI image layout tar ``layout`` available as ``reference``."""
        ...

    def remove(self, reference: str) -> None:
        """Remove ``reference`` wherever :meth:`store` put it; absent already is fine."""
        ...

    def sweep(self) -> list[str]:
        """Remove from this node what the store left here that no record needs any more
        (another node's record ended); the names removed."""
        ...


@dataclass(frozen=True)
class LocalImages:
    """Checkpoint images imported into the node's runtime, under
    ``localhost/resize-preemption-checkpoint/``: a restored pod names them with
    ``imagePullPolicy: Never``."""

    runtime: Runtime

    def reference(self, namespace: str, pod: str, container: str, uid: str) -> str:
        return image_reference(namespace, pod, container, uid)

    def store(self, layout: Path, reference: str) -> None:
        self.runtime.import_image(layout, reference)

    def remove(self, reference: str) -> None:
        self.runtime.remove_image(reference)

    def sweep(self) -> list[str]:
        # A local image is on its record's node only, and that node's agent removes it.
        return []


def run(argv: Sequence[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except FileNotFoundError:
        raise RuntimeFailure(f"{argv[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(f"`{' '.join(argv[:4])}` took over {timeout:g} s") from None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def version_tuple(text: str) -> tuple[int, ...]:
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not match:
        return ()
    return tuple(int(g) for g in match.groups() if g is not None)


def restore_enabled(version: tuple[int, ...], config_text: str | None) -> tuple[bool, str]:
    """Whether containerd ``version`` with configuration ``config_text`` (TOML; None: not
    readable) restores from checkpoint images in CreateContainer, and why not."""
    if not version:
        return False, "containerd's version is unknown"
    if version >= RESTORE_GONE:
        return False, "containerd v2.4 and later restore only through the pod-level CRI calls"
    if version < RESTORE_OPT_IN:
        return True, ""
    if config_text is None:
        return False, "containerd's configuration is not readable (--containerd-config)"
    try:
        config = tomllib.loads(config_text)
    except tomllib.TOMLDecodeError as e:
        return False, f"containerd's configuration is not TOML: {e}"
    section = config.get("plugins", {}).get(CRI_RUNTIME_PLUGIN, {})
    if section.get(RESTORE_KEY) is True:
        return True, ""
    return False, f'containerd: {RESTORE_KEY} is not true in [plugins."{CRI_RUNTIME_PLUGIN}"]'


@dataclass(frozen=True)
class Containerd:
    """containerd through its ``ctr`` client, in the CRI's namespace (``k8s.io``)."""

    ctr: str
    address: str
    namespace: str = "k8s.io"
    snapshotter: str = "overlayfs"
    config: Path | None = None

    def _ctr(self, *args: str, timeout: float = 600) -> str:
        # A command, not only a path: e.g. ``nsenter --target 1 --mount -- ctr`` runs the
        # host's own client from a pod.
        argv = [*shlex.split(self.ctr), "--address", self.address, "--namespace", self.namespace]
        argv += args
        result = run(argv, timeout)
        if result.returncode != 0:
            why = _last_line(result.stderr) or f"exit {result.returncode}"
            raise RuntimeFailure(f"`ctr {' '.join(args[:2])}` failed: {why}")
        return result.stdout

    def probe(self) -> RuntimeFacts:
        try:
            text = self._ctr("version", timeout=30)
        except RuntimeFailure as e:
            return RuntimeFacts("", False, str(e))
        server = text.split("Server:", 1)[-1]
        match = re.search(r"Version:\s*(\S+)", server)
        version = match.group(1) if match else ""
        config_text: str | None = None
        if self.config is not None:
            try:
                config_text = self.config.read_text()
            except OSError:
                config_text = None
        restore, why = restore_enabled(version_tuple(version), config_text)
        return RuntimeFacts(f"containerd {version}".strip(), restore, why)

    def import_image(self, layout: Path, reference: str) -> None:
        self._ctr("images", "import", "--snapshotter", self.snapshotter, str(layout))
        if reference not in self.image_names():
            raise RuntimeFailure(f"{layout.name} imported, but not as {reference}")

    def remove_image(self, reference: str) -> None:
        # The CRI names every image of its namespace by its id too (``sha256:`` and the
        # config's digest, the same target): once no other name holds that target, the id
        # alone would keep the image's content and its unpacked layer on the node.
        listed = self.image_digests()
        if reference not in listed:
            return
        target = listed.pop(reference)
        sharing = [name for name, digest in listed.items() if digest == target]
        ids = sharing if all(name.startswith("sha256:") for name in sharing) else []
        self._ctr("images", "rm", "--sync", reference, *ids)

    def image_names(self) -> set[str]:
        return set(self._ctr("images", "list", "--quiet", timeout=60).split())

    def image_digests(self) -> dict[str, str]:
        # ``REF TYPE DIGEST SIZE PLATFORMS LABELS``: the digest is the first sha256 after
        # the name (an image id is itself named ``sha256:...``).
        listed: dict[str, str] = {}
        for line in self._ctr("images", "list", timeout=60).splitlines()[1:]:
            fields = line.split()
            digests = [f for f in fields[1:] if f.startswith("sha256:")]
            if fields and digests:
                listed[fields[0]] = digests[0]
        return listed


@dataclass(frozen=True)
class CriuFacts:
    version: str
    usable: bool
    message: str = ""


def probe_criu(criu: str) -> CriuFacts:
    """``criu --version`` and ``criu check``: usable when both pass and the version is at
    least :data:`MIN_CRIU`. ``criu`` is a command (``nsenter --target 1 --mount -- criu``
    runs the host's, with its libraries, from a pod)."""
    command = shlex.split(criu)
    try:
        result = run([*command, "--version"], timeout=30)
    except RuntimeFailure as e:
        return CriuFacts("", False, f"CRIU: {e}")
    match = re.search(r"Version:\s*(\S+)", result.stdout)
    version = match.group(1) if match and result.returncode == 0 else ""
    if not version:
        why = _last_line(result.stderr) or "no version"
        return CriuFacts("", False, f"CRIU: `{criu} --version`: {why}")
    if version_tuple(version) < MIN_CRIU:
        need = ".".join(map(str, MIN_CRIU))
        return CriuFacts(version, False, f"CRIU {version} is older than {need}")
    check = run([*command, "check"], timeout=60)
    if check.returncode != 0:
        why = _last_line(check.stderr or check.stdout) or f"exit {check.returncode}"
        return CriuFacts(version, False, f"`criu check` failed: {why}")
    return CriuFacts(version, True)
