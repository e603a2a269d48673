"""How :class:`webhook.kube.checkpoints.ConfigMapCheckpoints` reads: abilities, read by
reviews, never wait on a list for long; records, read by the leader's worker, are listed
again when old or written since. The list is a stand-in the test holds and releases; the
ConfigMaps' contract against the real API server is tests/e2e/test_checkpoint_store_contract.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from webhook.core.checkpoint import NodeCheckpointing, Phase
from webhook.kube import checkpoints
from webhook.kube.checkpoints import ABILITY_WAIT, ConfigMapCheckpoints
from webhook.kube.errors import ClusterError

NODE = "node-1"


def _ability(node: str, able: bool) -> dict[str, Any]:
    value = "true" if able else "false"
    return {
        "metadata": {"name": f"rpw-node-{node}", "labels": {"resize-preemption.io/node": node}},
        "data": {"checkpoint": value, "restore": value},
    }


def _record(uid: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"rpw-checkpoint-{uid}",
            "labels": {
                "resize-preemption.io/checkpoint": "true",
                "resize-preemption.io/node": NODE,
            },
        },
        "data": {"phase": "imaged", "pod": "{}"},
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


def _store(lister: Lister, clock: Clock) -> ConfigMapCheckpoints:
    return ConfigMapCheckpoints(None, "rpw", max_age=1.0, clock=clock, lister=lister)


def _timed(read: Any) -> tuple[Any, float]:
    start = time.monotonic()
    value = read()
    return value, time.monotonic() - start


def _settled(store: ConfigMapCheckpoints) -> None:
    """Waits for the list in flight, as the next review would find it done."""
    assert store._idle.wait(5)


def test_a_review_reads_abilities_at_once_while_a_list_is_in_flight(lister: Lister) -> None:
    clock = Clock()
    store = _store(lister, clock)
    assert NodeCheckpointing(NODE, True, True) == store.capability(NODE)  # the first list
    _settled(store)
    lister.items = [_ability(NODE, False)]
    lister.hold()
    clock.now += 2  # older than max_age

    found, took = _timed(lambda: store.capability(NODE))

    assert NodeCheckpointing(NODE, True, True) == found  # the last list's answer
    assert took < ABILITY_WAIT
    assert 2 == lister.calls  # and a list started
    lister.released.set()
    _settled(store)
    assert NodeCheckpointing(NODE, False, False) == store.capability(NODE)


def test_abilities_younger_than_max_age_start_no_list(lister: Lister) -> None:
    clock = Clock()
    store = _store(lister, clock)
    store.capability(NODE)
    _settled(store)
    clock.now += 0.5

    store.capabilities()
    store.capability("node-2")

    assert 1 == lister.calls


def test_a_review_waits_at_most_a_moment_for_a_first_list(lister: Lister) -> None:
    lister.hold()  # the API server does not answer
    store = _store(lister, Clock())

    found, took = _timed(lambda: store.capability(NODE))

    assert None is found
    assert ABILITY_WAIT <= took < ABILITY_WAIT + 0.5


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(ClusterError("HTTP 503"), id="the-api-server-refuses"),
        pytest.param(RuntimeError("a bug"), id="anything-else"),
    ],
)
def test_a_failed_list_keeps_the_last_and_is_tried_again_later(
    lister: Lister, failure: Exception
) -> None:
    clock = Clock()
    store = _store(lister, clock)
    store.capability(NODE)
    _settled(store)
    lister.failure = failure
    clock.now += 2

    store.capability(NODE)
    _settled(store)
    kept = store.capability(NODE)  # within max_age of the failed try: no list

    assert NodeCheckpointing(NODE, True, True) == kept
    assert 2 == lister.calls
    lister.failure = None
    clock.now += 2
    store.capability(NODE)
    _settled(store)
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
    store.capability(NODE)
    _settled(store)
    clock.now += 2
    lister.hold()
    store.capability(NODE)  # a review's list, in flight
    assert store.write(checkpoints.CheckpointRecord("u-1", NODE, Phase.IMAGED, {}))
    lister.items = [_ability(NODE, True), _record("u-1")]

    lister.released.set()
    found = store.records()

    assert ["u-1"] == [r.uid for r in found]
    assert 3 == lister.calls  # the first, the review's, and the worker's own after the write


def test_a_replica_is_ready_only_once_the_abilities_were_listed(lister: Lister) -> None:
    lister.hold()  # the API server has not answered yet
    store = _store(lister, Clock())
    assert False is store.synced()  # and the first call started the list
    assert 1 == lister.calls
    assert False is store.synced()  # the list in flight is not started again
    assert 1 == lister.calls
    lister.released.set()
    _settled(store)
    assert True is store.synced()
    assert NodeCheckpointing(NODE, True, True) == store.capability(NODE)


def test_a_replica_whose_list_failed_is_not_ready(lister: Lister) -> None:
    clock = Clock()
    lister.failure = ClusterError("the API server is away")
    store = _store(lister, clock)
    assert False is store.synced()
    _settled(store)
    assert False is store.synced()
    clock.now += 2  # the next list is tried max_age later
    lister.failure = None
    store.synced()
    _settled(store)
    assert True is store.synced()
