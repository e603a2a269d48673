"""Upstream's own cases for ``PodRequests`` (k8s.io/component-helpers v0.37.2,
``resource/helpers_test.go`` ``TestPodResourceRequests``), under their names.

Ported are the cases that read status resources (``UseStatusResources: true``) or carry
no status, with the options we always use: overhead included, status resources used.
A case with the ``PodResizePending`` Infeasible condition is planned with role
``infeasible``; the others with role ``resizing`` (both are upstream's function)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.unit.builders import PodBuilder, make_pod
from webhook.core.accounting import Role, pod_requests
from webhook.core.resources import Resources


@dataclass(frozen=True)
class Case:
    description: str
    pod: PodBuilder
    expected: Resources
    role: Role = "resizing"


CASES = [
    Case(
        "nil options, larger init container",
        make_pod("p").init_container("init", cpu="4").requests(cpu="1", container="c"),
        Resources(cpu=4000),
    ),
    Case(
        "nil options, larger containers",
        make_pod("p")
        .init_container("init", cpu="2")
        .requests(cpu="2", container="c1")
        .requests(cpu="3", container="c2"),
        Resources(cpu=5000),
    ),
    Case(
        "pod overhead included",
        make_pod("p")
        .overhead(cpu="1", memory="1Gi")
        .init_container("init", cpu="2")
        .requests(cpu="2", container="c1")
        .requests(cpu="3", container="c2"),
        Resources(cpu=6000, memory=2**30),
    ),
    Case(
        "resized, infeasible",
        make_pod("p")
        .requests(cpu="4", container="container-1")
        .status("container-1", actual={"cpu": "2"})
        .resize_pending("Infeasible"),
        Resources(cpu=2000),
        role="infeasible",
    ),
    Case(
        "resized, infeasible & in-progress",
        make_pod("p")
        .requests(cpu="6", container="container-1")
        .status("container-1", allocated={"cpu": "4"}, actual={"cpu": "2"})
        .resize_pending("Infeasible"),
        Resources(cpu=4000),
        role="infeasible",
    ),
    Case(
        "resized, no resize status",
        make_pod("p")
        .requests(cpu="4", container="container-1")
        .status("container-1", actual={"cpu": "2"}),
        Resources(cpu=4000),
    ),
    Case(
        "resized: per-resource 3-way maximum",
        make_pod("p")
        .requests(cpu="30m", memory="20M", container="container-1")
        .status(
            "container-1",
            allocated={"cpu": "20m", "memory": "10M"},
            actual={"cpu": "10m", "memory": "30M"},
        ),
        Resources(cpu=30, memory=30_000_000),
    ),
    Case(
        "resized, restartable init container, infeasible",
        make_pod("p")
        .sidecar("restartable-init-1", cpu="4")
        .status("restartable-init-1", actual={"cpu": "2"}, init=True)
        .resize_pending("Infeasible"),
        Resources(cpu=2000),
        role="infeasible",
    ),
    Case(
        "resized, restartable init container, no resize status",
        make_pod("p")
        .sidecar("restartable-init-1", cpu="4")
        .status("restartable-init-1", actual={"cpu": "2"}, init=True),
        Resources(cpu=4000),
    ),
    Case(
        "restartable init container",
        make_pod("p").sidecar("restartable-init-1", cpu="1").requests(cpu="1", container="c"),
        Resources(cpu=2000),
    ),
    Case(
        "multiple restartable init containers",
        make_pod("p")
        .init_container("init-1", cpu="5")
        .sidecar("restartable-init-1", cpu="1")
        .sidecar("restartable-init-2", cpu="2")
        .sidecar("restartable-init-3", cpu="3")
        .requests(cpu="1", container="container-1"),
        Resources(cpu=7000),
    ),
    Case(
        "multiple restartable and regular init containers",
        make_pod("p")
        .init_container("init-1", cpu="5")
        .sidecar("restartable-init-1", cpu="1")
        .sidecar("restartable-init-2", cpu="2")
        .init_container("init-2", cpu="5")
        .sidecar("restartable-init-3", cpu="3")
        .requests(cpu="1", container="container-1"),
        Resources(cpu=8000),
    ),
    Case(
        "restartable-init, init and regular",
        make_pod("p")
        .sidecar("restartable-init-1", cpu="10")
        .init_container("init-1", cpu="200")
        .requests(cpu="100", container="container-1"),
        Resources(cpu=210_000),
    ),
    Case(
        "aggregate request resolves max of sums instead of sum of maxes",
        make_pod("p")
        .requests(cpu="1", container="c1")
        .requests(cpu="2", container="c2")
        .status("c1", allocated={"cpu": "2"})
        .status("c2", allocated={"cpu": "1"}),
        Resources(cpu=3000),
    ),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.description) for c in CASES])
def test_pod_resource_requests(case: Case) -> None:
    assert case.expected == pod_requests(case.pod.build(), case.role)
