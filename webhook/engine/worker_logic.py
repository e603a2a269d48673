"""What the preemption worker does next with one admitted resize: pure decisions.

:func:`next_action` looks at a ledger entry, the resizing pod and its node as the cache
shows them, and the time, and answers with one of three actions:

* :class:`Release` - remove the entry (and its reservation); evict nobody more;
* :class:`Wait` - nothing to do now; look again on the next change or at ``recheck_at``;
* :class:`Act` - loans to make and victims to evict, in that order, and victims to take
  off the claim.

No I/O and no clock reads happen here, so every branch is testable with plain objects.
The worker (:mod:`webhook.engine.worker`) carries the actions out.

The rules, in the order they are checked (numbered like the comments below):

1. an expired entry is released;
2. a pod that is gone (not cached, another uid, terminating, terminal) is released;
3. a resize not yet in the pod's spec is waited for, at most ``persist_timeout`` after
   admission; later the entry is released (a later webhook or the API server refused it);
   a pod whose spec changed again since (another spec, its generation past the entry's)
   was superseded and is released;
4. a loan the kubelet refused (:func:`webhook.core.lending.refused`) is recorded with a
   plan made again without its lender (:class:`Refuse`): every candidate may go and any
   other lender lend, the refused lender counted at what it is owed and the borrower at
   nothing (it may hold its new size already); the entry names the new victims and loans
   in that one write, and each refused loan is put back (:func:`to_put_back`);
5. an actuated resize (allocated >= desired for every container) is released - unless a
   refused lender still waits for its room back - and so is one the kubelet marked
   Infeasible;
6. otherwise the resize is planned again on fresh state with
   :func:`webhook.core.plan.plan_resize`, restricted to the victims the entry names and
   still pending, so the worker never evicts a pod the entry does not name, and
   evicts fewer when room appeared. ``fits``: no more evictions, pending victims are
   released from the claim; ``preempt``: evict the listed victims the plan still needs, in
   the entry's order; ``infeasible``: wait (a PodDisruptionBudget may allow it later),
   unless the kubelet already deferred the resize: then the entry is released so the
   reconciler plans again with every candidate (room disappeared, or a budget now forbids
   a listed victim; victims already handled are on their way out and count as freeing);
   no growth left (the kubelet is catching up): wait; not eligible any more (node opted
   out, preemptionPolicy Never): release.

Victims already handled, terminating, terminal or gone are never evicted again: they are
settled, which is read from the cluster and written nowhere. Loans likewise
(:func:`loan_state`): a lender whose spec is at or below the loan's ``after`` has lent, one
still at ``before`` is pending, and one whose owner set anything else, or that is gone,
owes nothing. The re-plan counts every loan not void as made (as handled victims count as
leaving), so a loan is never planned twice, and ``Act.lend`` lists the pending ones.

Most releases need no ledger write: :func:`webhook.core.reservation.spent` already makes
every reader ignore an entry whose resize was actuated, superseded, refused or marked
Infeasible, or whose pod is leaving, and an expired entry counts nowhere either.
:attr:`Release.write` says when the worker must remove the entry itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from webhook.core.lending import (
    Loan,
    LoanState,
    loan_state,
    loans_by_lender,
    lowered,
    owed_back,
    refusal_state,
    refused,
)
from webhook.core.model import DisruptionBudget, Node, PdbMode, Pod, PodRef
from webhook.core.plan import Plan, plan_resize
from webhook.core.policy import ImportanceKey, PreemptionPolicy
from webhook.core.reservation import actuated
from webhook.core.resources import ZERO
from webhook.engine.config import Config
from webhook.engine.ledger import LedgerEntry, counting, desired_requests

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
    them); ``recheck_at`` (epoch seconds) is when the answer changes by itself, if known."""

    reason: WaitReason
    detail: str
    recheck_at: float | None = None
    settle: tuple[PodRef, ...] = ()


@dataclass(frozen=True, slots=True)
class Act:
    """Carry out the plan.

    ``settle``: pending victims already terminating, terminal or gone - nothing to do,
    no API call. ``drop``: pending victims the fresh plan no longer needs - take them off
    the entry (a ledger write) so its reservation stops claiming them. ``evict``: victims
    to act on, in the entry's order. ``evict`` may be empty (the resize fits now; the
    entry counts until the kubelet actuates it or it expires). ``lend``: the entry's
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
    lenders, within the same reservation (:func:`record_refusal`). ``plan`` is ``None``
    when no plan makes room without them: the refusal is recorded and the usual rules
    decide on the next pass (wait, or release for a fresh plan). ``why`` is the kubelet's
    message. Each refused loan is put back (:func:`to_put_back`)."""

    loans: tuple[Loan, ...]
    plan: Plan | None
    why: str


Action = Release | Wait | Act | Refuse


