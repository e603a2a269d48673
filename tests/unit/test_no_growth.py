"""A resize that needs no room is ``fits`` with code ``no-growth``: what the admission
engine, the worker and the reconciler do with such a plan."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from harness.doubles import InMemoryLedger
from tests.unit.builders import make_pod
from tests.unit.test_worker_logic import CONFIG, NODE, NOW, entry, pod
from tests.unit.web_fixtures import resized, review, walkthrough_objects, walkthrough_view
from webhook.base.settings import Config
from webhook.core.resources import Resources
from webhook.engine.admission import AdmissionEngine
from webhook.engine.lifecycle.next_step import Wait, next_action


@dataclass(frozen=True)
class Review:
    cpu: str
    verdict: str
    code: str
    reserved: bool


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Review("2", "fits", "no-growth", False), id="shrink-reserves-nothing"),
        pytest.param(Review("4", "fits", "no-growth", False), id="same-size-reserves-nothing"),
        pytest.param(Review("5", "fits", "fits", True), id="growth-that-fits-reserves"),
    ],
)
def test_admission_of_a_resize_without_growth(case: Review) -> None:
    view = walkthrough_view()
    high = walkthrough_objects()[2]
    ledger = InMemoryLedger()
    engine = AdmissionEngine(Config(), view, ledger)

    decision = engine.validate(review(high, resized(high, case.cpu))["request"])

    assert (case.verdict, case.code) == (decision.verdict, decision.plan and decision.plan.code)
    assert case.reserved == bool(ledger.all_entries())
    assert () == decision.warnings


def test_worker_waits_while_the_kubelet_catches_up_on_a_resize_without_growth() -> None:
    # CPU moved from c1 to c2: persisted, not allocated yet, and it needs no room.
    moved = (
        make_pod("high")
        .on("node-1")
        .priority(1000)
        .requests(cpu="1", container="c1")
        .requests(cpu="2", container="c2")
        .status("c1", allocated={"cpu": "2"}, actual={"cpu": "2"})
        .status("c2", allocated={"cpu": "1"}, actual={"cpu": "1"})
        .build()
    )
    admitted = replace(
        entry("low", persisted=True),
        pod=moved.ref,
        desired=(("c1", Resources(1000, 0)), ("c2", Resources(2000, 0))),
    )

    action = next_action(
        admitted, moved, NODE, (moved, pod("low", cpu="4")), now=NOW, config=CONFIG
    )

    assert "actuating" == (action.reason if isinstance(action, Wait) else repr(action))
