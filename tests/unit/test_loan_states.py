"""A loan's states (``lifecycle.states.loan_phase``), the keep rule every ledger change writes
through, loans recorded on their lenders, and the orphans whose entry was lost."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

from dataclasses import replace

import pytest

from harness.doubles import FakeEvictor, FakeResizer, InMemoryLedger, StaticClusterView
from tests.unit.test_giveback import BORROWED, HIGH_AT_6, HIGH_BACK_TO_4, MID
from tests.unit.test_worker import Clock, make_worker
from tests.unit.test_worker_logic import ADMITTED, LOAN, NODE, NOW, entry, pod, ref
from webhook.base.settings import Config
from webhook.core.lending import LoanRecord, records, records_text
from webhook.core.model import LOANS_ANNOTATION, Pod
from webhook.core.snapshot import Snapshot
from webhook.engine.ledger import LedgerEntry
from webhook.engine.lifecycle.changes import drop_victims, release, tidy
from webhook.engine.lifecycle.give_back import ORPHAN_PREFIX, ended_records, give_backs, orphans
from webhook.engine.lifecycle.states import LoanPhase, loan_phase, owes, to_keep
from webhook.engine.status import service_status

LENT = pod("lender", cpu="1")  # made and actuated
AT_BEFORE = pod("lender", cpu="3")  # never made, or given back and actuated
RETURNING = pod("lender", cpu="3", allocated="1")  # given back, the kubelet not caught up
OWNER_CHANGED = pod("lender", cpu="2")


def recorded(lender: Pod, *loans: object) -> Pod:
    """``lender`` carrying the record of ``loans`` (those of ``BORROWED``'s borrower)."""
    text = records_text(LoanRecord(loan, ref("high"), ADMITTED) for loan in loans)  # type: ignore[arg-type]
    return replace(lender, annotations={LOANS_ANNOTATION: text})


@pytest.mark.parametrize(
    ("expected", "lender", "refused", "holding"),
    [
        pytest.param("to-lend", AT_BEFORE, False, True, id="planned"),
        pytest.param("ended", AT_BEFORE, False, False, id="never-made-and-not-needed"),
        pytest.param("lent", LENT, False, True, id="lent"),
        pytest.param("due", LENT, False, False, id="due-once-the-entry-holds-no-room"),
        pytest.param("returning", RETURNING, False, False, id="returning"),
        pytest.param("ended", OWNER_CHANGED, False, False, id="void-owner-changed-it"),
        pytest.param("ended", None, False, True, id="void-lender-gone"),
        pytest.param("refused", pod("lender", cpu="1", allocated="1"), True, True, id="refused"),
        pytest.param("putting-back", RETURNING, True, True, id="putting-back"),
        pytest.param("ended", AT_BEFORE, True, True, id="put-back"),
    ],
)
def test_loan_phase(expected: LoanPhase, lender: Pod | None, refused: bool, holding: bool) -> None:
    assert expected == loan_phase(LOAN, lender, refused=refused, holding=holding)


EXPIRED = replace(BORROWED, expires_at=NOW - 1)


@pytest.mark.parametrize(
    ("expected", "pods"),
    [
        pytest.param((EXPIRED,), (HIGH_BACK_TO_4, LENT, MID), id="owes-a-lent-loan"),
        pytest.param((EXPIRED,), (HIGH_BACK_TO_4, RETURNING, MID), id="owes-a-returning-loan"),
        pytest.param((), (HIGH_BACK_TO_4, AT_BEFORE, MID), id="returned"),
        pytest.param((), (HIGH_BACK_TO_4, OWNER_CHANGED, MID), id="void"),
    ],
)
def test_an_expired_entry_is_kept_exactly_while_it_owes_a_loan(
    expected: tuple[LedgerEntry, ...], pods: tuple[Pod, ...]
) -> None:
    assert expected == to_keep((EXPIRED,), pods, NOW)


def test_every_change_writes_through_the_keep_rule() -> None:
    """A change made for one entry also drops what the rule drops, and keeps what owes."""
    spent = entry(pod_name="gone", review="review-spent", expires_at=NOW - 1)
    other = entry("low", pod_name="other", review="review-2")
    pods = (HIGH_BACK_TO_4, LENT, MID)
    entries = (EXPIRED, spent, other)

    dropped, found = drop_victims("review-2", ("uid-low",), pods, NOW)(entries)
    tidied, _ = tidy(pods, NOW)(entries)
    released, _ = release("review-2", pods, NOW)(entries)

    assert (True, (EXPIRED, replace(other, victims=()))) == (found, dropped)
    assert (EXPIRED, other) == tidied
    assert (EXPIRED,) == released


def test_a_released_entry_with_loans_stays_until_they_are_returned() -> None:
    pods = (HIGH_AT_6, LENT, MID)

    [kept], _ = release(BORROWED.review_uid, pods, NOW)((BORROWED,))

    assert ((), True) == (kept.victims, owes(kept, {p.uid: p for p in pods}, NOW))
    assert (None, False) == release(BORROWED.review_uid, pods, NOW)(())
    # Returned: released again it changes nothing, and the next write drops it.
    returned = (HIGH_AT_6, AT_BEFORE, MID)
    assert (None, True) == release(BORROWED.review_uid, returned, NOW)((kept,))
    assert ((), True) == tidy(returned, NOW)((kept,))


def test_records_read_back_what_was_written_and_skip_what_does_not_read() -> None:
    lender = recorded(LENT, LOAN)
    broken = replace(LENT, annotations={LOANS_ANNOTATION: '[{"resource": "gpu"}, 7]'})

    [record] = records(lender)

    assert (LOAN, ref("high"), ADMITTED) == (record.loan, record.borrower, record.at)
    assert () == records(broken)
    assert () == records(replace(LENT, annotations={LOANS_ANNOTATION: "not json"}))


def test_an_orphan_is_a_loan_recorded_on_its_lender_that_no_entry_holds() -> None:
    lender = recorded(LENT, LOAN)

    [orphan] = orphans((), (HIGH_BACK_TO_4, lender, MID))

    assert () == orphans((BORROWED,), (HIGH_BACK_TO_4, lender, MID))
    assert (True, ref("high"), (LOAN,), ADMITTED) == (
        orphan.review_uid.startswith(ORPHAN_PREFIX),
        orphan.pod,
        orphan.loans,
        orphan.expires_at,
    )


@pytest.mark.parametrize(
    ("expected", "pods"),
    [
        pytest.param(("lender",), (HIGH_BACK_TO_4, recorded(LENT, LOAN), MID), id="room"),
        pytest.param((), (HIGH_AT_6, recorded(LENT, LOAN), MID), id="no-room-yet"),
    ],
)
def test_an_orphan_is_given_back_as_any_due_loan(
    expected: tuple[str, ...], pods: tuple[Pod, ...]
) -> None:
    assert expected == tuple(g.loan.pod.name for g in give_backs(NODE, pods, (), NOW))


@pytest.mark.parametrize(
    ("expected", "lender", "entries"),
    [
        pytest.param(1, recorded(AT_BEFORE, LOAN), (), id="returned-and-no-entry"),
        pytest.param(1, recorded(OWNER_CHANGED, LOAN), (), id="void-and-no-entry"),
        pytest.param(
            0, recorded(AT_BEFORE, LOAN), (BORROWED,), id="an-entry-holding-room-may-lend-it"
        ),
        pytest.param(
            1, recorded(AT_BEFORE, LOAN), (EXPIRED,), id="an-entry-holding-no-room-will-not"
        ),
        pytest.param(0, recorded(LENT, LOAN), (), id="lent-is-given-back-first"),
        pytest.param(0, recorded(RETURNING, LOAN), (), id="returning-keeps-its-record"),
    ],
)
def test_a_record_is_removed_once_its_loan_ended_and_no_entry_holds_it(
    expected: int, lender: Pod, entries: tuple[LedgerEntry, ...]
) -> None:
    borrowing = replace(pod("high", cpu="6", allocated="2", priority=1000), generation=1)
    found = ended_records(entries, (borrowing, lender, MID), NOW)

    assert expected == sum(len(r) for r in found.values())


def test_the_worker_gives_an_orphan_back_then_removes_its_record() -> None:
    log: list[str] = []
    resizer = FakeResizer(log=log)
    cluster = StaticClusterView([NODE], (HIGH_BACK_TO_4, recorded(LENT, LOAN), MID))
    worker = make_worker(cluster, InMemoryLedger(), FakeEvictor(), Clock(NOW), resizer=resizer)  # type: ignore[arg-type]

    worker.run_once()
    returned = StaticClusterView([NODE], (HIGH_BACK_TO_4, recorded(AT_BEFORE, LOAN), MID))
    worker.cluster = returned
    worker.lending.cluster = returned
    resizer.view = returned
    worker.run_once()

    assert ["give back lender 1000->3000", "forget lender"] == log


def test_status_lists_an_orphan_loan() -> None:
    lender = recorded(LENT, LOAN)
    snapshot = Snapshot({NODE.name: NODE}, (HIGH_BACK_TO_4, lender, MID), {}, (), ())

    status = service_status(snapshot, (), None, Config(), now=NOW)

    [node] = status.nodes
    assert [("default/lender", "lent", "default/high", True)] == [
        (s.loan.pod.key, s.state, s.borrower.key, s.orphan) for s in node.loans
    ]
