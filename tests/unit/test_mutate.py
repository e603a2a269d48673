"""The opt-in mutating endpoint: shrink a resize that cannot fit to the largest that does.

The scene: node-1 has 8 CPU; system-pod (2 CPU) outranks the resizing pod, so it never
goes; low-priority-pod (3 CPU) may be preempted; high-priority-pod holds 3 CPU and asks
for 7. Even with low-priority-pod gone only 6 CPU are free, so with
``resize-preemption.io/fit-to-node: "true"`` the resize becomes 6 (and preempts
low-priority-pod); without the annotation it is left alone.
"""

from __future__ import annotations

import base64
import copy
from typing import Any

import jsonpatch
import orjson
import pytest
from flask import Flask

from harness.doubles import InMemoryLedger, StaticClusterView
from tests.unit.web_fixtures import fit_to_node_objects, resized, review
from webhook.base.settings import Config
from webhook.core.model import FIT_TO_NODE_ANNOTATION
from webhook.web.app import create_app


def app_for(objects: tuple[dict[str, Any], ...]) -> tuple[Flask, InMemoryLedger]:
    ledger = InMemoryLedger()
    app = create_app(Config(), cluster=StaticClusterView.from_objects(objects), ledger=ledger)
    return app, ledger


def post(app: Flask, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = app.test_client().post(path, data=orjson.dumps(body), content_type="application/json")
    assert resp.status_code == 200, resp.data
    answer: dict[str, Any] = orjson.loads(resp.data)["response"]
    return answer


def patched(obj: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    assert answer["patchType"] == "JSONPatch"
    operations = orjson.loads(base64.b64decode(answer["patch"]))
    result: dict[str, Any] = jsonpatch.apply_patch(obj, operations)
    return result


def resources(obj: dict[str, Any]) -> dict[str, Any]:
    section: dict[str, Any] = obj["spec"]["containers"][0]["resources"]
    return section


def test_guaranteed_resize_is_reduced_to_what_fits_keeping_requests_equal_to_limits() -> None:
    objects = fit_to_node_objects(annotated=True)
    app, ledger = app_for(objects)
    high = objects[-1]
    new = resized(high, "7")

    answer = post(app, "/mutate-resize", review(high, new, uid="m-1"))

    assert answer["uid"] == "m-1"
    assert answer["allowed"] is True
    assert answer["warnings"] == ["resize-preemption: resize reduced to fit node-1: app cpu 7 -> 6"]
    result = patched(new, answer)
    assert (resources(result)) == {
        "requests": {"cpu": "6", "memory": "1Gi"},
        "limits": {"cpu": "6", "memory": "1Gi"},
    }
    # Only container resources change: the resize subresource would drop anything else.
    assert result == {**new, "spec": result["spec"]}
    assert result["spec"] == {
        **new["spec"],
        "containers": [{**new["spec"]["containers"][0], "resources": resources(result)}],
    }
    # The mutating endpoint reserves nothing: the validating one does, after it.
    assert ledger.writes == 0

    # The reduced resize is what the validating endpoint then admits, preempting.
    verdict = post(app, "/validate-resize", review(high, result, uid="v-1"))
    assert verdict["allowed"] is True
    assert verdict["warnings"] == [
        "preempting 1 lower-priority pod on node-1 for cpu 6: default/low-priority-pod"
    ]
    assert ledger.writes == 1


def test_burstable_resize_is_reduced_on_requests_and_stays_burstable() -> None:
    node, system, low, high = fit_to_node_objects(annotated=True)
    high = copy.deepcopy(high)
    resources(high)["limits"]["cpu"] = "8"
    high["status"]["qosClass"] = "Burstable"
    app, _ = app_for((node, system, low, high))
    new = resized(high, "7", limits=False)

    answer = post(app, "/mutate-resize", review(high, new))

    result = resources(patched(new, answer))
    assert result["requests"] == {"cpu": "6", "memory": "1Gi"}
    assert result["limits"] == {"cpu": "8", "memory": "1Gi"}  # untouched: still Burstable


def test_a_null_limits_section_is_left_alone() -> None:
    # A container may send "limits": null (nothing declared): only requests are reduced.
    node, system, low, high = fit_to_node_objects(annotated=True)
    high = copy.deepcopy(high)
    resources(high)["limits"] = None
    high["status"]["qosClass"] = "Burstable"
    app, _ = app_for((node, system, low, high))
    new = resized(high, "7", limits=False)

    answer = post(app, "/mutate-resize", review(high, new))

    assert {"requests": {"cpu": "6", "memory": "1Gi"}, "limits": None} == resources(
        patched(new, answer)
    )


@pytest.mark.parametrize(
    ("annotation", "cpu"),
    [
        pytest.param(None, "7", id="not-annotated"),
        pytest.param("false", "7", id="annotated-false"),
        pytest.param("true", "5", id="fits-with-preemption"),
        pytest.param("true", "3", id="no-change"),
        pytest.param("true", "2", id="shrink"),
    ],
)
def test_no_patch(annotation: str | None, cpu: str) -> None:
    node, system, low, high = fit_to_node_objects(annotated=False)
    if annotation is not None:
        high["metadata"]["annotations"] = {FIT_TO_NODE_ANNOTATION: annotation}
    app, _ = app_for((node, system, low, high))

    answer = post(app, "/mutate-resize", review(high, resized(high, cpu)))

    assert "patch" not in answer and "patchType" not in answer
    assert answer["allowed"] is True
    assert "warnings" not in answer


def test_nothing_fits_even_reduced_means_no_patch() -> None:
    # 5 CPU of system-pod + the 3 the pod holds fill the node, and nobody may be
    # preempted: there is nothing to grow into.
    node, system, _, high = fit_to_node_objects(annotated=True)
    resources(system)["requests"]["cpu"] = resources(system)["limits"]["cpu"] = "5"
    system["status"]["containerStatuses"][0]["allocatedResources"]["cpu"] = "5"
    system["status"]["containerStatuses"][0]["resources"]["requests"]["cpu"] = "5"
    app, _ = app_for((node, system, high))

    answer = post(app, "/mutate-resize", review(high, resized(high, "7")))

    assert "patch" not in answer
    assert answer["allowed"] is True


def test_validating_endpoint_never_patches_an_annotated_pod() -> None:
    objects = fit_to_node_objects(annotated=True)
    app, _ = app_for(objects)
    high = objects[-1]

    answer = post(app, "/validate-resize", review(high, resized(high, "7")))

    assert "patch" not in answer and "patchType" not in answer
    assert answer["warnings"][0].startswith("cannot fit on node-1")


def test_warn_mode_tells_what_the_reduction_would_be_and_patches_nothing() -> None:
    objects = fit_to_node_objects(annotated=True)
    app = create_app(
        Config(mode="warn"),
        cluster=StaticClusterView.from_objects(objects),
        ledger=InMemoryLedger(),
    )
    high = objects[-1]

    answer = post(app, "/mutate-resize", review(high, resized(high, "7"), uid="m-warn"))

    assert answer["allowed"] is True
    assert "patch" not in answer
    assert answer["warnings"] == [
        "resize-preemption: resize would be reduced to fit node-1: app cpu 7 -> 6"
    ]
