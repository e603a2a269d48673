"""Loans carried out: the lenders' port and the executor the worker calls.

What a loan is and where it stands is :mod:`webhook.engine.lifecycle`'s (its states,
:func:`~webhook.engine.states.loan_phase`, and the ledger changes); the arithmetic is
:mod:`webhook.core.lending`'s. This module acts on them through a :class:`LenderResizer`
(``pods/resize`` on the lender, ``webhook.kube.resizer``): :class:`Lending` makes an
entry's loans before its evictions, records a refusal and puts the lenders back, gives
loans back (orphans included) and removes the records of loans that ended, and counts
what the loans free for the metrics (:func:`lent_on`). It imports the lifecycle; the
lifecycle never imports it. See docs/lending.md.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Protocol

from webhook.base.metrics import RESOURCE_UNITS, Metrics, in_base_unit
from webhook.core.lending import Loan, LoanKey, LoanRecord, loan_key, loan_state
from webhook.core.model import Pod, PodRef
from webhook.engine.ledger import ClusterView, Ledger, LedgerEntry
from webhook.engine.lifecycle import changes, give_back, states
from webhook.engine.lifecycle.next_step import Refuse

log = logging.getLogger(__name__)


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

    def lend(self, loan: Loan, borrower: PodRef, node: str) -> LoanResult:
        """Make ``loan``: its record on the lender first
        (:data:`~webhook.core.model.LOANS_ANNOTATION`), then the lender lowered; a loan
        is never out without its record."""
        ...

    def give_back(self, loan: Loan, borrower: PodRef, node: str) -> LoanResult:
        """The lender back from the loan's ``after`` to its ``before`` (``lent``: patched;
        ``done``: at ``before`` already; ``void``: at another amount, or gone)."""
        ...

    def put_back(self, loan: Loan, borrower: PodRef, node: str, why: str) -> LoanResult:
        """Undo a loan the kubelet refused (``why``: its message): the lender back to
        ``before`` while it asks for at most ``after``; a warning event on it."""
        ...

    def forget(self, lender: PodRef, ended: Sequence[LoanRecord]) -> LoanResult:
        """Remove the records ``ended`` from ``lender`` (``done``: none of them is there
        any more; ``void``: the lender is gone)."""
        ...


class WorkerHandle(Protocol):
    """What :class:`Lending` asks of the worker it acts for."""

    def may_act(self) -> bool:
        """Whether this replica may call the API server now (it leads, its cache is
        current)."""
        ...

    def current(self, entry: LedgerEntry) -> LedgerEntry | None:
        """``entry`` as the ledger holds it now, while its resize is still the pod's
        persisted one on its node (``None``: released or cancelled meanwhile)."""
        ...

    def failed(self, entry: LedgerEntry) -> None:
        """Back ``entry`` off: an API call for it failed."""
        ...

    def succeeded(self, entry: LedgerEntry) -> None:
        """End ``entry``'s backoff."""
        ...

    def wake(self) -> None:
        """Ask for another pass."""
        ...


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
            if loan_key(loan) not in seen:
                seen.add(loan_key(loan))
                lent[loan.resource] += loan.frees
        if made:
            oldest = entry.admitted_at if oldest is None else min(oldest, entry.admitted_at)
    return lent, oldest


# -- carried out, for the worker --------------------------------------------------------------


class Lending:
    """What the worker does with the ledger's loans, through ``resizer``: makes an entry's
    pending loans before its evictions (each recorded on its lender first), records a
    refusal and puts the lenders back, gives loans back (orphans whose entry was lost
    included) and removes the records of loans that ended, and counts what they free.
    Without a ``resizer`` no loan is made (nor are the victims chosen to go with one
    evicted).

    ``handle`` is the worker's: asked before every call to the API server whether it
    may act and whether the entry is still current; a failure backs the entry off there.

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
        handle: WorkerHandle,
    ) -> None:
        self.cluster = cluster
        self.ledger = ledger
        self.metrics = metrics
        self.clock = clock
        self.resizer = resizer
        self.handle = handle
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
            self.handle.failed(entry)
            return False
        for loan in loans:
            if stop.is_set() or not self.handle.may_act():
                return False
            if self.handle.current(entry) is None:
                return False  # released or cancelled meanwhile: nobody needs the room
            result = self.resizer.lend(loan, entry.pod, entry.node)
            if result is LoanResult.VOID:
                # The lender changed since the decision: decide again before evicting.
                self.handle.wake()
                return False
            if not result.done:
                log.info(
                    "lending from %s for %s failed; retrying later", loan.pod.key, entry.pod.key
                )
                self.handle.failed(entry)
                return False
        self.handle.succeeded(entry)
        return True

    def refuse(self, entry: LedgerEntry, action: Refuse) -> None:
        """Record the refusal and the new plan in one ledger write, then put the lenders
        back; the next pass carries the new plan out. The write comes first: a lender put
        back before it would look like a loan still to make."""
        pods = tuple(self.cluster.pods_on(entry.node))
        change = changes.refuse(entry.review_uid, action, pods, self.clock())
        if not self.ledger.update(entry.node, change):
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
        self.put_back(changes.record_refusal(entry, action), action.why)
        self.handle.wake()

    def put_back(self, entry: LedgerEntry, why: str = "") -> None:
        """Put back the entry's refused loans whose lender still asks for the loan's
        ``after``; a failure backs the entry off (tried again on a later pass). Called for
        every entry whatever it does next (also after a restart between recording a
        refusal and putting the lender back)."""
        if not entry.refused or self.resizer is None:
            return
        pods = tuple(self.cluster.pods_on(entry.node))
        errors = {p.uid: p.resize_error for p in pods}
        for loan in states.to_put_back(entry, pods):
            if not self.handle.may_act():
                return
            reason = why or errors.get(loan.pod.uid) or "the kubelet could not actuate it"
            if self.resizer.put_back(loan, entry.pod, entry.node, reason) is LoanResult.FAILED:
                self.handle.failed(entry)
                return

    def give_back(self, node_name: str, stop: threading.Event) -> int:
        """Return the loans on ``node_name`` the node has room for now
        (:func:`~webhook.engine.give_back.give_backs`, orphans included), then remove the
        records of loans that ended; how many were returned. No ledger write: a loan
        given back is read from the lender (its spec at ``before``), and the next write
        to the node drops the entry once the kubelet actuated it. An error is logged and
        counted; the next pass tries again."""
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
        pods = tuple(self.cluster.pods_on(node_name))
        done = 0
        for give in give_back.give_backs(node, pods, entries, self.clock()):
            if stop.is_set() or not self.handle.may_act():
                return done
            result = self.resizer.give_back(give.loan, give.borrower, node_name)
            if result is LoanResult.FAILED:
                return done  # judged again on the next pass, on fresh state
            done += result is LoanResult.LENT
        for lender, ended in give_back.ended_records(entries, pods, self.clock()).items():
            if stop.is_set() or not self.handle.may_act():
                break
            self.resizer.forget(lender, ended)
        return done


__all__ = [
    "LenderResizer",
    "Lending",
    "LoanResult",
    "WorkerHandle",
    "lent_on",
]
