"""Raw Kubernetes objects -> the slim views the decision reads."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.unit.builders import (
    HIGH,
    LOW,
    MID,
    NODE,
    NOW,
    T0,
    Gi,
    Mi,
    make_node,
    make_pdb,
    make_pod,
    make_priority_class,
    rfc3339,
)
from webhook.core.errors import InputError, ObjectError, QuantityError
from webhook.core.model import (
    NODE_OPT_OUT_ANNOTATION,
    Container,
    LabelSelector,
    Requirement,
)
from webhook.core.objects import (
    PriorityResolver,
    parse_node,
    parse_pdb,
    parse_pod,
    parse_priority_class,
    parse_selector,
    parse_time,
)
from webhook.core.resources import Resources

# -- priority resolution ---------------------------------------------------------------

CLASSES = PriorityResolver(
    [
        make_priority_class("critical", HIGH).build(),
        make_priority_class("batch", LOW).never_preempts().build(),
        make_priority_class("standard", MID).global_default().build(),
    ]
)
NO_DEFAULT = PriorityResolver([make_priority_class("critical", HIGH).build()])
NEVER_DEFAULT = PriorityResolver(
    [make_priority_class("polite", MID).global_default().never_preempts().build()]
)


@pytest.mark.parametrize(
    ("pod", "resolver", "priority", "policy"),
    [
        pytest.param(
            make_pod("a").priority(42).priority_class("critical"),
            CLASSES,
            42,
            "PreemptLowerPriority",
            id="spec-priority-wins-over-class",
        ),
        pytest.param(
            make_pod("a").priority(None).priority_class("critical"),
            CLASSES,
            HIGH,
            "PreemptLowerPriority",
            id="priority-from-priorityClassName",
        ),
        pytest.param(
            make_pod("a").priority(None).priority_class("batch"),
            CLASSES,
            LOW,
            "Never",
            id="preemptionPolicy-Never-from-the-class",
        ),
        pytest.param(
            make_pod("a").priority(None),
            CLASSES,
            MID,
            "PreemptLowerPriority",
            id="globalDefault-class-without-a-class-name",
        ),
        pytest.param(
            make_pod("a").priority(None),
            NO_DEFAULT,
            0,
            "PreemptLowerPriority",
            id="zero-without-class-or-default",
        ),
        pytest.param(
            make_pod("a").priority(None),
            NEVER_DEFAULT,
            MID,
            "Never",
            id="preemptionPolicy-from-globalDefault",
        ),
        pytest.param(
            make_pod("a")
            .priority(None)
            .priority_class("batch")
            .preemption_policy("PreemptLowerPriority"),
            CLASSES,
            LOW,
            "PreemptLowerPriority",
            id="pod-preemptionPolicy-wins-over-class",
        ),
        pytest.param(
            make_pod("a").priority(LOW).never_preempts(),
            NO_DEFAULT,
            LOW,
            "Never",
            id="preemptionPolicy-Never-on-the-pod",
        ),
        pytest.param(
            make_pod("a").priority(7).priority_class("gone"),
            NO_DEFAULT,
            7,
            "PreemptLowerPriority",
            id="unknown-class-with-resolved-priority",
        ),
    ],
)
def test_priority_resolution(
    pod: Any, resolver: PriorityResolver, priority: int, policy: str
) -> None:
    parsed = pod.build(resolver)

    assert (priority, policy) == (parsed.priority, parsed.preemption_policy)


def test_the_highest_global_default_wins() -> None:
    resolver = PriorityResolver(
        [
            make_priority_class("a", LOW).global_default().build(),
            make_priority_class("b", MID).global_default().build(),
        ]
    )
    assert MID == make_pod("x").priority(None).build(resolver).priority


def test_unknown_priority_class_without_priority_is_an_error() -> None:
    with pytest.raises(ObjectError, match="no PriorityClass 'gone'"):
        make_pod("a").priority(None).priority_class("gone").build()


def test_unknown_preemption_policy_is_an_error() -> None:
    with pytest.raises(ObjectError, match="preemptionPolicy: unknown value 'Sometimes'"):
        make_pod("a").preemption_policy("Sometimes").build()


def test_priority_class_object() -> None:
    cls = parse_priority_class(
        {
            "kind": "PriorityClass",
            "metadata": {"name": "batch"},
            "value": LOW,
            "globalDefault": True,
            "preemptionPolicy": "Never",
        }
    )
    assert ("batch", LOW, True, "Never") == (
        cls.name,
        cls.value,
        cls.global_default,
        cls.preemption_policy,
    )


# -- pods -------------------------------------------------------------------------------


def test_pod_fields() -> None:
    pod = (
        make_pod("web", "shop")
        .priority(MID)
        .requests(cpu="500m", memory="256Mi")
        .limits(cpu="1", memory="512Mi")
        .labels(app="web")
        .on(NODE)
        .started(100)
        .build()
    )

    assert "shop/web" == pod.key
    assert "uid-shop-web" == pod.uid
    assert NODE == pod.node
    assert MID == pod.priority
    assert T0 + 100 == pod.start_time
    assert {"app": "web"} == dict(pod.labels)
    assert "Running" == pod.phase
    assert (Container("app", Resources(500, 256 * Mi), Resources(1000, 512 * Mi)),) == (
        pod.containers
    )
    assert not (pod.terminating or pod.mirror or pod.terminal)


def test_requests_default_to_limits() -> None:
    pod = make_pod("a").limits(cpu="2", memory="1Gi").build()

    assert Resources(2000, Gi) == pod.containers[0].requests


def test_explicit_request_is_kept_below_its_limit() -> None:
    pod = make_pod("a").requests(cpu="1").limits(cpu="2", memory="1Gi").build()

    assert Resources(1000, Gi) == pod.containers[0].requests


@pytest.mark.parametrize(
    ("pod", "attribute", "expected"),
    [
        pytest.param(make_pod("a").terminating(), "terminating", True, id="deletionTimestamp"),
        pytest.param(make_pod("a").mirror(), "mirror", True, id="mirror-annotation"),
        pytest.param(make_pod("a").phase("Succeeded"), "terminal", True, id="succeeded"),
        pytest.param(make_pod("a").phase("Failed"), "terminal", True, id="failed"),
        pytest.param(make_pod("a").phase("Pending"), "terminal", False, id="pending"),
        pytest.param(make_pod("a").not_started(), "start_time", None, id="no-startTime"),
        pytest.param(make_pod("a").unbound(), "node", "", id="not-bound"),
        pytest.param(make_pod("a").uid(None), "uid", "default/a", id="missing-uid"),
        pytest.param(make_pod("a").resize_pending("Deferred"), "resize", "deferred", id="deferred"),
        pytest.param(
            make_pod("a").resize_pending("Infeasible"), "resize", "infeasible", id="infeasible"
        ),
        pytest.param(
            make_pod("a").resize_pending("Deferred", since=500),
            "resize_pending_since",
            T0 + 500,
            id="pending-since",
        ),
        pytest.param(
            make_pod("a").resize_preemption_disabled(),
            "resize_preemption_disabled",
            True,
            id="PodResizePreemptionDisabled-condition",
        ),
        pytest.param(make_pod("a"), "resize", "none", id="no-resize-pending"),
    ],
)
def test_pod_state(pod: Any, attribute: str, expected: object) -> None:
    assert expected == getattr(pod.build(), attribute)


def test_legacy_status_resize_field() -> None:
    obj = make_pod("a").obj()
    obj["status"]["resize"] = "Infeasible"

    assert "infeasible" == parse_pod(obj).resize


def test_sidecars_and_init_containers() -> None:
    pod = (
        make_pod("a")
        .requests(cpu="1")
        .init_container("setup", cpu="2")
        .sidecar("proxy", cpu="100m")
        .build()
    )

    assert ("setup", False) == (pod.init_containers[0].name, pod.init_containers[0].sidecar)
    assert ("proxy", True) == (pod.init_containers[1].name, pod.init_containers[1].sidecar)
    assert ("setup", "proxy", "app") == tuple(c.name for c in pod.all_containers())


def test_container_statuses() -> None:
    pod = (
        make_pod("a")
        .requests(cpu="2")
        .status("app", allocated={"cpu": "1"}, actual={"cpu": "1500m"})
        .sidecar("proxy", cpu="100m")
        .status("proxy", allocated={"cpu": "100m"}, init=True)
        .build()
    )

    assert Resources(1000, 0) == pod.statuses["app"].allocated
    assert Resources(1500, 0) == pod.statuses["app"].actual
    assert Resources(100, 0) == pod.statuses["proxy"].allocated
    assert pod.statuses["proxy"].actual is None


def test_pod_level_resources_and_overhead() -> None:
    pod = (
        make_pod("a")
        .requests(cpu="1")
        .pod_resources(cpu="3", memory="1Gi")
        .overhead(cpu="250m", memory="120Mi")
        .pod_status_resources(allocated=Resources(2000, Gi), actual=Resources(2000, Gi))
        .build()
    )

    assert Resources(3000, Gi) == pod.pod_requests
    assert Resources(250, 120 * Mi) == pod.overhead
    assert Resources(2000, Gi) == pod.pod_allocated
    assert Resources(2000, Gi) == pod.pod_actual


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        pytest.param(
            lambda o: o["spec"]["containers"][0]["resources"]["requests"].update(cpu="lots"),
            "pod default/a.spec.containers[0].resources.requests.cpu: 'lots'",
            id="bad-container-quantity",
        ),
        pytest.param(
            lambda o: o["spec"].update(resources={"requests": {"memory": "1Q"}}),
            "pod default/a.spec.resources.requests.memory: '1Q'",
            id="bad-pod-level-quantity",
        ),
        pytest.param(
            lambda o: o["spec"].update(resources={"limits": {"cpu": "-1"}}),
            "pod default/a.spec.resources.limits.cpu: '-1' is negative",
            id="bad-pod-level-limit",
        ),
        pytest.param(
            lambda o: o["spec"].update(overhead={"cpu": "x"}),
            "pod default/a.spec.overhead.cpu",
            id="bad-overhead",
        ),
        pytest.param(
            lambda o: o["status"].update(startTime="yesterday"),
            "pod default/a.status.startTime: 'yesterday' is not an RFC 3339 time",
            id="bad-start-time",
        ),
        pytest.param(
            lambda o: o["spec"].update(containers="app"),
            "pod default/a.spec.containers must be a list",
            id="containers-not-a-list",
        ),
        pytest.param(
            lambda o: o["spec"].update(priority="high"),
            "pod default/a.spec.priority must be an integer",
            id="priority-not-an-integer",
        ),
        pytest.param(
            lambda o: o["spec"]["containers"][0].pop("name"),
            "pod default/a.spec.containers[0].name is missing",
            id="container-without-name",
        ),
        pytest.param(
            lambda o: o["metadata"].update(labels={"app": 3}),
            "pod default/a.metadata.labels.app must be a string",
            id="label-not-a-string",
        ),
        pytest.param(
            lambda o: o["metadata"].pop("name"),
            "metadata.name is missing",
            id="no-name",
        ),
        pytest.param(
            lambda o: o["status"].update(
                containerStatuses=[{"name": "app", "allocatedResources": {"cpu": "?"}}]
            ),
            "pod default/a.status.containerStatuses[0].allocatedResources.cpu",
            id="bad-allocated-resources",
        ),
        pytest.param(
            lambda o: o["spec"].update(
                initContainers=[{"name": "init", "resources": {"limits": {"memory": "x"}}}]
            ),
            "pod default/a.spec.initContainers[0].resources.limits.memory: 'x'",
            id="bad-init-container-quantity",
        ),
        pytest.param(
            lambda o: o["spec"].update(resources="big"),
            "pod default/a.spec.resources must be an object",
            id="pod-level-resources-not-a-map",
        ),
        pytest.param(
            lambda o: o["status"].update(
                conditions=[
                    {
                        "type": "PodResizePending",
                        "status": "True",
                        "reason": "Deferred",
                        "lastTransitionTime": "soon",
                    }
                ]
            ),
            "pod default/a.status.conditions[0]: 'soon' is not an RFC 3339 time",
            id="bad-condition-time",
        ),
        pytest.param(
            lambda o: o.update(kind="Pod", metadata="a"),
            "Pod.metadata must be an object, not str",
            id="metadata-not-a-map",
        ),
        pytest.param(
            lambda o: o["metadata"].update(namespace=7),
            "Pod 7/a.metadata.namespace must be a string, not int",
            id="namespace-not-a-string",
        ),
    ],
)
def test_malformed_pods_name_the_field(mutate: Any, fragment: str) -> None:
    obj = make_pod("a").requests(cpu="1").obj()
    mutate(obj)

    with pytest.raises(InputError) as raised:
        parse_pod(obj)

    assert fragment in str(raised.value)


def test_quantity_errors_keep_their_type() -> None:
    with pytest.raises(QuantityError):
        make_pod("a").requests(cpu="1.2.3").build()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("2023-11-14T22:13:20Z", T0, id="utc-z"),
        pytest.param("2023-11-14T23:13:20+01:00", T0, id="offset"),
        pytest.param("2023-11-14T22:13:20.5Z", T0 + 0.5, id="fraction"),
        pytest.param(rfc3339(NOW), NOW, id="builder-times"),
        pytest.param("2023-11-14T22:13:20", T0, id="no-offset-is-utc"),
        pytest.param(None, None, id="absent"),
    ],
)
def test_parse_time(text: str | None, expected: float | None) -> None:
    assert expected == parse_time(text, "t")


def test_time_without_offset_does_not_depend_on_the_local_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert T0 == parse_time("2023-11-14T22:13:20", "t")
    finally:
        monkeypatch.undo()
        time.tzset()


# -- nodes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "disabled"),
    [
        pytest.param(make_node(), False, id="default"),
        pytest.param(make_node().opted_out(), True, id="disableResizePreemption-field"),
        pytest.param(make_node().opted_out(""), False, id="empty-field-is-not-opt-out"),
        pytest.param(make_node().annotate(NODE_OPT_OUT_ANNOTATION, "true"), True, id="annotation"),
        pytest.param(
            make_node().annotate(NODE_OPT_OUT_ANNOTATION, ""), False, id="empty-annotation"
        ),
    ],
)
def test_node_opt_out(node: Any, disabled: bool) -> None:
    assert disabled == node.build().resize_preemption_disabled


def test_node_allocatable() -> None:
    node = make_node("n").allocatable(cpu="7910m", memory="30Gi").build()

    assert ("n", Resources(7910, 30 * Gi)) == (node.name, node.allocatable)
    assert {"kubernetes.io/os": "linux"} == dict(node.labels)


def test_node_without_allocatable_uses_capacity() -> None:
    obj = make_node("n").obj()
    del obj["status"]["allocatable"]
    obj["status"]["capacity"] = {"cpu": "4", "memory": "8Gi"}

    assert Resources(4000, 8 * Gi) == parse_node(obj).allocatable


def test_bad_node_quantity_names_the_node() -> None:
    with pytest.raises(QuantityError, match=r"node n.status.allocatable.cpu: 'eight'"):
        make_node("n").allocatable(cpu="eight").build()


# -- budgets and selectors ------------------------------------------------------------


def test_pdb_fields() -> None:
    pdb = make_pdb("web", "shop").selecting(app="web").allowing(2).disrupted("web-1").build()

    assert "shop/web" == pdb.key
    assert 2 == pdb.disruptions_allowed
    assert frozenset({"web-1"}) == pdb.disrupted_pods
    assert LabelSelector((("app", "web"),)) == pdb.selector


def test_null_and_empty_selectors_differ() -> None:
    assert make_pdb("a").null_selector().build().selector is None
    empty = make_pdb("a").empty_selector().build().selector
    assert empty is not None
    assert empty.empty


def test_pdb_without_status_allows_nothing() -> None:
    obj = make_pdb("a").obj()
    del obj["status"]

    assert 0 == parse_pdb(obj).disruptions_allowed


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        pytest.param(
            {"matchLabels": {"app": "a"}}, {"app": "a", "x": "y"}, True, id="labels-match"
        ),
        pytest.param({"matchLabels": {"app": "a"}}, {"app": "b"}, False, id="label-differs"),
        pytest.param({"matchLabels": {"app": "a"}}, {}, False, id="label-missing"),
        pytest.param(
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["x", "y"]}]},
            {"tier": "y"},
            True,
            id="in",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["x"]}]},
            {},
            True,
            id="not-in-matches-a-missing-key",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["x"]}]},
            {"tier": "x"},
            False,
            id="not-in",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
            {"tier": ""},
            True,
            id="exists",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
            {"tier": "x"},
            False,
            id="does-not-exist",
        ),
        pytest.param(
            {
                "matchLabels": {"app": "a"},
                "matchExpressions": [{"key": "tier", "operator": "Exists"}],
            },
            {"app": "a"},
            False,
            id="labels-and-expressions-must-all-match",
        ),
        pytest.param({}, {"anything": "x"}, True, id="empty-selector-as-a-selector"),
    ],
)
def test_selector_matching(
    selector: dict[str, Any], labels: dict[str, str], expected: bool
) -> None:
    parsed = parse_selector(selector, "s")
    assert parsed is not None
    assert expected == parsed.matches(labels)


def test_selector_with_unknown_operator_is_an_error() -> None:
    with pytest.raises(ObjectError, match=r"matchExpressions\[0\].operator: unknown 'Near'"):
        parse_selector({"matchExpressions": [{"key": "a", "operator": "Near"}]}, "s")


def test_requirement_values_are_a_set() -> None:
    parsed = parse_selector(
        {"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", "x", "y"]}]}, "s"
    )
    assert parsed is not None
    assert (Requirement("a", "In", frozenset({"x", "y"})),) == parsed.match_expressions


# -- the floor annotation (lending opt-in) -------------------------------------------------

FLOOR = "resize-preemption.io/floor"


def _meshed() -> Any:
    """A pod with an app container "worker", a sidecar "proxy" and an init "setup"."""
    return (
        make_pod("lender")
        .requests(cpu="3", memory="1Gi", container="worker")
        .sidecar("proxy", cpu="1")
        .init_container("setup", cpu="1")
    )


@pytest.mark.parametrize(
    ("expected", "annotation", "restarts"),
    [
        pytest.param(
            [("worker", "cpu", 1000), ("worker", "memory", 512 * Mi)],
            '{"worker": {"cpu": "1", "memory": "512Mi"}}',
            (),
            id="cpu-and-memory",
        ),
        pytest.param([("worker", "cpu", 500)], '{"worker": {"cpu": 0.5}}', (), id="json-number"),
        pytest.param([("proxy", "cpu", 100)], '{"proxy": {"cpu": "100m"}}', (), id="sidecar"),
        pytest.param(
            [("worker", "memory", Gi // 2)],
            '{"worker": {"cpu": "1", "memory": "512Mi"}}',
            ("cpu",),
            id="restart-container-cpu-does-not-lend",
        ),
        pytest.param([], '{"worker": {"cpu": "1"}}', ("cpu",), id="nothing-left-to-lend"),
        pytest.param([], "{}", (), id="empty"),
    ],
)
def test_floor_annotation(
    expected: list[tuple[str, str, int]], annotation: str, restarts: tuple[str, ...]
) -> None:
    b = _meshed().annotate(FLOOR, annotation)
    for resource in restarts:
        b.resize_policy(resource, container="worker")
    pod = b.build()

    assert expected == [(f.container, f.resource, f.amount) for f in pod.floors]
    assert "" == pod.floor_error


@pytest.mark.parametrize(
    ("fragment", "annotation"),
    [
        pytest.param("is not valid JSON", '{"worker": {cpu: 1}}', id="not-json"),
        pytest.param("must be a JSON object", '["worker"]', id="not-an-object"),
        pytest.param("'worker' must map cpu and/or memory", '{"worker": "1"}', id="not-a-map"),
        pytest.param("'worker' must map cpu and/or memory", '{"worker": {"gpu": "1"}}', id="gpu"),
        pytest.param("worker.cpu: 'lots' is not a valid", '{"worker": {"cpu": "lots"}}', id="qty"),
        pytest.param("worker.memory must be more than 0", '{"worker": {"memory": 0}}', id="zero"),
        pytest.param("no container (or sidecar) named 'web'", '{"web": {"cpu": "1"}}', id="web"),
        pytest.param("named 'setup' can be resized", '{"setup": {"cpu": "1"}}', id="init"),
    ],
)
def test_malformed_floor_lends_nothing_and_says_why(fragment: str, annotation: str) -> None:
    pod = _meshed().annotate(FLOOR, annotation).build()

    assert () == pod.floors
    assert fragment in pod.floor_error
    assert pod.floor_error.startswith(f"annotation {FLOOR}")


def test_pod_without_floor_annotation() -> None:
    pod = _meshed().build()

    assert ((), "") == (pod.floors, pod.floor_error)
