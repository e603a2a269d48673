"""The ledger's Lease naming, parsing and last-writer-wins store; the client's rate limiter."""

from __future__ import annotations

import re

import pytest

from webhook.core.errors import ObjectError
from webhook.core.model import PodRef
from webhook.core.resources import Resources
from webhook.engine.ledger import LedgerEntry, encode_entries
from webhook.kube.client import RateLimiter
from webhook.kube.ledger import (
    LEDGER_ANNOTATION,
    NODE_ANNOTATION,
    LeaseState,
    _LeaseStore,
    _micro_time,
    lease_name,
    parse_lease,
)

DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def entry(pod: str, node: str = "node-1") -> LedgerEntry:
    return LedgerEntry(
        pod=PodRef("default", pod, f"uid-{pod}"),
        node=node,
        review_uid=f"review-{pod}",
        resources=Resources(1000, 2**30),
        desired=(("app", Resources(1000, 2**30)),),
        victims=(),
        admitted_at=100.0,
        expires_at=200.0,
    )


def test_lease_name_short_node() -> None:
    assert lease_name("node-1") == "rpw-ledger-node-1"


@pytest.mark.parametrize("node", ["a" * 253, ("x" * 60 + ".") * 4, "n" * 241 + "." + "m" * 11])
def test_lease_name_long_node_is_a_valid_distinct_name(node: str) -> None:
    name = lease_name(node)
    assert len(name) <= 253
    assert DNS_SUBDOMAIN.fullmatch(name), name
    assert name != lease_name(node[:-1] + "z")


def test_micro_time_has_six_fraction_digits() -> None:
    assert _micro_time(0) == "1970-01-01T00:00:00.000000Z"
    assert _micro_time(1.5) == "1970-01-01T00:00:01.500000Z"


def lease(name: str, rv: str, annotations: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {
            "name": name,
            "namespace": "rpw",
            "resourceVersion": rv,
            "annotations": annotations,
        }
    }


def test_parse_lease() -> None:
    state = parse_lease(
        lease(
            "rpw-ledger-node-1",
            "12",
            {NODE_ANNOTATION: "node-1", LEDGER_ANNOTATION: encode_entries([entry("a")])},
        )
    )
    assert state.node == "node-1" and state.resource_version == "12"
    assert [e.pod.name for e in state.entries] == ["a"]


def test_parse_lease_node_from_entries_or_name_and_broken_entries_dropped() -> None:
    from_entries = parse_lease(
        lease("whatever", "1", {LEDGER_ANNOTATION: encode_entries([entry("a", "n-7")])})
    )
    assert from_entries.node == "n-7"
    from_name = parse_lease(lease("rpw-ledger-node-3", "1", {LEDGER_ANNOTATION: "[{]"}))
    assert from_name.node == "node-3" and from_name.entries == ()
    with pytest.raises(ObjectError):
        parse_lease(lease("unrelated", "1", {}))


def test_store_keeps_the_newest_version() -> None:
    store = _LeaseStore()
    new = LeaseState("rpw-ledger-n", "n", "20", (entry("a"),))
    old = LeaseState("rpw-ledger-n", "n", "19", ())
    assert store.upsert("rpw/rpw-ledger-n", new) is not None
    # A watch event older than our own write's response must not win.
    assert store.upsert("rpw/rpw-ledger-n", old) is None
    assert store.node("n") is new
    assert store.replace({"rpw/rpw-ledger-n": old}) == []
    assert store.node("n") is new
    newer = LeaseState("rpw-ledger-n", "n", "21", ())
    changes = store.replace({"rpw/rpw-ledger-n": newer})
    assert [c.type for c in changes] == ["MODIFIED"] and store.node("n") is newer
    assert store.remove("rpw/rpw-ledger-n") is not None
    assert store.node("n") is None and store.states() == ()


def test_rate_limiter_burst_then_qps() -> None:
    now = [0.0]
    limiter = RateLimiter(10, 3, clock=lambda: now[0])
    assert [limiter.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.reserve() == pytest.approx(0.1)
    now[0] += 1.0
    assert limiter.reserve() == 0.0
    with pytest.raises(ValueError):
        RateLimiter(0, 1)
