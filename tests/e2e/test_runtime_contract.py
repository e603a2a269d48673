"""The node agent's container-runtime port's contract, one suite for the double and containerd.

Every test runs over each runtime, through the ``subject`` fixture:
:class:`harness.doubles.RuntimeInMemory` ("memory") and
:class:`webhook.agent.runtime.Containerd` through ``ctr`` against the real node's containerd
("containerd", its ``k8s.io`` namespace, where the node's own images are). Together they
prove that a runtime (:class:`~webhook.agent.runtime.Runtime`):

* names itself and its version, and says it restores from checkpoint images when its
  configuration enables it, and why not when the configuration lacks the switch or cannot
  be read;
* imports a checkpoint image layout as the agent writes it (:mod:`webhook.agent.oci`):
  listed under its reference and under its id (``sha256:`` and its config's digest, as the
  CRI names every image of its namespace), and no other name, each with the digest of the
  layout's manifest;
* refuses, in one line, a layout that names another image or none, and a file that is not
  a layout, listing nothing under the reference (what the layout names is listed all the
  same, as ``ctr images import`` names it);
* removes an image from both listings, its id too once no other name holds the image, and
  removing one that is absent is no error.

Each test imports under references of its own and removes what it imported.
``-k memory`` runs the double's half without a control plane.
"""

from __future__ import annotations

import io
import json
import re
import secrets
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.doubles import RuntimeInMemory
from tests.unit.test_agent_oci import make_archive, spec
from webhook.agent.oci import (
    IMAGE_NAME_ANNOTATION,
    ImageLayout,
    write_image_layout,
)
from webhook.agent.runtime import RESTORE_KEY, Runtime, RuntimeFailure
from webhook.core.checkpoint import image_reference

#: What the real node's configuration says of restores (harness.realnode.containerd_config).
ENABLED = (
    '[plugins."io.containerd.cri.v1.runtime"]\n  enable_experimental_restore_via_create = true\n'
)
NOT_ENABLED = (
    "containerd: enable_experimental_restore_via_create is not true in "
    '[plugins."io.containerd.cri.v1.runtime"]'
)


@dataclass
class Subject:
    runtime: Runtime
    #: The configuration file the runtime runs with.
    config: Path
    #: The same runtime, its probe reading another configuration file.
    reading: Callable[[Path], Runtime]
    #: Names to remove once the test ends.
    imported: list[str] = field(default_factory=list)


def _memory(tmp_path: Path) -> Iterator[Subject]:
    config = tmp_path / "containerd-config.toml"
    config.write_text(ENABLED)
    runtime = RuntimeInMemory(config=config)

    def reading(other: Path) -> Runtime:
        return RuntimeInMemory(images=runtime.images, config=other)

    yield Subject(runtime, config, reading)


def _containerd(request: pytest.FixtureRequest) -> Iterator[Subject]:
    from webhook.agent.runtime import Containerd

    node = request.getfixturevalue("real_cluster").node
    ctr, address = str(node.stack.path("ctr")), str(node.paths.containerd_socket)
    config = node.paths.containerd_config
    runtime = Containerd(ctr=ctr, address=address, config=config)

    def reading(other: Path) -> Runtime:
        return Containerd(ctr=ctr, address=address, config=other)

    yield Subject(runtime, config, reading)


@pytest.fixture(
    params=[
        pytest.param("memory", id="memory"),
        pytest.param("containerd", id="containerd", marks=[pytest.mark.e2e, pytest.mark.realnode]),
    ]
)
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Subject]:
    made = _memory(tmp_path) if request.param == "memory" else _containerd(request)
    for subject in made:
        try:
            yield subject
        finally:
            for name in subject.imported:
                subject.runtime.remove_image(name)


def unique_reference(container: str = "main") -> str:
    return image_reference("contract", "worker", container, secrets.token_hex(16))


def checkpoint_layout(tmp_path: Path, subject: Subject, reference: str) -> ImageLayout:
    """A checkpoint archive as the kubelet writes it, made an image layout as the agent
    makes it (``layout.tar``), its reference removed once the test ends."""
    archive = make_archive(
        tmp_path / f"checkpoint-worker_contract-main-{secrets.token_hex(4)}.tar",
        {"spec.dump": spec(["sh", "-c", "n=0"]), "config.dump": b"{}",
         "checkpoint/pages-1.img": secrets.token_bytes(4096)},
    )  # fmt: skip
    subject.imported.append(reference)
    return write_image_layout(
        archive, tmp_path / "layout.tar", reference=reference, container="main"
    )


