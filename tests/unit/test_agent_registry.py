"""The node agent's registry settings and what it reads of them: the repository prefix, the
CA and the docker config.json credentials, each wrong one a single line (exit 2). The push
itself is proven against a real registry in tests/e2e/test_registry_push.py."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.doubles import RuntimeInMemory
from webhook.agent.command import image_store
from webhook.agent.registry import (
    RegistryClient,
    RegistryFailure,
    RegistryImages,
    credentials_for,
    parse_reference,
)
from webhook.agent.runtime import Containerd, LocalImages
from webhook.agent.settings import load_agent_settings
from webhook.core.errors import InputError

UID = "0f3c2a9e-1b2c-4d5e-8f90-123456789abc"
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "value",
    ["registry.example:5000/rpw-checkpoints", "registry.example/a/b", "localhost:5000/rpw",
     "198.18.0.1:5000/rpw-checkpoints", "registry:5000/rpw", ""],
    ids=["host-port", "two-components", "localhost", "ip-port", "name-port", "none"],
)  # fmt: skip
def test_a_registry_repository_is_read_as_given(value: str) -> None:
    settings = load_agent_settings(flags={"node": "n", "registry": value})
    assert value == settings.registry


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"registry": "registry.example:5000"}, "--registry='registry.example:5000' must be"),
        ({"registry": "rpw-checkpoints/x"}, "--registry='rpw-checkpoints/x' must be"),
        ({"registry": "registry.example/Upper"}, "--registry='registry.example/Upper' must be"),
        ({"registry": "https://registry.example/x"}, "--registry='https://registry.example/x'"),
        ({"registry": "registry.example/x:tag"}, "--registry='registry.example/x:tag' must be"),
        ({"registry": "r.example/x", "registry-ca": "ca.crt"},
         "--registry-ca='ca.crt' must be an absolute path"),
        ({"registry-auth": "/etc/auth.json"}, "--registry-ca and --registry-auth need --registry"),
    ],
    ids=["no-path", "no-host", "upper-case", "scheme", "tag", "relative-ca", "auth-alone"],
)  # fmt: skip
def test_bad_registry_settings_are_one_line(flags: dict[str, str], message: str) -> None:
    with pytest.raises(InputError) as caught:
        load_agent_settings(flags={"node": "n", **flags})
    assert message in str(caught.value)
    assert 1 == len(str(caught.value).splitlines())


def test_the_environment_names_the_registry() -> None:
    settings = load_agent_settings(
        env={"RPW_REGISTRY": "r.example/rpw", "RPW_REGISTRY_CA": "/etc/rpw/ca.crt",
             "RPW_REGISTRY_AUTH": "/etc/rpw/auth/.dockerconfigjson"},
        flags={"node": "n"},
    )  # fmt: skip
    assert ("r.example/rpw", "/etc/rpw/ca.crt", "/etc/rpw/auth/.dockerconfigjson") == (
        settings.registry,
        settings.registry_ca,
        settings.registry_auth,
    )


def encoded(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"auths": {"r.example:5000": {"auth": encoded("u", "p:w")}}}, ("u", "p:w")),
        ({"auths": {"https://r.example:5000": {"auth": encoded("u", "p")}}}, ("u", "p")),
        ({"auths": {"https://r.example:5000/v1/": {"auth": encoded("u", "p")}}}, ("u", "p")),
        ({"auths": {"r.example:5000": {"username": "u", "password": "p"}}}, ("u", "p")),
        ({"auths": {"other.example": {"auth": encoded("u", "p")}}}, None),
        ({"auths": {"r.example": {"auth": encoded("u", "p")}}}, None),
        ({}, None),
    ],
    ids=["auth", "scheme", "scheme-path", "username", "other-host", "no-port", "empty"],
)  # fmt: skip
def test_credentials_are_the_config_entry_of_the_registry_host(
    config: dict[str, Any], expected: tuple[str, str] | None
) -> None:
    assert expected == credentials_for(config, "r.example:5000")


def test_undecodable_credentials_say_so() -> None:
    with pytest.raises(RegistryFailure, match="not base64"):
        credentials_for({"auths": {"r.example": {"auth": "%%%"}}}, "r.example")


@pytest.mark.parametrize(
    ("reference", "expected"),
    [
        ("r.example:5000/rpw/team-a/worker/main:0f3c2a9e1b2c",
         ("rpw/team-a/worker/main", "0f3c2a9e1b2c")),
        ("r.example:5000/rpw:latest", ("rpw", "latest")),
    ],
    ids=["checkpoint", "short"],
)  # fmt: skip
def test_a_reference_splits_into_repository_and_tag(
    reference: str, expected: tuple[str, str]
) -> None:
    assert expected == parse_reference(reference, "r.example:5000")


@pytest.mark.parametrize(
    "reference",
    ["other.example/rpw:tag", "r.example:5000/rpw", "r.example:5000/rpw@sha256:abc"],
    ids=["other-host", "no-tag", "digest"],
)
def test_a_reference_of_another_registry_or_without_a_tag_is_refused(reference: str) -> None:
    with pytest.raises(RegistryFailure):
        parse_reference(reference, "r.example:5000")


def test_without_a_registry_images_stay_in_the_runtime() -> None:
    store = image_store(load_agent_settings(flags={"node": "n"}), RuntimeInMemory())
    assert isinstance(store, LocalImages)
    assert "localhost/resize-preemption-checkpoint/team-a/worker/main:0f3c2a9e-1b2" == (
        store.reference("team-a", "Worker", "main", UID)
    )


def test_with_a_registry_images_are_named_under_its_repository(tmp_path: Path) -> None:
    ca = tmp_path / "ca.crt"
    ca.write_text("")
    auth = tmp_path / "config.json"
    auth.write_text(json.dumps({"auths": {"r.example:5000": {"auth": encoded("u", "p")}}}))
    settings = load_agent_settings(flags={
        "node": "n", "registry": "r.example:5000/rpw", "registry-ca": str(ca),
        "registry-auth": str(auth),
    })  # fmt: skip
    store = image_store(settings, RuntimeInMemory())
    assert isinstance(store, RegistryImages)
    assert isinstance(store.client, RegistryClient)
    assert ("r.example:5000", ca, ("u", "p")) == (
        store.client.host,
        store.client.ca_file,
        store.client.credentials,
    )
    assert "r.example:5000/rpw/team-a/worker/main:0f3c2a9e-1b2" == (
        store.reference("team-a", "Worker", "main", UID)
    )


@pytest.mark.parametrize(
    ("files", "flags", "message"),
    [
        ({}, {"registry-ca": "{dir}/missing.crt"}, "--registry-ca='{dir}/missing.crt' is not a"),
        ({}, {"registry-auth": "{dir}/missing.json"}, "--registry-auth: registry credentials"),
        ({"auth.json": "not json"}, {"registry-auth": "{dir}/auth.json"},
         "--registry-auth: registry credentials {dir}/auth.json:"),
        ({"auth.json": '{"auths": {"other.example": {"auth": "dTpw"}}}'},
         {"registry-auth": "{dir}/auth.json"},
         "--registry-auth='{dir}/auth.json' holds no entry for r.example:5000"),
    ],
    ids=["missing-ca", "missing-auth", "auth-not-json", "auth-other-host"],
)  # fmt: skip
def test_unreadable_registry_files_are_one_line(
    tmp_path: Path, files: dict[str, str], flags: dict[str, str], message: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    given = {k: v.format(dir=tmp_path) for k, v in flags.items()}
    settings = load_agent_settings(flags={"node": "n", "registry": "r.example:5000/rpw", **given})
    with pytest.raises(InputError) as caught:
        image_store(settings, RuntimeInMemory())
    assert message.format(dir=tmp_path) in str(caught.value)
    assert 1 == len(str(caught.value).splitlines())


def test_the_command_line_loads_no_http_client_before_the_service_starts() -> None:
    """``serve`` parses its command line (every subcommand's settings, the agent's
    included) before gunicorn's gevent workers patch the standard library: urllib3 loaded
    then keeps the blocking ``ssl.SSLContext`` and the workers refuse to start. The
    registry client is loaded only by ``node-agent`` itself."""
    code = (
        "import sys, webhook.cli as cli; cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'urllib3'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert "[]" == result.stdout.strip()


def test_containerds_listing_gives_each_image_its_manifest_digest(tmp_path: Path) -> None:
    listing = (
        "REF TYPE DIGEST SIZE PLATFORMS LABELS\n"
        "r.example:5000/rpw/a/b/main:0f3c2a9e1b2c application/vnd.oci.image.manifest.v1+json "
        "sha256:aaaa 1.2 MiB linux/amd64 io.cri-containerd.image=managed\n"
        "r.example:5000/rpw/a/b/main@sha256:aaaa application/vnd.oci.image.manifest.v1+json "
        "sha256:aaaa 1.2 MiB linux/amd64 io.cri-containerd.image=managed\n"
        "sha256:cccc application/vnd.oci.image.manifest.v1+json "
        "sha256:aaaa 1.2 MiB linux/amd64 io.cri-containerd.image=managed\n"
    )
    ctr = tmp_path / "ctr"
    ctr.write_text(f"#!/bin/sh\ncat <<'EOF'\n{listing}EOF\n")
    ctr.chmod(0o755)
    runtime = Containerd(ctr=str(ctr), address="/run/containerd/containerd.sock")
    assert {
        "r.example:5000/rpw/a/b/main:0f3c2a9e1b2c": "sha256:aaaa",
        "r.example:5000/rpw/a/b/main@sha256:aaaa": "sha256:aaaa",
        "sha256:cccc": "sha256:aaaa",
    } == runtime.image_digests()
