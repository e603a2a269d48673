"""The node agent's port to the records it shares with the service (docs/checkpoint.md):
a victim's checkpoint record :class:`~webhook.core.checkpoint.CheckpointRecord` and its
node's abilities :class:`~webhook.core.checkpoint.NodeCheckpointing`: ``PodCheckpoint``
and ``CheckpointNode`` objects of the service's namespace, kept by
:class:`webhook.kube.checkpoints.PodCheckpoints` for the service and the agents alike. An
agent writes only their status, only of its own node's (the chart's admission policy)."""

from __future__ import annotations

import re
from typing import Final, Protocol

from webhook.core.checkpoint import CheckpointRecord, NodeCheckpointing
from webhook.core.report import clip

#: The oldest CRIU containerd checkpoints with (``utils.PodCriuVersion``).
MIN_CRIU: Final = (3, 16)

#: The longest message a record or a capability carries.
MESSAGE_LIMIT: Final = 300


def one_line(text: str) -> str:
    """A message as one line of at most :data:`MESSAGE_LIMIT` characters."""
    return clip(text, MESSAGE_LIMIT)


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


class CheckpointStore(Protocol):
    """Where records and abilities live, as the agent of one node reads and writes them."""

    def records_on(self, node: str) -> list[CheckpointRecord]:
        """Every checkpoint record of ``node`` (no other node's), read now, each with its
        version."""
        ...

    def update(self, record: CheckpointRecord) -> bool:
        """Write ``record``'s status over the record as it was read (``record.version``);
        False when it changed or went since (the next pass reads it again). Its spec is
        the service's and stays as written."""
        ...

    def delete(self, name: str) -> None:
        """Delete record ``name``; gone already is fine."""
        ...

    def publish(self, ability: NodeCheckpointing, now: float) -> None:
        """Write ``ability`` as of ``now`` into the status of the node's ``CheckpointNode``
        (created, named after the node, when there is none)."""
        ...
