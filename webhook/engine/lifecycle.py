"""The life of an admitted resize and of its loans: their states, the one rule for what a
ledger write keeps, and every ledger change the engine makes.

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
* **actuated**: the entry holds no room. While a lender whose loan the kubelet refused
  is owed its room, the worker goes on making that room (the borrower may hold it).
* **released**, from any state: the entry expired (``expires_at``), or the pod is
  terminating or finished. It holds nothing.

A loan of an entry's plan has states of its own, read by one function too,
:func:`loan_phase`, from the loan, its lender as cached, whether the kubelet refused it
and whether the entry still holds room::

    to-lend --> lent --> due --> returning --> ended
                  \\
                   +--> refused --> putting-back --> ended

* **to-lend**: planned, the lender still at its size before: the worker lends it before
  any eviction. **lent**: the lender lowered; the borrower's entry still holds room.
* **due**: lent, and the entry holds no room any more: given back when the node has room
  for it and nobody more important waits for that room (:func:`give_backs`).
* **returning**: given back, the kubelet has not actuated it yet: never preempted for.
* **refused**: the kubelet will not actuate it (a memory limit below the usage): the plan
  is made again without the lender, and the lender put back. **putting-back**: back at
  ``before`` in its spec, not yet in its allocation: the entry makes that room.
* **ended**: returned, put back, or void (the lender gone, or its owner set another size).

**The keep rule** (:func:`to_keep`): a write keeps the entries holding room and the
entries owing a loan (lent, due, returning; refused or putting-back until the entry
expires), and drops the rest. Every change to a node's entries is made here and goes
through it; a store stores what a change returns and judges nothing. A resize that goes
as planned costs one ledger write, the one that admitted it (:func:`admit`, shared by the
admission path and the reconciler through their :class:`Planner`).

A loan is also recorded on its lender (:func:`webhook.core.lending.records`), before it is
made. A record whose loan no entry holds (the entry was lost with its Lease, or by a
bug) is an orphan (:func:`orphans`): given back like any loan that is due, then removed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal, NamedTuple, Protocol

from webhook.base.settings import Config
from webhook.core.accounting import active_on, holdings, node_usage, pod_requests
from webhook.core.lending import (
    Loan,
    LoanKey,
    LoanRecord,
    loan_key,
    loan_state,
    loans_by_lender,
    lowered,
    owed_back,
    recorded,
    records,
    refusal_state,
    refused,
    unlendable,
)
from webhook.core.model import DisruptionBudget, Node, PdbMode, Pod, PodRef
from webhook.core.plan import NodePods, Plan, plan_resize
from webhook.core.policy import ImportanceKey, PreemptionPolicy, importance_key
from webhook.core.resources import ZERO, Resources
from webhook.engine.ledger import LedgerChange, LedgerEntry, desired_requests

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
    if entry.deadline <= now:
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
        if entry.persist_by and now >= entry.persist_deadline:
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


def wanted(entry: LedgerEntry, pod: Pod | None) -> bool:
    """Whether the resize ``entry`` admitted is still asked for, by ``pod`` as cached (by
    name): the same pod, on the entry's node, not leaving, its spec at exactly the
    admitted requests. Checked
    before each loan and each eviction of a batch decided a moment ago: a resize patched
    back down, or its pod deleted, stops the rest."""
    return (
        pod is not None
        and pod.uid == entry.pod.uid
        and pod.node == entry.node
        and not pod.leaving
        and persisted(entry, pod)
    )


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


# -- the loans' states ---------------------------------------------------------------------

LoanPhase = Literal["to-lend", "lent", "due", "returning", "refused", "putting-back", "ended"]
#: States in which a loan is owed to its lender: its entry is kept by every write.
OWED: frozenset[LoanPhase] = frozenset({"lent", "due", "returning"})
#: States of a refused loan whose lender is owed its room while the entry lasts.
OWED_REFUSED: frozenset[LoanPhase] = frozenset({"refused", "putting-back"})


def loan_phase(loan: Loan, lender: Pod | None, *, refused: bool, holding: bool) -> LoanPhase:
    """The state of ``loan`` given its lender as cached (``None``: not cached),
    whether the kubelet refused it (the entry lists it as refused) and whether its entry
    holds room: the one transition function of a loan (the module's docstring says why
    each transition happens). Read from the lender, never written: a restart neither
    repeats a loan nor forgets one."""
    if refused:
        undo = refusal_state(loan, lender)
        return "refused" if undo == "undo" else "putting-back" if undo == "restoring" else "ended"
    state = loan_state(loan, lender)
    if state == "lent":
        return "lent" if holding else "due"
    if state == "pending":
        return "to-lend" if holding else "ended"
    return "returning" if state == "returning" else "ended"


def loan_phases(
    entry: LedgerEntry, pods: Mapping[str, Pod], holding: bool
) -> Iterable[tuple[Loan, LoanPhase]]:
    """Each loan of ``entry``, made or refused, with its :func:`loan_phase`; lenders
    looked up by uid in the cached ``pods``."""
    for loan in entry.loans:
        yield loan, loan_phase(loan, pods.get(loan.pod.uid), refused=False, holding=holding)
    for loan in entry.refused:
        yield loan, loan_phase(loan, pods.get(loan.pod.uid), refused=True, holding=holding)


def owes_lender(entry: LedgerEntry, pods: Mapping[str, Pod]) -> bool:
    """Whether a lender whose loan the kubelet refused is not back at its own spec yet:
    the entry makes that room."""
    return any(p in OWED_REFUSED for _, p in loan_phases(entry, pods, True))


def owes(entry: LedgerEntry, pods: Mapping[str, Pod], now: float) -> bool:
    """Whether ``entry`` owes a loan, holding room or not: one lent, due or returning, or,
    until the entry expires, one refused whose lender waits for its room back."""
    if not entry.lends:
        return False
    owed = OWED | OWED_REFUSED if entry.deadline > now else OWED
    return any(p in owed for _, p in loan_phases(entry, pods, True))


def pending(entry: LedgerEntry, pods: Sequence[Pod]) -> tuple[Loan, ...]:
    """The entry's loans still to make, in the order taken: ``to-lend``, or given back
    and taken again before the kubelet actuated the return (``returning``)."""
    if not entry.loans:
        return ()
    by_uid = {p.uid: p for p in pods}
    return tuple(
        loan
        for loan, p in loan_phases(replace(entry, refused=()), by_uid, True)
        if p in ("to-lend", "returning")
    )


def to_put_back(entry: LedgerEntry, pods: Sequence[Pod]) -> tuple[Loan, ...]:
    """The entry's refused loans whose lender still asks for the loan's ``after``: put
    back to ``before``, whatever else the entry does; only loans the lender's own record
    holds (:func:`~webhook.core.lending.recorded`): the ledger's word alone raises no pod."""
    by_uid = {p.uid: p for p in pods}
    return tuple(
        loan
        for loan, p in loan_phases(replace(entry, loans=()), by_uid, True)
        if p == "refused" and recorded(loan, by_uid.get(loan.pod.uid))
    )


