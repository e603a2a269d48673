"""``python -m webhook status`` without a cluster: what the engine makes of one read
(reservations, loans, Deferred resizes and why they wait, the leader) and how it reads."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from tests.unit.builders import NODE, NOW, OTHER_NODE, T0, PodBuilder, make_node, make_pdb
from tests.unit.test_reconciler import BASE, entry_for, high
from tests.unit.test_worker_logic import LOAN
from webhook.base.settings import Config
from webhook.core.checkpoint import CheckpointRecord, Phase
from webhook.core.model import LabelSelector
from webhook.core.snapshot import load_snapshot
from webhook.engine.ledger import LedgerEntry
from webhook.engine.status import Leader, service_status, status_text, status_to_dict

LIVE_LEADER = Leader("replica-a", NOW - 3, 15, 2)


def objects(*pods: PodBuilder, budgets: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    nodes = [make_node(NODE).obj(), make_node(OTHER_NODE).obj()]
    return [*nodes, *(p.obj() for p in pods), *(b.obj() for b in budgets)]


@dataclass(frozen=True)
class Case:
    pods: tuple[PodBuilder, ...]
    entries: tuple[LedgerEntry, ...] = ()
    budgets: tuple[Any, ...] = ()
    node: str | None = None
    #: (pod, reason, victims) of every Deferred resize; detail starts with ``detail``.
    deferred: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    detail: str = ""
    #: (node, pods holding a reservation there).
    reserved: tuple[tuple[str, tuple[str, ...]], ...] = ()


CASES = [
    pytest.param(
        Case(
            (high(), *BASE),
            deferred=(("default/high", "preempt", ("default/low-a",)),),
            detail="preempt",
        ),
        id="the-reconciler-would-preempt-on-its-next-pass",
    ),
    pytest.param(
        Case(
            (high(), *BASE),
            entries=(entry_for("high", "low-a"),),
            deferred=(("default/high", "preempt", ("default/low-a",)),),
            detail="preemption under way",
            reserved=((NODE, ("default/high",)),),
        ),
        id="preemption-under-way-from-the-ledger",
    ),
    pytest.param(
        Case(
            (high(), *BASE),
            budgets=(make_pdb("low-a").allowing(0),),
            deferred=(("default/high", "infeasible", ()),),
        ),
        id="a-budget-keeps-the-victim",
    ),
    pytest.param(
        Case(
            (high().resize_preemption_disabled(), *BASE),
            deferred=(("default/high", "preemption-disabled", ()),),
            detail="preemption is disabled",
        ),
        id="opted-out",
    ),
    pytest.param(
        Case(
            (high(), *BASE),
            entries=(entry_for("high", "low-a"),),
            node=OTHER_NODE,
        ),
        id="another-node-only",
    ),
    pytest.param(
        Case(
            (*BASE,),
            entries=(entry_for("high", "low-a", expires_at=NOW - 1),),
        ),
        id="an-expired-entry-holds-nothing",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_status_tells_what_is_reserved_and_why_deferred_resizes_wait(case: Case) -> None:
    snapshot = load_snapshot(objects(*case.pods, budgets=case.budgets))

    status = service_status(snapshot, case.entries, LIVE_LEADER, Config(), now=NOW, node=case.node)

    assert case.deferred == tuple((w.pod.key, w.reason, w.victims) for w in status.deferred)
    assert all(w.detail.startswith(case.detail) for w in status.deferred)
    assert case.reserved == tuple(
        (n.name, tuple(e.pod.key for e in n.reservations)) for n in status.nodes
    )


def test_nothing_the_status_plans_is_written_to_the_entries_it_was_given() -> None:
    entries = [entry_for("peer", cpu=1000, review="other")]
    snapshot = load_snapshot(objects(high(), *BASE))

    service_status(snapshot, entries, None, Config(), now=NOW)

    assert [entry_for("peer", cpu=1000, review="other")] == entries


def test_loans_are_listed_with_their_state_on_the_lenders_node() -> None:
    lent = replace(entry_for("high"), loans=(LOAN,))
    snapshot = load_snapshot(objects(high()))

    status = service_status(snapshot, [lent], None, Config(), now=NOW)

    [node] = status.nodes
    assert [("default/lender", "default/high", "void")] == [
        (s.loan.pod.key, s.borrower.key, s.state) for s in node.loans
    ]


@pytest.mark.parametrize(
    ("expected", "leader"),
    [
        pytest.param(False, Leader("a", NOW - 5, 15, 0), id="renewed-within-the-lease"),
        pytest.param(True, Leader("a", NOW - 16, 15, 0), id="lease-ran-out"),
        pytest.param(True, Leader("", NOW, 15, 0), id="released"),
        pytest.param(True, Leader("a", None, 15, 0), id="never-renewed"),
    ],
)
def test_a_leader_is_live_while_its_lease_lasts(expected: bool, leader: Leader) -> None:
    assert expected == leader.expired(NOW)


def test_the_table_names_the_leader_the_reservations_and_the_deferred_resizes() -> None:
    snapshot = load_snapshot(objects(high(), *BASE))
    status = service_status(snapshot, [entry_for("high", "low-a")], LIVE_LEADER, Config(), now=NOW)

    text = status_text(status)

    lines = text.splitlines()
    assert "leader: replica-a (renewed 3s ago, lease 15s)" == lines[0]
    reservation = next(line for line in lines if line.lstrip().startswith(NODE))
    assert [
        "node-1",
        "default/high",
        "cpu",
        "6,",
        "memory",
        "1Gi",
        "default/low-a",
        "1s",
        "60s",
    ] == reservation.split()
    deferred = next(line for line in lines if line.lstrip().startswith("default/high"))
    # Pending since T0 + 500: 9500 s.
    assert ["default/high", NODE, "2h38m", "preempt", "preemption"] == deferred.split()[:5]
    assert "  (none)" == lines[lines.index("loans:") + 1]


@pytest.mark.parametrize(
    ("expected", "leader"),
    [
        pytest.param("leader: none (no leader Lease: is the webhook running?)", None, id="none"),
        pytest.param(
            "leader: none (the Lease of replica-a has run out)",
            replace(LIVE_LEADER, renewed_at=NOW - 60),
            id="ran-out",
        ),
    ],
)
def test_the_table_says_when_there_is_no_leader(expected: str, leader: Leader | None) -> None:
    status = service_status(load_snapshot(objects()), [], leader, Config(), now=NOW)

    assert expected == status_text(status).splitlines()[0]


def test_json_carries_the_same_in_kubernetes_notation() -> None:
    snapshot = load_snapshot(objects(high(), *BASE))
    status = service_status(snapshot, [entry_for("high", "low-a")], LIVE_LEADER, Config(), now=NOW)

    data = status_to_dict(status)

    assert {
        "holder": "replica-a",
        "renewedSecondsAgo": 3.0,
        "leaseDurationSeconds": 15,
        "transitions": 2,
        "expired": False,
    } == data["leader"]
    [node] = data["nodes"]
    assert {
        "pod": "default/high",
        "requests": {"cpu": "6", "memory": "1Gi"},
        "victimsPending": ["default/low-a"],
        "victims": ["default/low-a"],
        "admittedSecondsAgo": 1.0,
        "expiresInSeconds": 60.0,
        "review": "review-1",
    } == node["reservations"][0]
    [waiting] = data["deferred"]
    assert ("default/high", NODE, "preempt", ["default/low-a"]) == (
        waiting["pod"],
        waiting["node"],
        waiting["reason"],
        waiting["victims"],
    )
    assert NOW - T0 - 500 == waiting["waitingSeconds"]


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"team": "a"}, ("preempt", ("default/low-a",))),
        ({"team": "b"}, ("not-eligible", ())),
    ],
    ids=["selected", "not-selected"],
)
def test_status_holds_a_deferred_resize_to_the_preemptor_policy(
    labels: dict[str, str], expected: tuple[str, tuple[str, ...]]
) -> None:
    namespace = {"kind": "Namespace", "metadata": {"name": "default", "labels": labels}}
    snapshot = load_snapshot([*objects(high(), *BASE), namespace])
    config = Config(preemptor_namespace_selector=LabelSelector(match_labels=(("team", "a"),)))

    status = service_status(snapshot, [], LIVE_LEADER, config, now=NOW)

    assert [("default/high", *expected)] == [
        (w.pod.key, w.reason, w.victims) for w in status.deferred
    ]


def _record(uid: str, phase: Phase, node: str = NODE) -> CheckpointRecord:
    pod = {"metadata": {"namespace": "team-b", "name": f"pod-{uid}", "uid": uid}, "spec": {}}
    image = f"localhost/resize-preemption-checkpoint/team-b/pod-{uid}/main:{uid}"
    return CheckpointRecord(
        uid, node, phase, pod, {"main": "/a.tar"}, {"main": image}, sizes={"main": 4096},
        checkpointed_at="2026-12-06T07:00:00Z",
    )  # fmt: skip


def test_checkpoints_waiting_for_room_are_listed_the_ended_ones_are_not() -> None:
    records = [_record(u, p) for u, p in (("a", Phase.ARCHIVED), ("b", Phase.IMAGED),
               ("c", Phase.RESTORING), ("d", Phase.RESTORED), ("e", Phase.ABANDONED),
               ("f", Phase.FAILED))]  # fmt: skip
    other = _record("g", Phase.IMAGED, OTHER_NODE)

    status = service_status(
        load_snapshot(objects()), [], None, Config(), now=NOW, checkpoints=[*records, other]
    )
    on_node = service_status(
        load_snapshot(objects()), [], None, Config(), now=NOW, node=NODE, checkpoints=[other]
    )

    assert ["team-b/pod-a", "team-b/pod-b", "team-b/pod-c", "team-b/pod-g"] == [
        c["pod"] for c in status_to_dict(status)["checkpoints"]
    ]
    assert [] == status_to_dict(on_node)["checkpoints"]
    assert {
        "pod": "team-b/pod-b",
        "node": NODE,
        "phase": "imaged",
        "checkpointedAt": "2026-12-06T07:00:00Z",
        "bytes": 4096,
        "record": "rpw-checkpoint-b",
        "comesBackOn": {
            "node": NODE,
            "orAnyAbleNode": False,
            "why": f"its images are in {NODE}'s runtime only",
        },
    } == status_to_dict(status)["checkpoints"][1]
    text = status_text(status).split("checkpoints waiting for room:\n", 1)[1].splitlines()
    assert ["POD", "NODE", "PHASE", "CHECKPOINTED", "COMES", "BACK", "ON", "RECORD"] == (
        text[0].split()
    )
    assert [
        "team-b/pod-a", NODE, "archived", "2026-12-06T07:00:00Z", NODE, "rpw-checkpoint-a"
    ] == text[1].split()  # fmt: skip


REGISTRY = {"main": "registry.example:5000/rpw/team-b/pod/main:0123456789ab"}


def _restored(uid: str, node: str) -> dict[str, Any]:
    """The pod the restorer created from record ``uid``, bound to ``node``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "namespace": "team-b",
            "name": f"pod-{uid}",
            "uid": f"new-{uid}",
            "annotations": {"resize-preemption.io/restored-from": f"rpw-checkpoint-{uid}"},
        },
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x"}]},
        "status": {"phase": "Pending"},
    }


