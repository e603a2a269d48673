"""A loan the kubelet refuses: recorded in the entry, the lender put back, the plan made
again without it, and nothing lost.

The scene, memory only (node 16Gi): "high" (priority 1000) grows 4Gi -> 8Gi with 2Gi free.
"batch-1" (priority 10, Guaranteed, 6Gi, floor 2Gi) is the least important lender and
lends 2Gi (6Gi -> 4Gi) with ``lend-memory-limits`` on; the kubelet refuses to lower its
memory limit below what it uses. "batch-2" (priority 100, Burstable, request 4Gi, floor
1Gi) can lend instead."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.doubles import FakeEvictor, FakeResizer, InMemoryLedger, with_records
from tests.unit.builders import make_pod
from tests.unit.test_worker import Clock, Cluster, make_worker
from tests.unit.test_worker_logic import ADMITTED, CONFIG, NODE, NOW
from webhook.base.metrics import Metrics
from webhook.core.lending import Loan, LoanRecord, refusal_state, refused, room
from webhook.core.model import Pod, PodRef
from webhook.core.plan import NodePods, plan_resize
from webhook.core.policy import DefaultPolicy
from webhook.core.resources import ZERO, Resources, memory_bytes
from webhook.engine.ledger import LedgerEntry
from webhook.engine.lifecycle.changes import record_refusal, refuse
from webhook.engine.lifecycle.give_back import give_backs
from webhook.engine.lifecycle.next_step import Act, Refuse, Release, next_action
from webhook.engine.lifecycle.states import is_give_back, to_keep, to_put_back

GI = 1024**3
REFUSAL = (
    "cannot decrease memory limits: attempting to set pod memory limit (4294967296) "
    "below current usage (5368709120)"
)


def high(memory: str = "4Gi") -> Pod:
    """The borrower, its resize to 8Gi in the spec; the kubelet holds ``memory`` for it."""
    return (
        make_pod("high")
        .priority(1000)
        .requests(cpu="1", memory="8Gi")
        .holding(cpu="1", memory=memory)
        .generation(2)
        .build()
    )


def batch_1(
    spec: str = "6Gi",
    *,
    allocated: str | None = None,
    running: str | None = None,
    error_generation: int | None = None,
    generation: int = 1,
) -> Pod:
    """The Guaranteed lender at ``spec``; the kubelet allocated ``allocated`` and runs it at
    ``running`` (default: ``spec``); ``error_generation``: it reports an error actuating."""
    b = (
        make_pod("batch-1")
        .priority(10)
        .requests(cpu="1", memory=spec)
        .qos("Guaranteed")
        .floor(memory="2Gi")
        .generation(generation)
        .status(
            allocated={"cpu": "1", "memory": allocated or spec},
            actual={"cpu": "1", "memory": running or spec},
        )
    )
    if error_generation is not None:
        b = b.resize_error(REFUSAL, error_generation)
    if allocated or running:
        # The kubelet's pod-level aggregates follow the allocation, not what runs.
        held = memory_bytes(allocated or spec)
        b = b.pod_status_resources(Resources(1000, held), Resources(1000, held))
    return b.build()


def batch_2(*, floor: bool = True, spec: str = "4Gi") -> Pod:
    """The Burstable pod: request ``spec``, limit 8Gi."""
    b = make_pod("batch-2").priority(100).requests(cpu="1", memory=spec).limits(memory="8Gi")
    if floor:
        b = b.floor(memory="1Gi")
    return b.admitted().build()


#: batch-1 lent (spec 4Gi, allocated 4Gi), the kubelet refused to actuate it (runs at 6Gi).
REFUSED = batch_1("4Gi", running="6Gi", error_generation=2, generation=2)
#: batch-1 put back (spec 6Gi) while the kubelet still allocates it only 4Gi.
RESTORING = batch_1("6Gi", allocated="4Gi", error_generation=2, generation=3)


def admitted_entry() -> LedgerEntry:
    """The entry the admission writes for "high" on the scene with ``lend-memory-limits``
    on: one loan, from batch-1's memory, its limit lowered too. (By default a Guaranteed
    pod's memory never lends, and batch-2 lends instead: ``lending.lends``.)"""
    old = make_pod("high").priority(1000).requests(cpu="1", memory="4Gi").admitted().build()
    new = replace(high(), statuses={})
    scene = NodePods(NODE, (old, batch_1(), batch_2()))
    plan = plan_resize(old, new, scene, now=NOW, policy=DefaultPolicy(lend_memory_limits=True))
    default = plan_resize(old, new, scene, now=NOW)
    assert ("preempt", "lend", ["batch-1"], ["batch-2"]) == (
        plan.verdict,
        plan.code,
        [loan.pod.name for loan in plan.loans],
        [loan.pod.name for loan in default.loans],
    )
    return LedgerEntry.for_plan(
        replace(new, generation=2), plan, review_uid="review-1", now=ADMITTED, ttl=120.0
    )