def is_give_back(pod: Pod, entries: Sequence[LedgerEntry]) -> bool:
    """Whether ``pod``'s pending resize is a loan given back (``returning``) or a refused
    loan put back (``putting-back``), by the ledger's entries or by the pod's own record,
    not a resize its owner made. Nobody is preempted for either: a give-back takes only
    free room, and the room a refused lender is owed is made by the entry that borrowed
    it."""
    mine = {pod.uid: pod}
    return any(
        loan.pod.uid == pod.uid and p in ("returning", "putting-back")
        for e in entries
        for loan, p in loan_phases(e, mine, True)
    ) or any(loan_state(r.loan, pod) == "returning" for r in records(pod))


# -- what a write keeps ---------------------------------------------------------------------


def to_keep(
    entries: Iterable[LedgerEntry], pods: Iterable[Pod], now: float
) -> tuple[LedgerEntry, ...]:
    """The one rule for what a write to a node keeps: the entries holding room, and
    those that :func:`owe <owes>` a loan, holding room or not. Every change below writes
    through it."""
    by_uid = {p.uid: p for p in pods}
    return tuple(e for e in entries if holds_room(e, by_uid, now) or owes(e, by_uid, now))


def claim(
    pod: Pod, entries: Sequence[LedgerEntry], pods: Sequence[Pod], now: float
) -> Literal["held", "given-back", ""]:
    """What already answers for ``pod``'s pending resize on its node: ``held``, an entry
    of the pod holding room (the worker makes it); ``given-back``, the resize is room
    given back to it (:func:`is_give_back`: taken only when free, never preempted for);
    ``""``, nothing."""
    if any(e.pod.uid == pod.uid for e in room_holders(entries, pods, now)):
        return "held"
    return "given-back" if is_give_back(pod, entries) else ""


