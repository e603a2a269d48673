"""The life of an admitted resize, from the ledger write that admits it to its release.

An admitted resize is one ledger entry. Its state is never written: it is read from the
entry, the resizing pod as the cache shows it, and the time, by one function,
:func:`phase`. Every reader asks it: the admission path and the reconciler (which entries
hold room), a write to the node (which entries it keeps), the worker (what to do next).

::

    admitted --> persisted --> actuated
        \\            \\           \\
         +------------+-----------+--> released

* **admitted**: the entry holds room; the resize is not in the pod's spec yet (or the
  cache has not seen the pod yet: it may lag the admission).
  - -> persisted: the API server stored the resize (the spec carries exactly the
    admitted requests). The worker makes room from here on.
  - -> released: the pod's spec changed again at a later generation (superseded: a newer
    resize has its own entry if it needs room), or the resize is still not in the spec at
    ``persist_by`` (a later admission step refused it).
* **persisted**: the entry holds room and the worker makes it: it lends, then evicts
  (:func:`next_action`).
  - -> actuated: the kubelet allocated at least the admitted requests: the pod holds the
    room itself now, and the kubelet's own accounting counts it.
  - -> released: the kubelet marked the resize Infeasible; it will never use the room.
* **actuated**: the entry holds no room. It stays in the ledger only while it owes a loan
  (given back from it, :mod:`webhook.engine.loans`); while a lender whose loan the
  kubelet refused is owed its room, the worker goes on making that room (the borrower may
  hold it already).
* **released**, from any state: the entry expired (``expires_at``), or the pod is
  terminating or finished. It holds nothing; the next write to its node drops it (unless
  it owes a loan).

So a resize that goes as planned costs one ledger write, the one that admitted it: no
transition is written. :func:`admit` is that write, shared by the admission path and the
reconciler.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from webhook.core.lending import Loan
from webhook.core.model import DisruptionBudget, Node, PdbMode, Pod, PodRef
from webhook.core.plan import NodePods, Plan, plan_resize
from webhook.core.policy import ImportanceKey, PreemptionPolicy
from webhook.core.resources import Resources
from webhook.engine import loans
from webhook.engine.ledger import LedgerChange, LedgerEntry
from webhook.engine.settings import Config

State = Literal["admitted", "persisted", "actuated", "released"]
#: States in which an entry holds room on its node: every plan counts it.
HOLDS_ROOM: frozenset[State] = frozenset({"admitted", "persisted"})

Why = Literal[
    "unseen",
    "not-persisted-yet",
    "persisted",
    "actuated",
    "expired",
    "pod-leaving",
    "superseded",
    "not-persisted",
    "infeasible-resize",
]


class Phase(NamedTuple):
    """An entry's state, and why it is in it."""

    state: State
    why: Why


def phase(entry: LedgerEntry, pod: Pod | None, now: float) -> Phase:
    """The state of ``entry`` given its pod as cached (``None``: not cached) at ``now``:
    the one transition function of an admitted resize (the module's docstring says why
    each transition happens). Stable: once released, a later resize of the pod raises its
    generation past the entry's (or comes after ``persist_by``), so it never holds room
    again."""
    if entry.expires_at <= now:
        return Phase("released", "expired")
    if pod is None or pod.uid != entry.pod.uid:
        return Phase("admitted", "unseen")
    if pod.leaving:
        return Phase("released", "pod-leaving")
    if not persisted(entry, pod):
        # The generation tells a superseded spec apart at once (the spec alone cannot:
        # before persisting it differs too).
        if entry.generation and pod.generation > entry.generation:
            return Phase("released", "superseded")
        if entry.persist_by and now >= entry.persist_by:
            return Phase("released", "not-persisted")
        return Phase("admitted", "not-persisted-yet")
    if _allocated(entry.desired, pod):
        return Phase("actuated", "actuated")
    if pod.resize == "infeasible":
        return Phase("released", "infeasible-resize")
    return Phase("persisted", "persisted")


