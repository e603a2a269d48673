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

``PLATFORMS=linux/amd64,linux/arm64`` builds the image for both, the arm64 one on an arm64
stand-in (mmdebstrap ``--architectures=arm64``) with its RUN steps under QEMU, into one OCI
archive holding the image index: read back, the index names exactly those two platforms,
each image's compiled extensions are for its machine (their ELF headers), and the arm64
image, imported into a storage of the test's own, runs ``python -m webhook --version``
under emulation. The amd64 image is the one the tests above built, cached; the arm64 one
takes the stand-in (a few minutes: its packages' scripts run emulated) and the build (pip
under emulation), cached as well.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
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
PLATFORMS = "linux/amd64,linux/arm64"
#: ELF's e_machine of each architecture (the System V ABI's EM_X86_64 and EM_AARCH64).
E_MACHINE = {"amd64": 62, "arm64": 183}
SITE_PACKAGES = "opt/venv/lib/python3.11/site-packages/"


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


def e_machine(elf: bytes) -> int:
    """The machine an ELF file is for: e_machine, 2 bytes at offset 18, in the byte order
    its e_ident says (byte 5: 1 little-endian, 2 big-endian)."""
    assert b"\x7fELF" == elf[:4], elf[:20]
    return int.from_bytes(elf[18:20], "little" if elf[5] == 1 else "big")


def layer_files(
    layout: Layout, manifest: dict[str, Any], suffixes: tuple[str, ...]
) -> dict[str, bytes]:
    """The first 64 bytes of every regular file of the image's layers whose name ends with
    one of ``suffixes``, by path, as the image's root filesystem has it (a later layer's
    file replaces an earlier one's)."""
    found: dict[str, bytes] = {}
    for descriptor in manifest["layers"]:
        with tarfile.open(fileobj=io.BytesIO(layout.blob(descriptor)), mode="r:*") as layer:
            for member in layer:
                name = member.name.removeprefix("./")
                if member.isfile() and name.endswith(suffixes):
                    extracted = layer.extractfile(member)
                    assert extracted is not None
                    found[name] = extracted.read(64)
    return found


@pytest.fixture(scope="module")
def built_multi(
    built: tuple[Path, str, str, float], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, str, str, float]:
    """`make image PLATFORMS=linux/amd64,linux/arm64`: the archive, stdout, stderr and how
    long it took. After ``built``, whose amd64 image it takes from the cache."""
    archive = tmp_path_factory.mktemp("make-image-multi") / "rpw.tar"
    done, took = make_image(f"PLATFORMS={PLATFORMS}", f"IMAGE_ARCHIVE={archive}", timeout=2400)
    assert 0 == done.returncode, done.stderr[-4000:]
    print(f"make image PLATFORMS={PLATFORMS}: {took:.1f} s")
    return archive, done.stdout, done.stderr, took


@pytest.fixture(scope="module")
def multi(built_multi: tuple[Path, str, str, float]) -> Iterator[Layout]:
    opened = Layout(built_multi[0])
    yield opened
    opened.tar.close()


def platform_manifests(layout: Layout) -> dict[str, dict[str, Any]]:
    """The image index the archive's index.json names, read: each platform's manifest by its
    architecture, its platform checked against its config's."""
    (descriptor,) = json.loads(layout.raw("index.json"))["manifests"]
    assert REFERENCE == descriptor["annotations"]["org.opencontainers.image.ref.name"]
    assert "application/vnd.oci.image.index.v1+json" == descriptor["mediaType"]
    index = json.loads(layout.blob(descriptor))
    manifests: dict[str, dict[str, Any]] = {}
    for entry in index["manifests"]:
        manifest = json.loads(layout.blob(entry))
        config = json.loads(layout.blob(manifest["config"]))
        platform = entry["platform"]
        assert (config["os"], config["architecture"]) == (platform["os"], platform["architecture"])
        assert "linux" == platform["os"]
        assert platform["architecture"] not in manifests, index
        manifests[platform["architecture"]] = manifest
    return manifests


def test_the_multi_platform_archive_is_an_index_of_exactly_amd64_and_arm64(
    built_multi: tuple[Path, str, str, float], multi: Layout
) -> None:
    _, stdout, stderr, _ = built_multi
    manifests = platform_manifests(multi)

    assert REFERENCE == stdout.splitlines()[-1]
    assert {"amd64", "arm64"} == set(manifests)
    for arch, manifest in manifests.items():
        config = json.loads(multi.blob(manifest["config"]))
        labels = config["config"]["Labels"]
        assert VERSION == labels["org.opencontainers.image.version"], arch
        assert expected_revision() == labels["org.opencontainers.image.revision"], arch
        assert STAND_IN_MARK[1] == labels[STAND_IN_MARK[0]], arch
        assert ["python", "-m", "webhook"] == config["config"]["Entrypoint"], arch
    # The amd64 image is the one `make image` without PLATFORMS built, from the cache.
    assert "built already from these inputs" in stderr, stderr[-4000:]