@dataclass(frozen=True, slots=True)
class ListedOnly:
    """A :class:`PreemptionPolicy` that only lets the given pod uids be victims.

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
        # The entry's own loans are counted as made (``with_loans``); a re-plan never
        # borrows anything the admitted plan did not.
        return False

    def may_preempt(self, victim: Pod, preemptor: Pod) -> bool:
        return victim.uid in self.allowed and self.base.may_preempt(victim, preemptor)

    def importance(self, pod: Pod, now: float) -> ImportanceKey:
        return self.base.importance(pod, now)


def is_persisted(entry: LedgerEntry, pod: Pod) -> bool:
    """True when the pod's spec carries exactly the container requests the entry admitted."""
    return dict(desired_requests(pod)) == dict(entry.desired)


def is_actuated(entry: LedgerEntry, pod: Pod) -> bool:
    """True when the kubelet allocated at least the admitted requests to every container
    (:func:`webhook.core.reservation.actuated`, the rule that makes a reservation spent)."""
    return actuated(entry.desired, pod)


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


def to_put_back(entry: LedgerEntry, pods: Sequence[Pod]) -> tuple[Loan, ...]:
    """The entry's refused loans whose lender still asks for the loan's ``after``: to be
    put back to ``before``, whatever else the entry does."""
    by_uid = {p.uid: p for p in pods}
    return tuple(
        loan for loan in entry.refused if refusal_state(loan, by_uid.get(loan.pod.uid)) == "undo"
    )


def record_refusal(entry: LedgerEntry, action: Refuse) -> LedgerEntry:
    """``entry`` with ``action``'s loans refused and, when it has a plan, that plan in
    place of the rest: its victims after the ones already handled, its loans after the
    ones kept. Pure: a store may apply it again after a conflict."""
    keys = {_loan_key(loan) for loan in action.loans}
    known = {_loan_key(loan) for loan in entry.refused}
    if keys <= known:
        return entry  # recorded already
    kept = tuple(loan for loan in entry.loans if _loan_key(loan) not in keys)
    refused = entry.refused + tuple(loan for loan in action.loans if _loan_key(loan) not in known)
    if action.plan is None:
        return replace(entry, loans=kept, refused=refused)
    handled = tuple(v for v in entry.victims if v.uid in entry.handled)
    victims = handled + tuple(v.pod for v in action.plan.victims if v.pod.uid not in entry.handled)
    return replace(entry, loans=kept + action.plan.loans, refused=refused, victims=victims)


def _loan_key(loan: Loan) -> tuple[str, str, str, int, int]:
    return (loan.pod.uid, loan.container, loan.resource, loan.before, loan.after)


def _unheld(pod: Pod) -> Pod:
    """``pod`` as if it held nothing on its node yet: what its resize needs is its whole
    desired size, next to everyone else (a borrower the kubelet admitted on a loan it
    then refused holds room that is not there)."""
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


def _without_floors(pods: Iterable[Pod], lenders: frozenset[str]) -> tuple[Pod, ...]:
    """``pods`` with the ``lenders`` (uids) lending nothing: a plan made without them."""
    return tuple(replace(p, floors=()) if p.uid in lenders and p.floors else p for p in pods)