def persisted(entry: LedgerEntry, pod: Pod) -> bool:
    """Whether ``pod``'s spec carries exactly the container requests ``entry`` admitted."""
    return {c.name: c.requests for c in pod.all_containers()} == dict(entry.desired)


def _allocated(desired: Iterable[tuple[str, Resources]], pod: Pod) -> bool:
    """Whether the kubelet allocated at least ``desired`` to every container named:
    ``allocatedResources``, or ``resources`` (what the runtime applied) where the kubelet
    reports no allocation. Init containers that are not sidecars ran to completion and are
    not resized. Nothing desired: not allocated (an entry that does not say what it
    admitted holds room until it expires)."""
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


def holds_room(entry: LedgerEntry, pods: Mapping[str, Pod], now: float) -> bool:
    """Whether ``entry`` holds room, its pod looked up by uid in the cached ``pods``."""
    return phase(entry, pods.get(entry.pod.uid), now).state in HOLDS_ROOM


def room_holders(
    entries: Iterable[LedgerEntry], pods: Iterable[Pod], now: float
) -> tuple[LedgerEntry, ...]:
    """The entries that hold room on a node whose cached pods are ``pods``: what every
    plan counts. The others stay in the ledger until the next write to their node drops
    them; nobody writes to remove them."""
    listed = tuple(entries)
    if not listed:
        return ()  # most nodes have no entry: their pods need no index
    by_uid = {p.uid: p for p in pods}
    return tuple(e for e in listed if holds_room(e, by_uid, now))


def to_keep(
    entries: Iterable[LedgerEntry], pods: Iterable[Pod], now: float
) -> tuple[LedgerEntry, ...]:
    """The entries a write to a node keeps: those holding room, and those that owe a loan
    (:func:`webhook.engine.loans.owes`), holding room or not."""
    by_uid = {p.uid: p for p in pods}
    return tuple(e for e in entries if holds_room(e, by_uid, now) or loans.owes(e, by_uid, now))


def claim(
    pod: Pod, entries: Sequence[LedgerEntry], pods: Sequence[Pod], now: float
) -> Literal["held", "given-back", ""]:
    """What already answers for ``pod``'s pending resize on its node: ``held``, an entry
    of the pod holding room (the worker makes it); ``given-back``, the resize is room an
    entry gives back to it (:func:`webhook.engine.loans.is_give_back`: taken only when
    free, never preempted for); ``""``, nothing."""
    if any(e.pod.uid == pod.uid for e in room_holders(entries, pods, now)):
        return "held"
    return "given-back" if loans.is_give_back(pod, entries) else ""


# -- admitting ------------------------------------------------------------------------------


class Admitted(NamedTuple):
    """What :func:`admit` decided: the plan (``None``: not planned, the pod's resize has an
    entry holding room already) and the entry written (``None``: nothing written)."""

    plan: Plan | None
    entry: LedgerEntry | None


def admit(
    pod: Pod,
    pods: Sequence[Pod],
    now: float,
    *,
    review_uid: str,
    plan: Callable[[Sequence[LedgerEntry]], Plan],
    reserves: Callable[[Plan], bool],
    entry: Callable[[Plan], LedgerEntry],
    review: bool,
) -> LedgerChange[Admitted]:
    """The one write that admits ``pod``'s resize on its node, as a ledger change (pure: a
    store may apply it again after a conflict).

    ``plan`` plans the resize against the entries holding room; ``reserves`` says whether
    a plan takes a reservation; ``entry`` makes the entry for a plan that does. ``pods``
    are the node's cached pods. ``review``: the resize comes in an AdmissionReview, which
    the API server may send again (answered with the entry it wrote) and which supersedes
    the pod's earlier entries; otherwise it is a resize the kubelet deferred, and an entry
    of the pod still holding room is the worker's (nothing is planned).

    The write keeps the entries of other pods that hold room and every entry that owes a
    loan, and drops the rest: the one write a plan costs also clears what nobody reads.
    """

    def change(entries: tuple[LedgerEntry, ...]) -> tuple[tuple[LedgerEntry, ...] | None, Admitted]:
        if review:
            for e in entries:
                if e.review_uid == review_uid:
                    return None, Admitted(plan(room_holders(entries, pods, now)), e)
            others = room_holders((e for e in entries if e.pod.uid != pod.uid), pods, now)
        else:
            others = room_holders(entries, pods, now)
            if any(e.pod.uid == pod.uid for e in others):
                return None, Admitted(None, None)
        planned = plan(others)
        if planned.verdict == "preempt" and loans.is_give_back(pod, entries):
            # A loan given back takes only room that is free: nobody is evicted or shrunk
            # for it, and if the room went meanwhile the kubelet defers it.
            return None, Admitted(planned, None)
        if not reserves(planned):
            return None, Admitted(planned, None)
        new = entry(planned)
        kept = {e.review_uid for e in others}
        owing = tuple(e for e in loans.debtors(entries, pods, now) if e.review_uid not in kept)
        return (*others, *owing, new), Admitted(planned, new)

    return change


