"""Where the Kubernetes client configuration of a command comes from, checked before
anything starts: a kubeconfig named but missing, not text or not YAML is one line of
:class:`~webhook.core.errors.InputError`, not a traceback of the client's loader later.

Imports nothing of the ``kubernetes`` package: ``serve`` checks in the gunicorn master,
which must not import the client before its workers make the standard library
cooperative (webhook.web.worker).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import yaml

from webhook.core.errors import InputError

#: Where a pod's service-account token is mounted, as the client's in-cluster loader
#: reads it (kubernetes.config.incluster_config.SERVICE_TOKEN_FILENAME).
SERVICE_TOKEN_FILE: Final = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SERVICE_HOST_ENV: Final = "KUBERNETES_SERVICE_HOST"


class NoClientConfiguration(InputError):
    """Neither a kubeconfig nor a pod's service account to talk to the cluster with."""


def in_cluster(environ: Mapping[str, str] | None = None) -> bool:
    """True inside a pod with a mounted service-account token."""
    env = os.environ if environ is None else environ
    return bool(env.get(SERVICE_HOST_ENV)) and Path(SERVICE_TOKEN_FILE).is_file()


def default_kubeconfig(environ: Mapping[str, str] | None = None) -> str:
    """``$KUBECONFIG`` (files joined by ``os.pathsep``, as the client merges them), else
    ``~/.kube/config``."""
    env = os.environ if environ is None else environ
    return env.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def check_kubeconfig(path: str, *, context: str | None = None, whole: bool = True) -> None:
    """Raises :class:`InputError` (one line) unless ``path`` is a readable YAML mapping
    and, when it is the ``whole`` configuration (not one of several merged), names a
    context it defines (``context``, else its ``current-context``)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read kubeconfig {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InputError(f"kubeconfig {path} is not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"kubeconfig {path} is not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise InputError(f"kubeconfig {path} is not a kubeconfig (no mapping of clusters)")
    if whole:
        _check_context(path, data, context)


def _check_context(path: str, data: dict[str, object], context: str | None) -> None:
    chosen = context or data.get("current-context")
    if not chosen:
        raise InputError(f"kubeconfig {path} names no current-context")
    contexts = data.get("contexts")
    names = (
        [c.get("name") for c in contexts if isinstance(c, dict)]
        if isinstance(contexts, list)
        else []
    )
    if chosen not in names:
        raise InputError(f"kubeconfig {path} has no context {chosen!r}")


def client_source(
    kubeconfig: str | None,
    environ: Mapping[str, str] | None = None,
    *,
    context: str | None = None,
) -> str:
    """What the client will be configured from, as :func:`webhook.kube.client.
    make_configuration` chooses: ``kubeconfig`` if given, else in-cluster inside a pod,
    else the default kubeconfig; checked. Raises :class:`NoClientConfiguration` when
    none is given nor found, :class:`InputError` when the kubeconfig does not read."""
    if kubeconfig is None and in_cluster(environ):
        return "in-cluster"
    if kubeconfig is not None:
        check_kubeconfig(kubeconfig, context=context)
        return kubeconfig
    listed = default_kubeconfig(environ)
    found = [p for p in listed.split(os.pathsep) if p and Path(p).exists()]
    if not found:
        raise NoClientConfiguration(
            f"no Kubernetes client configuration: not in a pod, and no kubeconfig at "
            f"{listed} (give --kubeconfig FILE or set KUBECONFIG)"
        )
    for path in found:
        check_kubeconfig(path, context=context, whole=len(found) == 1)
    return listed
