"""The ledger port's contract, one suite for both stores.

Every test here runs three times, through the ``store`` fixture: on
:class:`webhook.engine.memory.MemoryLedger` ("memory"), on the unit tests'
:class:`harness.doubles.InMemoryLedger` ("memory-harness") and on
:class:`webhook.kube.ledger.LeaseLedger` against the real API server ("lease": one Lease
per node, two replicas on one fresh namespace). Together they prove that both stores:

* store exactly what a change returns - expired entries included, nothing dropped or
  kept on the store's own judgement; a change returning ``None`` writes nothing; reads
  (``entries``, ``all_entries``, another replica's once its watch has seen the write)
  return what was written;
* hold, after each of the lifecycle's changes (``release``, ``drop_victims``, ``tidy``,
  ``admit``), what :func:`webhook.engine.states.to_keep` keeps: an expired entry that
  owes a loan survives another admission's write on its node, and goes with the next
  write once its lender is back at its size before;
* lose no write to a conflict: two writers at once both land, and a change is applied
  again to the fresh entries after another writer wrote;
* create a node's Lease again when it was deleted behind the store's back;
* refuse, with :class:`LedgerFull` naming the node, a node whose entries are more than
  :data:`MAX_NODE_BYTES`, and write nothing then (exactly that many bytes are written);
* report no untidy node when every entry arrived in time.

``-k memory`` runs the in-memory part without a control plane.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from harness.doubles import InMemoryLedger
from tests.unit.builders import HIGH, LOW, NODE, Mi, make_node, make_pod, plan, uid
from webhook.core.lending import Loan
from webhook.core.model import Pod, PodRef
from webhook.core.plan import Plan
from webhook.core.resources import Resources
from webhook.engine.ledger import (
    MAX_NODE_BYTES,
    Ledger,
    LedgerChange,
    LedgerEntry,
    LedgerFull,
    R,
    decode_entries,
    encode_entries,
)
from webhook.engine.lifecycle import changes
from webhook.engine.memory import MemoryLedger

TTL = 120.0
#: Seconds a replica's watch may take to show another replica's write.
SEEN_WITHIN = 10.0


# -- the two stores -------------------------------------------------------------------------


class CountingLedger(MemoryLedger):
    """A :class:`MemoryLedger` counting each node's writes: the in-memory meaning of a
    Lease's resourceVersion (a write that raised counts for nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: Counter[str] = Counter()
        self._count_lock = threading.Lock()

    def update(self, node: str, change: LedgerChange[R]) -> R:
        wrote = False

        def watched(entries: tuple[LedgerEntry, ...]) -> tuple[tuple[LedgerEntry, ...] | None, R]:
            nonlocal wrote
            new, result = change(entries)
            wrote = new is not None
            return new, result

        result = super().update(node, watched)
        if wrote:
            with self._count_lock:
                self.writes[node] += 1
        return result


class MemoryStore:
    """The in-memory store with the Lease store's helpers: its other replica is itself,
    it holds what it reads, deleting a node's Lease empties the node."""

    #: Calls of a change when another writer wrote since this one last read: no cache,
    #: so the change sees the other's write the first time.
    calls_when_stale = 1

    def __init__(self, ledger: CountingLedger | InMemoryLedger) -> None:
        self.ledger = self.other = ledger

    def held(self, node: str) -> tuple[LedgerEntry, ...]:
        return self.ledger.entries(node)

    def version(self, node: str) -> str:
        writes = self.ledger.writes
        # The unit tests' InMemoryLedger counts every node's writes together.
        return str(writes if isinstance(writes, int) else writes[node])

    def delete(self, node: str) -> None:
        self.ledger.update(node, lambda _: ((), None))

    def stop_watch(self) -> None:
        """Nothing: its reads are the store."""

    def close(self) -> None:
        pass


