"""Lending: the room a pod that opted in frees by shrinking in place to its floors.

A pod opts in with the floor annotation (:data:`~webhook.core.model.FLOOR_ANNOTATION`,
parsed into :attr:`Pod.floors <webhook.core.model.Pod.floors>`). A loan lowers one
container's request of one resource, never below its floor, and keeps the QoS class:
a Guaranteed pod's limit goes down with its request, a Burstable pod's limit stays.

What a loan frees is what the kubelet counts (:func:`~webhook.core.accounting.pod_requests`):
once it is actuated the container's request, allocation and actuated request are all the
lowered amount, so the room freed is what the pod holds now minus what it holds then. That
is not always the amount lowered: a pod whose init container needs more than its app
containers holds the init container's peak, and lowering an app container under that
peak frees nothing. Loans are therefore sized on the model, never by subtraction.

See docs/lending.md.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from webhook.core.accounting import pod_requests
from webhook.core.model import LOANS_ANNOTATION, Container, ContainerStatus, Floor, Pod, PodRef
from webhook.core.resources import ZERO, ResourceName, Resources


@dataclass(frozen=True, slots=True)
class Loan:
    """One container's ``resource`` lowered in place from ``before`` to ``after``.

    ``before`` is the container's request (what a give-back restores); ``frees`` the room
    it frees on the node by the kubelet's model; ``limits`` is True for a Guaranteed pod,
    whose limit is lowered to ``after`` as well.
    """

    pod: PodRef
    priority: int
    container: str
    resource: ResourceName
    before: int
    after: int
    frees: int
    limits: bool = False


LoanKey = tuple[str, str, str, int, int]


def loan_key(loan: Loan) -> LoanKey:
    """The one identity of a loan: its lender's uid, container, resource, ``before`` and
    ``after``. A container lent twice has two loans, the second from what the first left."""
    return (loan.pod.uid, loan.container, loan.resource, loan.before, loan.after)


@dataclass(frozen=True, slots=True)
class LoanRecord:
    """A loan as its lender carries it (:data:`~webhook.core.model.LOANS_ANNOTATION`):
    the loan, the pod that borrowed, and when (epoch seconds)."""

    loan: Loan
    borrower: PodRef
    at: float


def records(pod: Pod) -> tuple[LoanRecord, ...]:
    """The loans ``pod`` records having made, in the order made. A record that does not
    read is left out: a lender never stops a decision, and a malformed record only loses
    the loan's safety net (its ledger entry still holds it)."""
    text = pod.annotations.get(LOANS_ANNOTATION)
    if not text:
        return ()
    try:
        raw = json.loads(text)
    except ValueError:
        return ()
    out = []
    for item in raw if isinstance(raw, list) else ():
        try:
            out.append(_record(pod, item))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return tuple(out)


def _record(pod: Pod, item: Mapping[str, Any]) -> LoanRecord:
    resource = item["resource"]
    before, after = int(item["before"]), int(item["after"])
    if resource not in ("cpu", "memory") or not 0 < after < before:
        raise ValueError(f"loan record of {resource!r} from {before} to {after}")
    borrower = item["borrower"]
    loan = Loan(
        pod=pod.ref,
        priority=pod.priority,
        container=str(item["container"]),
        resource=resource,
        before=before,
        after=after,
        frees=int(item.get("frees", before - after)),
        limits=bool(item.get("limits", False)),
    )
    ref = PodRef(str(borrower["namespace"]), str(borrower["name"]), str(borrower["uid"]))
    return LoanRecord(loan, ref, float(item["at"]))


def records_text(kept: Iterable[LoanRecord]) -> str:
    """The annotation's value for ``kept`` (``"[]"`` for none): compact JSON, made order."""
    return json.dumps(
        [
            {
                "container": r.loan.container,
                "resource": r.loan.resource,
                "before": r.loan.before,
                "after": r.loan.after,
                "frees": r.loan.frees,
                "limits": r.loan.limits,
                "borrower": {
                    "namespace": r.borrower.namespace,
                    "name": r.borrower.name,
                    "uid": r.borrower.uid,
                },
                "at": r.at,
            }
            for r in kept
        ],
        separators=(",", ":"),
    )


