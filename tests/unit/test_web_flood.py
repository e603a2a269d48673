"""Overload: how late the worker's event loop runs (LoopDelay), the mark it puts on each
request, the app's answer while it is set, and the quick variant of the review flood
(``python -m bench flood``: 4 times saturation against one replica)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

import gevent
import orjson
import pytest

from harness import flood
from harness.doubles import InMemoryLedger
from tests.unit.web_fixtures import dumps, walkthrough_review, walkthrough_view
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.engine.admission import response
from webhook.kube.errors import Conflict
from webhook.web import worker
from webhook.web.app import OVERLOADED, OVERLOADED_WARNING, create_app
from webhook.web.worker import (
    HandshakeDeadline,
    LoopDelay,
    is_overloaded,
    mark_overload,
    reset,
)

# --- LoopDelay ----------------------------------------------------------------------------


@dataclass
class Clock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class DelayCase:
    id: str
    #: Seconds late of each wake-up of the probe (every 0.05 s), in order.
    wakes: tuple[float, ...]
    #: Seconds after the last wake-up (or the start) at which the delay is read.
    read_after: float
    expected: float


DELAY_CASES = [
    DelayCase("punctual-probe-reads-zero", wakes=(0.0, 0.0), read_after=0.01, expected=0.0),
    DelayCase("asleep-not-due-yet", wakes=(), read_after=0.03, expected=0.0),
    DelayCase("overdue-probe-counts-the-overdue-time", wakes=(), read_after=0.55, expected=0.5),
    DelayCase("one-late-wake-is-a-busy-moment", wakes=(0.0, 0.3), read_after=0.01, expected=0.0),
    DelayCase("late-wakes-in-a-row-are-a-queue", wakes=(0.2, 0.3), read_after=0.01, expected=0.2),
    DelayCase("a-punctual-wake-ends-it", wakes=(0.2, 0.3, 0.0), read_after=0.01, expected=0.0),
]


@pytest.mark.parametrize("case", DELAY_CASES, ids=[c.id for c in DELAY_CASES])
def test_loop_delay(case: DelayCase) -> None:
    clock = Clock()
    delay = LoopDelay(interval=0.05, clock=clock)
    for late in case.wakes:
        clock.now += 0.05 + late
        delay.woke()
    clock.now += case.read_after
    assert case.expected == pytest.approx(delay.current())


@dataclass(frozen=True)
class OverloadCase:
    id: str
    delay: float
    shed_delay: float
    connections: int
    expected: bool


OVERLOAD_CASES = [
    OverloadCase("late-with-a-queue-of-connections", 0.2, 0.1, 26, True),
    OverloadCase("on-time", 0.05, 0.1, 200, False),
    OverloadCase("late-but-no-more-connections-than-kept-idle", 2.0, 0.1, 25, False),
    OverloadCase("zero-switches-it-off", 10.0, 0.0, 1000, False),
]


@pytest.mark.parametrize("case", OVERLOAD_CASES, ids=[c.id for c in OVERLOAD_CASES])
def test_is_overloaded(case: OverloadCase) -> None:
    assert case.expected is is_overloaded(case.delay, case.shed_delay, case.connections)


@pytest.mark.parametrize("overloaded", [True, False])
def test_mark_overload_tells_the_app(overloaded: bool) -> None:
    seen: dict[str, Any] = {}

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        seen.update(environ)
        return []

    mark_overload(app, lambda: overloaded)({}, None)  # type: ignore[arg-type]
    assert overloaded is seen[OVERLOADED]


# --- new connections while overloaded -------------------------------------------------------


def test_reset_is_seen_by_the_peer_at_once() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname(), timeout=2)
        accepted, _ = listener.accept()
        reset(accepted)
        with pytest.raises(ConnectionResetError):
            client.recv(1)
        client.close()


@dataclass
class Serving:
    busy: bool
    refused: list[socket.socket]

    def overloaded(self) -> bool:
        return self.busy

    def refuse(self, sock: socket.socket) -> None:
        self.refused.append(sock)


class NoTLS:
    def context(self) -> Any:
        raise AssertionError("an overloaded worker must not start a handshake")


def test_an_overloaded_worker_refuses_a_new_connection_before_its_handshake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    serving = Serving(busy=True, refused=[])
    monkeypatch.setattr(worker, "_serving", serving)
    a, b = socket.socketpair()
    with pytest.raises(gevent.GreenletExit):
        HandshakeDeadline(NoTLS(), timeout=1.0).wrap_socket(a)  # type: ignore[arg-type]
    assert [a] == serving.refused
    b.close()
    a.close()


# --- the app's answer while overloaded ------------------------------------------------------


def post(app: Any, path: str, body: bytes, overloaded: bool) -> Any:
    return app.test_client().post(
        path,
        data=body,
        content_type="application/json",
        environ_overrides={OVERLOADED: overloaded},
    )


@pytest.mark.parametrize("path", ["/validate-resize", "/mutate-resize"], ids=["validate", "mutate"])
def test_overloaded_review_is_allowed_at_once_without_a_decision(path: str) -> None:
    ledger, metrics = InMemoryLedger(), Metrics()
    app = create_app(Config(), cluster=walkthrough_view(), ledger=ledger, metrics=metrics)
    answer = post(app, path, dumps(walkthrough_review(uid="flooded")), overloaded=True)
    assert 200 == answer.status_code
    expected = {
        "uid": "flooded",
        "allowed": True,
        "warnings": [OVERLOADED_WARNING],
        "auditAnnotations": {"verdict": "overloaded"},
    }
    assert expected == orjson.loads(answer.data)["response"]
    assert () == ledger.all_entries()  # no room taken, nobody preempted
    endpoint = path.strip("/").split("-")[0]
    labels = {"endpoint": endpoint, "verdict": "overloaded"}
    registry = metrics.registry
    assert 1.0 == registry.get_sample_value("resize_preemption_reviews_total", labels)


def test_not_overloaded_the_review_is_decided() -> None:
    ledger = InMemoryLedger()
    app = create_app(Config(), cluster=walkthrough_view(), ledger=ledger)
    answer = post(app, "/validate-resize", dumps(walkthrough_review()), overloaded=False)
    assert "preempt" == orjson.loads(answer.data)["response"]["auditAnnotations"]["verdict"]
    assert 1 == len(ledger.all_entries())


@pytest.mark.parametrize(
    ("body", "status"),
    [(b"not json", 400), (dumps({"kind": "AdmissionReview"}), 400)],
    ids=["not-json", "no-request"],
)
def test_overloaded_bad_input_still_gets_its_400(body: bytes, status: int) -> None:
    app = create_app(Config(), cluster=walkthrough_view(), ledger=InMemoryLedger())
    answer = post(app, "/validate-resize", body, overloaded=True)
    assert status == answer.status_code
    assert "error" in orjson.loads(answer.data)


def test_overloaded_probes_are_served_as_ever() -> None:
    app = create_app(Config(), cluster=walkthrough_view(), ledger=InMemoryLedger())
    answer = app.test_client().get("/readyz", environ_overrides={OVERLOADED: True})
    assert 200 == answer.status_code


# --- how the flood's client judges an answer -----------------------------------------------


class _UnreachableLedger(InMemoryLedger):
    """A ledger whose writes fail as the Lease's do when the API server gives up."""

    def update(self, node: str, change: Any) -> Any:
        raise Conflict("ledger for node node-1: gave up after 8 conflicting writes", status=409)