class LeaseStore:
    """Two :class:`LeaseLedger` replicas on one namespace of the real API server;
    ``ledger`` is replica A, ``other`` replica B."""

    #: Once on the stale cached entries, once more on the Lease read after the 409.
    calls_when_stale = 2

    def __init__(self, cluster: Any, namespace: str) -> None:
        from webhook.base.metrics import Metrics
        from webhook.base.settings import Config
        from webhook.kube.client import make_api_client
        from webhook.kube.ledger import LeaseLedger

        self.cluster, self.namespace = cluster, namespace
        self.ledger, self.other = (
            LeaseLedger(
                make_api_client(str(cluster.kubeconfig)),
                Config(namespace=namespace, identity=identity),
                metrics=Metrics(),
                close_client=True,
            )
            for identity in ("replica-a", "replica-b")
        )
        for replica in (self.ledger, self.other):
            replica.start()
        for replica in (self.ledger, self.other):
            assert replica.wait_synced(30), "the Lease watch did not sync"

    def _path(self, node: str) -> str:
        from webhook.kube.ledger import lease_name

        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{lease_name(node)}"

    def _lease(self, node: str) -> Any:
        return self.cluster.client.get_or_none(self._path(node))

    def held(self, node: str) -> tuple[LedgerEntry, ...]:
        """The entries in the Lease as the API server has it (no cache)."""
        from webhook.kube.ledger import LEDGER_ANNOTATION

        lease = self._lease(node)
        if lease is None:
            return ()
        return decode_entries(lease["metadata"].get("annotations", {}).get(LEDGER_ANNOTATION))

    def version(self, node: str) -> str:
        lease = self._lease(node)
        return "" if lease is None else str(lease["metadata"]["resourceVersion"])

    def delete(self, node: str) -> None:
        self.cluster.client.delete(self._path(node))

    def stop_watch(self) -> None:
        """Replica A's cache stops following the Leases: it keeps what it last saw."""
        self.ledger.reflector.stop()

    def close(self) -> None:
        for replica in (self.ledger, self.other):
            replica.stop()


Store = MemoryStore | LeaseStore


@pytest.fixture(
    params=[
        pytest.param("memory"),
        pytest.param("harness", id="memory-harness"),
        pytest.param("lease", marks=pytest.mark.e2e),
    ],
)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "memory":
        subject: Store = MemoryStore(CountingLedger())
    elif request.param == "harness":
        subject = MemoryStore(InMemoryLedger())
    else:
        subject = LeaseStore(
            request.getfixturevalue("cluster"), request.getfixturevalue("namespace")
        )
    try:
        yield subject
    finally:
        subject.close()


# -- entries, pods and reads ------------------------------------------------------------------


def ref(name: str) -> PodRef:
    return PodRef("default", name, uid(name))


def entry(
    review: str,
    pod: str = "ghost",
    *,
    expired: bool = False,
    victims: Sequence[str] = (),
    loans: tuple[Loan, ...] = (),
) -> LedgerEntry:
    """An entry admitted two seconds ago (a replica's watch takes one admitted long ago
    for a late write, :data:`webhook.kube.ledger.LATE_AFTER`), expired a second ago when
    ``expired``. Its pod is in no cache unless named: it holds room until it expires."""
    now = time.time() - 2
    asked = Resources(100, 64 * Mi)
    return LedgerEntry(
        pod=ref(pod),
        node=NODE,
        review_uid=review,
        resources=asked,
        desired=(("app", asked),),
        victims=tuple(ref(v) for v in victims),
        admitted_at=now,
        expires_at=now + 1 if expired else now + TTL,
        loans=loans,
    )


def summary(entries: Sequence[LedgerEntry]) -> tuple[str, ...]:
    """Each entry as ``review[victim,...]``, sorted."""
    return tuple(
        sorted(
            e.review_uid + (f"[{','.join(v.name for v in e.victims)}]" if e.victims else "")
            for e in entries
        )
    )