def _victim_state(
    victim: PodRef, by_uid: Mapping[str, Pod], handled: frozenset[str] = frozenset()
) -> Literal["live", "leaving"]:
    pod = by_uid.get(victim.uid)
    if victim.uid in handled or pod is None or pod.terminal or pod.terminating:
        return "leaving"
    return "live"


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
    """Decide what to do with ``entry``.

    ``pod`` is the resizing pod as cached (looked up by namespace/name; ``None`` when not
    cached); ``node`` its node; ``pods`` the pods bound to ``entry.node``; ``others`` the
    node's other ledger entries (their reservations and claims count, this entry's own
    does not). Pure: same arguments, same action.
    """
    # 1. An expired reservation protects nothing any more.
    if entry.expires_at <= now:
        return Release("expired", f"reservation expired {now - entry.expires_at:.1f}s ago")

    # 2. The pod the room was reserved for is gone, replaced or leaving. Only a pod the
    #    cache no longer has needs the entry removed: a reservation of a pod not seen is
    #    kept by every reader (the cache may lag an admission).
    if pod is None:
        return Release("pod-gone", f"pod {entry.pod.key} no longer exists", write=True)
    if pod.uid != entry.pod.uid:
        return Release("pod-gone", f"pod {entry.pod.key} was replaced (uid {pod.uid})", write=True)
    if pod.terminating or pod.terminal:
        return Release("pod-gone", f"pod {entry.pod.key} is terminating or finished")

    # 3. Wait until the resize is in the pod's spec; another spec at a later generation
    #    (or, for an entry written persisted, any other spec) superseded it.
    if not is_persisted(entry, pod):
        later = bool(entry.generation) and pod.generation > entry.generation
        if entry.persisted or later:
            # Readers see a later generation themselves; without one, the worker removes it.
            return Release(
                "superseded", "the pod's spec changed again after the resize", write=not later
            )
        deadline = entry.admitted_at + config.persist_timeout
        if now >= deadline:
            # Written unless the entry carries its own deadline (older entries do not).
            return Release(
                "not-persisted",
                f"resize not in the pod's spec {config.persist_timeout:g}s after admission",
                write=not entry.persist_by,
            )
        return Wait("not-persisted-yet", "waiting for the resize to persist", deadline)

    # 4. Loans the kubelet refused (it will not actuate them: a memory limit below what the
    #    container uses) are recorded, and the plan made again without their lenders,
    #    before anything else: once recorded, each is put back whatever happens next.
    cached = {p.uid: p for p in pods}
    refusing = tuple(loan for loan in entry.loans if refused(loan, cached.get(loan.pod.uid)))
    others = counting((o for o in others if o.review_uid != entry.review_uid), pods, now)
    if refusing:
        lender = cached[refusing[0].pod.uid]
        why = lender.resize_error
        if node is None:
            return Refuse(refusing, None, why)
        gone = {_loan_key(loan) for loan in refusing}
        rest = replace(entry, loans=tuple(lo for lo in entry.loans if _loan_key(lo) not in gone))
        plan = _replan(rest, pod, node, pods, others, now, config, budgets, refusing, listed=False)
        keep = plan if plan.verdict in ("fits", "preempt") and plan.code != "no-growth" else None
        return Refuse(refusing, keep, why)

    # 5. Done, or the kubelet will never do it. A resize the kubelet actuated on a loan it
    #    then refused is not done while that lender waits for its room back: the entry
    #    makes that room, as it made the borrower's.
    owing = entry.owes(cached)
    if is_actuated(entry, pod) and not owing:
        return Release("actuated", "the kubelet allocated the new requests")
    if pod.resize == "infeasible":
        return Release("infeasible-resize", "the kubelet marked the resize Infeasible")
    if node is None:
        return Wait("node-unknown", f"node {entry.node} not in the cache")

    # 6. Plan again on fresh state, restricted to the entry's own pending victims.
    lend = tuple(
        loan for loan in entry.loans if loan_state(loan, cached.get(loan.pod.uid)) == "pending"
    )
    handled = _handled(entry, others)
    by_uid = {p.uid: p for p in pods if p.node == entry.node}
    pending = entry.pending_victims
    settle = tuple(v for v in pending if _victim_state(v, by_uid, handled) == "leaving")
    live = tuple(v for v in pending if v not in settle)
    plan = _replan(entry, pod, node, pods, others, now, config, budgets, (), listed=True)
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
        if pod.resize == "deferred":
            # The listed victims are not enough any more and the kubelet has given up for
            # now; holding the room until expiry would only delay the resize. The
            # reconciler re-plans it from scratch (same core, same ledger).
            return Release(
                "replan", f"the admitted victims no longer suffice: {plan.reason}", write=True
            )
        return Wait("cannot-fit", plan.reason, settle=settle)
    return Release("not-eligible", plan.reason, write=True)


def _handled(entry: LedgerEntry, others: Iterable[LedgerEntry]) -> frozenset[str]:
    """Victims any entry already handled: on their way out even if the cache has not seen
    their deletion yet."""
    return frozenset(entry.handled).union(*(o.handled for o in others))


def _replan(
    entry: LedgerEntry,
    pod: Pod,
    node: Node,
    pods: Sequence[Pod],
    others: Sequence[LedgerEntry],
    now: float,
    config: Config,
    budgets: Sequence[DisruptionBudget],
    refusing: tuple[Loan, ...],
    *,
    listed: bool,
) -> Plan:
    """The entry's resize planned on fresh state: every loan not void counted as made
    (the entry's and the others'), handled victims as leaving, the lenders of refused
    loans (``refusing`` and the entry's) lending nothing. ``listed``: only the entry's
    own live pending victims may go and nothing more is borrowed (the worker never evicts
    a pod the admission did not name); otherwise any candidate may, and any lender lend
    (a plan made again after a refusal). A borrower owed room by a refused loan is
    planned as if it held nothing (:func:`_unheld`)."""
    handled = _handled(entry, others)
    view = tuple(
        replace(p, terminating=True) if p.uid in handled and not p.terminating else p for p in pods
    )
    view = with_loans(view, (loan for e in (entry, *others) for loan in e.loans))
    view = owed_back(view, entry.refused + refusing)
    view = _without_floors(view, frozenset(loan.pod.uid for loan in entry.refused + refusing))
    by_uid = {p.uid: p for p in pods}
    old = _unheld(pod) if refusing or entry.owes(by_uid) else pod
    base = config.policy()
    if listed:
        on_node = {p.uid: p for p in pods if p.node == entry.node}
        live = frozenset(
            v.uid for v in entry.pending_victims if _victim_state(v, on_node, handled) == "live"
        )
        policy: PreemptionPolicy = ListedOnly(base, live)
    else:
        policy = base
    return plan_resize(
        old,
        pod,
        node,
        view,
        now=now,
        budgets=budgets,
        reservations=[o.reservation() for o in others],
        policy=policy,
    )


__all__ = [
    "Act",
    "Action",
    "ListedOnly",
    "LoanState",
    "Refuse",
    "Release",
    "ReleaseReason",
    "Wait",
    "WaitReason",
    "is_actuated",
    "is_persisted",
    "loan_state",
    "next_action",
    "record_refusal",
    "to_put_back",
    "with_loans",
]
