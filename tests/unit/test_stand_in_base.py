"""The stand-in base's pure parts (scripts/stand_in_base.py): the base's name as resolved, the
key an image built on it is cached under, and the refusal of a Dockerfile on another base."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.stand_in_base import (
    ARCHITECTURES,
    BASE_REFERENCE,
    PRODUCT_FILES,
    STAND_IN_LABEL,
    STAND_IN_REFERENCE,
    base_key,
    image_key,
    main,
    native_arch,
    qualified,
    storage_root,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("image", "resolved"),
    [
        pytest.param("python:3.11-slim-bookworm", BASE_REFERENCE, id="official-short"),
        pytest.param("library/python:3.11-slim-bookworm", BASE_REFERENCE, id="library"),
        pytest.param(BASE_REFERENCE, BASE_REFERENCE, id="qualified"),
        pytest.param("you/python:3.11", "docker.io/you/python:3.11", id="user"),
        pytest.param("quay.io/you/python:3.11", "quay.io/you/python:3.11", id="other-registry"),
        pytest.param("localhost/python:3.11", "localhost/python:3.11", id="localhost"),
        pytest.param("registry:5000/python:3.11", "registry:5000/python:3.11", id="port"),
    ],
)
def test_qualified_resolves_short_names_as_containers_image_does(image: str, resolved: str) -> None:
    assert resolved == qualified(image)


def test_the_dockerfile_builds_on_the_base_the_stand_in_replaces() -> None:
    froms = [
        line.split()[1]
        for line in (REPO_ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("FROM ")
    ]
    assert froms
    assert {BASE_REFERENCE} == {qualified(image) for image in froms}


def test_the_mark_names_a_local_image_that_is_no_registry_s() -> None:
    assert "org.opencontainers.image.base.name" == STAND_IN_LABEL
    assert STAND_IN_REFERENCE.startswith("localhost/stand-in/")


def _tree(root: Path) -> None:
    for name in (*PRODUCT_FILES, ".dockerignore"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    (root / "webhook").mkdir()
    (root / "webhook" / "cli.py").write_text("CLI = 1\n")


FIELDS = {"image": "localhost/rpw:0.1.0", "revision": "abc", "source": "", "flags": ""}


@pytest.mark.parametrize(
    ("fields", "path", "rebuilds"),
    [
        pytest.param({"revision": "abd"}, None, True, id="revision"),
        pytest.param({"image": "localhost/rpw:0.2.0"}, None, True, id="tag"),
        pytest.param({"flags": "--squash"}, None, True, id="flags"),
        pytest.param({}, "webhook/cli.py", True, id="source"),
        pytest.param({}, "cas/proxy.crt", True, id="local-ca"),
        pytest.param({}, "tests/test_cli.py", False, id="tests"),
        pytest.param({}, "webhook/__pycache__/cli.cpython-311.pyc", False, id="bytecode"),
    ],
)
def test_image_key_follows_every_input_of_the_build(
    tmp_path: Path, fields: dict[str, str], path: str | None, rebuilds: bool
) -> None:
    _tree(tmp_path)
    cas = tmp_path / "cas"
    cas.mkdir()
    before = image_key(tmp_path, cas, [f"{k}={v}" for k, v in FIELDS.items()])

    if path:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("changed")
    after = image_key(tmp_path, cas, [f"{k}={v}" for k, v in {**FIELDS, **fields}.items()])

    assert rebuilds == (before != after)


def test_image_key_does_not_depend_on_the_order_of_the_fields(tmp_path: Path) -> None:
    _tree(tmp_path)
    fields = [f"{k}={v}" for k, v in FIELDS.items()]

    assert image_key(tmp_path, tmp_path, fields) == image_key(tmp_path, tmp_path, fields[::-1])


def test_ensure_refuses_a_dockerfile_on_another_base_before_building(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"

    assert 2 == main(["ensure", "--store", str(store), "--from", "python:3.12-slim-bookworm"])
    assert not store.exists()
    assert (
        f"[stand-in base] the Dockerfile builds on python:3.12-slim-bookworm; the stand-in is "
        f"{BASE_REFERENCE} only\n"
    ) == capsys.readouterr().err


def test_each_architecture_has_a_base_of_its_own_keyed_and_stored_apart(tmp_path: Path) -> None:
    native = native_arch()
    (foreign,) = set(ARCHITECTURES) - {native}
    fields = [f"{k}={v}" for k, v in FIELDS.items()]
    _tree(tmp_path)

    assert base_key(tmp_path) == base_key(tmp_path, native) != base_key(tmp_path, foreign)
    assert image_key(tmp_path, tmp_path, fields) != image_key(tmp_path, tmp_path, fields, foreign)
    # The machine's own stays where it always was; the other in a storage beside it.
    assert tmp_path == storage_root(tmp_path) == storage_root(tmp_path, native)
    assert tmp_path / "platforms" / foreign == storage_root(tmp_path, foreign)


def test_storage_prints_the_root_and_refuses_an_architecture_not_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert 0 == main(["storage", "--store", str(tmp_path), "--arch", "arm64"])
    printed = capsys.readouterr().out.strip()
    with pytest.raises(SystemExit) as refused:
        main(["storage", "--store", str(tmp_path), "--arch", "s390x"])

    assert str(storage_root(tmp_path.resolve(), "arm64")) == printed
    assert 2 == refused.value.code
    assert "invalid choice: 's390x'" in capsys.readouterr().err
