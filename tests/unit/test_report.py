"""Plans as people and programs read them: the JSON contract, the short report, and
kubectl warnings."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import orjson
import pytest

from tests.unit.test_plan import (
    Scene,
    beyond_allocatable,
    fits_without_preemption,
    infeasible_even_with_every_victim,
    never_on_the_pod,
    node_opted_out_by_field,
    shrink_is_no_growth,
    terminating_pod_fits_once_terminated,
    two_victims_needed,
    walk,
)
from webhook.core.lending import Loan
from webhook.core.model import PodRef
from webhook.core.plan import Plan, ResourceFigures, Victim, already_admitted
from webhook.core.report import WARNING_LIMIT, clip, human_report, plan_to_dict, warnings_for
from webhook.core.resources import Resources


def test_json_contract_for_the_walkthrough() -> None:
    expected = {
        "pod": "default/high-priority-pod",
        "node": "node-1",
        "verdict": "preempt",
        "code": "preempt",
        "victims": ["default/low-priority-pod"],
        "reason": "preempting 1 lower-priority pod on node-1 to free cpu 1",
        "resources": {
            "cpu": {
                "requested": "6",
                "inUse": "3",
                "freeing": "0",
                "allocatable": "8",
                "shortfall": "1",
                "unmet": "0",
            },
            "memory": {
                "requested": "1Gi",
                "inUse": "500Mi",
                "freeing": "0",
                "allocatable": "16Gi",
                "shortfall": "0",
                "unmet": "0",
            },
        },
        "waitingFor": [],
        "loans": [],
        "floorErrors": [],
    }

    assert expected == plan_to_dict(walk().plan())


@pytest.mark.parametrize(
    "scene",
    [
        walk,
        fits_without_preemption,
        infeasible_even_with_every_victim,
        never_on_the_pod,
        shrink_is_no_growth,
        terminating_pod_fits_once_terminated,
    ],
    ids=lambda f: f.__name__.replace("_", "-"),
)
def test_json_is_serialisable_and_complete(scene: Callable[[], Scene]) -> None:
    data = orjson.loads(orjson.dumps(plan_to_dict(scene().plan())))

    assert {"pod", "node", "verdict", "victims", "reason", "resources"} <= set(data)
    assert {"cpu", "memory"} == set(data["resources"])
    assert data["verdict"] in ("fits", "preempt", "infeasible", "not-eligible")


def test_json_reports_what_stays_missing() -> None:
    data = plan_to_dict(infeasible_even_with_every_victim().plan())

    assert ("infeasible", [], "2") == (
        data["verdict"],
        data["victims"],
        data["resources"]["cpu"]["unmet"],
    )


def test_json_lists_pods_already_leaving() -> None:
    data = plan_to_dict(terminating_pod_fits_once_terminated().plan())

    assert ["default/low-priority-pod"] == data["waitingFor"]
    assert "3" == data["resources"]["cpu"]["freeing"]


def test_human_report_for_the_walkthrough() -> None:
    expected = "\n".join(
        [
            "preempt: preempting 1 lower-priority pod on node-1 to free cpu 1",
            "pod default/high-priority-pod on node-1",
            "",
            "resource  requested  in use  freeing  allocatable  shortfall",
            "cpu       6          3       0        8            1",
            "memory    1Gi        500Mi   0        16Gi         0",
            "",
            "victims, in eviction order:",
            "  default/low-priority-pod  priority 1000  frees cpu 3, memory 500Mi",
        ]
    )

    assert expected == human_report(walk().plan())


def test_human_report_lists_victims_in_eviction_order() -> None:
    lines = human_report(two_victims_needed().plan()).splitlines()

    assert [
        "  default/c  priority 1000  frees cpu 1, memory 0",
        "  default/b  priority 1000  frees cpu 2, memory 0",
    ] == lines[-2:]


def test_human_report_without_victims() -> None:
    report = human_report(fits_without_preemption().plan())

    assert report.startswith("fits: fits on node-1 without preemption\n")
    assert "victims" not in report


def test_human_report_names_pods_already_leaving() -> None:
    report = human_report(terminating_pod_fits_once_terminated().plan())

    assert "already leaving: default/low-priority-pod" == report.splitlines()[-1]


def test_human_report_for_an_unbound_pod() -> None:
    plan = Plan(PodRef("ns", "p"), "", "not-eligible", "not-bound", "pod is not bound to a node")

    assert "pod ns/p on -" == human_report(plan).splitlines()[1]


@pytest.mark.parametrize(
    ("scene", "enforcing", "expected"),
    [
        pytest.param(
            walk,
            True,
            ["preempting 1 lower-priority pod on node-1 for cpu 6: default/low-priority-pod"],
            id="preempt",
        ),
        pytest.param(
            walk,
            False,
            ["would preempt 1 lower-priority pod on node-1 for cpu 6: default/low-priority-pod"],
            id="preempt-not-enforcing",
        ),
        pytest.param(
            two_victims_needed,
            True,
            ["preempting 2 lower-priority pods on node-1 for cpu 6: default/c, default/b"],
            id="plural",
        ),
        pytest.param(fits_without_preemption, True, [], id="fits-says-nothing"),
        pytest.param(shrink_is_no_growth, True, [], id="no-growth-says-nothing"),
        pytest.param(
            beyond_allocatable,
            True,
            ["requests exceed node-1 allocatable: cpu 9 > 8"],
            id="infeasible",
        ),
        pytest.param(
            never_on_the_pod,
            True,
            ["resize will wait on node-1: preemptionPolicy is Never; cpu short by 1 on node-1"],
            id="never",
        ),
        pytest.param(
            node_opted_out_by_field,
            True,
            ["resize will wait on node-1: node-1 opted out of resize preemption"],
            id="opted-out",
        ),
        pytest.param(
            terminating_pod_fits_once_terminated,
            True,
            ["fits on node-1 once 1 pod already leaving has gone"],
            id="fits-once-terminated",
        ),
    ],
)
def test_warnings(scene: Callable[[], Scene], enforcing: bool, expected: list[str]) -> None:
    assert expected == warnings_for(scene().plan(), enforcing=enforcing)


@pytest.mark.parametrize(
    ("victims", "lenders", "expected"),
    [
        pytest.param((), (), "waiting for the kubelet", id="room-free-already"),
        pytest.param(
            (PodRef("default", "b"), PodRef("default", "c")),
            (),
            "waiting for 2 to leave: default/b, default/c",
            id="victims",
        ),
        pytest.param(
            (PodRef("default", "c"),),
            ("default/a",),
            "waiting for 1 to leave: default/c; borrowing from default/a",
            id="victims-and-loans",
        ),
    ],
)
def test_a_resize_asked_again_says_how_its_room_is_made_and_warns_nothing(
    victims: tuple[PodRef, ...], lenders: tuple[str, ...], expected: str
) -> None:
    plan = already_admitted(walk().new, "node-1", Resources(6000, 0), victims, lenders)

    assert ("fits", "admitted", (), ()) == (plan.verdict, plan.code, plan.victims, plan.loans)
    assert f"resize already admitted on node-1, its room held: {expected}" == plan.reason
    assert [] == warnings_for(plan)


def test_long_warnings_are_clipped_to_one_short_line() -> None:
    plan = walk().plan()
    many = tuple(
        Victim(PodRef("a-long-namespace-name", f"pod-with-a-long-name-{i}"), 0, Resources())
        for i in range(20)
    )
    (warning,) = warnings_for(replace(plan, victims=many))

    assert WARNING_LIMIT == len(warning)
    assert warning.endswith("...")
    assert "\n" not in warning


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        pytest.param("short", 7, "short", id="short"),
        pytest.param("two\nlines  and\tblanks", 120, "two lines and blanks", id="one-line"),
        pytest.param("x" * 10, 7, "xxxx...", id="clipped"),
        pytest.param("x" * 7, 7, "xxxxxxx", id="exactly-the-limit"),
    ],
)
def test_clip(text: str, limit: int, expected: str) -> None:
    assert expected == clip(text, limit=limit)


# -- loans -------------------------------------------------------------------------------


def _loans_plan(victims: tuple[Victim, ...] = (), *, count: int = 1) -> Plan:
    """A plan borrowing cpu 2 from ``count`` pods (3 -> 1 each, the last Guaranteed)."""
    loans = tuple(
        Loan(PodRef("default", f"batch-{i}"), 1000, "worker", "cpu", 3000, 1000, 2000, i == count)
        for i in range(1, count + 1)
    )
    return Plan(
        PodRef("default", "web"),
        "node-1",
        "preempt",
        "preempt" if victims else "lend",
        "borrowing",
        Resources(6000),
        victims,
        {"cpu": ResourceFigures(6000, 4000, 0, 8000, 2 * count)},
        loans=loans,
    )


def test_json_lists_loans() -> None:
    assert [
        {"pod": "default/batch-1", "container": "worker", "resource": "cpu", "from": "3",
         "to": "1"}
    ] == plan_to_dict(_loans_plan())["loans"]  # fmt: skip


@pytest.mark.parametrize(
    ("plan", "enforcing", "expected"),
    [
        pytest.param(
            _loans_plan(),
            True,
            ["borrowing cpu 2 from 1 lower-priority pod on node-1: default/batch-1 (cpu 3->1)"],
            id="loans-only",
        ),
        pytest.param(
            _loans_plan(),
            False,
            ["would borrow cpu 2 from 1 lower-priority pod on node-1: default/batch-1 (cpu 3->1)"],
            id="loans-not-enforcing",
        ),
        pytest.param(
            _loans_plan((Victim(PodRef("default", "old"), 0, Resources(1000)),)),
            True,
            [
                "preempting 1 lower-priority pod on node-1 for cpu 6: default/old",
                "borrowing cpu 2 from 1 lower-priority pod on node-1: default/batch-1 (cpu 3->1)",
            ],
            id="eviction-and-loan",
        ),
    ],
)
def test_loan_warnings(plan: Plan, enforcing: bool, expected: list[str]) -> None:
    assert expected == warnings_for(plan, enforcing=enforcing)


def test_loan_warning_stays_one_short_line() -> None:
    (warning,) = warnings_for(_loans_plan(count=12))

    assert WARNING_LIMIT == len(warning)
    assert warning.startswith("borrowing cpu 24 from 12 lower-priority pods on node-1: ")
    assert warning.endswith("...")


def test_human_report_lists_loans() -> None:
    lines = human_report(_loans_plan(count=2)).splitlines()

    assert [
        "loans, in the order taken:",
        "  default/batch-1  priority 1000  container worker  cpu 3->1  frees cpu 2",
        "  default/batch-2  priority 1000  container worker  cpu 3->1, limit too  frees cpu 2",
    ] == lines[-3:]


def test_malformed_floors_are_listed() -> None:
    plan = Plan(
        PodRef("default", "web"),
        "node-1",
        "preempt",
        "preempt",
        "preempting",
        floor_errors=((PodRef("default", "batch-1"), "annotation ... is not valid JSON"),),
    )

    assert [{"pod": "default/batch-1", "error": "annotation ... is not valid JSON"}] == (
        plan_to_dict(plan)["floorErrors"]
    )
    assert [
        "floor annotations not used (these pods lend nothing):",
        "  default/batch-1: annotation ... is not valid JSON",
    ] == human_report(plan).splitlines()[-2:]