def test_each_platform_s_compiled_extensions_and_python_are_for_its_machine(
    multi: Layout,
) -> None:
    for arch, manifest in platform_manifests(multi).items():
        files = layer_files(multi, manifest, (".so", "usr/bin/python3.11"))
        wheels = {
            path: head
            for path, head in files.items()
            if path.startswith(SITE_PACKAGES) and path.endswith(".so")
        }
        rust = f"{SITE_PACKAGES}cryptography/hazmat/bindings/_rust.abi3.so"
        pythons = {path: head for path, head in files.items() if path == "usr/bin/python3.11"}

        assert rust in wheels, (arch, sorted(wheels)[:20])
        assert len(wheels) >= 10, (arch, sorted(wheels))
        assert {E_MACHINE[arch]} == {e_machine(head) for head in wheels.values()}, arch
        assert [E_MACHINE[arch]] == [e_machine(head) for head in pythons.values()], arch


@pytest.fixture
def arm64_container(
    built_multi: tuple[Path, str, str, float], tmp_path: Path
) -> Iterator[list[str]]:
    """The arm64 image of the archive in a buildah storage of this test's own, as a working
    container: the buildah command line to run in it."""
    storage = tmp_path / "buildah"
    buildah = ["buildah", "--root", f"{storage}/storage", "--runroot", f"{storage}/run",
               "--storage-driver", "overlay"]  # fmt: skip
    container = subprocess.run(
        [*buildah, "from", "--quiet", "--arch", "arm64", f"oci-archive:{built_multi[0]}"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        yield [*buildah, "run", "--isolation", "chroot", container, "--"]
    finally:
        subprocess.run([*buildah, "rm", "--all"], capture_output=True, check=False)
        subprocess.run([*buildah, "rmi", "--all", "--force"], capture_output=True, check=False)
        shutil.rmtree(storage, ignore_errors=True)


def test_the_arm64_image_runs_the_webhook_under_emulation(arm64_container: list[str]) -> None:
    here = subprocess.run(
        [str(REPO_ROOT / ".venv" / "bin" / "python"), "-m", "webhook", "--version"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    began = time.monotonic()
    there = subprocess.run(
        [*arm64_container, "python", "-m", "webhook", "--version"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    print(f"python -m webhook --version, arm64 under emulation: {time.monotonic() - began:.1f} s")
    machine = subprocess.run(
        [*arm64_container, "python", "-c",
         "import platform, cryptography.hazmat.bindings._rust; print(platform.machine())"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip

    assert 0 == there.returncode, there.stderr[-4000:]
    assert f"python -m webhook {VERSION}" == there.stdout.strip() == here.stdout.strip()
    # The interpreter and cryptography's Rust extension load as aarch64 programs.
    assert 0 == machine.returncode, machine.stderr[-4000:]
    assert "aarch64" == machine.stdout.strip()


def test_a_second_multi_platform_run_builds_nothing_and_writes_the_same_archive(
    built_multi: tuple[Path, str, str, float], tmp_path: Path
) -> None:
    again = tmp_path / "again.tar"
    done, took = make_image(f"PLATFORMS={PLATFORMS}", f"IMAGE_ARCHIVE={again}", timeout=300)
    print(f"make image PLATFORMS={PLATFORMS}, warm: {took:.1f} s")

    assert 0 == done.returncode, done.stderr[-4000:]
    assert "built already from these inputs" in done.stderr, done.stderr[-4000:]
    assert "STEP" not in done.stderr
    assert "for arm64: building it" not in done.stderr
    first, second = Layout(built_multi[0]), Layout(again)
    try:
        assert first.raw("index.json") == second.raw("index.json")
    finally:
        first.tar.close()
        second.tar.close()


@pytest.mark.parametrize(
    ("platforms", "named"),
    [
        pytest.param("linux/s390x", "linux/s390x", id="other-arch"),
        pytest.param("linux/amd64,windows/amd64", "windows/amd64", id="other-os"),
        pytest.param("linux/amd64,", "an empty entry", id="trailing-comma"),
    ],
)
def test_a_platform_not_built_here_is_refused_in_one_line_building_nothing(
    platforms: str, named: str
) -> None:
    done, _ = make_image(f"PLATFORMS={platforms}", timeout=120)

    script = [line for line in done.stderr.splitlines() if not line.startswith("make: ***")]
    assert 2 == done.returncode
    assert ["Error 2"] == [
        line.rsplit("] ", 1)[1] for line in done.stderr.splitlines() if line.startswith("make: ***")
    ], done.stderr
    assert "" == done.stdout
    assert [
        f"[build-image] PLATFORMS={platforms}: {named} is not a platform built here; "
        "want linux/amd64, linux/arm64 or both, comma-separated"
    ] == script, done.stderr


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
