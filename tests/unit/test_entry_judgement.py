"""Whoever wrote a ledger entry, the worker acts on it only as the cache and the service's
own settings allow: the pod runs on the entry's node, the preemptor policy lets it take
room, its victims and lenders are not kept out by the victim policy, and each loan still
to make is one its lender's floors allow. An entry that breaks any of them is removed,
counted and logged before anyone is evicted or shrunk; a loan its lender holds no record
of is never given back or put back."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import orjson
import pytest

from harness.doubles import FakeEvictor, FakeResizer, InMemoryLedger
from tests.unit.test_worker import Clock, Cluster, add, make_worker
from tests.unit.test_worker_logic import (
    CONFIG,
    HIGH_RESIZED,
    LENDER,
    LOAN,
    LOW,
    MID,
    NODE,
    NOW,
    entry,
    pod,
)
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.lending import Loan
from webhook.core.model import LabelSelector, Pod
from webhook.engine.ledger import LedgerEntry
from webhook.engine.lifecycle.next_step import Release, next_action
from webhook.engine.lifecycle.states import to_put_back

PROD = LabelSelector(match_labels=(("tier", "prod"),))


@dataclass(frozen=True)
class Case:
    entry: LedgerEntry
    pods: tuple[Pod, ...]
    #: The rule broken; None: the entry is acted on.
    rule: str | None
    config: Config = CONFIG
    labels: dict[str, str] | None = None


LOANING = replace(entry(), loans=(LOAN,))
ON_NODE_2 = replace(HIGH_RESIZED, node="node-2")

CASES = [
    pytest.param(Case(entry("low"), (HIGH_RESIZED, LOW, MID), None), id="as-admitted"),
    pytest.param(
        Case(entry("low"), (ON_NODE_2, LOW, MID), "node"),
        id="the-pod-runs-on-another-node",
    ),
    pytest.param(
        Case(
            entry("low"),
            (HIGH_RESIZED, LOW, MID),
            "preemptor-policy",
            replace(CONFIG, preemptor_namespace_selector=PROD),
            {"tier": "dev"},
        ),
        id="a-namespace-the-preemptor-policy-does-not-select",
    ),
    pytest.param(
        Case(
            entry("low"),
            (HIGH_RESIZED, LOW, MID),
            "preemptor-policy",
            replace(CONFIG, min_preemptor_priority=5000),
        ),
        id="a-priority-under-the-minimum",
    ),
    pytest.param(
        Case(
            entry(),
            (HIGH_RESIZED, pod("low", cpu="1"), MID),
            None,
            replace(CONFIG, min_preemptor_priority=5000),
        ),
        id="a-reservation-taking-from-nobody-needs-no-preemptor-policy",
    ),
    pytest.param(
        Case(
            entry("low"),
            (HIGH_RESIZED, LOW, MID),
            "victim-policy",
            replace(CONFIG, protected_namespaces=frozenset({"default"})),
        ),
        id="a-victim-in-a-protected-namespace",
    ),
    pytest.param(Case(LOANING, (HIGH_RESIZED, LENDER, MID), None), id="a-loan-within-its-floor"),
    pytest.param(
        Case(LOANING, (HIGH_RESIZED, LENDER, MID), "lending", replace(CONFIG, lending=False)),
        id="lending-off",
    ),
    pytest.param(
        Case(LOANING, (HIGH_RESIZED, pod("lender", cpu="3"), MID), "lending"),
        id="a-lender-without-a-floor",
    ),
    pytest.param(
        Case(LOANING, (HIGH_RESIZED, pod("lender", cpu="3", floor="2"), MID), "lending"),
        id="a-loan-below-the-floor",
    ),
    pytest.param(
        Case(
            LOANING,
            (HIGH_RESIZED, pod("lender", cpu="3", floor="1", priority=1000), MID),
            "lending",
        ),
        id="a-lender-of-equal-priority",
    ),
    pytest.param(
        Case(
            replace(LOANING, loans=(replace(LOAN, limits=True),)),
            (HIGH_RESIZED, LENDER, MID),
            "lending",
        ),
        id="a-loan-lowering-a-burstable-pods-limit",
    ),
]


@pytest.mark.parametrize("case", CASES)
def test_an_entry_is_acted_on_only_as_the_cache_and_the_settings_allow(case: Case) -> None:
    pods = case.pods
    action = next_action(
        case.entry, pods[0], NODE, pods, now=NOW, config=case.config, labels=case.labels
    )

    rule = action.rule if isinstance(action, Release) else None
    assert case.rule == rule
    if case.rule is not None:
        assert isinstance(action, Release) and ("disallowed", True) == (
            action.reason,
            action.write,
        )


def test_a_refused_loan_its_lender_holds_no_record_of_is_never_put_back() -> None:
    # A loan to "lend" back to 3 CPU: no entry of the service's made it.
    raised = Loan(LOAN.pod, 0, "app", "cpu", 8000, 1000, 7000)
    forged = replace(entry(), loans=(), refused=(raised,))

    assert () == to_put_back(forged, (HIGH_RESIZED, pod("lender", cpu="1"), MID))


def test_the_worker_removes_counts_and_logs_an_entry_for_a_pod_on_another_node(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ledger, evictor, metrics = InMemoryLedger(), FakeEvictor(), Metrics()
    add(ledger, entry("low"))
    worker = make_worker(Cluster(ON_NODE_2, LOW, MID), ledger, evictor, Clock(), metrics=metrics)

    with caplog.at_level(logging.INFO, logger="webhook.decisions"):
        worker.run_once()

    assert ([], ()) == (evictor.calls, tuple(ledger.all_entries()))
    counted = metrics.registry.get_sample_value(
        "resize_preemption_entries_disallowed_total", {"rule": "node"}
    )
    assert 1.0 == counted
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == "webhook.decisions"]
    assert [("worker", "disallowed", "node", ["default/low"])] == [
        (x["endpoint"], x["verdict"], x["reason"], x["victims"]) for x in lines
    ]


def test_the_worker_makes_no_loan_its_lender_does_not_allow() -> None:
    ledger, resizer = InMemoryLedger(), FakeResizer()
    add(ledger, LOANING)
    cluster = Cluster(HIGH_RESIZED, pod("lender", cpu="3"), MID)
    worker = make_worker(cluster, ledger, FakeEvictor(), Clock(), resizer=resizer)

    worker.run_once()

    assert ([], ()) == (resizer.calls, tuple(ledger.all_entries()))
