"""The ledger's Lease naming, parsing and last-writer-wins store; the client's rate limiter."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import orjson
import pytest
from kubernetes.client import ApiClient

from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.errors import ObjectError
from webhook.core.model import PodRef
from webhook.core.resources import Resources
from webhook.engine.ledger import LedgerEntry, encode_entries
from webhook.kube.client import RateLimiter
from webhook.kube.ledger import (
    LATE_AFTER,
    LEDGER_ANNOTATION,
    NODE_ANNOTATION,
    REPLAY_WINDOW,
    LeaseLedger,
    LeaseState,
    _LeaseStore,
    _micro_time,
    lease_name,
    parse_lease,
)
from webhook.kube.reflector import WatchEvent, parse_list_page

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
    assert new == store.node("n")
    assert store.replace({"rpw/rpw-ledger-n": old}) == []
    assert new == store.node("n")
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


# -- a write that lands after its writer gave up ----------------------------------------


@dataclass(frozen=True)
class LateCase:
    admitted_ago: float  # seconds before the watch delivers the entry
    stream_age: float | None  # seconds the delivering watch has been open; None: a LIST
    persisted: bool  # the reconciler's entry (the resize was in the spec already)
    changed: bool  # an entry already known, changed (the worker dropped a victim)
    void: bool


LATE_CASES = [
    LateCase(1.0, 30.0, False, False, False),
    LateCase(LATE_AFTER + 5, 30.0, False, False, True),
    LateCase(LATE_AFTER + 5, None, False, False, False),
    LateCase(LATE_AFTER + 5, REPLAY_WINDOW / 2, False, False, False),
    LateCase(LATE_AFTER + 5, 30.0, True, False, False),
    LateCase(LATE_AFTER + 5, 30.0, False, True, False),
]
LATE_IDS = [
    "on-time-counts",
    "late-on-a-live-watch-is-void",
    "first-seen-in-a-list-counts",
    "replayed-by-a-new-watch-counts",
    "the-reconcilers-entry-counts",
    "a-known-entry-changed-counts",
]


@pytest.mark.parametrize("case", LATE_CASES, ids=LATE_IDS)
def test_an_admission_entry_that_lands_late_is_void_and_dropped(case: LateCase) -> None:
    now = 1000.0
    metrics = Metrics()
    ledger = LeaseLedger(ApiClient(), Config(namespace="rpw"), metrics=metrics, clock=lambda: now)
    other = replace(entry("other"), admitted_at=now - 1)
    late = replace(entry("late"), admitted_at=now - case.admitted_ago, persisted=case.persisted)
    before = [other, replace(late, victims=(PodRef("default", "v", "uid-v"),))]
    ledger.reflector.load_pages(
        [
            parse_list_page(
                orjson.dumps(
                    {
                        "metadata": {"resourceVersion": "10"},
                        "items": [
                            lease(
                                "rpw-ledger-node-1",
                                "10",
                                {
                                    NODE_ANNOTATION: "node-1",
                                    LEDGER_ANNOTATION: encode_entries(
                                        before if case.changed else [other]
                                    ),
                                },
                            )
                        ],
                    }
                )
            )
        ]
    )
    annotations = {NODE_ANNOTATION: "node-1", LEDGER_ANNOTATION: encode_entries([other, late])}
    # The list above was the first sync; what follows comes as a watch of this age would.
    ledger.reflector.stream_age = lambda: case.stream_age  # type: ignore[method-assign]
    if case.stream_age is None:
        ledger.reflector.load_pages(
            [
                parse_list_page(
                    orjson.dumps(
                        {
                            "metadata": {"resourceVersion": "11"},
                            "items": [lease("rpw-ledger-node-1", "11", annotations)],
                        }
                    )
                )
            ]
        )
    else:
        ledger.reflector.apply(
            WatchEvent("MODIFIED", lease("rpw-ledger-node-1", "11", annotations))
        )

    expected = ["review-other"] if case.void else ["review-late", "review-other"]
    assert expected == sorted(e.review_uid for e in ledger.entries("node-1"))
    assert expected == sorted(e.review_uid for e in ledger.all_entries())
    # The store only says which Leases hold void entries; the worker's pass drops them.
    assert (frozenset({"node-1"}) if case.void else frozenset()) == ledger.untidy()
    late_writes = metrics.registry.get_sample_value(
        "resize_preemption_errors_total", {"where": "ledger-late-write"}
    )
    assert (1 if case.void else None) == late_writes
