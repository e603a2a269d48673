"""`make image` as an operator runs it on this machine, where ``python:3.11-slim-bookworm``
cannot be pulled (no registry, no Docker daemon): it says so in one line, builds the
unchanged Dockerfile on the stand-in base and writes the OCI archive ``IMAGE_ARCHIVE`` names.
The archive is then read as an importer reads it (index.json, the manifest, the config, every
blob against its digest) and its labels checked.

The checkout's remote is given credentials for the build (through git's environment, the
repository untouched): the source label must come without them.

What it builds: the stand-in base (mmdebstrap from Debian 12's packages, about 40 s; none
when `make node` built it for the real node, the same one in the same store) and the image
(the Dockerfile's two stages, pip installing requirements-runtime.lock; 40-110 s here), both
cached under the key of their inputs (the image's: the files it copies, the base, the labels)
in the images store of the cache (``RPW_CACHE``), so a second run on the same commit builds
nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tarfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.binaries import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.image_store]

VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
REFERENCE = f"localhost/resize-preemption-webhook:{VERSION}"
STAND_IN_LINE = "python:3.11-slim-bookworm cannot be pulled here: building on its stand-in"
REMOTE = "https://builder:s3cret@git.example.com/you/rpw.git"
GIT_REMOTE = {
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "remote.origin.url",
    "GIT_CONFIG_VALUE_0": REMOTE,
}
STAND_IN_MARK = (
    "org.opencontainers.image.base.name",
    "localhost/stand-in/python:3.11-slim-bookworm",
)


def make_image(*args: str, timeout: float = 1800) -> tuple[subprocess.CompletedProcess[str], float]:
    """`make image ARGS` with the checkout's remote carrying credentials."""
    began = time.monotonic()
    # As a user types it: not as a sub-make of `make test` (whose make says "make[1]:").
    outer = ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")
    env = {k: v for k, v in os.environ.items() if k not in outer}
    done = subprocess.run(
        ["make", "--no-print-directory", "image", *args],
        cwd=REPO_ROOT, env={**env, **GIT_REMOTE}, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip
    return done, time.monotonic() - began


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False
    ).stdout.strip()


def expected_revision() -> str:
    head = git("rev-parse", "HEAD")
    return f"{head}-dirty" if git("status", "--porcelain") else head


class Layout:
    """An OCI archive read as an importer reads it: every blob it names checked against its
    digest and size."""

    def __init__(self, archive: Path) -> None:
        self.tar = tarfile.open(archive)  # noqa: SIM115 - closed by the fixture

    def raw(self, name: str) -> bytes:
        member = self.tar.extractfile(name)
        assert member is not None, f"{name}: not a file in the archive"
        return member.read()

    def blob(self, descriptor: dict[str, Any]) -> bytes:
        algorithm, _, digest = descriptor["digest"].partition(":")
        assert "sha256" == algorithm, descriptor
        content = self.raw(f"blobs/sha256/{digest}")
        assert digest == hashlib.sha256(content).hexdigest(), descriptor["digest"]
        assert descriptor["size"] == len(content), descriptor["digest"]
        return content


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str, float]:
    """The archive, `make image`'s stdout and stderr, and how long it took."""
    if os.geteuid() != 0:
        pytest.skip("the stand-in base is built as root (mmdebstrap, buildah's overlay storage)")
    archive = tmp_path_factory.mktemp("make-image") / "rpw.tar"
    done, took = make_image(f"IMAGE_ARCHIVE={archive}")
    assert 0 == done.returncode, done.stderr[-4000:]
    print(f"make image: {took:.1f} s")
    return archive, done.stdout, done.stderr, took


@pytest.fixture(scope="module")
def layout(built: tuple[Path, str, str, float]) -> Iterator[Layout]:
    opened = Layout(built[0])
    yield opened
    opened.tar.close()


def test_make_image_prints_the_reference_and_says_when_the_base_is_a_stand_in(
    built: tuple[Path, str, str, float],
) -> None:
    _, stdout, stderr, _ = built

    assert REFERENCE == stdout.splitlines()[-1]
    # This machine pulls nothing: the base comes from Debian's packages, said in one line.
    assert 1 == sum(STAND_IN_LINE in line for line in stderr.splitlines()), stderr[-4000:]


def test_the_archive_is_an_oci_layout_naming_the_image(layout: Layout) -> None:
    assert {"imageLayoutVersion": "1.0.0"} == json.loads(layout.raw("oci-layout"))
    index = json.loads(layout.raw("index.json"))
    (descriptor,) = index["manifests"]
    assert REFERENCE == descriptor["annotations"]["org.opencontainers.image.ref.name"]
    manifest = json.loads(layout.blob(descriptor))

    assert "application/vnd.oci.image.manifest.v1+json" == manifest["mediaType"]
    config = json.loads(layout.blob(manifest["config"]))
    layers = [layout.blob(layer) for layer in manifest["layers"]]
    assert len(config["rootfs"]["diff_ids"]) == len(layers) >= 2  # the base and the venv
    assert ("linux", "amd64") == (config["os"], config["architecture"])
    assert "65532:65532" == config["config"]["User"]
    assert ["python", "-m", "webhook"] == config["config"]["Entrypoint"]


def test_the_labels_say_version_revision_source_and_the_stand_in(
    layout: Layout, built: tuple[Path, str, str, float]
) -> None:
    manifest = json.loads(layout.blob(json.loads(layout.raw("index.json"))["manifests"][0]))
    config = layout.blob(manifest["config"])
    labels = json.loads(config)["config"]["Labels"]

    assert VERSION == labels["org.opencontainers.image.version"]
    assert expected_revision() == labels["org.opencontainers.image.revision"]
    assert "https://git.example.com/you/rpw.git" == labels["org.opencontainers.image.source"]
    assert b"s3cret" not in config  # nor in the history's build arguments
    assert STAND_IN_MARK[1] == labels[STAND_IN_MARK[0]]


def test_a_second_run_builds_nothing_and_writes_the_same_archive(
    built: tuple[Path, str, str, float], tmp_path: Path
) -> None:
    again = tmp_path / "again.tar"
    done, took = make_image(f"IMAGE_ARCHIVE={again}", timeout=300)
    print(f"make image, warm: {took:.1f} s")

    assert 0 == done.returncode, done.stderr[-4000:]
    assert "built already from these inputs" in done.stderr, done.stderr[-4000:]
    assert "STEP" not in done.stderr
    first, second = Layout(built[0]), Layout(again)
    try:
        assert first.raw("index.json") == second.raw("index.json")
    finally:
        first.tar.close()
        second.tar.close()


@pytest.mark.parametrize(
    ("base", "returncode", "says"),
    [
        pytest.param("bogus", 2, "BASE=bogus: want auto, stand-in or upstream", id="unknown"),
        pytest.param(
            "upstream", 1, "python:3.11-slim-bookworm cannot be had with", id="upstream-unpullable"
        ),
    ],
)
def test_base_refusals_are_one_line_and_build_nothing(
    base: str, returncode: int, says: str
) -> None:
    done, _ = make_image(f"BASE={base}", timeout=120)

    script = [line for line in done.stderr.splitlines() if not line.startswith("make: ***")]
    assert [f"Error {returncode}"] == [
        line.rsplit("] ", 1)[1] for line in done.stderr.splitlines() if line.startswith("make: ***")
    ], done.stderr
    assert "" == done.stdout
    assert 1 == len(script), done.stderr
    assert script[0].startswith(f"[build-image] {says}"), done.stderr
