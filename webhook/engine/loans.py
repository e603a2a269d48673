"""Loans over an admitted resize's life: the one place the engine meets lending.

:mod:`webhook.core.lending` is the arithmetic: what a lender frees at its floors, loans
sized on the kubelet's model, and where a loan stands, read from its lender. This module
is what the ledger's loans mean to an admitted resize (:mod:`webhook.engine.lifecycle`
calls it at its making-room step, and where it decides what a write keeps):

* **owed**: an entry owes a loan while the loan is not given back, or while a lender
  whose loan the kubelet refused waits for its room (:func:`owes`); writes keep it;
* **seen by a re-plan**: every loan not void counts as made, refused lenders count at
  what they are owed and lend nothing (:func:`as_lent`, :func:`borrower`);
* **made**: the entry's pending loans, in the order taken (:func:`pending`);
* **refused**: recorded with a plan made again without the lender (:func:`refusal`,
  :func:`record_refusal`) and put back (:func:`to_put_back`);
* **given back**: once the entry holds no room, when nobody more important waits for it
  (:func:`give_backs`); a pending resize that is one is never preempted for
  (:func:`is_give_back`);
* **what they free now**, for the metrics (:func:`lent_on`);
* **carried out** for the worker by :class:`Lending`, through a :class:`LenderResizer`
  (``pods/resize`` on the lender). Everything else here is pure.

A loan is known by one key (:func:`key`), and lenders are ranked by the core's
importance order (:func:`webhook.core.policy.importance_key`). See docs/lending.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from webhook.core.accounting import active_on, holdings, node_usage, pod_requests
from webhook.core.lending import (
    Loan,
    loan_state,
    loans_by_lender,
    lowered,
    owed_back,
    refusal_state,
    refused,
)
from webhook.core.model import Node, Pod, PodRef
from webhook.core.plan import Plan
from webhook.core.policy import importance_key
from webhook.core.resources import ZERO, Resources
from webhook.engine.ledger import ClusterView, Ledger, LedgerChange, LedgerEntry
from webhook.engine.loop import KeyedBackoff
from webhook.engine.metrics import RESOURCE_UNITS, Metrics, in_base_unit

if TYPE_CHECKING:
    from webhook.engine.lifecycle import Scene

LoanKey = tuple[str, str, str, int, int]

log = logging.getLogger(__name__)


def key(loan: Loan) -> LoanKey:
    """The one identity of a loan: its lender's uid, container, resource, ``before`` and
    ``after``. A container lent twice has two loans, the second from what the first left."""
    return (loan.pod.uid, loan.container, loan.resource, loan.before, loan.after)


# -- made by the cluster ------------------------------------------------------------------


class LoanResult(StrEnum):
    """What happened to one loan. All but ``failed`` are final."""

    #: The lender's spec was changed (``pods/resize``): lowered, or raised back.
    LENT = "lent"
    #: The lender already asks for at most the loan's ``after``: nothing to do.
    DONE = "done"
    #: The lender is gone, replaced or leaving, or its owner changed the amount since the
    #: plan (its spec wins): the loan is void.
    VOID = "void"
    FAILED = "failed"

    @property
    def done(self) -> bool:
        return self is not LoanResult.FAILED


class LenderResizer(Protocol):
    """Lowers a lender's container as ``loan`` says, idempotently, through
    ``pods/resize``; never raises (API failures are ``failed``). Only a lender still
    asking for the loan's ``before`` is lowered, and only to its ``after`` (and its limit
    too when ``loan.limits``)."""

    def lend(self, loan: Loan, borrower: PodRef, node: str) -> LoanResult: ...

    def give_back(self, loan: Loan, borrower: PodRef, node: str) -> LoanResult:
        """The lender back from the loan's ``after`` to its ``before`` (``lent``: patched;
        ``done``: at ``before`` already; ``void``: at another amount, or gone)."""
        ...

    def put_back(self, loan: Loan, borrower: PodRef, node: str, why: str) -> LoanResult:
        """Undo a loan the kubelet refused (``why``: its message): the lender back to
        ``before`` while it asks for at most ``after``; a warning event on it."""
        ...


# -- owed -----------------------------------------------------------------------------------


def owes_lender(entry: LedgerEntry, pods: Mapping[str, Pod]) -> bool:
    """Whether a lender whose loan the kubelet refused is not back at its own spec yet,
    judged on the cached ``pods`` of the node by uid: the entry makes that room."""
    return any(refusal_state(loan, pods.get(loan.pod.uid)) != "ended" for loan in entry.refused)


def owes(entry: LedgerEntry, pods: Mapping[str, Pod], now: float) -> bool:
    """Whether ``entry`` owes a loan, holding room or not: one lent or returning
    (:func:`~webhook.core.lending.loan_state`), or, until the entry expires, a refused
    lender owed its room (the borrower may hold it already)."""
    if not entry.loans and not entry.refused:
        return False
    return any(
        loan_state(loan, pods.get(loan.pod.uid)) in ("lent", "returning") for loan in entry.loans
    ) or (entry.expires_at > now and owes_lender(entry, pods))


def debtors(
    entries: Iterable[LedgerEntry], pods: Iterable[Pod], now: float
) -> tuple[LedgerEntry, ...]:
    """The entries among ``entries`` that :func:`owe <owes>` a loan, holding room or not."""
    lending = tuple(e for e in entries if e.loans or e.refused)
    if not lending:
        return ()  # most entries borrowed nothing: the pods need no index
    by_uid = {p.uid: p for p in pods}
    return tuple(e for e in lending if owes(e, by_uid, now))


def is_give_back(pod: Pod, entries: Sequence[LedgerEntry]) -> bool:
    """Whether ``pod``'s pending resize is a loan given back (its spec at a loan's
    ``before``, not actuated yet), or a refused loan put back, not a resize its owner
    made. Nobody is preempted for either: a give-back takes only free room, and the room a
    refused lender is owed is made by the entry that borrowed it."""
    return any(
        loan.pod.uid == pod.uid and loan_state(loan, pod) == "returning"
        for e in entries
        for loan in e.loans
    ) or any(
        loan.pod.uid == pod.uid and refusal_state(loan, pod) == "restoring"
        for e in entries
        for loan in e.refused
    )


# -- seen by a re-plan ----------------------------------------------------------------------


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


# -- made, refused, put back ----------------------------------------------------------------


def pending(entry: LedgerEntry, pods: Sequence[Pod]) -> tuple[Loan, ...]:
    """The entry's loans still to make (the lender's spec still at ``before``, allocated
    or not), in the order taken."""
    if not entry.loans:
        return ()
    by_uid = {p.uid: p for p in pods}
    return tuple(
        loan
        for loan in entry.loans
        if loan_state(loan, by_uid.get(loan.pod.uid)) in ("pending", "returning")
    )


@dataclass(frozen=True, slots=True)
class Refuse:
    """The kubelet refused ``loans`` (it will not actuate them): record them in the entry
    as refused and replace the rest of its plan with ``plan``, made again without their
    lenders, within the same reservation (:func:`record_refusal`). ``plan`` is ``None``
    when no plan makes room without them: the refusal is recorded and the usual rules
    decide on the next pass (wait, or release for a fresh plan). ``why`` is the kubelet's
    message. Each refused loan is put back (:func:`to_put_back`)."""

    loans: tuple[Loan, ...]
    plan: Plan | None
    why: str


def refusal(scene: Scene, replan: Callable[..., Plan]) -> Refuse | None:
    """Loans of the entry the kubelet refused (:func:`webhook.core.lending.refused`: a
    memory limit below what the container uses), with the plan made again without their
    lenders by ``replan`` - every candidate may go and any other lender lend, the refused
    lender counted at what it is owed and the borrower at nothing. Checked before anything
    else once the resize is persisted: once recorded, each is put back whatever happens
    next. ``None`` when the kubelet refused none."""
    entry = scene.entry
    if not entry.loans:
        return None
    cached = {p.uid: p for p in scene.pods}
    refusing = tuple(loan for loan in entry.loans if refused(loan, cached.get(loan.pod.uid)))
    if not refusing:
        return None
    why = cached[refusing[0].pod.uid].resize_error
    if scene.node is None:
        return Refuse(refusing, None, why)
    gone = {key(loan) for loan in refusing}
    rest = replace(entry, loans=tuple(lo for lo in entry.loans if key(lo) not in gone))
    plan = replan(replace(scene, entry=rest), refusing, listed=False)
    keep = plan if plan.verdict in ("fits", "preempt") and plan.code != "no-growth" else None
    return Refuse(refusing, keep, why)


def record_refusal(entry: LedgerEntry, action: Refuse) -> LedgerEntry:
    """``entry`` with ``action``'s loans refused and, when it has a plan, that plan in
    place of the rest: its victims after the ones already handled, its loans after the
    ones kept. Pure: a store may apply it again after a conflict."""
    keys = {key(loan) for loan in action.loans}
    known = {key(loan) for loan in entry.refused}
    if keys <= known:
        return entry  # recorded already
    kept = tuple(loan for loan in entry.loans if key(loan) not in keys)
    refusals = entry.refused + tuple(loan for loan in action.loans if key(loan) not in known)
    if action.plan is None:
        return replace(entry, loans=kept, refused=refusals)
    handled = tuple(v for v in entry.victims if v.uid in entry.handled)
    victims = handled + tuple(v.pod for v in action.plan.victims if v.pod.uid not in entry.handled)
    return replace(entry, loans=kept + action.plan.loans, refused=refusals, victims=victims)


def to_put_back(entry: LedgerEntry, pods: Sequence[Pod]) -> tuple[Loan, ...]:
    """The entry's refused loans whose lender still asks for the loan's ``after``: to be
    put back to ``before``, whatever else the entry does."""
    by_uid = {p.uid: p for p in pods}
    return tuple(
        loan for loan in entry.refused if refusal_state(loan, by_uid.get(loan.pod.uid)) == "undo"
    )


# -- given back -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Return ``loan`` (its lender to ``loan.before``) for the entry ``review_uid``."""

    review_uid: str
    loan: Loan


