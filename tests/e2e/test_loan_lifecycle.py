"""A loan is never stranded, and a cancelled resize stops its batch: the service on the real
API server, resizes made with kubectl, the hollow kubelet actuating them.

* an entry that owes a loan outlives its reservation: another admission's write to the
  node's Lease keeps it, and the lender gets its size back when the borrower shrinks;
* a loan outlives the loss of its entry (the Lease deleted): its lender carries the
  record, ``status`` lists it, and the worker gives it back when room returns;
* ``return-loans`` gives every loan back before an uninstall;
* a resize patched back down while its victims go in waves stops the waves not begun.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from harness import fault_hooks
from harness.webhook_process import NAMESPACE, WebhookProcess, start_webhook
from tests.e2e.conftest import NODE, Cluster, Kubectl, StartService, Waiter
from tests.e2e.service_support import (
    LEASES,
    clear_ledger,
    ledger_entries,
    pod_manifest,
    read_pod,
    resize,
    run_pods,
    spec_cpu,
    terminating,
)
from tests.e2e.test_lending import at, floor
from tests.e2e.test_status import run_cli
from webhook.core.model import LOANS_ANNOTATION
from webhook.engine.worker import VICTIM_PARALLELISM
from webhook.kube.ledger import lease_name

pytestmark = pytest.mark.e2e


def record_of(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The loans ``name`` records having made (its annotation), [] when none."""
    pod = read_pod(cluster, namespace, name) or {}
    text = (pod.get("metadata", {}).get("annotations") or {}).get(LOANS_ANNOTATION)
    return json.loads(text) if text else []


