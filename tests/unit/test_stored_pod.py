"""A review's stored pod (``oldObject``) is taken from the cluster view when the view has
that very version of it, and parsed from the review otherwise."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from harness.doubles import InMemoryLedger, StaticClusterView
from tests.unit.web_fixtures import node, pod, resized, review, walkthrough_objects
from webhook.base.settings import Config
from webhook.core.objects import parse_node, parse_pod
from webhook.engine.admission import AdmissionEngine
from webhook.kube.cache import PodCompactor


def _versioned(obj: dict[str, Any], version: str, **meta: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = version
    out["metadata"].update(meta)
    return out


@pytest.mark.parametrize(
    ("in_view", "expected"),
    [
        pytest.param({"version": "7"}, "preempt", id="same-version-is-read-from-the-view"),
        pytest.param({"version": "8", "cpu": "6"}, "fits", id="other-version-is-parsed"),
        pytest.param({"version": "8"}, "unverified", id="other-version-other-resources"),
        pytest.param({"version": "7", "uid": "uid-other"}, "unverified", id="other-uid"),
        pytest.param({"version": ""}, "unverified", id="view-without-version"),
    ],
)
def test_which_stored_pod_a_decision_reads(in_view: dict[str, str], expected: str) -> None:
    # The review says the pod already holds 6 CPU, so growing to 6 is no growth; the
    # view's version of it holds 4 unless told. Only the same version of the pod may be
    # swapped for the review's; another version is parsed, and decided on only when it
    # declares what the view's does (a review the cache does not bear out is not planned).
    stored = _versioned(pod("high-priority-pod", "6", 1_000_000), "7")
    viewed = _versioned(
        pod("high-priority-pod", in_view.get("cpu", "4"), 1_000_000), in_view["version"]
    )
    if "uid" in in_view:
        viewed["metadata"]["uid"] = in_view["uid"]
    view = StaticClusterView.from_objects([node(), pod("low-priority-pod", "3", 1000), viewed])
    engine = AdmissionEngine(Config(), view, InMemoryLedger())

    decision = engine.validate(review(stored, resized(stored, "6"))["request"])

    assert expected == decision.verdict


def test_the_compacted_cache_pod_decides_as_the_parsed_review_does() -> None:
    node_obj, low, high = walkthrough_objects()
    high = _versioned(high, "41")
    high["metadata"]["annotations"] = {"example.com/owner": "team-a"}  # not kept by the cache
    request = review(high, resized(high, "6"))["request"]

    def engine(pods: list[Any]) -> AdmissionEngine:
        view = StaticClusterView([parse_node(node_obj)], pods)
        return AdmissionEngine(Config(), view, InMemoryLedger(), clock=lambda: 1000.0)

    compactor = PodCompactor()
    cached = [compactor.compact(parse_pod(o)) for o in (low, high)]
    unversioned = [parse_pod(o) for o in (low, _versioned(high, ""))]
    from_view, from_review = engine(cached), engine(unversioned)
    assert cached[1] is from_view._stored_pod(request["oldObject"])
    assert from_review._stored_pod(request["oldObject"]) is None

    assert from_review.validate(request) == from_view.validate(request)
