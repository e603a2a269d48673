"""The real node's images: images.tsv written and read back, and the cache keys that decide
what is rebuilt."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from harness.images import (
    ImageArchive,
    ImagesUnavailable,
    Inputs,
    base_key,
    format_images_tsv,
    inputs_key,
    parse_images_tsv,
    product_key,
    prune,
    read_images,
    tag_of_debian_version,
)
from scripts.stand_in_base import PRODUCT_FILES, PRODUCT_TREES

REPO_ROOT = Path(__file__).resolve().parents[2]
ARCHIVES = [
    ImageArchive("registry.k8s.io/pause:3.10", "sandbox.tar", "sandbox"),
    ImageArchive("localhost/debian-busybox-static:1.35.0", "workload.tar", "workload"),
    ImageArchive("localhost/resize-preemption-webhook:0.1.0", "product.tar", "product"),
]


def test_images_tsv_is_one_tab_separated_line_per_image_and_reads_back_by_role() -> None:
    text = format_images_tsv(ARCHIVES)

    assert (
        "registry.k8s.io/pause:3.10\tsandbox.tar\tsandbox\n"
        "localhost/debian-busybox-static:1.35.0\tworkload.tar\tworkload\n"
        "localhost/resize-preemption-webhook:0.1.0\tproduct.tar\tproduct\n"
    ) == text
    assert {a.role: a for a in ARCHIVES} == parse_images_tsv(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("a:1\ta.tar\n", "line 1: want reference, file, role", id="two-fields"),
        pytest.param("a:1\t\tsandbox\n", "line 1: want reference, file, role", id="empty-field"),
        pytest.param("\na:1\ta.tar\tbase\n", "line 2: unknown role 'base'", id="unknown-role"),
        pytest.param(
            "a:1\ta.tar\tsandbox\nb:1\tb.tar\tsandbox\n",
            "line 2: a second sandbox image",
            id="repeated-role",
        ),
        pytest.param("a:1\tsub/a.tar\tsandbox\n", "'sub/a.tar' is not a file name", id="path"),
    ],
)
def test_a_malformed_images_tsv_names_its_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_images_tsv(text)


@pytest.mark.parametrize(
    "archives",
    [
        pytest.param([ARCHIVES[0], ARCHIVES[0]], id="repeated-role"),
        pytest.param([ImageArchive("a\tb:1", "a.tar", "sandbox")], id="tab-in-reference"),
    ],
)
def test_format_refuses_what_could_not_be_read_back(archives: list[ImageArchive]) -> None:
    with pytest.raises(ValueError):
        format_images_tsv(archives)


def test_read_images_wants_every_role_and_every_archive(tmp_path: Path) -> None:
    (tmp_path / "images.tsv").write_text(format_images_tsv(ARCHIVES[:2]))
    for archive in ARCHIVES:
        (tmp_path / archive.file).write_bytes(b"")
    with pytest.raises(ImagesUnavailable, match="names no product image"):
        read_images(tmp_path)

    (tmp_path / "images.tsv").write_text(format_images_tsv(ARCHIVES))
    (tmp_path / "workload.tar").unlink()
    with pytest.raises(ImagesUnavailable, match=r"archives missing: workload\.tar"):
        read_images(tmp_path)

    (tmp_path / "workload.tar").write_bytes(b"")
    assert "product.tar" == read_images(tmp_path)["product"].file


def test_read_images_of_a_directory_without_images_tsv_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ImagesUnavailable, match=str(tmp_path)):
        read_images(tmp_path)


def test_inputs_key_depends_on_names_and_contents_not_on_order() -> None:
    parts = [("a", b"1"), ("b", b"2")]
    key = inputs_key(parts)

    assert key == inputs_key(list(reversed(parts)))
    assert key != inputs_key([("a", b"1"), ("b", b"3")])
    assert key != inputs_key([("a", b"1"), ("c", b"2")])
    # A name and its content never run into each other.
    assert inputs_key([("ab", b"c")]) != inputs_key([("a", b"bc")])


@pytest.mark.parametrize(
    ("version", "tag"),
    [
        pytest.param("1:1.35.0-4+deb12u1+b1", "1.35.0", id="epoch-and-revision"),
        pytest.param("1.36.1-9", "1.36.1", id="revision"),
        pytest.param("2.0", "2.0", id="native"),
        pytest.param("1.2~rc1-1", "1.2_rc1", id="tilde"),
    ],
)
def test_tag_of_debian_version(version: str, tag: str) -> None:
    assert tag == tag_of_debian_version(version)


def _inputs(root: Path, local_cas: Path) -> Inputs:
    unused = root / "unused"
    return Inputs(root, root, unused, "v0", unused, "0", local_cas)


def _source_tree(root: Path) -> None:
    for name in (*PRODUCT_FILES, ".dockerignore"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    (root / "webhook" / "core").mkdir(parents=True)
    (root / "webhook" / "core" / "plan.py").write_text("PLAN = 1\n")


@pytest.mark.parametrize(
    ("path", "content", "rebuilds"),
    [
        pytest.param("webhook/core/plan.py", "PLAN = 2\n", True, id="package-source"),
        pytest.param("webhook/core/new.py", "", True, id="new-module"),
        pytest.param("requirements-runtime.lock", "flask==9\n", True, id="lock"),
        pytest.param("Dockerfile", "FROM scratch\n", True, id="dockerfile"),
        pytest.param(".dockerignore", "*\n", True, id="dockerignore"),
        pytest.param("scripts/build-image.sh", "exit 1\n", True, id="build-script"),
        pytest.param("scripts/stand_in_base.py", "", True, id="stand-in-recipe"),
        pytest.param("tests/test_plan.py", "", False, id="tests"),
        pytest.param("webhook/core/__pycache__/plan.cpython-311.pyc", "\0", False, id="bytecode"),
    ],
)
def test_product_key_follows_what_the_dockerfile_copies(
    tmp_path: Path, path: str, content: str, rebuilds: bool
) -> None:
    _source_tree(tmp_path)
    inputs = _inputs(tmp_path, tmp_path / "no-cas")
    before = product_key(inputs, "base-1")

    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text(content)

    assert rebuilds == (before != product_key(inputs, "base-1"))


def test_product_key_follows_the_base(tmp_path: Path) -> None:
    _source_tree(tmp_path)
    inputs = _inputs(tmp_path, tmp_path / "no-cas")
    assert product_key(inputs, "base-1") != product_key(inputs, "base-2")


def test_base_key_follows_the_machines_local_cas(tmp_path: Path) -> None:
    cas = tmp_path / "cas"
    cas.mkdir()
    inputs = _inputs(tmp_path, cas)
    without = base_key(inputs)

    (cas / "proxy.crt").write_text("-----BEGIN CERTIFICATE-----\n")

    assert without != base_key(inputs)


def test_every_file_the_dockerfile_copies_from_the_context_is_in_the_product_key() -> None:
    copied: set[str] = set()
    for line in (REPO_ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            copied.update(w.rstrip("/") for w in words[1:-1])
    assert copied
    assert set() == copied - set(PRODUCT_FILES) - set(PRODUCT_TREES)


def _image_set(cache: Path, name: str, archives: list[str], mtime: int) -> None:
    directory = cache / "sets" / name
    directory.mkdir(parents=True)
    for archive in archives:
        stored = cache / "archives" / archive
        stored.parent.mkdir(exist_ok=True)
        if not stored.exists():
            stored.write_bytes(b"")
        os.link(stored, directory / archive)
    os.utime(directory, (mtime, mtime))


def test_prune_keeps_the_newest_directories_and_the_archives_they_link(tmp_path: Path) -> None:
    _image_set(tmp_path, "old", ["sandbox-1.tar", "product-1.tar"], mtime=1000)
    _image_set(tmp_path, "newer", ["sandbox-1.tar", "product-2.tar"], mtime=2000)
    _image_set(tmp_path, "newest", ["sandbox-1.tar", "product-3.tar"], mtime=3000)

    removed = prune(tmp_path, keep=2)

    assert [tmp_path / "sets/old", tmp_path / "archives/product-1.tar"] == removed
    assert ["newer", "newest"] == sorted(p.name for p in (tmp_path / "sets").iterdir())
    assert ["product-2.tar", "product-3.tar", "sandbox-1.tar"] == sorted(
        p.name for p in (tmp_path / "archives").iterdir()
    )