# -- the ledger's changes (pure: a store may apply one again after a conflict) -------------


class Admitted(NamedTuple):
    """What :func:`admit` decided: the plan (``None``: not planned, the pod's resize has an
    entry holding room already) and the entry written (``None``: nothing written)."""

    plan: Plan | None
    entry: LedgerEntry | None


class Planner(Protocol):
    """Plans one resize for :func:`admit`: the admission path's for a review, the
    reconciler's for a resize the kubelet deferred (``review`` False)."""

    @property
    def pod(self) -> Pod:
        """The resizing pod, with the resize in its spec."""
        ...

    @property
    def review_uid(self) -> str: ...

    @property
    def review(self) -> bool:
        """The resize comes in an AdmissionReview, which the API server may send again
        and which supersedes the pod's earlier entries."""
        ...

    def plan(self, holders: Sequence[LedgerEntry]) -> Plan:
        """The resize planned against ``holders``, the node's entries holding room."""
        ...

    def reserves(self, plan: Plan) -> bool:
        """Whether ``plan`` takes a reservation."""
        ...

    def entry(self, plan: Plan) -> LedgerEntry:
        """The entry admitting the resize as ``plan`` has it."""
        ...


def admit(planner: Planner, pods: Sequence[Pod], now: float) -> LedgerChange[Admitted]:
    """The one write that admits ``planner.pod``'s resize on its node, as a ledger change.
    ``pods`` are the node's cached pods.

    A review sent again is answered with the entry it wrote. Otherwise the resize is
    planned against the entries holding room: for a review, the pod's own earlier entries
    are superseded and left out; for a deferred resize, an entry of the pod still holding
    room is the worker's, and nothing is planned. A give-back is never preempted for.
    The write keeps what :func:`to_keep` keeps of the rest: the one write a plan costs
    also clears what nobody reads."""
    pod = planner.pod

    def change(entries: tuple[LedgerEntry, ...]) -> tuple[tuple[LedgerEntry, ...] | None, Admitted]:
        if planner.review:
            for e in entries:
                if e.review_uid == planner.review_uid:
                    return None, Admitted(planner.plan(room_holders(entries, pods, now)), e)
            rest = tuple(e for e in entries if e.pod.uid != pod.uid or _owing(e, pods, now))
            holders = room_holders((e for e in rest if e.pod.uid != pod.uid), pods, now)
        else:
            rest = entries
            holders = room_holders(entries, pods, now)
            if any(e.pod.uid == pod.uid for e in holders):
                return None, Admitted(None, None)
        planned = planner.plan(holders)
        if planned.verdict == "preempt" and is_give_back(pod, entries):
            # A loan given back takes only room that is free: nobody is evicted or shrunk
            # for it, and if the room went meanwhile the kubelet defers it.
            return None, Admitted(planned, None)
        if not planner.reserves(planned):
            return _answered(entries, planner, planned, pods, now), Admitted(planned, None)
        new = planner.entry(planned)
        return (*to_keep(rest, pods, now), new), Admitted(planned, new)

    return change


#: The verdicts of a review that need no room taken from anyone for its resize.
_NEEDS_NO_ROOM: Final = frozenset({"fits", "not-eligible"})


def _answered(
    entries: tuple[LedgerEntry, ...], planner: Planner, plan: Plan, pods: Sequence[Pod], now: float
) -> tuple[LedgerEntry, ...] | None:
    """What a review's plan that reserves nothing writes: nothing, unless it finds room
    taken for the very same resize of its pod (an entry of that uid admitting those
    requests) and its verdict is that no room may or need be taken (``fits`` without a
    reservation, or ``not-eligible``, the preemptor policy's refusal included). The
    review, planned from the cache and the service's settings, is authoritative for its
    pod: an entry that another writer left for that resize - a replica with other
    settings, a caller that is not the API server - is removed, unless it owes a loan."""
    if not planner.review or plan.verdict not in _NEEDS_NO_ROOM:
        return None
    pod, desired = planner.pod, dict(desired_requests(planner.pod))
    stale = [
        e
        for e in entries
        if e.pod.uid == pod.uid and dict(e.desired) == desired and not _owing(e, pods, now)
    ]
    if not stale:
        return None
    return to_keep((e for e in entries if e not in stale), pods, now)