ENTRY = admitted_entry()
[LOAN_1] = ENTRY.loans
LOAN_2 = Loan(
    PodRef("default", "batch-2", "uid-default-batch-2"),
    100,
    "app",
    "memory",
    4 * GI,
    2 * GI,
    2 * GI,
)


# batch-1 carries its own record of the loan, written before it was lent: only a loan so
# recorded is put back or given back.
REFUSED = with_records(REFUSED, (LoanRecord(LOAN_1, ENTRY.pod, ADMITTED),))
RESTORING = with_records(RESTORING, (LoanRecord(LOAN_1, ENTRY.pod, ADMITTED),))


def decide(entry: LedgerEntry, *pods: Pod) -> object:
    return next_action(entry, pods[0], NODE, pods, now=NOW, config=CONFIG)


def test_the_admitted_plan_borrows_from_the_least_important_lender() -> None:
    assert (
        Loan(LOAN_1.pod, 10, "app", "memory", 6 * GI, 4 * GI, 2 * GI, limits=True),
        (),
    ) == (LOAN_1, ENTRY.victims)


@dataclass(frozen=True)
class RefusalCase:
    lender: Pod
    expected: bool


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(RefusalCase(REFUSED, True), id="refused"),
        pytest.param(RefusalCase(batch_1("4Gi", running="6Gi"), False), id="not-actuated-yet"),
        pytest.param(
            RefusalCase(batch_1("4Gi", running="6Gi", error_generation=1, generation=2), False),
            id="error-about-an-older-spec",
        ),
        pytest.param(
            RefusalCase(batch_1("4Gi", error_generation=2, generation=2), False),
            id="actuated-after-all",
        ),
        pytest.param(RefusalCase(batch_1("6Gi", error_generation=1), False), id="not-lent"),
    ],
)
def test_a_loan_is_refused_only_when_the_kubelet_reports_an_error_for_the_lent_spec(
    case: RefusalCase,
) -> None:
    assert case.expected == refused(LOAN_1, case.lender)


@dataclass(frozen=True)
class ReplanCase:
    borrower: Pod
    others: tuple[Pod, ...]
    loans: tuple[Loan, ...]
    victims: tuple[str, ...]


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            ReplanCase(high("8Gi"), (batch_2(),), (LOAN_2,), ()),
            id="borrower-admitted-on-the-refused-loan-borrows-elsewhere",
        ),
        pytest.param(
            ReplanCase(high("4Gi"), (batch_2(),), (LOAN_2,), ()),
            id="borrower-not-admitted-yet-borrows-elsewhere",
        ),
        pytest.param(
            # The refused lender is an ordinary candidate now, and the least important.
            ReplanCase(high("8Gi"), (batch_2(floor=False),), (), ("batch-1",)),
            id="no-other-lender-evicts-the-least-important",
        ),
    ],
)
def test_a_refused_loan_is_recorded_and_planned_again_without_its_lender(
    case: ReplanCase,
) -> None:
    action = decide(ENTRY, case.borrower, REFUSED, *case.others)

    assert isinstance(action, Refuse)
    assert action.plan is not None
    assert ((LOAN_1,), REFUSAL) == (action.loans, action.why)
    assert (case.loans, case.victims) == (
        action.plan.loans,
        tuple(v.pod.name for v in action.plan.victims),
    )


