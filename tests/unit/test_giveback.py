"""Giving loans back: only once the borrower holds its room, only into room nobody more
important waits for, most important lender first."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from tests.unit.test_worker_logic import ADMITTED, LOAN, NODE, NOW, entry, pod, ref
from webhook.core.lending import Loan, loan_state
from webhook.core.model import Pod
from webhook.engine.ledger import LedgerEntry
from webhook.engine.lifecycle.give_back import give_backs
from webhook.engine.lifecycle.states import to_keep

# "high" (priority 1000) borrowed 2 CPUs from "lender" (priority 0, 3 -> 1) to grow to 6
# on 8; "mid" (priority 2000) holds 1.
BORROWED = replace(entry(), loans=(LOAN,), generation=1)
HIGH_AT_6 = replace(pod("high", cpu="6", priority=1000), generation=1)
HIGH_BACK_TO_4 = replace(pod("high", cpu="4", priority=1000), generation=2)
LENT = pod("lender", cpu="1", lent=(LOAN,))
LOAN_2 = Loan(ref("lender-2"), 500, "app", "cpu", 3000, 1000, 2000)
MID = pod("mid", cpu="1", priority=2000)
MID_0 = pod("mid", cpu="0", priority=2000)


@dataclass(frozen=True)
class Case:
    pods: tuple[Pod, ...]
    #: Lenders given back to, in order.
    expected: tuple[str, ...]
    entries: tuple[LedgerEntry, ...] = (BORROWED,)


CASES = [
    pytest.param(Case((HIGH_AT_6, LENT, MID), ()), id="no-room-while-the-borrower-holds-it"),
    pytest.param(Case((HIGH_BACK_TO_4, LENT, MID), ("lender",)), id="room-again-given-back"),
    pytest.param(
        Case(
            (replace(pod("high", cpu="6", allocated="2", priority=1000), generation=1), LENT, MID),
            (),
        ),
        id="not-before-the-borrower-s-resize-is-actuated",
    ),
    pytest.param(
        Case(
            (
                HIGH_BACK_TO_4,
                LENT,
                pod("mid", cpu="3", allocated="1", priority=2000, resize="Deferred"),
            ),
            (),
        ),
        id="a-more-important-pending-growth-comes-first",
    ),
    pytest.param(
        Case(
            (
                HIGH_BACK_TO_4,
                LENT,
                pod("mid", cpu="3", allocated="1", priority=-5, resize="Deferred"),
            ),
            ("lender",),
        ),
        id="a-less-important-pending-growth-does-not",
    ),
    pytest.param(
        Case(
            (HIGH_BACK_TO_4, LENT, MID),
            (),
            entries=(BORROWED, entry(pod_name="other", review="review-2", desired_cpu=2000)),
        ),
        id="a-reservation-comes-first",
    ),
    pytest.param(Case((HIGH_BACK_TO_4, pod("lender", cpu="2"), MID), ()), id="owner-changed-it"),
    pytest.param(Case((HIGH_BACK_TO_4, MID), ()), id="lender-gone"),
    pytest.param(
        Case((HIGH_BACK_TO_4, pod("lender", cpu="1"), MID), ()),
        id="a-loan-its-lender-holds-no-record-of-is-not-given-back",
    ),
    pytest.param(
        Case((HIGH_BACK_TO_4, pod("lender", cpu="3", allocated="1"), MID), ()),
        id="given-back-already",
    ),
    pytest.param(
        Case(
            (HIGH_BACK_TO_4, LENT, pod("lender-2", cpu="1", priority=500, lent=(LOAN_2,)), MID_0),
            ("lender-2",),
            entries=(replace(BORROWED, loans=(LOAN, LOAN_2)),),
        ),
        id="room-for-one-the-most-important-lender-first",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_give_backs(case: Case) -> None:
    returned = give_backs(NODE, case.pods, case.entries, NOW)

    assert case.expected == tuple(g.loan.pod.name for g in returned)


def test_lent_twice_returns_the_later_loan_first() -> None:
    again = replace(LOAN, before=1000, after=500, frees=500)
    twice = replace(BORROWED, loans=(LOAN, again))
    pods = (HIGH_BACK_TO_4, pod("lender", cpu="500m", lent=(LOAN, again)), MID_0)

    [give] = give_backs(NODE, pods, (twice,), NOW)

    assert (500, 1000) == (give.loan.after, give.loan.before)


def test_an_entry_stays_until_its_loans_are_given_back_and_actuated() -> None:
    spent = (HIGH_BACK_TO_4, MID)

    assert (BORROWED,) == to_keep((BORROWED,), (*spent, LENT), NOW)
    assert (BORROWED,) == to_keep((BORROWED,), (*spent, pod("lender", cpu="3", allocated="1")), NOW)
    assert () == to_keep((BORROWED,), (*spent, pod("lender", cpu="3")), NOW)
    assert () == to_keep((BORROWED,), (*spent, pod("lender", cpu="2")), NOW)  # owner's spec won


@pytest.mark.parametrize(
    ("expected", "lender"),
    [
        pytest.param("lent", LENT, id="lent"),
        pytest.param(
            "returning", pod("lender", cpu="3", allocated="1"), id="given-back-not-actuated"
        ),
        pytest.param("to-lend", pod("lender", cpu="3"), id="given-back-and-actuated"),
        pytest.param("void", pod("lender", cpu="2"), id="owner-changed-it"),
        pytest.param("void", None, id="gone"),
    ],
)
def test_a_loan_given_back_is_returning_until_the_kubelet_allocates_it(
    expected: str, lender: Pod | None
) -> None:
    assert expected == loan_state(LOAN, lender)


def test_expired_entries_still_give_back() -> None:
    expired = replace(BORROWED, expires_at=ADMITTED)

    assert ("lender",) == tuple(
        g.loan.pod.name for g in give_backs(NODE, (HIGH_BACK_TO_4, LENT, MID), (expired,), NOW)
    )
