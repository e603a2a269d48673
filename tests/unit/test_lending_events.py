"""The event on a resizing pod whose deferred resize the reconciler planned: it names
victims and lenders, since no kubectl warning told anyone."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.builders import HIGH, LOW, NODE, make_node, make_pod, plan
from webhook.core.model import Pod
from webhook.service import _decision_event


class Recorder:
    def __init__(self) -> None:
        self.notes: list[str] = []

    def record(self, regarding: Any, **event: Any) -> bool:
        self.notes.append(event["note"])
        return True


def pods(floor: bool, scratch: bool) -> list[Pod]:
    low = make_pod("batch-1").priority(LOW).requests(cpu="3").on(NODE).started(100).admitted()
    if floor:
        low = low.floor(cpu="1")
    out = [low.build()]
    if scratch:
        out.append(make_pod("scratch").priority(0).requests(cpu="2").on(NODE).admitted().build())
    return out


@pytest.mark.parametrize(
    ("expected", "floor", "scratch", "cpu"),
    [
        pytest.param(
            "Deferred resize: borrowing cpu 1 from 1 lower-priority pod on node-1: "
            "default/batch-1 (cpu 3->2)",
            True,
            False,
            "6",
            id="loans-only",
        ),
        pytest.param(
            "Deferred resize: preempting 1 lower-priority pod on node-1 and borrowing cpu 1 "
            "from 1 to free cpu 3: default/scratch; borrowing cpu 1 from 1 lower-priority pod "
            "on node-1: default/batch-1 (cpu 3->2)",
            True,
            True,
            "6",
            id="one-eviction-one-loan",
        ),
        pytest.param(
            "Deferred resize: preempting 1 lower-priority pod on node-1 to free cpu 1: "
            "default/batch-1",
            False,
            False,
            "6",
            id="victims-only",
        ),
    ],
)
def test_the_reconciler_s_event_names_victims_and_lenders(
    expected: str, floor: bool, scratch: bool, cpu: str
) -> None:
    node = make_node(NODE).allocatable(cpu="8", memory="16Gi").build()
    old, new = (
        make_pod("web").priority(HIGH).requests(cpu="4").on(NODE).started(50).admitted()
    ).resize(cpu=cpu)
    the_plan = plan(old, new, node, pods(floor, scratch))
    recorder = Recorder()

    _decision_event(recorder)(new, the_plan, True)  # type: ignore[arg-type]

    assert [expected] == recorder.notes