def test_a_refusal_with_no_plan_left_is_still_recorded() -> None:
    # The borrower may not preempt (any more): nothing is planned, the refusal recorded.
    never = replace(high("8Gi"), preemption_policy="Never")

    action = decide(ENTRY, never, REFUSED, batch_2())

    assert isinstance(action, Refuse)
    assert ((LOAN_1,), None) == (action.loans, action.plan)


def test_recording_a_refusal_replaces_the_plan_and_is_idempotent() -> None:
    action = decide(ENTRY, high("8Gi"), REFUSED, batch_2())
    assert isinstance(action, Refuse)

    once = record_refusal(ENTRY, action)

    assert ((LOAN_2,), (LOAN_1,), ()) == (once.loans, once.refused, once.victims)
    assert once == record_refusal(once, action)
    assert once == LedgerEntry.from_json(once.to_json())
    assert "refused" not in ENTRY.to_json()


@pytest.mark.parametrize(
    ("lender", "state", "put_back"),
    [
        pytest.param(REFUSED, "refused", True, id="still-lent"),
        pytest.param(RESTORING, "putting-back", False, id="put-back-not-admitted"),
        pytest.param(batch_1("6Gi", generation=3), "ended", False, id="back-at-its-spec"),
        pytest.param(batch_1("5Gi", generation=3), "ended", False, id="owner-changed-it"),
    ],
)
def test_a_refused_loan_is_put_back_while_the_lender_asks_for_the_loan(
    lender: Pod, state: str, put_back: bool
) -> None:
    recorded = replace(ENTRY, loans=(), refused=(LOAN_1,))

    assert state == refusal_state(LOAN_1, lender)
    assert put_back == (to_put_back(recorded, (high("8Gi"), lender)) == (LOAN_1,))


def test_a_borrower_actuated_on_a_refused_loan_is_not_done_until_the_lender_has_its_room() -> None:
    recorded = replace(ENTRY, loans=(LOAN_2,), refused=(LOAN_1,))

    owing = decide(recorded, high("8Gi"), RESTORING, batch_2())
    settled = decide(recorded, high("8Gi"), batch_1("6Gi", generation=3), batch_2(spec="2Gi"))

    assert isinstance(owing, Act)
    assert (LOAN_2,) == owing.lend
    assert isinstance(settled, Release)
    assert "actuated" == settled.reason


def test_an_entry_owing_a_lender_its_room_is_kept_until_it_expires() -> None:
    recorded = replace(ENTRY, loans=(), refused=(LOAN_1,))
    pods = (high("8Gi"), RESTORING)

    assert (recorded,) == to_keep((recorded,), pods, NOW)
    assert () == to_keep((recorded,), pods, recorded.expires_at)


def worker_on(cluster: Cluster, entry: LedgerEntry, metrics: Metrics) -> tuple[object, FakeResizer]:
    ledger = InMemoryLedger()
    ledger.update(entry.node, lambda es: ((*es, entry), None))
    resizer = FakeResizer()
    worker = make_worker(
        cluster, ledger, FakeEvictor(), Clock(NOW), metrics=metrics, resizer=resizer
    )
    return worker, resizer


