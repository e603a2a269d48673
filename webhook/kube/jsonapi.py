"""One JSON request to the API server through an ``ApiClient``, without the client's models.

The generated client validates request bodies against its pydantic models and serializes
times with ``isoformat()`` (which drops the fraction when it is zero, so a
``metav1.MicroTime`` would not always parse). Leases, Events, Evictions and status
patches are small documents we build ourselves, so they go out as plain JSON and come
back as plain dicts, with the client's authentication, TLS, pool and timeouts.

Errors are raised as :mod:`webhook.kube.errors` classes (``NotFound``, ``Conflict``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

import orjson
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from webhook.core.model import PodRef
from webhook.kube.errors import TRANSLATABLE, translate

Method = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]

JSON: Final = "application/json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"


def request_json(
    api_client: ApiClient,
    method: Method,
    path: str,
    *,
    body: Mapping[str, Any] | None = None,
    query: Mapping[str, str] | None = None,
    content_type: str = JSON,
    timeout: float | tuple[float, float] | None = None,
) -> dict[str, Any]:
    """Send one request; return the decoded JSON object (``{}`` for an empty body).

    Raises a :class:`webhook.kube.errors.ClusterError` subclass on any non-2xx answer or
    transport failure.
    """
    headers = {"Accept": JSON}
    if body is not None:
        headers["Content-Type"] = content_type
    try:
        request = api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query.items()) if query else None,
            header_params=headers,
            body=dict(body) if body is not None else None,
            auth_settings=["BearerToken"],
        )
        response = api_client.call_api(*request, _request_timeout=timeout)
        data: bytes = response.read()  # type: ignore[no-untyped-call]
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=None, data=None)
    except TRANSLATABLE as e:
        raise translate(e) from e
    if not data:
        return {}
    decoded = orjson.loads(data)
    return decoded if isinstance(decoded, dict) else {}


def pod_path(pod: PodRef) -> str:
    """The API path of ``pod`` (by namespace and name: its uid is no part of it)."""
    return f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}"


def patch_pod(
    api_client: ApiClient,
    pod: PodRef,
    subresource: str,
    patch: Mapping[str, Any],
    *,
    timeout: float | tuple[float, float] | None,
) -> dict[str, Any]:
    """Send the strategic merge ``patch`` to ``pod``'s ``subresource`` (``status``,
    ``resize``; ``""``: the pod itself); raises as :func:`request_json`."""
    return request_json(
        api_client,
        "PATCH",
        pod_path(pod) + ("/" + subresource if subresource else ""),
        body=patch,
        content_type=STRATEGIC_MERGE_PATCH,
        timeout=timeout,
    )


__all__ = [
    "JSON",
    "STRATEGIC_MERGE_PATCH",
    "patch_pod",
    "pod_path",
    "request_json",
]
