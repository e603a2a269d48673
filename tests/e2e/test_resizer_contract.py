"""The lenders' resizer port's contract, one suite for the double and the resizer.

Every test here runs twice, through the ``subject`` fixture: on
:class:`harness.doubles.FakeResizer` over a :class:`~webhook.engine.memory.FixedClusterView`
of objects kept in memory ("fixed"), and on :class:`webhook.kube.resizer.Resizer` reading
the watch-fed cache and patching ``pods/resize`` of the real API server ("cache").
Lenders are Guaranteed pods asking 2 CPUs, bound to a node no kubelet serves; the loan
lowers them to 1 (limit too). Together they prove that a resizer
(:class:`~webhook.engine.loans.LenderResizer`):

* ``lend``: lowers a lender still asking ``before`` to ``after`` and records the loan on
  it (``lent``); a lender at ``after`` already is ``done``, recorded; a lender gone,
  replaced, leaving or at an amount its owner set is ``void`` and left as it is; a second
  call, once the view shows the first, is ``done`` and records nothing twice;
* ``give_back`` and ``put_back``: raise a lender at ``after`` back to ``before``
  (``lent``); at ``before`` already ``done``; at another amount, or gone, ``void``;
* ``forget``: removes the ended records and keeps the others (``lent``), ``done`` when
  none of them is there, ``void`` when the lender is gone or replaced;
* never raises: a write its API server cannot take is ``failed``, the lender left as it
  was.

The real resizer judges the cache's copy and patches on its resourceVersion: a call
before the cache shows the previous write fails and is judged again (the worker's next
pass). The tests let the view catch up (:attr:`Subject.settle`) between two calls.

``-k fixed`` runs the double's half without a control plane.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.doubles import FakeResizer
from tests.e2e.contract_world import (
    MemoryWorld,
    World,
    eventually,
    ghost,
    loans_annotation,
    make_world,
    node_doc,
    pod_doc,
    unreachable_kubeconfig,
)
from webhook.core.lending import Loan, LoanRecord, loan_key, records, records_text
from webhook.core.model import Pod, PodRef
from webhook.core.objects import parse_pod
from webhook.engine.loans import LenderResizer, LoanResult

BORROWER = PodRef("default", "high-priority-pod", "uid-of-the-borrower")
NODE = "node-of-the-borrower"


@dataclass
class Subject:
    world: World
    resizer: LenderResizer
    #: The lender as it is now in the resizer's world (``None``: gone).
    lender: Callable[[PodRef], Pod | None]
    #: Waits until the view the resizer reads shows the lender as it is now.
    settle: Callable[[PodRef], None]
    #: The same resizer kind, reading the same view, writing to an API server it cannot
    #: reach.
    unreachable: Callable[[], LenderResizer]


def _fake(world: World) -> Subject:
    resizer = FakeResizer(world.view())
    return Subject(
        world,
        resizer,
        resizer.lender,
        lambda _: None,
        lambda: FakeResizer(world.view(), reachable=False),
    )


def _real(world: World, api_clients: Callable[[str], Any], cluster: Any, tmp: Path) -> Subject:
    from webhook.base.metrics import Metrics
    from webhook.kube.resizer import Resizer

    def resizer(kubeconfig: str) -> LenderResizer:
        return Resizer(
            api_clients(kubeconfig), None, Metrics(), lenders=world.view().pod, request_timeout=3
        )

    def lender(ref: PodRef) -> Pod | None:
        stored = world.stored_pod(ref.name, ref.namespace)
        return None if stored is None else parse_pod(stored)

    def settle(ref: PodRef) -> None:
        stored = world.stored_pod(ref.name, ref.namespace)
        version = None if stored is None else stored["metadata"]["resourceVersion"]
        eventually(
            lambda: getattr(world.pod(ref.name, ref.namespace), "resource_version", None),
            version,
            f"the cache to see {ref.name} as stored",
        )

    return Subject(
        world,
        resizer(str(cluster.kubeconfig)),
        lender,
        settle,
        lambda: resizer(unreachable_kubeconfig(cluster, tmp)),
    )


@pytest.fixture(
    params=[
        pytest.param("fixed", id="fixed"),
        pytest.param("cache", id="cache", marks=pytest.mark.e2e),
    ]
)
def subject(request: pytest.FixtureRequest) -> Iterator[Subject]:
    for world in make_world(request):
        if isinstance(world, MemoryWorld):
            yield _fake(world)
        else:
            yield from _real_subject(world, request)


def _real_subject(world: World, request: pytest.FixtureRequest) -> Iterator[Subject]:
    from webhook.kube.client import make_api_client

    clients: list[Any] = []

    def api_client(kubeconfig: str) -> Any:
        clients.append(make_api_client(kubeconfig))
        return clients[-1]

    cluster, tmp = request.getfixturevalue("cluster"), request.getfixturevalue("tmp_path")
    yield _real(world, api_client, cluster, tmp)
    for client in clients:
        client.close()


def lender_pod(subject: Subject, cpu: str = "2", *, annotations: Any = None) -> PodRef:
    """The lender on a node of its own, which no kubelet serves (the API server admits a
    resize only for a pod on a node it knows)."""
    node = subject.world.create(node_doc(ghost()))["metadata"]["name"]
    doc = pod_doc("lender", node, cpu=cpu, phase="Running", annotations=annotations)
    meta = subject.world.create(doc)["metadata"]
    return PodRef(meta["namespace"], meta["name"], meta["uid"])


def loan(ref: PodRef, before: int = 2000, after: int = 1000) -> Loan:
    return Loan(ref, 0, "app", "cpu", before, after, before - after, limits=True)


def cpu(pod: Pod | None) -> tuple[int, int] | None:
    """The lender's container's CPU (request, limit)."""
    if pod is None:
        return None
    return pod.containers[0].requests.cpu, pod.containers[0].limits.cpu


def recorded(pod: Pod | None) -> list[tuple[tuple[str, str, str, int, int], str]]:
    """The lender's loan records as (loan key, borrower name)."""
    return [] if pod is None else [(loan_key(r.loan), r.borrower.name) for r in records(pod)]


