"""Pause, don't kill: who is checkpointed, the restored pod, the record's phases."""

from __future__ import annotations

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
    pause_of,
    remaining_grace,
    restored_pod,
)
from webhook.core.model import Pod
from webhook.core.plan import NodePods, plan_resize
from webhook.core.policy import DefaultPolicy
from webhook.core.report import human_report, plan_to_dict, warnings_for
from webhook.engine.pauses import (
    IMAGING_PATIENCE,
    Advance,
    Create,
    Wait,
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
        "archives": {"count": "/var/lib/kubelet/checkpoints/a.tar"},
        "images": {"count": "localhost/resize-preemption-checkpoint/team-b/low/count:u-1"},
        "commands": {"count": ["sh", "-c", "loop"]},
        "sizes": {"count": 270336},
        "checkpointed_at": "2026-12-06T07:01:00Z",
    }
    return CheckpointRecord(**{**defaults, **kw})


def test_a_record_reads_back_as_written() -> None:
    record = _record(message="one line")

    assert record == CheckpointRecord.from_data(record.uid, record.node, record.data())


@pytest.mark.parametrize(
    "data",
    [
        pytest.param({"phase": "sleeping"}, id="unknown-phase"),
        pytest.param({"phase": "imaged", "pod": "{"}, id="pod-not-json"),
        pytest.param({"phase": "imaged", "images": "[]"}, id="images-not-an-object"),
        pytest.param({"phase": "imaged", "sizes": '{"c": "x"}'}, id="size-not-a-number"),
    ],
)
def test_a_record_that_does_not_parse_is_a_value_error(data: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="rpw-checkpoint-u-1"):
        CheckpointRecord.from_data("u-1", NODE, data)


def test_the_restored_pod_keeps_its_identity_and_starts_from_its_images() -> None:
    restored = restored_pod(_record())

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
        {"name": "side", "image": "busybox", "command": ["sleep", "inf"]},
    ] == restored["spec"]["containers"]


def _now_pod(
    name: str = "low", uid_: str = "u-2", phase: str = "Running", ours: bool = True
) -> Pod:
    builder = make_pod(name, "team-b").uid(uid_).on(NODE).phase(phase)
    if ours:
        builder = builder.annotate(RESTORED_FROM_ANNOTATION, "rpw-checkpoint-u-1")
    return builder.build()


@pytest.mark.parametrize(
    ("phase", "now_pod", "fits", "age", "expected"),
    [
        pytest.param(Phase.ARCHIVED, None, True, 5.0, Wait(), id="archived-waits-for-its-agent"),
        pytest.param(
            Phase.ARCHIVED,
            None,
            True,
            IMAGING_PATIENCE + 1,
            Advance(Phase.ABANDONED, "no image of the checkpoint was made in time"),
            id="archived-too-long",
        ),
        pytest.param(
            Phase.IMAGED,
            _now_pod(uid_="u-1", ours=False),
            True,
            1.0,
            Wait(),
            id="imaged-victim-still-leaving",
        ),
        pytest.param(Phase.IMAGED, None, False, 1.0, Wait(), id="imaged-no-room-yet"),
        pytest.param(
            Phase.IMAGED,
            _now_pod(ours=False),
            True,
            1.0,
            Advance(Phase.ABANDONED, "another pod team-b/low exists"),
            id="imaged-name-taken",
        ),
        pytest.param(
            Phase.IMAGED,
            _now_pod(phase="Pending"),
            True,
            1.0,
            Advance(Phase.RESTORING),
            id="imaged-created-before-a-restart",
        ),
        pytest.param(
            Phase.RESTORING,
            _now_pod(phase="Pending"),
            True,
            1.0,
            Wait(),
            id="restoring-not-running-yet",
        ),
        pytest.param(
            Phase.RESTORING,
            _now_pod(),
            True,
            1.0,
            Advance(Phase.RESTORED, "the restored pod is Running"),
            id="restoring-runs",
        ),
        pytest.param(
            Phase.RESTORING,
            _now_pod(phase="Failed"),
            True,
            1.0,
            Advance(Phase.RESTORED, "the restored pod is Failed"),
            id="restoring-failed-ends-too",
        ),
        pytest.param(
            Phase.RESTORING,
            _now_pod(phase="Pending"),
            True,
            500.0,
            Advance(Phase.RESTORED, "the restored pod has not started in time"),
            id="restoring-too-long",
        ),
        pytest.param(
            Phase.RESTORING,
            None,
            True,
            1.0,
            Advance(Phase.ABANDONED, "the restored pod was deleted"),
            id="restoring-deleted",
        ),
        pytest.param(Phase.RESTORED, None, True, 1.0, Wait(), id="restored-is-the-agents"),
        pytest.param(Phase.FAILED, None, True, 1.0, Wait(), id="failed-is-the-agents"),
    ],
)
def test_one_step_of_a_checkpoint(
    phase: Phase, now_pod: Pod | None, fits: bool, age: float, expected: object
) -> None:
    assert expected == step(_record(phase=phase), now_pod, lambda: fits, age)


def test_an_imaged_checkpoint_with_room_is_created_again() -> None:
    action = step(_record(), None, lambda: True, 1.0)

    assert Create(restored_pod(_record())) == action


def test_room_is_read_only_when_it_decides() -> None:
    def fits() -> bool:
        raise AssertionError("read")

    assert Wait() == step(_record(phase=Phase.ARCHIVED), None, fits, 1.0)


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
