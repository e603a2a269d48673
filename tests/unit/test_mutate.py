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
import threading
import time
from typing import Any

import jsonpatch
import orjson
import pytest
from flask import Flask

from harness.doubles import InMemoryLedger, StaticClusterView
from tests.unit.test_reflector_stream import list_page, node_obj, pages
from tests.unit.web_fixtures import NODE, fit_to_node_objects, resized, review
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.model import FIT_TO_NODE_ANNOTATION
from webhook.engine import admission
from webhook.engine.admission import AdmissionEngine
from webhook.kube.cache import BUDGETS, NAMESPACES, NODES, PODS, PRIORITY_CLASSES, ClusterCache
from webhook.kube.reflector import WatchEvent
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


# -- a review sent the moment its neighbours were bound ---------------------------------------


def _versioned(obj: dict[str, Any], version: str, **spec: Any) -> dict[str, Any]:
    stamped = copy.deepcopy(obj)
    stamped["metadata"]["resourceVersion"] = version
    stamped["spec"].update(spec)
    return stamped


def _lagging_cache(
    monkeypatch: pytest.MonkeyPatch, held: list[dict[str, Any]], later: list[dict[str, Any]]
) -> ClusterCache:
    """The service's real cache, listed with ``held``; the watch delivers ``later`` (as
    MODIFIED events) 50 ms after a review first waits for it, and never if none does."""
    cache = ClusterCache(None, freeze_gc=False)
    for kind, items in ((NODES, [node_obj(NODE, "1")]), (BUDGETS, []), (PRIORITY_CLASSES, [])):
        cache.reflector(kind).load_pages(pages(list_page(items, "1")))
    namespaces = [
        {"metadata": {"name": n, "resourceVersion": "1"}} for n in ("default", "kube-system")
    ]
    cache.reflector(NAMESPACES).load_pages(pages(list_page(namespaces, "1")))
    pods = cache.reflector(PODS)
    pods.load_pages(pages(list_page(held, held[-1]["metadata"]["resourceVersion"])))
    waiting = pods.wait_for

    def deliver_then_wait(version: str, timeout: float) -> bool:
        def deliver() -> None:
            for obj in later:
                pods.apply(WatchEvent("MODIFIED", obj))

        threading.Timer(0.05, deliver).start()
        return waiting(version, timeout)

    monkeypatch.setattr(pods, "wait_for", deliver_then_wait)
    return cache


def test_a_review_sent_as_a_neighbour_is_bound_is_reduced_with_the_neighbour_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race seen on v1.35.4 (docs/control-plane.md): the resize reached the service
    before the watch had delivered system-pod's binding to node-1, so the mutating review
    planned on a node without it and reduced nothing. ``oldObject`` names a version of
    the pod written after that binding: the review waits for the cache to hold it."""
    _, system, low, high = fit_to_node_objects(annotated=True)
    held = [
        _versioned(system, "5", nodeName=""),  # created, not yet bound
        _versioned(low, "6"),
        _versioned(high, "7"),
    ]
    # The binding, then the kubelet's status write of high-priority-pod: the review's.
    bound, stored = _versioned(system, "12"), _versioned(high, "13")
    cache = _lagging_cache(monkeypatch, held, [bound, stored])
    app = create_app(Config(), cluster=cache, ledger=InMemoryLedger())
    new = resized(stored, "7")

    answer = post(app, "/mutate-resize", review(stored, new, uid="m-race"))

    assert ["resize-preemption: resize reduced to fit node-1: app cpu 7 -> 6"] == answer.get(
        "warnings"
    )
    assert {"cpu": "6", "memory": "1Gi"} == resources(patched(new, answer))["requests"]
    assert "13" == cache.reflector(PODS).resource_version


def test_a_claimed_version_never_written_costs_only_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A review that is a claim may name any version: it waits :data:`CATCH_UP` at most,
    is counted, and is planned on the cache as it is."""
    monkeypatch.setattr(admission, "CATCH_UP", 0.05)
    _, system, low, high = fit_to_node_objects(annotated=True)
    held = [_versioned(system, "5"), _versioned(low, "6"), _versioned(high, "7")]
    cache = _lagging_cache(monkeypatch, held, [])
    metrics = Metrics()
    engine = AdmissionEngine(Config(), cache, InMemoryLedger(), metrics=metrics)
    claimed = _versioned(high, "99999")

    started = time.monotonic()
    decision = engine.mutate(review(claimed, resized(claimed, "7"))["request"])
    waited = time.monotonic() - started

    assert ("reduced", ("resize-preemption: resize reduced to fit node-1: app cpu 7 -> 6",)) == (
        decision.verdict,
        decision.warnings,
    )
    assert 0.05 <= waited < 1.0
    assert 1 == metrics.registry.get_sample_value(
        "resize_preemption_errors_total", {"where": "cache-behind"}
    )
