"""How :class:`webhook.kube.checkpoints.PodCheckpoints` reads: abilities, read by
reviews, answer the last list the replica's loop took and never wait on one; records, read
by the leader's worker, are listed again when old or written since. The list is a stand-in
the test holds and releases; the store's contract against the real API server is
tests/e2e/test_checkpoint_store_contract.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from webhook.core.checkpoint import CheckpointRecord, NodeCheckpointing, Phase
from webhook.kube import checkpoints
from webhook.kube.checkpoints import PodCheckpoints
from webhook.kube.errors import ClusterError

NODE = "node-1"


def _ability(node: str, able: bool) -> dict[str, Any]:
    value = "true" if able else "false"
    return {
        "kind": "CheckpointNode",
        "metadata": {"name": node},
        "spec": {"node": node},
        "status": {"checkpoint": value, "restore": value},
    }


def _record(uid: str) -> dict[str, Any]:
    return {
        "kind": "PodCheckpoint",
        "metadata": {"name": f"rpw-checkpoint-{uid}"},
        "spec": {"uid": uid, "node": NODE, "pod": {}, "archives": {}},
        "status": {"phase": "imaged"},
    }


class Lister:
    """The API server's list: answers ``items``; while ``held``, waits to be released."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.calls = 0
        self.failure: Exception | None = None
        self.released = threading.Event()
        self.released.set()

    def hold(self) -> None:
        self.released.clear()

    def __call__(self) -> list[dict[str, Any]]:
        self.calls += 1
        self.released.wait(10)
        if self.failure is not None:
            raise self.failure
        return list(self.items)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def lister() -> Iterator[Lister]:
    found = Lister([_ability(NODE, True)])
    yield found
    found.released.set()  # never leave a list thread waiting


def _store(lister: Lister, clock: Clock) -> PodCheckpoints:
    return PodCheckpoints(None, "rpw", max_age=1.0, clock=clock, lister=lister)


def _timed(read: Any) -> tuple[Any, float]:
    start = time.monotonic()
    value = read()
    return value, time.monotonic() - start


def _refreshing(store: PodCheckpoints) -> threading.Thread:
    """The replica's loop, one pass, in a thread of its own (the test may hold the list)."""
    thread = threading.Thread(target=store.refresh, daemon=True)
    thread.start()
    return thread


def test_abilities_answer_the_last_refresh_and_never_list_themselves(lister: Lister) -> None:
    store = _store(lister, Clock())
    store.refresh()
    lister.items = [_ability(NODE, False)]

    assert NodeCheckpointing(NODE, True, True) == store.capability(NODE)
    assert [NodeCheckpointing(NODE, True, True)] == store.capabilities()
    assert None is store.capability("node-2")
    assert 1 == lister.calls
    store.refresh()
    assert NodeCheckpointing(NODE, False, False) == store.capability(NODE)


def test_a_review_never_waits_on_a_list_in_flight(lister: Lister) -> None:
    store = _store(lister, Clock())
    store.refresh()
    lister.items = [_ability(NODE, False)]
    lister.hold()  # the API server is slow to answer the next list
    refreshing = _refreshing(store)

    found, took = _timed(lambda: store.capability(NODE))

    assert NodeCheckpointing(NODE, True, True) == found  # the last list's answer
    assert took < 0.1
    lister.released.set()
    refreshing.join(5)
    assert NodeCheckpointing(NODE, False, False) == store.capability(NODE)


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(ClusterError("HTTP 503"), id="the-api-server-refuses"),
        pytest.param(RuntimeError("a bug"), id="anything-else"),
    ],
)
def test_a_failed_list_keeps_the_last_and_the_next_refresh_tries_again(
    lister: Lister, failure: Exception
) -> None:
    store = _store(lister, Clock())
    store.refresh()
    lister.items = [_ability(NODE, False)]
    lister.failure = failure

    store.refresh()

    assert NodeCheckpointing(NODE, True, True) == store.capability(NODE)
    lister.failure = None
    store.refresh()
    assert NodeCheckpointing(NODE, False, False) == store.capability(NODE)
    assert 3 == lister.calls


def test_records_are_listed_again_before_the_answer_once_old(lister: Lister) -> None:
    clock = Clock()
    store = _store(lister, clock)
    assert [] == list(store.records())
    lister.items = [_record("u-1")]

    clock.now += 0.5
    assert [] == list(store.records())  # younger than max_age
    clock.now += 1
    assert ["u-1"] == [r.uid for r in store.records()]
    assert 2 == lister.calls


def test_records_are_listed_again_after_a_write(
    lister: Lister, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "request_json", lambda *a, **kw: {})
    clock = Clock()
    store = _store(lister, clock)
    store.records()
    record = checkpoints.CheckpointRecord("u-1", NODE, Phase.IMAGED, {})
    lister.items = [_record("u-1")]

    assert store.write(record)

    assert ["u-1"] == [r.uid for r in store.records()]  # at the same moment
    assert 2 == lister.calls


def test_a_list_started_before_a_write_does_not_answer_records_after_it(
    lister: Lister, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "request_json", lambda *a, **kw: {})
    clock = Clock()
    store = _store(lister, clock)
    store.refresh()
    clock.now += 2
    lister.hold()
    refreshing = _refreshing(store)  # the loop's list, in flight
    assert _eventually(lambda: 2 == lister.calls)
    assert store.write(checkpoints.CheckpointRecord("u-1", NODE, Phase.IMAGED, {}))
    lister.items = [_ability(NODE, True), _record("u-1")]

    lister.released.set()
    found = store.records()

    assert ["u-1"] == [r.uid for r in found]
    assert 3 == lister.calls  # the first, the loop's, and the worker's own after the write
    refreshing.join(5)


def test_a_replica_is_ready_only_once_the_abilities_were_listed(lister: Lister) -> None:
    store = _store(lister, Clock())
    assert False is store.synced()
    assert 0 == lister.calls  # readiness lists nothing itself: the loop does
    lister.hold()  # the API server has not answered yet
    refreshing = _refreshing(store)
    assert _eventually(lambda: 1 == lister.calls)
    assert False is store.synced()
    lister.released.set()
    refreshing.join(5)
    assert True is store.synced()
    assert NodeCheckpointing(NODE, True, True) == store.capability(NODE)


def test_a_replica_whose_list_failed_is_not_ready(lister: Lister) -> None:
    lister.failure = ClusterError("the API server is away")
    store = _store(lister, Clock())
    store.refresh()
    assert False is store.synced()
    lister.failure = None
    store.refresh()
    assert True is store.synced()


def _eventually(check: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.01)
    return bool(check())


def test_a_record_created_whose_status_failed_is_deleted_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller evicts the victim as never checkpointed: no record of it may stay."""
    calls: list[str] = []

    def request(api: Any, method: str, path: str, **kw: Any) -> dict[str, Any]:
        calls.append(f"{method} {path.rsplit('/', 1)[-1]}")
        if method == "PATCH":
            raise ClusterError("the API server went away")
        return {}

    monkeypatch.setattr(checkpoints, "request_json", request)
    record = CheckpointRecord("u-1", NODE, Phase.ARCHIVED, {}, {"main": "/a.tar"})

    assert False is PodCheckpoints(None, "rpw", lister=lambda: []).write(record)
    assert ["POST podcheckpoints", "PATCH status", "DELETE rpw-checkpoint-u-1"] == calls
