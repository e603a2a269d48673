"""Errors from the Kubernetes API, as one small hierarchy the rest of the service can catch.

The official client raises ``kubernetes.client.ApiException`` for HTTP errors and lets
urllib3 and socket errors through for transport failures. :func:`translate` turns all of
them into a :class:`ClusterError`, so callers outside this package never import the client::

    WebhookError                   (webhook.core.errors)
    └── ClusterError               the API server failed us; ``status``, ``reason``, ``body``
        ├── NotFound               404: the object is not there (deleting it: success)
        ├── Conflict               409: stale resourceVersion, or AlreadyExists on create
        ├── Expired                410: resourceVersion or continue token too old: relist
        ├── TooManyRequests        429: API priority and fairness, or an Eviction a PDB
        │                          blocks; ``retry_after`` seconds when the server said
        ├── Forbidden              401/403: RBAC or authentication; retrying will not help
        └── Unavailable            5xx, timeouts, refused or reset connections, TLS errors:
                                   transient, retry with backoff

Any other status (400, 422, ...) is a plain :class:`ClusterError`: the request was wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import orjson
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from webhook.core.errors import WebhookError

#: Exceptions :func:`translate` understands; ``except TRANSLATABLE as e: raise translate(e)``.
TRANSLATABLE: Final = (ApiException, urllib3.exceptions.HTTPError, OSError)

_EMPTY: Mapping[str, Any] = {}


class ClusterError(WebhookError):
    """The Kubernetes API server refused a request or could not be reached.

    ``status`` is the HTTP status (``None`` for transport errors), ``reason`` the
    ``Status.reason`` the server gave (``"AlreadyExists"``, ``"Expired"``, ...) or ``""``,
    ``body`` the decoded ``Status`` object (empty when there was none).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        reason: str = "",
        body: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.reason = reason
        self.body: Mapping[str, Any] = body if body is not None else _EMPTY

    @property
    def causes(self) -> tuple[Mapping[str, Any], ...]:
        """``Status.details.causes`` (e.g. an Eviction's ``DisruptionBudget`` cause)."""
        details = self.body.get("details")
        causes = details.get("causes") if isinstance(details, Mapping) else None
        if not isinstance(causes, list):
            return ()
        return tuple(c for c in causes if isinstance(c, Mapping))


class NotFound(ClusterError):
    """HTTP 404."""


class Conflict(ClusterError):
    """HTTP 409: a write carried a stale resourceVersion, or a create found the name taken."""


class Expired(ClusterError):
    """HTTP 410 Gone: the resourceVersion or continue token is too old. Relist."""


class TooManyRequests(ClusterError):
    """HTTP 429. ``retry_after`` is the server's hint in seconds, ``None`` if it gave none.

    The Eviction API also answers 429 when a PodDisruptionBudget forbids the eviction; the
    Status then carries a cause of type ``DisruptionBudget`` (see :attr:`blocked_by_budget`).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = 429,
        reason: str = "",
        body: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, status=status, reason=reason, body=body)
        self.retry_after = retry_after

    @property
    def blocked_by_budget(self) -> bool:
        return any(c.get("reason") == "DisruptionBudget" for c in self.causes) or (
            "disruption budget" in self.message.lower()
        )


class Forbidden(ClusterError):
    """HTTP 401 or 403: our credentials or RBAC do not allow the request."""


class Unavailable(ClusterError):
    """The API server is unreachable or failing (5xx, timeout, connection or TLS error)."""


def _status_body(raw: object) -> Mapping[str, Any]:
    if isinstance(raw, str | bytes | bytearray) and raw:
        try:
            decoded = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return _EMPTY
        if isinstance(decoded, Mapping):
            return decoded
    return _EMPTY


def _retry_after(headers: object, body: Mapping[str, Any]) -> float | None:
    value: object = None
    if headers is not None and hasattr(headers, "get"):
        value = headers.get("Retry-After")
    if value is None:
        details = body.get("details")
        if isinstance(details, Mapping):
            value = details.get("retryAfterSeconds")
    if value is None:
        return None
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        # An HTTP-date Retry-After: the API server never sends one; treat as "no hint".
        return None
    return seconds if seconds >= 0 else None


def from_api_exception(exc: ApiException) -> ClusterError:
    """One :class:`ClusterError` for an ``ApiException``, chosen by HTTP status."""
    status = exc.status if isinstance(exc.status, int) else None
    body = _status_body(exc.body)
    reason = str(body.get("reason") or "")
    message = str(body.get("message") or exc.reason or f"HTTP {status}")
    if status is None or status == 0:
        # The client reports TLS failures as ApiException(status=0).
        return Unavailable(f"API server unreachable: {message}", reason=reason, body=body)
    message = f"HTTP {status}: {message}"
    kwargs: dict[str, Any] = {"status": status, "reason": reason, "body": body}
    if status == 404:
        return NotFound(message, **kwargs)
    if status == 409:
        return Conflict(message, **kwargs)
    if status == 410:
        return Expired(message, **kwargs)
    if status == 429:
        return TooManyRequests(message, retry_after=_retry_after(exc.headers, body), **kwargs)
    if status in (401, 403):
        return Forbidden(message, **kwargs)
    if status >= 500:
        return Unavailable(message, **kwargs)
    return ClusterError(message, **kwargs)


def translate(exc: BaseException) -> ClusterError:
    """The :class:`ClusterError` for any failure of a call to the API server.

    ``ApiException`` maps by status (see the module docstring); urllib3 errors, socket
    timeouts and ``OSError`` (refused, reset, DNS) become :class:`Unavailable`. A
    ``ClusterError`` is returned as is. Anything else becomes a plain ``ClusterError`` whose
    message names the exception type, so an unexpected failure is still caught by callers
    that fail open - use ``raise translate(e) from e`` to keep the original traceback.
    """
    if isinstance(exc, ClusterError):
        return exc
    if isinstance(exc, ApiException):
        return from_api_exception(exc)
    if isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError):
        return Unavailable(f"API server timed out: {exc}")
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return Unavailable(f"API server unreachable: {type(exc).__name__}: {exc}")
    return ClusterError(f"API call failed: {type(exc).__name__}: {exc}")


__all__ = [
    "TRANSLATABLE",
    "ClusterError",
    "Conflict",
    "Expired",
    "Forbidden",
    "NotFound",
    "TooManyRequests",
    "Unavailable",
    "from_api_exception",
    "translate",
]
