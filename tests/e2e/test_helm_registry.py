"""The chart's ``checkpoint.registry``: checkpoint images pushed to a registry. Rendered by
the real helm (no cluster): off unless a repository is given; with one, the agent's command
line names it, its CA and credentials are mounted from where the values say, the schema
refuses what the agent would, and the admission policy counts images under the repository
as checkpoint images (tried on the real API server in test_checkpoint_policy_registry.py)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.helm_tools import render, template
from tests.e2e.test_helm_checkpoint import ON, agent_objects, pod_spec
from webhook.agent.settings import AGENT_SETTINGS, AgentSettings, load_agent_settings
from webhook.cli import build_parser

pytestmark = pytest.mark.e2e

REPOSITORY = "registry.example:5000/rpw-checkpoints"
PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def agent_settings(values: dict[str, Any]) -> AgentSettings:
    """What the agent reads of the DaemonSet's command line."""
    (container,) = pod_spec(values)["containers"]
    command = [*container["command"], *container["args"]]
    argv = [a.replace("$(NODE_NAME)", "node-1") for a in command[command.index("node-agent") :]]
    parsed = build_parser().parse_args(argv)
    flags = {name: getattr(parsed, name.replace("-", "_"), None) for name in AGENT_SETTINGS}
    return load_agent_settings(flags=flags)


def mounts(values: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Mount path -> (volume name, volume source) of the agent's container, but the
    checkpoint directory and containerd's configuration."""
    spec = pod_spec(values)
    volumes = {v["name"]: {k: w for k, w in v.items() if k != "name"} for v in spec["volumes"]}
    (container,) = spec["containers"]
    return {
        m["mountPath"]: (m["name"], volumes[m["name"]])
        for m in container["volumeMounts"]
        if m["name"] not in ("checkpoints", "containerd-config")
    }


def test_without_a_repository_images_stay_on_the_node() -> None:
    settings = agent_settings(ON)
    assert ("", "", "") == (settings.registry, settings.registry_ca, settings.registry_auth)
    assert {} == mounts(ON)
    assert "ConfigMap" not in agent_objects(ON)


def test_an_inline_ca_and_a_credentials_secret_are_mounted_and_named() -> None:
    values = {**ON, "checkpoint.registry.repository": REPOSITORY,
              "checkpoint.registry.ca": PEM, "checkpoint.registry.authSecret": "push"}  # fmt: skip

    settings = agent_settings(values)

    assert (REPOSITORY, "/etc/rpw/registry-ca/ca.crt", "/etc/rpw/registry-auth/config.json") == (
        settings.registry,
        settings.registry_ca,
        settings.registry_auth,
    )
    ca_map = agent_objects(values)["ConfigMap"]
    ca_name = ca_map["metadata"]["name"]
    assert {"ca.crt": PEM} == ca_map["data"]
    assert "resize-preemption-system" == ca_map["metadata"]["namespace"]
    assert {
        "/etc/rpw/registry-ca": ("registry-ca", {"configMap": {"name": ca_name}}),
        "/etc/rpw/registry-auth": ("registry-auth", {"secret": {
            "secretName": "push", "defaultMode": 0o400,
            "items": [{"key": ".dockerconfigjson", "path": "config.json"}],
        }}),
    } == mounts(values)  # fmt: skip


def test_a_ca_secret_is_mounted_as_its_ca_crt() -> None:
    values = {**ON, "checkpoint.registry.repository": REPOSITORY,
              "checkpoint.registry.caSecret": "registry-ca"}  # fmt: skip

    settings = agent_settings(values)

    assert ("/etc/rpw/registry-ca/ca.crt", "") == (settings.registry_ca, settings.registry_auth)
    assert {
        "/etc/rpw/registry-ca": ("registry-ca", {"secret": {
            "secretName": "registry-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}],
        }}),
    } == mounts(values)  # fmt: skip
    assert "ConfigMap" not in agent_objects(values)


def policy_prefixes(values: dict[str, Any]) -> str:
    (policy,) = [
        d for d in render(values)
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith("-images")
    ]  # fmt: skip
    (prefixes,) = [v for v in policy["spec"]["variables"] if v["name"] == "prefixes"]
    return str(prefixes["expression"])


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (ON, "['localhost/resize-preemption-checkpoint/']"),
        ({**ON, "checkpoint.registry.repository": REPOSITORY},
         f"['localhost/resize-preemption-checkpoint/', '{REPOSITORY}/']"),
    ],
    ids=["local", "registry"],
)  # fmt: skip
def test_the_policy_counts_images_under_the_repository_as_checkpoint_images(
    values: dict[str, Any], expected: str
) -> None:
    assert expected == policy_prefixes(values)


BAD = [
    ("no-path", {"checkpoint.registry.repository": "registry.example:5000"},
     "at '/checkpoint/registry/repository': 'registry.example:5000' does not match pattern"),
    ("upper-case", {"checkpoint.registry.repository": "Registry.example/rpw"},
     "at '/checkpoint/registry/repository': 'Registry.example/rpw' does not match pattern"),
    ("scheme", {"checkpoint.registry.repository": "https://registry.example/rpw"},
     "at '/checkpoint/registry/repository'"),
    ("tag", {"checkpoint.registry.repository": "registry.example/rpw:1"},
     "at '/checkpoint/registry/repository'"),
    ("ca-and-secret", {"checkpoint.registry.repository": REPOSITORY,
                       "checkpoint.registry.ca": PEM, "checkpoint.registry.caSecret": "ca"},
     "at '/checkpoint/registry/ca': maxLength: got 59, want 0"),
    ("ca-not-pem", {"checkpoint.registry.repository": REPOSITORY,
                    "checkpoint.registry.ca": "/etc/ssl/ca.crt"},
     "at '/checkpoint/registry/ca': '/etc/ssl/ca.crt' does not match pattern"),
    ("auth-without-repository", {"checkpoint.registry.authSecret": "push"},
     "at '/checkpoint/registry/authSecret': maxLength: got 4, want 0"),
    ("bad-secret-name", {"checkpoint.registry.repository": REPOSITORY,
                         "checkpoint.registry.authSecret": "Push_Secret"},
     "at '/checkpoint/registry/authSecret': 'Push_Secret' does not match pattern"),
    ("unknown-key", {"checkpoint.registry.password": "x"},
     "at '/checkpoint/registry': additional properties 'password' not allowed"),
]  # fmt: skip


@pytest.mark.parametrize(("values", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_registry_values_are_refused_by_the_schema(
    values: dict[str, Any], message: str
) -> None:
    result = template({**ON, **values})
    assert 0 != result.returncode
    assert message in result.stderr, result.stderr