def _owing(entry: LedgerEntry, pods: Sequence[Pod], now: float) -> bool:
    return entry.lends and owes(entry, {p.uid: p for p in pods}, now)


Change = tuple[tuple[LedgerEntry, ...] | None, bool]


def _edit(
    review_uid: str,
    pods: Sequence[Pod],
    now: float,
    edit: Callable[[LedgerEntry], LedgerEntry | None],
    *,
    unchanged: bool = True,
) -> LedgerChange[bool]:
    """Change: ``edit`` the entry admitted by ``review_uid`` (``None``: drop it), the
    node's entries written through :func:`to_keep`; result: whether the entry was there
    (``unchanged`` when the edit changes nothing). Writes nothing when the entry is not
    there or the edit changes nothing."""

    def change(entries: tuple[LedgerEntry, ...]) -> Change:
        target = next((e for e in entries if e.review_uid == review_uid), None)
        if target is None:
            return None, False
        edited = edit(target)
        if edited == target:
            return None, unchanged
        others = tuple(e for e in entries if e is not target)
        kept = to_keep(others if edited is None else (*others, edited), pods, now)
        return (kept if kept != entries else None), True

    return change


def release(review_uid: str, pods: Sequence[Pod], now: float) -> LedgerChange[bool]:
    """Change: the entry admitted by ``review_uid`` holds no room and names no victims any
    more; it stays only while it owes a loan (given back from it, :func:`give_backs`)."""
    return _edit(
        review_uid,
        pods,
        now,
        lambda e: (
            replace(e, expires_at=min(e.expires_at, e.admitted_at), victims=()) if e.lends else None
        ),
    )


def drop_victims(
    review_uid: str, drop: Iterable[str], pods: Sequence[Pod], now: float
) -> LedgerChange[bool]:
    """Change: take the victims ``drop`` (uids) off the entry admitted by ``review_uid``,
    so its reservation stops claiming them."""
    gone = frozenset(drop)
    return _edit(
        review_uid,
        pods,
        now,
        lambda e: e.with_victims([v for v in e.victims if v.uid not in gone]),
    )


def refuse(review_uid: str, action: Refuse, pods: Sequence[Pod], now: float) -> LedgerChange[bool]:
    """Change: record ``action``'s refused loans, and its new plan, in the entry admitted
    by ``review_uid`` (:func:`record_refusal`); result: whether that recorded anything
    (the entry is there, and did not have them already)."""
    return _edit(review_uid, pods, now, lambda e: record_refusal(e, action), unchanged=False)


def tidy(pods: Sequence[Pod], now: float) -> LedgerChange[bool]:
    """Change: the node's entries as read, written through :func:`to_keep` whatever they
    are: a store whose reads leave some entries out (void ones) drops them from what it
    holds; result: True."""

    def change(entries: tuple[LedgerEntry, ...]) -> Change:
        return to_keep(entries, pods, now), True

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
    "disallowed",
]
WaitReason = Literal["not-persisted-yet", "node-unknown", "cannot-fit", "actuating"]


#: Which rule an entry broke (:func:`disallowed`): the label of
#: ``resize_preemption_entries_disallowed_total``.
Rule = Literal["node", "preemptor-policy", "victim-policy", "lending"]


@dataclass(frozen=True, slots=True)
class Release:
    """The entry holds nothing any more; evict nobody (more). ``write``: readers still
    count it (the pod is gone from the cache, or the plan was given up on), so the worker
    removes it from the ledger; otherwise it is left for the next write to drop."""

    reason: ReleaseReason
    detail: str
    write: bool = False
    #: For ``disallowed``: the rule the entry broke.
    rule: Rule | None = None


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