def entry_of(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The ledger entry of pod ``namespace/name`` as the node's Lease stores it."""
    return next(
        (
            e
            for e in ledger_entries(cluster)
            if (e["pod"]["namespace"], e["pod"]["name"]) == (namespace, name)
        ),
        None,
    )


def lend(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    classes: dict[str, str],
    wait_until: Waiter,
) -> None:
    """node-1 (8 CPU): lender 3 CPU (floor 1), high 3, other 1; high 3 -> 5 takes the free
    CPU and borrows 1 from the lender (3 -> 2)."""
    run_pods(
        kubectl,
        [
            pod_manifest("lender", "3", classes["low"], annotations=floor("1")),
            pod_manifest("high", "3", classes["high"]),
            pod_manifest("other", "1", classes["high"]),
        ],
    )
    assert 0 == resize(kubectl, "high", "5").returncode
    wait_until(at(cluster, namespace, "high", "5"), timeout=30, what="the resize actuated")
    wait_until(at(cluster, namespace, "lender", "2"), timeout=30, what="the loan actuated")
    [record] = record_of(cluster, namespace, "lender")
    assert (3000, 2000, "high") == (record["before"], record["after"], record["borrower"]["name"])


def shrink_and_see_it_given_back(
    cluster: Cluster, namespace: str, kubectl: Kubectl, wait_until: Waiter
) -> None:
    """high back to 3: the lender gets its CPU back, and its record goes."""
    assert 0 == resize(kubectl, "high", "3").returncode
    wait_until(at(cluster, namespace, "lender", "3"), timeout=30, what="the loan given back")
    wait_until(
        lambda: not record_of(cluster, namespace, "lender"), timeout=15, what="its record gone"
    )


@pytest.mark.service_modes
def test_an_entry_owing_a_loan_survives_another_admissions_write_past_its_expiry(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    start_service("--reservation-ttl", "6")
    lend(cluster, namespace, kubectl, priority_classes, wait_until)
    borrowed = entry_of(cluster, namespace, "high")
    assert borrowed is not None
    wait_until(lambda: time.time() > borrowed["expires"] + 1, timeout=15, what="its expiry")

    # Another admission on the node: other's memory grows where there is room, which
    # writes its own entry to the node's Lease.
    grow = json.dumps(
        {
            "spec": {
                "containers": [
                    {
                        "name": "app",
                        "resources": {
                            "requests": {"memory": "512Mi"},
                            "limits": {"memory": "512Mi"},
                        },
                    }
                ]
            }
        }
    )
    kubectl("patch", "pod", "other", "--subresource", "resize", "--patch", grow)
    wait_until(lambda: entry_of(cluster, namespace, "other"), timeout=10, what="other's entry")

    assert borrowed["review"] == (entry_of(cluster, namespace, "high") or {}).get("review")
    shrink_and_see_it_given_back(cluster, namespace, kubectl, wait_until)


def test_a_loan_whose_lease_was_deleted_is_listed_and_given_back(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    start_service()
    lend(cluster, namespace, kubectl, priority_classes, wait_until)

    cluster.client.delete(f"{LEASES}/{lease_name(NODE)}")
    wait_until(lambda: entry_of(cluster, namespace, "high") is None, timeout=10, what="no entry")

    status = run_cli(
        "status",
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--service-namespace",
        NAMESPACE,
        "-o",
        "json",
    )
    assert 0 == status.returncode, status.stderr
    [node] = [n for n in json.loads(status.stdout)["nodes"] if n["node"] == NODE]
    assert [(f"{namespace}/lender", "lent", f"{namespace}/high", True)] == [
        (loan["lender"], loan["state"], loan["borrower"], loan["orphan"])
        for loan in node["loans"]
        if loan["lender"].startswith(f"{namespace}/")
    ]
    time.sleep(2)  # the worker's passes: the node is full, nothing is given back yet
    assert "2" == spec_cpu(read_pod(cluster, namespace, "lender") or {})

    shrink_and_see_it_given_back(cluster, namespace, kubectl, wait_until)


def test_return_loans_gives_every_loan_back_once_the_service_is_gone(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    start_service: StartService,
    wait_until: Waiter,
) -> None:
    service = start_service()
    lend(cluster, namespace, kubectl, priority_classes, wait_until)
    service.stop()

    result = run_cli(
        "return-loans", "--kubeconfig", str(cluster.kubeconfig), "--node", NODE, "-o", "json"
    )

    assert 0 == result.returncode, result.stderr
    assert [
        {
            "lender": f"{namespace}/lender",
            "container": "app",
            "resource": "cpu",
            "from": "2",
            "to": "3",
            "borrower": f"{namespace}/high",
            "result": "lent",
        }
    ] == [r for r in json.loads(result.stdout) if r["lender"].startswith(f"{namespace}/")]
    lender = read_pod(cluster, namespace, "lender") or {}
    # Its spec is back; the kubelet actuates it once the node has room for it.
    assert ("3", []) == (spec_cpu(lender), record_of(cluster, namespace, "lender"))


@pytest.fixture
def slow_evictions(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[WebhookProcess]:
    """The service whose evictions each hold their thread 4 s after the call: a batch
    larger than the worker's parallelism goes in two waves, 4 s apart."""
    clear_ledger(cluster)
    monkeypatch.setenv(fault_hooks.DELAY_ENV, "4")
    process = start_webhook(
        cluster.client,
        cluster.kubeconfig,
        cluster.control_plane.state_dir,
        command=fault_hooks.COMMAND,
    )
    yield process
    process.stop()


def test_a_resize_patched_back_down_stops_the_rest_of_its_batch(
    cluster: Cluster,
    namespace: str,
    kubectl: Kubectl,
    priority_classes: dict[str, str],
    slow_evictions: WebhookProcess,
    wait_until: Waiter,
) -> None:
    count = VICTIM_PARALLELISM + 4
    lows = [f"low-{i}" for i in range(count)]
    run_pods(
        kubectl,
        [
            pod_manifest("high", "4", priority_classes["high"]),
            *(pod_manifest(name, "200m", priority_classes["low"]) for name in lows),
        ],
    )

    assert 0 == resize(kubectl, "high", "8").returncode  # every low pod must go
    wait_until(
        lambda: any(terminating(read_pod(cluster, namespace, n)) for n in lows),
        timeout=15,
        what="the first wave of evictions",
    )
    assert 0 == resize(kubectl, "high", "4").returncode  # the resize cancelled
    time.sleep(8)  # past the second wave's turn

    left = [n for n in lows if (p := read_pod(cluster, namespace, n)) and not terminating(p)]
    assert count - VICTIM_PARALLELISM == len(left)