def guaranteed(pod: Pod) -> bool:
    """Whether ``pod`` is of QoS class Guaranteed: as the kubelet reported it, else as
    the API server derives it (every container limits cpu and memory to its requests)."""
    if pod.qos_class:
        return pod.qos_class == "Guaranteed"
    containers = pod.all_containers()
    return bool(containers) and all(
        c.limits.cpu and c.limits.memory and c.requests == c.limits for c in containers
    )


def held(pod: Pod) -> Resources:
    """What ``pod`` holds by its containers, as loans are measured against.

    The kubelet's pod-level status aggregates (``status.allocatedResources``) say
    nothing about one container; without them the amount comes from the container
    statuses, before a loan and after it alike. Pod-level *spec* requests still replace
    the container aggregate, so lowering a container frees none of those.
    """
    if pod.pod_allocated is None and pod.pod_actual is None:
        return pod_requests(pod)
    return pod_requests(replace(pod, pod_allocated=None, pod_actual=None))


def lowered(pod: Pod, container: str, resource: ResourceName, amount: int) -> Pod:
    """``pod`` once a loan lowering ``container``'s ``resource`` to ``amount`` is
    actuated: request, allocation and actuated request at ``amount`` (and the limit too
    for a Guaranteed pod)."""
    limits_too = guaranteed(pod)

    def lower(c: Container) -> Container:
        if c.name != container:
            return c
        limits = c.limits.replace(resource, amount) if limits_too else c.limits
        return replace(c, requests=c.requests.replace(resource, amount), limits=limits)

    statuses = dict(pod.statuses)
    status = statuses.get(container)
    if status is not None:
        statuses[container] = ContainerStatus(
            status.name,
            None if status.allocated is None else status.allocated.replace(resource, amount),
            None if status.actual is None else status.actual.replace(resource, amount),
        )
    return replace(
        pod,
        containers=tuple(lower(c) for c in pod.containers),
        init_containers=tuple(lower(c) for c in pod.init_containers),
        statuses=statuses,
        pod_allocated=None,
        pod_actual=None,
    )


def _request(pod: Pod, floor: Floor) -> int:
    c = pod.container(floor.container)
    return 0 if c is None else c.requests.get(floor.resource)


def lends(pod: Pod, floor: Floor, *, limits: bool = False) -> bool:
    """Whether ``floor`` of ``pod`` may lend. A Guaranteed pod's memory only with
    ``limits`` (the setting ``lend-memory-limits``, off by default): its limit goes down
    with its request, and the kubelet checks the usage against a lowered limit only when
    it applies it; usage that grows past the limit later is OOM-killed, and the container
    restarts into the same limit until the loan is given back (measured on the real
    node: docs/lending.md, "A lender's memory"). Lowering a CPU limit throttles, never
    kills, and a Burstable pod's loan lowers its request only."""
    return limits or not (floor.resource == "memory" and guaranteed(pod))


def at_floors(pod: Pod, *, limits: bool = False) -> Pod:
    """``pod`` with every floor that :func:`lends` lent in full."""
    for floor in pod.floors:
        if lends(pod, floor, limits=limits) and floor.amount < _request(pod, floor):
            pod = lowered(pod, floor.container, floor.resource, floor.amount)
    return pod


def room(pod: Pod, *, limits: bool = False) -> Resources:
    """What lending every floor of ``pod`` in full frees on its node (zero without floors).

    Zero too while the kubelet reports an error actuating the pod's resize (a loan it
    refused, being put back): a loan from it now would likely be refused again."""
    if not pod.floors or pod.resize_error:
        return ZERO
    return (held(pod) - held(at_floors(pod, limits=limits))).clamp()


def borrow(
    pod: Pod, needed: Resources, *, limits: bool = False
) -> tuple[tuple[Loan, ...], Resources]:
    """Loans from ``pod`` covering as much of ``needed`` as its floors allow, each only as
    much as is still needed, and what they free together.

    Contract: every loan stays at or above its floor and below the request, only from a
    floor that :func:`lends`; what the loans free is at most ``needed`` per resource and
    at most :func:`room`.
    """
    loans: list[Loan] = []
    freed = ZERO
    for floor in pod.floors:
        want = needed.get(floor.resource) - freed.get(floor.resource)
        loan = _loan(pod, floor, want) if want > 0 and lends(pod, floor, limits=limits) else None
        if loan is not None:
            loans.append(loan)
            freed = freed.replace(loan.resource, freed.get(loan.resource) + loan.frees)
            pod = lowered(pod, loan.container, loan.resource, loan.after)
    return tuple(loans), freed