@dataclass(frozen=True, slots=True)
class Refuse:
    """The kubelet refused ``loans`` (it will not actuate them): record them in the entry
    as refused and replace the rest of its plan with ``plan``, made again without their
    lenders, within the same reservation (:func:`refuse`). ``plan`` is ``None`` when no
    plan makes room without them: the refusal is recorded and the usual rules decide on
    the next pass (wait, or release for a fresh plan). ``why`` is the kubelet's message.
    Each refused loan is put back (:func:`to_put_back`)."""

    loans: tuple[Loan, ...]
    plan: Plan | None
    why: str


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

    @property
    def lend_memory_limits(self) -> bool:
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
    #: The labels of the resizing pod's namespace (``None``: not known).
    labels: Mapping[str, str] | None = None

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
    labels: Mapping[str, str] | None = None,
) -> Action:
    """What the worker does next with ``entry``, by its :func:`phase`; pure.

    ``pod`` is the resizing pod as cached (looked up by namespace/name; ``None`` when not
    cached); ``node`` its node; ``pods`` the pods bound to ``entry.node``; ``others`` the
    node's other ledger entries (those holding room count, this entry's own does not);
    ``labels`` those of the pod's namespace (``None``: not known).

    1. released: expired, pod gone or leaving (:func:`_gone`); disallowed: the cache and
       the settings do not bear the entry out (:func:`_disallowed`);
    2. admitted: wait for the resize to persist, at most ``persist_timeout``
       (:func:`_until_persisted`);
    3. a loan the kubelet refused is recorded with a plan made again without its lender
       (:func:`_refusal`);
    4. actuated, or marked Infeasible: released (:func:`_done`);
    5. persisted: make the room (:func:`_making_room`).
    """
    held = room_holders((o for o in others if o.review_uid != entry.review_uid), pods, now)
    scene = Scene(entry, pod, node, pods, budgets, held, now, config, labels)
    now_in = phase(entry, pod, now)
    return (
        _gone(scene, now_in)
        or _disallowed(scene)
        or _until_persisted(scene, now_in)
        or _refusal(scene)
        or _done(scene, now_in)
        or _making_room(scene)
    )


def _gone(s: Scene, now_in: Phase) -> Release | None:
    """1. An expired reservation protects nothing any more; nor does one whose pod is gone,
    replaced or leaving. Only a pod the cache no longer has needs the entry removed: a
    reservation of a pod not seen is kept by every reader (the cache may lag)."""
    entry = s.entry
    if now_in.why == "expired":
        return Release("expired", f"reservation expired {s.now - entry.deadline:.1f}s ago")
    if s.pod is None:
        return Release("pod-gone", f"pod {entry.pod.key} no longer exists", write=True)
    if s.pod.uid != entry.pod.uid:
        detail = f"pod {entry.pod.key} was replaced (uid {s.pod.uid})"
        return Release("pod-gone", detail, write=True)
    if now_in.why == "pod-leaving":
        return Release("pod-gone", f"pod {entry.pod.key} is terminating or finished")
    return None


def _disallowed(s: Scene) -> Release | None:
    """1b. Whoever wrote an entry - this service, a replica with other settings, anyone
    with rights on the node's Lease - it is acted on only as the cache and this service's
    own settings allow (:func:`disallowed`); one they do not bear out is removed."""
    assert s.pod is not None  # released by _gone otherwise
    found = disallowed(s.entry, s.pod, s.pods, s.config, s.labels)
    if found is None:
        return None
    return Release("disallowed", found.detail, write=True, rule=found.rule)


class Disallowed(NamedTuple):
    rule: Rule
    detail: str


def disallowed(
    entry: LedgerEntry,
    pod: Pod,
    pods: Sequence[Pod],
    config: Config,
    labels: Mapping[str, str] | None,
) -> Disallowed | None:
    """Which rule of the settings and the cache ``entry`` breaks for ``pod`` (its
    resizing pod as cached) on its node, whose cached pods are ``pods``; ``None`` when
    none. Judged before every step, so a setting changed since the admission, or an
    entry this service never wrote, takes nothing:

    - ``node``: the pod runs on the entry's node;
    - ``preemptor-policy``: an entry taking from others (victims, loans to make) is the
      preemptor policy's to allow (namespace selector, minimum priority);
    - ``victim-policy``: no pending victim or lender is one the victim policy keeps out
      (a protected namespace);
    - ``lending``: lending is on, and every loan still to make is one the lender's
      floors allow (:func:`~webhook.core.lending.unlendable`).

    That the resize is the pod's persisted one is :func:`phase`'s to say."""
    if pod.node != entry.node:
        return Disallowed(
            "node", f"pod {pod.key} runs on {pod.node or 'no node'}, not {entry.node}"
        )
    by_uid = {p.uid: p for p in pods}
    to_lend = pending(entry, pods)
    refs = (*entry.pending_victims, *(loan.pod for loan in to_lend))
    taken = [p for p in (by_uid.get(r.uid) for r in refs) if p is not None and not p.leaving]
    if taken and (refusal := config.preemptors().refusal(pod, labels)):
        return Disallowed("preemptor-policy", refusal)
    policy = config.policy()
    for p in taken:
        if not policy.may_preempt(p, pod):
            return Disallowed("victim-policy", f"{p.key} may not give up room for {pod.key}")
    if to_lend and not policy.lending:
        return Disallowed("lending", "lending is off")
    for loan in to_lend:
        why = unlendable(loan, by_uid.get(loan.pod.uid), pod, limits=policy.lend_memory_limits)
        if why:
            return Disallowed("lending", why)
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


