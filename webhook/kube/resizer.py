"""Carrying out a loan: lowering one lender container in place through ``pods/resize``.

A loan (:class:`webhook.core.lending.Loan`) names a container and a resource to lower
from ``before`` to ``after``; a Guaranteed lender's limit goes down with its request
(``loan.limits``), so its QoS class stays. The webhook itself sees the resize as a
non-growing one and never plans for it.

Contract - idempotent, safe to call again after a crash or by another replica:

* the lender is looked up in the cluster cache (``lenders``), not read from the API
  server: the patch's preconditions make a stale copy safe, so a loan costs one request.
  Whether there is anything to write is the core's judgement of that copy
  (:func:`webhook.core.lending.lender_step`): ``done`` (lent already) and ``void`` (no
  lender, or its owner changed the amount since the plan, and the new spec wins) write
  nothing;
* the patch carries the lender's uid and the ``resourceVersion`` the cache holds: a newer
  pod of the same name, or a change the cache has not seen yet, fails it with a conflict
  (``failed``, judged again on the next pass, when the cache has caught up) instead of
  lowering the wrong amount; a lender deleted meanwhile is ``void``;
* a give-back (:meth:`Resizer.give_back`) is the same call the other way: the lender
  back from ``after`` to ``before``, only while it still asks for ``after``;
* a refused loan is put back (:meth:`Resizer.put_back`) the same way: the lender from
  ``after`` to ``before``, only while it still asks for ``after``, with a
  ``LoanRefused`` warning event on the lender saying why;
* a loan is recorded on its lender before the lender is lowered: the annotation
  :data:`~webhook.core.model.LOANS_ANNOTATION` (its size before, the borrower, the time),
  in a patch of the pod's metadata with the same preconditions (the resize subresource
  writes the containers' resources only). A crash between the two leaves a record of a
  loan not made, which the worker removes (:meth:`Resizer.forget`) once no entry holds
  it; a loan is never out without its record. Records are removed only by ``forget``,
  once the loan ended;
* ``lent`` is followed by a ``Lent`` event on the lender, related to the borrower, and
  counted in ``resize_preemption_loans_total{result="made"}``; nothing is raised: API
  failures are logged and reported as ``failed``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from webhook.base.loop import Backoff
from webhook.base.metrics import Metrics
from webhook.core.errors import ObjectError
from webhook.core.lending import Loan, LoanRecord, lender_step, loan_key, records, records_text
from webhook.core.model import LOANS_ANNOTATION, Pod, PodRef
from webhook.core.objects import parse_pod
from webhook.core.resources import format_cpu, format_memory
from webhook.engine.loans import LoanResult
from webhook.kube.errors import ClusterError, Conflict, NotFound
from webhook.kube.events import EventRecorder
from webhook.kube.jsonapi import patch_pod, pod_path, request_json

log = logging.getLogger(__name__)

LENT_REASON: Final = "Lent"
LENDING_ACTION: Final = "Lending"
REFUSED_REASON: Final = "LoanRefused"


def amount_text(resource: str, amount: int) -> str:
    """``amount`` of ``resource`` in Kubernetes notation: ``2`` CPUs, ``512Mi``."""
    return format_cpu(amount) if resource == "cpu" else format_memory(amount)


def lent_note(loan: Loan, borrower: PodRef, node: str) -> str:
    """``lent cpu 2 to pod <uid> on node-1``: what the lender gave up, for whom."""
    lent = amount_text(loan.resource, loan.before - loan.after)
    return f"lent {loan.resource} {lent} to pod {borrower.uid} on {node}"


def refused_note(loan: Loan, why: str) -> str:
    """``the kubelet refused to lower memory to 4Gi (...); put back to 6Gi``, at most
    the 1024 characters an event's note may have."""
    after, before = amount_text(loan.resource, loan.after), amount_text(loan.resource, loan.before)
    note = f"the kubelet refused to lower {loan.resource} to {after} ({why}); put back to {before}"
    return note if len(note) <= 1024 else note[:1021] + "..."