#: An amount larger than any a pod holds: where a container's share dominates its pod's.
_HUGE = 2**62


def _loan(pod: Pod, floor: Floor, want: int) -> Loan | None:
    """The smallest loan of ``floor`` freeing ``want`` (or all it can), if it frees any.

    What the pod holds of the resource, as a function of the container's amount ``a``,
    is ``max(C, K + a)``: every term of ``PodRequests`` (the sum of the app containers
    and sidecars, each init container's peak, in each of the three aggregates) counts
    the container at most once, and the rest (other containers, pod-level requests,
    overhead) does not depend on it. ``K`` is read off at a huge amount, where the
    container's terms dominate; then the highest amount freeing ``target`` is
    ``base - target - K``.
    """
    before = _request(pod, floor)
    if floor.amount >= before:
        return None
    name, resource = floor.container, floor.resource
    base = held(pod).get(resource)
    target = min(want, base - held(lowered(pod, name, resource, floor.amount)).get(resource))
    if target <= 0:
        return None
    rest = held(lowered(pod, name, resource, _HUGE)).get(resource) - _HUGE  # K
    after = min(before - 1, base - target - rest)
    frees = base - held(lowered(pod, name, resource, after)).get(resource)
    return Loan(pod.ref, pod.priority, name, resource, before, after, frees, guaranteed(pod))


def _lent_from(loan: Loan, lender: Pod | None) -> tuple[int, ContainerStatus | None] | None:
    """The cached lender's request of the loan's resource in the loan's container, and
    that container's status; None when the lender is gone, replaced or leaving, or the
    container is gone: no loan stands on such a lender."""
    if lender is None or lender.uid != loan.pod.uid or lender.leaving:
        return None
    container = lender.container(loan.container)
    if container is None:
        return None
    return container.requests.get(loan.resource), lender.statuses.get(loan.container)


#: A loan as its lender shows it, in the words of the loan's phases (``to-lend``, ``lent``,
#: ``returning``; docs/architecture.md), plus ``void``.
LoanState = Literal["to-lend", "lent", "returning", "void"]


def loan_state(loan: Loan, lender: Pod | None) -> LoanState:
    """Where ``loan`` stands, read from the lender as cached (``None``: not cached).

    ``lent``: the lender's spec asks for at most the loan's ``after`` (made, actuated or
    not). ``to-lend``: still at ``before``, as planned. ``returning``: at ``before`` again
    (given back) and the kubelet has not allocated that yet: the loan still owes its
    lender, and such a give-back, if the kubelet defers it, is nobody's to preempt for.
    ``void``: the lender is gone, replaced or leaving, or its owner set another amount
    since the plan (its spec wins; nothing is lowered for it).
    """
    found = _lent_from(loan, lender)
    if found is None:
        return "void"
    request, status = found
    if request <= loan.after:
        return "lent"
    if request != loan.before:
        return "void"
    granted = None if status is None else (status.allocated or status.actual)
    return (
        "returning"
        if granted is not None and granted.get(loan.resource) < loan.before
        else "to-lend"
    )


LenderStep = Literal["resize", "done", "void"]


def lender_step(loan: Loan, lender: Pod | None, *, back: bool = False) -> LenderStep:
    """What making ``loan`` (or, ``back``, returning it) asks of the lender as cached.

    ``done``: its spec already asks for the target (made: at most ``after``; returned:
    ``before``). ``void``: no lender to act on (as :func:`loan_state`), or its owner set
    an amount other than the one the step starts from (its spec wins). ``resize``: the
    spec still asks for the start amount, and one ``pods/resize`` takes it to the target.
    """
    found = _lent_from(loan, lender)
    if found is None:
        return "void"
    request = found[0]
    start, target = (loan.after, loan.before) if back else (loan.before, loan.after)
    if request == target or (not back and request < target):
        return "done"
    return "resize" if request == start else "void"


def refused(loan: Loan, lender: Pod | None) -> bool:
    """Whether the kubelet refused ``loan``: the lender lent (its spec at or below the
    loan's ``after``), the kubelet reports an error actuating that spec
    (``PodResizeInProgress`` reason ``Error`` for the lender's current generation), and
    the container still runs above ``after``.

    The case met is a memory limit lowered below the container's usage, which the kubelet
    will not do ("cannot decrease memory limits ..."); it checks the whole pod's resize at
    once, so every loan of that pod not yet actuated is refused with it. An error about an
    older generation says nothing about this spec.
    """
    if lender is None or loan_state(loan, lender) != "lent" or not lender.resize_error:
        return False
    if lender.resize_error_generation < lender.generation:
        return False
    status = lender.statuses.get(loan.container)
    running = None if status is None else status.actual
    return running is not None and running.get(loan.resource) > loan.after