def without_name(layout: Path) -> None:
    """Rewrite the layout's ``index.json`` so that it names no image."""
    with tarfile.open(layout) as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else b"") for m in tar]  # type: ignore[union-attr]
    with tarfile.open(layout, "w", format=tarfile.PAX_FORMAT) as out:
        for member, data in members:
            if member.name == "index.json":
                index = json.loads(data)
                for entry in index["manifests"]:
                    entry["annotations"].pop(IMAGE_NAME_ANNOTATION)
                data = json.dumps(index).encode()
                member.size = len(data)
            out.addfile(member, io.BytesIO(data) if member.isfile() else None)


def image_id(layout: Path) -> str:
    """The id the CRI names the layout's image by: its config's digest."""
    with tarfile.open(layout) as tar:
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        manifest_blob = f"blobs/sha256/{index['manifests'][0]['digest'].removeprefix('sha256:')}"
        manifest = json.load(tar.extractfile(manifest_blob))  # type: ignore[arg-type]
    return str(manifest["config"]["digest"])


def added(runtime: Runtime, before: dict[str, str], expected: set[str]) -> dict[str, str]:
    """What the listing holds that ``before`` did not, once it holds ``expected`` (the CRI
    names an imported image by its id as it hears of it, within a few seconds)."""
    deadline = time.monotonic() + 5
    while True:
        now = runtime.image_digests()
        if expected <= set(now) or time.monotonic() > deadline:
            return {n: d for n, d in now.items() if n not in before}
        time.sleep(0.1)


# -- probe --------------------------------------------------------------------------------------


def test_the_probe_names_the_runtime_and_says_restores_are_enabled(subject: Subject) -> None:
    facts = subject.runtime.probe()
    assert re.fullmatch(r"containerd v\d+\.\d+\.\d+", facts.version), facts.version
    assert (True, "") == (facts.restore, facts.message)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("without-the-switch", NOT_ENABLED),
        ("switch-false", NOT_ENABLED),
        ("absent", "containerd's configuration is not readable (--containerd-config)"),
    ],
    ids=["without-the-switch", "switch-false", "config-absent"],
)
def test_the_probe_says_why_a_configuration_does_not_restore(
    subject: Subject, tmp_path: Path, config: str, message: str
) -> None:
    text = subject.config.read_text()
    assert f"{RESTORE_KEY} = true" in text
    other = tmp_path / "other-config.toml"
    if config == "without-the-switch":
        other.write_text(text.replace(f"{RESTORE_KEY} = true", ""))
    elif config == "switch-false":
        other.write_text(text.replace(f"{RESTORE_KEY} = true", f"{RESTORE_KEY} = false"))
    facts = subject.reading(other).probe()
    assert (False, message) == (facts.restore, facts.message)
    assert subject.runtime.probe().version == facts.version


# -- import ---------------------------------------------------------------------------------------


def test_an_imported_layout_is_listed_under_its_reference_and_its_id_alone(
    subject: Subject, tmp_path: Path
) -> None:
    reference = unique_reference()
    layout = checkpoint_layout(tmp_path, subject, reference)
    before = subject.runtime.image_digests()
    listed = {reference, image_id(tmp_path / "layout.tar")}

    subject.runtime.import_image(tmp_path / "layout.tar", reference)

    assert dict.fromkeys(listed, layout.manifest_digest) == added(subject.runtime, before, listed)
    assert listed <= subject.runtime.image_names()
    digests = subject.runtime.image_digests()
    assert before == {n: digests[n] for n in before}


def test_two_references_of_one_pod_are_two_images(subject: Subject, tmp_path: Path) -> None:
    references = [unique_reference(c) for c in ("main", "sidecar")]
    layouts = {}
    for reference in references:
        (tmp_path / reference[-8:]).mkdir()
        layouts[reference] = checkpoint_layout(tmp_path / reference[-8:], subject, reference)
        subject.runtime.import_image(tmp_path / reference[-8:] / "layout.tar", reference)
    digests = subject.runtime.image_digests()
    assert {r: layouts[r].manifest_digest for r in references} == {
        r: digests[r] for r in references
    }


