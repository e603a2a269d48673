"""Every change the engine makes to a node's ledger entries, each written through the keep
rule (:func:`~webhook.engine.lifecycle.states.to_keep`). A store stores what a change
returns and judges nothing. A resize that goes as planned costs one ledger write, the one
that admitted it (:func:`admit`, shared by the admission path and the reconciler through
their :class:`Planner`). Changes are pure: a store may apply one again after a conflict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Final, NamedTuple, Protocol

from webhook.core.lending import (
    Loan,
    loan_key,
)
from webhook.core.model import Pod
from webhook.core.plan import Plan
from webhook.engine.ledger import LedgerChange, LedgerEntry, desired_requests
from webhook.engine.lifecycle.states import is_give_back, owes, persisted, room_holders, to_keep


class Refusal(Protocol):
    """Loans the kubelet refused, and the plan made again without their lenders
    (``None``: none makes room): what the worker's ``Refuse`` step carries."""

    @property
    def loans(self) -> tuple[Loan, ...]: ...

    @property
    def plan(self) -> Plan | None: ...


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

    def admitted(self, entry: LedgerEntry) -> Plan:
        """The answer to the resize asked for again while ``entry``, admitting the very
        same resize, holds room: nothing planned anew."""
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
    room is the worker's, and nothing is planned. A review whose plan would take room, for
    a resize that an entry holding room admitted already (the same pod and requests: an
    autoscaler repeats a pending resize on each loop), is answered with that entry and
    writes nothing: until the kubelet actuates the resize, its plan counts the room being
    made for it as missing, and would take it twice. A plan that may take no room still
    removes such an entry (:func:`_answered`). A give-back is never preempted for.
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
        if planner.review and planner.reserves(planned):
            same = _same_resize(room_holders(entries, pods, now), pod, pods)
            if same is not None:
                return None, Admitted(planner.admitted(same), same)
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


def _same_resize(
    holders: Iterable[LedgerEntry], pod: Pod, pods: Sequence[Pod]
) -> LedgerEntry | None:
    """The entry among ``holders`` admitting ``pod``'s resize as it asks now (the same pod,
    exactly the same container requests) once the API server stored it: the cached pod's
    spec carries it. An entry whose resize was never stored answers no review: a caller
    that is not the API server may have written it."""
    desired = dict(desired_requests(pod))
    cached = next((p for p in pods if p.uid == pod.uid), None)
    return next(
        (
            e
            for e in holders
            if e.pod.uid == pod.uid
            and dict(e.desired) == desired
            and cached is not None
            and persisted(e, cached)
        ),
        None,
    )


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


def refuse(review_uid: str, action: Refusal, pods: Sequence[Pod], now: float) -> LedgerChange[bool]:
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


def record_refusal(entry: LedgerEntry, action: Refusal) -> LedgerEntry:
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
