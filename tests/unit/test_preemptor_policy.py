"""The preemptor policy (who may take room from others) and the namespaces whose pods are
never victims: the judgement, its settings, and both paths that plan - a review and a
deferred resize - holding a pod to the same rule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from harness.doubles import InMemoryLedger, StaticClusterView
from tests.unit.builders import HIGH, LOW, NODE, NOW, make_node, make_pod
from tests.unit.test_reconciler import BASE, high, low, peer
from tests.unit.web_fixtures import walkthrough_objects, walkthrough_review
from webhook.base.metrics import Metrics
from webhook.base.settings import Config, load_config
from webhook.cli import main
from webhook.core.errors import InputError
from webhook.core.model import LabelSelector, Namespace, Requirement
from webhook.core.policy import Preemptors
from webhook.core.snapshot import load_snapshot
from webhook.engine.admission import AdmissionEngine
from webhook.engine.reconciler import Reconciler

TEAM_A = LabelSelector(match_labels=(("team", "a"),))
NAME = "kubernetes.io/metadata.name"

# -- the judgement ---------------------------------------------------------------------------

REFUSALS = [
    # (rule, preemptor priority, namespace labels, refused?, words the reason holds)
    (Preemptors(), 0, None, False, ""),
    (Preemptors(TEAM_A), HIGH, {"team": "a"}, False, ""),
    (Preemptors(TEAM_A), HIGH, {"team": "b"}, True, "namespace not selected"),
    (Preemptors(TEAM_A), HIGH, None, True, "not known yet"),
    (Preemptors(LabelSelector()), HIGH, {}, False, ""),
    (Preemptors(min_priority=HIGH), HIGH, {}, False, ""),
    (
        Preemptors(min_priority=HIGH),
        HIGH - 1,
        {},
        True,
        f"under the preemptor policy's minimum {HIGH}",
    ),
    (Preemptors(min_priority=-5), -5, {}, False, ""),
    (
        Preemptors(
            LabelSelector(match_expressions=(Requirement(NAME, "NotIn", frozenset({"x"})),))
        ),
        HIGH,
        {NAME: "x"},
        True,
        "not selected",
    ),
]


@pytest.mark.parametrize(
    ("rule", "priority", "labels", "refused", "words"),
    REFUSALS,
    ids=[
        "no-rule",
        "selected-namespace",
        "other-namespace",
        "unknown-namespace",
        "empty-selector-selects-all",
        "at-the-minimum",
        "below-the-minimum",
        "negative-minimum",
        "not-in-expression",
    ],
)
def test_refusal(
    rule: Preemptors,
    priority: int,
    labels: Mapping[str, str] | None,
    refused: bool,
    words: str,
) -> None:
    pod = make_pod("p").priority(priority).build()
    reason = rule.refusal(pod, labels)
    assert refused == bool(reason)
    assert words in reason


# -- the settings ------------------------------------------------------------------------------

SELECTOR_FORMS = [
    ('{"matchLabels": {"team": "a"}}', TEAM_A),
    ({"matchLabels": {"team": "a"}}, TEAM_A),
    ("matchLabels: {team: a}", TEAM_A),
    ("none", None),
    (
        '{"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]}',
        LabelSelector(match_expressions=(Requirement("team", "In", frozenset({"a", "b"})),)),
    ),
]


@pytest.mark.parametrize(
    ("raw", "expected"), SELECTOR_FORMS, ids=["json", "yaml-mapping", "yaml-text", "none", "in"]
)
def test_selector_forms(raw: Any, expected: LabelSelector | None) -> None:
    config = load_config(flags={"preemptor-namespace-selector": raw})
    assert expected == config.preemptor_namespace_selector


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"preemptor-namespace-selector": "[1, 2]"}, "must be a label selector"),
        ({"preemptor-namespace-selector": '{"matchLabel": {}}'}, "unknown field 'matchLabel'"),
        (
            {
                "preemptor-namespace-selector": {
                    "matchExpressions": [{"key": "a", "operator": "Is"}]
                }
            },
            "unknown 'Is'",
        ),
        ({"preemptor-namespace-selector": "{"}, "JSON or YAML"),
        ({"min-preemptor-priority": "high"}, "must be an integer"),
        ({"min-preemptor-priority": 1.5}, "must be an integer"),
    ],
    ids=["a-list", "misspelt-field", "unknown-operator", "broken-text", "a-word", "a-fraction"],
)
def test_bad_policy_settings_name_the_setting(flags: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=message):
        load_config(flags=flags)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({}, {"kube-system", "resize-preemption-system"}),
        ({"service-namespace": "tools"}, {"kube-system", "tools"}),
        ({"unprotected-namespaces": "kube-system"}, {"resize-preemption-system"}),
        (
            {"unprotected-namespaces": "kube-system,resize-preemption-system"},
            set(),
        ),
        (
            {
                "protected-namespaces": "kube-system,monitoring",
                "unprotected-namespaces": "kube-system",
            },
            {"kube-system", "monitoring", "resize-preemption-system"},
        ),
    ],
    ids=["default", "own-namespace-follows", "opt-in-one", "opt-in-both", "protected-wins"],
)
def test_protected_namespaces(flags: dict[str, object], expected: set[str]) -> None:
    assert frozenset(expected) == load_config(flags=flags).policy().protected_namespaces


# -- the reconciler ------------------------------------------------------------------------------


def reconcile(
    config: Config, *pods: Any, namespaces: Any = None
) -> list[tuple[str, str, tuple[str, ...]]]:
    built = [p.build() for p in pods]
    node = make_node(NODE).allocatable(cpu="8", memory="16Gi").build()
    view = StaticClusterView([node], built, namespaces=namespaces)
    ledger = InMemoryLedger()
    reconciler = Reconciler(config, view, ledger, metrics=Metrics(), clock=lambda: NOW)
    outcomes = reconciler.reconcile()
    assert sum(1 for o in outcomes if o.admitted) == len(ledger.all_entries())
    return [
        (o.verdict, o.code, tuple(v.pod.name for v in (o.plan.victims if o.plan else ())))
        for o in outcomes
    ]


NOT_ALLOWED = ("not-eligible", "preemptor-not-allowed", ())
PREEMPTS = ("preempt", "preempt", ("low-a",))


@pytest.mark.parametrize(
    ("config", "namespaces", "expected"),
    [
        (Config(), None, [PREEMPTS]),
        (Config(min_preemptor_priority=HIGH), None, [PREEMPTS]),
        (Config(min_preemptor_priority=HIGH + 1), None, [NOT_ALLOWED]),
        (
            Config(preemptor_namespace_selector=TEAM_A),
            [Namespace("default", {"team": "a"})],
            [PREEMPTS],
        ),
        (
            Config(preemptor_namespace_selector=TEAM_A),
            [Namespace("default", {"team": "b"})],
            [NOT_ALLOWED],
        ),
        (Config(preemptor_namespace_selector=TEAM_A), [], [NOT_ALLOWED]),
    ],
    ids=[
        "no-rule",
        "at-the-minimum",
        "below-the-minimum",
        "selected-namespace",
        "other-namespace",
        "namespace-not-known",
    ],
)
def test_reconciler_holds_a_deferred_resize_to_the_rule(
    config: Config, namespaces: Any, expected: list[tuple[str, str, tuple[str, ...]]]
) -> None:
    assert expected == reconcile(config, high(), *BASE, namespaces=namespaces)


def test_a_refused_preemptor_borrows_nobody_either() -> None:
    # lender (3 CPU, floor 1) can lend the 2 CPUs high is short of.
    lender = low("lender", "3").annotate("resize-preemption.io/floor", '{"app": {"cpu": "1"}}')
    scene = (high(), lender, peer("peer", "1"))
    assert [("preempt", "lend", ())] == reconcile(Config(), *scene)
    assert [NOT_ALLOWED] == reconcile(Config(min_preemptor_priority=HIGH + 1), *scene)


@pytest.mark.parametrize(
    ("config", "victims"),
    [
        (Config(), {"low-b", "low-c"}),
        (Config(unprotected_namespaces=frozenset({"kube-system"})), {"low-a"}),
        (Config(protected_namespaces=frozenset({"default"})), set()),
    ],
    ids=["kube-system-protected-by-default", "kube-system-opted-in", "all-protected"],
)
def test_a_kube_system_pod_is_no_victim_by_default(config: Config, victims: set[str]) -> None:
    # low-a (kube-system, started last) is the least important: the one victim when it
    # may be one; protected, the two others must both go.
    system = make_pod("low-a", "kube-system").priority(LOW).requests(cpu="2", memory="256Mi")
    others = (low("low-b", "1", started=100), low("low-c", "1", started=200))
    ((verdict, _, chosen),) = reconcile(config, high(), system.started(300).admitted(), *others)
    assert ("preempt" if victims else "infeasible", victims) == (verdict, set(chosen))


# -- the admission path ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "labels", "verdict", "warning"),
    [
        (Config(), {"team": "b"}, "preempt", "preempting 1 lower-priority pod"),
        (Config(preemptor_namespace_selector=TEAM_A), {"team": "a"}, "preempt", "preempting 1"),
        (
            Config(preemptor_namespace_selector=TEAM_A),
            {"team": "b"},
            "not-eligible",
            "namespace not selected by the preemptor policy; nobody preempted",
        ),
        (
            Config(min_preemptor_priority=1_000_001),
            {"team": "a"},
            "not-eligible",
            "priority 1000000 under the preemptor policy's minimum 1000001",
        ),
    ],
    ids=["no-rule", "selected", "other-namespace", "below-the-minimum"],
)
def test_a_review_outside_the_rule_evicts_nobody_and_says_why(
    config: Config, labels: dict[str, str], verdict: str, warning: str
) -> None:
    snapshot = load_snapshot(walkthrough_objects())
    view = StaticClusterView(
        snapshot.nodes.values(),
        snapshot.pods,
        namespaces=[Namespace("default", labels)],
    )
    ledger = InMemoryLedger()
    decision = AdmissionEngine(config, view, ledger).validate(walkthrough_review()["request"])
    assert (True, verdict) == (decision.allowed, decision.verdict)
    assert any(warning in w for w in decision.warnings), decision.warnings
    victims = [v for e in ledger.all_entries() for v in e.victims]
    assert (verdict == "preempt") == bool(victims)


@pytest.mark.parametrize(
    "args",
    [
        ("status", "--kubeconfig", "/nonexistent", "--min-preemptor-priority", "high"),
        ("status", "--kubeconfig", "/nonexistent", "--preemptor-namespace-selector", "[1]"),
        ("serve", "--tls-cert", "x", "--tls-key", "y", "--preemptor-namespace-selector", "{"),
    ],
    ids=["status-priority", "status-selector", "serve-selector"],
)
def test_a_bad_policy_flag_is_one_line_and_exit_2(
    args: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert 2 == main(list(args))
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: command line: ")
