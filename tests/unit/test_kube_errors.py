"""translate(): every way the API server or the network fails -> one ClusterError class."""

from __future__ import annotations

import orjson
import pytest
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from webhook.core.errors import WebhookError
from webhook.kube.errors import (
    ClusterError,
    Conflict,
    Expired,
    Forbidden,
    NotFound,
    TooManyRequests,
    Unavailable,
    translate,
)


def api_error(
    status: int,
    reason: str = "",
    message: str = "",
    headers: dict[str, str] | None = None,
    **extra: object,
) -> ApiException:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": status,
        **extra,
    }
    exc = ApiException(status=status, reason=reason or "Error", body=orjson.dumps(body).decode())
    exc.headers = headers
    return exc


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (404, NotFound),
        (409, Conflict),
        (410, Expired),
        (429, TooManyRequests),
        (401, Forbidden),
        (403, Forbidden),
        (500, Unavailable),
        (503, Unavailable),
        (504, Unavailable),
        (400, ClusterError),
        (422, ClusterError),
    ],
)
def test_status_picks_the_class(status: int, cls: type[ClusterError]) -> None:
    err = translate(api_error(status, message="boom"))
    assert type(err) is cls
    assert isinstance(err, WebhookError)
    assert err.status == status
    assert "boom" in str(err) and str(status) in str(err)


def test_conflict_tells_already_exists_from_a_stale_write() -> None:
    created = translate(api_error(409, "AlreadyExists", 'leases "x" already exists'))
    stale = translate(api_error(409, "Conflict", "the object has been modified"))
    assert isinstance(created, Conflict) and isinstance(stale, Conflict)
    assert ("AlreadyExists", "Conflict") == (created.reason, stale.reason)
    assert created.reason == "AlreadyExists"
    assert created.body["code"] == 409


def test_retry_after_from_the_header() -> None:
    err = translate(api_error(429, "TooManyRequests", headers={"Retry-After": "3"}))
    assert isinstance(err, TooManyRequests)
    assert err.retry_after == 3.0


def test_retry_after_from_the_status_details() -> None:
    err = translate(api_error(429, "TooManyRequests", details={"retryAfterSeconds": 7}))
    assert isinstance(err, TooManyRequests)
    assert err.retry_after == 7.0


def test_no_retry_after_hint() -> None:
    err = translate(api_error(429, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}))
    assert isinstance(err, TooManyRequests)
    assert err.retry_after is None


def test_eviction_blocked_by_a_budget() -> None:
    err = translate(
        api_error(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
            details={"causes": [{"reason": "DisruptionBudget", "message": "needs 1 healthy"}]},
        )
    )
    assert isinstance(err, TooManyRequests)
    assert err.blocked_by_budget
    assert err.causes[0]["reason"] == "DisruptionBudget"
    assert not TooManyRequests("apf", retry_after=1).blocked_by_budget


def test_body_that_is_not_a_status() -> None:
    exc = ApiException(status=502, reason="Bad Gateway", body="<html>proxy error</html>")
    err = translate(exc)
    assert isinstance(err, Unavailable)
    assert err.reason == "" and dict(err.body) == {}
    assert "Bad Gateway" in str(err)


def test_tls_failure_reported_as_status_zero() -> None:
    err = translate(ApiException(status=0, reason="SSLError\ncertificate verify failed"))
    assert isinstance(err, Unavailable)
    assert err.status is None


@pytest.mark.parametrize(
    "exc",
    [
        urllib3.exceptions.ReadTimeoutError(None, "/api", "read timed out"),  # type: ignore[arg-type]
        urllib3.exceptions.MaxRetryError(None, "/api", reason=ConnectionRefusedError()),  # type: ignore[arg-type]
        urllib3.exceptions.ProtocolError("Connection broken", ConnectionResetError()),
        ConnectionRefusedError(111, "Connection refused"),
        TimeoutError(),
        OSError(101, "Network is unreachable"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_transport_failures_are_unavailable(exc: BaseException) -> None:
    err = translate(exc)
    assert isinstance(err, Unavailable)
    assert err.status is None


def test_cluster_errors_pass_through() -> None:
    original = NotFound("gone", status=404)
    assert translate(original) is original


def test_anything_else_is_a_plain_cluster_error() -> None:
    err = translate(KeyError("x"))
    assert type(err) is ClusterError
    assert "KeyError" in str(err)
