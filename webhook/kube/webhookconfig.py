"""Setting ``clientConfig.caBundle`` on the webhook's admission configurations.

Used by ``python -m webhook certs --patch-webhooks`` when certificates do not come from
cert-manager. Each configuration is read, then changed with one JSON patch that first
``test``s every webhook's name at its index, so a configuration edited in between is
never patched blindly (the read is retried instead).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import orjson
from kubernetes.client import AdmissionregistrationV1Api, ApiClient

from webhook.kube.client import make_api_client
from webhook.kube.errors import TRANSLATABLE, ClusterError, NotFound, translate

WebhookKind = Literal["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"]

DEFAULT_NAME: Final = "resize-preemption-webhook"
KINDS: Final[tuple[WebhookKind, ...]] = (
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
)
JSON_PATCH: Final = "application/json-patch+json"
_ATTEMPTS: Final = 3


@dataclass(frozen=True, slots=True)
class PatchOutcome:
    """What happened to one configuration: ``webhooks`` patched, or ``found`` False."""

    kind: WebhookKind
    name: str
    found: bool
    webhooks: tuple[str, ...] = ()

    def describe(self) -> str:
        if not self.found:
            return f"{self.kind} {self.name}: not found"
        return f"{self.kind} {self.name}: caBundle set on {', '.join(self.webhooks) or 'nothing'}"


def ca_bundle_patch_ops(
    configuration: dict[str, Any], ca_bundle: str, *, changed_only: bool = False
) -> list[dict[str, Any]]:
    """The JSON patch setting ``caBundle`` on every webhook of ``configuration`` (with
    ``changed_only``, on those whose ``caBundle`` differs).

    A ``test`` of each webhook's name guards its index against a concurrent edit.
    """
    ops: list[dict[str, Any]] = []
    webhooks = configuration.get("webhooks") or []
    for i, webhook in enumerate(webhooks):
        name = webhook.get("name") if isinstance(webhook, dict) else None
        if not isinstance(name, str):
            continue
        if changed_only and (webhook.get("clientConfig") or {}).get("caBundle") == ca_bundle:
            continue
        ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": name})
        ops.append(
            {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": ca_bundle}
        )
    return ops


def set_ca_bundle(
    api_client: ApiClient,
    ca_bundle: str,
    *,
    names: Sequence[str] = (DEFAULT_NAME,),
    kinds: Sequence[WebhookKind] = KINDS,
    changed_only: bool = False,
) -> list[PatchOutcome]:
    """Set ``caBundle`` on every webhook of each named configuration of each kind (with
    ``changed_only``, only where it differs: nothing is written when all are equal).

    A configuration that does not exist is reported (``found=False``), not an error: the
    mutating one is optional. Raises :class:`ClusterError` when the API refuses a request.
    """
    api = AdmissionregistrationV1Api(api_client)
    outcomes = []
    for kind in kinds:
        read, patch = _operations(api, kind)
        for name in names:
            outcomes.append(_patch_one(kind, name, ca_bundle, read, patch, changed_only))
    return outcomes


def patch_webhook_ca_bundles(
    ca_bundle: str,
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    names: Sequence[str] = (DEFAULT_NAME,),
) -> list[PatchOutcome]:
    """:func:`set_ca_bundle` through a client of its own, built from ``kubeconfig`` (or
    ``$KUBECONFIG``, ``~/.kube/config``, in-cluster), never the client's global default.

    Raises :class:`ClusterError` when no configuration of any kind has one of ``names``.
    """
    api_client = make_api_client(kubeconfig, context=context)
    try:
        outcomes = set_ca_bundle(api_client, ca_bundle, names=names)
    finally:
        api_client.close()  # type: ignore[no-untyped-call]
    missing = [n for n in names if not any(o.found for o in outcomes if o.name == n)]
    if missing:
        raise NotFound(
            f"no webhook configuration named {', '.join(missing)}: apply the manifests first",
            status=404,
        )
    return outcomes


Reader = Callable[[str], Any]
Patcher = Callable[[str, list[dict[str, Any]]], Any]


def _operations(api: AdmissionregistrationV1Api, kind: WebhookKind) -> tuple[Reader, Patcher]:
    if kind == "ValidatingWebhookConfiguration":

        def read(name: str) -> Any:
            return api.read_validating_webhook_configuration(name, _preload_content=False)

        def patch(name: str, ops: list[dict[str, Any]]) -> Any:
            return api.patch_validating_webhook_configuration(
                name, ops, _content_type=JSON_PATCH, _preload_content=False
            )

    else:

        def read(name: str) -> Any:
            return api.read_mutating_webhook_configuration(name, _preload_content=False)

        def patch(name: str, ops: list[dict[str, Any]]) -> Any:
            return api.patch_mutating_webhook_configuration(
                name, ops, _content_type=JSON_PATCH, _preload_content=False
            )

    return read, patch


def _patch_one(
    kind: WebhookKind,
    name: str,
    ca_bundle: str,
    read: Reader,
    patch: Patcher,
    changed_only: bool = False,
) -> PatchOutcome:
    last: ClusterError | None = None
    for _ in range(_ATTEMPTS):
        try:
            configuration = orjson.loads(read(name).data)
        except TRANSLATABLE as e:
            error = translate(e)
            if isinstance(error, NotFound):
                return PatchOutcome(kind, name, found=False)
            raise error from e
        ops = ca_bundle_patch_ops(configuration, ca_bundle, changed_only=changed_only)
        webhooks = tuple(op["value"] for op in ops if op["op"] == "test")
        if not ops:
            return PatchOutcome(kind, name, found=True)
        try:
            patch(name, ops)
        except TRANSLATABLE as e:
            error = translate(e)
            # A failed ``test`` (422: edited since read) or a conflict (409): read again.
            if error.status in (409, 422):
                last = error
                continue
            if isinstance(error, NotFound):
                return PatchOutcome(kind, name, found=False)
            raise error from e
        return PatchOutcome(kind, name, found=True, webhooks=webhooks)
    raise ClusterError(f"could not set the caBundle of {kind} {name}: {last}")


__all__ = [
    "DEFAULT_NAME",
    "KINDS",
    "PatchOutcome",
    "ca_bundle_patch_ops",
    "patch_webhook_ca_bundles",
    "set_ca_bundle",
]