# -- lend -----------------------------------------------------------------------------------


def test_lend_lowers_a_lender_asking_before_and_records_the_loan(subject: Subject) -> None:
    ref = lender_pod(subject)

    assert LoanResult.LENT == subject.resizer.lend(loan(ref), BORROWER, NODE)

    lender = subject.lender(ref)
    assert (1000, 1000) == cpu(lender)
    assert [(loan_key(loan(ref)), BORROWER.name)] == recorded(lender)


def test_a_second_lend_once_seen_is_done_and_records_nothing_twice(subject: Subject) -> None:
    ref = lender_pod(subject)
    assert LoanResult.LENT == subject.resizer.lend(loan(ref), BORROWER, NODE)
    subject.settle(ref)

    assert LoanResult.DONE == subject.resizer.lend(loan(ref), BORROWER, NODE)

    lender = subject.lender(ref)
    assert (1000, 1000) == cpu(lender)
    assert [(loan_key(loan(ref)), BORROWER.name)] == recorded(lender)


def test_lend_from_a_lender_at_after_already_is_done_and_recorded(subject: Subject) -> None:
    ref = lender_pod(subject, cpu="1")

    assert LoanResult.DONE == subject.resizer.lend(loan(ref), BORROWER, NODE)

    lender = subject.lender(ref)
    assert (1000, 1000) == cpu(lender)
    assert [(loan_key(loan(ref)), BORROWER.name)] == recorded(lender)


@dataclass(frozen=True)
class Void:
    """A lender as ``change`` leaves it (its ref given), and its CPU after the call."""

    change: Callable[[Subject, PodRef], PodRef]
    cpu: tuple[int, int] | None


def _deleted(subject: Subject, ref: PodRef) -> PodRef:
    subject.world.delete_pod(ref.name, grace=0)
    return ref


def _replaced(subject: Subject, ref: PodRef) -> PodRef:
    subject.world.delete_pod(ref.name, grace=0)
    lender_pod(subject)
    return ref


def _leaving(subject: Subject, ref: PodRef) -> PodRef:
    subject.world.delete_pod(ref.name)
    return ref


VOID_LENDS = [
    pytest.param(Void(_deleted, None), id="gone"),
    pytest.param(Void(_replaced, (2000, 2000)), id="replaced-under-its-name"),
    pytest.param(Void(_leaving, (2000, 2000)), id="leaving"),
]


@pytest.mark.parametrize("case", VOID_LENDS)
def test_lend_from_a_lender_gone_replaced_or_leaving_is_void(subject: Subject, case: Void) -> None:
    ref = case.change(subject, lender_pod(subject))

    assert LoanResult.VOID == subject.resizer.lend(loan(ref), BORROWER, NODE)

    # Whatever now has the lender's name, read by name.
    lender = subject.lender(PodRef(ref.namespace, ref.name, ""))
    assert case.cpu == cpu(lender)
    assert [] == recorded(lender)


def test_lend_from_a_lender_its_owner_set_to_another_amount_is_void(subject: Subject) -> None:
    ref = lender_pod(subject, cpu="1500m")

    assert LoanResult.VOID == subject.resizer.lend(loan(ref), BORROWER, NODE)

    lender = subject.lender(ref)
    assert (1500, 1500) == cpu(lender)
    assert [] == recorded(lender)


# -- give back, put back --------------------------------------------------------------------


def give_back(subject: Subject, made: Loan) -> LoanResult:
    return subject.resizer.give_back(made, BORROWER, NODE)


def put_back(subject: Subject, made: Loan) -> LoanResult:
    return subject.resizer.put_back(made, BORROWER, NODE, "the kubelet refused it")


