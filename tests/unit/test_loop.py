"""The engine's loop, its backoff and the runnables the service starts and stops."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from webhook.base.loop import Backoff, KeyedBackoff, Loop, Runnables

T0 = 1_000.0


def doubling(base: float, cap: float) -> Backoff:
    """The preemption worker's policy: doubling, capped, jittered in [50%, 100%]."""
    return Backoff(initial=base, factor=2.0, cap=cap, jitter=(0.5, 1.0))


class FakeClock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# -- Backoff -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BackoffCase:
    """``failures`` failures of one key in a row at T0; ``waits`` is how long each made it
    wait (not_before - T0)."""

    base: float
    cap: float
    jitter: float  # what the random source returns, in [0, 1)
    failures: int
    waits: tuple[float, ...]


BACKOFF_CASES = [
    pytest.param(BackoffCase(1.0, 30.0, 1.0, 1, (1.0,)), id="first-failure-waits-base"),
    pytest.param(BackoffCase(1.0, 30.0, 1.0, 4, (1.0, 2.0, 4.0, 8.0)), id="each-failure-doubles"),
    pytest.param(BackoffCase(1.0, 5.0, 1.0, 5, (1.0, 2.0, 4.0, 5.0, 5.0)), id="capped-at-cap"),
    pytest.param(BackoffCase(2.0, 30.0, 0.0, 2, (1.0, 2.0)), id="jitter-halves-at-most"),
    pytest.param(BackoffCase(2.0, 30.0, 0.5, 1, (1.5,)), id="jitter-in-between"),
    pytest.param(BackoffCase(3.0, 3.0, 1.0, 3, (3.0, 3.0, 3.0)), id="base-equal-to-cap"),
]


@pytest.mark.parametrize("case", BACKOFF_CASES)
def test_backoff_waits(case: BackoffCase) -> None:
    backoff = KeyedBackoff(
        doubling(case.base, case.cap), clock=FakeClock(), rng=lambda: case.jitter
    )

    waits = tuple(backoff.failed("entry") - T0 for _ in range(case.failures))

    assert case.waits == waits


@dataclass(frozen=True)
class ReadyCase:
    """After ``steps`` (``fail:KEY``, ``ok:KEY``, ``reset``, ``retain:K1,K2``, ``+SECONDS``),
    the keys that may be tried now."""

    steps: tuple[str, ...]
    ready: frozenset[str]


READY_CASES = [
    pytest.param(ReadyCase((), frozenset("ab")), id="never-failed-is-ready"),
    pytest.param(ReadyCase(("fail:a",), frozenset("b")), id="failed-waits"),
    pytest.param(ReadyCase(("fail:a", "+0.99"), frozenset("b")), id="not-before-its-time"),
    pytest.param(ReadyCase(("fail:a", "+1"), frozenset("ab")), id="ready-when-the-wait-is-over"),
    pytest.param(
        ReadyCase(("fail:a", "+1", "fail:a", "+1"), frozenset("b")), id="second-wait-is-longer"
    ),
    pytest.param(ReadyCase(("fail:a", "ok:a"), frozenset("ab")), id="success-forgets"),
    pytest.param(
        ReadyCase(("fail:a", "ok:a", "fail:a", "+1"), frozenset("ab")),
        id="after-success-failures-count-from-one",
    ),
    pytest.param(ReadyCase(("fail:a", "fail:b", "reset"), frozenset("ab")), id="reset-forgets-all"),
    pytest.param(
        ReadyCase(("fail:a", "fail:b", "retain:b"), frozenset("a")), id="retain-forgets-the-rest"
    ),
]


def test_a_caller_counting_its_own_retries_gets_the_same_waits() -> None:
    backoff = doubling(0.5, 8.0)

    assert [0.25, 0.5, 1.0, 2.0, 4.0, 4.0] == [backoff.delay(n, lambda: 0.0) for n in range(1, 7)]