def give_backs(
    node: Node,
    pods: Sequence[Pod],
    entries: Sequence[LedgerEntry],
    now: float,
) -> tuple[GiveBack, ...]:
    """The loans on ``node`` to return now, in order; ``pods`` are the node's cached
    pods, ``entries`` its ledger entries. Same arguments, same answer.

    A loan is returned once its entry holds no room any more (the borrower's resize was
    actuated, the borrower is gone, or its plan was given up on), and only if the node has
    room for it *after* every active reservation and every pending growth of a pod of
    higher or equal priority than the lender: a give-back takes only room nobody more
    important waits for, so it never makes the webhook evict or shrink anyone. Most
    important lender first, each return counted before the next is judged. A container
    lent twice gets the later loan back first (only a loan whose ``after`` is the lender's
    request now is due), so each give-back restores exactly one loan's ``before``. A
    lender whose loan the kubelet refused counts at the loan's ``before`` until it holds
    it again: nothing is given back into that room. Ended loans need nothing
    (:func:`~webhook.core.lending.loan_state`)."""
    # Imported here: the lifecycle calls this module at its making-room step.
    from webhook.engine.lifecycle import room_holders

    holders = room_holders(entries, pods, now)
    by_uid = {p.uid: p for p in pods}
    view = {p.uid: p for p in owed_back(pods, (loan for e in entries for loan in e.refused))}
    out = []
    for give in _due(entries, by_uid, {e.review_uid for e in holders}, now):
        loan = give.loan
        returned = lowered(view[loan.pod.uid], loan.container, loan.resource, loan.before)
        trial = {**view, loan.pod.uid: returned}
        if _fits(node, trial.values(), holders, now, loan.priority):
            view = trial
            out.append(give)
    return tuple(out)