def resize_patch(
    loan: Loan, amount: int, *, uid: str, resource_version: str, init: bool
) -> dict[str, Any]:
    """The strategic merge patch setting the loan's container to ``amount`` (the limit
    too for a Guaranteed lender), conditional on the lender's uid and, when known, on
    the ``resource_version`` read."""
    value = amount_text(loan.resource, amount)
    resources: dict[str, Any] = {"requests": {loan.resource: value}}
    if loan.limits:
        resources["limits"] = {loan.resource: value}
    containers = "initContainers" if init else "containers"
    meta = {"uid": uid}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {
        "metadata": meta,
        "spec": {containers: [{"name": loan.container, "resources": resources}]},
    }


class Resizer:
    """Lowers lenders for loans, one call at a time; thread-safe (no per-call state)."""

    def __init__(
        self,
        api_client: Any,
        recorder: EventRecorder | None,
        metrics: Metrics,
        *,
        lenders: Callable[[str, str], Pod | None],
        request_timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``lenders(namespace, name)``: the pod as the cluster cache holds it."""
        self._api_client = api_client
        self._lenders = lenders
        self._clock = clock
        self.recorder = recorder
        self.metrics = metrics
        self._timeout = request_timeout

    def lend(self, loan: Loan, borrower: PodRef, node: str) -> LoanResult:
        """Make ``loan`` for ``borrower`` on ``node``; see the module docstring. Never
        raises."""
        result = self._attempt(
            loan,
            borrower,
            back=False,
            failure="could not lend from %s for %s: %s",
            error="error lending from %s for %s",
            keys=(loan.pod.key, borrower.key),
        )
        if result is LoanResult.LENT:
            self.metrics.loans.labels("made").inc()
            log.info(
                "%s lent %s %s->%s to %s",
                loan.pod.key,
                loan.resource,
                amount_text(loan.resource, loan.before),
                amount_text(loan.resource, loan.after),
                borrower.key,
            )
            if self.recorder is not None:
                self.recorder.record(
                    loan.pod,
                    related=borrower,
                    reason=LENT_REASON,
                    action=LENDING_ACTION,
                    note=lent_note(loan, borrower, node),
                )
        return result

    def give_back(self, loan: Loan, borrower: PodRef, node: str) -> LoanResult:
        """Return ``loan``: the lender back to ``before``, only while it still asks for
        the loan's ``after`` (``done`` at ``before`` already, ``void`` at any other
        amount: its owner's spec wins). Counted in
        ``resize_preemption_loans_total{result="returned"}``. Never raises."""
        result = self._attempt(
            loan,
            borrower,
            back=True,
            failure="could not give back to %s: %s",
            error="error giving back to %s",
            keys=(loan.pod.key,),
        )
        if result is LoanResult.LENT:
            self.metrics.loans.labels("returned").inc()
            log.info(
                "gave %s %s %s back to %s (lent to %s on %s)",
                loan.resource,
                amount_text(loan.resource, loan.before - loan.after),
                amount_text(loan.resource, loan.before),
                loan.pod.key,
                borrower.key,
                node,
            )
        return result

    def put_back(self, loan: Loan, borrower: PodRef, node: str, why: str) -> LoanResult:
        """Undo ``loan``, which the kubelet refused (``why``: its message): the lender
        back to ``before`` while it still asks for the loan's ``after``
        (``done``: at ``before`` already; ``void``: at another amount, or gone). Never
        raises."""
        result = self._attempt(
            loan,
            borrower,
            back=True,
            failure="could not put %s back after a refused loan: %s",
            error="error putting %s back after a refused loan",
            keys=(loan.pod.key,),
        )
        if result is LoanResult.LENT:
            log.info(
                "put %s %s back to %s after the kubelet refused the loan to %s on %s: %s",
                loan.pod.key,
                loan.resource,
                amount_text(loan.resource, loan.before),
                borrower.key,
                node,
                why,
            )
            if self.recorder is not None:
                self.recorder.record(
                    loan.pod,
                    related=borrower,
                    type_="Warning",
                    reason=REFUSED_REASON,
                    action=LENDING_ACTION,
                    note=refused_note(loan, why),
                )
        return result

    def forget(self, lender: PodRef, ended: Sequence[LoanRecord]) -> LoanResult:
        """Remove the records ``ended`` from ``lender``'s loan record (the annotation goes
        with the last one); ``done`` when none is there, ``void`` when the lender is gone
        or replaced. Never raises."""
        try:
            pod = self._lenders(lender.namespace, lender.name)
            if pod is None or pod.uid != lender.uid:
                return LoanResult.VOID
            gone = {loan_key(r.loan) for r in ended}
            kept = tuple(r for r in records(pod) if loan_key(r.loan) not in gone)
            if len(kept) == len(records(pod)):
                return LoanResult.DONE
            self._record(pod, kept)
        except NotFound:
            return LoanResult.VOID
        except (ClusterError, ObjectError) as e:
            log.warning("could not remove ended loan records from %s: %s", lender.key, e)
            return LoanResult.FAILED
        except Exception:
            log.exception("error removing ended loan records from %s", lender.key)
            return LoanResult.FAILED
        log.info("removed %d ended loan record(s) from %s", len(ended), lender.key)
        return LoanResult.LENT

    def _attempt(
        self,
        loan: Loan,
        borrower: PodRef,
        *,
        back: bool,
        failure: str,
        error: str,
        keys: tuple[str, ...],
    ) -> LoanResult:
        """The lender lowered from ``before`` to ``after`` or, ``back``, raised from
        ``after`` to ``before``; never raises. An API or object error is logged as the
        warning ``failure % (*keys, error)``, anything else with its traceback as
        ``error % keys``: both are ``failed``."""
        try:
            return self._resize(loan, borrower, back=back)
        except (ClusterError, ObjectError) as e:
            log.warning(failure, *keys, e)
        except Exception:
            log.exception(error, *keys)
        return LoanResult.FAILED

    def _resize(self, loan: Loan, borrower: PodRef, *, back: bool) -> LoanResult:
        pod = self._lenders(loan.pod.namespace, loan.pod.name)
        step = lender_step(loan, pod, back=back)
        if pod is None or step == "void":
            return LoanResult.VOID
        version = pod.resource_version
        if not back and all(loan_key(r.loan) != loan_key(loan) for r in records(pod)):
            try:
                version = self._record(
                    pod, (*records(pod), LoanRecord(loan, borrower, self._clock()))
                )
            except NotFound:
                return LoanResult.VOID
            except Conflict:
                return LoanResult.FAILED  # judged again when the cache has caught up
        if step == "done":
            return LoanResult.DONE
        init = pod.container(loan.container) in pod.init_containers
        for fresh in (False, True):
            if fresh:
                # The lender moved on from the version patched (the kubelet writes its
                # status after every change, the loan's record included): judged again
                # on a fresh read, and patched once more if it still asks the same.
                pod = self._read(loan.pod)
                step = lender_step(loan, pod, back=back)
                if pod is None or step != "resize":
                    return LoanResult.DONE if step == "done" else LoanResult.VOID
                version = pod.resource_version
            target = loan.before if back else loan.after
            patch = resize_patch(
                loan, target, uid=loan.pod.uid, resource_version=version, init=init
            )
            try:
                patch_pod(self._api_client, loan.pod, "resize", patch, timeout=self._timeout)
            except NotFound:
                return LoanResult.VOID
            except Conflict:
                continue
            return LoanResult.LENT
        return LoanResult.FAILED  # judged again on the next pass

    def _read(self, ref: PodRef) -> Pod | None:
        """``ref`` as the API server has it now (``None``: gone)."""
        try:
            return parse_pod(
                request_json(self._api_client, "GET", pod_path(ref), timeout=self._timeout)
            )
        except NotFound:
            return None

    def _record(self, pod: Pod, kept: Sequence[LoanRecord]) -> str:
        """Write ``kept`` as ``pod``'s loan record (none: the annotation removed), on the
        cache's copy's uid and resourceVersion; the lender's new resourceVersion."""
        meta: dict[str, Any] = {
            "uid": pod.uid,
            "annotations": {LOANS_ANNOTATION: records_text(kept) if kept else None},
        }
        if pod.resource_version:
            meta["resourceVersion"] = pod.resource_version
        out = patch_pod(self._api_client, pod.ref, "", {"metadata": meta}, timeout=self._timeout)
        version = out.get("metadata", {}).get("resourceVersion")
        return version if isinstance(version, str) else ""


