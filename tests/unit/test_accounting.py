"""What a pod holds on its node (component-helpers ``PodRequests`` with the kubelet's
status model) and what a node has left (headroom)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from tests.unit.builders import (
    NODE,
    NOW,
    OTHER_NODE,
    Gi,
    Mi,
    PodBuilder,
    make_node,
    make_pod,
    make_reservation,
    uid,
)
from webhook.core.accounting import NodeUsage, Reservation, active_on, node_usage, pod_requests
from webhook.core.model import Pod, PodRef
from webhook.core.resources import Resources

ARITHMETIC = [
    pytest.param(make_pod("a").requests(cpu="1", memory="1Gi"), 1000, Gi, id="one-container"),
    pytest.param(
        make_pod("a").requests(cpu="1").requests(cpu="2", container="b"),
        3000,
        0,
        id="app-containers-add-up",
    ),
    pytest.param(
        make_pod("a").requests(cpu="1", memory="1Gi").sidecar("proxy", cpu="500m", memory="64Mi"),
        1500,
        Gi + 64 * Mi,
        id="sidecar-adds-to-app-containers",
    ),
    pytest.param(
        make_pod("a").requests(cpu="1").init_container("setup", cpu="4"),
        4000,
        0,
        id="init-container-peak-wins",
    ),
    pytest.param(
        make_pod("a").requests(cpu="2").init_container("setup", cpu="1"),
        2000,
        0,
        id="small-init-container-does-not-add",
    ),
    pytest.param(
        make_pod("a")
        .requests(cpu="2")
        .sidecar("proxy", cpu="1")
        .init_container("setup", cpu="3500m"),
        4500,
        0,
        id="init-after-sidecar-counts-the-sidecar",
    ),
    pytest.param(
        make_pod("a")
        .requests(cpu="2")
        .init_container("setup", cpu="3500m")
        .sidecar("proxy", cpu="1"),
        3500,
        0,
        id="init-before-sidecar-does-not",
    ),
    pytest.param(
        make_pod("a")
        .requests(cpu="1")
        .sidecar("s1", cpu="1")
        .init_container("i1", cpu="1")
        .sidecar("s2", cpu="1")
        .init_container("i2", cpu="1"),
        3000,
        0,
        id="sidecars-accumulate-across-init-containers",
    ),
    pytest.param(
        make_pod("a").requests(cpu="1", memory="1Gi").overhead(cpu="250m", memory="120Mi"),
        1250,
        Gi + 120 * Mi,
        id="overhead-on-top",
    ),
    pytest.param(
        make_pod("a").requests(cpu="1", memory="1Gi").pod_resources(cpu="3", memory="2Gi"),
        3000,
        2 * Gi,
        id="pod-level-replaces-containers",
    ),
    pytest.param(
        make_pod("a").requests(cpu="1", memory="1Gi").pod_resources(cpu="3"),
        3000,
        Gi,
        id="pod-level-cpu-only",
    ),
    pytest.param(
        make_pod("a")
        .requests(cpu="1")
        .pod_resources(cpu="3")
        .overhead(cpu="100m")
        .init_container("setup", cpu="8"),
        3100,
        0,
        id="pod-level-replaces-init-peak-and-overhead-still-adds",
    ),
    pytest.param(make_pod("a"), 0, 0, id="no-containers"),
    pytest.param(make_pod("a").requests(), 0, 0, id="no-requests"),
]


@pytest.mark.parametrize(("pod", "cpu", "memory"), ARITHMETIC)
def test_pod_requests_arithmetic(pod: PodBuilder, cpu: int, memory: int) -> None:
    built = pod.build()

    assert Resources(cpu, memory) == pod_requests(built, "other")
    assert Resources(cpu, memory) == pod_requests(built, "resizing")


STATUS_MODEL = [
    pytest.param(
        make_pod("a").requests(cpu="2"),
        Resources(2000, 0),
        Resources(2000, 0),
        id="no-container-status-counts-at-spec",
    ),
    pytest.param(
        make_pod("a").requests(cpu="2").status("app"),
        Resources(2000, 0),
        Resources(2000, 0),
        id="status-without-resources-counts-at-spec",
    ),
    pytest.param(
        make_pod("a").requests(cpu="2").status("app", allocated={"cpu": "1"}, actual={"cpu": "1"}),
        Resources(1000, 0),
        Resources(2000, 0),
        id="pending-growth-other-at-allocated-resizing-at-desired",
    ),
    pytest.param(
        make_pod("a")
        .requests(cpu="2")
        .status("app", allocated={"cpu": "1"}, actual={"cpu": "1500m"}),
        Resources(1500, 0),
        Resources(2000, 0),
        id="actual-above-allocated",
    ),
    pytest.param(
        make_pod("a").requests(cpu="1").status("app", allocated={"cpu": "3"}, actual={"cpu": "2"}),
        Resources(3000, 0),
        Resources(3000, 0),
        id="shrink-not-yet-actuated-holds-the-larger",
    ),
    pytest.param(
        make_pod("a").requests(cpu="1").status("app", actual={"cpu": "2"}),
        Resources(2000, 0),
        Resources(2000, 0),
        id="actual-only",
    ),
    pytest.param(
        make_pod("a")
        .requests(cpu="2", memory="2Gi")
        .status("app", allocated={"cpu": "1", "memory": "1Gi"}),
        Resources(1000, Gi),
        Resources(2000, 2 * Gi),
        id="allocated-only",
    ),
    pytest.param(
        make_pod("a")
        .requests(cpu="1")
        .sidecar("proxy", cpu="1")
        .status("proxy", allocated={"cpu": "500m"}, init=True),
        Resources(1500, 0),
        Resources(2000, 0),
        id="sidecar-follows-its-status",
    ),
    pytest.param(
        make_pod("a")
        .requests(cpu="1")
        .init_container("setup", cpu="3")
        .status("setup", allocated={"cpu": "100m"}, init=True),
        # The kubelet counts an admitted pod at its allocation, init containers too.
        Resources(1000, 0),
        Resources(3000, 0),
        id="init-container-at-its-allocation-desired-when-resizing",
    ),
    pytest.param(
        make_pod("a")
        .requests(cpu="1")
        .pod_resources(cpu="4")
        .pod_status_resources(allocated=Resources(3000, 0), actual=Resources(3000, 0)),
        Resources(3000, 0),
        Resources(4000, 0),
        id="pod-level-status",
    ),
    pytest.param(
        make_pod("a").requests(cpu="2").status("other-name", allocated={"cpu": "1"}),
        Resources(2000, 0),
        Resources(2000, 0),
        id="status-of-another-container-is-not-used",
    ),
]


@pytest.mark.parametrize(("pod", "other", "resizing"), STATUS_MODEL)
def test_status_model(pod: PodBuilder, other: Resources, resizing: Resources) -> None:
    built = pod.build()

    assert other == pod_requests(built, "other")
    assert resizing == pod_requests(built, "resizing")


# -- headroom -------------------------------------------------------------------------


def headroom(usage: NodeUsage) -> Resources:
    """Room left once everything on its way out has gone (may be negative)."""
    return usage.allocatable - usage.in_use + usage.freeing


def _usage(
    pods: list[Pod], reservations: Sequence[Reservation] = (), exclude: str = "resizing"
) -> NodeUsage:
    node = make_node(NODE).allocatable(cpu="8", memory="16Gi").build()
    active = active_on(reservations, NODE, NOW, exclude_pod=uid(exclude))
    return node_usage(node, pods, active, exclude_uid=uid(exclude))


def test_headroom_subtracts_other_pods() -> None:
    pods = [
        make_pod("resizing").requests(cpu="4").build(),
        make_pod("a").requests(cpu="1", memory="1Gi").build(),
        make_pod("b", "other-ns").requests(cpu="2").build(),
    ]
    usage = _usage(pods)

    assert Resources(3000, Gi) == usage.in_use
    assert Resources(5000, 15 * Gi) == headroom(usage)
    assert {uid("a"): Resources(1000, Gi), uid("b", "other-ns"): Resources(2000, 0)} == dict(
        usage.held
    )


@pytest.mark.parametrize(
    ("pod", "counted"),
    [
        pytest.param(make_pod("p").requests(cpu="1").phase("Succeeded"), False, id="succeeded"),
        pytest.param(make_pod("p").requests(cpu="1").phase("Failed"), False, id="failed"),
        pytest.param(make_pod("p").requests(cpu="1").phase("Pending"), True, id="pending-bound"),
        pytest.param(make_pod("p").requests(cpu="1").on(OTHER_NODE), False, id="other-node"),
        pytest.param(make_pod("p").requests(cpu="1").mirror(), True, id="mirror-pod"),
        pytest.param(make_pod("p").requests(cpu="1").terminating(), True, id="terminating"),
    ],
)
def test_which_pods_hold_room(pod: PodBuilder, counted: bool) -> None:
    usage = _usage([pod.build()])

    assert (Resources(1000, 0) if counted else Resources()) == usage.in_use


def test_terminating_pods_are_on_their_way_out() -> None:
    pods = [
        make_pod("b").requests(cpu="1").terminating().build(),
        make_pod("a").requests(cpu="2").terminating().build(),
        make_pod("c").requests(cpu="3").build(),
    ]
    usage = _usage(pods)

    assert Resources(6000, 0) == usage.in_use
    assert Resources(3000, 0) == usage.freeing
    assert (PodRef("default", "a", uid("a")), PodRef("default", "b", uid("b"))) == (
        usage.waiting_for
    )
    assert Resources(5000, 16 * Gi) == headroom(usage)


RESERVATIONS = [
    pytest.param([], Resources(1000, 0), Resources(), id="none"),
    pytest.param(
        [make_reservation("a", cpu="3")],
        Resources(3000, 0),
        Resources(2000, 0),
        id="raises-a-pod-to-its-reservation",
    ),
    pytest.param(
        [make_reservation("a", cpu="500m")],
        Resources(1000, 0),
        Resources(),
        id="never-below-what-the-pod-holds",
    ),
    pytest.param(
        [make_reservation("unseen", cpu="2", memory="1Gi")],
        Resources(3000, Gi),
        Resources(2000, Gi),
        id="reservation-of-an-unseen-pod",
    ),
    pytest.param(
        [make_reservation("a", cpu="3", expires_in=-1)],
        Resources(1000, 0),
        Resources(),
        id="expired",
    ),
    pytest.param(
        [make_reservation("a", cpu="3", expires_in=0)],
        Resources(1000, 0),
        Resources(),
        id="expires-now",
    ),
    pytest.param(
        [make_reservation("resizing", cpu="6")],
        Resources(1000, 0),
        Resources(),
        id="own-reservation-ignored",
    ),
    pytest.param(
        [make_reservation("x", cpu="6", node=OTHER_NODE)],
        Resources(1000, 0),
        Resources(),
        id="other-node",
    ),
]


@pytest.mark.parametrize(("reservations", "in_use", "reserved"), RESERVATIONS)
def test_reservations_reduce_headroom(
    reservations: list[Reservation], in_use: Resources, reserved: Resources
) -> None:
    pods = [make_pod("resizing").requests(cpu="1").build(), make_pod("a").requests(cpu="1").build()]
    usage = _usage(pods, reservations)

    assert in_use == usage.in_use
    # What the reservations add on top of what the other pod holds.
    assert reserved == usage.in_use - pod_requests(pods[1])


def test_claimed_victims_count_once_as_freeing() -> None:
    pods = [
        make_pod("victim").requests(cpu="2").build(),
        make_pod("claimer").requests(cpu="1").build(),
    ]
    reservations = [make_reservation("claimer", cpu="3", victims=[uid("victim")])]
    usage = _usage(pods, reservations)

    assert Resources(5000, 0) == usage.in_use
    assert Resources(2000, 0) == usage.freeing
    assert (PodRef("default", "victim", uid("victim")),) == usage.waiting_for
    assert Resources(5000, 16 * Gi) == headroom(usage)


def test_claimed_and_terminating_victim_is_not_doubled() -> None:
    pods = [
        make_pod("victim").requests(cpu="2").terminating().build(),
        make_pod("claimer").requests(cpu="1").build(),
    ]
    reservations = [make_reservation("claimer", cpu="3", victims=[uid("victim")])]

    assert Resources(2000, 0) == _usage(pods, reservations).freeing


def test_active_on_filters_node_expiry_and_own() -> None:
    keep = make_reservation("a", cpu="1")
    reservations = [
        keep,
        make_reservation("b", cpu="1", expires_in=-5),
        make_reservation("c", cpu="1", node=OTHER_NODE),
        make_reservation("me", cpu="1"),
    ]

    assert {keep.pod_uid: keep} == active_on(reservations, NODE, NOW, exclude_pod=uid("me"))


def test_reservation_is_active_until_it_expires() -> None:
    r = make_reservation("a", cpu="1")

    assert r.active(NOW)
    assert not replace(r, expires_at=NOW).active(NOW)
