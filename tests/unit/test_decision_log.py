"""The decision log: one line per review, now or from a background thread."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.web_fixtures import walkthrough_review, walkthrough_view
from webhook.engine.admission import AdmissionEngine, Decision
from webhook.engine.config import Config
from webhook.engine.decision_log import BatchedDecisionLog, Facts, ImmediateDecisionLog
from webhook.engine.ledger import InMemoryLedger

LOGGER = "webhook.decisions"


def facts(uid: str) -> Facts:
    return Facts("validate", "default", f"pod-{uid}", False, "enforce", 0.001, Decision(uid))


def logged_uids(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [json.loads(r.getMessage())["uid"] for r in caplog.records if r.name == LOGGER]


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_engine_logs_at_once_by_default(caplog: pytest.LogCaptureFixture) -> None:
    engine = AdmissionEngine(Config(), walkthrough_view(), InMemoryLedger())
    assert isinstance(engine.decisions, ImmediateDecisionLog)
    review = walkthrough_review()["request"]

    with caplog.at_level(logging.INFO, logger=LOGGER):
        engine.validate(review)

    assert [review["uid"]] == logged_uids(caplog)


def test_a_batched_log_writes_nothing_on_the_review_path(
    caplog: pytest.LogCaptureFixture,
) -> None:
    batched = BatchedDecisionLog()
    engine = AdmissionEngine(Config(), walkthrough_view(), InMemoryLedger(), decisions=batched)
    review = walkthrough_review()["request"]

    with caplog.at_level(logging.INFO, logger=LOGGER):
        engine.validate(review)
        assert [] == logged_uids(caplog)  # not started: the line waits
        batched.stop()

    [line] = [json.loads(r.getMessage()) for r in caplog.records if r.name == LOGGER]
    assert (review["uid"], "preempt") == (line["uid"], line["verdict"])


def test_a_batched_log_writes_in_order_from_its_thread(caplog: pytest.LogCaptureFixture) -> None:
    batched = BatchedDecisionLog(interval=0.01)
    uids = [str(i) for i in range(50)]

    with caplog.at_level(logging.INFO, logger=LOGGER):
        batched.start()
        for uid in uids:
            batched.write(facts(uid))
        wait_for(lambda: len(logged_uids(caplog)) == len(uids))
        threads = {r.threadName for r in caplog.records if r.name == LOGGER}
        batched.stop()

    assert uids == logged_uids(caplog)
    assert {"decision-log"} == threads


def test_stop_writes_what_is_pending(caplog: pytest.LogCaptureFixture) -> None:
    # An interval no test waits for: only stop() can have written the lines.
    batched = BatchedDecisionLog(interval=3600)

    with caplog.at_level(logging.INFO, logger=LOGGER):
        batched.start()
        batched.write(facts("a"))
        batched.write(facts("b"))
        batched.stop()

    assert ["a", "b"] == logged_uids(caplog)


def test_past_the_limit_lines_are_dropped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    batched = BatchedDecisionLog(limit=2)

    with caplog.at_level(logging.INFO):
        for uid in "abcde":
            batched.write(facts(uid))
        batched.stop()

    assert ["a", "b"] == logged_uids(caplog)
    assert ["decision log behind: 3 lines dropped"] == [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
    ]


def test_a_line_that_cannot_be_written_does_not_stop_the_others(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from webhook.engine import decision_log

    real = decision_log.record

    def record(f: Facts) -> dict[str, Any]:
        if f.decision.uid == "bad":
            raise ValueError("cannot format")
        return real(f)

    monkeypatch.setattr(decision_log, "record", record)
    batched = BatchedDecisionLog(interval=0.01)

    with caplog.at_level(logging.INFO):
        batched.start()
        for uid in ("a", "bad", "c"):
            batched.write(facts(uid))
        wait_for(lambda: len(logged_uids(caplog)) == 2)
        batched.write(facts("d"))
        wait_for(lambda: len(logged_uids(caplog)) == 3)
        batched.stop()

    assert ["a", "c", "d"] == logged_uids(caplog)
    assert any("review bad" in r.getMessage() for r in caplog.records if r.levelno >= 40)
