"""``webhook.kube.resizer``: a loan made through ``pods/resize``, once, and only on the
lender the plan saw."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from webhook.base.metrics import Metrics
from webhook.core.lending import Loan, LoanRecord, records_text
from webhook.core.model import LOANS_ANNOTATION, Pod, PodRef
from webhook.core.objects import parse_pod
from webhook.engine.loans import LoanResult
from webhook.kube.resizer import Resizer, lent_note, refused_note, resize_patch

GI = 1024**3
BORROWER = PodRef("default", "high-priority-pod", "uid-high")
AT = 1_700_000_000.0
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
    """One pod behind an ``ApiClient`` (PATCH its resize subresource), and the cluster
    cache's copy of it (``lenders``)."""

    pod: dict[str, Any] | None
    calls: list[tuple[str, str, Any]] = field(default_factory=list)
    patch_status: int = 200
    #: Resize PATCHes answered 409 before the others succeed, and the pod a GET reads then.
    resize_conflicts: int = 0
    moved_on: dict[str, Any] | None = None

    def lenders(self, namespace: str, name: str) -> Pod | None:
        return parse_pod(self.pod) if self.pod is not None else None

    def resizer(self, recorder: Any = None, metrics: Metrics | None = None) -> Resizer:
        return Resizer(self, recorder, metrics or Metrics(), lenders=self.lenders, clock=lambda: AT)

    def patches(self, subresource: str = "") -> list[Any]:
        """The bodies of the PATCHes sent to the pod (``""``) or to a subresource."""
        path = "/api/v1/namespaces/default/pods/batch-1" + (
            f"/{subresource}" if subresource else ""
        )
        return [body for method, p, body in self.calls if method == "PATCH" and p == path]

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
        if method == "PATCH" and path.endswith("/resize") and self.resize_conflicts:
            self.resize_conflicts -= 1
            self.pod = self.moved_on or self.pod
            raise ApiException(status=409, reason="Conflict")
        return _Response(200, json.dumps(self.pod).encode())


class Recorder:
    def __init__(self) -> None:
        self.notes: list[tuple[str, str, str]] = []
        self.types: list[str] = []

    def record(
        self,
        regarding: PodRef,
        *,
        related: PodRef,
        reason: str,
        action: str,
        note: str,
        type_: str = "Normal",
    ) -> bool:
        self.notes.append((regarding.name, reason, note))
        self.types.append(type_)
        return True


def lender(
    cpu: str = "3",
    *,
    uid: str = "uid-batch",
    terminating: bool = False,
    sidecar: bool = False,
    recorded: tuple[Loan, ...] = (),
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "batch-1", "namespace": "default", "uid": uid}
    meta["resourceVersion"] = "42"
    if recorded:
        text = records_text(LoanRecord(loan, BORROWER, AT) for loan in recorded)
        meta["annotations"] = {LOANS_ANNOTATION: text}
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
    ("expected", "records", "resizes", "pod"),
    [
        pytest.param(LoanResult.LENT, 1, 1, lender(), id="at-before-is-recorded-and-lowered"),
        pytest.param(
            LoanResult.LENT, 0, 1, lender(recorded=(CPU_LOAN,)), id="recorded-already-is-lowered"
        ),
        pytest.param(LoanResult.DONE, 1, 0, lender("1"), id="at-after-is-done-and-recorded"),
        pytest.param(
            LoanResult.DONE, 0, 0, lender("1", recorded=(CPU_LOAN,)), id="done-and-recorded"
        ),
        pytest.param(LoanResult.DONE, 1, 0, lender("500m"), id="below-after-is-done"),
        pytest.param(LoanResult.VOID, 0, 0, lender("2"), id="owner-changed-it"),
        pytest.param(LoanResult.VOID, 0, 0, lender(uid="uid-new"), id="replaced"),
        pytest.param(LoanResult.VOID, 0, 0, lender(terminating=True), id="terminating"),
        pytest.param(LoanResult.VOID, 0, 0, None, id="gone"),
    ],
)
def test_a_loan_lowers_only_the_lender_the_plan_saw_and_is_recorded_first(
    expected: LoanResult, records: int, resizes: int, pod: dict[str, Any] | None
) -> None:
    server = PodServer(pod)

    result = server.resizer().lend(CPU_LOAN, BORROWER, "node-1")

    assert (expected, records, resizes) == (
        result,
        len(server.patches()),
        len(server.patches("resize")),
    )