@pytest.mark.parametrize("case", READY_CASES)
def test_backoff_ready(case: ReadyCase) -> None:
    clock = FakeClock()
    backoff = KeyedBackoff(doubling(1.0, 30.0), clock=clock, rng=lambda: 1.0)

    for step in case.steps:
        verb, _, arg = step.partition(":")
        if verb == "fail":
            backoff.failed(arg)
        elif verb == "ok":
            backoff.succeeded(arg)
        elif verb == "reset":
            backoff.reset()
        elif verb == "retain":
            backoff.retain(arg.split(","))
        else:
            clock.now += float(step)

    assert case.ready == frozenset(k for k in "ab" if backoff.ready(k))


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param({"initial": 0.0, "cap": 1.0}, id="zero-base"),
        pytest.param({"initial": -1.0, "cap": 1.0}, id="negative-base"),
        pytest.param({"initial": 2.0, "cap": 1.0}, id="cap-below-base"),
        pytest.param({"initial": 1.0, "factor": 0.5}, id="shrinking"),
        pytest.param({"initial": 1.0, "jitter": (1.2, 0.8)}, id="jitter-upside-down"),
        pytest.param({"initial": 1.0, "jitter": (-0.1, 1.0)}, id="negative-jitter"),
        pytest.param({"initial": 1.0, "attempts": 0}, id="no-attempt"),
    ],
)
def test_backoff_refuses_timings_that_cannot_work(policy: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Backoff(**{"factor": 2.0, **policy})  # type: ignore[arg-type]


@dataclass(frozen=True)
class RetryCase:
    """``Backoff.retry`` over attempts that answer ``outcomes`` in turn: what it returns,
    and the waits it made in between."""

    policy: Backoff
    outcomes: tuple[bool, ...]
    returns: bool
    waits: tuple[float, ...]
    stop_after_waits: int | None = None  # the stop flag is set by this wait
    deadline: float | None = None  # on a clock that each wait moves on


RETRY_CASES = [
    pytest.param(
        RetryCase(Backoff(initial=1.0, factor=2.0), (True,), True, ()), id="first-try-works"
    ),
    pytest.param(
        RetryCase(Backoff(initial=1.0, factor=2.0), (False, False, True), True, (1.0, 2.0)),
        id="waits-grow-until-it-works",
    ),
    pytest.param(
        RetryCase(Backoff(initial=1.0, factor=1.0, attempts=3), (False,) * 5, False, (1.0, 1.0)),
        id="attempts-spent",
    ),
    pytest.param(
        RetryCase(
            Backoff(initial=1.0, factor=1.0), (False,) * 5, False, (1.0, 1.0), stop_after_waits=2
        ),
        id="stopped-while-waiting",
    ),
    pytest.param(
        RetryCase(Backoff(initial=2.0, factor=1.0), (False,) * 5, False, (2.0, 2.0), deadline=6.0),
        id="no-try-at-or-past-the-deadline",
    ),
    pytest.param(
        RetryCase(Backoff(initial=1.0, factor=1.0, jitter=(1.0, 2.2)), (False, True), True, (1.6,)),
        id="jittered-period",
    ),
]


@pytest.mark.parametrize("case", RETRY_CASES)
def test_backoff_retry(case: RetryCase) -> None:
    outcomes = iter(case.outcomes)
    clock = FakeClock(0.0)
    waits: list[float] = []

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        clock.now += seconds
        return len(waits) == case.stop_after_waits

    deadline = None if case.deadline is None else (clock, case.deadline)
    returned = case.policy.retry(
        lambda: next(outcomes), wait=wait, rng=lambda: 0.5, deadline=deadline
    )

    assert (case.returns, case.waits) == (returned, tuple(pytest.approx(w) for w in waits))


# -- Loop ------------------------------------------------------------------------------------


class Steps:
    """A step that counts its calls and lets a test wait for the n-th."""

    def __init__(self, fail: Callable[[int], bool] = lambda n: False) -> None:
        self.count = 0
        self.fail = fail
        self._cond = threading.Condition()

    def __call__(self, stop: threading.Event) -> None:
        with self._cond:
            self.count += 1
            n = self.count
            self._cond.notify_all()
        if self.fail(n):
            raise RuntimeError(f"step {n} failed")

    def wait_for(self, n: int, timeout: float = 5.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.count >= n, timeout)


def test_a_loop_steps_at_start_then_on_each_wake() -> None:
    steps = Steps()
    loop = Loop("test", steps, period=60.0)
    loop.start()
    try:
        assert steps.wait_for(1)
        loop.wake()
        assert steps.wait_for(2)
    finally:
        loop.stop(5)
    assert not loop.running


def test_a_quiet_loop_steps_every_period() -> None:
    steps = Steps()
    loop = Loop("test", steps, period=0.01)
    loop.start()
    try:
        assert steps.wait_for(4)
    finally:
        loop.stop(5)


def test_a_failing_step_is_counted_and_the_loop_goes_on() -> None:
    errors: list[int] = []
    steps = Steps(fail=lambda n: n == 1)
    loop = Loop("test", steps, period=0.01, error_pause=0.01, on_error=lambda: errors.append(1))
    loop.start()
    try:
        assert steps.wait_for(3)
    finally:
        loop.stop(5)
    assert [1] == errors


def test_a_stopped_loop_starts_again() -> None:
    steps = Steps()
    loop = Loop("test", steps, period=60.0)
    loop.start()
    assert steps.wait_for(1)
    loop.stop(5)
    stepped = steps.count
    loop.wake()
    assert not steps.wait_for(stepped + 1, timeout=0.1)  # stopped: a wake does nothing

    loop.start()
    try:
        assert steps.wait_for(stepped + 1)  # the first step of a start runs at once
        assert loop.running
    finally:
        loop.stop(5)


def test_wakes_during_the_debounce_cost_one_step() -> None:
    steps = Steps()
    loop = Loop("test", steps, period=60.0, debounce=0.2)
    loop.start()
    try:
        assert steps.wait_for(1)
        for _ in range(10):  # a burst, well within the debounce
            loop.wake()
        assert steps.wait_for(2)
        assert not steps.wait_for(3, timeout=0.5)
    finally:
        loop.stop(5)
    assert 2 == steps.count


def test_stop_sets_the_flag_a_long_step_watches() -> None:
    inside = threading.Event()
    saw_stop = threading.Event()

    def step(stop: threading.Event) -> None:
        inside.set()
        if stop.wait(5):
            saw_stop.set()

    loop = Loop("test", step, period=60.0)
    loop.start()
    assert inside.wait(5)
    loop.stop(5)

    assert saw_stop.is_set()


# -- Runnables -------------------------------------------------------------------------------


@dataclass
class Recorder:
    """Runnables that write ``start NAME`` / ``stop NAME (timeout)`` to one log."""

    log: list[str] = field(default_factory=list)

    def make(self, name: str) -> Named:
        return Named(name, self.log)


@dataclass
class Named:
    name: str
    log: list[str]

    def start(self) -> None:
        self.log.append(f"start {self.name}")

    def stop(self, timeout: float) -> None:
        self.log.append(f"stop {self.name} ({timeout:g})")


@dataclass(frozen=True)
class RunnablesCase:
    """Calls on a set of runnables (``cache`` and ``elector`` always, ``worker`` and
    ``reconciler`` while leading) and what the runnables saw, in order."""

    calls: tuple[str, ...]
    seen: tuple[str, ...]


RUNNABLES_CASES = [
    pytest.param(
        RunnablesCase(("start",), ("start cache", "start elector")), id="start-runs-the-others"
    ),
    pytest.param(
        RunnablesCase(
            ("start", "start_leading"),
            ("start cache", "start elector", "start worker", "start reconciler"),
        ),
        id="leading-starts-the-leaders-in-order",
    ),
    pytest.param(
        RunnablesCase(
            ("start_leading", "stop_leading"),
            ("start worker", "start reconciler", "stop reconciler (10)", "stop worker (30)"),
        ),
        id="losing-leadership-stops-them-newest-first",
    ),
    pytest.param(
        RunnablesCase(
            ("start_leading", "start_leading", "stop_leading", "stop_leading"),
            ("start worker", "start reconciler", "stop reconciler (10)", "stop worker (30)"),
        ),
        id="leading-twice-starts-once-and-stops-once",
    ),
    pytest.param(RunnablesCase(("stop_leading",), ()), id="stop-leading-without-leading"),
    pytest.param(
        RunnablesCase(
            ("start", "start_leading", "stop"),
            (
                "start cache",
                "start elector",
                "start worker",
                "start reconciler",
                "stop reconciler (10)",
                "stop worker (30)",
                "stop elector (10)",
                "stop cache (5)",
            ),
        ),
        id="stop-stops-the-leaders-first-then-the-rest-in-reverse",
    ),
    pytest.param(
        RunnablesCase(
            ("start", "stop", "start_leading"),
            ("start cache", "start elector", "stop elector (10)", "stop cache (5)"),
        ),
        id="no-leading-after-shutdown-began",
    ),
    pytest.param(
        RunnablesCase(
            ("start_leading", "stop_leading", "start_leading"),
            (
                "start worker",
                "start reconciler",
                "stop reconciler (10)",
                "stop worker (30)",
                "start worker",
                "start reconciler",
            ),
        ),
        id="leadership-regained-starts-them-again",
    ),
]


@pytest.mark.parametrize("case", RUNNABLES_CASES)
def test_runnables(case: RunnablesCase) -> None:
    recorder = Recorder()
    runnables = Runnables()
    runnables.add(recorder.make("cache"), stop_timeout=5)
    runnables.add(recorder.make("worker"), leader_election=True, stop_timeout=30)
    runnables.add(recorder.make("elector"))
    runnables.add(recorder.make("reconciler"), leader_election=True)

    for call in case.calls:
        getattr(runnables, call)()

    assert list(case.seen) == recorder.log
