"""The HTTP contract of the review endpoints and probes (Flask test client, no cluster)."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from harness.doubles import InMemoryLedger, StaticClusterView
from harness.noop_endpoint import add_noop_endpoint
from tests.unit.web_fixtures import (
    fit_to_node_objects,
    node,
    pod,
    resized,
    review,
    walkthrough_objects,
    walkthrough_review,
    walkthrough_view,
)
from webhook.base.metrics import Metrics
from webhook.base.settings import Config, Mode
from webhook.core.errors import InputError
from webhook.engine.admission import (
    AdmissionEngine,
    AdmissionRequest,
    AdmissionReview,
    Endpoint,
    clean_audit_annotations,
)
from webhook.web import app as app_module
from webhook.web.app import create_app

INFEASIBLE_WARNING = (
    "cannot fit on node-1 even after preempting every lower-priority pod: cpu short by 1"
)
WALKTHROUGH_WARNING = (
    "preempting 1 lower-priority pod on node-1 for cpu 6: default/low-priority-pod"
)
NOW = 1_750_000_000.0


@dataclass
class Service:
    app: Flask
    ledger: InMemoryLedger
    metrics: Metrics
    client: FlaskClient = field(init=False)

    def __post_init__(self) -> None:
        self.client = self.app.test_client()

    def post(self, path: str, body: Any, **kwargs: Any) -> TestResponse:
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        kwargs.setdefault("content_type", "application/json")
        return self.client.post(path, data=data, **kwargs)


def service(
    mode: Mode = "enforce", view: StaticClusterView | None = None, **config: Any
) -> Service:
    ledger = InMemoryLedger()
    metrics = Metrics()
    app = create_app(
        Config(mode=mode, **config),
        cluster=view if view is not None else walkthrough_view(),
        ledger=ledger,
        clock=lambda: NOW,
        metrics=metrics,
    )
    return Service(app, ledger, metrics)


def counter(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def assert_json(resp: TestResponse) -> Any:
    assert resp.mimetype == "application/json", resp.data
    return orjson.loads(resp.data)


# -- reviews ---------------------------------------------------------------------------------


def test_walkthrough_preempts_with_warning_audit_and_reservation() -> None:
    svc = service()

    resp = svc.post("/validate-resize", walkthrough_review(uid="uid-walkthrough"))

    assert resp.status_code == 200
    body = assert_json(resp)
    assert {k: body[k] for k in ("apiVersion", "kind")} == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
    }
    answer = body["response"]
    assert answer["uid"] == "uid-walkthrough"
    assert answer["allowed"] is True
    assert answer["warnings"] == [WALKTHROUGH_WARNING]
    assert answer["auditAnnotations"] == {
        "verdict": "preempt",
        "reason": "preempt",
        "node": "node-1",
        "victims": "default/low-priority-pod",
        "shortfall": "cpu=1,memory=0",
    }
    assert "patch" not in answer and "patchType" not in answer
    assert svc.ledger.writes == 1
    (entry,) = svc.ledger.entries("node-1")
    assert tuple(v.key for v in entry.victims) == ("default/low-priority-pod",)
    assert (
        counter(
            svc.metrics,
            "resize_preemption_reviews_total",
            endpoint="validate",
            verdict="preempt",
        )
        == 1
    )


def test_answer_is_repeated_for_a_retried_review() -> None:
    svc = service()
    first = assert_json(svc.post("/validate-resize", walkthrough_review(uid="same")))
    second = assert_json(svc.post("/validate-resize", walkthrough_review(uid="same")))
    assert first == second
    assert len(svc.ledger.entries("node-1")) == 1


_, _LOW, _HIGH = walkthrough_objects()


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(review(_HIGH, resized(_HIGH, "6"), sub_resource=None), id="pod-update"),
        pytest.param(review(None, _HIGH, operation="CREATE", sub_resource=None), id="pod-create"),
        pytest.param(review(_HIGH, resized(_HIGH, "6"), sub_resource="status"), id="pods-status"),
        pytest.param(
            {
                **review(_HIGH, _HIGH),
                "request": {
                    **review(_HIGH, _HIGH)["request"],
                    "resource": {"group": "apps", "version": "v1", "resource": "deployments"},
                },
            },
            id="deployment",
        ),
        pytest.param(review(_HIGH, _HIGH, operation="DELETE"), id="delete"),
    ],
)
def test_requests_other_than_a_pod_resize_are_allowed_untouched(body: dict[str, Any]) -> None:
    svc = service()
    answer = assert_json(svc.post("/validate-resize", body))["response"]
    assert answer == {"uid": "review-1", "allowed": True}
    assert svc.ledger.writes == 0


@pytest.mark.parametrize("endpoint", ["/validate-resize", "/mutate-resize"])
def test_v1beta1_is_answered_in_v1beta1(endpoint: str) -> None:
    body = walkthrough_review(api_version="admission.k8s.io/v1beta1")
    answer = assert_json(service().post(endpoint, body))
    assert answer["apiVersion"] == "admission.k8s.io/v1beta1"


@dataclass(frozen=True)
class Case:
    mode: Mode
    cpu: str
    dry_run: bool
    allowed: bool
    warning: str
    writes: int
    status: dict[str, Any] | None = None
    #: The walkthrough, or one whose resize cannot fit even after preemption: node-1
    #: with a 2 CPU pod of higher priority, high-priority-pod 3 -> 7 CPU.
    crowded: bool = False


DECISIONS = {
    "enforce-preempt": Case("enforce", "6", False, True, WALKTHROUGH_WARNING, 1),
    "dry-run-writes-nothing": Case(
        "enforce",
        "6",
        True,
        True,
        "would preempt 1 lower-priority pod on node-1 for cpu 6: default/low-priority-pod",
        0,
    ),
    "warn-mode-writes-nothing": Case(
        "warn",
        "6",
        False,
        True,
        "would preempt 1 lower-priority pod on node-1 for cpu 6: default/low-priority-pod",
        0,
    ),
    "enforce-infeasible-allowed": Case(
        "enforce", "7", False, True, INFEASIBLE_WARNING, 0, crowded=True
    ),
    "enforce-over-allocatable-allowed": Case(
        "enforce", "10", False, True, "requests exceed node-1 allocatable: cpu 10 > 8", 0
    ),
    "deny-infeasible-denies": Case(
        "deny-infeasible",
        "7",
        False,
        False,
        INFEASIBLE_WARNING,
        0,
        status={"code": 403, "reason": "Forbidden"},
        crowded=True,
    ),
    "deny-over-allocatable-denies": Case(
        "deny-infeasible",
        "10",
        False,
        False,
        "requests exceed node-1 allocatable",
        0,
        status={"code": 403, "reason": "Forbidden"},
    ),
    "deny-infeasible-dry-run-denies-like-the-real-request": Case(
        "deny-infeasible",
        "7",
        True,
        False,
        INFEASIBLE_WARNING,
        0,
        status={"code": 403, "reason": "Forbidden"},
        crowded=True,
    ),
    "deny-infeasible-feasible-allows": Case(
        "deny-infeasible", "6", False, True, WALKTHROUGH_WARNING, 1
    ),
}


@pytest.mark.parametrize("case", DECISIONS.values(), ids=DECISIONS.keys())
def test_modes_and_dry_run(case: Case) -> None:
    objects = fit_to_node_objects(annotated=False) if case.crowded else walkthrough_objects()
    svc = service(case.mode, StaticClusterView.from_objects(objects))
    high = objects[-1]
    body = review(high, resized(high, case.cpu), uid="u-1", dry_run=case.dry_run)

    resp = svc.post("/validate-resize", body)

    assert resp.status_code == 200  # a denial is an AdmissionReview, not an HTTP error
    answer = assert_json(resp)["response"]
    assert answer["uid"] == "u-1"
    assert case.allowed is answer["allowed"]
    assert len(answer["warnings"]) == 1
    assert answer["warnings"][0].startswith(case.warning), answer["warnings"]
    assert case.writes == svc.ledger.writes
    if case.status is None:
        assert "status" not in answer
    else:
        status = answer["status"]
        assert case.status == {k: status[k] for k in case.status}
        # The reason kubectl prints: why even preemption cannot make room.
        assert status["message"].startswith("resize-preemption: ")
        assert "node-1" in status["message"]


def test_warnings_respect_the_api_server_limits() -> None:
    # 30 victims with long names: the warning is cut to one line of at most 120 chars.
    long = "x" * 50
    victims = [pod(f"{long}-{i}", "250m", 10) for i in range(30)]
    high = pod("high-priority-pod", "500m", 1_000_000)
    view = StaticClusterView.from_objects([walkthrough_objects()[0], *victims, high])
    answer = assert_json(
        service(view=view).post("/validate-resize", review(high, resized(high, "7")))
    )["response"]
    assert answer["warnings"]
    for w in answer["warnings"]:
        assert len(w) <= 120 and "\n" not in w
    for key in answer["auditAnnotations"]:
        assert "/" not in key and len(key) <= 63


@pytest.mark.parametrize(
    "annotations, expected",
    [
        pytest.param({"verdict": "fits"}, {"verdict": "fits"}, id="valid-keys-kept"),
        pytest.param({"verdict": 3}, {"verdict": "3"}, id="values-become-text"),
        pytest.param(
            {"verdict": "fits", "a/b": "x", "-x": "y", "k" * 64: "z"},
            {"verdict": "fits"},
            id="invalid-keys-dropped",
        ),
    ],
)
def test_audit_annotations_follow_the_api_server_rules(
    annotations: dict[str, Any], expected: dict[str, str]
) -> None:
    # Twice: the second time every valid key has been seen before.
    for _ in range(2):
        assert expected == clean_audit_annotations(annotations)


def test_unknown_node_fails_open_with_a_warning() -> None:
    # The pod's watch has delivered it, its node's not yet.
    high = pod("high-priority-pod", "4", 1_000_000, node_name="node-9")
    svc = service(view=StaticClusterView.from_objects([node(), high]))
    answer = assert_json(svc.post("/validate-resize", review(high, resized(high, "6"))))["response"]
    assert answer["allowed"] is True
    assert "node node-9 is not known yet" in answer["warnings"][0]


def test_a_pod_the_cache_does_not_hold_is_allowed_plainly_and_reserves_nothing() -> None:
    ghost = pod("ghost", "1", 2_000_000_000)
    svc = service()
    answer = assert_json(svc.post("/validate-resize", review(ghost, resized(ghost, "8"))))
    response = answer["response"]
    assert response["allowed"] is True
    assert [
        "resize-preemption: the pod is not as the service's cache holds it; resize not planned"
    ] == response["warnings"]
    assert 0 == svc.ledger.writes
    assert 1 == counter(svc.metrics, "resize_preemption_unverified_reviews_total")


def test_mutate_never_patches_a_pod_without_the_annotation() -> None:
    svc = service()
    answer = assert_json(svc.post("/mutate-resize", walkthrough_review()))["response"]
    assert answer == {"uid": "review-1", "allowed": True}
    assert svc.ledger.writes == 0  # the mutating endpoint never reserves


# -- malformed requests ----------------------------------------------------------------------

BAD_BODIES: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "not JSON"),
    "not-json": (b"hello", "not JSON"),
    "not-utf8": (b'{"kind": "\xff\xfe"}', "not JSON"),
    "array": (b"[]", "not a JSON object"),
    "wrong-kind": (
        orjson.dumps({"apiVersion": "v1", "kind": "Pod"}),
        "expected kind AdmissionReview",
    ),
    "no-request": (
        orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
        "has no request",
    ),
    "no-uid": (
        orjson.dumps(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}
        ),
        "has no uid",
    ),
    "uid-not-string": (
        orjson.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {"uid": 7},
            }
        ),
        "has no uid",
    ),
    "object-not-object": (
        orjson.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {"uid": "u", "object": [1]},
            }
        ),
        "request.object is not an object",
    ),
    "deep-nesting": (b"[" * 5000 + b"]" * 5000, "not JSON"),
}


@pytest.mark.parametrize("endpoint", ["/validate-resize", "/mutate-resize"])
@pytest.mark.parametrize(("body", "message"), BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_a_body_that_is_not_an_admission_review_is_400(
    endpoint: str, body: bytes, message: str
) -> None:
    resp = service().post(endpoint, body)
    assert resp.status_code == 400
    assert message in assert_json(resp)["error"]


def test_a_body_over_the_limit_is_413() -> None:
    svc = service(max_body_bytes=2048)
    body = orjson.dumps(walkthrough_review()) + b" " * 4096

    resp = svc.post("/validate-resize", body)

    assert resp.status_code == 413
    error = assert_json(resp)["error"]
    assert "exceeds the limit of 2048 bytes" in error


def test_a_chunked_body_over_the_limit_is_413() -> None:
    # No Content-Length: the limit is enforced while reading the stream.
    svc = service(max_body_bytes=2048)
    stream = io.BytesIO(orjson.dumps(walkthrough_review()) + b" " * 4096)
    resp = svc.client.post(
        "/validate-resize",
        input_stream=stream,
        content_type="application/json",
        headers={"Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert resp.status_code == 413
    assert "exceeds the limit of 2048 bytes" in assert_json(resp)["error"]


def test_a_chunked_body_within_the_limit_is_answered() -> None:
    body = orjson.dumps(walkthrough_review(uid="chunked"))
    svc = service(max_body_bytes=len(body))
    resp = svc.client.post(
        "/validate-resize",
        input_stream=io.BytesIO(body),
        content_type="application/json",
        headers={"Transfer-Encoding": "chunked"},
        environ_overrides={"wsgi.input_terminated": True},
    )
    assert resp.status_code == 200
    assert assert_json(resp)["response"]["uid"] == "chunked"


def test_a_body_at_the_limit_is_read() -> None:
    body = orjson.dumps(walkthrough_review())
    svc = service(max_body_bytes=len(body))
    assert svc.post("/validate-resize", body).status_code == 200


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("application/merge-patch+json", 200),
        ("", 200),  # no Content-Type at all: tolerated
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),
        ("multipart/form-data; boundary=x", 415),
    ],
)
def test_content_types(content_type: str, status: int) -> None:
    svc = service()
    headers = {"Content-Type": content_type} if content_type else {}
    resp = svc.client.post(
        "/validate-resize", data=orjson.dumps(walkthrough_review()), headers=headers
    )
    assert status == resp.status_code
    body = assert_json(resp)
    if status == 415:
        assert "application/json" in body["error"]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/validate-resize", "POST"),
        ("PUT", "/validate-resize", "POST"),
        ("DELETE", "/mutate-resize", "POST"),
        ("OPTIONS", "/mutate-resize", "POST"),
        ("POST", "/livez", "GET, HEAD, OPTIONS"),
        ("POST", "/readyz", "GET, HEAD, OPTIONS"),
    ],
)
def test_wrong_method_is_405(method: str, path: str, allow: str) -> None:
    resp = service().client.open(path, method=method)
    assert resp.status_code == 405
    assert allow == resp.headers["Allow"]
    assert f"method {method} is not allowed on {path}" in assert_json(resp)["error"]


@pytest.mark.parametrize("path", ["/", "/validate", "/metrics", "/noop", "/validate-resize/x"])
def test_unknown_path_is_404(path: str) -> None:
    resp = service().client.post(path, data=b"{}")
    assert resp.status_code == 404
    assert "/validate-resize" in assert_json(resp)["error"]


def test_the_benchmarks_noop_endpoint_takes_the_review_path() -> None:
    app = add_noop_endpoint(create_app(cluster=walkthrough_view(), ledger=InMemoryLedger()))
    client = app.test_client()
    resp = client.post(
        "/noop", data=orjson.dumps(walkthrough_review(uid="n-1")), content_type="application/json"
    )
    assert resp.status_code == 200
    assert assert_json(resp)["response"] == {"uid": "n-1", "allowed": True}
    assert client.post("/noop", data=b"{}", content_type="application/json").status_code == 400


# -- failures inside the service: never a 500 ------------------------------------------------


class ExplodingEngine(AdmissionEngine):
    def answer(
        self, api_version: str, request: AdmissionRequest, endpoint: Endpoint
    ) -> AdmissionReview:
        raise RuntimeError("boom")


def test_an_exception_after_the_review_was_read_fails_open() -> None:
    engine = ExplodingEngine(Config(), walkthrough_view(), InMemoryLedger())
    app = create_app(engine=engine)

    resp = app.test_client().post(
        "/validate-resize", data=orjson.dumps(walkthrough_review(uid="u-9")), content_type=""
    )

    assert resp.status_code == 200
    answer = assert_json(resp)["response"]
    assert answer["uid"] == "u-9"
    assert answer["allowed"] is True
    assert "internal error" in answer["warnings"][0]
    assert counter(engine.metrics, "resize_preemption_errors_total", where="web") == 1


class UnreadableEngine(AdmissionEngine):
    def answer(
        self, api_version: str, request: AdmissionRequest, endpoint: Endpoint
    ) -> AdmissionReview:
        raise InputError("the engine could not read its own answer")


def test_bad_input_raised_after_the_review_was_read_fails_open() -> None:
    engine = UnreadableEngine(Config(), walkthrough_view(), InMemoryLedger())
    app = create_app(engine=engine)

    resp = app.test_client().post(
        "/validate-resize", data=orjson.dumps(walkthrough_review(uid="u-8")), content_type=""
    )

    assert (200, "u-8", True) == (
        resp.status_code,
        assert_json(resp)["response"]["uid"],
        assert_json(resp)["response"]["allowed"],
    )
    assert 1 == counter(engine.metrics, "resize_preemption_errors_total", where="web")
    assert 1 == counter(
        engine.metrics,
        "resize_preemption_reviews_total",
        endpoint="validate",
        verdict="error",
    )


def test_an_exception_before_the_review_was_read_is_400(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(body: bytes) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(app_module, "parse_review", broken)
    metrics = Metrics()
    app = create_app(cluster=StaticClusterView(), ledger=InMemoryLedger(), metrics=metrics)

    resp = app.test_client().post(
        "/validate-resize", data=orjson.dumps(walkthrough_review()), content_type=""
    )

    assert resp.status_code == 400
    assert "could not be read" in assert_json(resp)["error"]
    assert counter(metrics, "resize_preemption_errors_total", where="web") == 1


#: Ways of sending a review; the API server's first.
DELIVERIES = {
    "as the API server sends it": {"content_type": "application/json"},
    "with a charset": {"content_type": "application/json; charset=utf-8"},
    "without a Content-Type": {"content_type": ""},
    "chunked": {
        "content_type": "application/json",
        "headers": {"Transfer-Encoding": "chunked"},
        "environ_overrides": {"wsgi.input_terminated": True},
    },
}


def _send(app: Flask, path: str, body: bytes, delivery: dict[str, Any]) -> TestResponse:
    kwargs = dict(delivery)
    if "headers" in kwargs:
        kwargs["input_stream"] = io.BytesIO(body)
    else:
        kwargs["data"] = body
    return app.test_client().post(path, **kwargs)


@pytest.mark.parametrize("delivery", DELIVERIES.values(), ids=DELIVERIES.keys())
@pytest.mark.parametrize("path", ["/validate-resize", "/noop"])
def test_every_way_of_sending_a_review_gets_the_same_answer(
    path: str, delivery: dict[str, Any]
) -> None:
    reference = add_noop_endpoint(
        create_app(cluster=walkthrough_view(), ledger=InMemoryLedger(), clock=lambda: NOW)
    )
    app = add_noop_endpoint(
        create_app(cluster=walkthrough_view(), ledger=InMemoryLedger(), clock=lambda: NOW)
    )
    body = orjson.dumps(walkthrough_review(uid="same"))
    expected = _send(reference, path, body, DELIVERIES["as the API server sends it"])
    resp = _send(app, path, body, delivery)
    assert (200, "application/json") == (resp.status_code, resp.mimetype)
    assert orjson.loads(expected.data) == orjson.loads(resp.data)
    assert str(len(resp.data)) == resp.headers["Content-Length"]


@pytest.mark.parametrize("delivery", DELIVERIES.values(), ids=DELIVERIES.keys())
def test_failures_are_answered_alike_every_way(
    delivery: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = ExplodingEngine(Config(), walkthrough_view(), InMemoryLedger())
    exploding = create_app(engine=engine)
    resp = _send(exploding, "/validate-resize", orjson.dumps(walkthrough_review(uid="u")), delivery)
    assert (200, True) == (resp.status_code, assert_json(resp)["response"]["allowed"])
    assert 1 == counter(engine.metrics, "resize_preemption_errors_total", where="web")

    resp = _send(
        create_app(cluster=StaticClusterView(), ledger=InMemoryLedger()),
        "/validate-resize",
        b"[1]",
        delivery,
    )
    assert 400 == resp.status_code
    assert "not a JSON object" in assert_json(resp)["error"]

    def broken(body: bytes) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(app_module, "parse_review", broken)
    metrics = Metrics()
    app = create_app(cluster=StaticClusterView(), ledger=InMemoryLedger(), metrics=metrics)
    resp = _send(app, "/validate-resize", orjson.dumps(walkthrough_review()), delivery)
    assert 400 == resp.status_code
    assert "could not be read" in assert_json(resp)["error"]
    assert 1 == counter(metrics, "resize_preemption_errors_total", where="web")


def test_metrics_are_injected_not_global() -> None:
    metrics = Metrics()
    app = create_app(cluster=walkthrough_view(), ledger=InMemoryLedger(), metrics=metrics)
    other = create_app(cluster=walkthrough_view(), ledger=InMemoryLedger())
    for served in (app, other):
        served.test_client().post("/validate-resize", data=orjson.dumps(walkthrough_review()))
    assert 1 == counter(
        metrics, "resize_preemption_reviews_total", endpoint="validate", verdict="preempt"
    )


# -- probes ----------------------------------------------------------------------------------


def test_livez_is_always_200() -> None:
    app = create_app(
        cluster=StaticClusterView(), ledger=InMemoryLedger(), readiness=lambda: {"tls": False}
    )
    resp = app.test_client().get("/livez")
    assert resp.status_code == 200
    assert assert_json(resp) == {"status": "ok"}


def test_readyz_is_503_until_every_check_passes() -> None:
    state = {"tls": True, "cache": False, "ledger": True}
    app = create_app(
        cluster=StaticClusterView(), ledger=InMemoryLedger(), readiness=lambda: dict(state)
    )
    client = app.test_client()

    resp = client.get("/readyz")
    assert resp.status_code == 503
    assert {"ready": False, "checks": state} == assert_json(resp)

    state["cache"] = True
    resp = client.get("/readyz")
    assert resp.status_code == 200
    assert {"ready": True, "checks": state} == assert_json(resp)


@pytest.mark.parametrize(
    ("readiness", "status"),
    [
        pytest.param(None, 200, id="default-checks-static-view"),
        pytest.param(lambda: {}, 503, id="no-checks-is-not-ready"),
    ],
)
def test_readyz_defaults(readiness: Callable[[], dict[str, bool]] | None, status: int) -> None:
    app = create_app(cluster=walkthrough_view(), ledger=InMemoryLedger(), readiness=readiness)
    assert status == app.test_client().get("/readyz").status_code


def test_readyz_default_checks_follow_the_cache() -> None:
    app = create_app(cluster=walkthrough_view(synced=False), ledger=InMemoryLedger())
    resp = app.test_client().get("/readyz")
    assert resp.status_code == 503
    assert assert_json(resp)["checks"] == {"cache": False, "ledger": True}


def test_a_failing_readiness_check_is_503_not_500() -> None:
    def broken() -> dict[str, bool]:
        raise RuntimeError("cache exploded")

    resp = (
        create_app(cluster=StaticClusterView(), ledger=InMemoryLedger(), readiness=broken)
        .test_client()
        .get("/readyz")
    )
    assert resp.status_code == 503
    assert assert_json(resp) == {"ready": False, "checks": {"readiness": False}}