def test_the_record_then_the_resize_each_with_preconditions() -> None:
    server = PodServer(lender())

    server.resizer().lend(CPU_LOAN, BORROWER, "node-1")

    paths = [path for method, path, _ in server.calls if method == "PATCH"]
    assert [
        "/api/v1/namespaces/default/pods/batch-1",
        "/api/v1/namespaces/default/pods/batch-1/resize",
    ] == paths
    [record] = server.patches()
    text = record["metadata"]["annotations"][LOANS_ANNOTATION]
    assert {"uid": "uid-batch", "resourceVersion": "42"} == {
        k: v for k, v in record["metadata"].items() if k != "annotations"
    }
    assert [
        {
            "container": "worker",
            "resource": "cpu",
            "before": 3000,
            "after": 1000,
            "frees": 2000,
            "limits": False,
            "borrower": {"namespace": "default", "name": "high-priority-pod", "uid": "uid-high"},
            "at": AT,
        }
    ] == json.loads(text)
    assert [
        {
            "metadata": {"uid": "uid-batch", "resourceVersion": "42"},
            "spec": {"containers": [{"name": "worker", "resources": {"requests": {"cpu": "1"}}}]},
        }
    ] == server.patches("resize")


def test_a_loan_costs_two_requests_the_lender_is_read_from_the_cache() -> None:
    server = PodServer(lender())

    server.resizer().lend(CPU_LOAN, BORROWER, "node-1")

    assert ["PATCH", "PATCH"] == [method for method, _, _ in server.calls]


def test_a_record_that_cannot_be_written_stops_the_loan() -> None:
    server = PodServer(lender(), patch_status=409)

    assert LoanResult.FAILED == server.resizer().lend(CPU_LOAN, BORROWER, "node-1")
    assert [] == server.patches("resize")


SECOND_LOAN = replace(CPU_LOAN, before=1000, after=500, frees=500)


@pytest.mark.parametrize(
    ("expected", "annotation", "pod", "ended"),
    [
        pytest.param(
            LoanResult.LENT,
            None,
            lender(recorded=(CPU_LOAN,)),
            (CPU_LOAN,),
            id="the-last-record-removes-the-annotation",
        ),
        pytest.param(
            LoanResult.LENT,
            [SECOND_LOAN],
            lender(recorded=(CPU_LOAN, SECOND_LOAN)),
            (CPU_LOAN,),
            id="the-others-stay",
        ),
        pytest.param(
            LoanResult.DONE, "unsent", lender(recorded=(SECOND_LOAN,)), (CPU_LOAN,), id="not-there"
        ),
        pytest.param(LoanResult.VOID, "unsent", None, (CPU_LOAN,), id="lender-gone"),
        pytest.param(
            LoanResult.VOID,
            "unsent",
            lender(uid="uid-new", recorded=(CPU_LOAN,)),
            (CPU_LOAN,),
            id="lender-replaced",
        ),
    ],
)
def test_forget_removes_only_the_ended_records(
    expected: LoanResult, annotation: Any, pod: dict[str, Any] | None, ended: tuple[Loan, ...]
) -> None:
    server = PodServer(pod)

    result = server.resizer().forget(CPU_LOAN.pod, [LoanRecord(x, BORROWER, AT) for x in ended])

    sent = [p["metadata"]["annotations"][LOANS_ANNOTATION] for p in server.patches()]
    if annotation == "unsent":
        assert (expected, []) == (result, sent)
    elif annotation is None:
        assert (expected, [None]) == (result, sent)
    else:
        [text] = sent
        kept = [(r["before"], r["after"]) for r in json.loads(text)]
        assert (expected, [(x.before, x.after) for x in annotation]) == (result, kept)


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

    assert LoanResult.LENT == server.resizer().lend(CPU_LOAN, BORROWER, "node-1")
    [body] = server.patches("resize")
    assert ["initContainers"] == list(body["spec"])


@pytest.mark.parametrize(
    "status", [pytest.param(409, id="conflict"), pytest.param(500, id="server-error")]
)
def test_an_api_failure_is_failed_not_raised(status: int) -> None:
    server = PodServer(lender(), patch_status=status)
    metrics = Metrics()

    assert LoanResult.FAILED == server.resizer(None, metrics).lend(CPU_LOAN, BORROWER, "node-1")
    assert None is metrics.registry.get_sample_value(
        "resize_preemption_loans_total", {"result": "made"}
    )


