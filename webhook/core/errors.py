"""The project's error hierarchy.

Every error the webhook raises on purpose derives from :class:`WebhookError`, so callers
can tell "we refused this input / the cluster refused us" from a programming error::

    WebhookError
    ├── InputError            the input is malformed; the message names the value and where
    │   ├── QuantityError     a resource quantity that does not parse
    │   ├── ObjectError       a Kubernetes object missing a field or of the wrong shape
    │   └── ResizeError       a resize patch that names unknown containers or bad fields
    ├── LookupFailed          a pod, node or container the request names does not exist
    └── ClusterError          defined in ``webhook.kube.errors``: the API server failed us

Input errors become HTTP 400 / exit code 2 with their message; a ``ClusterError`` never
blocks a resize (the admission path fails open).
"""

from __future__ import annotations


class WebhookError(Exception):
    """Base of every error this project raises deliberately."""


class InputError(WebhookError, ValueError):
    """The input cannot be used as given; ``str(error)`` is one readable line."""


class QuantityError(InputError):
    """A Kubernetes resource quantity that does not parse or is out of range."""


class ObjectError(InputError):
    """A Kubernetes object that lacks a required field or has one of the wrong type."""


class ResizeError(InputError):
    """A resize patch that cannot be applied to the pod it names."""


class LookupFailed(WebhookError, LookupError):
    """Something the request names (pod, node, container) is not there."""
