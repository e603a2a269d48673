"""The node agent's registry path against a real registry (CNCF Distribution, built by
scripts/build-registry.sh, TLS from its own CA, deletes on), once with basic
authentication and once with the bearer token challenge (a token service of the harness):
the push client alone, then the agent's pass with the registry as its image store - the
record's images are registry references, nothing goes into the node's runtime, and a
finished or abandoned record's manifest is deleted."""

from __future__ import annotations

import hashlib
import json
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.doubles import RuntimeInMemory
from harness.registry import USER, TestRegistry
from tests.unit.test_agent import Clock, Store, make_agent, record
from tests.unit.test_agent_oci import make_archive, spec
from webhook.agent.oci import CHECKPOINT_ANNOTATION, write_image_layout
from webhook.agent.registry import RegistryClient, RegistryFailure, RegistryImages

pytestmark = pytest.mark.e2e

UID = "0f3c2a9e-1b2c-4d5e-8f90-123456789abc"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
#: The digest of an image of the node that no record made.
BUSYBOX = "sha256:" + "b" * 64


@pytest.fixture(scope="module", params=["basic", "token"])
def registry(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[TestRegistry]:
    with TestRegistry(tmp_path_factory.mktemp("registry"), auth=request.param) as running:
        yield running


def client(registry: TestRegistry, password: str | None = None) -> RegistryClient:
    credentials = (USER, registry.password if password is None else password)
    return RegistryClient(registry.host, ca_file=registry.ca_file, credentials=credentials)


def fetch(registry: TestRegistry, path: str, accept: str = "") -> bytes:
    """A GET as any registry client makes it (the standard library's, not the agent's)."""
    request = urllib.request.Request(f"https://{registry.host}{path}")
    request.add_header("Authorization", registry.authorization(path))
    if accept:
        request.add_header("Accept", accept)
    context = ssl.create_default_context(cafile=str(registry.ca_file))
    with urllib.request.urlopen(request, context=context, timeout=30) as response:
        return bytes(response.read())


def manifest_of(registry: TestRegistry, reference: str) -> dict[str, Any]:
    name, _, tag = reference.removeprefix(registry.host + "/").rpartition(":")
    return dict(json.loads(fetch(registry, f"/v2/{name}/manifests/{tag}", MANIFEST)))


def layout(tmp_path: Path, reference: str, pages: bytes) -> tuple[Path, Path]:
    archive = make_archive(
        tmp_path / "checkpoint-worker_team-a-main.tar",
        {"spec.dump": spec(["sh", "-c", "count"]), "pages": pages},
    )
    destination = tmp_path / "layout.tar"
    write_image_layout(archive, destination, reference=reference, container="main")
    return archive, destination


def test_a_pushed_layout_is_pulled_back_as_the_same_image(
    registry: TestRegistry, tmp_path: Path
) -> None:
    reference = f"{registry.host}/rpw/team-a/worker/main:{UID[:12]}"
    archive, pushed_layout = layout(tmp_path, reference, b"\x01" * 3_000_000)

    pushed = client(registry).push_layout(pushed_layout, reference)

    if registry.token_server is not None:  # the push met the bearer challenge
        assert registry.token_server.requests >= 2  # pull, then pull and push
    manifest = manifest_of(registry, reference)
    name = reference.removeprefix(registry.host + "/").rpartition(":")[0]
    (layer,) = manifest["layers"]
    assert {CHECKPOINT_ANNOTATION: "main"} == manifest["annotations"]
    assert "sha256:" + hashlib.sha256(archive.read_bytes()).hexdigest() == layer["digest"]
    assert archive.read_bytes() == fetch(registry, f"/v2/{name}/blobs/{layer['digest']}")
    config = json.loads(fetch(registry, f"/v2/{name}/blobs/{manifest['config']['digest']}"))
    assert [layer["digest"]] == config["rootfs"]["diff_ids"]
    manifest_bytes = fetch(registry, f"/v2/{name}/manifests/{pushed.digest}", MANIFEST)
    assert pushed.digest == "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()


def test_a_second_push_of_the_same_blobs_uploads_none_again(
    registry: TestRegistry, tmp_path: Path
) -> None:
    first = f"{registry.host}/rpw/team-a/worker/main:aaaaaaaaaaaa"
    _, pushed_layout = layout(tmp_path, first, b"\x02" * 100_000)
    pusher = client(registry)
    pusher.push_layout(pushed_layout, first)
    uploads_before = registry.log_text().count("POST /v2/rpw/team-a/worker/main/blobs/uploads/")

    pusher.push_layout(pushed_layout, first)

    uploads = registry.log_text().count("POST /v2/rpw/team-a/worker/main/blobs/uploads/")
    assert uploads_before == uploads
    assert 200 == registry.manifest_status(first)


def test_a_deleted_image_answers_404_and_deleting_it_again_is_fine(
    registry: TestRegistry, tmp_path: Path
) -> None:
    reference = f"{registry.host}/rpw/team-a/gone/main:bbbbbbbbbbbb"
    _, pushed_layout = layout(tmp_path, reference, b"\x03" * 1000)
    pusher = client(registry)
    pusher.push_layout(pushed_layout, reference)
    assert 200 == registry.manifest_status(reference)

    pusher.delete(reference)
    pusher.delete(reference)

    assert 404 == registry.manifest_status(reference)


def refused(registry: TestRegistry) -> str:
    """How a wrong password ends: the registry's own 401, or the token service's."""
    if registry.token_server is None:
        return ": HTTP 401 with the credentials given"
    return f"token from {registry.token_server.realm}: HTTP 401"


@pytest.mark.parametrize(
    ("password", "ca", "message"),
    [("wrong", True, "{refused}"), (None, False, "CERTIFICATE_VERIFY_FAILED")],
    ids=["wrong-password", "unknown-ca"],
)
def test_a_push_the_registry_refuses_says_why_in_one_line(
    registry: TestRegistry, tmp_path: Path, password: str | None, ca: bool, message: str
) -> None:
    message = message.format(refused=refused(registry))
    reference = f"{registry.host}/rpw/team-a/refused/main:cccccccccccc"
    _, pushed_layout = layout(tmp_path, reference, b"\x04" * 1000)
    pusher = client(registry, password)
    if not ca:
        pusher = RegistryClient(registry.host, credentials=(USER, registry.password))

    with pytest.raises(RegistryFailure) as caught:
        pusher.push_layout(pushed_layout, reference)

    assert message in str(caught.value)
    assert 1 == len(str(caught.value).splitlines())
    assert 404 == registry.manifest_status(reference)


def agent_images(registry: TestRegistry, runtime: RuntimeInMemory) -> RegistryImages:
    return RegistryImages(f"{registry.host}/rpw-checkpoints", client(registry), runtime)


def test_the_agent_pushes_an_archived_record_and_deletes_it_when_restored(
    registry: TestRegistry, tmp_path: Path
) -> None:
    name, data = record(tmp_path, uid=UID, containers=("main", "sidecar"))
    store, runtime, clock = Store({name: data}), RuntimeInMemory(), Clock()
    agent = make_agent(tmp_path, store, runtime, clock)
    agent.images = agent_images(registry, runtime)

    agent.step()

    expected = {
        c: f"{registry.host}/rpw-checkpoints/team-a/worker/{c}:{UID[:12]}"
        for c in ("main", "sidecar")
    }
    assert ("imaged", expected) == (store.items[name]["status"]["phase"],
                                    store.items[name]["status"]["images"])  # fmt: skip
    assert [200, 200] == [registry.manifest_status(r) for r in expected.values()]
    assert set() == runtime.image_names()  # nothing imported into the node's runtime
    assert [] == sorted(p.name for p in tmp_path.glob("checkpoint-*.tar"))

    # The restored pod's kubelet pulled the image onto the node, which the CRI names by
    # tag, by digest and by its config's digest: those copies go too, and nothing else.
    main = manifest_of(registry, expected["main"])
    digest = (
        "sha256:"
        + hashlib.sha256(
            json.dumps(main, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
    )
    name_of_main = expected["main"].rpartition(":")[0]
    pulled = {expected["main"], f"{name_of_main}@{digest}", main["config"]["digest"]}
    runtime.images |= dict.fromkeys(pulled, digest) | {"busybox:latest": BUSYBOX}
    store.items[name]["status"]["phase"] = "restored"
    agent.step()

    assert name not in store.items
    assert [404, 404] == [registry.manifest_status(r) for r in expected.values()]
    assert {"busybox:latest"} == runtime.image_names()


def test_pushed_checkpoints_count_in_the_nodes_bounds(
    registry: TestRegistry, tmp_path: Path
) -> None:
    old_name, old = record(tmp_path, pod="old", uid="1" * 32, at=1_799_999_000.0)
    store, runtime = Store({old_name: old}), RuntimeInMemory()
    agent = make_agent(tmp_path, store, runtime, Clock(), max_checkpoints=1)
    agent.images = agent_images(registry, runtime)
    agent.step()
    (pushed,) = store.items[old_name]["status"]["images"].values()
    assert 200 == registry.manifest_status(pushed)

    # Written after that pass: its sweep deletes archives no record names.
    new_name, new = record(tmp_path, pod="new", uid="2" * 32)
    store.items[new_name] = new
    agent.step()

    assert [new_name] == sorted(store.items)
    assert "imaged" == store.items[new_name]["status"]["phase"]
    assert 404 == registry.manifest_status(pushed)


def test_a_push_the_registry_refuses_fails_the_record_with_one_line(
    registry: TestRegistry, tmp_path: Path
) -> None:
    name, data = record(tmp_path, pod="refused", uid="3" * 32)
    store, runtime = Store({name: data}), RuntimeInMemory()
    agent = make_agent(tmp_path, store, runtime, Clock())
    agent.images = RegistryImages(
        f"{registry.host}/rpw-checkpoints", client(registry, "wrong"), runtime
    )

    agent.step()

    assert "failed" == store.items[name]["status"]["phase"]
    assert store.items[name]["status"]["message"].startswith("imaging failed: ")
    assert store.items[name]["status"]["message"].endswith(refused(registry))


def test_copies_pulled_here_of_images_another_nodes_agent_deleted_are_swept(
    registry: TestRegistry, tmp_path: Path
) -> None:
    runtime = RuntimeInMemory()
    agent = make_agent(tmp_path, Store(), runtime, Clock())
    agent.images = agent_images(registry, runtime)
    pusher = client(registry)
    repository = f"{registry.host}/rpw-checkpoints"
    names: dict[str, set[str]] = {}
    for pod in ("ended", "waiting"):
        reference = f"{repository}/team-b/{pod}/main:{pod[:4] * 3}"
        _, pushed_layout = layout(tmp_path, reference, pod.encode() * 1000)
        pushed = pusher.push_layout(pushed_layout, reference)
        config = manifest_of(registry, reference)["config"]["digest"]
        names[pod] = {reference, f"{reference.rpartition(':')[0]}@{pushed.digest}", config}
        runtime.images |= dict.fromkeys(names[pod], pushed.digest)
    runtime.images["busybox:latest"] = BUSYBOX
    # The record of "ended" ends on its own node: its agent deletes the manifest.
    pusher.delete(f"{repository}/team-b/ended/main:endeendeende")

    agent.step()

    assert names["waiting"] | {"busybox:latest"} == runtime.image_names()
