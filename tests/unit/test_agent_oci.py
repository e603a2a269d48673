"""The checkpoint image layout the node agent writes, read back as containerd reads it."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from webhook.agent.oci import (
    CHECKPOINT_ANNOTATION,
    IMAGE_NAME_ANNOTATION,
    LAYER_TYPE,
    ArchiveError,
    process_args,
    write_image_layout,
)

REFERENCE = "localhost/resize-preemption-checkpoint/team-a/worker/main:0f3c2a9e-1b2c"


def make_archive(path: Path, files: dict[str, bytes], *, gzipped: bool = False) -> Path:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = buffer.getvalue()
    path.write_bytes(gzip.compress(raw) if gzipped else raw)
    return path


def spec(args: Any, annotations: dict[str, str] | None = None) -> bytes:
    """A ``spec.dump``: the OCI runtime spec containerd saved, with its CRI annotations."""
    doc = {"ociVersion": "1.2.0", "process": {"args": args, "cwd": "/"}}
    if annotations is not None:
        doc["annotations"] = annotations
    return json.dumps(doc).encode()


def owner(uid: str, pod: str, container: str, namespace: str = "team-a") -> dict[str, str]:
    """The annotations containerd gives a pod's container (``DefaultCRIAnnotations``)."""
    return {
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-uid": uid,
        "io.kubernetes.cri.sandbox-name": pod,
        "io.kubernetes.cri.sandbox-namespace": namespace,
        "io.kubernetes.cri.container-name": container,
    }


def read_layout(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]


def test_the_layout_is_one_image_whose_layer_is_the_archive(tmp_path: Path) -> None:
    archive = make_archive(
        tmp_path / "checkpoint-worker_team-a-main-2026.tar",
        {
            "spec.dump": spec(["sh", "-c", "n=0"]),
            "config.dump": b"{}",
            "checkpoint/pages-1.img": b"\0" * 4096,
        },
    )
    layout = write_image_layout(
        archive, tmp_path / "image.tar", reference=REFERENCE, container="main", arch="x86_64"
    )
    files = read_layout(tmp_path / "image.tar")
    index = json.loads(files["index.json"])
    (entry,) = index["manifests"]
    manifest_blob = files[f"blobs/sha256/{entry['digest'].removeprefix('sha256:')}"]
    manifest = json.loads(manifest_blob)
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    (layer,) = manifest["layers"]
    archive_digest = "sha256:" + hashlib.sha256(archive.read_bytes()).hexdigest()
    assert {"imageLayoutVersion": "1.0.0"} == json.loads(files["oci-layout"])
    assert REFERENCE == entry["annotations"][IMAGE_NAME_ANNOTATION]
    assert "0f3c2a9e-1b2c" == entry["annotations"]["org.opencontainers.image.ref.name"]
    assert {CHECKPOINT_ANNOTATION: "main"} == manifest["annotations"]
    assert (LAYER_TYPE, archive_digest, archive.stat().st_size) == (
        layer["mediaType"],
        layer["digest"],
        layer["size"],
    )
    assert archive.read_bytes() == files[f"blobs/sha256/{archive_digest[7:]}"]
    assert ("amd64", "linux", [archive_digest]) == (
        config["architecture"],
        config["os"],
        config["rootfs"]["diff_ids"],
    )
    assert entry["digest"] == "sha256:" + hashlib.sha256(manifest_blob).hexdigest()
    assert (entry["digest"], archive.stat().st_size) == (layout.manifest_digest, layout.layer_size)


def test_a_gzipped_archive_is_a_gzip_layer_whose_diff_id_is_its_content(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "a.tar", {"spec.dump": spec(["sleep", "1"])}, gzipped=True)
    write_image_layout(archive, tmp_path / "image.tar", reference=REFERENCE, container="main")
    files = read_layout(tmp_path / "image.tar")
    entry = json.loads(files["index.json"])["manifests"][0]
    manifest = json.loads(files[f"blobs/sha256/{entry['digest'][7:]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    content = gzip.decompress(archive.read_bytes())
    assert "application/vnd.oci.image.layer.v1.tar+gzip" == manifest["layers"][0]["mediaType"]
    assert ["sha256:" + hashlib.sha256(content).hexdigest()] == config["rootfs"]["diff_ids"]


def test_process_args_come_from_spec_dump(tmp_path: Path) -> None:
    archive = make_archive(tmp_path / "a.tar", {"./spec.dump": spec(["sh", "-c", "echo $n"])})
    assert ["sh", "-c", "echo $n"] == process_args(archive)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"config.dump": b"{}"}, "holds no spec.dump"),
        ({"spec.dump": b"not json"}, "is not JSON"),
        ({"spec.dump": spec([])}, "has no process.args"),
        ({"spec.dump": spec("sh -c x")}, "has no process.args"),
        ({"spec.dump": b'{"process": {}}'}, "has no process.args"),
    ],
    ids=["no-spec", "not-json", "empty-args", "args-not-a-list", "no-args"],
)
def test_an_archive_without_a_command_is_refused(
    tmp_path: Path, files: dict[str, bytes], message: str
) -> None:
    archive = make_archive(tmp_path / "a.tar", files)
    with pytest.raises(ArchiveError, match=message):
        process_args(archive)


def test_a_file_that_is_no_tar_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.tar").write_bytes(b"plain text, no archive")
    with pytest.raises(ArchiveError, match="is not a tar archive"):
        process_args(tmp_path / "a.tar")