def _due(
    entries: Sequence[LedgerEntry], by_uid: dict[str, Pod], holders: set[str], now: float
) -> list[GiveBack]:
    due: dict[LoanKey, GiveBack] = {}
    for entry in entries:
        if entry.review_uid in holders:
            continue  # the borrower still needs the room
        for loan in entry.loans:
            lender = by_uid.get(loan.pod.uid)
            if lender is None or loan_state(loan, lender) != "lent":
                continue
            container = lender.container(loan.container)
            if container is None or container.requests.get(loan.resource) != loan.after:
                continue  # lent again since, from what this loan left: that one first
            due.setdefault(key(loan), GiveBack(entry.review_uid, loan))
    return sorted(
        due.values(),
        key=lambda g: (importance_key(by_uid[g.loan.pod.uid], now), key(g.loan)),
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


# -- what they free now ---------------------------------------------------------------------


def lent_on(
    entries: Iterable[LedgerEntry], pods: Iterable[Pod]
) -> tuple[dict[str, int], float | None]:
    """What the loans of one node's ``entries`` the cached ``pods`` show made free
    together, by resource, and when the oldest entry with a loan made was admitted."""
    lent = {"cpu": 0, "memory": 0}
    lending = tuple(e for e in entries if e.loans)
    if not lending:
        return lent, None  # most nodes lend nothing: their pods need no index
    by_uid = {p.uid: p for p in pods}
    seen: set[LoanKey] = set()
    oldest: float | None = None
    for entry in lending:
        made = [x for x in entry.loans if loan_state(x, by_uid.get(x.pod.uid)) == "lent"]
        for loan in made:
            if key(loan) not in seen:
                seen.add(key(loan))
                lent[loan.resource] += loan.frees
        if made:
            oldest = entry.admitted_at if oldest is None else min(oldest, entry.admitted_at)
    return lent, oldest


# -- carried out, for the worker --------------------------------------------------------------


def refuse_entry(review_uid: str, action: Refuse) -> LedgerChange[bool]:
    """Change: record ``action``'s refused loans, and its new plan, in the entry admitted
    by ``review_uid`` (:func:`record_refusal`); result: whether that recorded anything
    (the entry is there, and did not have them already)."""

    def change(entries: tuple[LedgerEntry, ...]) -> tuple[tuple[LedgerEntry, ...] | None, bool]:
        out = tuple(record_refusal(e, action) if e.review_uid == review_uid else e for e in entries)
        return (out, True) if out != entries else (None, False)

    return change


class Lending:
    """What the worker does with the ledger's loans, through ``resizer``: makes an entry's
    pending loans before its evictions, records a refusal and puts the lenders back, gives
    loans back, and counts what they free. Without a ``resizer`` no loan is made (nor are
    the victims chosen to go with one evicted).

    ``may_act`` is asked before every call to the API server; a failure backs the entry
    off in ``backoff``; ``wake`` asks the worker for another pass.

    Guarantees: it never lends twice: a loan is made only while its lender still asks
    for the loan's ``before`` as the cache holds it, and the resizer's patch carries that
    copy's uid and resourceVersion as preconditions (a copy the lender has moved on from
    fails, and is judged again when the cache has caught up); a lender at or below
    ``after`` has lent, and one whose owner changed it owes nothing. A loan the kubelet
    refused is recorded (one write), put back (the lender's spec from the loan's
    ``after`` to its ``before``, with the same preconditions) and counted once in
    ``resize_preemption_loans_total{result="refused"}``."""

    def __init__(
        self,
        cluster: ClusterView,
        ledger: Ledger,
        metrics: Metrics,
        clock: Callable[[], float],
        resizer: LenderResizer | None,
        *,
        may_act: Callable[[], bool],
        backoff: KeyedBackoff,
        wake: Callable[[], None],
    ) -> None:
        self.cluster = cluster
        self.ledger = ledger
        self.metrics = metrics
        self.clock = clock
        self.resizer = resizer
        self.may_act = may_act
        self.backoff = backoff
        self.wake = wake
        #: Nodes whose ``resize_preemption_lent_resources`` was set by the last count.
        self._lent_nodes: set[str] = set()

    def count(self, groups: Mapping[str, Sequence[LedgerEntry]], now: float) -> None:
        """``resize_preemption_lent_resources``: what the loans the ledger records and the
        cache shows made free, per node and resource, of ``groups``: the entries that
        lend, by node (0 on a node that had such entries and has none now);
        ``resize_preemption_oldest_loan_age_seconds``: how long ago the oldest entry with a
        loan still out was admitted (a loan is made right after its admission)."""
        oldest: float | None = None
        for node in self._lent_nodes - set(groups):
            for resource in ("cpu", "memory"):
                self.metrics.lent.labels(node, resource, RESOURCE_UNITS[resource][0]).set(0)
        self._lent_nodes = set(groups)
        for node, entries in groups.items():
            lent, since = lent_on(entries, self.cluster.pods_on(node))
            if since is not None:
                oldest = since if oldest is None else min(oldest, since)
            for resource, amount in lent.items():
                unit, value = in_base_unit(resource, amount)
                self.metrics.lent.labels(node, resource, unit).set(value)
        self.metrics.oldest_loan_age.set(0.0 if oldest is None else max(0.0, now - oldest))

    def stop(self) -> None:
        """A replica that no longer leads tells nothing of the loans out."""
        self.metrics.oldest_loan_age.set(0.0)

    def lend(self, entry: LedgerEntry, loans: Sequence[Loan], stop: threading.Event) -> bool:
        """Make ``loans`` of ``entry`` in order; whether all are done (made, or owed no
        more), so that the evictions may follow."""
        if self.resizer is None:
            log.warning("resize of %s needs loans and nothing can make them", entry.pod.key)
            self.backoff.failed(entry.review_uid)
            return False
        for loan in loans:
            if stop.is_set() or not self.may_act():
                return False
            current = next(
                (e for e in self.ledger.entries(entry.node) if e.review_uid == entry.review_uid),
                None,
            )
            if current is None:
                return False  # released meanwhile: nobody needs the room any more
            result = self.resizer.lend(loan, entry.pod, entry.node)
            if result is LoanResult.VOID:
                # The lender changed since the decision: decide again before evicting.
                self.wake()
                return False
            if not result.done:
                log.info(
                    "lending from %s for %s failed; retrying later", loan.pod.key, entry.pod.key
                )
                self.backoff.failed(entry.review_uid)
                return False
        self.backoff.succeeded(entry.review_uid)
        return True

    def refuse(self, entry: LedgerEntry, action: Refuse) -> None:
        """Record the refusal and the new plan in one ledger write, then put the lenders
        back; the next pass carries the new plan out. The write comes first: a lender put
        back before it would look like a loan still to make."""
        if not self.ledger.update(entry.node, refuse_entry(entry.review_uid, action)):
            return  # gone meanwhile, or recorded already (counted then)
        for loan in action.loans:
            self.metrics.loans.labels("refused").inc()
            log.info(
                "the kubelet refused the loan of %s %s from %s to %s: %s; %s",
                loan.resource,
                loan.pod.key,
                loan.before,
                entry.pod.key,
                action.why,
                "planned again without it"
                if action.plan is not None
                else "no plan makes room without it",
            )
        self.put_back(record_refusal(entry, action), action.why)
        self.wake()

    def put_back(self, entry: LedgerEntry, why: str = "") -> None:
        """Put back the entry's refused loans whose lender still asks for the loan's
        ``after``; a failure backs the entry off (tried again on a later pass). Called for
        every entry whatever it does next (also after a restart between recording a
        refusal and putting the lender back)."""
        if not entry.refused or self.resizer is None:
            return
        pods = tuple(self.cluster.pods_on(entry.node))
        errors = {p.uid: p.resize_error for p in pods}
        for loan in to_put_back(entry, pods):
            if not self.may_act():
                return
            reason = why or errors.get(loan.pod.uid) or "the kubelet could not actuate it"
            if self.resizer.put_back(loan, entry.pod, entry.node, reason) is LoanResult.FAILED:
                self.backoff.failed(entry.review_uid)
                return

    def give_back(self, entries: Sequence[LedgerEntry], stop: threading.Event) -> int:
        """Return the loans on the node of ``entries`` the node has room for now
        (:func:`give_backs`); how many were returned. Nothing is written: a loan given
        back is read from the lender (its spec at ``before``), and the next write to the
        node drops the entry once the kubelet actuated it. An error is logged and counted;
        the next pass tries again."""
        if not any(e.loans for e in entries):
            return 0
        node_name = entries[0].node
        try:
            return self._give_back(node_name, stop)
        except Exception:
            self.metrics.errors.labels("worker").inc()
            log.exception("giving loans back on %s failed", node_name)
            return 0

    def _give_back(self, node_name: str, stop: threading.Event) -> int:
        node = self.cluster.node(node_name)
        if node is None or self.resizer is None:
            return 0
        entries = self.ledger.entries(node_name)
        done = 0
        for give in give_backs(node, tuple(self.cluster.pods_on(node_name)), entries, self.clock()):
            if stop.is_set() or not self.may_act():
                break
            borrower = next(e.pod for e in entries if e.review_uid == give.review_uid)
            result = self.resizer.give_back(give.loan, borrower, node_name)
            if result is LoanResult.FAILED:
                break  # judged again on the next pass, on fresh state
            done += result is LoanResult.LENT
        return done


__all__ = [
    "GiveBack",
    "LenderResizer",
    "Lending",
    "LoanKey",
    "LoanResult",
    "Refuse",
    "as_lent",
    "borrower",
    "debtors",
    "give_backs",
    "is_give_back",
    "key",
    "lent_on",
    "owes",
    "owes_lender",
    "pending",
    "record_refusal",
    "refusal",
    "refuse_entry",
    "to_put_back",
    "with_loans",
]