def read_pod(api_client: Any, ref: PodRef, timeout: float) -> Pod | None:
    """``ref`` as the API server has it now (``None``: gone)."""
    try:
        return parse_pod(request_json(api_client, "GET", pod_path(ref), timeout=timeout))
    except NotFound:
        return None


#: Tries of one give-back or record removal by :func:`return_loans`, a short pause apart.
RETURN_RETRIES: Final = Backoff(initial=0.2, factor=2.0, cap=2.0, attempts=6)


@dataclass(frozen=True, slots=True)
class Returned:
    """What :func:`return_loans` did with one recorded loan."""

    record: LoanRecord
    result: LoanResult


def return_loans(
    api_client: Any, *, node: str | None = None, timeout: float = 10.0
) -> tuple[Returned, ...]:
    """Give back every loan its lenders record (on ``node`` only, when given), for an
    operator about to uninstall: each lender's spec back to each loan's ``before``, the
    latest loan of a container first, then its records removed. No room is checked:
    nothing will make room or give back once the service is gone, so the spec goes back
    now and the kubelet actuates it when the node has room. Lenders are read from the API
    server at every step (no cache runs)."""
    query = f"?fieldSelector=spec.nodeName%3D{quote(node)}" if node else ""
    listed = request_json(api_client, "GET", "/api/v1/pods" + query, timeout=timeout)
    lenders = [
        parse_pod(item)
        for item in listed.get("items") or ()
        if LOANS_ANNOTATION in ((item.get("metadata") or {}).get("annotations") or {})
    ]

    def live(namespace: str, name: str) -> Pod | None:
        return read_pod(api_client, PodRef(namespace, name), timeout)

    resizer = Resizer(api_client, None, Metrics(), lenders=live, request_timeout=timeout)
    return tuple(r for lender in lenders for r in _return_all(resizer, lender))


