"""The service's background work: one loop, one backoff, and what runs while this replica
leads.

* :class:`Loop` - a daemon thread that calls one step when woken, or after a period of
  quiet. The preemption worker, the reconciler and the after-review backlog are each one.
* :class:`Backoff` - the one retry policy (initial wait, factor, cap, jitter, attempts),
  and :meth:`Backoff.retry` to call something until it works; :class:`KeyedBackoff` -
  that policy per key: how long something that failed waits before it is tried again.
* :class:`Runnables` - everything the service starts, started in order and stopped in
  reverse; the ones that need leader election run only while this replica leads.
* :class:`Backlog` - what follows an answer, done off the review path (below).

No Kubernetes client and no HTTP here: what a step does is its owner's business.

The after-review backlog. Once a review is answered, the engine still counts it in the
metrics and writes its decision-log line. In a loop that costs little; on the review
path of a busy server it costs a good part of the decision (docs/service.md,
Performance), because the logging and metrics code goes cold between two reviews. A
:class:`Backlog` runs those jobs from a background thread, a batch at a time, where that
code stays warm from one job to the next; the review path only queues a job. The
engine's default, :func:`run_now`, runs each job at once.

A job takes a batch: it is called with the arguments submitted for it since its last
run, so what one call per review would repeat (a lock, a write, a metric update) is done
once per batch.

Contract: every argument is handed to its job exactly once, in the order submitted
(consecutive submissions of one job go in one call), at most ``interval`` seconds late
while the backlog runs; :meth:`Backlog.stop` runs what is left. Arguments of a process
that dies without :meth:`~Backlog.stop` are lost (metrics restart with the process
anyway; the decision log loses its last lines).
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: A loop's step: called with the stop flag of the thread running it, so a long step can
#: end early once it is set.
Step = Callable[[threading.Event], object]


class Loop:
    """Runs ``step`` on a daemon thread: once at start, then whenever :meth:`wake` is
    called, and at the latest ``period`` seconds after the last step.

    ``debounce``: seconds to wait after being woken before the step runs, so a burst of
    changes (one deletion is several watch events) costs one step. A step that raises is
    logged and reported to ``on_error`` (which counts it); the loop then waits
    ``error_pause`` seconds and goes on: a failure never ends the thread.

    :meth:`start` and :meth:`stop` may be called any number of times, in any order
    (leadership comes and goes). Each thread gets its own stop flag: a thread that
    outlived :meth:`stop`'s wait (in a long step) still sees its own flag set and ends,
    while a new one started meanwhile runs with a fresh flag.
    """

    def __init__(
        self,
        name: str,
        step: Step,
        *,
        period: float,
        debounce: float = 0.0,
        error_pause: float = 0.0,
        on_error: Callable[[], object] | None = None,
    ) -> None:
        self.name = name
        self.period = period
        self.debounce = debounce
        self.error_pause = error_pause
        self._step = step
        self._on_error = on_error
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        """Ask for a step soon. Cheap and thread-safe: wakes that come while a step runs
        are folded into one more step after it."""
        self._wake.set()

    def start(self) -> None:
        """Start the thread unless it runs (idempotent); the first step runs at once."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop = threading.Event()
            self._wake.set()
            self._thread = threading.Thread(
                target=self._run, args=(self._stop,), name=self.name, daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop after the step in progress; waits up to ``timeout`` seconds for it."""
        with self._lock:
            self._stop.set()
            self._wake.set()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive() and not self._stop.is_set()

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._wake.wait(self.period)
            if self.debounce:
                stop.wait(self.debounce)
            self._wake.clear()
            if stop.is_set():
                return
            try:
                self._step(stop)
            except Exception:
                if self._on_error is not None:
                    self._on_error()
                log.exception("%s: step failed; trying again", self.name)
                stop.wait(self.error_pause)


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait after a failure, and how many tries in all: the one retry policy
    of the service (client-go's ``wait.Backoff``).

    After the n-th failure in a row the wait is ``initial * factor**(n-1)``, at most
    ``cap``, scaled by a random factor drawn evenly from ``jitter`` (low, high) so that
    callers failing together do not come back together. ``attempts``: tries in all, the
    first included (``None``: until it works or its caller stops). A factor of 1 makes a
    jittered period (``wait.JitterUntil``).
    """

    initial: float
    factor: float
    cap: float = math.inf
    jitter: tuple[float, float] = (1.0, 1.0)
    attempts: int | None = None

    def __post_init__(self) -> None:
        low, high = self.jitter
        if self.initial <= 0 or self.cap < self.initial or self.factor < 1:
            raise ValueError("backoff needs 0 < initial <= cap and factor >= 1")
        if not 0 <= low <= high:
            raise ValueError("backoff jitter needs 0 <= low <= high")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError("backoff needs at least one attempt")

    def delay(self, failures: int, rng: Callable[[], float] = random.random) -> float:
        """The wait after ``failures`` failures in a row (one or more)."""
        low, high = self.jitter
        base = min(self.cap, self.initial * self.factor ** max(0, failures - 1))
        return base * (low + (high - low) * rng())

    def spent(self, failures: int) -> bool:
        """True when ``failures`` failures in a row used up every attempt."""
        return self.attempts is not None and failures >= self.attempts

    def retry(
        self,
        attempt: Callable[[], bool],
        *,
        wait: Callable[[float], object],
        rng: Callable[[], float] = random.random,
        deadline: tuple[Callable[[], float], float] | None = None,
    ) -> bool:
        """Call ``attempt`` until it returns True (then True). False when the attempts
        are spent, when ``wait(delay)`` returns true (a stop flag's ``wait``: stopped),
        or when the next try would start at or past ``deadline`` (a clock and the time
        on it: client-go's ``PollImmediateUntil``)."""
        failures = 0
        while not attempt():
            failures += 1
            if self.spent(failures):
                return False
            delay = self.delay(failures, rng)
            if deadline is not None and deadline[0]() + delay >= deadline[1]:
                return False
            if wait(delay):
                return False
        return True


@dataclass(slots=True)
class _Attempts:
    failures: int
    not_before: float


class KeyedBackoff:
    """A :class:`Backoff` per key: how long something that failed waits before it is tried
    again. :meth:`succeeded` forgets a key; :meth:`reset` forgets them all (something
    changed that may let every one of them through now). Thread-safe.
    """

    def __init__(
        self,
        policy: Backoff,
        *,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.policy = policy
        self._clock = clock
        self._rng = rng
        self._lock = threading.Lock()
        self._keys: dict[str, _Attempts] = {}

    def failed(self, key: str) -> float:
        """Count one more failure of ``key``; returns when it may be tried again (epoch
        seconds, the clock's)."""
        with self._lock:
            attempts = self._keys.get(key)
            failures = 1 if attempts is None else attempts.failures + 1
            wait = self.policy.delay(failures, self._rng)
            self._keys[key] = _Attempts(failures, self._clock() + wait)
            return self._keys[key].not_before

    def ready(self, key: str) -> bool:
        """True when ``key`` is not waiting (never failed, or its wait is over)."""
        attempts = self._keys.get(key)
        return attempts is None or self._clock() >= attempts.not_before

    def succeeded(self, key: str) -> None:
        with self._lock:
            self._keys.pop(key, None)

    def reset(self) -> None:
        with self._lock:
            self._keys.clear()

    def retain(self, keys: Iterable[str]) -> None:
        """Forget every key not in ``keys`` (their work is gone)."""
        kept = set(keys)
        with self._lock:
            for key in [k for k in self._keys if k not in kept]:
                del self._keys[key]


class Runnable(Protocol):
    """Something the service starts and stops: a loop, a watch, the leader elector."""

    def start(self) -> None: ...

    def stop(self, timeout: float) -> None: ...


@dataclass(frozen=True, slots=True)
class _Registered:
    runnable: Runnable
    stop_timeout: float


class Runnables:
    """Everything the service runs, registered in one place (after controller-runtime's
    manager and its ``LeaderElectionRunnable``).

    A runnable added with ``leader_election=True`` runs only while this replica leads:
    :meth:`start_leading` and :meth:`stop_leading` are the leader elector's callbacks. The
    others run from :meth:`start` to :meth:`stop`. Each group starts in the order added
    and stops in reverse. :meth:`stop` stops the leader's runnables first, so nothing acts
    for this replica once its shutdown began, and none starts again after it.
    """

    def __init__(self) -> None:
        self._always: list[_Registered] = []
        self._leader: list[_Registered] = []
        self._lock = threading.Lock()
        self._leading = False
        self._closed = False

    def add(
        self, runnable: Runnable, *, leader_election: bool = False, stop_timeout: float = 10.0
    ) -> None:
        """Register ``runnable``; ``stop_timeout`` is what its :meth:`stop` may wait."""
        group = self._leader if leader_election else self._always
        group.append(_Registered(runnable, stop_timeout))

    def start(self) -> None:
        for registered in self._always:
            registered.runnable.start()

    def stop(self) -> None:
        with self._lock:
            self._closed = True
        self.stop_leading()
        for registered in reversed(self._always):
            registered.runnable.stop(registered.stop_timeout)

    def start_leading(self) -> None:
        """This replica leads now: start the runnables that need leader election."""
        with self._lock:
            if self._leading or self._closed:
                return
            self._leading = True
            for registered in self._leader:
                registered.runnable.start()

    def stop_leading(self) -> None:
        """This replica stopped leading (or shuts down): stop them, newest first.
        Idempotent."""
        with self._lock:
            if not self._leading:
                return
            self._leading = False
            for registered in reversed(self._leader):
                registered.runnable.stop(registered.stop_timeout)


# -- the after-review backlog -------------------------------------------------------------

#: How late a job may run, in seconds.
FLUSH_INTERVAL = 0.05
#: Jobs a backlog holds at most; past it (its thread has stalled), new jobs are dropped
#: and counted.
PENDING_LIMIT = 100_000

#: A job: called with a batch of the arguments submitted for it, in order.
Job = Callable[[Sequence[Any]], None]
#: How the engine hands over work: ``after(job, argument)``.
After = Callable[[Job, Any], None]


def run_now(job: Job, argument: Any) -> None:
    """An :data:`After` that runs the job at once, in the caller's thread, on a batch of
    one."""
    job((argument,))


class Backlog:
    """Runs submitted jobs from one background :class:`~webhook.base.loop.Loop`, in
    batches (:meth:`submit` is an :data:`After`).

    :meth:`submit` is thread-safe, takes no lock and does no I/O. Work submitted before
    :meth:`start` waits for it. A job that raises is logged, and loses that batch (a job
    that can fail on one argument should catch that itself).
    """

    def __init__(
        self,
        interval: float = FLUSH_INTERVAL,
        limit: int = PENDING_LIMIT,
        name: str = "backlog",
    ) -> None:
        self.interval = interval
        self.limit = limit
        self.name = name
        self._pending: deque[tuple[Job, Any]] = deque()
        # Approximate under contention (no lock on the review path); reported only.
        self._dropped = 0
        self._loop = Loop(name, lambda _stop: self.flush(), period=interval)

    def submit(self, job: Job, argument: Any) -> None:
        if len(self._pending) >= self.limit:
            self._dropped += 1
            return
        self._pending.append((job, argument))  # deque.append is atomic

    def start(self) -> None:
        self._loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread, then run every job still pending."""
        self._loop.stop(timeout)
        self.flush()

    def flush(self) -> None:
        """Run every pending job now (one thread at a time: the background thread, or
        the caller of :meth:`stop` once it has ended)."""
        pending = self._pending
        while pending:
            # What is queued now; what is submitted meanwhile goes in the next round.
            taken = [pending.popleft() for _ in range(len(pending))]
            for job, group in groupby(taken, key=itemgetter(0)):
                try:
                    job([argument for _, argument in group])
                except Exception:
                    # One failing job must not stop the others (nor the thread running them).
                    log.exception("%s: a job failed", self.name)
        dropped, self._dropped = self._dropped, 0
        if dropped:
            log.warning("%s behind: %d jobs dropped", self.name, dropped)


__all__ = [
    "FLUSH_INTERVAL",
    "PENDING_LIMIT",
    "After",
    "Backlog",
    "Backoff",
    "Job",
    "KeyedBackoff",
    "Loop",
    "Runnable",
    "Runnables",
    "Step",
    "run_now",
]
