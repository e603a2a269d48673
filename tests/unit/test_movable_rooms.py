"""The room elsewhere as the service reads it: each node's room kept as nodes change
(:class:`~webhook.engine.elsewhere.NodeRooms`), merged with the ledger's entries and read
only as far as asked, against every room added up from nothing
(:func:`~webhook.core.movable.rooms_elsewhere`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from itertools import islice

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.builders import HIGH, LOW, MID, NODE, NOW, make_node, make_pdb, make_pod
from tests.unit.test_reflector_stream import list_page, node_obj, pages, pod_obj
from webhook.core import plan as P
from webhook.core.accounting import Reservation
from webhook.core.model import DisruptionBudget, Node, Pod
from webhook.core.movable import Room, claim, judge, rooms_elsewhere
from webhook.core.plan import NodePods, Plan, plan_resize
from webhook.core.policy import DefaultPolicy, importance_key, rank
from webhook.core.resources import Resources
from webhook.engine.elsewhere import Elsewhere
from webhook.engine.rooms import NodeRooms
from webhook.kube.cache import NODES, PODS, ClusterCache
from webhook.kube.reflector import WatchEvent

NAMES = tuple(f"node-{i}" for i in range(6))


@dataclass
class _View:
    """A cluster view whose nodes and pods a test changes, telling its rooms each time."""

    nodes: dict[str, Node] = field(default_factory=dict)
    pods: dict[str, tuple[Pod, ...]] = field(default_factory=dict)
    rooms: NodeRooms = field(default_factory=NodeRooms)

    def node(self, name: str) -> Node | None:
        return self.nodes.get(name)

    def all_nodes(self) -> Sequence[Node]:
        return tuple(self.nodes.values())

    def pods_on(self, node: str) -> Sequence[Pod]:
        return self.pods.get(node, ())

    def node_rooms(self) -> NodeRooms:
        return self.rooms


@dataclass(frozen=True)
class _Entry:
    held: Reservation

    def reservation(self) -> Reservation:
        return self.held


@dataclass
class _Ledger:
    held: list[Reservation] = field(default_factory=list)

    def all_entries(self) -> tuple[_Entry, ...]:
        return tuple(_Entry(r) for r in self.held)


def _node(name: str, cpu: int, kind: str) -> Node:
    b = make_node(name).allocatable(cpu=f"{cpu}m", memory="8Gi")
    if kind == "cordoned":
        b = b.cordoned()
    elif kind == "tainted":
        b = b.taint("dedicated", value="db")
    elif kind == "not-ready":
        b = b.ready("False")
    return b.build()


def _pod(node: str, k: int, cpu: int) -> Pod:
    return make_pod(f"p-{node}-{k}").requests(cpu=f"{cpu}m", memory="1Gi").on(node).build()


_change = st.one_of(
    st.tuples(
        st.just("node"),
        st.sampled_from(NAMES),
        st.integers(0, 4000),
        st.sampled_from(["plain", "plain", "cordoned", "tainted", "not-ready"]),
    ),
    st.tuples(st.just("pods"), st.sampled_from(NAMES), st.lists(st.integers(0, 1500), max_size=3)),
    st.tuples(st.just("gone"), st.sampled_from(NAMES)),
)

_reservation = st.builds(
    lambda pod, node, cpu, elsewhere, needs, expires: Reservation(
        pod_uid=f"uid-default-{pod}",
        pod=f"default/{pod}",
        node=node,
        resources=Resources(cpu, 0),
        expires_at=NOW + expires,
        moves=((elsewhere, Resources(needs, 0)),),
    ),
    st.sampled_from(["r1", "r2", "resizing"]),
    st.sampled_from(NAMES),
    st.integers(0, 2000),
    st.sampled_from(NAMES),
    st.integers(0, 2000),
    st.sampled_from([-5.0, 30.0]),
)


def _apply(view: _View, change: tuple[object, ...]) -> None:
    name = str(change[1])
    if change[0] == "node":
        view.nodes[name] = _node(name, int(change[2]), str(change[3]))  # type: ignore[call-overload]
    elif change[0] == "pods":
        cpus = change[2]
        assert isinstance(cpus, list)
        view.pods[name] = tuple(_pod(name, k, c) for k, c in enumerate(cpus))
    else:
        view.nodes.pop(name, None)
    view.rooms.changed(name)


def _reference(view: _View, held: list[Reservation], exclude: str) -> tuple[Room, ...]:
    counted = [r for r in held if r.active(NOW) and r.pod_uid != "uid-default-resizing"]
    return rooms_elsewhere(view.nodes.values(), view.pods, counted, NOW, exclude=exclude)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(st.lists(_change, min_size=1, max_size=4), min_size=1, max_size=5),
    held=st.lists(_reservation, max_size=4),
    exclude=st.sampled_from(NAMES),
    first=st.integers(0, 3),
)
def test_the_rooms_kept_as_nodes_change_are_every_room_added_up_afresh(
    steps: list[list[tuple[object, ...]]], held: list[Reservation], exclude: str, first: int
) -> None:
    view = _View()
    ledger = _Ledger(held)
    elsewhere = Elsewhere(view, ledger)  # type: ignore[arg-type]
    for changes in steps:
        for change in changes:
            _apply(view, change)
        expected = _reference(view, held, exclude)
        rooms = elsewhere.rooms(exclude, NOW, "uid-default-resizing")
        # Read partly first, as a search that stops at the first room that fits.
        assert expected[:first] == tuple(islice(rooms, first))
        assert expected == tuple(rooms)
        assert len(expected) == len(rooms)


def test_nothing_is_read_until_a_room_is_asked_for() -> None:
    view = _View({"node-1": _node("node-1", 1000, "plain")})
    elsewhere = Elsewhere(view, _Ledger())  # type: ignore[arg-type]
    rooms = elsewhere.rooms("node-0", NOW)
    view.nodes["node-1"] = _node("node-1", 3000, "plain")
    assert 3000 == rooms[0].free.cpu


def _cache_with(pods: list[dict[str, object]]) -> ClusterCache:
    cache = ClusterCache(None, freeze_gc=False)
    nodes = [node_obj("node-1", "1", cpu="4"), node_obj("node-2", "1", cpu="2")]
    cache.reflector(NODES).load_pages(pages(list_page(nodes, "1")))
    cache.reflector(PODS).load_pages(pages(list_page(pods, "2")))  # type: ignore[arg-type]
    return cache


def _free(cache: ClusterCache) -> dict[str, int]:
    rooms = cache.node_rooms()
    rooms.refresh(cache)
    return {r.node: r.free.cpu for r in rooms.roomiest()}


@pytest.mark.parametrize(
    ("expected", "kind", "obj"),
    [
        pytest.param(
            {"node-1": 500, "node-2": 2000},
            PODS,
            WatchEvent("ADDED", pod_obj("b", "3", cpu="500m")),
            id="pod-added",
        ),
        pytest.param(
            {"node-1": 4000, "node-2": 1000},
            PODS,
            WatchEvent("MODIFIED", pod_obj("a", "3", cpu="1", node="node-2")),
            id="pod-moved-to-another-node",
        ),
        pytest.param(
            {"node-1": 4000, "node-2": 2000},
            PODS,
            WatchEvent("DELETED", pod_obj("a", "3")),
            id="pod-deleted",
        ),
        pytest.param(
            {"node-1": 5000, "node-2": 2000},
            NODES,
            WatchEvent("MODIFIED", node_obj("node-1", "3", cpu="8")),
            id="node-grown",
        ),
        pytest.param(
            {"node-2": 2000},
            NODES,
            WatchEvent("DELETED", node_obj("node-1", "3")),
            id="node-deleted",
        ),
    ],
)
def test_the_cache_tells_its_rooms_which_nodes_changed(
    expected: dict[str, int], kind: str, obj: WatchEvent
) -> None:
    cache = _cache_with([pod_obj("a", "2", cpu="3")])
    assert {"node-1": 1000, "node-2": 2000} == _free(cache)
    cache.reflector(kind).apply(obj)
    assert expected == _free(cache)


def test_two_entries_of_one_pod_promising_different_room_on_one_node_merge() -> None:
    """A later resize admitted before the earlier entry went: both promises stand."""
    from webhook.core.accounting import active_on

    def held(cpu: int) -> Reservation:
        return Reservation(
            "uid-r", "default/r", "node-1", Resources(cpu, 0), expires_at=NOW + 30,
            moves=(("node-2", Resources(cpu, 0)),),
        )  # fmt: skip

    merged = active_on([held(2000), held(1000)], "node-1", NOW)["uid-r"]
    assert (("node-2", Resources(1000, 0)), ("node-2", Resources(2000, 0))) == merged.moves


# -- the plan's shortcuts against judging every candidate and selecting again ----------


@st.composite
def _crowd(draw: st.DrawFn) -> tuple[list[Pod], list[DisruptionBudget], list[Room]]:
    """Pods of three priorities, bare or a controller's, some under budgets, on a full
    node; a few rooms elsewhere."""
    pods = []
    for i in range(draw(st.integers(1, 9))):
        b = make_pod(f"p{i}").priority(draw(st.sampled_from([LOW, LOW, MID])))
        b = b.requests(cpu=f"{draw(st.integers(1, 6)) * 250}m").started(draw(st.integers(1, 4)))
        b = b.labels(app=draw(st.sampled_from(["a", "b", "c"])))
        kind = draw(st.sampled_from(["", "ReplicaSet", "ReplicaSet", "DaemonSet"]))
        pods.append((b.owned_by(kind) if kind else b).admitted().build())
    budgets = [
        make_pdb(app).selecting(app=app).allowing(draw(st.integers(0, 1))).build()
        for app in draw(st.sets(st.sampled_from(["a", "b"])))
    ]
    rooms = [
        Room(f"node-{9 - i}", Resources(draw(st.integers(0, 6)) * 250, 4 * 2**30))
        for i in range(draw(st.integers(0, 3)))
    ]
    return pods, budgets, sorted(rooms, key=lambda r: (-r.free.cpu, -r.free.memory, r.node))


#: Victims that overspend a budget stay in the plan: the plan's victims are the selection's.
POLICY = DefaultPolicy(pdb_mode="best-effort")


def _resize() -> tuple[Pod, Pod]:
    return make_pod("web").priority(HIGH).requests(cpu="1").admitted().resize(cpu="3")


def _by_hand(pods: list[Pod], budgets: list[DisruptionBudget], rooms: list[Room]) -> Plan:
    """Movable-first as docs/decision-core.md says it, every step taken: each candidate
    up to upstream's highest victim priority judged on its own, the selection made again
    in the movable-first order, kept when no worse, its victims judged in eviction order."""
    old, new = _resize()
    node, policy, everyone = (
        make_node(NODE).allocatable(cpu="4", memory="16Gi").build(),
        POLICY,
        [*pods, old],
    )
    view = NodePods(node, everyone)
    upstream = plan_resize(old, new, view, now=NOW, budgets=budgets, policy=policy)
    if not upstream.victims:
        return upstream
    need = P._need(old, new, view, (), NOW, view.holdings())
    ranking = rank(NODE, everyone, budgets, policy, NOW)
    candidates = P.candidates_of(new, NODE, ranking.pods, frozenset(), policy)
    top = max(v.priority for v in upstream.victims)
    movable = frozenset(p.uid for p in candidates if p.priority <= top and judge(p, rooms).movable)
    pods_in_order = sorted(ranking.pods, key=lambda p: importance_key(p, NOW, p.uid in movable))
    order = replace(
        ranking, pods=tuple(pods_in_order), place={p.uid: i for i, p in enumerate(pods_in_order)}
    )
    reordered = [p for p in order.pods if p in candidates]
    again = P.select_victims(
        reordered, order, P.clear_node(reordered, need.demand, node, need.usage, policy)
    )
    chosen = P.select_victims(
        candidates, ranking, P.clear_node(candidates, need.demand, node, need.usage, policy)
    )
    if P._no_worse(again, chosen):
        chosen = again
    by_uid = {p.uid: p for p in candidates}
    moves = claim([by_uid[v.pod.uid] for v in chosen.victims], rooms)
    return replace(upstream, victims=tuple(
        replace(v, move=m) for v, m in zip(chosen.victims, moves, strict=True)
    ))  # fmt: skip


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_crowd())
def test_the_plan_s_shortcuts_choose_as_every_step_taken(
    crowd: tuple[list[Pod], list[DisruptionBudget], list[Room]],
) -> None:
    pods, budgets, rooms = crowd
    old, new = _resize()
    node = make_node(NODE).allocatable(cpu="4", memory="16Gi").build()
    planned = plan_resize(
        old, new, NodePods(node, [*pods, old]), now=NOW, budgets=budgets, policy=POLICY,
        elsewhere=rooms,
    )  # fmt: skip
    expected = _by_hand(pods, budgets, rooms)
    assert (expected.victim_keys, [v.move for v in expected.victims]) == (
        planned.victim_keys,
        [v.move for v in planned.victims],
    )