def _return_all(resizer: Resizer, lender: Pod) -> list[Returned]:
    """Every loan ``lender`` records given back, the latest first, then the records of
    those given back removed; in the order made."""
    results = [
        Returned(
            r, _patiently(functools.partial(resizer.give_back, r.loan, r.borrower, lender.node))
        )
        for r in reversed(records(lender))
    ]
    ended = [r.record for r in results if r.result is not LoanResult.FAILED]
    if ended and _patiently(lambda: resizer.forget(lender.ref, ended)) is LoanResult.FAILED:
        results = [Returned(r.record, LoanResult.FAILED) for r in results]
    return results[::-1]


def _patiently(step: Callable[[], LoanResult]) -> LoanResult:
    """``step`` until it does not fail, at most :data:`RETURN_RETRIES` times. The kubelet
    writes the lender's status often: a patch on the version just read may meet a newer
    one (409), and is made again on a fresh read."""
    outcome = [LoanResult.FAILED]

    def attempt() -> bool:
        outcome[0] = step()
        return outcome[0] is not LoanResult.FAILED

    RETURN_RETRIES.retry(attempt, wait=time.sleep)
    return outcome[0]


__all__ = [
    "LENDING_ACTION",
    "LENT_REASON",
    "REFUSED_REASON",
    "Resizer",
    "Returned",
    "amount_text",
    "lent_note",
    "refused_note",
    "resize_patch",
    "return_loans",
]
