"""Literal environment values of a checkpointed pod, kept where only the service reads them.

A checkpoint record holds the pod as it was taken, and a node agent must read its node's
records (their archives and the pod's uid). RBAC grants reads of an object whole, never
of some of its fields, so every agent and every holder of the viewer Role could read a
record's pod spec, literal ``env`` values included (a password set as a value, not a
Secret reference). So a record holds them sealed: each value encrypted with AES-GCM under
the checkpoint key, which the chart hands the service's pods alone (a Secret read by the
kubelet into the environment variable :data:`KEY_VARIABLE`; no account is granted it), and
bound to the record, the pod's namespace and name, the container and the variable, so that
a sealed value moved elsewhere does not open. ``kubectl apply``'s
``kubectl.kubernetes.io/last-applied-configuration`` annotation is a copy of the whole
manifest, those values included: it is sealed the same way. The pod creator opens them
again just before the restored pod is created. ``valueFrom`` references stay as they
are: they hold no value.

A service given no key (a process run outside the chart) makes one at its start: what it
sealed only that process can open, and a restore after it is gone says why it fails.
"""

from __future__ import annotations

import base64
import binascii
import copy
import functools
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any, Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from webhook.core.checkpoint import RESTORED_FROM_ANNOTATION, record_name

log = logging.getLogger(__name__)

#: The service's environment variable holding the key: 32 bytes, base64.
KEY_VARIABLE: Final = "RESIZE_PREEMPTION_CHECKPOINT_KEY"
#: Annotations holding a copy of the pod's manifest, its literal values with it.
COPIES: Final = ("kubectl.kubernetes.io/last-applied-configuration",)
#: A sealed value starts so; a value that does not is left as it is.
PREFIX: Final = "rpw-sealed:v1:"
_NONCE: Final = 12


class SealError(ValueError):
    """A sealed value that this key does not open; the message says which."""


class EnvSealer:
    """Seals and opens the literal ``env`` values of a pod's containers."""

    def __init__(self, key: bytes, random: Callable[[int], bytes] = os.urandom) -> None:
        self._aead = AESGCM(key)
        self._random = random

    def seal(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        """``pod`` as read, each literal ``env`` value sealed for its checkpoint record."""
        meta = pod.get("metadata") or {}
        where = _where(record_name(str(meta.get("uid") or "")), meta)
        return _each_value(pod, lambda c, n, v: self._seal(f"{where}/{c}/{n}", v))

    def open(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """The restored pod ``manifest`` with its values opened; raises ``SealError``."""
        meta = manifest.get("metadata") or {}
        record = str((meta.get("annotations") or {}).get(RESTORED_FROM_ANNOTATION) or "")
        where = _where(record, meta)
        return _each_value(manifest, lambda c, n, v: self._open(where, c, n, v))

    def _seal(self, bound: str, value: str) -> str:
        nonce = self._random(_NONCE)
        sealed = self._aead.encrypt(nonce, value.encode(), bound.encode())
        return PREFIX + base64.b64encode(nonce + sealed).decode()

    def _open(self, where: str, container: str, name: str, value: str) -> str:
        if not value.startswith(PREFIX):
            return value
        try:
            raw = base64.b64decode(value.removeprefix(PREFIX), validate=True)
            bound = f"{where}/{container}/{name}".encode()
            return self._aead.decrypt(raw[:_NONCE], raw[_NONCE:], bound).decode()
        except (binascii.Error, InvalidTag, UnicodeDecodeError, ValueError):
            place = f"in container {container}" if container else "of the annotation"
            raise SealError(
                f"the value of {name} {place} does not open with this service's "
                "checkpoint key (sealed by another key, or for another pod)"
            ) from None


def _where(record: str, meta: Mapping[str, Any]) -> str:
    return f"{record}/{meta.get('namespace', '')}/{meta.get('name', '')}"


def _each_value(pod: Mapping[str, Any], change: Callable[[str, str, str], str]) -> dict[str, Any]:
    """A copy of ``pod`` with ``change(container, variable, value)`` of each literal
    value of its containers' ``env`` (``change("", annotation, value)`` of the
    annotations that copy the manifest)."""
    out = copy.deepcopy(dict(pod))
    annotations = (out.get("metadata") or {}).get("annotations") or {}
    for key in COPIES:
        if isinstance(annotations.get(key), str) and annotations[key]:
            annotations[key] = change("", key, annotations[key])
    spec = out.get("spec") or {}
    for kind in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(kind) or ():
            for var in container.get("env") or ():
                if isinstance(var, dict) and isinstance(var.get("value"), str) and var["value"]:
                    var["value"] = change(
                        str(container.get("name")), str(var["name"]), var["value"]
                    )
    return out


@functools.cache
def process_sealer() -> EnvSealer:
    """The one sealer of this process: the checkpointer seals with it and the pod creator
    opens with it, even when its key was made at the start."""
    return load_sealer(os.environ)


def load_sealer(env: Mapping[str, str]) -> EnvSealer:
    """The sealer of the key in ``env``'s :data:`KEY_VARIABLE`, else of a key made now
    (logged: records sealed with it open only in this process)."""
    text = env.get(KEY_VARIABLE, "")
    if text:
        try:
            key = base64.b64decode(text, validate=True)
        except binascii.Error:
            key = b""
        if len(key) == 32:
            return EnvSealer(key)
        log.warning("%s is not 32 bytes in base64: a key made now is used instead", KEY_VARIABLE)
    else:
        log.warning(
            "no checkpoint key (%s): literal environment values of checkpointed pods are "
            "sealed with a key made now, which only this process can open",
            KEY_VARIABLE,
        )
    return EnvSealer(AESGCM.generate_key(bit_length=256))
