"""What the engine needs from the cluster, as ports: the reservation ledger it writes
(entries, their wire form, and the port that stores them), the cluster view it reads and
the victims' evictor and events.

One ledger entry per admitted resize. It holds the room reserved for the resize (so
concurrent admissions, on any replica, see it) and the plan the preemption worker must
carry out (so a crash between admission and eviction loses nothing). Entries are grouped
per node; a store updates one node's group atomically with optimistic concurrency.

``webhook.kube`` implements the ports against the API server: ``LeaseLedger`` is a
:class:`Ledger` on one Lease per node, ``ClusterCache`` a :class:`ClusterView` from
list+watch, ``Evictor`` a :class:`VictimEvictor`, ``EventRecorder`` the
:class:`PreemptionEvents` (the lenders' port is with the rest of lending,
:class:`webhook.engine.loans.LenderResizer`). ``harness.doubles`` has a
:class:`ClusterView` over a fixed set of objects and a :class:`Ledger` in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol, TypeVar

import orjson

from webhook.core.accounting import Reservation
from webhook.core.errors import ObjectError, WebhookError
from webhook.core.lending import Loan
from webhook.core.model import DisruptionBudget, Node, Pod, PodRef
from webhook.core.objects import PriorityResolver
from webhook.core.plan import Plan
from webhook.core.resources import Resources
from webhook.engine.rooms import NodeRooms

R = TypeVar("R")

#: Bump when the JSON form changes incompatibly; readers skip entries they do not know.
ENTRY_VERSION = 1
#: Bytes of one node's encoded entries a store takes at most. A Lease's annotations may
#: hold 256 KiB in all (the API server's ``TotalAnnotationSizeLimitB``); this leaves room
#: for the other annotations and keys. Both stores apply it, so both refuse alike.
MAX_NODE_BYTES = 240 * 1024
#: Entries one node's ledger holds at most: one per resize in flight on the node, which
#: runs at most a few hundred pods (the kubelet's default is 110). Past it a write is
#: refused like one past :data:`MAX_NODE_BYTES`, and a read keeps the first this many.
MAX_NODE_ENTRIES = 256
#: Seconds an entry's ``admitted_at`` may lie ahead of a reader's clock: replicas' clocks
#: differ by this much at most (NTP keeps them within a second; a clock 30 s off is a
#: broken node). An entry admitted further in the future is refused: it holds no room.
MAX_CLOCK_SKEW = 60.0
#: Seconds between an entry's ``admitted_at`` and when a reader first sees it that are
#: taken as no clock offset: watch delay and the drift NTP leaves. Above it, the reader
#: moves the entry onto its own clock (:func:`on_local_clock`).
CLOCK_TOLERANCE = 5.0


class LedgerFull(WebhookError):
    """A node's entries, as a change would write them, are more than one store object
    holds (:data:`MAX_NODE_BYTES`); nothing was written. The admission path fails open
    with this message; the worker and the reconciler try again on a later pass."""


def check_size(node: str, encoded: str, count: int = 0) -> str:
    """``encoded`` (one node's ``count`` entries, :func:`encode_entries`) if a store may
    write it; raises :class:`LedgerFull` otherwise."""
    if count > MAX_NODE_ENTRIES:
        raise LedgerFull(
            f"ledger of node {node} full: {count} entries, more than the "
            f"{MAX_NODE_ENTRIES} one node's ledger holds"
        )
    size = len(encoded.encode())
    if size > MAX_NODE_BYTES:
        raise LedgerFull(
            f"ledger of node {node} full: its entries would take {size} bytes, "
            f"more than the {MAX_NODE_BYTES} one Lease holds"
        )
    return encoded


def desired_requests(pod: Pod) -> tuple[tuple[str, Resources], ...]:
    """The container requests ``pod``'s spec declares, by container name: what a resize
    sets, and what an entry admits (compare them as mappings: a decoded entry keeps its
    containers in name order)."""
    return tuple((c.name, c.requests) for c in pod.all_containers())


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """An admitted resize.

    ``desired`` are the container requests the webhook admitted (by container name), so
    the worker can tell when the resize is persisted in the pod's spec. ``victims`` are in
    eviction order, with uids: the worker never evicts a later pod of the same name.
    ``handled``: victim uids known to be on their way out although the cluster may not
    show it yet; the worker adds its own evictions in memory, and nothing writes them
    (a victim evicted is terminating or gone in the cluster, which is read instead).
    ``generation``: the pod's ``metadata.generation`` with the resize in its spec (the
    API server bumps it on every spec change, before validating admission sees the
    object); 0 when unknown. ``persist_by``: when a resize still not in the pod's spec is
    taken as refused by a later admission step (0: no deadline). Where the entry stands
    is read, never written: :func:`webhook.engine.lifecycle.states.entry_phase`.
    ``loans``: the plan's loans in the order taken. Whether one is carried out is read
    from the cluster (the lender's spec at or below the loan's ``after``), never written,
    so a restart neither repeats a loan nor forgets one. ``refused``: loans the kubelet
    refused, taken out of ``loans`` (never made again for this entry, never given back):
    each is put back and the plan made again without its lender
    (:mod:`webhook.engine.lifecycle`).

    ``shift`` (never written): seconds to add to the entry's times, which its writer's
    clock set, to read them on this process's clock (:func:`on_local_clock`). Every
    deadline is read through :attr:`deadline` and :attr:`persist_deadline`.
    """

    pod: PodRef
    node: str
    review_uid: str
    resources: Resources
    desired: tuple[tuple[str, Resources], ...]
    victims: tuple[PodRef, ...]
    admitted_at: float
    expires_at: float
    handled: frozenset[str] = frozenset()
    #: The resize was in the pod's spec when the entry was written (the reconciler's).
    persisted: bool = False
    generation: int = 0
    persist_by: float = 0.0
    loans: tuple[Loan, ...] = ()
    refused: tuple[Loan, ...] = ()
    #: Room on other nodes the plan's movable victims' replacements count on (victim
    #: order movable-first): promised to them until the entry expires.
    moves: tuple[tuple[str, Resources], ...] = ()
    shift: float = field(default=0.0, compare=False)

    @property
    def deadline(self) -> float:
        """When the entry stops holding room, on this process's clock."""
        return self.expires_at + self.shift

    @property
    def persist_deadline(self) -> float:
        """``persist_by`` on this process's clock (0: no deadline)."""
        return self.persist_by + self.shift if self.persist_by else 0.0

    @classmethod
    def for_plan(
        cls,
        pod: Pod,
        plan: Plan,
        *,
        review_uid: str,
        now: float,
        ttl: float,
        persisted: bool = False,
        persist_timeout: float = 0.0,
    ) -> LedgerEntry:
        """The entry admitting ``pod``'s resize as ``plan`` (``fits`` or ``preempt``) has
        it: the room the plan requested on its node, its victims in eviction order, held
        for ``ttl`` seconds from ``now``, and the spec generation of ``pod`` (the object
        being admitted carries the generation its resize will have). ``persisted``: the
        resize is in the pod's spec already (the kubelet deferred it).
        ``persist_timeout``: seconds after which a resize not in the spec is taken as
        refused (0: never)."""
        return cls(
            pod=pod.ref,
            node=plan.node,
            review_uid=review_uid,
            resources=plan.requested,
            desired=desired_requests(pod),
            victims=tuple(v.pod for v in plan.victims),
            admitted_at=now,
            expires_at=now + ttl,
            persisted=persisted,
            generation=pod.generation,
            persist_by=now + persist_timeout if persist_timeout and not persisted else 0.0,
            loans=plan.loans,
            moves=plan.moves,
        )

    @property
    def lends(self) -> bool:
        """Whether the plan borrows: loans to make, made or refused. Only then has
        :class:`~webhook.engine.loans.Lending` anything to do for the entry."""
        return bool(self.loans or self.refused)

    @property
    def pending_victims(self) -> tuple[PodRef, ...]:
        return tuple(v for v in self.victims if v.uid not in self.handled)

    def reservation(self) -> Reservation:
        return Reservation(
            pod_uid=self.pod.uid,
            pod=self.pod.key,
            node=self.node,
            resources=self.resources,
            victims=frozenset(v.uid for v in self.pending_victims),
            expires_at=self.deadline,
            moves=self.moves,
        )

    def with_victims(self, victims: Sequence[PodRef]) -> LedgerEntry:
        return replace(self, victims=tuple(victims))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "v": ENTRY_VERSION,
            "pod": _ref_json(self.pod),
            "node": self.node,
            "review": self.review_uid,
            "resources": {"cpu": self.resources.cpu, "memory": self.resources.memory},
            "desired": {n: [r.cpu, r.memory] for n, r in self.desired},
            "victims": [_ref_json(v) for v in self.victims],
            "admitted": self.admitted_at,
            "expires": self.expires_at,
            "handled": sorted(self.handled),
            "persisted": self.persisted,
            "generation": self.generation,
            "persist_by": self.persist_by,
            "loans": [_loan_json(loan) for loan in self.loans],
        }
        if self.refused:
            # Only when there are any: an entry without keeps the form every reader knows.
            data["refused"] = [_loan_json(loan) for loan in self.refused]
        if self.moves:
            data["moves"] = [[node, r.cpu, r.memory] for node, r in self.moves]
        return data

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> LedgerEntry:
        """Inverse of :meth:`to_json`; raises :class:`ObjectError` on a malformed entry."""
        try:
            if data.get("v") != ENTRY_VERSION:
                raise ObjectError(f"ledger entry version {data.get('v')!r} is not supported")
            return LedgerEntry(
                pod=_ref_from_json(data["pod"]),
                node=str(data["node"]),
                review_uid=str(data["review"]),
                resources=Resources(
                    int(data["resources"]["cpu"]), int(data["resources"]["memory"])
                ),
                desired=tuple(
                    (str(n), Resources(int(c), int(m))) for n, (c, m) in data["desired"].items()
                ),
                victims=tuple(_ref_from_json(v) for v in data["victims"]),
                admitted_at=float(data["admitted"]),
                expires_at=float(data["expires"]),
                handled=frozenset(str(u) for u in data.get("handled", ())),
                persisted=bool(data.get("persisted", False)),
                generation=int(data.get("generation", 0)),
                persist_by=float(data.get("persist_by", 0.0)),
                loans=tuple(_loan_from_json(item) for item in data.get("loans", ())),
                refused=tuple(_loan_from_json(item) for item in data.get("refused", ())),
                moves=tuple(
                    (str(n), Resources(int(c), int(m))) for n, c, m in data.get("moves", ())
                ),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ObjectError(f"malformed ledger entry: {e!r}") from None


def _ref_json(ref: PodRef) -> dict[str, str]:
    return {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid}


def _ref_from_json(data: Mapping[str, Any]) -> PodRef:
    return PodRef(str(data["namespace"]), str(data["name"]), str(data["uid"]))


def _loan_json(loan: Loan) -> dict[str, Any]:
    return {
        "pod": _ref_json(loan.pod),
        "priority": loan.priority,
        "container": loan.container,
        "resource": loan.resource,
        "before": loan.before,
        "after": loan.after,
        "frees": loan.frees,
        "limits": loan.limits,
    }


def _loan_from_json(data: Mapping[str, Any]) -> Loan:
    resource = data["resource"]
    if resource not in ("cpu", "memory"):
        raise ValueError(f"loan of unknown resource {resource!r}")
    before, after = int(data["before"]), int(data["after"])
    if not 0 < after < before:
        raise ValueError(f"loan from {before} to {after} lowers nothing")
    return Loan(
        pod=_ref_from_json(data["pod"]),
        priority=int(data["priority"]),
        container=str(data["container"]),
        resource=resource,
        before=before,
        after=after,
        frees=int(data["frees"]),
        limits=bool(data["limits"]),
    )


def on_local_clock(
    entry: LedgerEntry, *, seen: float, live: bool, ttl: float
) -> tuple[LedgerEntry, str]:
    """``entry`` as a reader first seeing it at ``seen`` (its own clock) takes it, and why
    it changed anything ("" when it did not): every replica's entries are read on one
    clock, whatever their writers' clocks say.

    * it holds room at most ``ttl`` seconds from its admission, whatever ``expires_at``
      says;
    * ``admitted_at`` more than :data:`MAX_CLOCK_SKEW` ahead of ``seen``: refused, it
      holds no room (expired at its admission);
    * ``live`` (this process saw it written: its own write or a watch event): its times
      are moved by ``seen - admitted_at``, so it holds room as long on this clock as on
      its writer's - a reader whose clock runs ahead neither releases (nor drops) a fresh
      entry early, one whose clock runs behind holds it no longer than the TTL;
    * first seen in a list (written some time before): moved back only, by how far
      ``admitted_at`` lies ahead of ``seen``, so it holds room at most ``ttl`` from now.

    A difference within :data:`CLOCK_TOLERANCE` moves nothing.
    """
    why = ""
    if entry.admitted_at > seen + MAX_CLOCK_SKEW:
        why = f"admitted {entry.admitted_at - seen:.0f}s in the future: refused"
        entry = replace(entry, expires_at=entry.admitted_at, persist_by=0.0)
    elif entry.expires_at - entry.admitted_at > ttl:
        why = f"held {entry.expires_at - entry.admitted_at:.0f}s: capped at the TTL"
        entry = replace(entry, expires_at=entry.admitted_at + ttl)
    behind = seen - entry.admitted_at
    if abs(behind) <= CLOCK_TOLERANCE or (behind > 0 and not live):
        return entry, why
    return replace(entry, shift=behind), why


def encode_entries(entries: Iterable[LedgerEntry]) -> str:
    """Canonical JSON of one node's entries (sorted, so equal sets encode equally)."""
    items = sorted((e.to_json() for e in entries), key=lambda d: (d["pod"]["uid"], d["review"]))
    return orjson.dumps(items, option=orjson.OPT_SORT_KEYS).decode()


def decode_entries(text: str | None) -> tuple[LedgerEntry, ...]:
    """Entries from :func:`encode_entries`' output; unknown or broken entries are dropped
    (a ledger we cannot read must not stop admissions - it only loses reservations)."""
    if not text:
        return ()
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError:
        return ()
    entries: list[LedgerEntry] = []
    # Bounded work per read, whoever wrote the Lease.
    for item in raw[:MAX_NODE_ENTRIES] if isinstance(raw, list) else ():
        try:
            entries.append(LedgerEntry.from_json(item))
        except ObjectError:
            continue
    return tuple(entries)


#: A change to one node's entries: it receives them as they are and returns (new entries
#: or ``None`` for "leave as is", result). It must be pure: a store calls it again after a
#: conflict.
LedgerChange = Callable[[tuple[LedgerEntry, ...]], tuple[tuple[LedgerEntry, ...] | None, R]]


class Ledger(Protocol):
    """Where entries live. ``webhook.kube.ledger`` keeps them in Leases, one per node."""

    def entries(self, node: str) -> tuple[LedgerEntry, ...]:
        """One node's entries as last seen (no API call on the hot path)."""
        ...

    def all_entries(self) -> tuple[LedgerEntry, ...]: ...

    def update(self, node: str, change: LedgerChange[R]) -> R:
        """Apply ``change`` atomically to ``node``'s entries; retried on conflict. The
        store writes exactly the entries ``change`` returns: which entries live is the
        lifecycle's rule (:func:`webhook.engine.lifecycle.states.to_keep`), never the store's.

        Raises :class:`LedgerFull` when they would not fit one store object, and
        ``webhook.kube.errors.ClusterError`` (a :class:`WebhookError`) when the store
        cannot be reached; callers on the admission path fail open.
        """
        ...

    def reachable(self) -> bool: ...

    def untidy(self) -> frozenset[str]:
        """Nodes whose stored entries include some that reads leave out (a late write's
        void entries): a write through the keep rule
        (:func:`webhook.engine.lifecycle.changes.tidy`) drops them."""
        ...


class ClusterView(Protocol):
    """A read-only, in-memory view of the cluster. Every call is a memory read."""

    def node(self, name: str) -> Node | None: ...

    def all_nodes(self) -> Sequence[Node]:
        """Every node (victim order ``movable-first`` reads the others' room)."""
        ...

    def pods_on(self, node: str) -> Sequence[Pod]:
        """Pods bound to ``node``, terminal ones included (the planner skips them). A pod
        with a ``resource_version`` reads as that version of the stored object, nothing
        else: the node memo reuses what it computed of a version
        (:class:`~webhook.engine.planner.NodeMemo`)."""
        ...

    def node_rooms(self) -> NodeRooms:
        """Every node's room, told which nodes changed (victim order ``movable-first``)."""
        ...

    def pod(self, namespace: str, name: str) -> Pod | None: ...

    def lenders(self) -> Sequence[Pod]:
        """Pods carrying a loan record (:data:`~webhook.core.model.LOANS_ANNOTATION`),
        on any node: the worker gives back loans whose ledger entry is gone."""
        ...

    def budgets(self, namespaces: Iterable[str]) -> Sequence[DisruptionBudget]:
        """PodDisruptionBudgets in any of ``namespaces``."""
        ...

    def priority_resolver(self) -> PriorityResolver: ...

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        """The labels of namespace ``name`` (the preemptor policy's selector reads them);
        ``None`` when the view does not know it."""
        ...

    def synced(self) -> bool:
        """True once every watched kind has been listed."""
        ...

    def age(self) -> float:
        """Seconds since the cache last heard from the API server."""
        ...

    def staleness(self) -> float:
        """Seconds during which the view may have missed changes: 0 while it is fed by
        open watches, growing from the moment one was lost until it is back."""
        ...

    def caught_up(self, version: str, timeout: float) -> bool:
        """Whether the view holds every pod write up to resource version ``version``
        (:mod:`webhook.core.versions`), waiting at most ``timeout`` seconds for it. False
        when ``version`` is not comparable. A review's ``oldObject`` names the version of
        the pod it resizes; once the view holds it, it holds every pod bound before too."""
        ...


class EvictionResult(StrEnum):
    """What happened to one victim. All but ``blocked-by-pdb`` and ``failed`` are final."""

    EVICTED = "evicted"
    DELETED = "deleted"
    GONE = "gone"
    SKIPPED_TERMINATING = "skipped-terminating"
    BLOCKED_BY_PDB = "blocked-by-pdb"
    FAILED = "failed"

    @property
    def done(self) -> bool:
        """True when the victim is leaving or gone: never act on it again."""
        return self not in (EvictionResult.BLOCKED_BY_PDB, EvictionResult.FAILED)


class VictimEvictor(Protocol):
    """Removes one victim for a preemptor, idempotently; never raises (API failures are
    ``failed``). ``seen_live``: the caller has just seen the victim live under this uid;
    ``grace_seconds``, when given, caps the victim's grace period further (what its
    checkpoint left of it)."""

    def evict(
        self,
        victim: PodRef,
        preemptor: PodRef,
        node: str,
        *,
        seen_live: bool = False,
        grace_seconds: int | None = None,
    ) -> EvictionResult: ...


class PreemptionEvents(Protocol):
    """Tells the resizing pod when its admitted plan was given up on; never raises.

    A plan carried out needs no event on the resizing pod: the kubectl warning (or the
    reconciler's event) named the victims, and each victim gets upstream's ``Preempted``
    event, related to the resizing pod."""

    def abandoned(
        self, preemptor: PodRef, victims: Sequence[PodRef], node: str, detail: str
    ) -> bool: ...