def refused_count(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value("resize_preemption_loans_total", {"result": "refused"})


def test_the_worker_records_the_refusal_puts_the_lender_back_and_borrows_elsewhere() -> None:
    metrics = Metrics()
    cluster = Cluster(high("8Gi"), REFUSED, batch_2())
    worker, resizer = worker_on(cluster, ENTRY, metrics)

    worker.run_once()
    [recorded] = worker.ledger.all_entries()
    cluster.set(high("8Gi"), RESTORING, batch_2())
    worker.run_once()

    assert ((LOAN_2,), (LOAN_1,)) == (recorded.loans, recorded.refused)
    assert [f"put back batch-1: {REFUSAL}", "lend batch-2"] == resizer.log
    assert 1.0 == refused_count(metrics)


def test_a_restart_between_recording_and_putting_back_puts_back_once_and_counts_once() -> None:
    metrics = Metrics()
    recorded = replace(ENTRY, loans=(LOAN_2,), refused=(LOAN_1,))
    worker, resizer = worker_on(Cluster(high("8Gi"), REFUSED, batch_2()), recorded, metrics)

    worker.run_once()

    assert [f"put back batch-1: {REFUSAL}", "lend batch-2"] == resizer.log
    assert refused_count(metrics) is None


def test_the_kubelet_error_is_parsed_with_the_generation_it_is_about() -> None:
    assert (REFUSAL, 2, 2) == (
        REFUSED.resize_error,
        REFUSED.resize_error_generation,
        REFUSED.generation,
    )
    assert ("", 0) == (batch_2().resize_error, batch_2().resize_error_generation)


def test_a_pod_whose_resize_the_kubelet_cannot_actuate_lends_nothing() -> None:
    assert (Resources(0, 3 * GI), ZERO) == (
        room(batch_2()),
        room(replace(batch_2(), resize_error=REFUSAL)),
    )


def test_a_guaranteed_pods_memory_floor_lends_nothing() -> None:
    """Its limit would go down with its request: usage that grows past it later is
    OOM-killed (docs/lending.md, "A lender's memory")."""
    assert (ZERO, ZERO) == (room(batch_1()), room(REFUSED))


def test_nothing_is_given_back_into_the_room_a_refused_lender_is_owed() -> None:
    # The borrower holds its 8Gi; the kubelet still reports batch-1 at the 4Gi it
    # allocated, though batch-1 asks for 6Gi again: 8 + 4 + 4 would fit, 8 + 6 + 4 does not.
    recorded = replace(ENTRY, loans=(LOAN_2,), refused=(LOAN_1,))
    lent = with_records(batch_2(spec="2Gi"), (LoanRecord(LOAN_2, ENTRY.pod, ADMITTED),))

    owed = give_backs(NODE, (high("8Gi"), RESTORING, lent), (recorded,), NOW)
    none_owed = give_backs(
        NODE, (high("8Gi"), RESTORING, lent), (replace(recorded, refused=()),), NOW
    )

    assert ((), (LOAN_2,)) == (owed, tuple(g.loan for g in none_owed))


def test_a_refused_lender_put_back_is_never_preempted_for() -> None:
    recorded = replace(ENTRY, loans=(), refused=(LOAN_1,))
    # Without its own record: the entry alone says it is a loan put back.
    restoring = with_records(RESTORING, ())

    assert (True, False) == (
        is_give_back(restoring, (recorded,)),
        is_give_back(restoring, (replace(recorded, refused=()),)),
    )


def test_a_refusal_is_recorded_once() -> None:
    action = decide(ENTRY, high("8Gi"), REFUSED, batch_2())
    assert isinstance(action, Refuse)
    change = refuse(ENTRY.review_uid, action, (), NOW)

    first, recorded = change((ENTRY,))
    assert first is not None
    again, recorded_again = change(first)

    assert (True, None, False) == (recorded, again, recorded_again)


def _loans(draw: st.DrawFn) -> tuple[Loan, ...]:
    count = draw(st.integers(min_value=0, max_value=5))
    return tuple(
        Loan(
            PodRef("default", f"lender-{i}", f"uid-{i}"),
            i,
            "app",
            draw(st.sampled_from(("cpu", "memory"))),
            4000 + i,
            1000 + i,
            3000,
        )
        for i in range(count)
    )


@given(st.data())
def test_recording_refusals_loses_no_loan_and_is_idempotent(data: st.DataObject) -> None:
    loans = data.draw(st.composite(_loans)())
    refusing = tuple(lo for lo in loans if data.draw(st.booleans()))
    before = replace(ENTRY, loans=loans)
    action = Refuse(refusing, None, REFUSAL)

    once = record_refusal(before, action)

    assert once == record_refusal(once, action)
    assert refusing == once.refused
    assert tuple(lo for lo in loans if lo not in refusing) == once.loans
