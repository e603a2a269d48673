"""Where an evicted victim's work went: moved, lost or unknown, told once per victim."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.doubles import FakeEvents, FakeEvictor, InMemoryLedger, StaticClusterView
from tests.unit.builders import NODE, NOW, OTHER_NODE, PodBuilder, make_pod
from tests.unit.test_worker import CONFIG, Clock, Cluster, add
from tests.unit.test_worker_logic import HIGH_RESIZED, LOW, MID, entry
from webhook.base.metrics import Metrics
from webhook.core.model import PodRef
from webhook.engine.follow import Follow
from webhook.engine.ledger import EvictionResult
from webhook.engine.worker import PreemptionWorker
from webhook.kube.events import EventRecorder

WINDOW = 60.0
PREEMPTOR = PodRef("default", "high", "uid-high")
OUTCOMES = ("moved", "lost", "unknown")


def _web(name: str) -> PodBuilder:
    """A pod of the ReplicaSet ``web`` (owner uid ``uid-web``)."""
    return make_pod(name).owned_by("ReplicaSet", "web").requests(cpu="1")


VICTIM = _web("b").on(NODE)


@dataclass
class Run:
    follow: Follow
    metrics: Metrics
    events: FakeEvents
    clock: list[float]

    def counts(self) -> dict[str, float]:
        read = self.metrics.registry.get_sample_value
        name = "resize_preemption_victim_outcomes_total"
        return {o: v for o in OUTCOMES if (v := read(name, {"outcome": o}) or 0.0)}

    def step(self, step: tuple[Any, ...]) -> None:
        what = step[0]
        if what == "wait":
            self.clock[0] += step[1]
        elif what == "stop":
            self.follow.stop(timeout=1)
        else:
            self.follow.seen(step[1].build(), added=what == "added")
        self.follow.run_once()


def start(victims: Sequence[PodBuilder], done: bool = True) -> Run:
    pods = [v.build() for v in victims]
    metrics, events, clock = Metrics(), FakeEvents(), [NOW]
    follow = Follow(StaticClusterView(pods=pods), metrics, events, lambda: clock[0], window=WINDOW)
    for pod in pods:
        follow.expect(PREEMPTOR, NODE, pod.ref)
        follow.evicted(pod.ref, done)
    follow.run_once()
    return Run(follow, metrics, events, clock)


@pytest.mark.parametrize(
    ("expected", "expected_events", "victim", "steps"),
    [
        pytest.param(
            {"moved": 1},
            [("Moved", "default/b", "default/b-2", OTHER_NODE)],
            VICTIM,
            [("added", _web("b-2").unbound()), ("modified", _web("b-2").on(OTHER_NODE))],
            id="replacement-bound-elsewhere",
        ),
        pytest.param(
            {"moved": 1},
            [("Moved", "default/b", "default/b", OTHER_NODE)],
            make_pod("b").owned_by("StatefulSet", "web").on(NODE),
            [
                (
                    "added",
                    make_pod("b").uid("uid-b-new").owned_by("StatefulSet", "web").on(OTHER_NODE),
                )
            ],
            id="statefulset-same-name-new-uid",
        ),
        pytest.param(
            {"lost": 1},
            [
                (
                    "NotMoved",
                    "default/b",
                    f"its replacement default/b-2 was bound to {NODE}, the resizing node",
                )
            ],
            VICTIM,
            [("added", _web("b-2").unbound()), ("modified", _web("b-2").on(NODE))],
            id="replacement-back-on-the-resizing-node",
        ),
        pytest.param(
            {"lost": 1},
            [
                (
                    "NotMoved",
                    "default/b",
                    "the scheduler found no node for its replacement default/b-2",
                )
            ],
            VICTIM,
            [("added", _web("b-2").unbound()), ("modified", _web("b-2").unschedulable())],
            id="replacement-unschedulable",
        ),
        pytest.param(
            {},
            [],
            VICTIM,
            [("added", _web("b-2").unschedulable(nominated=OTHER_NODE))],
            id="unschedulable-but-nominated-waits",
        ),
        pytest.param(
            {"lost": 1},
            [],
            make_pod("b").requests(cpu="1"),
            [],
            id="bare-pod",
        ),
        pytest.param(
            {"lost": 1},
            [],
            make_pod("b").owned_by("DaemonSet", "agents"),
            [("added", make_pod("b-2").owned_by("DaemonSet", "agents").on(NODE))],
            id="daemonset",
        ),
        pytest.param(
            {"lost": 1},
            [
                (
                    "NotMoved",
                    "default/b",
                    f"its replacement default/b-2 was not bound within {WINDOW:.0f}s",
                )
            ],
            VICTIM,
            [("added", _web("b-2").unbound()), ("wait", WINDOW)],
            id="replacement-unbound-past-the-window",
        ),
        pytest.param(
            {"unknown": 1},
            [],
            VICTIM,
            [("modified", _web("sibling").on(OTHER_NODE)), ("wait", WINDOW)],
            id="a-sibling-is-no-replacement",
        ),
        pytest.param(
            {},
            [],
            VICTIM,
            [("added", _web("b-2").unbound()), ("wait", WINDOW - 1)],
            id="within-the-window-nothing-yet",
        ),
        pytest.param(
            {"unknown": 1},
            [],
            VICTIM,
            [("added", _web("b-2").unbound()), ("stop",)],
            id="stopped-leading-first",
        ),
        pytest.param(
            {"moved": 1},
            [("Moved", "default/b", "default/b-2", OTHER_NODE)],
            VICTIM,
            [
                ("added", _web("b-2").on(OTHER_NODE)),
                ("modified", _web("b-2").on(OTHER_NODE)),
                ("wait", WINDOW),
                ("stop",),
            ],
            id="told-once",
        ),
    ],
)
def test_each_evicted_victim_gets_one_outcome(
    expected: dict[str, float],
    expected_events: list[tuple[str, ...]],
    victim: PodBuilder,
    steps: list[tuple[Any, ...]],
) -> None:
    run = start([victim])
    for step in steps:
        run.step(step)
    assert expected == run.counts()
    assert expected_events == run.events.told


def test_an_eviction_that_did_not_happen_is_not_followed() -> None:
    run = start([VICTIM], done=False)
    run.step(("added", _web("b-2").on(OTHER_NODE)))
    run.step(("wait", WINDOW))
    run.step(("stop",))
    assert {} == run.counts()


def test_two_victims_of_one_owner_take_one_replacement_each() -> None:
    run = start([VICTIM, _web("c").on(NODE)])
    run.step(("added", _web("b-2").unbound()))
    run.step(("added", _web("c-2").on(OTHER_NODE)))
    run.step(("modified", _web("b-2").unschedulable()))
    assert {"moved": 1, "lost": 1} == run.counts()
    assert [
        ("Moved", "default/c", "default/c-2", OTHER_NODE),
        ("NotMoved", "default/b", "the scheduler found no node for its replacement default/b-2"),
    ] == run.events.told


@pytest.mark.parametrize(
    ("expected_why", "victim"),
    [
        pytest.param("no controller recreates it", make_pod("b").on(NODE), id="bare-pod"),
        pytest.param(
            "its DaemonSet recreates it on this node only",
            make_pod("b").owned_by("DaemonSet", "agents").on(NODE),
            id="daemonset",
        ),
    ],
)
def test_a_victim_nothing_moves_is_logged_lost_without_an_event(
    caplog: pytest.LogCaptureFixture, expected_why: str, victim: PodBuilder
) -> None:
    with caplog.at_level(logging.INFO, logger="webhook.decisions"):
        run = start([victim])
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "webhook.decisions"]
    assert [("lost", expected_why)] == [(line["outcome"], line["why"]) for line in lines]
    assert [] == run.events.told


def test_the_decision_log_has_a_line_per_outcome(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="webhook.decisions"):
        run = start([VICTIM])
        run.step(("added", _web("b-2").on(OTHER_NODE)))
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "webhook.decisions"]
    assert [
        {
            "victim": "default/b",
            "outcome": "moved",
            "pod": "default/high",
            "node": NODE,
            "why": f"its ReplicaSet replaced it with default/b-2 on {OTHER_NODE}",
            "replacement": "default/b-2",
            "to": OTHER_NODE,
        }
    ] == lines


@pytest.mark.parametrize(
    ("expected", "pod"),
    [
        pytest.param(("ReplicaSet", "uid-web", False), _web("a"), id="owned"),
        pytest.param(("", "", False), make_pod("a"), id="bare"),
        pytest.param(
            ("ReplicaSet", "uid-web", True), _web("a").unschedulable(), id="unschedulable"
        ),
        pytest.param(
            ("ReplicaSet", "uid-web", False),
            _web("a").unschedulable(nominated=OTHER_NODE),
            id="nominated",
        ),
    ],
)
def test_a_pod_names_its_controller_by_uid_and_says_when_it_is_unschedulable(
    expected: tuple[str, str, bool], pod: PodBuilder
) -> None:
    built = pod.build()
    assert expected == (built.controller, built.controller_uid, built.unschedulable)


_STEPS = st.lists(
    st.one_of(
        st.tuples(
            st.sampled_from(["added", "modified"]),
            st.sampled_from(
                [
                    _web("b-2").unbound(),
                    _web("b-2").on(OTHER_NODE),
                    _web("b-2").on(NODE),
                    _web("b-2").unschedulable(),
                    _web("c-2").on(OTHER_NODE),
                    _web("sibling").on(NODE),
                ]
            ),
        ),
        st.tuples(st.just("wait"), st.sampled_from([1.0, WINDOW / 2, WINDOW])),
    ),
    max_size=8,
)


@settings(max_examples=150, deadline=None)
@given(steps=_STEPS, bare=st.booleans())
def test_after_stopping_every_evicted_victim_was_counted_exactly_once(
    steps: list[tuple[Any, ...]], bare: bool
) -> None:
    victims = [VICTIM, _web("c").on(NODE)] + ([make_pod("d")] if bare else [])
    run = start(victims)
    for step in [*steps, ("stop",)]:
        run.step(step)
    assert len(victims) == sum(run.counts().values())
    moved = [t for t in run.events.told if t[0] == "Moved"]
    assert run.counts().get("moved", 0) == len(moved)
    assert all(OTHER_NODE == t[3] for t in moved)


@pytest.mark.parametrize(
    ("expected", "result"),
    [
        pytest.param({"lost": 1}, EvictionResult.EVICTED, id="evicted"),
        pytest.param({"lost": 1}, EvictionResult.DELETED, id="deleted"),
        pytest.param({}, EvictionResult.BLOCKED_BY_PDB, id="blocked"),
        pytest.param({}, EvictionResult.GONE, id="gone-before"),
    ],
)
def test_the_worker_tells_follow_of_each_eviction_it_made(
    expected: dict[str, float], result: EvictionResult
) -> None:
    ledger, evictor, clock, metrics = InMemoryLedger(), FakeEvictor(), Clock(), Metrics()
    evictor.results["low"] = result
    add(ledger, entry("low"))
    cluster = Cluster(HIGH_RESIZED, LOW, MID)
    evictor.view = cluster  # type: ignore[assignment]
    follow = Follow(cluster, metrics, FakeEvents(), clock)  # type: ignore[arg-type]
    worker = PreemptionWorker(
        cluster,  # type: ignore[arg-type]
        ledger,
        evictor,
        CONFIG,
        metrics,
        clock,
        follow=follow,
    )
    worker.run_once()
    follow.run_once()
    assert [("low", "high", "node-1")] == evictor.calls
    run = Run(follow, metrics, FakeEvents(), [clock.now])
    assert expected == run.counts()


class Recorded(EventRecorder):
    """An EventRecorder that keeps the bodies it would post."""

    def __init__(self) -> None:
        super().__init__(None, controller="resize-preemption-webhook", instance="r1")
        self.bodies: list[dict[str, Any]] = []

    def record(self, regarding: PodRef, **kwargs: Any) -> bool:
        self.bodies.append(self.event_body(regarding, **kwargs))
        return True


@pytest.mark.parametrize(
    ("expected", "tell"),
    [
        pytest.param(
            (
                "Moved",
                "Preempted default/b moved: its replacement default/b-2 runs on node-2",
                "b-2",
            ),
            lambda r: r.moved(
                PREEMPTOR, VICTIM.build().ref, PodRef("default", "b-2", "u2"), OTHER_NODE
            ),
            id="moved",
        ),
        pytest.param(
            ("NotMoved", "Preempted default/b did not move: no controller recreates it", "b"),
            lambda r: r.lost(PREEMPTOR, VICTIM.build().ref, "no controller recreates it"),
            id="not-moved",
        ),
    ],
)
def test_the_resizing_pod_is_told_where_the_victim_went(
    expected: tuple[str, str, str], tell: Any
) -> None:
    recorder = Recorded()
    assert tell(recorder)
    [body] = recorder.bodies
    assert expected == (body["reason"], body["note"], body["related"]["name"])
    assert ("high", "Normal", "Preempting") == (
        body["regarding"]["name"],
        body["type"],
        body["action"],
    )
