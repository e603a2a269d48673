"""Which loans are returned now (:func:`give_backs`), and the loans a lender records that
no entry holds.

A loan is also recorded on its lender (:func:`webhook.core.lending.records`), before it is
made. A record whose loan no entry holds (the entry was lost with its Lease, or by a bug)
is an orphan (:func:`orphans`): given back like any loan that is due, then removed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from webhook.core.accounting import active_on, holdings, node_usage, pod_requests
from webhook.core.lending import (
    Loan,
    LoanKey,
    LoanRecord,
    loan_key,
    lowered,
    owed_back,
    recorded,
    records,
)
from webhook.core.model import Node, Pod, PodRef
from webhook.core.policy import importance_key
from webhook.core.resources import ZERO, Resources
from webhook.engine.ledger import LedgerEntry
from webhook.engine.lifecycle.states import loan_phase, room_holders

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
