"""``webhook.kube.resizer``: a loan made through ``pods/resize``, once, and only on the
lender the plan saw."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from webhook.core.lending import Loan
from webhook.core.model import PodRef
from webhook.engine.metrics import Metrics
from webhook.engine.ports import LoanResult
from webhook.kube.resizer import Resizer, lent_note, resize_patch

GI = 1024**3
BORROWER = PodRef("default", "high-priority-pod", "uid-high")
CPU_LOAN = Loan(PodRef("default", "batch-1", "uid-batch"), 1000, "worker", "cpu", 3000, 1000, 2000)
MEMORY_LOAN = Loan(
    PodRef("default", "batch-1", "uid-batch"), 1000, "worker", "memory", 2 * GI, GI, GI, True
)


@dataclass
class _Response:
    status: int
    body: bytes

    def read(self) -> bytes:
        return self.body


@dataclass
class PodServer:
    """One pod behind an ``ApiClient``: GET it, PATCH its resize subresource."""

    pod: dict[str, Any] | None
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    patch_status: int = 200

    def param_serialize(self, **request: Any) -> tuple[Any, ...]:
        return (request["method"], request["resource_path"], request.get("body"))

    def call_api(self, method: str, path: str, body: Any, **_: Any) -> _Response:
        self.calls.append((method, path, body))
        if path.endswith("/events"):
            return _Response(201, b"{}")
        if self.pod is None:
            raise ApiException(status=404, reason="Not Found")
        if method == "PATCH" and self.patch_status != 200:
            raise ApiException(status=self.patch_status, reason="refused")
        return _Response(200, json.dumps(self.pod).encode())


class Recorder:
    def __init__(self) -> None:
        self.notes: list[tuple[str, str, str]] = []

    def record(
        self, regarding: PodRef, *, related: PodRef, reason: str, action: str, note: str
    ) -> bool:
        self.notes.append((regarding.name, reason, note))
        return True


def lender(
    cpu: str = "3", *, uid: str = "uid-batch", terminating: bool = False, sidecar: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "batch-1", "namespace": "default", "uid": uid}
    meta["resourceVersion"] = "42"
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    container = {
        "name": "worker",
        "resources": {"requests": {"cpu": cpu, "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
    }
    if sidecar:
        container["restartPolicy"] = "Always"
        return {
            "metadata": meta,
            "spec": {"containers": [{"name": "app"}], "initContainers": [container]},
        }
    return {"metadata": meta, "spec": {"containers": [container]}}


@pytest.mark.parametrize(
    ("expected", "pod"),
    [
        pytest.param(LoanResult.LENT, lender(), id="at-before-is-lowered"),
        pytest.param(LoanResult.DONE, lender("1"), id="at-after-is-done"),
        pytest.param(LoanResult.DONE, lender("500m"), id="below-after-is-done"),
        pytest.param(LoanResult.VOID, lender("2"), id="owner-changed-it"),
        pytest.param(LoanResult.VOID, lender(uid="uid-new"), id="replaced"),
        pytest.param(LoanResult.VOID, lender(terminating=True), id="terminating"),
        pytest.param(LoanResult.VOID, None, id="gone"),
    ],
)
def test_a_loan_lowers_only_the_lender_the_plan_saw(
    expected: LoanResult, pod: dict[str, Any] | None
) -> None:
    server = PodServer(pod)

    result = Resizer(server, None, Metrics()).lend(CPU_LOAN, BORROWER, "node-1")

    assert expected == result
    patches = [c for c in server.calls if c[0] == "PATCH"]
    assert (1 if expected is LoanResult.LENT else 0) == len(patches)


def test_the_patch_goes_to_the_resize_subresource_with_preconditions() -> None:
    server = PodServer(lender())

    Resizer(server, None, Metrics()).lend(CPU_LOAN, BORROWER, "node-1")

    [(_, path, body)] = [c for c in server.calls if c[0] == "PATCH"]
    assert "/api/v1/namespaces/default/pods/batch-1/resize" == path
    assert {
        "metadata": {"uid": "uid-batch", "resourceVersion": "42"},
        "spec": {"containers": [{"name": "worker", "resources": {"requests": {"cpu": "1"}}}]},
    } == body


@pytest.mark.parametrize(
    ("expected", "loan", "init"),
    [
        pytest.param(
            {"initContainers": [{"name": "worker", "resources": {"requests": {"cpu": "1"}}}]},
            CPU_LOAN,
            True,
            id="sidecar",
        ),
        pytest.param(
            {
                "containers": [
                    {
                        "name": "worker",
                        "resources": {"requests": {"memory": "1Gi"}, "limits": {"memory": "1Gi"}},
                    }
                ]
            },
            MEMORY_LOAN,
            False,
            id="guaranteed-lowers-its-limit-too",
        ),
    ],
)
def test_resize_patch(expected: dict[str, Any], loan: Loan, init: bool) -> None:
    patch = resize_patch(loan, loan.after, uid="u", resource_version="", init=init)

    assert {"metadata": {"uid": "u"}, "spec": expected} == patch


def test_a_sidecar_lends_through_init_containers() -> None:
    server = PodServer(lender(sidecar=True))

    assert LoanResult.LENT == Resizer(server, None, Metrics()).lend(CPU_LOAN, BORROWER, "node-1")
    [(_, _, body)] = [c for c in server.calls if c[0] == "PATCH"]
    assert ["initContainers"] == list(body["spec"])


@pytest.mark.parametrize(
    "status", [pytest.param(409, id="conflict"), pytest.param(500, id="server-error")]
)
def test_an_api_failure_is_failed_not_raised(status: int) -> None:
    server = PodServer(lender(), patch_status=status)
    metrics = Metrics()

    assert LoanResult.FAILED == Resizer(server, None, metrics).lend(CPU_LOAN, BORROWER, "node-1")
    assert None is metrics.registry.get_sample_value(
        "resize_preemption_loans_total", {"result": "made"}
    )


def test_a_loan_made_is_told_on_the_lender_and_counted() -> None:
    recorder = Recorder()
    metrics = Metrics()

    Resizer(PodServer(lender()), recorder, metrics).lend(CPU_LOAN, BORROWER, "node-1")  # type: ignore[arg-type]
    Resizer(PodServer(lender("1")), recorder, metrics).lend(CPU_LOAN, BORROWER, "node-1")  # type: ignore[arg-type]

    assert [("batch-1", "Lent", "lent cpu 2 to pod uid-high on node-1")] == recorder.notes
    assert 1.0 == metrics.registry.get_sample_value(
        "resize_preemption_loans_total", {"result": "made"}
    )


def test_lent_note_names_the_amount_in_kubernetes_notation() -> None:
    assert "lent memory 1Gi to pod uid-high on node-1" == lent_note(MEMORY_LOAN, BORROWER, "node-1")