def _refusal(s: Scene) -> Refuse | None:
    """3. Loans of the entry the kubelet refused (:func:`webhook.core.lending.refused`: a
    memory limit below what the container uses), with the plan made again without their
    lenders - every candidate may go and any other lender lend, the refused lender
    counted at what it is owed and the borrower at nothing. Checked before anything else
    once the resize is persisted: once recorded, each is put back whatever happens next."""
    entry = s.entry
    if not entry.loans:
        return None
    cached = {p.uid: p for p in s.pods}
    refusing = tuple(loan for loan in entry.loans if refused(loan, cached.get(loan.pod.uid)))
    if not refusing:
        return None
    why = cached[refusing[0].pod.uid].resize_error
    if s.node is None:
        return Refuse(refusing, None, why)
    gone = {loan_key(loan) for loan in refusing}
    rest = replace(entry, loans=tuple(lo for lo in entry.loans if loan_key(lo) not in gone))
    plan = replan(replace(s, entry=rest), refusing, listed=False)
    keep = plan if plan.verdict in ("fits", "preempt") and plan.code != "no-growth" else None
    return Refuse(refusing, keep, why)


def record_refusal(entry: LedgerEntry, action: Refuse) -> LedgerEntry:
    """``entry`` with ``action``'s loans refused and, when it has a plan, that plan in
    place of the rest: its victims after the ones already handled, its loans after the
    ones kept. The same entry when recorded already."""
    keys = {loan_key(loan) for loan in action.loans}
    known = {loan_key(loan) for loan in entry.refused}
    if keys <= known:
        return entry
    kept = tuple(loan for loan in entry.loans if loan_key(loan) not in keys)
    refusals = entry.refused + tuple(loan for loan in action.loans if loan_key(loan) not in known)
    if action.plan is None:
        return replace(entry, loans=kept, refused=refusals)
    handled = tuple(v for v in entry.victims if v.uid in entry.handled)
    victims = handled + tuple(v.pod for v in action.plan.victims if v.pod.uid not in entry.handled)
    return replace(entry, loans=kept + action.plan.loans, refused=refusals, victims=victims)


