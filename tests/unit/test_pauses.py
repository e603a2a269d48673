"""The checkpointing evictor and the restorer, on doubles of their ports."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from harness.doubles import (
    FakeCheckpointer,
    FakeCreator,
    FakeEvents,
    FakeEvictor,
    MemoryCheckpoints,
)
from tests.unit.builders import NODE, make_node, make_pod
from webhook.base.metrics import Metrics
from webhook.core.checkpoint import (
    ON_PREEMPT_ANNOTATION,
    RESTORED_FROM_ANNOTATION,
    CheckpointRecord,
    NodeCheckpointing,
    Phase,
    image_reference,
    restored_pod,
)
from webhook.core.model import Node, Pod, PodRef
from webhook.core.resources import Resources
from webhook.engine.ledger import EvictionResult, LedgerEntry
from webhook.engine.memory import FixedClusterView, MemoryLedger
from webhook.engine.pauses import Checkpointed, Pauses, PausingEvictor, Restorer

ABLE = NodeCheckpointing(NODE, checkpoint=True, restore=True)
PREEMPTOR = PodRef("default", "high", "uid-high")


def _victim(opted: bool = True, **kw: Any) -> Pod:
    b = make_pod("low").on(NODE).requests(cpu="1", memory="100Mi").started(10).admitted()
    if opted:
        b = b.annotate(ON_PREEMPT_ANNOTATION, "checkpoint")
    return b.build()


def _evictor(
    victim: Pod, store: MemoryCheckpoints, checkpointer: FakeCheckpointer, enabled: bool = True
) -> tuple[PausingEvictor, FakeEvictor, FakeEvents, Metrics]:
    view = FixedClusterView([make_node(NODE).build()], [victim])
    inner, events, metrics = FakeEvictor(view), FakeEvents(view), Metrics()
    pausing = PausingEvictor(
        inner, view, Pauses(store, enabled), checkpointer, events, metrics, clock=lambda: 0.0
    )
    return pausing, inner, events, metrics


def test_an_opted_in_victim_is_checkpointed_recorded_then_evicted_with_the_grace_left() -> None:
    victim, store, checkpointer = _victim(), MemoryCheckpoints([ABLE]), FakeCheckpointer()
    pausing, inner, events, metrics = _evictor(victim, store, checkpointer)

    result = pausing.evict(victim.ref, PREEMPTOR, NODE, seen_live=True)

    assert EvictionResult.EVICTED == result
    assert [("default/low", NODE)] == checkpointer.calls
    assert [29] == inner.graces  # 30 s less the 0.3 s checkpoint, in whole seconds
    (record,) = store.writes
    assert (Phase.ARCHIVED, {"main": "/checkpoints/low.tar"}) == (record.phase, record.archives)
    assert ["Checkpointed"] == [e[0] for e in events.told]
    assert 1.0 == metrics.checkpoints.labels("checkpointed")._value.get()


@pytest.mark.parametrize(
    ("victim", "store", "answer", "enabled", "expected_calls", "expected_event"),
    [
        pytest.param(
            _victim(opted=False), MemoryCheckpoints([ABLE]), None, True, 0, None, id="not-opted-in"
        ),
        pytest.param(
            _victim(),
            MemoryCheckpoints([ABLE]),
            None,
            False,
            0,
            "checkpoints are off in this service: evicted",
            id="service-off",
        ),
        pytest.param(
            _victim(),
            MemoryCheckpoints(),
            None,
            True,
            0,
            "no checkpoint agent reports node node-1: evicted",
            id="no-agent",
        ),
        pytest.param(
            _victim(),
            MemoryCheckpoints([ABLE]),
            Checkpointed({}, {}, 30, 0.1, "criu not found"),
            True,
            1,
            "criu not found",
            id="kubelet-refused",
        ),
    ],
)
def test_a_victim_not_checkpointed_is_evicted_as_any_other(
    victim: Pod,
    store: MemoryCheckpoints,
    answer: Checkpointed | None,
    enabled: bool,
    expected_calls: int,
    expected_event: str | None,
) -> None:
    checkpointer = FakeCheckpointer(answer)
    pausing, inner, events, _ = _evictor(victim, store, checkpointer, enabled)

    assert EvictionResult.EVICTED == pausing.evict(victim.ref, PREEMPTOR, NODE)
    assert expected_calls == len(checkpointer.calls)
    assert [None] == inner.graces
    assert [] == store.writes
    expected = [] if expected_event is None else [("CheckpointFailed", expected_event)]
    assert expected == events.told


def test_a_record_not_written_evicts_without_a_checkpoint() -> None:
    victim, store = _victim(), MemoryCheckpoints([ABLE])
    store.refuse_writes = True
    pausing, inner, events, _ = _evictor(victim, store, FakeCheckpointer())

    assert EvictionResult.EVICTED == pausing.evict(victim.ref, PREEMPTOR, NODE)
    assert [None] == inner.graces
    assert [("CheckpointFailed", "its checkpoint record was not written")] == (events.told)


def test_a_victim_checkpointed_before_a_restart_is_not_checkpointed_again() -> None:
    victim = _victim()
    done = CheckpointRecord(victim.uid, NODE, Phase.ARCHIVED, {}, {"main": "/a.tar"})
    store, checkpointer = MemoryCheckpoints([ABLE], [done]), FakeCheckpointer()
    pausing, inner, _, _ = _evictor(victim, store, checkpointer)

    assert EvictionResult.EVICTED == pausing.evict(victim.ref, PREEMPTOR, NODE)
    assert [] == checkpointer.calls
    assert [None] == inner.graces


# -- the restorer ------------------------------------------------------------------------------


def _imaged(victim: Pod) -> CheckpointRecord:
    pod = {
        "metadata": {"namespace": victim.namespace, "name": victim.name, "uid": victim.uid},
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "1"}}}
            ],
        },
    }
    return CheckpointRecord(
        victim.uid,
        NODE,
        Phase.IMAGED,
        pod,
        {"main": "/a.tar"},
        {"main": image_reference(victim.namespace, victim.name, "main", victim.uid)},
        {"main": ["sh"]},
        {"main": 4096},
    )


def _restorer(
    pods: list[Pod],
    cpu: str,
    *records: CheckpointRecord,
    others: tuple[Node, ...] = (),
    abilities: tuple[NodeCheckpointing, ...] = (ABLE,),
    entries: tuple[LedgerEntry, ...] = (),
) -> tuple[Restorer, Any]:
    nodes = [make_node(NODE).allocatable(cpu=cpu, memory="8Gi").build(), *others]
    view = FixedClusterView(nodes, pods)
    store, creator = MemoryCheckpoints(abilities, records), FakeCreator()
    restorer = Restorer(view, MemoryLedger(entries), store, creator, FakeEvents(view), Metrics())
    return restorer, (store, creator)


@pytest.mark.parametrize(
    ("cpu", "expected_created"),
    [
        pytest.param("2", 1, id="room-returned"),
        pytest.param("1500m", 0, id="no-room-yet"),
    ],
)
def test_an_imaged_checkpoint_comes_back_once_its_requests_fit(
    cpu: str, expected_created: int
) -> None:
    victim = _victim()
    record = _imaged(victim)
    # The node holds one 1-CPU pod besides: 2 CPU leave room for the restored one.
    other = make_pod("other").on(NODE).requests(cpu="1").started(5).admitted().build()
    restorer, (store, creator) = _restorer([other], cpu, record)

    restorer.run()

    assert expected_created == len(creator.created)
    if expected_created:
        assert [restored_pod(record, NODE)] == creator.created
        assert Phase.RESTORING == store.stored[victim.uid].phase


def test_a_restored_pod_that_runs_ends_its_record() -> None:
    victim = _victim()
    record = replace(_imaged(victim), phase=Phase.RESTORING)
    running = (
        make_pod("low")
        .uid("uid-new")
        .on(NODE)
        .annotate(RESTORED_FROM_ANNOTATION, record.name)
        .phase("Running")
        .build()
    )
    restorer, (store, _) = _restorer([running], "4", record)

    restorer.run()

    assert Phase.RESTORED == store.stored[victim.uid].phase
    assert ["Restored"] == [e[0] for e in restorer.events.told]  # type: ignore[union-attr]


# -- restored on another node -------------------------------------------------------------------

OTHER = "node-2"
REGISTRY = "registry.example:5000/rpw"


def _in_registry(victim: Pod, name: str = "low", uid: str = "") -> CheckpointRecord:
    record = _imaged(victim)
    uid = uid or record.uid
    pod = {**record.pod, "metadata": {**record.pod["metadata"], "name": name, "uid": uid}}
    image = f"{REGISTRY}/{victim.namespace}/{name}/main:{uid[:12]}"
    return replace(record, uid=uid, pod=pod, images={"main": image})


def _full() -> Pod:
    """Holds node-1's 2 CPU."""
    return make_pod("full").on(NODE).requests(cpu="2").started(5).admitted().build()


