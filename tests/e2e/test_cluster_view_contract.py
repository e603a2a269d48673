"""The cluster view port's contract, one suite for the doubles and the cache.

Every test here runs three times, through the ``world`` fixture: on
:class:`webhook.engine.memory.FixedClusterView` over objects kept in memory ("fixed"),
on the unit tests' :class:`harness.doubles.StaticClusterView` over them
("fixed-static"), and on :class:`webhook.kube.cache.ClusterCache` fed by watches of the
real API server ("cache"). Together they prove that the views
(:class:`~webhook.engine.ledger.ClusterView` and the reconciler's
:class:`~webhook.engine.reconciler.DeferredView`):

* hold in ``pods_on(node)`` every pod bound to that node, terminal ones included, and
  no pod bound to another node or to none;
* read ``pod(namespace, name)`` as the stored object (its uid, node, phase, labels and
  resourceVersion), and ``None`` for a pod not stored there;
* list in ``lenders()`` the pods carrying a loan record on any node, and only those;
* answer ``budgets(namespaces)`` with the budgets of those namespaces only;
* read ``namespace_labels`` as the namespace's labels with the name label the API server
  sets, and ``None`` for a namespace that does not exist;
* read ``node`` and ``all_nodes`` as the stored nodes, each node's room in
  ``node_rooms()`` from the pods bound to it, a pod's priority and the
  ``priority_resolver`` from its PriorityClass;
* list in ``pending_resizes()`` the pods whose resize is Deferred or Infeasible;
* are ``synced``, not stale, and fresh once they hold what was written, and have
  ``caught_up`` with the version of each pod write they hold, never with a later one.

``-k fixed`` runs the doubles' part without a control plane.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from tests.e2e.contract_world import (
    WORLDS,
    World,
    eventually,
    ghost,
    loans_annotation,
    make_world,
    names,
    namespace_doc,
    node_doc,
    pdb_doc,
    pod_doc,
    priority_class_doc,
)
from webhook.core.model import LOANS_ANNOTATION
from webhook.engine.memory import NAME_LABEL

MI = 1024**2
GI = 1024**3


@pytest.fixture(params=WORLDS)
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    yield from make_world(request)


# -- pods by node ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "phase",
    [
        pytest.param("", id="pending"),
        pytest.param("Running", id="running"),
        pytest.param("Succeeded", id="succeeded-terminal"),
        pytest.param("Failed", id="failed-terminal"),
    ],
)
def test_pods_on_a_node_are_every_pod_bound_to_it_in_any_phase(world: World, phase: str) -> None:
    here, there = ghost(), ghost()
    world.create(pod_doc("pod", here, phase=phase))
    world.create(pod_doc("neighbour", here, phase="Running"))
    world.create(pod_doc("elsewhere", there, phase="Running"))
    world.create(pod_doc("unbound", ""))
    view = world.view()

    assert ["neighbour", "pod"] == names(view.pods_on(here), world.namespace)
    assert ["elsewhere"] == names(view.pods_on(there), world.namespace)
    assert [] == names(view.pods_on(ghost()), world.namespace)
    assert [] == names(view.pods_on(""), world.namespace)
    assert (phase or "Pending") == next(p.phase for p in view.pods_on(here) if p.name == "pod")


def test_a_pod_deleted_leaves_its_node_and_one_leaving_stays_on_it(world: World) -> None:
    here = ghost()
    for name in ("gone", "leaving", "staying"):
        world.create(pod_doc(name, here, phase="Running"))

    world.delete_pod("gone", grace=0)
    world.delete_pod("leaving")
    view = world.view()

    assert ["leaving", "staying"] == names(view.pods_on(here), world.namespace)
    assert [True, False] == [
        p.terminating for p in sorted(view.pods_on(here), key=lambda p: p.name)
    ]
    assert view.pod(world.namespace, "gone") is None


# -- one pod --------------------------------------------------------------------------------


def test_a_pod_reads_as_the_stored_object(world: World) -> None:
    here = ghost()
    stored = world.create(pod_doc("web", here, labels={"app": "web", "tier": "front"}))

    found = world.view().pod(world.namespace, "web")

    assert found is not None
    meta = stored["metadata"]
    assert (meta["uid"], meta["resourceVersion"]) == (found.uid, found.resource_version)
    assert (world.namespace, "web", here) == (found.namespace, found.name, found.node)
    assert {"app": "web", "tier": "front"} == dict(found.labels)
    assert 1000 == found.containers[0].requests.cpu


@dataclass(frozen=True)
class Unknown:
    namespace: Callable[[World], str]
    name: str


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(Unknown(lambda w: w.namespace, "nobody"), id="unknown-name"),
        pytest.param(Unknown(lambda w: "no-such-namespace", "web"), id="other-namespace"),
        pytest.param(Unknown(lambda w: w.namespace, ""), id="empty-name"),
    ],
)
def test_a_pod_not_stored_reads_as_none(world: World, case: Unknown) -> None:
    world.create(pod_doc("web", ghost()))

    assert world.view().pod(case.namespace(world), case.name) is None


# -- lenders --------------------------------------------------------------------------------


def test_lenders_are_the_pods_carrying_a_loan_record_on_any_node(world: World) -> None:
    record = loans_annotation("[]")
    world.create(pod_doc("lender-a", ghost(), annotations=record))
    world.create(pod_doc("lender-b", ghost(), annotations=record, phase="Running"))
    world.create(pod_doc("plain", ghost(), annotations={"resize-preemption.io/other": "x"}))
    world.create(pod_doc("bare", ghost()))

    lenders = world.view().lenders()

    assert ["lender-a", "lender-b"] == names(lenders, world.namespace)
    assert all(LOANS_ANNOTATION in p.annotations for p in lenders)


# -- budgets --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        pytest.param(("a",), ["a/pdb-1", "a/pdb-2"], id="one-namespace"),
        pytest.param(("b",), ["b/pdb-3"], id="the-other"),
        pytest.param(("a", "b"), ["a/pdb-1", "a/pdb-2", "b/pdb-3"], id="both"),
        pytest.param(("b", "a"), ["a/pdb-1", "a/pdb-2", "b/pdb-3"], id="either-order"),
        pytest.param(("c",), [], id="a-namespace-without-budgets"),
        pytest.param(("nowhere",), [], id="no-such-namespace"),
        pytest.param((), [], id="none-asked"),
    ],
)
def test_budgets_are_those_of_the_namespaces_asked_for(
    world: World, asked: tuple[str, ...], expected: list[str]
) -> None:
    suffix = secrets.token_hex(3)
    spaces = {"a": world.namespace, "nowhere": f"nowhere-{suffix}"}
    for key in ("b", "c"):
        spaces[key] = world.create(namespace_doc(f"{key}-{suffix}"))["metadata"]["name"]
    world.create(pdb_doc("pdb-1", {"app": "one"}))
    world.create(pdb_doc("pdb-2", {"app": "two"}))
    world.create(pdb_doc("pdb-3", {"app": "one"}), spaces["b"])
    keys = {f"{spaces[k]}/": f"{k}/" for k in ("a", "b")}

    found = world.view().budgets(frozenset(spaces[k] for k in asked))

    assert expected == sorted(keys[f"{b.namespace}/"] + b.name for b in found)


# -- namespaces -----------------------------------------------------------------------------


def test_a_namespace_reads_as_its_labels_and_the_name_label(world: World) -> None:
    name = world.create(namespace_doc(f"labelled-{secrets.token_hex(3)}", {"team": "blue"}))[
        "metadata"
    ]["name"]
    view = world.view()

    assert {"team": "blue", NAME_LABEL: name} == dict(view.namespace_labels(name) or {})
    assert {NAME_LABEL: world.namespace} == dict(view.namespace_labels(world.namespace) or {})


def test_a_namespace_that_does_not_exist_reads_as_none(world: World) -> None:
    world.create(pod_doc("web", ghost()))

    assert world.view().namespace_labels(f"no-such-{secrets.token_hex(3)}") is None


# -- nodes and priorities -------------------------------------------------------------------


def test_a_node_reads_as_the_stored_node_and_an_unknown_one_as_none(world: World) -> None:
    name = f"contract-{secrets.token_hex(3)}"
    world.create(node_doc(name, cpu="4", memory="8Gi"))
    view = world.view()

    found = view.node(name)

    assert found is not None
    assert (4000, 8 * 1024**3) == (found.allocatable.cpu, found.allocatable.memory)
    assert name in [n.name for n in view.all_nodes()]
    assert view.node(ghost()) is None
    assert ghost() not in [n.name for n in view.all_nodes()]


def test_a_pod_has_its_priority_class_value(world: World) -> None:
    name = f"contract-{secrets.token_hex(3)}"
    world.create(priority_class_doc(name, 12345))
    world.create(pod_doc("web", ghost(), priority_class=name))
    view = world.view()

    found = view.pod(world.namespace, "web")

    assert found is not None
    assert 12345 == found.priority
    eventually(
        lambda: view.priority_resolver().resolve({"priorityClassName": name}, "pod")[0],
        12345,
        "the resolver to know the class",
    )


def test_node_rooms_hold_each_node_s_room_as_pods_are_bound_to_it(world: World) -> None:
    name = f"contract-{secrets.token_hex(3)}"
    world.create(node_doc(name, cpu="4", memory="8Gi"))
    world.create(pod_doc("first", name, cpu="1", phase="Running"))
    view = world.view()
    rooms = view.node_rooms()
    rooms.refresh(view)
    before = rooms.room(name)

    world.create(pod_doc("second", name, cpu="1500m", phase="Running"))
    view = world.view()
    rooms = view.node_rooms()
    rooms.refresh(view)
    after = rooms.room(name)

    assert before is not None and after is not None
    assert (3000, 8 * GI - 128 * MI) == (before.free.cpu, before.free.memory)
    assert (1500, 8 * GI - 256 * MI) == (after.free.cpu, after.free.memory)
    assert name in [r.node for r in rooms.roomiest()]
    assert rooms.room(ghost()) is None


# -- pending resizes ------------------------------------------------------------------------


def pending(reason: str) -> dict[str, str]:
    return {"type": "PodResizePending", "status": "True", "reason": reason}


def test_pending_resizes_are_the_deferred_and_infeasible_ones(world: World) -> None:
    here = ghost()
    world.create(pod_doc("deferred", here, phase="Running", conditions=[pending("Deferred")]))
    world.create(pod_doc("infeasible", here, phase="Running", conditions=[pending("Infeasible")]))
    world.create(pod_doc("settled", here, phase="Running"))

    found = world.view().pending_resizes()  # type: ignore[attr-defined]

    assert ["deferred", "infeasible"] == names(found, world.namespace)


# -- freshness ------------------------------------------------------------------------------


def test_a_view_holding_what_was_written_is_synced_current_and_fresh(world: World) -> None:
    world.create(pod_doc("web", ghost()))
    view = world.view()

    assert view.synced()
    # Synced once each list is applied; each watch opens just after its list, and until then
    # the view counts the moments since the list as ones it may have missed changes in.
    eventually(view.staleness, 0.0, "every watch open")
    assert 0.0 <= view.age() < 130.0


def test_a_view_has_caught_up_with_each_pod_write_it_holds_and_with_none_later(
    world: World,
) -> None:
    stored = world.create(pod_doc("web", ghost()))
    version = stored["metadata"]["resourceVersion"]
    view = world.view()

    assert view.caught_up(version, timeout=30.0)
    found = view.pod(world.namespace, "web")
    assert found is not None and version == found.resource_version
    # A version no write has reached yet, and one that is not a version at all.
    assert not view.caught_up(str(int(version) + 10**9), timeout=0.2)
    assert not view.caught_up("not-a-version", timeout=0.2)