RAISES = pytest.mark.parametrize(
    "back",
    [pytest.param(give_back, id="give-back"), pytest.param(put_back, id="put-back")],
)


@RAISES
@pytest.mark.parametrize(
    ("at", "expected", "after_call"),
    [
        pytest.param("1", LoanResult.LENT, (2000, 2000), id="at-after-raised-to-before"),
        pytest.param("2", LoanResult.DONE, (2000, 2000), id="at-before-already"),
        pytest.param("1500m", LoanResult.VOID, (1500, 1500), id="at-another-amount"),
    ],
)
def test_a_lender_is_raised_back_only_from_after(
    subject: Subject,
    back: Callable[[Subject, Loan], LoanResult],
    at: str,
    expected: LoanResult,
    after_call: tuple[int, int],
) -> None:
    ref = lender_pod(subject, cpu=at)

    assert expected == back(subject, loan(ref))
    assert after_call == cpu(subject.lender(ref))


@RAISES
def test_raising_back_a_lender_gone_is_void(
    subject: Subject, back: Callable[[Subject, Loan], LoanResult]
) -> None:
    ref = lender_pod(subject, cpu="1")
    subject.world.delete_pod(ref.name, grace=0)

    assert LoanResult.VOID == back(subject, loan(ref))
    assert subject.lender(ref) is None


def test_a_loan_made_then_given_back_leaves_the_lender_at_before(subject: Subject) -> None:
    ref = lender_pod(subject)
    assert LoanResult.LENT == subject.resizer.lend(loan(ref), BORROWER, NODE)
    subject.settle(ref)

    assert LoanResult.LENT == give_back(subject, loan(ref))
    assert (2000, 2000) == cpu(subject.lender(ref))


# -- forget ---------------------------------------------------------------------------------


FIRST, SECOND = (2000, 1500), (1500, 1000)


def two_records(subject: Subject) -> tuple[PodRef, LoanRecord, LoanRecord]:
    """A lender at 1 CPU recording two loans (2 -> 1.5 -> 1), read back from its world."""
    ghost_ref = PodRef("", "", "")
    text = records_text(
        LoanRecord(loan(ghost_ref, *made), BORROWER, 1_000_000.0) for made in (FIRST, SECOND)
    )
    ref = lender_pod(subject, cpu="1", annotations=loans_annotation(text))
    first, second = records(subject.lender(ref))  # type: ignore[arg-type]
    return ref, first, second


def test_forget_removes_the_ended_records_and_keeps_the_others(subject: Subject) -> None:
    ref, first, second = two_records(subject)

    assert LoanResult.LENT == subject.resizer.forget(ref, [first])

    assert [(loan_key(second.loan), BORROWER.name)] == recorded(subject.lender(ref))


def test_forget_of_records_no_longer_there_is_done(subject: Subject) -> None:
    ref, first, second = two_records(subject)
    assert LoanResult.LENT == subject.resizer.forget(ref, [first])
    subject.settle(ref)

    assert LoanResult.DONE == subject.resizer.forget(ref, [first])
    assert [(loan_key(second.loan), BORROWER.name)] == recorded(subject.lender(ref))


def test_forget_of_the_last_records_leaves_none(subject: Subject) -> None:
    ref, first, second = two_records(subject)

    assert LoanResult.LENT == subject.resizer.forget(ref, [first, second])

    assert [] == recorded(subject.lender(ref))


@pytest.mark.parametrize(
    "change",
    [pytest.param(_deleted, id="gone"), pytest.param(_replaced, id="replaced-under-its-name")],
)
def test_forget_on_a_lender_gone_or_replaced_is_void(
    subject: Subject, change: Callable[[Subject, PodRef], PodRef]
) -> None:
    ref, first, _ = two_records(subject)
    change(subject, ref)

    assert LoanResult.VOID == subject.resizer.forget(ref, [first])


# -- never raises ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("at", "call"),
    [
        pytest.param("2", lambda r, made: r.lend(made, BORROWER, NODE), id="lend"),
        pytest.param("1", lambda r, made: r.give_back(made, BORROWER, NODE), id="give-back"),
        pytest.param(
            "1", lambda r, made: r.put_back(made, BORROWER, NODE, "refused"), id="put-back"
        ),
    ],
)
def test_an_api_server_out_of_reach_is_failed_not_raised(
    subject: Subject, at: str, call: Callable[[LenderResizer, Loan], LoanResult]
) -> None:
    ref = lender_pod(subject, cpu=at)
    before = cpu(subject.lender(ref))

    assert LoanResult.FAILED == call(subject.unreachable(), loan(ref))
    assert before == cpu(subject.lender(ref))
    assert [] == recorded(subject.lender(ref))


def test_forget_with_an_api_server_out_of_reach_is_failed_not_raised(subject: Subject) -> None:
    ref, first, _ = two_records(subject)

    assert LoanResult.FAILED == subject.unreachable().forget(ref, [first])
    assert 2 == len(recorded(subject.lender(ref)))
