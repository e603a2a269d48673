"""The comparison counts a component's requests per scenario; leader election apart."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

from pathlib import Path

import orjson

from harness.compare.measure import IDLE_LABEL, AuditCursor, count_requests

AGENT = "resize-preemption-webhook/1"
AT = "2026-01-01T00:00:01.000000Z"


def line(audit_id: str, verb: str, resource: str, name: str = "", **extra: str) -> bytes:
    ref = {"resource": resource, "name": name} | extra
    event = {
        "auditID": audit_id,
        "verb": verb,
        "userAgent": AGENT,
        "objectRef": ref,
        "requestReceivedTimestamp": AT,
    }
    return orjson.dumps(event) + b"\n"


def test_leader_renewals_are_in_the_breakdown_and_not_in_the_total(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_bytes(
        line("1", "create", "leases", "rpw-ledger-node-1")
        + line("2", "update", "leases", "resize-preemption-webhook-leader")
        + line("3", "update", "leases", "resize-preemption-webhook-leader")
        + line("4", "create", "pods", "low", subresource="eviction")
        + line("5", "create", "events")
        + line("5", "create", "events")  # one request logged at two stages
    )

    total, breakdown = count_requests(AuditCursor(log), "resize-preemption-webhook/", 0, 2e9)

    assert 3 == total
    assert {
        "create events": 1,
        "create leases": 1,
        "create pods/eviction": 1,
        IDLE_LABEL: 2,
    } == breakdown


def test_at_rest_leader_renewals_count(tmp_path: Path) -> None:
    log = tmp_path / "audit.log"
    log.write_bytes(line("1", "update", "leases", "resize-preemption-webhook-leader"))

    counted = count_requests(
        AuditCursor(log), "resize-preemption-webhook/", 0, 2e9, leader_apart=False
    )

    assert (1, {"update leases": 1}) == counted
