"""Applying the patch ``kubectl patch --subresource resize`` sends."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.builders import make_pod, resize_patch
from webhook.core.errors import InputError, ResizeError
from webhook.core.objects import parse_pod
from webhook.core.resize import apply_resize
from webhook.core.resources import Resources


def stored() -> dict[str, Any]:
    return (
        make_pod("web")
        .requests(cpu="1", memory="1Gi")
        .limits(cpu="8", memory="1Gi")
        .requests(cpu="100m", container="log")
        .sidecar("proxy", cpu="100m", memory="64Mi")
        .admitted()
        .obj()
    )


def containers(obj: dict[str, Any], field: str = "containers") -> dict[str, Any]:
    return {c["name"]: c.get("resources") for c in obj["spec"].get(field, [])}


def test_requests_merge_key_by_key() -> None:
    patched = apply_resize(stored(), resize_patch("app", cpu="3"))

    assert {
        "requests": {"cpu": "3", "memory": "1Gi"},
        "limits": {"cpu": "8", "memory": "1Gi"},
    } == containers(patched)["app"]
    assert {"requests": {"cpu": "100m"}} == containers(patched)["log"]


def test_limits_and_requests_together() -> None:
    patch = {
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "2Gi"}},
                }
            ]
        }
    }
    patched = apply_resize(stored(), patch)

    assert {
        "requests": {"cpu": "1", "memory": "2Gi"},
        "limits": {"cpu": "8", "memory": "2Gi"},
    } == containers(patched)["app"]


def test_containers_matched_by_name_not_position() -> None:
    patch = {
        "spec": {
            "containers": [
                {"name": "log", "resources": {"requests": {"cpu": "200m"}}},
                {"name": "app", "resources": {"requests": {"cpu": "4"}}},
            ]
        }
    }
    pod = parse_pod(apply_resize(stored(), patch))

    assert [("app", 4000), ("log", 200)] == [(c.name, c.requests.cpu) for c in pod.containers]


def test_init_container_resize() -> None:
    patched = apply_resize(stored(), resize_patch("proxy", cpu="500m", init=True))

    assert {"cpu": "500m", "memory": "64Mi"} == containers(patched, "initContainers")["proxy"][
        "requests"
    ]


def test_pod_level_resize() -> None:
    obj = make_pod("web").requests(cpu="1").pod_resources(cpu="2", memory="1Gi").obj()
    patched = apply_resize(obj, {"spec": {"resources": {"requests": {"cpu": "3"}}}})

    assert Resources(3000, 2**30) == parse_pod(patched).pod_requests


def test_resize_policy_is_replaced() -> None:
    policy = [{"resourceName": "memory", "restartPolicy": "RestartContainer"}]
    patch = {"spec": {"containers": [{"name": "app", "resizePolicy": policy}]}}

    assert policy == apply_resize(stored(), patch)["spec"]["containers"][0]["resizePolicy"]


def test_the_stored_pod_is_not_changed() -> None:
    original = stored()
    apply_resize(original, resize_patch("app", cpu="3"))

    assert stored() == original


def test_metadata_in_the_patch_is_accepted_and_ignored() -> None:
    patched = apply_resize(stored(), {"metadata": {"name": "web"}, **resize_patch("app", cpu="2")})

    assert "2" == containers(patched)["app"]["requests"]["cpu"]


@pytest.mark.parametrize(
    "empty", [pytest.param(None, id="null-resources"), pytest.param("absent", id="no-resources")]
)
def test_container_without_resources(empty: object) -> None:
    obj = make_pod("web").requests(cpu="1").obj()
    if empty == "absent":
        del obj["spec"]["containers"][0]["resources"]
    else:
        obj["spec"]["containers"][0]["resources"] = empty

    patched = apply_resize(obj, resize_patch("app", cpu="2"))

    assert {"requests": {"cpu": "2"}} == containers(patched)["app"]


def test_null_pod_level_resources() -> None:
    obj = make_pod("web").requests(cpu="1").obj()
    obj["spec"]["resources"] = None

    patched = apply_resize(obj, {"spec": {"resources": {"requests": {"cpu": "2"}}}})

    assert {"requests": {"cpu": "2"}} == patched["spec"]["resources"]


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        pytest.param(
            resize_patch("sidecar", cpu="1"),
            "spec.containers[0]: the pod has no container named 'sidecar' (has: app, log)",
            id="unknown-container",
        ),
        pytest.param(
            resize_patch("app", cpu="1", init=True),
            "spec.initContainers[0]: the pod has no initContainer named 'app' (has: proxy)",
            id="app-container-named-as-init",
        ),
        pytest.param(
            {"spec": {"containers": [{"resources": {"requests": {"cpu": "1"}}}]}},
            "spec.containers[0]: every container in a resize patch needs a name",
            id="no-name",
        ),
        pytest.param(
            {"spec": {"containers": [{"name": "app", "image": "nginx"}]}},
            "spec.containers[0]: cannot resize image",
            id="other-container-field",
        ),
        pytest.param(
            {"spec": {"nodeName": "elsewhere"}},
            "a resize cannot change spec.nodeName",
            id="other-spec-field",
        ),
        pytest.param(
            {"status": {}},
            "a resize patch can only change spec, not status",
            id="status",
        ),
        pytest.param(
            {"spec": {"containers": [{"name": "app", "resources": {"requests": {"cpu": None}}}]}},
            "spec.containers[0].resources.requests.cpu: a resize cannot remove it",
            id="removing-a-request",
        ),
        pytest.param(
            {
                "spec": {
                    "containers": [
                        {"name": "app", "resources": {"requests": {"nvidia.com/gpu": "1"}}}
                    ]
                }
            },
            "only cpu and memory can be resized",
            id="other-resource",
        ),
        pytest.param(
            {"spec": {"containers": [{"name": "app", "resources": {"claims": []}}]}},
            "spec.containers[0].resources.claims: only requests and limits can be resized",
            id="resource-claims",
        ),
        pytest.param(
            {"spec": {"containers": {"name": "app"}}},
            "spec.containers must be a list",
            id="containers-not-a-list",
        ),
        pytest.param(
            {"spec": {"containers": [{"name": "app", "resources": {"requests": "2"}}]}},
            "spec.containers[0].resources.requests must be an object",
            id="requests-not-an-object",
        ),
        pytest.param({"spec": "x"}, "spec must be an object", id="spec-not-an-object"),
    ],
)
def test_bad_patches(patch: dict[str, Any], message: str) -> None:
    with pytest.raises(ResizeError) as raised:
        apply_resize(stored(), patch)

    assert message in str(raised.value)


def test_patch_must_be_an_object() -> None:
    with pytest.raises(ResizeError, match="the resize patch must be a JSON object"):
        apply_resize(stored(), [])  # type: ignore[arg-type]


def test_bad_quantity_in_a_patch_fails_when_parsed() -> None:
    patched = apply_resize(
        make_pod("web").requests(cpu="1").obj(), resize_patch("app", cpu="a lot")
    )

    with pytest.raises(InputError, match=r"spec.containers\[0\].resources.requests.cpu: 'a lot'"):
        parse_pod(patched)


@pytest.mark.parametrize(
    ("patch", "words"),
    [
        pytest.param(
            resize_patch("app", cpu="9"),
            "container 'app': requests.cpu 9 is above limits.cpu 8",
            id="request-above-the-limit",
        ),
        pytest.param(
            {
                "spec": {
                    "containers": [{"name": "app", "resources": {"limits": {"memory": "512Mi"}}}]
                }
            },
            "container 'app': requests.memory 1Gi is above limits.memory 512Mi",
            id="limit-below-the-request",
        ),
        pytest.param(
            {"spec": {"resources": {"requests": {"cpu": "3"}, "limits": {"cpu": "2"}}}},
            "the pod's spec.resources: requests.cpu 3 is above limits.cpu 2",
            id="pod-level",
        ),
        pytest.param(
            resize_patch("app", cpu="a lot"),
            "container 'app' requests.cpu: 'a lot' is not a valid quantity",
            id="a-quantity-that-does-not-read",
        ),
    ],
)
def test_a_resize_the_api_server_would_refuse_is_refused_in_one_line(
    patch: dict[str, Any], words: str
) -> None:
    with pytest.raises(InputError) as refused:
        apply_resize(stored(), patch)

    assert words in str(refused.value) and "\n" not in str(refused.value)
