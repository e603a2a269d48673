"""The chart's node agent of checkpoint and restore (``checkpoint.enabled``), rendered by the
real helm: off by default; when on, a DaemonSet in the release's namespace with no more host
access than docs/checkpoint.md "Security" says, a Role on the checkpoint records and node
reports of the webhook's namespace only (no ConfigMap), and a command line the agent
accepts; the CustomResourceDefinitions of those in the chart's ``crds/``. No cluster."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.helm_tools import CHART, helm, render, template
from webhook.agent.settings import AGENT_SETTINGS, load_agent_settings
from webhook.cli import build_parser
from webhook.core.errors import InputError

pytestmark = pytest.mark.e2e

NAMESPACE = "resize-preemption-system"
AGENT = "resize-preemption-webhook-node-agent"
ON = {"checkpoint.enabled": True}


def agent_objects(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The objects of the node agent, by kind (one each)."""
    objects = [o for o in render(values) if "node-agent" in o["metadata"]["name"]]
    kinds = [o["kind"] for o in objects]
    assert len(kinds) == len(set(kinds)), kinds
    return {o["kind"]: o for o in objects}


def pod_spec(values: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = agent_objects(values)["DaemonSet"]["spec"]["template"]["spec"]
    return spec


def test_the_chart_ships_the_records_kinds_with_their_status_apart() -> None:
    crds = [
        o for o in render({}, extra=["--include-crds"]) if o["kind"] == "CustomResourceDefinition"
    ]
    assert ["checkpointnodes.resize-preemption.io", "podcheckpoints.resize-preemption.io"] == (
        sorted(c["metadata"]["name"] for c in crds)
    )
    for crd in crds:
        (version,) = crd["spec"]["versions"]
        assert {"status": {}} == version["subresources"]
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        assert [{"rule": "self == oldSelf"}] == [
            {"rule": r["rule"]} for r in spec["x-kubernetes-validations"]
        ]


def test_the_agent_is_off_by_default() -> None:
    assert {} == agent_objects({})


def test_the_agent_runs_in_the_release_namespace_which_the_chart_does_not_make() -> None:
    objects = agent_objects(ON)
    assert "Namespace" not in objects
    assert (NAMESPACE, NAMESPACE) == (
        objects["DaemonSet"]["metadata"]["namespace"],
        objects["ServiceAccount"]["metadata"]["namespace"],
    )


def test_its_rights_are_records_and_reports_of_the_webhooks_namespace_only() -> None:
    objects = agent_objects(ON)
    role, binding = objects["Role"], objects["RoleBinding"]
    assert NAMESPACE == role["metadata"]["namespace"] == binding["metadata"]["namespace"]
    group = "resize-preemption.io"
    assert [
        {"apiGroups": [group], "resources": ["podcheckpoints"],
         "verbs": ["get", "list", "delete"]},
        {"apiGroups": [group], "resources": ["checkpointnodes"], "verbs": ["create"]},
        {"apiGroups": [group], "resources": ["podcheckpoints/status", "checkpointnodes/status"],
         "verbs": ["get", "patch"]},
    ] == role["rules"]  # fmt: skip
    assert [{"kind": "ServiceAccount", "name": AGENT, "namespace": NAMESPACE}] == (
        binding["subjects"]
    )
    assert {"ClusterRole", "ClusterRoleBinding"}.isdisjoint(objects)
    assert AGENT == pod_spec(ON)["serviceAccountName"]


@pytest.mark.parametrize(
    ("config", "paths"),
    [
        ("/etc/containerd/config.toml",
         {"/var/lib/kubelet/checkpoints": ("DirectoryOrCreate", False),
          "/etc/containerd/config.toml": ("File", True)}),
        ("", {"/var/lib/kubelet/checkpoints": ("DirectoryOrCreate", False)}),
    ],
    ids=["with-containerd-config", "without"],
)  # fmt: skip
def test_the_host_paths_are_the_checkpoint_directory_and_containerds_config(
    config: str, paths: dict[str, tuple[str, bool]]
) -> None:
    spec = pod_spec({**ON, "checkpoint.containerdConfig": config})
    (container,) = spec["containers"]
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert sorted(volumes) == sorted(mounts)
    assert paths == {
        volumes[n]["path"]: (volumes[n]["type"], mounts[n].get("readOnly", False)) for n in volumes
    }
    # Mounted where the host has them: the host's ctr imports the layout by that path.
    assert all(volumes[n]["path"] == mounts[n]["mountPath"] for n in volumes)


def test_the_pod_is_root_privileged_in_the_hosts_pid_namespace() -> None:
    spec = pod_spec(ON)
    (container,) = spec["containers"]
    assert True is spec["hostPID"]
    assert {"privileged": True, "runAsUser": 0, "readOnlyRootFilesystem": True} == (
        container["securityContext"]
    )
    assert "hostNetwork" not in spec


@pytest.mark.parametrize(
    "values",
    [
        ON,
        {**ON, "checkpoint.maxCheckpoints": 3, "checkpoint.maxCheckpointBytes": 1073741824,
         "checkpoint.pollInterval": 0.5, "checkpoint.containerdConfig": ""},
        {**ON, "checkpoint.maxCheckpointBytes": "512Mi", "checkpoint.criu": "/opt/criu/criu"},
        {**ON, "checkpoint.hostCommand": "", "checkpoint.ctr": "/usr/bin/ctr"},
    ],
    ids=["defaults", "numbers", "quantity-and-path", "no-host-command"],
)  # fmt: skip
def test_the_container_command_is_one_the_agent_accepts(values: dict[str, Any]) -> None:
    (container,) = pod_spec(values)["containers"]
    command = [*container["command"], *container["args"]]
    argv = [a.replace("$(NODE_NAME)", "node-1") for a in command[command.index("node-agent") :]]
    parsed = build_parser().parse_args(argv)
    flags = {name: getattr(parsed, name.replace("-", "_"), None) for name in AGENT_SETTINGS}
    settings = load_agent_settings(flags=flags)
    assert ("node-1", NAMESPACE) == (settings.node, settings.namespace)
    given = {k.removeprefix("checkpoint."): v for k, v in values.items()}
    if given.get("hostCommand") == "":
        assert ("/usr/bin/ctr", "criu") == (settings.ctr, settings.criu)
    else:
        assert settings.ctr.startswith("nsenter --target 1 --mount -- ")
    if "maxCheckpoints" in given:
        assert (3, 1024**3, 0.5, "") == (
            settings.max_checkpoints, settings.max_checkpoint_bytes, settings.poll_interval,
            settings.containerd_config,
        )  # fmt: skip
    if given.get("maxCheckpointBytes") == "512Mi":
        assert (512 * 1024**2, "nsenter --target 1 --mount -- /opt/criu/criu") == (
            settings.max_checkpoint_bytes, settings.criu
        )  # fmt: skip


BAD = [
    ("zero-checkpoints", {"checkpoint.maxCheckpoints": 0},
     "at '/checkpoint/maxCheckpoints': minimum: got 0, want 1"),
    ("bytes-as-words", {"checkpoint.maxCheckpointBytes": "lots"},
     "at '/checkpoint/maxCheckpointBytes'"),
    ("relative-dir", {"checkpoint.checkpointDir": "checkpoints"},
     "at '/checkpoint/checkpointDir': 'checkpoints' does not match pattern"),
    ("own-namespace", {"checkpoint.namespace": "resize-preemption-node"},
     "at '/checkpoint': additional properties 'namespace' not allowed"),
    ("zero-poll", {"checkpoint.pollInterval": 0},
     "at '/checkpoint/pollInterval': exclusiveMinimum: got 0, want 0"),
    ("unknown-key", {"checkpoint.maxImages": 3},
     "at '/checkpoint': additional properties 'maxImages' not allowed"),
]  # fmt: skip


@pytest.mark.parametrize(("values", "message"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_agent_values_are_refused_by_the_schema(values: dict[str, Any], message: str) -> None:
    result = template({**ON, **values})
    assert 0 != result.returncode
    assert message in result.stderr


@pytest.mark.parametrize(
    ("flag", "value"),
    [("max-checkpoints", 0), ("max-checkpoint-bytes", "lots"), ("checkpoint-dir", "checkpoints"),
     ("poll-interval", 0)],
    ids=["zero-checkpoints", "bytes-as-words", "relative-dir", "zero-poll"],
)  # fmt: skip
def test_the_agent_refuses_them_too(flag: str, value: Any) -> None:
    with pytest.raises(InputError, match=f"--{flag}="):
        load_agent_settings(flags={"node": "node-1", flag: json.dumps(value).strip('"')})


def test_helm_lint_is_clean_with_the_agent() -> None:
    result = helm(
        "lint", "--strict", str(CHART), "--kube-version", "1.37.2",
        "--set-json", "checkpoint.enabled=true", "--set", "image.localBuild=true",
    )  # fmt: skip
    assert 0 == result.returncode, result.stdout + result.stderr