def unlendable(loan: Loan, lender: Pod | None, borrower: Pod, *, limits: bool) -> str:
    """Why ``loan`` may not be made for ``borrower`` from ``lender`` as cached (``""``:
    it may): the judgement of a loan that a ledger entry lists, whoever wrote it, against
    the floors the lender's own annotation declares. ``limits``: the setting
    ``lend-memory-limits`` (:func:`lends`).

    A loan is made only from a live lender of lower priority on the borrower's node, one
    container's request lowered from ``before`` to ``after`` at or above its floor of
    that resource, a floor that :func:`lends`, the limit lowered with it exactly when the
    lender is Guaranteed."""
    if lender is None or lender.uid != loan.pod.uid or lender.leaving:
        return f"lender {loan.pod.key} is not running under that uid"
    if lender.node != borrower.node:
        return f"lender {loan.pod.key} is not on {borrower.node}"
    if lender.priority >= borrower.priority:
        return f"lender {loan.pod.key} is not of lower priority than {borrower.key}"
    floor = next(
        (f for f in lender.floors if (f.container, f.resource) == (loan.container, loan.resource)),
        None,
    )
    if floor is None or not lends(lender, floor, limits=limits):
        return f"lender {loan.pod.key} lends no {loan.resource} of container {loan.container}"
    if not floor.amount <= loan.after < loan.before:
        return f"loan of {loan.pod.key} goes below its floor or lowers nothing"
    if loan.limits != guaranteed(lender):
        return f"loan of {loan.pod.key} would change its limits against its QoS class"
    return ""


def recorded(loan: Loan, lender: Pod | None) -> bool:
    """Whether ``lender`` carries its own record of ``loan`` (:func:`records`): written
    before the loan was made, so a loan without one was never made by the service, and
    nothing raises the lender back to the loan's ``before`` for it."""
    key = loan_key(loan)
    return lender is not None and any(loan_key(r.loan) == key for r in records(lender))


#: A refused loan as its lender shows it, in the words of the loan's phases.
RefusalState = Literal["refused", "putting-back", "ended"]


def refusal_state(loan: Loan, lender: Pod | None) -> RefusalState:
    """Where a refused ``loan`` stands, read from the lender as cached.

    ``refused``: the lender's spec is still at ``after``: put it back to ``before`` (one
    lowered further since lent again, from what this loan left: that loan is undone
    first, by its own entry).
    ``putting-back``: the spec is back at ``before`` but the kubelet has not admitted that
    yet (its allocation is still below): the room it lost is owed to it, and the resize
    that borrowed it must make that room. ``ended``: the lender holds its ``before``
    again, or is gone, or its owner set another amount (its spec wins).
    """
    found = _lent_from(loan, lender)
    if found is None:
        return "ended"
    request, status = found
    if request < loan.after:
        return "putting-back"
    if request == loan.after:
        return "refused"
    if request != loan.before:
        return "ended"
    allocated = None if status is None else status.allocated
    return (
        "putting-back"
        if allocated is not None and allocated.get(loan.resource) < loan.before
        else "ended"
    )


def loans_by_lender(loans: Iterable[Loan]) -> dict[str, list[Loan]]:
    """``loans`` by their lender's uid, each lender's in the order given."""
    by_lender: dict[str, list[Loan]] = {}
    for loan in loans:
        by_lender.setdefault(loan.pod.uid, []).append(loan)
    return by_lender


def owed_back(pods: Iterable[Pod], loans: Iterable[Loan]) -> tuple[Pod, ...]:
    """``pods`` with every refused loan of ``loans`` not ended counted at its ``before``:
    the kubelet allocated the lowered amount (and may have given it to the borrower, and
    reports the pod at it), but the lender never ran below ``before`` and is owed it."""
    by_lender = loans_by_lender(loans)
    out = []
    for p in pods:
        for loan in by_lender.get(p.uid, ()):
            if refusal_state(loan, p) != "ended":
                p = lowered(p, loan.container, loan.resource, loan.before)
        out.append(p)
    return tuple(out)