def _other(cpu: str = "2") -> Node:
    return make_node(OTHER).allocatable(cpu=cpu, memory="8Gi").build()


ABLE_2 = NodeCheckpointing(OTHER, checkpoint=True, restore=True)


@pytest.mark.parametrize(
    ("record", "others", "abilities", "expected_node"),
    [
        pytest.param(_in_registry(_victim()), (_other(),), (ABLE, ABLE_2), OTHER,
                     id="registry-image-on-another-able-node"),
        pytest.param(_imaged(_victim()), (_other(),), (ABLE, ABLE_2), None,
                     id="local-image-waits-for-its-node"),
        pytest.param(_in_registry(_victim()), (_other(),), (ABLE,), None,
                     id="no-agent-on-the-other-node"),
        pytest.param(
            _in_registry(_victim()),
            (_other(),),
            (ABLE, NodeCheckpointing(OTHER, checkpoint=False, restore=True, message="no criu")),
            None,
            id="the-other-node-cannot",
        ),
        pytest.param(_in_registry(_victim()), (_other("500m"),), (ABLE, ABLE_2), None,
                     id="no-room-on-the-other-node"),
        pytest.param(
            _in_registry(_victim()),
            (make_node(OTHER).allocatable(cpu="2", memory="8Gi").cordoned().build(),),
            (ABLE, ABLE_2),
            None,
            id="the-other-node-cordoned",
        ),
    ],
)  # fmt: skip
def test_a_checkpoint_in_a_registry_comes_back_on_another_node_with_room(
    record: CheckpointRecord,
    others: tuple[Node, ...],
    abilities: tuple[NodeCheckpointing, ...],
    expected_node: str | None,
) -> None:
    restorer, (store, creator) = _restorer(
        [_full()], "2", record, others=others, abilities=abilities
    )

    restorer.run()

    expected = [] if expected_node is None else [restored_pod(record, expected_node)]
    assert expected == creator.created
    expected_phase = Phase.IMAGED if expected_node is None else Phase.RESTORING
    assert expected_phase == store.stored[record.uid].phase


