"""When an admitted resize stops holding room: the cluster shows it holds nothing any more
(:func:`webhook.engine.lifecycle.states.entry_phase` leaves the states that hold room)."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from tests.unit.builders import Gi, make_pod
from webhook.core.model import Pod, PodRef
from webhook.core.resources import Resources
from webhook.engine.ledger import LedgerEntry
from webhook.engine.lifecycle.states import HOLDS_ROOM, entry_phase

NOW = 1000.0
#: "high" was admitted from 2 to 6 CPUs; the resize's spec is generation 3.
RESERVED = LedgerEntry(
    pod=PodRef("default", "high", "uid-high"),
    node="node-1",
    review_uid="review-1",
    resources=Resources(6000, Gi),
    desired=(("app", Resources(6000, Gi)),),
    victims=(),
    admitted_at=NOW - 10,
    expires_at=NOW + 100,
    generation=3,
    persist_by=NOW + 10,
)


def high(cpu: str = "6", *, holding: str = "2", generation: int = 3) -> Pod:
    return (
        make_pod("high")
        .uid("uid-high")
        .priority(1000)
        .requests(cpu=cpu, memory="1Gi")
        .holding(cpu=holding, memory="1Gi")
        .generation(generation)
        .on("node-1")
        .build()
    )


@dataclass(frozen=True)
class Case:
    pod: Pod | None
    expected: bool
    reservation: LedgerEntry = RESERVED
    now: float = NOW


CASES = [
    pytest.param(Case(None, False), id="pod-not-seen-keeps-counting"),
    pytest.param(Case(high(), False), id="persisted-not-actuated-counts"),
    pytest.param(Case(high(holding="6"), True), id="actuated-is-spent"),
    pytest.param(
        Case(high(generation=5), False),
        id="the-reserved-spec-at-a-later-generation-still-counts",
    ),
    pytest.param(Case(high(holding="8"), True), id="allocated-above-the-demand-is-spent"),
    pytest.param(Case(high("2", holding="2", generation=2), False), id="not-persisted-yet-counts"),
    pytest.param(
        Case(high("2", holding="2", generation=2), True, now=NOW + 10),
        id="not-persisted-by-its-deadline-is-spent",
    ),
    pytest.param(
        Case(high("3", holding="3", generation=4), True),
        id="a-later-shrink-supersedes-it-for-good",
    ),
    pytest.param(
        Case(
            make_pod("high")
            .uid("uid-high")
            .requests(cpu="6", memory="1Gi")
            .holding(cpu="2")
            .generation(3)
            .resize_pending("Infeasible")
            .on("node-1")
            .build(),
            True,
        ),
        id="kubelet-says-infeasible",
    ),
    pytest.param(
        Case(
            make_pod("high")
            .uid("uid-high")
            .requests(cpu="6", memory="1Gi")
            .holding(cpu="2", memory="1Gi")
            .generation(3)
            .terminating()
            .on("node-1")
            .build(),
            True,
        ),
        id="pod-terminating",
    ),
    pytest.param(
        Case(high(holding="6", generation=0), True, reservation=RESERVED),
        id="generation-unknown-falls-back-to-the-spec",
    ),
    pytest.param(
        Case(high("3", holding="3", generation=0), False),
        id="generation-unknown-spec-differs-counts-until-its-deadline",
    ),
    pytest.param(
        Case(
            high(holding="6"),
            False,
            reservation=replace(RESERVED, desired=(), generation=0, persist_by=0.0),
        ),
        id="an-entry-that-does-not-say-what-it-admitted-counts-until-expiry",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_spent(case: Case) -> None:
    spent = entry_phase(case.reservation, case.pod, case.now).state not in HOLDS_ROOM
    assert case.expected == spent
