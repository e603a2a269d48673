"""The overrides of scripts/build-node.sh and scripts/build-images.sh: a prepared directory
is used as it is when complete, refused with the missing names when not, and nothing is
built either way."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
NODE_EXECUTABLES = (
    "kubelet",
    "containerd",
    "ctr",
    "containerd-shim-runc-v2",
    "runc",
    "cni/bridge",
    "cni/host-local",
    "cni/loopback",
    "cni/portmap",
)


def _run(script: str, env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPTS / script)],
        env={**os.environ, "RPW_CACHE": str(tmp_path / "cache"), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _node_stack(directory: Path, leave_out: str | None = None) -> Path:
    for name in NODE_EXECUTABLES:
        if name != leave_out:
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            (directory / name).write_text("#!/bin/sh\n")
            (directory / name).chmod(0o755)
    (directory / "VERSIONS").write_text("kubelet v1.37.2\n")
    return directory


def test_a_complete_prepared_node_stack_is_used_as_it_is(tmp_path: Path) -> None:
    stack = _node_stack(tmp_path / "stack")

    result = _run("build-node.sh", {"RPW_NODE_ASSETS": str(stack)}, tmp_path)

    assert (0, str(stack)) == (result.returncode, result.stdout.splitlines()[-1])
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("leave_out", ["kubelet", "cni/portmap"])
def test_an_incomplete_prepared_node_stack_is_refused_by_name(
    tmp_path: Path, leave_out: str
) -> None:
    stack = _node_stack(tmp_path / "stack", leave_out=leave_out)

    result = _run("build-node.sh", {"RPW_NODE_ASSETS": str(stack)}, tmp_path)

    assert 1 == result.returncode
    assert f"RPW_NODE_ASSETS={stack} lacks one of:" in result.stderr
    assert "" == result.stdout


def test_prepared_images_are_used_only_with_their_images_tsv(tmp_path: Path) -> None:
    images = tmp_path / "images"
    images.mkdir()

    refused = _run("build-images.sh", {"RPW_IMAGES": str(images)}, tmp_path)
    (images / "images.tsv").write_text("registry.k8s.io/pause:3.10\tsandbox.tar\tsandbox\n")
    used = _run("build-images.sh", {"RPW_IMAGES": str(images)}, tmp_path)

    assert (1, "") == (refused.returncode, refused.stdout)
    assert "holds no images.tsv" in refused.stderr
    assert (0, str(images)) == (used.returncode, used.stdout.splitlines()[-1])
