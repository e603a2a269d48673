"""What :class:`webhook.agent.runtime.Containerd` asks ``ctr`` to remove, given what
``ctr images list`` says (a stand-in ``ctr``). The same removals against the real node's
containerd: tests/e2e/test_runtime_contract.py."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from webhook.agent.runtime import Containerd

HEADER = "REF TYPE DIGEST SIZE PLATFORMS LABELS\n"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CHECKPOINT = "localhost/resize-preemption-checkpoint/team-a/worker/main:0f3c2a9e-1b2"
PULLED = "r.example:5000/rpw/team-a/worker/main"


def row(name: str, digest: str) -> str:
    return (
        f"{name} {MANIFEST} sha256:{digest} 20.6 KiB linux/amd64 io.cri-containerd.image=managed\n"
    )


def stand_in_ctr(tmp_path: Path, listing: str) -> tuple[str, Path]:
    """A ``ctr`` that lists ``listing`` and writes each other command's arguments to
    ``calls``."""
    (tmp_path / "listing").write_text(HEADER + listing)
    calls = tmp_path / "calls"
    script = tmp_path / "ctr"
    script.write_text(
        "#!/bin/sh\n"
        "shift 4\n"  # --address <socket> --namespace k8s.io
        f'[ "$1 $2" = "images list" ] && exec cat {shlex.quote(str(tmp_path / "listing"))}\n'
        f'echo "$@" >> {shlex.quote(str(calls))}\n'
    )
    script.chmod(0o755)
    return str(script), calls


@pytest.mark.parametrize(
    ("listing", "removed", "expected"),
    [
        (row(CHECKPOINT, "aaaa") + row("sha256:cccc", "aaaa") + row("busybox:1", "bbbb")
         + row("sha256:dddd", "bbbb"),
         CHECKPOINT, [f"images rm --sync {CHECKPOINT} sha256:cccc"]),
        (row(f"{PULLED}:0f3c2a9e1b2c", "aaaa") + row(f"{PULLED}@sha256:aaaa", "aaaa")
         + row("sha256:cccc", "aaaa"),
         f"{PULLED}:0f3c2a9e1b2c", [f"images rm --sync {PULLED}:0f3c2a9e1b2c"]),
        (row(f"{PULLED}@sha256:aaaa", "aaaa") + row("sha256:cccc", "aaaa"),
         f"{PULLED}@sha256:aaaa", [f"images rm --sync {PULLED}@sha256:aaaa sha256:cccc"]),
        (row("sha256:cccc", "aaaa"), "sha256:cccc", ["images rm --sync sha256:cccc"]),
        (row("busybox:1", "bbbb") + row("sha256:dddd", "bbbb"), CHECKPOINT, []),
    ],
    ids=["with-its-id", "another-name-holds-it", "the-last-name", "the-id-itself", "absent"],
)  # fmt: skip
def test_a_removed_image_takes_its_id_once_no_other_name_holds_it(
    tmp_path: Path, listing: str, removed: str, expected: list[str]
) -> None:
    ctr, calls = stand_in_ctr(tmp_path, listing)
    Containerd(ctr=ctr, address="/run/containerd/containerd.sock").remove_image(removed)
    assert expected == (calls.read_text().splitlines() if calls.exists() else [])