#: A way to make a file that is not a layout naming the reference: the file, and the names
#: its import lists all the same.
Made = tuple[Path, set[str]]


def layout_of_another_name(tmp_path: Path, subject: Subject) -> Made:
    other = unique_reference("other")
    checkpoint_layout(tmp_path, subject, other)
    return tmp_path / "layout.tar", {other, image_id(tmp_path / "layout.tar")}


def layout_naming_none(tmp_path: Path, subject: Subject) -> Made:
    reference = unique_reference("unnamed")
    checkpoint_layout(tmp_path, subject, reference)
    without_name(tmp_path / "layout.tar")
    # ``ctr images import`` names it after the date and the layout's ref.name.
    tag = reference.rpartition(":")[2]
    name = f"import-{time.strftime('%Y-%m-%d')}:{tag}"
    subject.imported.append(name)
    return tmp_path / "layout.tar", {name, image_id(tmp_path / "layout.tar")}


def not_a_tar(tmp_path: Path, subject: Subject) -> Made:
    path = tmp_path / "layout.tar"
    path.write_bytes(b"not an image layout\n" * 100)
    return path, set()


def a_bare_archive(tmp_path: Path, subject: Subject) -> Made:
    path = make_archive(tmp_path / "layout.tar", {"spec.dump": spec(["sh"])})
    return path, set()


@pytest.mark.parametrize(
    "make",
    [layout_of_another_name, layout_naming_none, not_a_tar, a_bare_archive],
    ids=["names-another-image", "names-none", "not-a-tar", "archive-not-layout"],
)
def test_an_import_not_of_the_reference_fails_in_one_line_and_lists_nothing_under_it(
    subject: Subject, tmp_path: Path, make: Callable[[Path, Subject], Made]
) -> None:
    reference = unique_reference()
    subject.imported.append(reference)
    path, listed = make(tmp_path, subject)
    before = subject.runtime.image_digests()

    with pytest.raises(RuntimeFailure) as caught:
        subject.runtime.import_image(path, reference)

    message = str(caught.value)
    assert (1, True) == (len(message.splitlines()), bool(message.strip())), message
    assert listed == set(added(subject.runtime, before, listed))
    names = subject.runtime.image_names()
    assert (False, False) == (reference in names, reference in subject.runtime.image_digests())


# -- remove ---------------------------------------------------------------------------------------


def test_a_removed_image_leaves_both_listings_with_its_id(subject: Subject, tmp_path: Path) -> None:
    reference = unique_reference()
    checkpoint_layout(tmp_path, subject, reference)
    before = subject.runtime.image_digests()
    subject.runtime.import_image(tmp_path / "layout.tar", reference)
    listed = {reference, image_id(tmp_path / "layout.tar")}
    assert listed == set(added(subject.runtime, before, listed))

    subject.runtime.remove_image(reference)

    assert before == subject.runtime.image_digests()
    assert set(before) == subject.runtime.image_names()


def test_an_image_another_name_holds_keeps_its_id_until_that_name_goes(
    subject: Subject, tmp_path: Path
) -> None:
    """Two references to one archive are one image (the same manifest): removing one
    leaves the other, and the id, listed."""
    first, second = unique_reference(), unique_reference()
    layout = checkpoint_layout(tmp_path, subject, first)
    archive = next(tmp_path.glob("checkpoint-*.tar"))
    subject.imported.append(second)
    (tmp_path / "second").mkdir()
    write_image_layout(archive, tmp_path / "second" / "layout.tar", reference=second,
                       container="main")  # fmt: skip
    before = subject.runtime.image_digests()
    subject.runtime.import_image(tmp_path / "layout.tar", first)
    subject.runtime.import_image(tmp_path / "second" / "layout.tar", second)
    listed = {first, second, image_id(tmp_path / "layout.tar")}
    assert dict.fromkeys(listed, layout.manifest_digest) == added(subject.runtime, before, listed)

    subject.runtime.remove_image(first)
    assert listed - {first} == set(added(subject.runtime, before, set()))

    subject.runtime.remove_image(second)
    assert before == subject.runtime.image_digests()


def test_removing_an_absent_image_changes_nothing(subject: Subject) -> None:
    before = subject.runtime.image_digests()
    subject.runtime.remove_image(unique_reference())
    subject.runtime.remove_image(unique_reference())
    assert before == subject.runtime.image_digests()
