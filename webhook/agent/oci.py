"""A checkpoint archive as an OCI image layout tar that containerd imports and restores from.

What containerd v2.3.7 reads (``internal/cri/server/container_checkpoint_linux.go``,
``CRImportCheckpoint`` and ``checkIfCheckpointOCIImage``):

* the image's target blob (here the manifest, which ``index.json`` names) is read as an OCI
  index, and only its ``annotations`` matter: ``org.criu.checkpoint.container.name`` makes it
  a checkpoint image;
* the image's root filesystem (the config's ``rootfs.diff_ids``) is mounted read-only from
  the runtime's snapshotter: ``spec.dump``, ``config.dump``, ``status.dump``, the CRIU
  images under ``checkpoint/`` and ``rootfs-diff.tar`` must be at its root - the archive the
  kubelet wrote, unchanged, is that one layer;
* the platform of the config must be the sandbox's.

``ctr images import`` names the image from ``io.containerd.image.name`` in ``index.json``
(``client/import.go``), with ``org.opencontainers.image.ref.name`` the tag, as containerd's
own exporter writes them.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import platform
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

CHECKPOINT_ANNOTATION = "org.criu.checkpoint.container.name"
IMAGE_NAME_ANNOTATION = "io.containerd.image.name"
REF_NAME_ANNOTATION = "org.opencontainers.image.ref.name"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
GZIP_LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
SPEC_DUMP = "spec.dump"
_CHUNK = 1 << 20
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le"}


class ArchiveError(ValueError):
    """The archive cannot become a checkpoint image; the message says why, in one line."""


@dataclass(frozen=True)
class ImageLayout:
    """What :func:`write_image_layout` wrote: the manifest's digest and the layer's."""

    reference: str
    manifest_digest: str
    layer_digest: str
    layer_size: int


def goarch(machine: str | None = None) -> str:
    """The OCI architecture of this machine (``uname -m`` spelled as Go spells it)."""
    name = machine or platform.machine()
    return _GOARCH.get(name, name)


def _digest_file(path: Path) -> tuple[str, str, bool]:
    """sha256 of the file, of its uncompressed content (the diff id), and whether gzip."""
    with path.open("rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    outer = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            outer.update(chunk)
    if not gzipped:
        return outer.hexdigest(), outer.hexdigest(), False
    inner = hashlib.sha256()
    with gzip.open(path, "rb") as g:
        while chunk := g.read(_CHUNK):
            inner.update(chunk)
    return outer.hexdigest(), inner.hexdigest(), True


def _blob(data: bytes) -> tuple[str, bytes]:
    return hashlib.sha256(data).hexdigest(), data


def _json(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _add_bytes(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    out.addfile(info, io.BytesIO(data))


def _add_dir(out: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    out.addfile(info)


def write_image_layout(
    archive: Path, destination: Path, *, reference: str, container: str, arch: str | None = None
) -> ImageLayout:
    """Write ``destination``: an OCI image layout tar of one image named ``reference``,
    whose single layer is ``archive`` byte for byte and whose manifest carries
    :data:`CHECKPOINT_ANNOTATION` = ``container``. The archive is streamed, never held in
    memory (a checkpoint holds the process's memory)."""
    if not archive.is_file():
        raise ArchiveError(f"{archive} is not a file")
    layer_hex, diff_hex, gzipped = _digest_file(archive)
    size = archive.stat().st_size
    config_hex, config = _blob(
        _json(
            {
                "architecture": goarch(arch),
                "os": "linux",
                "config": {},
                "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_hex}"]},
            }
        )
    )
    annotations = {CHECKPOINT_ANNOTATION: container}
    manifest_hex, manifest = _blob(
        _json(
            {
                "schemaVersion": 2,
                "mediaType": MANIFEST_TYPE,
                "config": {"mediaType": CONFIG_TYPE, "digest": f"sha256:{config_hex}",
                           "size": len(config)},
                "layers": [{"mediaType": GZIP_LAYER_TYPE if gzipped else LAYER_TYPE,
                            "digest": f"sha256:{layer_hex}", "size": size}],
                "annotations": annotations,
            }
        )
    )  # fmt: skip
    tag = reference.rsplit(":", 1)[1] if ":" in reference.rsplit("/", 1)[-1] else "latest"
    index = _json(
        {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": MANIFEST_TYPE,
                    "digest": f"sha256:{manifest_hex}",
                    "size": len(manifest),
                    "annotations": {IMAGE_NAME_ANNOTATION: reference, REF_NAME_ANNOTATION: tag},
                }
            ],
        }
    )
    with tarfile.open(destination, "w", format=tarfile.PAX_FORMAT) as out:
        _add_bytes(out, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}))
        _add_bytes(out, "index.json", index)
        for directory in ("blobs", "blobs/sha256"):
            _add_dir(out, directory)
        _add_bytes(out, f"blobs/sha256/{config_hex}", config)
        _add_bytes(out, f"blobs/sha256/{manifest_hex}", manifest)
        info = tarfile.TarInfo(f"blobs/sha256/{layer_hex}")
        info.size = size
        info.mode = 0o600
        with archive.open("rb") as layer:
            out.addfile(info, layer)
    return ImageLayout(reference, f"sha256:{manifest_hex}", f"sha256:{layer_hex}", size)


def _open_archive(archive: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(archive, "r:*")
    except (OSError, tarfile.TarError) as e:
        raise ArchiveError(f"{archive} is not a tar archive: {e}") from None


def _member(tar: tarfile.TarFile, name: str) -> IO[bytes] | None:
    for member in tar:
        if member.name.lstrip("./") == name and member.isfile():
            return tar.extractfile(member)
    return None


def spec_dump(archive: Path) -> dict[str, Any]:
    """The archive's ``spec.dump``: the OCI runtime spec containerd saved of the container."""
    with _open_archive(archive) as tar:
        member = _member(tar, SPEC_DUMP)
        if member is None:
            raise ArchiveError(f"{archive} holds no {SPEC_DUMP}")
        try:
            spec = json.load(member)
        except ValueError:
            raise ArchiveError(f"{SPEC_DUMP} in {archive} is not JSON") from None
    if not isinstance(spec, dict):
        raise ArchiveError(f"{SPEC_DUMP} in {archive} is not a JSON object")
    return spec


def process_args(archive: Path, spec: Mapping[str, Any] | None = None) -> list[str]:
    """The container's process arguments, ``process.args`` of the archive's ``spec.dump``
    (the OCI runtime spec containerd saved): the restored pod's ``command``."""
    spec = spec_dump(archive) if spec is None else spec
    args = (spec.get("process") or {}).get("args")
    if not isinstance(args, list) or not args or not all(isinstance(a, str) for a in args):
        raise ArchiveError(f"{SPEC_DUMP} in {archive} has no process.args")
    return list(args)


@dataclass(frozen=True)
class Owner:
    """Whose container an archive holds, as containerd annotated its runtime spec
    (``DefaultCRIAnnotations``)."""

    namespace: str
    pod: str
    uid: str
    container: str


def owner_of(spec: Mapping[str, Any]) -> Owner:
    """The pod and container the checkpointed process ran in, from ``spec.dump``'s
    annotations; empty fields where containerd wrote none."""
    notes = spec.get("annotations") or {}
    if not isinstance(notes, Mapping):
        notes = {}
    return Owner(*(str(notes.get(f"io.kubernetes.cri.{k}") or "") for k in _OWNER_KEYS))


_OWNER_KEYS = ("sandbox-namespace", "sandbox-name", "sandbox-uid", "container-name")