def _done(s: Scene, now_in: Phase) -> Release | Wait | None:
    """4. Done, or the kubelet will never do it. A resize the kubelet actuated on a loan
    it then refused is not done while that lender waits for its room back: the entry
    makes that room, as it made the borrower's."""
    if now_in.state == "actuated" and not (
        s.entry.refused and owes_lender(s.entry, {p.uid: p for p in s.pods})
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
    lend = pending(s.entry, s.pods)
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
    node's pods as the ledger's loans leave them (:func:`as_lent`).
    ``listed``: only the entry's own live pending victims may go and nothing more is
    borrowed; otherwise any candidate may, and any lender lend (a plan made again after a
    refusal, ``refusing`` the loans refused)."""
    assert s.pod is not None and s.node is not None
    handled = s.handled()
    pods = tuple(
        replace(p, terminating=True) if p.uid in handled and not p.terminating else p
        for p in s.pods
    )
    pods = as_lent(pods, s.entry, s.others, refusing)
    old = borrower(s.pod, s.entry, s.pods, refusing)
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


# -- the pods as the loans leave them (a re-plan's view) -------------------------------------


def with_loans(pods: Sequence[Pod], loans: Iterable[Loan]) -> tuple[Pod, ...]:
    """``pods`` with every loan not void counted as actuated: the room it frees is
    spoken for by the resize that borrowed it, as a claimed victim's is."""
    by_lender = loans_by_lender(loans)
    out = []
    for p in pods:
        for loan in by_lender.get(p.uid, ()):
            state = loan_state(loan, p)
            if state != "void":
                request = p.container(loan.container)
                amount = loan.after
                if state == "lent" and request is not None:
                    amount = request.requests.get(loan.resource)
                p = lowered(p, loan.container, loan.resource, amount)
        out.append(p)
    return tuple(out)


def as_lent(
    pods: Sequence[Pod],
    entry: LedgerEntry,
    others: Sequence[LedgerEntry],
    refusing: tuple[Loan, ...] = (),
) -> tuple[Pod, ...]:
    """The node's ``pods`` as a re-plan of ``entry`` sees them: every loan of the node's
    entries not void counted as made (so none is planned twice), and the lenders of
    refused loans (the entry's and ``refusing``) counted at what they are owed, lending
    nothing. Without any loan, ``pods`` as they are."""
    refusals = entry.refused + refusing
    if not refusals and not entry.loans and not any(o.loans for o in others):
        return tuple(pods)
    view = with_loans(pods, (loan for e in (entry, *others) for loan in e.loans))
    view = owed_back(view, refusals)
    lenders = frozenset(loan.pod.uid for loan in refusals)
    return tuple(replace(p, floors=()) if p.uid in lenders and p.floors else p for p in view)


def borrower(
    pod: Pod, entry: LedgerEntry, pods: Sequence[Pod], refusing: tuple[Loan, ...] = ()
) -> Pod:
    """The resizing ``pod`` as a re-plan counts it: as if it held nothing yet while a
    refused lender is owed room (the kubelet may have admitted it on that loan: it holds
    room that is not there), else as cached."""
    if not refusing and not (entry.refused and owes_lender(entry, {p.uid: p for p in pods})):
        return pod
    return replace(
        pod.with_containers(
            tuple(replace(c, requests=ZERO) for c in pod.containers),
            tuple(replace(c, requests=ZERO) for c in pod.init_containers),
        ),
        statuses={},
        pod_allocated=None,
        pod_actual=None,
        pod_requests=ZERO,
        overhead=ZERO,
    )


# -- giving back ----------------------------------------------------------------------------

#: The review uid of the stand-in entry of an orphan loan (:func:`orphans`).
ORPHAN_PREFIX = "orphan/"


def orphans(entries: Sequence[LedgerEntry], pods: Sequence[Pod]) -> tuple[LedgerEntry, ...]:
    """The loans ``pods`` record having made that no entry of ``entries`` holds (made or
    refused): the ledger lost their entry. Each as a stand-in entry that holds no room
    (expired at the loan's time), borrowed by the pod the record names, so that it is
    given back, or its record removed, by the same rules as any loan."""
    held = {loan_key(loan) for e in entries for loan in (*e.loans, *e.refused)}
    return tuple(
        LedgerEntry(
            pod=r.borrower,
            node=lender.node,
            review_uid=f"{ORPHAN_PREFIX}{lender.uid}/{i}",
            resources=ZERO,
            desired=(),
            victims=(),
            admitted_at=r.at,
            expires_at=r.at,
            loans=(r.loan,),
        )
        for lender in pods
        for i, r in enumerate(records(lender))
        if loan_key(r.loan) not in held
    )


def ended_records(
    entries: Sequence[LedgerEntry], pods: Sequence[Pod], now: float
) -> dict[PodRef, tuple[LoanRecord, ...]]:
    """The records to remove from each lender among ``pods``: those whose loan has ended
    (the lender back at its size before and allocated so, or void) and that no entry
    holding room may still make. A record whose loan is lent, due or returning stays
    until the kubelet holds the lender at its size again."""
    held = {loan_key(loan) for e in room_holders(entries, pods, now) for loan in e.loans}
    out: dict[PodRef, tuple[LoanRecord, ...]] = {}
    for lender in pods:
        done = tuple(
            r
            for r in records(lender)
            if loan_key(r.loan) not in held
            and loan_phase(r.loan, lender, refused=False, holding=False) == "ended"
        )
        if done:
            out[lender.ref] = done
    return out


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Return ``loan`` (its lender to ``loan.before``) for the entry ``review_uid``,
    whose resizing pod is ``borrower``."""

    review_uid: str
    borrower: PodRef
    loan: Loan


def give_backs(
    node: Node,
    pods: Sequence[Pod],
    entries: Sequence[LedgerEntry],
    now: float,
) -> tuple[GiveBack, ...]:
    """The loans on ``node`` to return now, in order; ``pods`` are the node's cached
    pods, ``entries`` its ledger entries (orphan loans are found among the pods'
    records, :func:`orphans`). Same arguments, same answer.

    A loan is returned once it is ``due`` (its entry holds no room any more: the
    borrower's resize was actuated, the borrower is gone, or its plan was given up on),
    and only if the node has room for it *after* every active reservation and every
    pending growth of a pod of higher or equal priority than the lender: a give-back
    takes only room nobody more important waits for, so it never makes the webhook evict
    or shrink anyone. Most important lender first, each return counted before the next
    is judged. A container lent twice gets the later loan back first (only a loan whose
    ``after`` is the lender's request now is due), so each give-back restores exactly one
    loan's ``before``. A lender whose loan the kubelet refused counts at the loan's
    ``before`` until it holds it again: nothing is given back into that room."""
    holders = room_holders(entries, pods, now)
    by_uid = {p.uid: p for p in pods}
    view = {p.uid: p for p in owed_back(pods, (loan for e in entries for loan in e.refused))}
    out = []
    for give in _due((*entries, *orphans(entries, pods)), by_uid, holders, now):
        loan = give.loan
        returned = lowered(view[loan.pod.uid], loan.container, loan.resource, loan.before)
        trial = {**view, loan.pod.uid: returned}
        if _fits(node, trial.values(), holders, now, view[loan.pod.uid].priority):
            view = trial
            out.append(give)
    return tuple(out)


def _due(
    entries: Sequence[LedgerEntry],
    by_uid: dict[str, Pod],
    holders: Sequence[LedgerEntry],
    now: float,
) -> list[GiveBack]:
    holding = {e.review_uid for e in holders}
    due: dict[LoanKey, GiveBack] = {}
    for entry in entries:
        if entry.review_uid in holding:
            continue  # the borrower still needs the room
        for loan in entry.loans:
            lender = by_uid.get(loan.pod.uid)
            if loan_phase(loan, lender, refused=False, holding=False) != "due":
                continue
            assert lender is not None
            container = lender.container(loan.container)
            if container is None or container.requests.get(loan.resource) != loan.after:
                continue  # lent again since, from what this loan left: that one first
            if not recorded(loan, lender):
                continue  # never made by the service: nothing to give back
            due.setdefault(loan_key(loan), GiveBack(entry.review_uid, entry.pod, loan))
    return sorted(
        due.values(),
        key=lambda g: (importance_key(by_uid[g.loan.pod.uid], now), loan_key(g.loan)),
    )


def _fits(
    node: Node, pods: Iterable[Pod], entries: Sequence[LedgerEntry], now: float, priority: int
) -> bool:
    """Whether ``pods`` fit ``node`` with every active reservation, and every pod of
    ``priority`` or more counted at its desired size (its pending growth first)."""

    def holds(pod: Pod) -> Resources:
        if pod.priority < priority:
            return pod_requests(pod)
        return pod_requests(pod, "infeasible" if pod.resize == "infeasible" else "resizing")

    reservations = active_on([e.reservation() for e in entries], node.name, now)
    counted = holdings(node, pods, holds)
    usage = node_usage(node, counted.pods.values(), reservations, exclude_uid="", kept=counted)
    return usage.in_use.fits_in(node.allocatable)


__all__ = [
    "HOLDS_ROOM",
    "ORPHAN_PREFIX",
    "OWED",
    "OWED_REFUSED",
    "Act",
    "Action",
    "Admitted",
    "GiveBack",
    "ListedOnly",
    "LoanPhase",
    "Phase",
    "Planner",
    "Refuse",
    "Release",
    "ReleaseReason",
    "Scene",
    "State",
    "Wait",
    "WaitReason",
    "admit",
    "as_lent",
    "borrower",
    "claim",
    "drop_victims",
    "ended_records",
    "give_backs",
    "holds_room",
    "is_give_back",
    "loan_phase",
    "loan_phases",
    "next_action",
    "orphans",
    "owes",
    "owes_lender",
    "pending",
    "persisted",
    "phase",
    "record_refusal",
    "refuse",
    "release",
    "replan",
    "room_holders",
    "tidy",
    "to_keep",
    "to_put_back",
    "wanted",
    "with_loans",
]