# -- the worker's next step -----------------------------------------------------------------

ReleaseReason = Literal[
    "expired",
    "pod-gone",
    "not-persisted",
    "superseded",
    "actuated",
    "infeasible-resize",
    "not-eligible",
    "replan",
]
WaitReason = Literal["not-persisted-yet", "node-unknown", "cannot-fit", "actuating"]


@dataclass(frozen=True, slots=True)
class Release:
    """The entry holds nothing any more; evict nobody (more). ``write``: readers still
    count it (the pod is gone from the cache, or the plan was given up on), so the worker
    removes it from the ledger; otherwise it is left for the next write to drop."""

    reason: ReleaseReason
    detail: str
    write: bool = False


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to evict now. ``settle``: pending victims found leaving (nothing to do for
    them)."""

    reason: WaitReason
    detail: str
    settle: tuple[PodRef, ...] = ()


@dataclass(frozen=True, slots=True)
class Act:
    """Make the room.

    ``settle``: pending victims already terminating, terminal or gone - nothing to do,
    no API call. ``drop``: pending victims the fresh plan no longer needs - take them off
    the entry (a ledger write) so its reservation stops claiming them. ``evict``: victims
    to act on, in the entry's order. ``evict`` may be empty (the resize fits now; the
    entry holds room until the kubelet actuates it or it expires). ``lend``: the entry's
    loans still pending, in the order taken; made before any eviction (a loan is actuated
    at once, an eviction waits out a grace period).
    """

    plan: Plan
    evict: tuple[PodRef, ...] = ()
    settle: tuple[PodRef, ...] = ()
    drop: tuple[PodRef, ...] = ()
    lend: tuple[Loan, ...] = ()


Refuse = loans.Refuse
Action = Release | Wait | Act | Refuse


@dataclass(frozen=True, slots=True)
class ListedOnly:
    """A :class:`PreemptionPolicy` that only lets the given pod uids be victims and takes
    nothing more from lenders: a re-plan never evicts or borrows beyond what was admitted.

    Wraps the configured policy, so protected namespaces and ranking still apply.
    """

    base: PreemptionPolicy
    allowed: frozenset[str]

    @property
    def pdb_mode(self) -> PdbMode:
        return self.base.pdb_mode

    @property
    def max_victims(self) -> int | None:
        return self.base.max_victims

    @property
    def lending(self) -> bool:
        return False

    def may_preempt(self, victim: Pod, preemptor: Pod) -> bool:
        return victim.uid in self.allowed and self.base.may_preempt(victim, preemptor)

    def importance(self, pod: Pod, now: float) -> ImportanceKey:
        return self.base.importance(pod, now)


@dataclass(frozen=True, slots=True)
class Scene:
    """What one decision on an entry reads: its pod as cached by name (``None``: not
    cached), its node, the node's pods and budgets, the node's other entries holding room,
    the time and the settings."""

    entry: LedgerEntry
    pod: Pod | None
    node: Node | None
    pods: Sequence[Pod]
    budgets: Sequence[DisruptionBudget]
    others: tuple[LedgerEntry, ...]
    now: float
    config: Config

    def victims(self) -> tuple[tuple[PodRef, ...], tuple[PodRef, ...]]:
        """The entry's pending victims, (live, leaving): leaving when handled by any
        entry, terminating, terminal or gone."""
        handled = self.handled()
        by_uid = {p.uid: p for p in self.pods if p.node == self.entry.node}
        live: list[PodRef] = []
        leaving: list[PodRef] = []
        for v in self.entry.pending_victims:
            pod = by_uid.get(v.uid)
            gone = v.uid in handled or pod is None or pod.leaving
            (leaving if gone else live).append(v)
        return tuple(live), tuple(leaving)

    def handled(self) -> frozenset[str]:
        """Victims any entry already handled: on their way out even if the cache has not
        seen their deletion yet."""
        return frozenset(self.entry.handled).union(*(o.handled for o in self.others))


def next_action(
    entry: LedgerEntry,
    pod: Pod | None,
    node: Node | None,
    pods: Sequence[Pod],
    *,
    now: float,
    config: Config,
    budgets: Sequence[DisruptionBudget] = (),
    others: Iterable[LedgerEntry] = (),
) -> Action:
    """What the worker does next with ``entry``, by its :func:`phase`; pure.

    ``pod`` is the resizing pod as cached (looked up by namespace/name; ``None`` when not
    cached); ``node`` its node; ``pods`` the pods bound to ``entry.node``; ``others`` the
    node's other ledger entries (those holding room count, this entry's own does not).

    1. released: expired, pod gone or leaving (:func:`_gone`);
    2. admitted: wait for the resize to persist, at most ``persist_timeout``
       (:func:`_until_persisted`);
    3. a loan the kubelet refused is recorded with a plan made again without its lender
       (:func:`webhook.engine.loans.refusal`);
    4. actuated, or marked Infeasible: released (:func:`_done`);
    5. persisted: make the room (:func:`_making_room`).
    """
    held = room_holders((o for o in others if o.review_uid != entry.review_uid), pods, now)
    scene = Scene(entry, pod, node, pods, budgets, held, now, config)
    now_in = phase(entry, pod, now)
    return (
        _gone(scene, now_in)
        or _until_persisted(scene, now_in)
        or loans.refusal(scene, replan)
        or _done(scene, now_in)
        or _making_room(scene)
    )


def _gone(s: Scene, now_in: Phase) -> Release | None:
    """1. An expired reservation protects nothing any more; nor does one whose pod is gone,
    replaced or leaving. Only a pod the cache no longer has needs the entry removed: a
    reservation of a pod not seen is kept by every reader (the cache may lag)."""
    entry = s.entry
    if now_in.why == "expired":
        return Release("expired", f"reservation expired {s.now - entry.expires_at:.1f}s ago")
    if s.pod is None:
        return Release("pod-gone", f"pod {entry.pod.key} no longer exists", write=True)
    if s.pod.uid != entry.pod.uid:
        detail = f"pod {entry.pod.key} was replaced (uid {s.pod.uid})"
        return Release("pod-gone", detail, write=True)
    if now_in.why == "pod-leaving":
        return Release("pod-gone", f"pod {entry.pod.key} is terminating or finished")
    return None


def _until_persisted(s: Scene, now_in: Phase) -> Release | Wait | None:
    """2. Wait until the resize is in the pod's spec; another spec at a later generation
    (or, for an entry written persisted, any other spec) superseded it."""
    if now_in.why not in ("not-persisted-yet", "superseded", "not-persisted"):
        return None
    entry, config = s.entry, s.config
    later = now_in.why == "superseded"
    if entry.persisted or later:
        # Readers see a later generation themselves; without one, the worker removes it.
        detail = "the pod's spec changed again after the resize"
        return Release("superseded", detail, write=not later)
    deadline = entry.admitted_at + config.persist_timeout
    if s.now >= deadline:
        # Written unless the entry carries its own deadline, which every reader applies.
        detail = f"resize not in the pod's spec {config.persist_timeout:g}s after admission"
        return Release("not-persisted", detail, write=not entry.persist_by)
    return Wait("not-persisted-yet", "waiting for the resize to persist")


def _done(s: Scene, now_in: Phase) -> Release | Wait | None:
    """4. Done, or the kubelet will never do it. A resize the kubelet actuated on a loan
    it then refused is not done while that lender waits for its room back: the entry
    makes that room, as it made the borrower's."""
    if now_in.state == "actuated" and not (
        s.entry.refused and loans.owes_lender(s.entry, {p.uid: p for p in s.pods})
    ):
        return Release("actuated", "the kubelet allocated the new requests")
    assert s.pod is not None  # released by _gone otherwise
    if s.pod.resize == "infeasible":
        return Release("infeasible-resize", "the kubelet marked the resize Infeasible")
    if s.node is None:
        return Wait("node-unknown", f"node {s.entry.node} not in the cache")
    return None


