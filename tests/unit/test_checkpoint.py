"""Pause, don't kill: who is checkpointed, the restored pod, the record's phases."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.builders import NODE, make_node, make_pod, walkthrough
from webhook.core.checkpoint import (
    ON_PREEMPT_ANNOTATION,
    RESTORED_FROM_ANNOTATION,
    CheckpointRecord,
    NodeCheckpointing,
    Phase,
    Return,
    comes_back_on,
    only_its_node,
    pause_of,
    remaining_grace,
    restored_pod,
)
from webhook.core.model import Pod, Taint
from webhook.core.movable import Room
from webhook.core.objects import parse_pod
from webhook.core.plan import NodePods, plan_resize
from webhook.core.policy import DefaultPolicy
from webhook.core.report import human_report, plan_to_dict, warnings_for
from webhook.core.resources import Resources
from webhook.engine.pauses import (
    IMAGING_PATIENCE,
    Advance,
    Create,
    Later,
    step,
)

ABLE = NodeCheckpointing(NODE, checkpoint=True, restore=True, criu="4.1.1")
NO_CRIU = NodeCheckpointing(NODE, checkpoint=False, restore=True, message="criu not found")


def _opted(name: str = "low") -> Any:
    return make_pod(name).on(NODE).annotate(ON_PREEMPT_ANNOTATION, "checkpoint")


@pytest.mark.parametrize(
    ("pod", "node", "enabled", "expected"),
    [
        pytest.param(make_pod("low").on(NODE), ABLE, True, None, id="not-opted-in"),
        pytest.param(
            _opted(),
            ABLE,
            True,
            (True, "checkpointed, and restored on node-1 when room returns"),
            id="checkpointed",
        ),
        pytest.param(
            _opted(),
            ABLE,
            False,
            (False, "checkpoints are off in this service: evicted"),
            id="service-off",
        ),
        pytest.param(
            _opted().owned_by("ReplicaSet"),
            ABLE,
            True,
            (False, "its ReplicaSet makes a new pod: evicted"),
            id="controller-recreates",
        ),
        pytest.param(
            _opted(),
            None,
            True,
            (False, "no checkpoint agent reports node node-1: evicted"),
            id="no-agent",
        ),
        pytest.param(_opted(), NO_CRIU, True, (False, "criu not found: evicted"), id="node-cannot"),
        pytest.param(
            make_pod("low").on(NODE).annotate(ON_PREEMPT_ANNOTATION, "pause"),
            ABLE,
            True,
            (False, "resize-preemption.io/on-preempt='pause' is not 'checkpoint': evicted"),
            id="unknown-value",
        ),
    ],
)
def test_who_is_checkpointed(
    pod: Any, node: NodeCheckpointing | None, enabled: bool, expected: tuple[bool, str] | None
) -> None:
    pause = pause_of(pod.build(), node, enabled=enabled)

    assert expected == (None if pause is None else (pause.checkpoint, pause.why))


@pytest.mark.parametrize(
    ("grace", "spent", "expected"),
    [
        pytest.param(30, 0.27, 29, id="a-quick-checkpoint-costs-a-second"),
        pytest.param(30, 0.0, 30, id="nothing-spent"),
        pytest.param(2, 5.0, 0, id="never-negative"),
        pytest.param(10, 3.0, 7, id="whole-seconds"),
    ],
)
def test_the_grace_left_after_a_checkpoint(grace: int, spent: float, expected: int) -> None:
    assert expected == remaining_grace(grace, spent)


@given(st.integers(0, 3600), st.floats(0, 4000, allow_nan=False))
def test_checkpoint_and_eviction_never_take_longer_than_the_grace_period(
    grace: int, spent: float
) -> None:
    assert spent + remaining_grace(grace, spent) <= max(grace, spent)


def _record(**kw: Any) -> CheckpointRecord:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "low",
            "namespace": "team-b",
            "uid": "u-1",
            "resourceVersion": "12",
            "creationTimestamp": "2026-12-06T07:00:00Z",
            "labels": {"app": "count"},
            "annotations": {ON_PREEMPT_ANNOTATION: "checkpoint", "note": "kept"},
        },
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": "count", "image": "busybox", "args": ["sh", "-c", "loop"]},
                {"name": "side", "image": "busybox", "command": ["sleep", "inf"]},
            ],
        },
    }
    defaults: dict[str, Any] = {
        "uid": "u-1",
        "node": NODE,
        "phase": Phase.IMAGED,
        "pod": pod,
        "archives": {
            "count": "/var/lib/kubelet/checkpoints/a.tar",
            "side": "/var/lib/kubelet/checkpoints/b.tar",
        },
        "images": {
            "count": "localhost/resize-preemption-checkpoint/team-b/low/count:u-1",
            "side": "localhost/resize-preemption-checkpoint/team-b/low/side:u-1",
        },
        "commands": {"count": ["sh", "-c", "loop"]},
        "sizes": {"count": 270336},
        "checkpointed_at": "2026-12-06T07:01:00Z",
    }
    return CheckpointRecord(**{**defaults, **kw})


def test_a_record_reads_back_as_written() -> None:
    record = _record(message="one line")

    status = {k: v for k, v in record.status().items() if v is not None}
    item = {"metadata": {"name": record.name}, "spec": record.spec(), "status": status}
    assert record == CheckpointRecord.from_object(item)


SPEC = {"uid": "u-1", "node": NODE, "pod": {}, "archives": {}}


@pytest.mark.parametrize(
    ("spec", "status"),
    [
        pytest.param(SPEC, {"phase": "sleeping"}, id="unknown-phase"),
        pytest.param({**SPEC, "pod": "{"}, {"phase": "imaged"}, id="pod-not-an-object"),
        pytest.param(SPEC, {"phase": "imaged", "images": []}, id="images-not-an-object"),
        pytest.param(SPEC, {"phase": "imaged", "sizes": {"c": "x"}}, id="size-not-a-number"),
        pytest.param({**SPEC, "uid": "u-2"}, {"phase": "imaged"}, id="another-uid"),
        pytest.param({"node": NODE}, {"phase": "imaged"}, id="no-uid"),
    ],
)
def test_a_record_that_does_not_parse_is_a_value_error(
    spec: dict[str, Any], status: dict[str, Any]
) -> None:
    item = {"metadata": {"name": "rpw-checkpoint-u-1"}, "spec": spec, "status": status}
    with pytest.raises(ValueError, match="rpw-checkpoint-u-1"):
        CheckpointRecord.from_object(item)


def test_the_restored_pod_keeps_its_identity_and_starts_from_its_images() -> None:
    restored = restored_pod(_record(), NODE)

    assert {
        "name": "low",
        "namespace": "team-b",
        "labels": {"app": "count"},
        "annotations": {
            ON_PREEMPT_ANNOTATION: "checkpoint",
            "note": "kept",
            RESTORED_FROM_ANNOTATION: "rpw-checkpoint-u-1",
        },
    } == restored["metadata"]
    assert NODE == restored["spec"]["nodeName"]
    assert [
        {
            "name": "count",
            "image": "localhost/resize-preemption-checkpoint/team-b/low/count:u-1",
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", "loop"],
            "args": [],
        },
        {
            "name": "side",
            "image": "localhost/resize-preemption-checkpoint/team-b/low/side:u-1",
            "imagePullPolicy": "Never",
            "command": ["sleep", "inf"],
            "args": [],
        },
    ] == restored["spec"]["containers"]


def _now_pod(
    name: str = "low", uid_: str = "u-2", phase: str = "Running", ours: bool = True
) -> Pod:
    builder = make_pod(name, "team-b").uid(uid_).on(NODE).phase(phase)
    if ours:
        builder = builder.annotate(RESTORED_FROM_ANNOTATION, "rpw-checkpoint-u-1")
    return builder.build()


@pytest.mark.parametrize(
    ("phase", "now_pod", "where", "age", "expected"),
    [
        pytest.param(Phase.ARCHIVED, None, NODE, 5.0, Later(), id="archived-waits-for-its-agent"),
        pytest.param(
            Phase.ARCHIVED,
            None,
            NODE,
            IMAGING_PATIENCE + 1,
            Advance(Phase.ABANDONED, "no image of the checkpoint was made in time"),
            id="archived-too-long",
        ),
        pytest.param(
            Phase.IMAGED,
            _now_pod(uid_="u-1", ours=False),
            NODE,
            1.0,
            Later(),
            id="imaged-victim-still-leaving",
        ),
        pytest.param(Phase.IMAGED, None, "", 1.0, Later(), id="imaged-no-room-yet"),
        pytest.param(
            Phase.IMAGED,
            _now_pod(ours=False),
            NODE,
            1.0,
            Advance(Phase.ABANDONED, "another pod team-b/low exists"),
            id="imaged-name-taken",
        ),
        pytest.param(
            Phase.IMAGED,
            _now_pod(phase="Pending"),
            NODE,
            1.0,
            Advance(Phase.RESTORING),
            id="imaged-created-before-a-restart",
        ),
        pytest.param(
            Phase.RESTORING,
            _now_pod(phase="Pending"),
            NODE,
            1.0,
            Later(),
            id="restoring-not-running-yet",
        ),
        pytest.param(
            Phase.RESTORING,
            _now_pod(),
            NODE,
            1.0,
            Advance(Phase.RESTORED, "the restored pod is Running"),
            id="restoring-runs",
        ),
        pytest.param(
            Phase.RESTORING,
            _now_pod(phase="Failed"),
            NODE,
            1.0,
            Advance(Phase.RESTORED, "the restored pod is Failed"),
            id="restoring-failed-ends-too",
        ),
        pytest.param(
            Phase.RESTORING,
            _now_pod(phase="Pending"),
            NODE,
            500.0,
            Advance(Phase.RESTORED, "the restored pod has not started in time"),
            id="restoring-too-long",
        ),
        pytest.param(
            Phase.RESTORING,
            None,
            NODE,
            1.0,
            Advance(Phase.ABANDONED, "the restored pod was deleted"),
            id="restoring-deleted",
        ),
        pytest.param(Phase.RESTORED, None, NODE, 1.0, Later(), id="restored-is-the-agents"),
        pytest.param(Phase.FAILED, None, NODE, 1.0, Later(), id="failed-is-the-agents"),
    ],
)
def test_one_step_of_a_checkpoint(
    phase: Phase, now_pod: Pod | None, where: str, age: float, expected: object
) -> None:
    assert expected == step(_record(phase=phase), now_pod, lambda: where, age)


@pytest.mark.parametrize(
    ("record", "where"),
    [
        pytest.param(_record(), NODE, id="local-images-on-its-node"),
        pytest.param(_record(images={c: f"registry.example:5000/rpw/team-b/low/{c}:u-1"
                                     for c in ("count", "side")}), "node-2",
                     id="registry-images-elsewhere"),
    ],
)  # fmt: skip
def test_an_imaged_checkpoint_with_room_is_created_again_where_there_is_room(
    record: CheckpointRecord, where: str
) -> None:
    action = step(record, None, lambda: where, 1.0)

    assert Create(restored_pod(record, where), where) == action


def test_room_is_read_only_when_it_decides() -> None:
    def where() -> str:
        raise AssertionError("read")

    assert Later() == step(_record(phase=Phase.ARCHIVED), None, where, 1.0)


# -- where a checkpointed pod comes back ---------------------------------------------------

OTHER, THIRD = "node-2", "node-3"
REGISTRY = {"count": "registry.example:5000/rpw/team-b/low/count:0123456789ab"}
GI = 1024**3


def _portable(**spec: Any) -> CheckpointRecord:
    """A record whose image is in a registry; its pod asks 1 CPU and 1Gi, with ``spec``'s
    fields besides."""
    record = _record(images=REGISTRY)
    pod = dict(record.pod)
    containers = [dict(c) for c in pod["spec"]["containers"]]
    containers[0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    pod["spec"] = {**pod["spec"], "containers": containers, **spec}
    return _record(images=REGISTRY, pod=pod)


def _room(node: str, cpu: int, memory: int = 4 * GI, **kw: Any) -> Room:
    return Room(node, Resources(cpu, memory), **kw)


def _back(
    record: CheckpointRecord,
    home: Room | None,
    rooms: list[Room],
    able: tuple[str, ...] = (NODE, OTHER, THIRD),
    taken: dict[str, Resources] | None = None,
) -> Return:
    return comes_back_on(record, parse_pod(dict(record.pod)), home, rooms, able, taken)


HOME_FULL = _room(NODE, 500)


@pytest.mark.parametrize(
    ("record", "home", "rooms", "able", "taken", "expected"),
    [
        pytest.param(
            _portable(), _room(NODE, 1000), [_room(OTHER, 8000)], (OTHER,), None,
            Return(NODE, "its node node-1 has room"),
            id="its-own-node-first-when-it-fits",
        ),
        pytest.param(
            replace(_portable(), images=_record().images),
            _room(NODE, 8000, taints=(Taint("node-role.kubernetes.io/control-plane", "",
                                            "NoSchedule"),)),
            [], (), None,
            Return("", "node-1 does not allow it now; its images are in node-1's runtime only"),
            id="never-its-own-node-when-it-does-not-tolerate-its-taints",
        ),
        pytest.param(
            _portable(), _room(NODE, 8000, taints=(Taint("gpu", "", "NoExecute"),)),
            [_room(OTHER, 2000)], (OTHER,), None,
            Return(OTHER, "no room on node-1; node-2 has room and can restore"),
            id="another-node-when-its-own-has-a-taint-it-does-not-tolerate",
        ),
        pytest.param(
            _portable(), HOME_FULL, [_room(OTHER, 2000)], (OTHER,), None,
            Return(OTHER, "no room on node-1; node-2 has room and can restore"),
            id="registry-images-elsewhere-at-once",
        ),
        pytest.param(
            replace(_portable(), images=_record().images), HOME_FULL, [_room(OTHER, 8000)],
            (OTHER,), None,
            Return("", "no room on node-1 yet; its images are in node-1's runtime only"),
            id="local-images-wait-for-their-node",
        ),
        pytest.param(
            _portable(), HOME_FULL, [_room(OTHER, 8000)], (), None,
            Return("", "no room on node-1, nor on another node able to restore"),
            id="no-agent-able-elsewhere",
        ),
        pytest.param(
            _portable(), HOME_FULL, [_room(OTHER, 900)], (OTHER,), None,
            Return("", "no room on node-1, nor on another node able to restore"),
            id="no-cpu-elsewhere",
        ),
        pytest.param(
            _portable(), HOME_FULL, [_room(OTHER, 2000, GI // 2)], (OTHER,), None,
            Return("", "no room on node-1, nor on another node able to restore"),
            id="no-memory-elsewhere",
        ),
        pytest.param(
            _portable(), HOME_FULL, [_room(OTHER, 2000), _room(THIRD, 3000)], (OTHER, THIRD),
            None, Return(THIRD, "no room on node-1; node-3 has room and can restore"),
            id="the-roomiest-cpu-first",
        ),
        pytest.param(
            _portable(), HOME_FULL, [_room(THIRD, 2000, 2 * GI), _room(OTHER, 2000, 3 * GI)],
            (OTHER, THIRD), None,
            Return(OTHER, "no room on node-1; node-2 has room and can restore"),
            id="then-the-roomiest-memory",
        ),
        pytest.param(
            _portable(), HOME_FULL, [_room(THIRD, 2000), _room(OTHER, 2000)], (OTHER, THIRD),
            None, Return(OTHER, "no room on node-1; node-2 has room and can restore"),
            id="then-by-name",
        ),
        pytest.param(
            _portable(), HOME_FULL, [_room(OTHER, 3000), _room(THIRD, 2000)], (OTHER, THIRD),
            {OTHER: Resources(2500, 0)},
            Return(THIRD, "no room on node-1; node-3 has room and can restore"),
            id="what-this-pass-took-counts",
        ),
        pytest.param(
            _portable(), _room(NODE, 1000), [_room(OTHER, 8000)], (OTHER,),
            {NODE: Resources(500, 0)},
            Return(OTHER, "no room on node-1; node-2 has room and can restore"),
            id="taken-on-its-own-node-counts-too",
        ),
        pytest.param(
            _portable(), None, [_room(OTHER, 2000)], (OTHER,), None,
            Return(OTHER, "no room on node-1; node-2 has room and can restore"),
            id="its-node-takes-no-pods",
        ),
        pytest.param(
            _portable(), HOME_FULL, [_room(NODE, 8000)], (NODE,), None,
            Return("", "no room on node-1, nor on another node able to restore"),
            id="its-own-node-is-no-other-node",
        ),
        pytest.param(
            _portable(nodeSelector={"disk": "ssd"}), HOME_FULL,
            [_room(OTHER, 8000), _room(THIRD, 2000, labels={"disk": "ssd"})], (OTHER, THIRD),
            None, Return(THIRD, "no room on node-1; node-3 has room and can restore"),
            id="node-selector",
        ),
        pytest.param(
            _portable(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "zone", "operator": "In", "values": ["b"]}]}]}}}),
            HOME_FULL, [_room(OTHER, 8000, labels={"zone": "a"})], (OTHER,), None,
            Return("", "no room on node-1, nor on another node able to restore"),
            id="required-node-affinity",
        ),
        pytest.param(
            _portable(), HOME_FULL, [_room(OTHER, 8000, taints=(Taint("gpu", "", "NoSchedule"),))],
            (OTHER,), None,
            Return("", "no room on node-1, nor on another node able to restore"),
            id="an-untolerated-taint",
        ),
        pytest.param(
            _portable(tolerations=[{"key": "gpu", "operator": "Exists"}]), HOME_FULL,
            [_room(OTHER, 8000, taints=(Taint("gpu", "", "NoSchedule"),))], (OTHER,), None,
            Return(OTHER, "no room on node-1; node-2 has room and can restore"),
            id="a-tolerated-taint",
        ),
        pytest.param(
            _portable(volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]),
            HOME_FULL, [_room(OTHER, 8000)], (OTHER,), None,
            Return("", "no room on node-1 yet; its volumes cannot be judged on another node"),
            id="volumes-its-node-only",
        ),
        pytest.param(
            _portable(affinity={"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"topologyKey": "kubernetes.io/hostname", "labelSelector": {}}]}}),
            HOME_FULL, [_room(OTHER, 8000)], (OTHER,), None,
            Return("", "no room on node-1 yet; its inter-pod affinity cannot be judged on "
                   "another node"),
            id="inter-pod-affinity-its-node-only",
        ),
        pytest.param(
            _portable(hostNetwork=True), HOME_FULL, [_room(OTHER, 8000)], (OTHER,), None,
            Return("", "no room on node-1 yet; its host ports cannot be judged on another node"),
            id="host-network-its-node-only",
        ),
    ],
)  # fmt: skip
def test_where_a_checkpointed_pod_comes_back(
    record: CheckpointRecord,
    home: Room | None,
    rooms: list[Room],
    able: tuple[str, ...],
    taken: dict[str, Resources] | None,
    expected: Return,
) -> None:
    assert expected == _back(record, home, rooms, able, taken)


def test_a_host_port_keeps_a_pod_on_its_node() -> None:
    record = _portable()
    pod = dict(record.pod)
    containers = [dict(c) for c in pod["spec"]["containers"]]
    containers[0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    pod["spec"] = {**pod["spec"], "containers": containers}
    held = _record(images=REGISTRY, pod=pod)

    assert "its host ports cannot be judged on another node" == only_its_node(
        held, parse_pod(dict(held.pod))
    )


@pytest.mark.parametrize(
    ("images", "expected"),
    [
        pytest.param({"count": "localhost/resize-preemption-checkpoint/team-b/low/count:u-1"},
                     False, id="local"),
        pytest.param(REGISTRY, True, id="registry"),
        pytest.param({**REGISTRY, "side": "localhost/resize-preemption-checkpoint/t/l/side:u"},
                     False, id="one-local-image-keeps-it-home"),
        pytest.param({"count": "localhost/resize-preemption-checkpointed/x:1"}, True,
                     id="a-lookalike-repository-is-a-registry"),
        pytest.param({}, False, id="no-images-yet"),
    ],
)  # fmt: skip
def test_a_record_is_portable_when_every_image_is_in_a_registry(
    images: dict[str, str], expected: bool
) -> None:
    assert expected == _record(images=images).portable


@pytest.mark.parametrize(
    ("images", "node", "expected_policy"),
    [
        pytest.param({"count": "localhost/resize-preemption-checkpoint/team-b/low/count:u-1"},
                     NODE, "Never", id="local-on-its-node"),
        pytest.param(REGISTRY, NODE, "IfNotPresent", id="registry-on-its-node"),
        pytest.param(REGISTRY, OTHER, "IfNotPresent", id="registry-elsewhere"),
    ],
)  # fmt: skip
def test_the_restored_pod_is_bound_to_the_node_given_and_pulls_registry_images(
    images: dict[str, str], node: str, expected_policy: str
) -> None:
    restored = restored_pod(_record(images=images), node)

    assert node == restored["spec"]["nodeName"]
    assert (images["count"], expected_policy) == (
        restored["spec"]["containers"][0]["image"],
        restored["spec"]["containers"][0]["imagePullPolicy"],
    )
    assert "imagePullPolicy" not in restored["spec"]["containers"][1]  # not checkpointed


def test_a_record_with_local_images_is_never_restored_on_another_node() -> None:
    with pytest.raises(ValueError, match="rpw-checkpoint-u-1 can come back on node-1 only"):
        restored_pod(_record(), OTHER)


# -- plans ---------------------------------------------------------------------------------


def _walkthrough_plan(low: Pod, *, order: str, pause: Any) -> Any:
    old, new, _, _ = walkthrough()
    # Room for one victim's worth: 4 + 3 + 3 CPU held of 11, the resize asks 2 more.
    node = make_node(NODE).allocatable(cpu="11", memory="16Gi").build()
    other = (
        make_pod("other-low")
        .priority(low.priority)
        .requests(cpu="3", memory="500Mi")
        .on(NODE)
        .started(110)  # started after the walkthrough's low pod: upstream's victim
        .admitted()
        .build()
    )
    rooms = [] if order == "movable-first" else None
    return plan_resize(
        old,
        new,
        NodePods(node, [low, other, old]),
        now=1000.0,
        policy=DefaultPolicy(),
        elsewhere=rooms,
        pause=pause,
    )


def _low(opted: bool) -> Pod:
    _, _, _, (low,) = walkthrough()
    b = make_pod("low-priority-pod").priority(low.priority).requests(cpu="3", memory="500Mi")
    b = b.on(NODE).started(100).admitted()  # the older: upstream keeps it
    return (b.annotate(ON_PREEMPT_ANNOTATION, "checkpoint") if opted else b).build()


def test_a_plan_says_which_victims_are_checkpointed() -> None:
    plan = _walkthrough_plan(
        _low(True), order="movable-first", pause=partial(pause_of, node=ABLE, enabled=True)
    )

    assert ("default/low-priority-pod",) == plan.victim_keys
    assert [
        {
            "pod": "default/low-priority-pod",
            "checkpoint": True,
            "why": "checkpointed, and restored on node-1 when room returns",
        }
    ] == plan_to_dict(plan)["checkpoints"]
    assert (
        "checkpointing 1 of them, restored when room returns: default/low-priority-pod"
        == warnings_for(plan)[-1]
    )
    assert "checkpoint: checkpointed, and restored on node-1" in human_report(plan)


@pytest.mark.parametrize(
    ("order", "node", "expected"),
    [
        pytest.param("upstream", ABLE, ("default/other-low",), id="upstream-keeps-its-order"),
        pytest.param(
            "movable-first",
            ABLE,
            ("default/low-priority-pod",),
            id="movable-first-prefers-checkpointed",
        ),
        pytest.param(
            "movable-first",
            NO_CRIU,
            ("default/other-low",),
            id="movable-first-not-for-a-refused-opt-in",
        ),
    ],
)
def test_victim_order_prefers_victims_that_will_be_checkpointed(
    order: str, node: NodeCheckpointing, expected: tuple[str, ...]
) -> None:
    plan = _walkthrough_plan(
        _low(True), order=order, pause=partial(pause_of, node=node, enabled=True)
    )

    assert expected == plan.victim_keys


def test_a_plan_without_opted_in_victims_keeps_its_form() -> None:
    plan = _walkthrough_plan(
        _low(False), order="upstream", pause=partial(pause_of, node=ABLE, enabled=True)
    )

    assert "checkpoints" not in plan_to_dict(plan)
    assert 1 == len(warnings_for(plan))
