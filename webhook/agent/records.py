"""The ConfigMaps the service and the node agent share (docs/checkpoint.md): a node's
capability ``rpw-node-<node>`` and a victim's checkpoint record ``rpw-checkpoint-<uid>``,
their names, labels and data, and the store they are kept in (:class:`CheckpointStore`,
implemented over the API server in :mod:`webhook.kube.checkpoint_store`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, Protocol

from webhook.core.checkpoint import (
    CAPABILITY_LABEL,
    CAPABILITY_PREFIX,
    CHECKPOINT_LABEL,
    IMAGE_REPOSITORY,
    MANAGED_BY,
    NODE_LABEL,
    PHASE_LABEL,
    RECORD_PREFIX,
    rfc3339,
)
from webhook.core.report import clip

#: The oldest CRIU containerd checkpoints with (``utils.PodCriuVersion``).
MIN_CRIU: Final = (3, 16)


def parse_rfc3339(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


#: The longest message a record or a capability carries.
MESSAGE_LIMIT: Final = 300


def one_line(text: str) -> str:
    """A message as one line of at most :data:`MESSAGE_LIMIT` characters."""
    return clip(text, MESSAGE_LIMIT)


def capability_name(node: str) -> str:
    return CAPABILITY_PREFIX + node


def capability_labels(node: str) -> dict[str, str]:
    return {**MANAGED_BY, CAPABILITY_LABEL: "true", NODE_LABEL: node}


def record_labels(node: str, phase: str) -> dict[str, str]:
    return {**MANAGED_BY, CHECKPOINT_LABEL: "true", NODE_LABEL: node, PHASE_LABEL: phase}


#: ``host[:port]/path``: a registry host (a name with a dot or a port, or ``localhost``)
#: and at least one path component, as image references spell them, all lower case: the
#: agent writes references in lower case, and the chart's admission policy compares them
#: with this prefix as given.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"(?:[a-z0-9-]+(?:\.[a-z0-9-]+)+|localhost|\[[0-9a-f:]+\])(?::[0-9]{1,5})?"
_HOST_ONLY = r"[a-z0-9-]+:[0-9]{1,5}"
REPOSITORY_PATTERN: Final = rf"^(?:{_HOST}|{_HOST_ONLY})(?:/{_COMPONENT})+$"
_REPOSITORY = re.compile(REPOSITORY_PATTERN)


def valid_repository(value: str) -> bool:
    """Whether ``value`` is a registry repository prefix (``host[:port]/path``)."""
    return bool(_REPOSITORY.match(value))


def split_repository(prefix: str) -> tuple[str, str]:
    """``registry.example:5000/rpw-checkpoints`` -> (host, path)."""
    host, _, path = prefix.partition("/")
    return host, path


def image_reference(namespace: str, pod: str, container: str, uid: str) -> str:
    """``localhost/resize-preemption-checkpoint/<ns>/<pod>/<container>:<first 12 of uid>``."""
    return f"{IMAGE_REPOSITORY}/{namespace}/{pod}/{container}:{uid[:12]}".lower()


@dataclass(frozen=True)
class Capability:
    """What a node can do, as ``rpw-node-<node>`` says it."""

    checkpoint: bool
    restore: bool
    criu: str
    runtime: str
    message: str

    def data(self, now: float) -> dict[str, str]:
        return {
            "checkpoint": str(self.checkpoint).lower(),
            "restore": str(self.restore).lower(),
            "criu": self.criu,
            "runtime": self.runtime,
            "message": one_line(self.message),
            "updatedAt": rfc3339(now),
        }


@dataclass(frozen=True)
class Record:
    """One checkpoint record as read: its ConfigMap's name and data."""

    name: str
    data: Mapping[str, str] = field(default_factory=dict)
    #: The ConfigMap's resourceVersion: an update of a record changed since fails
    #: (:class:`StaleRecord`) instead of overwriting the service's write.
    version: str = ""

    @property
    def phase(self) -> str:
        return self.data.get("phase", "")

    def _json(self, key: str) -> Any:
        try:
            return json.loads(self.data.get(key) or "{}")
        except ValueError:
            return {}

    @property
    def archives(self) -> dict[str, str]:
        value = self._json("archives")
        return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}

    @property
    def images(self) -> dict[str, str]:
        value = self._json("images")
        return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}

    @property
    def sizes(self) -> dict[str, int]:
        value = self._json("sizes")
        if not isinstance(value, dict):
            return {}
        return {str(k): int(v) for k, v in value.items() if isinstance(v, int)}

    @property
    def pod(self) -> dict[str, Any]:
        value = self._json("pod")
        return value if isinstance(value, dict) else {}

    def pod_identity(self) -> tuple[str, str, str]:
        """(namespace, name, uid) of the checkpointed pod; the uid from the record's name
        when the pod JSON lacks it."""
        meta = self.pod.get("metadata") or {}
        uid = str(meta.get("uid") or self.name.removeprefix(RECORD_PREFIX))
        return str(meta.get("namespace") or ""), str(meta.get("name") or ""), uid

    @property
    def checkpointed_at(self) -> float:
        return parse_rfc3339(self.data.get("checkpointedAt", "")) or 0.0


class StaleRecord(Exception):
    """The record changed (or went) since it was read; the next pass reads it again."""


class CheckpointStore(Protocol):
    """Where records and capabilities live (ConfigMaps in the service's namespace)."""

    def records(self, node: str) -> list[Record]:
        """Every checkpoint record of ``node``."""
        ...

    def update(self, record: Record, data: Mapping[str, str], node: str) -> None:
        """Merge ``data`` into ``record`` as read (its phase label follows
        ``data["phase"]``); :class:`StaleRecord` when it changed since."""
        ...

    def delete(self, name: str) -> None:
        """Delete record ``name``; gone already is fine."""
        ...

    def publish(self, node: str, data: Mapping[str, str]) -> None:
        """Create or replace ``rpw-node-<node>`` with ``data``."""
        ...