def _making_room(s: Scene) -> Action:
    """5. Plan again on fresh state, restricted to the entry's own pending victims: the
    worker never evicts a pod the entry does not name, and evicts fewer when room
    appeared."""
    live, settle = s.victims()
    plan = replan(s, (), listed=True)
    lend = loans.pending(s.entry, s.pods)
    if plan.code == "no-growth":
        # Judged by its code, whatever verdict the core gives it: the kubelet is catching
        # up, and the entry's victims stay claimed until it has.
        return Wait("actuating", plan.reason, settle=settle)
    if plan.verdict == "fits":
        # The loans are part of the room the resize fits in; only victims can go unneeded.
        return Act(plan, settle=settle, drop=live, lend=lend)
    if plan.verdict == "preempt":
        needed = {v.pod.uid for v in plan.victims}
        evict = tuple(v for v in live if v.uid in needed)
        drop = tuple(v for v in live if v.uid not in needed)
        return Act(plan, evict=evict, settle=settle, drop=drop, lend=lend)
    if plan.verdict == "infeasible":
        assert s.pod is not None
        if s.pod.resize == "deferred":
            # The listed victims are not enough any more and the kubelet has given up for
            # now; holding the room until expiry would only delay the resize. The
            # reconciler re-plans it from scratch (same core, same ledger).
            detail = f"the admitted victims no longer suffice: {plan.reason}"
            return Release("replan", detail, write=True)
        return Wait("cannot-fit", plan.reason, settle=settle)
    return Release("not-eligible", plan.reason, write=True)