def eventually(read: Callable[[], Any], expected: Any, what: str) -> None:
    """Polls ``read()`` until it returns ``expected``, for at most :data:`SEEN_WITHIN` s."""
    deadline = time.monotonic() + SEEN_WITHIN
    while (got := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert expected == got, what


def reads(ledger: Ledger) -> tuple[str, ...]:
    return summary(ledger.entries(NODE))


def assert_holds(store: Store, expected: tuple[str, ...]) -> None:
    """The store holds ``expected`` on the node; replica A reads it at once, replica B
    once its watch has seen it."""
    assert expected == summary(store.held(NODE))
    assert expected == summary(store.ledger.entries(NODE))
    assert expected == summary(store.ledger.all_entries())
    eventually(functools.partial(reads, store.other), expected, "replica B's read")


def write(store: Store, *entries: LedgerEntry) -> None:
    """Seeds the node with exactly ``entries``."""
    store.ledger.update(NODE, lambda _: (entries, None))


def adding(new: LedgerEntry, seen: list[tuple[str, ...]] | None = None) -> LedgerChange[str]:
    """A change adding ``new``; records the entries of each call in ``seen``."""

    def change(entries: tuple[LedgerEntry, ...]) -> tuple[tuple[LedgerEntry, ...], str]:
        if seen is not None:
            seen.append(summary(entries))
        return (*entries, new), new.review_uid

    return change


# The node and its pods: "high" borrowed 2 CPUs of "lender" (3 -> 1).
NODE_16 = make_node(NODE).allocatable(cpu="16", memory="32Gi").build()
HIGH_POD = (
    make_pod("high").priority(HIGH).requests(cpu="6", memory="1Gi").started(50).admitted().build()
)


def lender(cpu: str, allocated: str) -> Pod:
    """The lender asking for ``cpu``, the kubelet holding it at ``allocated``."""
    builder = make_pod("lender").priority(LOW).requests(cpu=cpu, memory="1Gi").started(100)
    return builder.holding(cpu=allocated, memory="1Gi").build()


LENT = lender("1", "1")
RETURNING = lender("3", "1")  # given back, the kubelet has not allocated it yet
BACK = lender("3", "3")  # given back and allocated: the loan ended
LOAN = Loan(LENT.ref, LOW, "app", "cpu", 3000, 1000, 2000)


def loan_entry(*, expired: bool = True, victims: Sequence[str] = ()) -> LedgerEntry:
    return entry("r-loan", "high", expired=expired, victims=victims, loans=(LOAN,))


def resizing(name: str) -> tuple[Pod, Pod]:
    """``name`` resizing from half a CPU to one."""
    builder = make_pod(name).requests(cpu="500m", memory="1Gi").started(200).admitted()
    return builder.resize(cpu="1", memory="1Gi")


@dataclass(frozen=True)
class Resize:
    """A :class:`~webhook.engine.changes.Planner`: ``pod``'s resize from ``old`` as a
    review, planned by the decision core on :data:`NODE_16` among ``others``."""

    old: Pod
    pod: Pod
    others: tuple[Pod, ...]
    review_uid: str
    now: float
    review: bool = True

    def plan(self, holders: Sequence[LedgerEntry]) -> Plan:
        reservations = [e.reservation() for e in holders]
        return plan(
            self.old, self.pod, NODE_16, self.others, reservations=reservations, now=self.now
        )

    def reserves(self, plan: Plan) -> bool:
        return plan.verdict in ("fits", "preempt")

    def entry(self, plan: Plan) -> LedgerEntry:
        return LedgerEntry.for_plan(
            self.pod, plan, review_uid=self.review_uid, now=self.now, ttl=TTL
        )


def admit(store: Store, name: str, lent_from: Pod) -> str | None:
    """Admits ``name``'s resize (review ``r-<name>``) through replica A, on the node of
    "high" and the lender ``lent_from``; the review uid of the entry written."""
    old, new = resizing(name)
    others = (HIGH_POD, lent_from)
    now = time.time()
    change = changes.admit(Resize(old, new, others, f"r-{name}", now), (*others, new), now)
    written = store.ledger.update(NODE, change).entry
    return None if written is None else written.review_uid


# -- 1. a store stores exactly what a change returns ------------------------------------------


@dataclass(frozen=True)
class Stored:
    seed: tuple[LedgerEntry, ...]
    change: Callable[[tuple[LedgerEntry, ...]], tuple[tuple[LedgerEntry, ...] | None, str]]
    expected: tuple[str, ...]
    writes: bool = True


def _without(review: str) -> LedgerChange[str]:
    return lambda entries: (tuple(e for e in entries if e.review_uid != review), "dropped")


STORED = [
    pytest.param(
        lambda: Stored(
            (),
            lambda _: ((entry("r-live"), entry("r-old", expired=True)), "both"),
            ("r-live", "r-old"),
        ),
        id="expired-entries-returned-are-kept",
    ),
    pytest.param(
        lambda: Stored(
            (entry("r-1"), entry("r-2", expired=True), entry("r-3")),
            _without("r-1"),
            ("r-2", "r-3"),
        ),
        id="only-what-the-change-drops-goes",
    ),
    pytest.param(lambda: Stored((entry("r-1"),), lambda _: ((), "emptied"), ()), id="emptied"),
    pytest.param(
        lambda: Stored((entry("r-1", expired=True),), lambda _: (None, "none"), ("r-1",), False),
        id="none-writes-nothing",
    ),
]


@pytest.mark.parametrize("case", STORED)
def test_a_store_stores_exactly_what_a_change_returns(
    store: Store, case: Callable[[], Stored]
) -> None:
    c = case()
    write(store, *c.seed)
    before = store.version(NODE)

    result = store.ledger.update(NODE, c.change)

    assert c.change(c.seed)[1] == result
    assert c.writes == (before != store.version(NODE))
    assert_holds(store, c.expected)


# -- 2. the keep rule through the lifecycle's changes ------------------------------------------


@dataclass(frozen=True)
class Kept:
    seed: tuple[LedgerEntry, ...]
    change: LedgerChange[Any]
    expected: tuple[str, ...]


KEPT = [
    pytest.param(
        lambda now: Kept(
            (entry("r-1"), entry("r-2")), changes.release("r-1", (LENT,), now), ("r-2",)
        ),
        id="release-drops-an-entry-without-loans",
    ),
    pytest.param(
        lambda now: Kept(
            (loan_entry(expired=False, victims=["v1"]),),
            changes.release("r-loan", (HIGH_POD, LENT), now),
            ("r-loan",),
        ),
        id="release-keeps-an-entry-owing-a-loan-without-its-victims",
    ),
    pytest.param(
        lambda now: Kept(
            (entry("r-1", victims=["v1", "v2"]), entry("r-old", expired=True)),
            changes.drop_victims("r-1", [uid("v1")], (LENT,), now),
            ("r-1[v2]",),
        ),
        id="drop-victims-and-the-expired-entry",
    ),
    pytest.param(
        lambda now: Kept(
            (entry("r-1"), entry("r-old", expired=True), loan_entry()),
            changes.tidy((HIGH_POD, LENT), now),
            ("r-1", "r-loan"),
        ),
        id="tidy-keeps-an-expired-entry-whose-loan-is-lent",
    ),
    pytest.param(
        lambda now: Kept(
            (entry("r-1"), loan_entry()),
            changes.tidy((HIGH_POD, RETURNING), now),
            ("r-1", "r-loan"),
        ),
        id="tidy-keeps-an-expired-entry-whose-loan-is-returning",
    ),
    pytest.param(
        lambda now: Kept(
            (entry("r-1"), loan_entry()),
            changes.tidy((HIGH_POD, BACK), now),
            ("r-1",),
        ),
        id="tidy-drops-it-once-the-loan-ended",
    ),
]


@pytest.mark.parametrize("case", KEPT)
def test_the_store_holds_what_the_keep_rule_keeps(
    store: Store, case: Callable[[float], Kept]
) -> None:
    c = case(time.time())
    write(store, *c.seed)

    store.ledger.update(NODE, c.change)

    assert_holds(store, c.expected)


def test_an_expired_entry_owing_a_loan_outlives_admissions_until_the_loan_ends(
    store: Store,
) -> None:
    write(store, loan_entry(), entry("r-old", expired=True))

    assert "r-other" == admit(store, "other", LENT)
    assert_holds(store, ("r-loan", "r-other"))

    assert "r-third" == admit(store, "third", BACK)
    assert_holds(store, ("r-other", "r-third"))


# -- 3. conflicts ---------------------------------------------------------------------------


def test_two_writers_at_once_both_land(store: Store) -> None:
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def add(ledger: Ledger, review: str) -> None:
        try:
            barrier.wait(timeout=30)
            ledger.update(NODE, adding(entry(review)))
        except BaseException as e:
            errors.append(e)

    threads = [
        threading.Thread(target=add, args=(store.ledger, "r-a")),
        threading.Thread(target=add, args=(store.other, "r-b")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)

    assert [] == errors
    assert ("r-a", "r-b") == summary(store.held(NODE))
    for replica in (store.ledger, store.other):
        eventually(functools.partial(reads, replica), ("r-a", "r-b"), "both replicas' reads")


def test_a_change_is_applied_again_to_the_entries_another_writer_left(store: Store) -> None:
    write(store, entry("r-first"))
    store.stop_watch()  # A's cache keeps r-first alone from here on
    store.other.update(NODE, adding(entry("r-b")))
    seen: list[tuple[str, ...]] = []

    store.ledger.update(NODE, adding(entry("r-a"), seen))

    assert store.calls_when_stale == len(seen)
    assert ("r-b", "r-first") == seen[-1]
    assert ("r-a", "r-b", "r-first") == summary(store.held(NODE))


# -- 4. a deleted Lease ---------------------------------------------------------------------


def test_a_deleted_lease_is_created_again(store: Store) -> None:
    write(store, entry("r-old"))
    store.delete(NODE)
    eventually(lambda: store.ledger.entries(NODE), (), "replica A to see the delete")

    assert "r-new" == store.ledger.update(NODE, adding(entry("r-new")))

    assert_holds(store, ("r-new",))


def test_a_write_from_a_cache_that_missed_the_delete_stores_what_it_returned(
    store: Store,
) -> None:
    write(store, entry("r-old"))
    store.stop_watch()
    store.delete(NODE)
    returned: list[tuple[str, ...]] = []

    def change(entries: tuple[LedgerEntry, ...]) -> tuple[tuple[LedgerEntry, ...], None]:
        new = (*entries, entry("r-new"))
        returned.append(summary(new))
        return new, None

    store.ledger.update(NODE, change)

    assert returned[-1] == summary(store.held(NODE))
    assert returned[-1] == summary(store.ledger.entries(NODE))
    assert "r-new" in returned[-1]


# -- 5. a node whose entries do not fit one Lease ----------------------------------------------


def sized(size: int) -> LedgerEntry:
    """An entry whose :func:`encode_entries` takes exactly ``size`` bytes (its victims
    fill it; the first victim's name is padded to the byte)."""
    bare = entry("r-big")
    empty = len(encode_entries([bare]))
    # Each victim after the first takes its JSON and a comma.
    one = len(encode_entries([bare.with_victims([ref("v-00000")])])) - empty
    victims = [ref(f"v-{i:05d}") for i in range((size - empty) // (one + 1))]
    short = size - len(encode_entries([bare.with_victims(victims)]).encode())
    first = victims[0]
    victims[0] = PodRef(first.namespace, first.name + "x" * short, first.uid)
    big = bare.with_victims(victims)
    assert size == len(encode_entries([big]).encode())
    return big


def test_entries_of_exactly_max_node_bytes_are_written(store: Store) -> None:
    big = sized(MAX_NODE_BYTES)

    store.ledger.update(NODE, lambda _: ((big,), None))

    assert (big,) == store.held(NODE)
    assert (big,) == store.ledger.entries(NODE)


def test_entries_over_max_node_bytes_raise_ledger_full_and_write_nothing(store: Store) -> None:
    write(store, entry("r-small"))
    before = store.version(NODE)
    big = sized(MAX_NODE_BYTES + 1)

    with pytest.raises(LedgerFull, match=f"node {NODE} "):
        store.ledger.update(NODE, lambda entries: ((*entries, big), None))

    assert before == store.version(NODE)
    assert_holds(store, ("r-small",))


# -- 6. untidy ------------------------------------------------------------------------------


def test_a_fresh_node_is_not_untidy(store: Store) -> None:
    assert frozenset() == store.ledger.untidy()

    write(store, entry("r-1"))
    assert_holds(store, ("r-1",))

    assert frozenset() == store.ledger.untidy()
    assert frozenset() == store.other.untidy()