def test_two_restores_in_one_pass_never_count_on_the_same_room() -> None:
    # node-2 has room for one 1-CPU pod; node-3 for one more.
    first = _in_registry(_victim(), "low-a", "uid-a")
    second = _in_registry(_victim(), "low-b", "uid-b")
    third_node = make_node("node-3").allocatable(cpu="1", memory="8Gi").build()
    abilities = (ABLE, ABLE_2, NodeCheckpointing("node-3", checkpoint=True, restore=True))
    restorer, (_, creator) = _restorer(
        [_full()], "2", first, second, others=(_other("1500m"), third_node), abilities=abilities
    )

    restorer.run()

    assert [("low-a", OTHER), ("low-b", "node-3")] == [
        (m["metadata"]["name"], m["spec"]["nodeName"]) for m in creator.created
    ]


def test_a_reservation_promising_the_other_nodes_room_keeps_it() -> None:
    # A plan on node-1 promised node-2's 2 CPU to a victim's replacement.
    promise = make_pod("grower").on(NODE).requests(cpu="1").started(1).admitted().build()
    now = time.time()  # the restorer's clock
    entry = LedgerEntry(
        pod=promise.ref,
        node=NODE,
        review_uid="r-1",
        resources=Resources(1000, 0),
        desired=(("main", Resources(1000, 0)),),
        victims=(),
        admitted_at=now,
        expires_at=now + 600,
        moves=((OTHER, Resources(2000, 0)),),
    )
    record = _in_registry(_victim())
    restorer, (_, creator) = _restorer(
        [_full(), promise], "3", record, others=(_other(),), abilities=(ABLE, ABLE_2),
        entries=(entry,),
    )  # fmt: skip

    restorer.run()

    assert [] == creator.created


def test_a_pod_restored_elsewhere_is_told_where() -> None:
    record = replace(_in_registry(_victim()), phase=Phase.RESTORING)
    running = (
        make_pod("low")
        .uid("uid-new")
        .on(OTHER)
        .annotate(RESTORED_FROM_ANNOTATION, record.name)
        .phase("Running")
        .build()
    )
    restorer, (store, _) = _restorer([running], "4", record, others=(_other(),))

    restorer.run()

    assert Phase.RESTORED == store.stored[record.uid].phase
    assert [
        ("Restored", f"Restored on node {OTHER} from {record.name}: the restored pod is Running")
    ] == restorer.events.told  # type: ignore[union-attr]