def replan(s: Scene, refusing: tuple[Loan, ...], *, listed: bool) -> Plan:
    """The entry's resize planned on fresh state: handled victims as leaving, and the
    node's pods as the ledger's loans leave them (:func:`webhook.engine.loans.as_lent`).
    ``listed``: only the entry's own live pending victims may go and nothing more is
    borrowed; otherwise any candidate may, and any lender lend (a plan made again after a
    refusal, ``refusing`` the loans refused)."""
    assert s.pod is not None and s.node is not None
    handled = s.handled()
    pods = tuple(
        replace(p, terminating=True) if p.uid in handled and not p.terminating else p
        for p in s.pods
    )
    pods = loans.as_lent(pods, s.entry, s.others, refusing)
    old = loans.borrower(s.pod, s.entry, s.pods, refusing)
    policy: PreemptionPolicy = s.config.policy()
    if listed:
        policy = ListedOnly(policy, frozenset(v.uid for v in s.victims()[0]))
    return plan_resize(
        old,
        s.pod,
        NodePods(s.node, pods),
        now=s.now,
        budgets=s.budgets,
        reservations=[o.reservation() for o in s.others],
        policy=policy,
    )


__all__ = [
    "HOLDS_ROOM",
    "Act",
    "Action",
    "Admitted",
    "ListedOnly",
    "Phase",
    "Refuse",
    "Release",
    "ReleaseReason",
    "Scene",
    "State",
    "Wait",
    "WaitReason",
    "admit",
    "claim",
    "holds_room",
    "next_action",
    "persisted",
    "phase",
    "replan",
    "room_holders",
    "to_keep",
]
