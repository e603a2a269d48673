"""Reservations: room promised to resizes already admitted but not yet actuated.

Between the webhook's answer and the kubelet actuating the resize, the node's pods do not
yet show the new size. Without a reservation, two resizes admitted a millisecond apart
would both see the same free room. A reservation holds the resizing pod's full new
requests (not a delta, so it never double counts once the kubelet catches up) and names
the victims the plan claimed, whose capacity is therefore already spoken for.

A reservation ends in one of two ways. It expires (``expires_at``), or it is *spent*: the
cluster itself shows that it holds nothing any more (:func:`spent`). Both are read, never
written: nobody has to remove a reservation from the ledger for it to stop counting, so
a resize that went as planned costs one ledger write, the one that admitted it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from webhook.core.model import Pod
from webhook.core.resources import Resources


@dataclass(frozen=True, slots=True)
class Reservation:
    """Room on ``node`` held for pod ``pod_uid`` until ``expires_at`` (epoch seconds).

    ``desired``: the container requests admitted, by container name. ``generation``: the
    pod's ``metadata.generation`` with the resize in its spec (the API server bumps it on
    every spec change, before validating admission sees the object); 0 when unknown.
    ``persist_by``: when a resize still not in the pod's spec is taken as refused by a
    later admission step (0: no deadline).
    """

    pod_uid: str
    pod: str  # "namespace/name", for messages
    node: str
    resources: Resources
    victims: frozenset[str] = frozenset()  # victim pod uids claimed by the plan
    expires_at: float = 0.0
    desired: tuple[tuple[str, Resources], ...] = ()
    generation: int = 0
    persist_by: float = 0.0

    def active(self, now: float) -> bool:
        return now < self.expires_at


def actuated(desired: Iterable[tuple[str, Resources]], pod: Pod) -> bool:
    """True when the kubelet allocated at least ``desired`` to every container named.

    ``allocatedResources`` is read, or ``resources`` (what the runtime applied) where the
    kubelet does not report allocations. Init containers that are not sidecars ran to
    completion and are not resized; they are skipped. Nothing desired: not actuated (an
    entry that does not say what it admitted keeps counting until it expires).
    """
    wanted_any = False
    for name, wanted in desired:
        wanted_any = True
        container = pod.container(name)
        if container is None:
            return False
        if container in pod.init_containers and not container.sidecar:
            continue
        status = pod.statuses.get(name)
        if status is None:
            return False
        granted = status.allocated if status.allocated is not None else status.actual
        if granted is None or not wanted.fits_in(granted):
            return False
    return wanted_any


def in_spec(reservation: Reservation, pod: Pod) -> bool:
    """True when ``pod``'s spec carries exactly the container requests reserved for."""
    declared = {c.name: c.requests for c in pod.all_containers()}
    return declared == dict(reservation.desired)


def spent(reservation: Reservation, pod: Pod | None, now: float) -> bool:
    """Whether the cluster shows that ``reservation`` holds nothing any more.

    ``pod`` is the cached pod with the reservation's uid, ``None`` when the cache does not
    have it: a pod not seen yet keeps its reservation (the cache may lag the admission),
    and one that is gone is the preemption worker's to release. Spent when the pod

    * is terminating or finished (it will never use the room);
    * has another spec than the resize and a later ``generation`` than the reserved one (a
      newer resize or edit superseded it, and has its own reservation if it needs room);
    * still lacks the resize in its spec at ``persist_by`` (a later webhook or the API
      server refused it);
    * was marked Infeasible by the kubelet for this spec;
    * has it actuated: the kubelet allocated the demand, so the pod itself now holds the
      room and the kubelet's own accounting counts it.

    The answer is stable: once spent, a later resize of the pod to other requests raises
    its generation past the reserved one (or comes after ``persist_by``), so the
    reservation does not count again.
    """
    if pod is None or pod.uid != reservation.pod_uid:
        return False
    if pod.terminating or pod.terminal:
        return True
    if not in_spec(reservation, pod):
        # Not persisted yet, refused, or superseded: the generation tells the last apart
        # at once (the spec alone cannot: before persisting it differs too).
        if reservation.generation and pod.generation > reservation.generation:
            return True
        return bool(reservation.persist_by) and now >= reservation.persist_by
    return pod.resize == "infeasible" or actuated(reservation.desired, pod)


def active_on(
    reservations: Iterable[Reservation], node: str, now: float, *, exclude_pod: str = ""
) -> dict[str, Reservation]:
    """Active reservations on ``node`` by pod uid, leaving out ``exclude_pod``'s own.

    Spent reservations must be left out by the caller (:func:`spent` needs the cached
    pods, which the ledger's readers have); expired ones are left out here.

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
            )
        by_pod[r.pod_uid] = r
    return by_pod
