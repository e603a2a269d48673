"""AdmissionReview v1 on the wire: typed shapes, validation of what arrives, responses.

The API server enforces its own rules on our answers (uid echo, apiVersion/kind, no patch
from a validating webhook, warning and audit-annotation formats); everything we send is
built here so those rules live in one place.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal, NotRequired, TypedDict, cast

import orjson

from webhook.core.errors import InputError
from webhook.core.report import WARNING_LIMIT, clip

API_VERSIONS: Final = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
MAX_WARNINGS_CHARS: Final = 4096
MAX_WARNING_CHARS: Final = WARNING_LIMIT
# An audit annotation key: a qualified name's name part (no prefix; the API server adds
# the webhook's name as prefix), at most 63 characters.
_AUDIT_KEY: Final = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class ReviewError(InputError):
    """The body is not an AdmissionReview we can answer (HTTP 400)."""


class GroupVersionResource(TypedDict):
    group: str
    version: str
    resource: str


class AdmissionRequest(TypedDict):
    uid: str
    kind: NotRequired[Mapping[str, str]]
    resource: NotRequired[GroupVersionResource]
    subResource: NotRequired[str]
    name: NotRequired[str]
    namespace: NotRequired[str]
    operation: NotRequired[Operation]
    userInfo: NotRequired[Mapping[str, Any]]
    object: NotRequired[Mapping[str, Any] | None]
    oldObject: NotRequired[Mapping[str, Any] | None]
    dryRun: NotRequired[bool]


class Status(TypedDict):
    code: int
    message: str
    reason: NotRequired[str]


class AdmissionResponse(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[Status]
    patch: NotRequired[str]
    patchType: NotRequired[Literal["JSONPatch"]]
    warnings: NotRequired[list[str]]
    auditAnnotations: NotRequired[dict[str, str]]


class AdmissionReview(TypedDict):
    apiVersion: str
    kind: Literal["AdmissionReview"]
    response: AdmissionResponse


def parse_review(body: bytes) -> tuple[str, AdmissionRequest]:
    """(apiVersion, request) of an AdmissionReview body, or :class:`ReviewError`."""
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ReviewError("body is not JSON; expected an AdmissionReview") from None
    if not isinstance(review, dict):
        raise ReviewError("body is not a JSON object; expected an AdmissionReview")
    api_version, kind = review.get("apiVersion"), review.get("kind")
    if kind != "AdmissionReview" or api_version not in API_VERSIONS:
        raise ReviewError(
            f"expected kind AdmissionReview of admission.k8s.io/v1, got kind {kind!r} "
            f"apiVersion {api_version!r}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise ReviewError("AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("AdmissionReview request has no uid")
    for field in ("object", "oldObject"):
        if request.get(field) is not None and not isinstance(request[field], dict):
            raise ReviewError(f"AdmissionReview request.{field} is not an object")
    return str(api_version), cast(AdmissionRequest, request)


def is_pod_resize(request: AdmissionRequest) -> bool:
    """The only requests this webhook acts on: UPDATE of pods/resize in the core group."""
    resource: object = request.get("resource")
    return (
        (type(resource) is dict or isinstance(resource, Mapping))
        and resource.get("group", "") == ""
        and resource.get("resource") == "pods"
        and request.get("subResource") == "resize"
        and request.get("operation") == "UPDATE"
    )


def clean_warnings(warnings: Sequence[str]) -> list[str]:
    """One line each, at most 120 characters, 4096 in all (the API server's limits)."""
    out: list[str] = []
    used = 0
    for w in warnings:
        line = clip(str(w), MAX_WARNING_CHARS)
        if not line or used + len(line) > MAX_WARNINGS_CHARS:
            continue
        out.append(line)
        used += len(line)
    return out


def clean_audit_annotations(annotations: Mapping[str, str]) -> dict[str, str]:
    """Only keys the API server accepts (no '/', a valid name of <= 63 characters)."""
    # Every answer carries the same few keys, with text values: checked in C when so.
    if annotations.keys() <= _VALID_AUDIT_KEYS and set(map(type, annotations.values())) <= {str}:
        return dict(annotations)
    return {k: str(v) for k, v in annotations.items() if _valid_audit_key(k)}


#: Keys :func:`_valid_audit_key` accepted (bounded: past it, no more are added).
_VALID_AUDIT_KEYS: set[str] = set()


def _valid_audit_key(key: str) -> bool:
    if key in _VALID_AUDIT_KEYS:
        return True
    if _AUDIT_KEY.fullmatch(key) is None:
        return False
    if len(_VALID_AUDIT_KEYS) < 256:
        _VALID_AUDIT_KEYS.add(key)
    return True


def response(
    api_version: str,
    uid: str,
    *,
    allowed: bool = True,
    code: int | None = None,
    message: str = "",
    reason: str = "",
    warnings: Sequence[str] = (),
    audit: Mapping[str, str] | None = None,
    patch: list[dict[str, Any]] | None = None,
) -> AdmissionReview:
    """An AdmissionReview answering request ``uid``; ``patch`` only for mutating answers."""
    resp: AdmissionResponse = {"uid": uid, "allowed": allowed}
    if not allowed:
        status: Status = {"code": code or 403, "message": message}
        if reason:
            status["reason"] = reason
        resp["status"] = status
    cleaned = clean_warnings(warnings)
    if cleaned:
        resp["warnings"] = cleaned
    annotations = clean_audit_annotations(audit or {})
    if annotations:
        resp["auditAnnotations"] = annotations
    if patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": resp}
