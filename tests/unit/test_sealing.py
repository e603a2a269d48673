"""Literal env values of a checkpointed pod are sealed in its record and opened only for
its own restore (:mod:`webhook.kube.sealing`)."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from webhook.core.checkpoint import CheckpointRecord, Phase, image_reference, restored_pod
from webhook.kube.sealing import KEY_VARIABLE, PREFIX, EnvSealer, SealError, load_sealer

UID = "0123456789ab-cdef-4000-8000-000000000001"
KEY = bytes(range(32))


def _pod() -> dict[str, Any]:
    env = [
        {"name": "PASSWORD", "value": "hunter2"},
        {"name": "EMPTY", "value": ""},
        {"name": "FROM", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
    ]
    return {
        "metadata": {"name": "low", "namespace": "team-a", "uid": UID},
        "spec": {
            "nodeName": "node-1",
            "initContainers": [{"name": "init", "image": "busybox", "env": [dict(env[0])]}],
            "containers": [{"name": "main", "image": "busybox", "env": copy.deepcopy(env)}],
        },
    }


def _restored(pod: dict[str, Any]) -> dict[str, Any]:
    image = image_reference("team-a", "low", "main", UID)
    record = CheckpointRecord(
        UID, "node-1", Phase.IMAGED, pod, {"main": "/a.tar"}, {"main": image}, {"main": ["sh"]}
    )
    return restored_pod(record, "node-1")


def test_literal_values_are_sealed_and_only_they() -> None:
    sealed = EnvSealer(KEY).seal(_pod())

    env = sealed["spec"]["containers"][0]["env"]
    assert env[0]["value"].startswith(PREFIX)
    assert "hunter2" not in json.dumps(sealed)
    assert {"name": "EMPTY", "value": ""} == env[1]
    assert _pod()["spec"]["containers"][0]["env"][2] == env[2]
    assert sealed["spec"]["initContainers"][0]["env"][0]["value"].startswith(PREFIX)


def test_the_restore_opens_them_again() -> None:
    sealer = EnvSealer(KEY)
    opened = sealer.open(_restored(sealer.seal(_pod())))

    assert "hunter2" == opened["spec"]["containers"][0]["env"][0]["value"]
    assert "hunter2" == opened["spec"]["initContainers"][0]["env"][0]["value"]


def test_another_key_does_not_open_them() -> None:
    manifest = _restored(EnvSealer(KEY).seal(_pod()))
    with pytest.raises(SealError, match="PASSWORD in container init"):
        EnvSealer(bytes(32)).open(manifest)


@pytest.mark.parametrize("where", ["another-pod", "another-record", "another-container"])
def test_a_sealed_value_moved_elsewhere_does_not_open(where: str) -> None:
    sealer = EnvSealer(KEY)
    manifest = _restored(sealer.seal(_pod()))
    if where == "another-pod":
        manifest["metadata"]["name"] = "attacker"
    elif where == "another-record":
        manifest["metadata"]["annotations"]["resize-preemption.io/restored-from"] = "rpw-x"
    else:
        init = manifest["spec"]["initContainers"][0]
        init["name"] = "main2"
    with pytest.raises(SealError):
        sealer.open(manifest)


@pytest.mark.parametrize("value", ["", "not base64!", base64.b64encode(b"short").decode()])
def test_without_a_usable_key_one_is_made(value: str) -> None:
    sealer = load_sealer({KEY_VARIABLE: value} if value else {})
    assert (
        "hunter2"
        == sealer.open(_restored(sealer.seal(_pod())))["spec"]["containers"][0]["env"][0]["value"]
    )


def test_the_key_given_is_the_one_used() -> None:
    given = load_sealer({KEY_VARIABLE: base64.b64encode(KEY).decode()})
    assert (
        "hunter2"
        == EnvSealer(KEY).open(_restored(given.seal(_pod())))["spec"]["containers"][0]["env"][0][
            "value"
        ]
    )


def test_kubectls_copy_of_the_manifest_is_sealed_too() -> None:
    pod = _pod()
    applied = json.dumps(pod)
    pod["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": applied,
        "team": "ml",
    }
    sealer = EnvSealer(KEY)

    sealed = sealer.seal(pod)

    assert "hunter2" not in json.dumps(sealed)
    assert "ml" == sealed["metadata"]["annotations"]["team"]
    opened = sealer.open(_restored(sealed))
    assert (
        applied
        == opened["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
    )