def test_a_loan_made_is_told_on_the_lender_and_counted() -> None:
    recorder = Recorder()
    metrics = Metrics()

    PodServer(lender()).resizer(recorder, metrics).lend(CPU_LOAN, BORROWER, "node-1")
    PodServer(lender("1")).resizer(recorder, metrics).lend(CPU_LOAN, BORROWER, "node-1")

    assert [("batch-1", "Lent", "lent cpu 2 to pod uid-high on node-1")] == recorder.notes
    assert 1.0 == metrics.registry.get_sample_value(
        "resize_preemption_loans_total", {"result": "made"}
    )


def test_lent_note_names_the_amount_in_kubernetes_notation() -> None:
    assert "lent memory 1Gi to pod uid-high on node-1" == lent_note(MEMORY_LOAN, BORROWER, "node-1")


WHY = "cannot decrease memory limits: attempting to set pod memory limit (1073741824) below..."


@pytest.mark.parametrize(
    ("expected", "pod"),
    [
        pytest.param(LoanResult.LENT, lender("1"), id="at-after-is-put-back"),
        pytest.param(LoanResult.DONE, lender("3"), id="at-before-is-done"),
        pytest.param(LoanResult.VOID, lender("2"), id="owner-changed-it"),
        pytest.param(LoanResult.VOID, lender("1", uid="uid-new"), id="replaced"),
        pytest.param(LoanResult.VOID, None, id="gone"),
    ],
)
def test_a_refused_loan_is_put_back_only_on_the_lender_it_lowered(
    expected: LoanResult, pod: dict[str, Any] | None
) -> None:
    server = PodServer(pod)
    recorder = Recorder()

    result = server.resizer(recorder).put_back(CPU_LOAN, BORROWER, "node-1", WHY)

    assert expected == result
    patches = [c[2] for c in server.calls if c[0] == "PATCH"]
    told = [("batch-1", "LoanRefused", refused_note(CPU_LOAN, WHY))]
    if expected is LoanResult.LENT:
        assert [
            {
                "metadata": {"uid": "uid-batch", "resourceVersion": "42"},
                "spec": {
                    "containers": [{"name": "worker", "resources": {"requests": {"cpu": "3"}}}]
                },
            }
        ] == patches
        assert (told, ["Warning"]) == (recorder.notes, recorder.types)
    else:
        assert ([], []) == (patches, recorder.notes)


def test_refused_note_says_what_the_kubelet_refused_and_what_was_put_back() -> None:
    assert f"the kubelet refused to lower memory to 1Gi ({WHY}); put back to 2Gi" == refused_note(
        MEMORY_LOAN, WHY
    )
    assert 1024 == len(refused_note(MEMORY_LOAN, "x" * 2000))


@pytest.mark.parametrize(
    ("expected", "moved_on", "resizes"),
    [
        pytest.param(LoanResult.LENT, lender(), 2, id="status-written-meanwhile-patched-again"),
        pytest.param(LoanResult.VOID, lender("2"), 1, id="owner-changed-it-meanwhile"),
        pytest.param(LoanResult.DONE, lender("1"), 1, id="lent-meanwhile"),
    ],
)
def test_a_conflict_is_judged_again_on_a_fresh_read(
    expected: LoanResult, moved_on: dict[str, Any], resizes: int
) -> None:
    """The kubelet writes the lender's status after the record's patch: the resize meets
    a newer version, and is made again only if the lender still asks the same."""
    moved_on["metadata"]["resourceVersion"] = "43"
    server = PodServer(lender(recorded=(CPU_LOAN,)), resize_conflicts=1, moved_on=moved_on)

    result = server.resizer().lend(CPU_LOAN, BORROWER, "node-1")

    gets = [p for m, p, _ in server.calls if m == "GET"]
    assert (expected, resizes, 1) == (result, len(server.patches("resize")), len(gets))
    if resizes == 2:
        assert "43" == server.patches("resize")[1]["metadata"]["resourceVersion"]


def test_two_conflicts_fail_and_wait_for_the_next_pass() -> None:
    server = PodServer(lender(recorded=(CPU_LOAN,)), resize_conflicts=2)

    assert LoanResult.FAILED == server.resizer().lend(CPU_LOAN, BORROWER, "node-1")
