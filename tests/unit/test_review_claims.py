"""A review's body is a claim: a review is planned from the pod the cache holds, with only
its resize's resources taken from ``object``; anything else ``object`` says differently
makes it ``unverified`` (allowed, naming nobody, writing nothing). A review planned so is
authoritative for its pod's resize: a verdict that takes no room removes an entry that
another writer left for that resize."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from harness.doubles import InMemoryLedger, StaticClusterView
from tests.unit.web_fixtures import node, pod, resized, review, walkthrough_objects
from webhook.base.settings import Config
from webhook.core.model import FIT_TO_NODE_ANNOTATION, LabelSelector, Pod
from webhook.core.objects import parse_pod
from webhook.core.resize import resize_of
from webhook.engine.admission import AdmissionEngine
from webhook.engine.ledger import LedgerEntry

NOW = 1000.0
Obj = dict[str, Any]


def _edited(edit: Callable[[Obj], None]) -> Callable[[Obj], Obj]:
    def apply(obj: Obj) -> Obj:
        out = copy.deepcopy(obj)
        edit(out)
        return out

    return apply


def _set(path: str, value: Any) -> Callable[[Obj], Obj]:
    *parents, leaf = path.split(".")

    def edit(obj: Obj) -> None:
        for key in parents:
            obj = obj.setdefault(key, {})
        obj[leaf] = value

    return _edited(edit)


OWNER = [{"kind": "ReplicaSet", "name": "rs", "uid": "rs-1", "controller": True}]
CLAIMS = [
    pytest.param(_set("metadata.uid", "uid-other"), "uid", id="uid"),
    pytest.param(_set("metadata.namespace", "prod"), "namespace", id="namespace"),
    pytest.param(_set("metadata.name", "other"), "name", id="name"),
    pytest.param(_set("spec.nodeName", "node-2"), "node", id="node"),
    pytest.param(_set("spec.priority", 2_000_000_000), "priority", id="priority"),
    pytest.param(_set("spec.preemptionPolicy", "Never"), "preemption policy", id="never"),
    pytest.param(_set("metadata.ownerReferences", OWNER), "owner", id="owner"),
    pytest.param(
        _set("metadata.annotations", {FIT_TO_NODE_ANNOTATION: "true"}),
        "annotations",
        id="service-annotation",
    ),
    pytest.param(
        _edited(lambda o: o["spec"]["containers"][0].update(name="other")),
        "containers",
        id="container-name",
    ),
    pytest.param(_set("spec.overhead", {"cpu": "1"}), "overhead", id="overhead"),
    pytest.param(_set("metadata.generation", 9), "generation", id="generation"),
]


def _stored() -> Pod:
    high = walkthrough_objects()[2]
    high["metadata"]["generation"] = 3
    return parse_pod(high)


@pytest.mark.parametrize(("claim", "named"), CLAIMS)
def test_a_claim_beyond_the_resources_is_not_this_pods_resize(
    claim: Callable[[Obj], Obj], named: str
) -> None:
    high = walkthrough_objects()[2]
    high["metadata"]["generation"] = 3
    claimed = parse_pod(claim(resized(high, "6")))

    why = resize_of(_stored(), claimed)

    assert isinstance(why, str)
    assert named in why.split(" in ", 1)[1].split(", ")


def test_the_resize_is_the_stored_pod_with_the_claimed_resources() -> None:
    high = walkthrough_objects()[2]
    high["metadata"]["generation"] = 4
    # Annotations the service does not read, and labels, may differ: nothing reads them.
    high["metadata"]["annotations"] = {"example.com/note": "anything"}
    high["metadata"]["labels"] = {"tier": "claimed"}
    claimed = parse_pod(resized(high, "6"))

    resize = resize_of(_stored(), claimed)

    assert isinstance(resize, Pod)
    assert (claimed.containers, 4) == (resize.containers, resize.generation)
    assert (_stored().labels, _stored().annotations) == (resize.labels, resize.annotations)


PROD = LabelSelector(match_labels=(("tier", "prod"),))


def _namespace(name: str, labels: dict[str, str]) -> Obj:
    return {"kind": "Namespace", "metadata": {"name": name, "labels": labels}}


def _engine(objects: list[Obj], ledger: InMemoryLedger, **settings: Any) -> AdmissionEngine:
    namespaces = [_namespace("default", {}), _namespace("prod", {"tier": "prod"})]
    view = StaticClusterView.from_objects([*namespaces, *objects])
    return AdmissionEngine(Config(**settings), view, ledger, clock=lambda: NOW)


def two_nodes() -> list[Obj]:
    """node-1 as the walkthrough has it, and node-2 with a victim of its own."""
    objects = list(walkthrough_objects())
    return [*objects, node("node-2"), pod("victim2", "3", 1000, node_name="node-2")]


@pytest.mark.parametrize(
    ("claim", "settings"),
    [
        pytest.param(_set("spec.nodeName", "node-2"), {}, id="another-node"),
        pytest.param(
            _set("metadata.namespace", "prod"),
            {"preemptor_namespace_selector": PROD},
            id="a-selected-namespace",
        ),
        pytest.param(
            _set("spec.priority", 2_000_000),
            {"min_preemptor_priority": 1_500_000},
            id="a-priority-above-the-minimum",
        ),
    ],
)
def test_a_review_whose_object_claims_more_than_the_store_names_nobody_and_writes_nothing(
    claim: Callable[[Obj], Obj], settings: dict[str, Any]
) -> None:
    # oldObject exactly as stored; the claim in object alone.
    ledger = InMemoryLedger()
    engine = _engine(two_nodes(), ledger, **settings)
    high = walkthrough_objects()[2]

    decision = engine.validate(review(high, claim(resized(high, "6")))["request"])

    assert ("unverified", True, None, 0) == (
        decision.verdict,
        decision.allowed,
        decision.plan,
        ledger.writes,
    )
    assert not any("victim" in w or "low-priority" in w for w in decision.warnings)


def test_a_forged_opt_in_to_fit_to_node_changes_nothing() -> None:
    engine = _engine(list(walkthrough_objects()), InMemoryLedger())
    high = walkthrough_objects()[2]
    claimed = resized(high, "6")
    claimed["metadata"]["annotations"] = {FIT_TO_NODE_ANNOTATION: "true"}

    decision = engine.mutate(review(high, claimed)["request"])

    assert (None, "unverified") == (decision.patch, decision.verdict)


def _left_by_another_writer(high: Obj, cpu: str) -> LedgerEntry:
    """An entry for ``high``'s resize to ``cpu`` preempting low-priority-pod, as a replica
    with other settings (or anyone with Lease rights) would leave it."""
    engine = _engine(list(walkthrough_objects()), InMemoryLedger())
    decision = engine.validate(review(high, resized(high, cpu), uid="other")["request"])
    assert decision.admitted is not None
    return decision.admitted


@pytest.mark.parametrize(
    ("settings", "verdict"),
    [
        pytest.param({"preemptor_namespace_selector": PROD}, "not-eligible", id="refused"),
        pytest.param({"min_preemptor_priority": 2_000_000}, "not-eligible", id="below-minimum"),
    ],
)
def test_a_review_that_may_take_no_room_removes_what_another_writer_left_for_its_resize(
    settings: dict[str, Any], verdict: str
) -> None:
    high = walkthrough_objects()[2]
    left = _left_by_another_writer(high, "6")
    ledger = InMemoryLedger([left])
    engine = _engine(list(walkthrough_objects()), ledger, **settings)

    decision = engine.validate(review(high, resized(high, "6"))["request"])

    assert (verdict, ()) == (decision.verdict, tuple(ledger.entries("node-1")))


def test_an_entry_for_another_resize_of_the_pod_is_left_to_its_own_rules() -> None:
    high = walkthrough_objects()[2]
    left = _left_by_another_writer(high, "7")
    ledger = InMemoryLedger([left])
    engine = _engine(list(walkthrough_objects()), ledger, min_preemptor_priority=2_000_000)

    engine.validate(review(high, resized(high, "6"))["request"])

    assert (left,) == tuple(ledger.entries("node-1"))
