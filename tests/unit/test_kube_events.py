"""Event shapes and limits (no API server needed)."""

from __future__ import annotations

from webhook.core.model import PodRef
from webhook.kube.events import (
    NOTE_LIMIT,
    EventRecorder,
    abandoned_note,
    micro_time,
    truncate_note,
)


def test_micro_time_always_has_six_fractional_digits() -> None:
    assert micro_time(1_700_000_000.0) == "2023-11-14T22:13:20.000000Z"
    assert micro_time(1_700_000_000.25) == "2023-11-14T22:13:20.250000Z"


def test_truncation_counts_bytes_and_never_splits_a_character() -> None:
    note = "é" * 1000  # 2000 bytes
    cut = truncate_note(note)
    assert len(cut.encode()) <= NOTE_LIMIT
    assert cut.endswith(" ...")
    assert cut[:-4] == "é" * len(cut[:-4])
    assert truncate_note("short") == "short"


def test_abandoned_note_names_the_victims_left_alone() -> None:
    victims = [PodRef("default", "low-priority-pod", "u1")]
    assert (
        "Stopped preempting on node-1 for this resize (reservation expired 0.5s ago); "
        "not evicted: default/low-priority-pod"
    ) == abandoned_note(victims, "node-1", "reservation expired 0.5s ago")
    two = [*victims, PodRef("batch", "job-1", "u2")]
    assert abandoned_note(two, "node-1", "x").endswith("default/low-priority-pod, batch/job-1")
    assert abandoned_note([], "node-1", "x").endswith("not evicted: none")


def test_the_preempted_event_matches_upstream() -> None:
    recorder = EventRecorder(
        None, controller="resize-preemption-webhook", instance="replica-1", clock=lambda: 5.5
    )
    victim = PodRef("default", "low", "uid-low")
    preemptor = PodRef("default", "high", "uid-high")
    body = recorder.event_body(
        victim,
        related=preemptor,
        type_="Normal",
        reason="Preempted",
        action="Preempting",
        note="Preempted by pod uid-high on node node-1",
    )
    assert body == {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": f"low.{int(5.5e9):x}", "namespace": "default"},
        "eventTime": "1970-01-01T00:00:05.500000Z",
        "reportingController": "resize-preemption-webhook",
        "reportingInstance": "replica-1",
        "action": "Preempting",
        "reason": "Preempted",
        "regarding": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": "default",
            "name": "low",
            "uid": "uid-low",
        },
        "related": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": "default",
            "name": "high",
            "uid": "uid-high",
        },
        "note": "Preempted by pod uid-high on node node-1",
        "type": "Normal",
    }
    # Two events in the same nanosecond still get distinct names.
    again = recorder.event_body(
        victim, related=None, type_="Normal", reason="r", action="a", note="n"
    )
    assert again["metadata"]["name"] != body["metadata"]["name"]


class _Recording(EventRecorder):
    def __init__(self) -> None:
        super().__init__(None, controller="resize-preemption-webhook", instance="replica-1")
        self.sent: list[tuple[str, str, str, str]] = []

    def record(self, regarding: PodRef, **event: object) -> bool:  # type: ignore[override]
        self.sent.append(
            (regarding.name, str(event["type_"]), str(event["reason"]), str(event["note"]))
        )
        return True


def test_a_malformed_floor_is_told_once_per_pod_and_message() -> None:
    recorder = _Recording()
    batch = PodRef("default", "batch-1", "uid-batch")
    message = "annotation resize-preemption.io/floor: not JSON"

    recorder.floor_errors([(batch, message)])
    recorder.floor_errors([(batch, message), (batch, "another message")])

    assert [
        ("batch-1", "Warning", "InvalidLendingFloor", f"{message}; this pod lends nothing"),
        ("batch-1", "Warning", "InvalidLendingFloor", "another message; this pod lends nothing"),
    ] == recorder.sent
