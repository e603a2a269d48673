"""What state an admitted resize and each of its loans is in, and what a write keeps.

An admitted resize is one ledger entry. Its state is never written: it is read from the
entry, the resizing pod as the cache shows it, and the time, by one function,
:func:`entry_phase`. Every reader asks it: the admission path and the reconciler (which entries
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
* **persisted**: the entry holds room and the worker makes it: it lends, then evicts.
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
  for it and nobody more important waits for that room.
* **returning**: given back, the kubelet has not actuated it yet: never preempted for.
* **refused**: the kubelet will not actuate it (a memory limit below the usage): the plan
  is made again without the lender, and the lender put back. **putting-back**: back at
  ``before`` in its spec, not yet in its allocation: the entry makes that room.
* **ended**: returned, put back, or void (the lender gone, or its owner set another size).

**The keep rule** (:func:`to_keep`): a write keeps the entries holding room and the
entries owing a loan (lent, due, returning; refused or putting-back until the entry
expires), and drops the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Literal, NamedTuple

from webhook.core.lending import (
    Loan,
    loan_state,
    recorded,
    records,
    refusal_state,
)
from webhook.core.model import Pod
from webhook.core.resources import Resources
from webhook.engine.ledger import LedgerEntry

EntryState = Literal["admitted", "persisted", "actuated", "released"]
#: States in which an entry holds room on its node: every plan counts it.
HOLDS_ROOM: frozenset[EntryState] = frozenset({"admitted", "persisted"})

Why = Literal[
    "unseen",
    "replaced",
    "not-persisted-yet",
    "persisted",
    "actuated",
    "expired",
    "pod-leaving",
    "superseded",
    "not-persisted",
    "infeasible-resize",
]


class EntryPhase(NamedTuple):
    """An entry's state, and why it is in it."""

    state: EntryState
    why: Why


def entry_phase(entry: LedgerEntry, pod: Pod | None, now: float) -> EntryPhase:
    """The state of ``entry`` given its pod as cached (``None``: not cached) at ``now``:
    the one transition function of an admitted resize (the module's docstring says why
    each transition happens). Stable: once released, a later resize of the pod raises its
    generation past the entry's (or comes after ``persist_by``), so it never holds room
    again."""
    if entry.deadline <= now:
        return EntryPhase("released", "expired")
    if pod is None:
        return EntryPhase("admitted", "unseen")
    if pod.uid != entry.pod.uid:
        return EntryPhase("admitted", "replaced")
    if pod.leaving:
        return EntryPhase("released", "pod-leaving")
    if not persisted(entry, pod):
        # The generation tells a superseded spec apart at once (the spec alone cannot:
        # before persisting it differs too).
        if entry.generation and pod.generation > entry.generation:
            return EntryPhase("released", "superseded")
        if entry.persist_by and now >= entry.persist_deadline:
            return EntryPhase("released", "not-persisted")
        return EntryPhase("admitted", "not-persisted-yet")
    if _allocated(entry.desired, pod):
        return EntryPhase("actuated", "actuated")
    if pod.resize == "infeasible":
        return EntryPhase("released", "infeasible-resize")
    return EntryPhase("persisted", "persisted")


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
    return entry_phase(entry, pods.get(entry.pod.uid), now).state in HOLDS_ROOM


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
        return refusal_state(loan, lender)
    state = loan_state(loan, lender)
    if state == "lent":
        return "lent" if holding else "due"
    if state == "to-lend":
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


def to_lend(entry: LedgerEntry, pods: Sequence[Pod]) -> tuple[Loan, ...]:
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


def answered_by(
    pod: Pod, entries: Sequence[LedgerEntry], pods: Sequence[Pod], now: float
) -> Literal["held", "given-back", ""]:
    """What already answers for ``pod``'s pending resize on its node: ``held``, an entry
    of the pod holding room (the worker makes it); ``given-back``, the resize is room
    given back to it (:func:`is_give_back`: taken only when free, never preempted for);
    ``""``, nothing."""
    if any(e.pod.uid == pod.uid for e in room_holders(entries, pods, now)):
        return "held"
    return "given-back" if is_give_back(pod, entries) else ""
