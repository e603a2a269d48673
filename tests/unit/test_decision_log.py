"""What follows an answer: counting the review and its decision-log line, now or from a
background thread (the backlog)."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

import pytest

from tests.unit.web_fixtures import walkthrough_review, walkthrough_view
from webhook.engine.admission import AdmissionEngine
from webhook.engine.backlog import Backlog
from webhook.engine.config import Config
from webhook.engine.ledger import InMemoryLedger

LOGGER = "webhook.decisions"


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def reviews_counted(engine: AdmissionEngine) -> float:
    value = engine.metrics.registry.get_sample_value(
        "rpw_admission_reviews_total", {"endpoint": "validate", "verdict": "preempt"}
    )
    return value or 0.0


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


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
    assert 1.0 == engine.metrics.registry.get_sample_value("rpw_victims_planned_total")
    [line] = logged(caplog)
    assert (review["uid"], "preempt", True) == (
        json.loads(line)["uid"],
        json.loads(line)["verdict"],
        json.loads(line)["reserved"],
    )


# -- the backlog ----------------------------------------------------------------------------


def test_a_backlog_runs_jobs_in_order_from_its_thread() -> None:
    backlog = Backlog(interval=0.01, name="after-review")
    ran: list[tuple[int, str]] = []

    def job(i: int) -> None:
        ran.append((i, threading.current_thread().name))

    backlog.start()
    for i in range(50):
        backlog.submit(job, i)
    wait_for(lambda: len(ran) == 50)
    backlog.stop()

    assert list(range(50)) == [i for i, _ in ran]
    assert {"after-review"} == {name for _, name in ran}


def test_stop_runs_what_is_pending() -> None:
    # An interval no test waits for: only stop() can have run the jobs.
    backlog = Backlog(interval=3600)
    ran: list[str] = []

    backlog.start()
    backlog.submit(ran.append, "a")
    backlog.submit(ran.append, "b")
    backlog.stop()

    assert ["a", "b"] == ran


def test_past_the_limit_jobs_are_dropped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    backlog = Backlog(limit=2, name="after-review")
    ran: list[str] = []

    with caplog.at_level(logging.WARNING):
        for x in "abcde":
            backlog.submit(ran.append, x)
        backlog.stop()

    assert ["a", "b"] == ran
    assert ["after-review behind: 3 jobs dropped"] == [r.getMessage() for r in caplog.records]


def test_a_failing_job_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    backlog = Backlog(interval=0.01)
    ran: list[str] = []

    def job(x: str) -> None:
        if x == "bad":
            raise ValueError("cannot")
        ran.append(x)

    with caplog.at_level(logging.ERROR):
        backlog.start()
        for x in ("a", "bad", "c"):
            backlog.submit(job, x)
        wait_for(lambda: len(ran) == 2)
        backlog.submit(job, "d")
        wait_for(lambda: len(ran) == 3)
        backlog.stop()

    assert ["a", "c", "d"] == ran
    assert 1 == len([r for r in caplog.records if "a job failed" in r.getMessage()])
