"""What follows an answer: counting the review and its decision-log line, now or from a
background thread (the backlog)."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence

import pytest

from harness.doubles import InMemoryLedger
from tests.unit.web_fixtures import walkthrough_review, walkthrough_view
from webhook.base.loop import Backlog, Job
from webhook.base.settings import Config
from webhook.engine import admission
from webhook.engine.admission import AdmissionEngine
from webhook.engine.decision_log import Facts

LOGGER = "webhook.decisions"


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def reviews_counted(engine: AdmissionEngine, *verdicts: str) -> float:
    """Validating reviews counted with any of ``verdicts`` (default: preempt and fits)."""
    registry = engine.metrics.registry
    return sum(
        registry.get_sample_value(
            "resize_preemption_reviews_total", {"endpoint": "validate", "verdict": verdict}
        )
        or 0.0
        for verdict in verdicts or ("preempt", "fits")
    )


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The decision-log lines (a record holds a batch of them)."""
    return [line for r in caplog.records if r.name == LOGGER for line in r.getMessage().split("\n")]


# -- the engine -----------------------------------------------------------------------------


def test_by_default_a_review_is_counted_and_logged_before_it_is_answered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = AdmissionEngine(Config(), walkthrough_view(), InMemoryLedger())
    review = walkthrough_review()["request"]

    with caplog.at_level(logging.INFO, logger=LOGGER):
        engine.validate(review)

    assert 1.0 == reviews_counted(engine)
    [line] = logged(caplog)
    assert review["uid"] == json.loads(line)["uid"]


def test_with_a_backlog_the_review_path_only_queues(caplog: pytest.LogCaptureFixture) -> None:
    backlog = Backlog()
    engine = AdmissionEngine(Config(), walkthrough_view(), InMemoryLedger(), after=backlog.submit)
    review = walkthrough_review()["request"]

    with caplog.at_level(logging.INFO, logger=LOGGER):
        decision = engine.validate(review)
        assert (0.0, []) == (reviews_counted(engine), logged(caplog))  # not started yet
        backlog.stop()

    assert "preempt" == decision.verdict
    assert 1.0 == reviews_counted(engine)
    assert 1.0 == engine.metrics.registry.get_sample_value(
        "resize_preemption_planned_victims_total"
    )
    [line] = logged(caplog)
    assert (review["uid"], "preempt", True) == (
        json.loads(line)["uid"],
        json.loads(line)["verdict"],
        json.loads(line)["reserved"],
    )


def test_a_batch_is_counted_once_and_logged_as_one_record_of_its_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    backlog = Backlog()
    engine = AdmissionEngine(Config(), walkthrough_view(), InMemoryLedger(), after=backlog.submit)
    uids = [f"review-{i}" for i in range(3)]

    with caplog.at_level(logging.INFO, logger=LOGGER):
        for uid in uids:
            engine.validate({**walkthrough_review()["request"], "uid": uid})
        backlog.stop()

    # The same resize three times, never stored by an API server: each one is planned.
    assert (3.0, 0.0) == (reviews_counted(engine, "preempt"), reviews_counted(engine, "fits"))
    assert 3.0 == engine.metrics.registry.get_sample_value(
        "resize_preemption_planned_victims_total"
    )
    assert 1 == len([r for r in caplog.records if r.name == LOGGER])
    assert uids == [json.loads(line)["uid"] for line in logged(caplog)]


def test_a_line_that_cannot_be_built_costs_only_itself(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    backlog = Backlog()
    engine = AdmissionEngine(Config(), walkthrough_view(), InMemoryLedger(), after=backlog.submit)
    built = admission.line

    def line(facts: Facts, mode: str) -> bytes:
        if facts.decision.uid == "review-1":
            raise ValueError("cannot")
        return built(facts, mode)

    monkeypatch.setattr(admission, "line", line)
    with caplog.at_level(logging.INFO):
        for uid in ("review-0", "review-1", "review-2"):
            engine.validate({**walkthrough_review()["request"], "uid": uid})
        backlog.stop()

    assert 3.0 == reviews_counted(engine)
    assert ["review-0", "review-2"] == [json.loads(line)["uid"] for line in logged(caplog)]
    assert ["decision-log line of review review-1"] == [
        r.getMessage() for r in caplog.records if r.levelno == logging.ERROR
    ]


# -- the backlog ----------------------------------------------------------------------------


def test_a_backlog_runs_jobs_in_order_from_its_thread() -> None:
    backlog = Backlog(interval=0.01, name="after-review")
    ran: list[tuple[int, str]] = []

    def job(batch: Sequence[int]) -> None:
        ran.extend((i, threading.current_thread().name) for i in batch)

    backlog.start()
    for i in range(50):
        backlog.submit(job, i)
    wait_for(lambda: len(ran) == 50)
    backlog.stop()

    assert list(range(50)) == [i for i, _ in ran]
    assert {"after-review"} == {name for _, name in ran}


def test_what_is_queued_goes_to_each_job_as_one_batch_in_order() -> None:
    backlog = Backlog(interval=3600)
    calls: list[tuple[str, list[str]]] = []

    def job(name: str) -> Job:
        return lambda batch: calls.append((name, list(batch)))

    first, second = job("first"), job("second")
    for job_, x in ((first, "a"), (first, "b"), (second, "c"), (first, "d"), (first, "e")):
        backlog.submit(job_, x)
    backlog.stop()

    assert [("first", ["a", "b"]), ("second", ["c"]), ("first", ["d", "e"])] == calls


def test_stop_runs_what_is_pending() -> None:
    # An interval no test waits for: only stop() can have run the jobs.
    backlog = Backlog(interval=3600)
    ran: list[str] = []

    backlog.start()
    backlog.submit(ran.extend, "a")
    backlog.submit(ran.extend, "b")
    backlog.stop()

    assert ["a", "b"] == ran


def test_past_the_limit_jobs_are_dropped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    backlog = Backlog(limit=2, name="after-review")
    ran: list[str] = []

    with caplog.at_level(logging.WARNING):
        for x in "abcde":
            backlog.submit(ran.extend, x)
        backlog.stop()

    assert ["a", "b"] == ran
    assert ["after-review behind: 3 jobs dropped"] == [r.getMessage() for r in caplog.records]


def test_a_failing_job_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    backlog = Backlog(interval=0.01)
    ran: list[str] = []

    def failing(batch: Sequence[str]) -> None:
        raise ValueError("cannot")

    with caplog.at_level(logging.ERROR):
        backlog.start()
        for job, x in ((ran.extend, "a"), (failing, "b"), (ran.extend, "c")):
            backlog.submit(job, x)
        wait_for(lambda: len(ran) == 2)
        backlog.submit(ran.extend, "d")
        wait_for(lambda: len(ran) == 3)
        backlog.stop()

    assert ["a", "c", "d"] == ran
    assert 1 == len([r for r in caplog.records if "a job failed" in r.getMessage()])
