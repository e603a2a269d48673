"""The harness's fault points: which ones a ledger write and an eviction reach, in order."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.doubles import InMemoryLedger
from harness.fault_hooks import Fault, FaultEvictor, FaultLedger, fault_hooks
from tests.unit.test_worker_logic import NOW, entry, ref
from webhook.engine.hooks import Hooks
from webhook.engine.ledger import EvictionResult, LedgerChange, LedgerEntry
from webhook.engine.lifecycle.changes import drop_victims, release


@dataclass
class Points:
    """Stands in for a Fault: records the points reached instead of killing anyone."""

    reached_in_order: list[str] = field(default_factory=list)

    def reached(self, point: str) -> None:
        self.reached_in_order.append(point)


def add(new: LedgerEntry) -> LedgerChange[None]:
    return lambda entries: ((*entries, new), None)


@pytest.mark.parametrize(
    ("change", "points"),
    [
        pytest.param(
            add(entry("low", review="review-2")),
            ["ledger-before", "ledger-write", "admitted"],
            id="a-new-entry-is-an-admission",
        ),
        pytest.param(
            drop_victims("review-1", ("uid-low",), (), NOW),
            ["ledger-before", "ledger-write"],
            id="a-drop-is-a-write",
        ),
        pytest.param(
            release("review-1", (), NOW), ["ledger-before", "ledger-write"], id="a-release"
        ),
        pytest.param(release("nobody", (), NOW), [], id="no-change-writes-nothing"),
    ],
)
def test_ledger_points(change: LedgerChange[object], points: list[str]) -> None:
    store = InMemoryLedger()
    store.update("node-1", add(entry("low")))
    seen = Points()

    FaultLedger(store, seen).update("node-1", change)  # type: ignore[arg-type]

    assert points == seen.reached_in_order


def test_an_eviction_is_a_point_after_the_call() -> None:
    seen = Points()

    class Evictor:
        def evict(self, *_: object, **__: object) -> EvictionResult:
            seen.reached("call")
            return EvictionResult.EVICTED

    result = FaultEvictor(Evictor(), seen).evict(ref("low"), ref("high"), "node-1")  # type: ignore[arg-type]

    assert (EvictionResult.EVICTED, ["call", "evicted"]) == (result, seen.reached_in_order)


def test_nothing_armed_keeps_the_service_as_built() -> None:
    assert Hooks() == fault_hooks({})
    store = InMemoryLedger()
    armed = fault_hooks({"RPW_FAULT_FILE": "/nonexistent/{identity}"})
    assert isinstance(armed.ledger(store, "replica-0"), FaultLedger)


def test_a_paused_point_holds_its_thread_until_the_marker_is_removed(tmp_path: Path) -> None:
    armed = tmp_path / "replica-0"
    armed.write_text("evicted:2:pause")
    fault = Fault(path=str(armed))
    marker = Path(f"{armed}.paused")

    fault.reached("evicted")  # the first arrival passes
    assert not marker.exists()
    held = threading.Thread(target=fault.reached, args=("evicted",))
    held.start()
    deadline = time.monotonic() + 5
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)

    assert ("evicted", True, False) == (marker.read_text(), held.is_alive(), armed.exists())
    marker.unlink()
    held.join(2)
    assert not held.is_alive()
