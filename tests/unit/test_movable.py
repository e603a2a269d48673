"""Victim order ``movable-first``: which victims' work moves elsewhere, and who goes first."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.builders import (
    HIGH,
    LOW,
    MID,
    NODE,
    NOW,
    OTHER_NODE,
    PodBuilder,
    cores,
    make_node,
    make_pod,
    make_reservation,
)
from webhook.base.settings import load_config
from webhook.core.errors import InputError
from webhook.core.model import Node, Pod
from webhook.core.movable import Room, claim, judge, room_on, rooms_elsewhere
from webhook.core.plan import NodePods, Plan, plan_resize
from webhook.core.policy import DefaultPolicy
from webhook.core.resources import Resources

Gi = 2**30


def _rs(name: str) -> PodBuilder:
    """A pod of a ReplicaSet asking for one core and 1Gi, bound to the resizing node."""
    return make_pod(name).owned_by("ReplicaSet").requests(cpu="1", memory="1Gi").on(NODE)


def _room(cpu: str = "2", memory: str = "4Gi", node: Any = None) -> Room | None:
    built: Node = (node or make_node(OTHER_NODE)).allocatable(cpu=cpu, memory=memory).build()
    return room_on(built, (), (), NOW)


ROOM = _room()


@pytest.mark.parametrize(
    ("expected", "pod", "rooms"),
    [
        pytest.param(True, _rs("a"), [ROOM], id="replicaset-with-room"),
        pytest.param(
            True, _rs("a").owned_by("StatefulSet", controller=False), [ROOM], id="one-controller"
        ),
        pytest.param(False, make_pod("a").requests(cpu="1"), [ROOM], id="bare-pod"),
        pytest.param(
            False,
            make_pod("a").owned_by("ReplicaSet", controller=False).requests(cpu="1"),
            [ROOM],
            id="owner-not-controller",
        ),
        pytest.param(
            False, make_pod("a").owned_by("DaemonSet").requests(cpu="1"), [ROOM], id="daemonset"
        ),
        pytest.param(
            False, make_pod("a").owned_by("Widget").requests(cpu="1"), [ROOM], id="unknown-kind"
        ),
        pytest.param(True, make_pod("a").owned_by("Job").requests(cpu="1"), [ROOM], id="job"),
        pytest.param(False, _rs("a"), [], id="no-other-node"),
        pytest.param(False, _rs("a").requests(cpu="3"), [ROOM], id="too-big-for-the-room"),
        pytest.param(
            False,
            _rs("a").spec_field("nodeSelector", {"disk": "ssd"}),
            [ROOM],
            id="node-selector-unmet",
        ),
        pytest.param(
            True,
            _rs("a").spec_field("nodeSelector", {"disk": "ssd"}),
            [_room(node=make_node(OTHER_NODE).labels(disk="ssd"))],
            id="node-selector-met",
        ),
        pytest.param(
            False,
            _rs("a").spec_field(
                "affinity",
                {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchFields": [
                                        {"key": "metadata.name", "operator": "In", "values": [NODE]}
                                    ]
                                }
                            ]
                        }
                    }
                },
            ),
            [ROOM],
            id="required-affinity-to-this-node",
        ),
        pytest.param(
            False,
            _rs("a"),
            [_room(node=make_node(OTHER_NODE).taint("dedicated", value="gpu"))],
            id="untolerated-noschedule-taint",
        ),
        pytest.param(
            True,
            _rs("a").tolerates("dedicated", "NoSchedule"),
            [_room(node=make_node(OTHER_NODE).taint("dedicated", value="gpu"))],
            id="tolerated-taint",
        ),
        pytest.param(
            True,
            _rs("a"),
            [_room(node=make_node(OTHER_NODE).taint("soft", "PreferNoSchedule"))],
            id="prefer-no-schedule-does-not-block",
        ),
        pytest.param(
            False,
            _rs("a").spec_field(
                "affinity",
                {
                    "podAntiAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": [
                            {"topologyKey": "kubernetes.io/hostname"}
                        ]
                    }
                },
            ),
            [ROOM],
            id="pod-anti-affinity-is-unknown",
        ),
        pytest.param(
            False,
            _rs("a").spec_field("topologySpreadConstraints", [{"maxSkew": 1}]),
            [ROOM],
            id="topology-spread-is-unknown",
        ),
        pytest.param(
            False,
            _rs("a").spec_field(
                "volumes", [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]
            ),
            [ROOM],
            id="claimed-volume-is-unknown",
        ),
        pytest.param(
            True,
            _rs("a").spec_field("volumes", [{"name": "conf", "configMap": {"name": "c"}}]),
            [ROOM],
            id="config-map-volume-goes-anywhere",
        ),
    ],
)
def test_movable_when_a_controller_recreates_it_where_there_is_room(
    expected: bool, pod: PodBuilder, rooms: list[Room | None]
) -> None:
    assert expected == judge(pod.build(), [r for r in rooms if r is not None]).movable


@pytest.mark.parametrize(
    "node",
    [
        pytest.param(make_node(OTHER_NODE).ready("False"), id="not-ready"),
        pytest.param(make_node(OTHER_NODE).ready("Unknown"), id="ready-unknown"),
        pytest.param(make_node(OTHER_NODE).cordoned(), id="cordoned"),
        pytest.param(
            make_node(OTHER_NODE).taint("node.kubernetes.io/not-ready", "NoExecute"),
            id="condition-taint",
        ),
    ],
)
def test_a_node_that_takes_no_pods_is_never_room(node: Any) -> None:
    assert None is _room(node=node)


def test_room_is_allocatable_less_its_pods_and_reservations_and_promised_moves() -> None:
    node = make_node(OTHER_NODE).allocatable(cpu="8", memory="16Gi").build()
    pods = [make_pod("p").requests(cpu="3", memory="2Gi").on(OTHER_NODE).admitted().build()]
    reservations = [
        make_reservation("r", node=OTHER_NODE, cpu="1", memory="1Gi"),
        # Another plan promised 2 cores and 1Gi here to a victim's replacement.
        replace(
            make_reservation("s", node=NODE, cpu="1"),
            moves=((OTHER_NODE, Resources(cores(2), Gi)),),
        ),
        # An expired promise holds nothing.
        replace(
            make_reservation("t", node=NODE, cpu="1", expires_in=-1),
            moves=((OTHER_NODE, Resources(cores(4), Gi)),),
        ),
    ]
    room = room_on(node, pods, reservations, NOW)
    assert room is not None
    assert Resources(cores(2), 12 * Gi) == room.free


def test_two_victims_never_count_on_the_same_room() -> None:
    rooms = [r for r in [_room(cpu="1")] if r is not None]
    first, second = _rs("a").build(), _rs("b").build()
    moves = claim([first, second], rooms)
    assert [True, False] == [m.movable for m in moves]
    assert OTHER_NODE == moves[0].node


# -- the plan ---------------------------------------------------------------------------


def _node() -> Node:
    return make_node(NODE).allocatable(cpu="4", memory="16Gi").build()


def _plan(pods: list[Pod], rooms: list[Room] | None, *, now: float = NOW) -> Plan:
    old, new = make_pod("web").priority(HIGH).requests(cpu="1").admitted().resize(cpu="2")
    return plan_resize(
        old, new, NodePods(_node(), [*pods, old]), now=now, policy=DefaultPolicy(), elsewhere=rooms
    )


def _equal_pair() -> list[Pod]:
    """Two equally unimportant pods filling the node: ``bare`` started later than ``rs``,
    so upstream evicts ``bare``."""
    bare = make_pod("bare").priority(LOW).requests(cpu="1").started(200).admitted().build()
    rs = _rs("rs").priority(LOW).started(100).admitted().build()
    filler = make_pod("filler").priority(HIGH).requests(cpu="1").started(1).admitted().build()
    return [bare, rs, filler]


@pytest.mark.parametrize(
    ("expected", "rooms"),
    [
        pytest.param(("default/bare",), None, id="upstream-newer-goes"),
        pytest.param(("default/rs",), [ROOM], id="movable-first-the-movable-goes"),
        pytest.param(("default/bare",), [], id="movable-first-without-room-as-upstream"),
    ],
)
def test_equal_priority_the_movable_pod_goes_first(
    expected: tuple[str, ...], rooms: list[Room] | None
) -> None:
    assert expected == _plan(_equal_pair(), rooms).victim_keys


def test_the_plan_says_where_each_victim_goes() -> None:
    plan = _plan(_equal_pair(), [r for r in [ROOM] if r is not None])
    (victim,) = plan.victims
    assert victim.move is not None
    assert (True, OTHER_NODE) == (victim.move.movable, victim.move.node)
    assert ((OTHER_NODE, Resources(cores(1), Gi)),) == plan.moves


def test_a_lower_priority_pod_still_goes_before_a_movable_one() -> None:
    low = make_pod("low").priority(LOW).requests(cpu="1").started(200).admitted().build()
    mid = _rs("mid").priority(MID).started(100).admitted().build()
    filler = make_pod("filler").priority(HIGH).requests(cpu="1").started(1).admitted().build()
    plan = _plan([low, mid, filler], [r for r in [ROOM] if r is not None])
    assert ("default/low",) == plan.victim_keys
    assert plan.victims[0].move is not None and not plan.victims[0].move.movable


def test_rooms_elsewhere_leave_out_the_resizing_node_roomiest_first_then_by_name() -> None:
    nodes = [make_node(n).build() for n in ("node-3", NODE, OTHER_NODE)]
    nodes.append(make_node("node-4").allocatable(cpu="16", memory="16Gi").build())
    rooms = rooms_elsewhere(nodes, {}, (), NOW, exclude=NODE)
    assert ["node-4", OTHER_NODE, "node-3"] == [r.node for r in rooms]


def test_an_unknown_victim_order_is_refused_with_the_choices() -> None:
    with pytest.raises(InputError, match="must be one of upstream, movable-first"):
        load_config(flags={"victim-order": "random"})


def test_victim_order_from_the_environment() -> None:
    assert "movable-first" == load_config(env={"RPW_VICTIM_ORDER": "movable-first"}).victim_order


# -- never worse than upstream ---------------------------------------------------------

_KINDS = st.sampled_from(["", "ReplicaSet", "StatefulSet", "DaemonSet", "Job"])


@st.composite
def _scene(draw: st.DrawFn) -> tuple[list[Pod], list[Room]]:
    pods = []
    for i in range(draw(st.integers(1, 7))):
        b = make_pod(f"p{i}").priority(draw(st.sampled_from([LOW, MID])))
        b = b.requests(cpu=f"{draw(st.integers(1, 6)) * 250}m").started(draw(st.integers(1, 4)))
        kind = draw(_KINDS)
        if kind:
            b = b.owned_by(kind)
        pods.append(b.admitted().build())
    rooms = [
        Room(f"node-{9 - i}", Resources(draw(st.integers(0, 4)) * 250, 4 * Gi))
        for i in range(draw(st.integers(0, 3)))
    ]
    return pods, rooms


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scene())
def test_movable_first_never_evicts_more_nor_more_important_pods(
    scene: tuple[list[Pod], list[Room]],
) -> None:
    pods, rooms = scene
    upstream, movable = _plan(pods, None), _plan(pods, rooms)
    assert upstream.verdict == movable.verdict
    assert len(movable.victims) <= len(upstream.victims)
    top = max((v.priority for v in upstream.victims), default=0)
    assert all(v.priority <= top for v in movable.victims)
    assert all(v.move is not None for v in movable.victims)


# -- the service: the room elsewhere from the cluster view and the ledger ----------------


def _cluster(*resizing: str) -> list[dict[str, Any]]:
    """For each name in ``resizing`` a full node of its own (node-1, node-3...) with a
    high-priority pod of that name, and a bare pod and a ReplicaSet's pod of low priority;
    node-2 has room for one core only."""
    objects = [make_node(OTHER_NODE).allocatable(cpu="1", memory="64Gi").obj()]
    for i, name in enumerate(resizing):
        node = NODE if i == 0 else f"node-{i + 2}"
        objects += [
            make_node(node).allocatable(cpu="3", memory="64Gi").obj(),
            make_pod(f"{name}-bare").priority(LOW).requests(cpu="1").started(200).on(node),
            _rs(f"{name}-rs").priority(LOW).started(100).on(node),
            make_pod(name).priority(HIGH).requests(cpu="1").limits(cpu="1").on(node),
        ]
    return [o if isinstance(o, dict) else o.admitted().obj() for o in objects]


def _validate(engine: Any, objects: list[dict[str, Any]], name: str, uid: str) -> Any:
    from tests.unit.web_fixtures import resized, review

    obj = next(o for o in objects if o["metadata"]["name"] == name)
    return engine.validate(review(obj, resized(obj, "2"), uid=uid)["request"])


@pytest.mark.parametrize(
    ("expected", "order"),
    [
        pytest.param(("default/a-bare",), "upstream", id="upstream"),
        pytest.param(("default/a-rs",), "movable-first", id="movable-first"),
    ],
)
def test_the_service_plans_in_the_configured_order(expected: tuple[str, ...], order: Any) -> None:
    from harness.doubles import InMemoryLedger, StaticClusterView
    from webhook.base.settings import Config
    from webhook.engine.admission import AdmissionEngine

    objects = _cluster("a")
    ledger = InMemoryLedger()
    engine = AdmissionEngine(
        Config(victim_order=order),
        StaticClusterView.from_objects(objects),
        ledger,
        clock=lambda: NOW,
    )
    _validate(engine, objects, "a", "review-a")
    (entry,) = ledger.all_entries()
    assert expected == tuple(v.key for v in entry.victims)


def test_room_elsewhere_is_not_promised_twice() -> None:
    """Two resizes each need one victim; node-2's one free core can take only one
    replacement: the second plan sees it promised and evicts as upstream would."""
    from harness.doubles import InMemoryLedger, StaticClusterView
    from webhook.base.settings import Config
    from webhook.engine.admission import AdmissionEngine

    objects = _cluster("a", "b")
    ledger = InMemoryLedger()
    engine = AdmissionEngine(
        Config(victim_order="movable-first"),
        StaticClusterView.from_objects(objects),
        ledger,
        clock=lambda: NOW,
    )
    _validate(engine, objects, "a", "review-a")
    _validate(engine, objects, "b", "review-b")
    entries = {e.pod.name: e for e in ledger.all_entries()}
    assert ("default/a-rs",) == tuple(v.key for v in entries["a"].victims)
    assert ((OTHER_NODE, Resources(cores(1), Gi)),) == entries["a"].moves
    assert ("default/b-bare",) == tuple(v.key for v in entries["b"].victims)
    assert () == entries["b"].moves


@pytest.mark.parametrize(
    ("expected", "rooms"),
    [
        pytest.param(None, None, id="upstream-no-moves"),
        pytest.param(
            [
                {
                    "pod": "default/rs",
                    "movable": True,
                    "node": OTHER_NODE,
                    "why": f"its ReplicaSet can recreate it on {OTHER_NODE}",
                }
            ],
            [ROOM],
            id="movable-first-names-where-it-goes",
        ),
    ],
)
def test_the_decision_log_says_where_each_victim_goes(
    expected: list[dict[str, Any]] | None, rooms: list[Room] | None
) -> None:
    from webhook.engine.decision_log import plan_fields

    assert expected == plan_fields(_plan(_equal_pair(), rooms), reserved=True).get("moves")
