"""Reservations: room promised to resizes already admitted but not yet actuated.

Between the webhook's answer and the kubelet actuating the resize, the node's pods do not
yet show the new size. Without a reservation, two resizes admitted a millisecond apart
would both see the same free room. A reservation holds the resizing pod's full new
requests (not a delta, so it never double counts once the kubelet catches up) and names
the victims the plan claimed, whose capacity is therefore already spoken for.

A reservation holds room until it expires (``expires_at``) or the cluster shows that it
holds nothing any more; the admitted resize's lifecycle judges the latter
(``webhook.engine.lifecycle``), and only reservations still holding room reach a plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from webhook.core.resources import Resources


@dataclass(frozen=True, slots=True)
class Reservation:
    """Room on ``node`` held for pod ``pod_uid`` until ``expires_at`` (epoch seconds)."""

    pod_uid: str
    pod: str  # "namespace/name", for messages
    node: str
    resources: Resources
    victims: frozenset[str] = frozenset()  # victim pod uids claimed by the plan
    expires_at: float = 0.0
    #: Room on other nodes promised to the replacements of movable victims: (node, what
    #: the replacement asks for), so that no other plan counts on it too.
    moves: tuple[tuple[str, Resources], ...] = ()

    def active(self, now: float) -> bool:
        return now < self.expires_at


def _move_order(move: tuple[str, Resources]) -> tuple[str, int, int]:
    """Promises in a total order (amounts have none): by node, then amount."""
    node, needs = move
    return (node, needs.cpu, needs.memory)


def active_on(
    reservations: Iterable[Reservation], node: str, now: float, *, exclude_pod: str = ""
) -> dict[str, Reservation]:
    """Active reservations on ``node`` by pod uid, leaving out ``exclude_pod``'s own.

    Reservations that hold nothing any more must be left out by the caller (that needs the
    cached pods, which the ledger's readers have); expired ones are left out here.

    Several active reservations of one pod (a later resize admitted before the earlier
    one's entry went) merge into one holding the most room and every claimed victim, so
    the result does not depend on the order they come in.
    """
    by_pod: dict[str, Reservation] = {}
    for r in reservations:
        if r.node != node or r.pod_uid == exclude_pod or not r.active(now):
            continue
        seen = by_pod.get(r.pod_uid)
        if seen is not None:
            r = Reservation(
                pod_uid=r.pod_uid,
                pod=min(seen.pod, r.pod),
                node=node,
                resources=seen.resources.max(r.resources),
                victims=seen.victims | r.victims,
                expires_at=max(seen.expires_at, r.expires_at),
                moves=tuple(sorted(set(seen.moves) | set(r.moves), key=_move_order)),
            )
        by_pod[r.pod_uid] = r
    return by_pod
