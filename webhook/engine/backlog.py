"""What follows an answer, done off the review path.

Once a review is answered, the engine still counts it in the metrics and writes its
decision-log line. In a loop that costs little; on the review path of a busy server it
costs a good part of the decision (docs/service.md, Performance), because the logging and
metrics code goes cold between two reviews. A :class:`Backlog` runs those jobs from a
background thread, a batch at a time, where that code stays warm from one job to the
next; the review path only queues a job. The engine's default, :func:`run_now`, runs each
job at once.

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
from collections import deque
from collections.abc import Callable, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Any

from webhook.engine.loop import Loop

log = logging.getLogger(__name__)

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
    """Runs submitted jobs from one background :class:`~webhook.engine.loop.Loop`, in
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


__all__ = ["FLUSH_INTERVAL", "PENDING_LIMIT", "After", "Backlog", "Job", "run_now"]