@pytest.mark.parametrize(
    ("record", "pods", "expected_where", "expected_json"),
    [
        pytest.param(
            _record("a", Phase.IMAGED), [], NODE,
            {"node": NODE, "orAnyAbleNode": False,
             "why": f"its images are in {NODE}'s runtime only"},
            id="local-images-its-node",
        ),
        pytest.param(
            replace(_record("a", Phase.IMAGED), images=REGISTRY), [], f"{NODE} or any able node",
            {"node": NODE, "orAnyAbleNode": True, "why": ""},
            id="registry-images-any-able-node",
        ),
        pytest.param(
            replace(_record("a", Phase.ARCHIVED), images={}), [], NODE,
            {"node": NODE, "orAnyAbleNode": False, "why": "its images are not made yet"},
            id="archived-not-imaged-yet",
        ),
        pytest.param(
            replace(_record("a", Phase.IMAGED), images=REGISTRY, pod={
                "metadata": {"namespace": "team-b", "name": "pod-a", "uid": "a"},
                "spec": {"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}]},
            }),
            [], NODE,
            {"node": NODE, "orAnyAbleNode": False,
             "why": "its volumes cannot be judged on another node"},
            id="registry-images-but-volumes",
        ),
        pytest.param(
            replace(_record("a", Phase.RESTORING), images=REGISTRY), [_restored("a", OTHER_NODE)],
            f"{OTHER_NODE} (restoring)",
            {"node": OTHER_NODE, "orAnyAbleNode": False, "why": "its restored pod is bound there"},
            id="restoring-on-the-other-node",
        ),
    ],
)  # fmt: skip
def test_status_says_where_a_checkpoint_may_come_back(
    record: CheckpointRecord,
    pods: list[dict[str, Any]],
    expected_where: str,
    expected_json: dict[str, Any],
) -> None:
    status = service_status(
        load_snapshot([*objects(), *pods]), [], None, Config(), now=NOW, checkpoints=[record]
    )

    assert expected_json == status_to_dict(status)["checkpoints"][0]["comesBackOn"]
    text = status_text(status).split("checkpoints waiting for room:\n", 1)[1].splitlines()
    assert expected_where in text[1]
