"""The node agent's port to the records it shares with the service (docs/checkpoint.md):
a victim's checkpoint record :class:`~webhook.core.checkpoint.CheckpointRecord` and its
node's abilities :class:`~webhook.core.checkpoint.NodeCheckpointing`, both ConfigMaps of
the service's namespace, kept by :class:`webhook.kube.checkpoints.ConfigMapCheckpoints`
for the service and the agents alike."""

from __future__ import annotations

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


class CheckpointStore(Protocol):
    """Where records and abilities live, as the agent of one node reads and writes them."""

    def records_on(self, node: str) -> list[CheckpointRecord]:
        """Every checkpoint record of ``node``, read now, each with its version."""
        ...

    def update(self, record: CheckpointRecord) -> bool:
        """Write ``record`` over the record as it was read (``record.version``); False
        when it changed or went since (the next pass reads it again)."""
        ...

    def delete(self, name: str) -> None:
        """Delete record ``name``; gone already is fine."""
        ...

    def publish(self, ability: NodeCheckpointing, now: float) -> None:
        """Create or replace ``rpw-node-<node>`` with ``ability`` as of ``now``."""
        ...