@dataclass(frozen=True)
class AnswerCase:
    id: str
    #: The app's answer: decided, overloaded, or failed open (its ledger write refused).
    answer: str
    verdicts: tuple[str, ...]
    expected: tuple[str, str | None]
    uid: str = "flooded"
    status: int = 200


ANSWER_CASES = [
    AnswerCase("decided", "decided", ("preempt",), ("full", "preempt")),
    AnswerCase("decided-one-of-several", "decided", ("fits", "preempt"), ("full", "preempt")),
    AnswerCase("decided-otherwise-is-wrong", "decided", ("fits",), ("wrong answer", None)),
    AnswerCase("overload-answer", "overloaded", ("preempt",), ("overloaded", None)),
    AnswerCase("ledger-write-failed-open", "failed open", ("preempt",), ("failed open", None)),
    AnswerCase("another-reviews-uid", "decided", ("preempt",), ("wrong uid", None), uid="other"),
    AnswerCase("server-error", "decided", ("preempt",), ("http 500", None), status=500),
]


@pytest.mark.parametrize("case", ANSWER_CASES, ids=[c.id for c in ANSWER_CASES])
def test_the_flood_client_tells_answers_apart(case: AnswerCase) -> None:
    ledger = _UnreachableLedger() if case.answer == "failed open" else InMemoryLedger()
    app = create_app(Config(), cluster=walkthrough_view(), ledger=ledger)
    body = dumps(walkthrough_review(uid="flooded"))
    answer = post(app, "/validate-resize", body, overloaded=case.answer == "overloaded")
    assert 200 == answer.status_code
    outcome = flood.classify(case.status, answer.data, case.uid.encode(), case.verdicts)
    assert case.expected == outcome


def test_the_flood_client_counts_a_denial_as_wrong() -> None:
    denied = dumps(response("admission.k8s.io/v1", "flooded", allowed=False, message="no"))
    assert ("wrong answer", None) == flood.classify(200, denied, b"flooded", ("preempt",))


# --- the flood, quick variant -------------------------------------------------------------


@pytest.mark.solo
def test_review_flood_quick() -> None:
    """4 times saturation for a few seconds against one replica with its defaults: it
    survives, no 5xx, every answer is the full decision or the overload answer, memory
    stays bounded, and most reviews are answered (or refused at once) within the API
    server's timeout; afterwards reviews are decided in full again. Whether the overload
    answer is needed depends on how far the client, on the same cores, gets past
    saturation: the tests above show what it does when it is."""
    result = flood.run(seconds=5.0, factor=4.0, both=False)
    (run,) = result["runs"]
    counts = run["counts"]
    assert run["worker_alive"], run
    assert 0 == run["server_errors_5xx"], run
    assert set(counts) <= {"full", "overloaded", "timed out", "connection error"}, run
    # Without the protection 85 to 93% time out (docs/reliability.md); the bound, half,
    # leaves room for the client, on the same cores, being starved in turn when other
    # work loads the machine.
    assert counts.get("timed out", 0) <= 0.5 * run["offered"], run
    assert run["worker_rss_mb"]["after"] - run["worker_rss_mb"]["before"] < 100, run
    after = run["after_flood"]
    # Decided in full again (a busy moment of the shared machine may still shed one).
    assert after.get("full", 0) >= 0.9 * sum(after.values()) > 0, run
