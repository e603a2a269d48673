"""Ledger entries survive their JSON form, and the in-memory ledger behaves like a store."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import orjson
import pytest

from harness.doubles import InMemoryLedger
from tests.unit.builders import NOW, Gi, plan, uid, walkthrough
from webhook.core.accounting import Reservation
from webhook.core.errors import ObjectError
from webhook.core.lending import Loan
from webhook.core.model import PodRef
from webhook.core.resources import Resources
from webhook.engine.ledger import (
    ENTRY_VERSION,
    MAX_NODE_ENTRIES,
    LedgerEntry,
    LedgerFull,
    decode_entries,
    encode_entries,
    on_local_clock,
)

LOAN = Loan(PodRef("batch", "job-3", "uid-job-3"), 1000, "worker", "cpu", 3000, 1000, 2000)
MEMORY_LOAN = Loan(
    PodRef("batch", "job-3", "uid-job-3"), 1000, "worker", "memory", 2 * Gi, Gi, Gi, limits=True
)


def entry(
    name: str = "web", review: str = "review-1", node: str = "node-1", **changes: Any
) -> LedgerEntry:
    base = LedgerEntry(
        pod=PodRef("shop", name, f"uid-{name}"),
        node=node,
        review_uid=review,
        resources=Resources(6000, 2 * Gi),
        desired=(("app", Resources(5500, Gi)), ("proxy", Resources(500, Gi))),
        victims=(PodRef("batch", "job-2", "uid-job-2"), PodRef("batch", "job-1", "uid-job-1")),
        admitted_at=NOW,
        expires_at=NOW + 60.5,
    )
    return replace(base, **changes)


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(entry(), id="fresh"),
        pytest.param(entry(handled=frozenset({"uid-job-2"})), id="one-victim-handled"),
        pytest.param(entry(persisted=True, generation=3), id="persisted"),
        pytest.param(entry(victims=(), desired=()), id="no-victims"),
        pytest.param(entry(resources=Resources(10**15, 2**62)), id="huge-amounts"),
        pytest.param(entry(name="ü-名前"), id="non-ascii-name"),
        pytest.param(entry(loans=(LOAN, MEMORY_LOAN)), id="loans-in-order"),
    ],
)
def test_json_round_trip(value: LedgerEntry) -> None:
    wire = orjson.loads(orjson.dumps(value.to_json()))

    assert value == LedgerEntry.from_json(wire)


def test_wire_form() -> None:
    expected = {
        "v": ENTRY_VERSION,
        "pod": {"namespace": "shop", "name": "web", "uid": "uid-web"},
        "node": "node-1",
        "review": "review-1",
        "resources": {"cpu": 6000, "memory": 2 * Gi},
        "desired": {"app": [5500, Gi], "proxy": [500, Gi]},
        "victims": [
            {"namespace": "batch", "name": "job-2", "uid": "uid-job-2"},
            {"namespace": "batch", "name": "job-1", "uid": "uid-job-1"},
        ],
        "admitted": NOW,
        "expires": NOW + 60.5,
        "handled": ["uid-job-1"],
        "persisted": True,
        "generation": 7,
        "persist_by": NOW + 10.0,
        "loans": [
            {
                "pod": {"namespace": "batch", "name": "job-3", "uid": "uid-job-3"},
                "priority": 1000,
                "container": "worker",
                "resource": "cpu",
                "before": 3000,
                "after": 1000,
                "frees": 2000,
                "limits": False,
            }
        ],
    }
    value = entry(
        handled=frozenset({"uid-job-1"}),
        persisted=True,
        generation=7,
        persist_by=NOW + 10.0,
        loans=(LOAN,),
    )

    assert expected == value.to_json()


def test_victims_keep_their_eviction_order() -> None:
    decoded = LedgerEntry.from_json(entry().to_json())

    assert ("job-2", "job-1") == tuple(v.name for v in decoded.victims)


def test_older_entries_without_optional_fields() -> None:
    data = entry().to_json()
    del data["handled"], data["persisted"], data["generation"], data["persist_by"]
    del data["loans"]

    decoded = LedgerEntry.from_json(data)

    assert (frozenset(), False, 0, 0.0, ()) == (
        decoded.handled,
        decoded.persisted,
        decoded.generation,
        decoded.persist_by,
        decoded.loans,
    )


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        pytest.param(lambda d: d.update(v=ENTRY_VERSION + 1), "is not supported", id="version"),
        pytest.param(lambda d: d.pop("v"), "is not supported", id="no-version"),
        pytest.param(lambda d: d.pop("pod"), "malformed ledger entry", id="no-pod"),
        pytest.param(
            lambda d: d["resources"].update(cpu="lots"), "malformed ledger entry", id="bad-cpu"
        ),
        pytest.param(
            lambda d: d.update(desired=[["app", 1]]), "malformed ledger entry", id="bad-desired"
        ),
        pytest.param(
            lambda d: d.update(victims=[{"name": "x"}]),
            "malformed ledger entry",
            id="victim-without-namespace",
        ),
        pytest.param(lambda d: d.update(expires=None), "malformed ledger entry", id="no-expiry"),
        pytest.param(
            lambda d: d["loans"][0].update(resource="gpu"), "unknown resource", id="loan-of-gpu"
        ),
        pytest.param(
            lambda d: d["loans"][0].update(after=3000), "lowers nothing", id="loan-lowers-nothing"
        ),
        pytest.param(lambda d: d["loans"][0].update(after=0), "lowers nothing", id="loan-to-zero"),
        pytest.param(
            lambda d: d["loans"][0].pop("container"),
            "malformed ledger entry",
            id="loan-no-container",
        ),
    ],
)
def test_malformed_entries_are_refused(mutate: Any, fragment: str) -> None:
    data = entry(loans=(LOAN,)).to_json()
    mutate(data)

    with pytest.raises(ObjectError, match=fragment):
        LedgerEntry.from_json(data)


def test_reservation_claims_only_pending_victims() -> None:
    value = entry(handled=frozenset({"uid-job-2"}))

    assert (
        Reservation(
            pod_uid="uid-web",
            pod="shop/web",
            node="node-1",
            resources=Resources(6000, 2 * Gi),
            victims=frozenset({"uid-job-1"}),
            expires_at=NOW + 60.5,
        )
        == value.reservation()
    )
    assert (PodRef("batch", "job-1", "uid-job-1"),) == value.pending_victims


def test_entry_helpers_return_new_entries() -> None:
    value = entry()

    assert () == value.with_victims(()).victims
    assert frozenset() == value.handled
    assert not value.persisted


@pytest.mark.parametrize(
    "persisted", [pytest.param(False, id="admitted"), pytest.param(True, id="deferred")]
)
def test_entry_for_a_plan_holds_its_room_victims_and_desired_requests(persisted: bool) -> None:
    old, new, node, pods = walkthrough()
    walk = plan(old, new, node, pods)

    value = LedgerEntry.for_plan(
        new, walk, review_uid="review-7", now=NOW, ttl=30.0, persisted=persisted
    )

    assert (
        LedgerEntry(
            pod=PodRef("default", "high-priority-pod", uid("high-priority-pod")),
            node="node-1",
            review_uid="review-7",
            resources=Resources(6000, Gi),
            desired=(("app", Resources(6000, Gi)),),
            victims=(PodRef("default", "low-priority-pod", uid("low-priority-pod")),),
            admitted_at=NOW,
            expires_at=NOW + 30.0,
            persisted=persisted,
        )
        == value
    )


def test_encode_decode_round_trip() -> None:
    entries = (entry("b", "r2"), entry("a", "r1"), entry("a", "r0"))

    decoded = decode_entries(encode_entries(entries))

    assert set(entries) == set(decoded)
    assert [("uid-a", "r0"), ("uid-a", "r1"), ("uid-b", "r2")] == [
        (e.pod.uid, e.review_uid) for e in decoded
    ]


def test_encoding_is_canonical() -> None:
    a, b = entry("a", "r1"), entry("b", "r2")

    assert encode_entries([a, b]) == encode_entries([b, a])


def test_desired_comes_back_sorted_by_container_name() -> None:
    value = entry(desired=(("zeta", Resources(1, 1)), ("alpha", Resources(2, 2))))

    (decoded,) = decode_entries(encode_entries([value]))

    assert dict(value.desired) == dict(decoded.desired)
    assert ("alpha", "zeta") == tuple(n for n, _ in decoded.desired)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(None, id="none"),
        pytest.param("", id="empty"),
        pytest.param("{not json", id="not-json"),
        pytest.param('{"v": 1}', id="not-a-list"),
        pytest.param("[]", id="empty-list"),
    ],
)
def test_unreadable_ledgers_decode_to_nothing(text: str | None) -> None:
    assert () == decode_entries(text)


def test_broken_entries_are_dropped_and_the_rest_kept() -> None:
    good = entry()
    raw = orjson.loads(encode_entries([good]))
    raw += [{"v": 99}, {"v": ENTRY_VERSION}, "junk"]

    assert (good,) == decode_entries(orjson.dumps(raw).decode())


# -- the in-memory ledger ------------------------------------------------------------------


def test_in_memory_ledger_updates_one_node() -> None:
    ledger = InMemoryLedger()
    first = entry()

    result = ledger.update("node-1", lambda current: ((*current, first), len(current)))

    assert 0 == result
    assert (first,) == ledger.entries("node-1")
    assert () == ledger.entries("node-2")
    assert (first,) == ledger.all_entries()
    assert 1 == ledger.writes
    assert ledger.reachable()


def test_leaving_entries_as_they_are_writes_nothing() -> None:
    ledger = InMemoryLedger()
    ledger.update("node-1", lambda current: ((entry(),), None))

    answer = ledger.update("node-1", lambda current: (None, len(current)))

    assert 1 == answer
    assert 1 == ledger.writes


def test_nodes_are_kept_apart() -> None:
    ledger = InMemoryLedger()
    a, b = entry("a", node="node-1"), entry("b", node="node-2")
    ledger.update("node-1", lambda current: ((a,), None))
    ledger.update("node-2", lambda current: ((b,), None))
    ledger.update("node-1", lambda current: ((), None))

    assert () == ledger.entries("node-1")
    assert (b,) == ledger.entries("node-2")
    assert (b,) == ledger.all_entries()


def test_concurrent_updates_are_atomic() -> None:
    ledger = InMemoryLedger()

    def add(i: int) -> None:
        for k in range(50):
            value = entry(f"p{i}-{k}", f"r{i}-{k}")
            ledger.update("node-1", lambda current, v=value: ((*current, v), None))

    threads = [threading.Thread(target=add, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert 200 == len(ledger.entries("node-1"))
    assert 200 == ledger.writes


# -- read on the reader's clock: TTL cap, entries from the future, clock offsets -----------

TTL = 120.0


@pytest.mark.parametrize(
    ("admitted", "expires", "seen", "live", "deadline", "why"),
    [
        # A reader whose clock agrees: the entry as written.
        (NOW, NOW + TTL, NOW, True, NOW + TTL, ""),
        # Held longer than the TTL by its writer: capped.
        (NOW, NOW + 3600, NOW, True, NOW + TTL, "capped at the TTL"),
        # The reader's clock 30 s ahead sees a fresh entry written: as long on its clock.
        (NOW, NOW + TTL, NOW + 30, True, NOW + 30 + TTL, ""),
        # 30 s behind: no longer on its clock than the TTL either.
        (NOW, NOW + TTL, NOW - 30, True, NOW - 30 + TTL, ""),
        # Admitted further ahead than clocks may differ: refused, holds nothing.
        (NOW + 3600, NOW + 3600 + TTL, NOW, True, NOW, "in the future: refused"),
        (NOW + 3600, NOW + 3600 + TTL, NOW, False, NOW, "in the future: refused"),
        # First seen in a list, written a minute ago: as written.
        (NOW - 60, NOW - 60 + TTL, NOW, False, NOW - 60 + TTL, ""),
        # First seen in a list, from a writer 30 s ahead: no more than the TTL from now.
        (NOW + 30, NOW + 30 + TTL, NOW, False, NOW + TTL, ""),
    ],
    ids=[
        "same-clock",
        "capped",
        "reader-ahead",
        "reader-behind",
        "from-the-future",
        "from-the-future-listed",
        "listed",
        "listed-writer-ahead",
    ],
)
def test_an_entry_is_read_on_the_readers_clock(
    admitted: float, expires: float, seen: float, live: bool, deadline: float, why: str
) -> None:
    read, said = on_local_clock(
        entry(admitted_at=admitted, expires_at=expires), seen=seen, live=live, ttl=TTL
    )
    assert deadline == pytest.approx(read.deadline)
    assert why in said and bool(why) == bool(said)
    # The reservation every plan counts ends at the same time.
    assert read.deadline == read.reservation().expires_at


def test_the_persist_deadline_moves_with_the_entry() -> None:
    written = entry(admitted_at=NOW, expires_at=NOW + TTL, persist_by=NOW + 10)
    read, _ = on_local_clock(written, seen=NOW + 30, live=True, ttl=TTL)
    assert NOW + 40 == pytest.approx(read.persist_deadline)
    # What the reader writes back is what it read: its clock stays out of the Lease.
    assert written.to_json() == read.to_json()


def test_a_node_holds_a_bounded_count_of_entries() -> None:
    ledger = InMemoryLedger()
    many = tuple(entry(f"web-{i}", f"review-{i}") for i in range(MAX_NODE_ENTRIES + 1))
    with pytest.raises(LedgerFull, match=f"more than the {MAX_NODE_ENTRIES}"):
        ledger.update("node-1", lambda _: (many, None))
    assert () == ledger.entries("node-1")
    # A read of a Lease someone filled past the bound keeps the bound.
    assert MAX_NODE_ENTRIES == len(decode_entries(encode_entries(many)))
