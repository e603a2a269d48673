"""Giving loans back: which lenders get their room back now, on one node. Pure.

A loan is returned from its ledger entry once that entry holds no room any more (the
borrower's resize was actuated, or the borrower is gone, or its plan was given up on)
and the node has room for it *after* every active reservation and every pending growth
of a pod of higher or equal priority than the lender: a give-back takes only room nobody
more important is waiting for, so it never makes the webhook evict or shrink anyone.
Most important lender first (higher priority, then the earlier started), each return
counted before the next is judged.

A lender whose container was lent twice (two loans, the second from the amount the first
left) gets the later loan back first: only a loan whose ``after`` is the lender's
request now is returned, so each give-back restores exactly one loan's ``before``.

A lender whose loan the kubelet refused counts at the loan's ``before`` until it holds
it again (:func:`webhook.core.lending.owed_back`): nothing is given back into that room.

Ended loans need nothing: a lender whose owner changed its resources (its spec wins),
or that is gone, owes and is owed nothing (:func:`webhook.core.lending.loan_state`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from webhook.core.accounting import pod_requests
from webhook.core.headroom import holdings, node_usage
from webhook.core.lending import Loan, loan_state, lowered, owed_back
from webhook.core.model import Node, Pod
from webhook.core.reservation import active_on
from webhook.core.resources import Resources
from webhook.engine.ledger import LedgerEntry, counting


@dataclass(frozen=True, slots=True)
class GiveBack:
    """Return ``loan`` (its lender to ``loan.before``) for the entry ``review_uid``."""

    review_uid: str
    loan: Loan


def _due(entries: Sequence[LedgerEntry], by_uid: dict[str, Pod], live: set[str]) -> list[GiveBack]:
    due: dict[tuple[str, str, str, int], GiveBack] = {}
    for entry in entries:
        if entry.review_uid in live:
            continue  # the borrower still needs the room
        for loan in entry.loans:
            lender = by_uid.get(loan.pod.uid)
            if lender is None or loan_state(loan, lender) != "lent":
                continue
            container = lender.container(loan.container)
            if container is None or container.requests.get(loan.resource) != loan.after:
                continue  # lent again since, from what this loan left: that one first
            key = (loan.pod.uid, loan.container, loan.resource, loan.after)
            due.setdefault(key, GiveBack(entry.review_uid, loan))
    return sorted(
        due.values(),
        key=lambda g: (
            -g.loan.priority,
            _started(by_uid[g.loan.pod.uid]),
            g.loan.pod.key,
            g.loan.container,
            g.loan.resource,
        ),
    )


def _started(pod: Pod) -> float:
    return pod.start_time if pod.start_time is not None else float("inf")


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


def give_backs(
    node: Node, pods: Sequence[Pod], entries: Sequence[LedgerEntry], now: float
) -> tuple[GiveBack, ...]:
    """The loans on ``node`` to return now, in order; ``pods`` are the node's cached
    pods, ``entries`` its ledger entries. Same arguments, same answer."""
    live = counting(entries, pods, now)
    by_uid = {p.uid: p for p in pods}
    # A lender whose loan was refused counts at what it is owed, not at the lowered
    # allocation the kubelet may still report: that room is spoken for.
    view = {p.uid: p for p in owed_back(pods, (loan for e in entries for loan in e.refused))}
    out = []
    for give in _due(entries, by_uid, {e.review_uid for e in live}):
        loan = give.loan
        returned = lowered(view[loan.pod.uid], loan.container, loan.resource, loan.before)
        trial = {**view, loan.pod.uid: returned}
        if _fits(node, trial.values(), live, now, loan.priority):
            view = trial
            out.append(give)
    return tuple(out)


__all__ = ["GiveBack", "give_backs"]
