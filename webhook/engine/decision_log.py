"""The decision log: one JSON line per review on the ``webhook.decisions`` logger.

A review's line is built from a few facts the engine hands over (:class:`Facts`). Turning
them into a line and passing it through :mod:`logging` costs little in a loop, but on
the review path of a busy server it cost about a third of the whole decision: logging's
code and objects had gone cold between two reviews. So the service logs from a
background thread, a batch at a time (:class:`BatchedDecisionLog`), where that code stays
warm from one line to the next; the review path only queues the facts.

Contract of every :class:`DecisionLog`: lines come out in the order they were written,
each one the record :func:`record` builds, as one ``INFO`` record of ``webhook.decisions``.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import orjson

from webhook.core.resources import format_amount

if TYPE_CHECKING:
    from webhook.engine.admission import Decision

decision_logger = logging.getLogger("webhook.decisions")
log = logging.getLogger(__name__)

#: How late a batched line may be written, in seconds.
FLUSH_INTERVAL = 0.05
#: Lines a batched log holds at most; past it, lines are dropped and counted.
PENDING_LIMIT = 100_000


class Facts(NamedTuple):
    """What one review's line says, before it is formatted."""

    endpoint: str
    namespace: str
    name: str
    dry_run: bool
    mode: str
    elapsed: float
    decision: Decision


def record(facts: Facts) -> dict[str, Any]:
    """The JSON object of one line (the fields are documented in docs/service.md)."""
    d = facts.decision
    out: dict[str, Any] = {
        "uid": d.uid,
        "endpoint": facts.endpoint,
        "pod": f"{facts.namespace}/{facts.name}",
        "verdict": d.verdict,
        "allowed": d.allowed,
        "dryRun": facts.dry_run,
        "mode": facts.mode,
        "latencyMs": round(facts.elapsed * 1000, 3),
    }
    plan = d.plan
    if plan is not None:
        figures = plan.figures or {}
        out |= {
            "node": plan.node,
            "reason": plan.code,
            "requested": {n: format_amount(n, f.requested) for n, f in figures.items()},
            "headroom": {
                n: format_amount(n, f.allocatable - f.in_use + f.freeing)
                for n, f in figures.items()
            },
            "victims": list(plan.victim_keys),
            "reserved": d.reserved,
        }
    if d.error:
        out["error"] = d.error
    return out


def emit(facts: Facts) -> None:
    """Log one line now."""
    # The record is built by hand, as Logger.info would but without looking up the
    # caller's file and line in the stack: that lookup was two thirds of the cost of a
    # line, and the line is its message alone (the JSON).
    decision_logger.handle(
        decision_logger.makeRecord(
            decision_logger.name,
            logging.INFO,
            "",
            0,
            orjson.dumps(record(facts)).decode(),
            (),
            None,
        )
    )


class DecisionLog(Protocol):
    def write(self, facts: Facts) -> None:
        """Log the line of one review (now or soon)."""
        ...


class ImmediateDecisionLog:
    """Logs each line as it is written: the engine's default (tests, ``plan``)."""

    def write(self, facts: Facts) -> None:
        emit(facts)


class BatchedDecisionLog:
    """Logs lines from a background thread, at most ``interval`` seconds after they were
    written; :meth:`stop` writes what is left. Lines written before :meth:`start` wait
    for it, as do lines of a process that dies without :meth:`stop` (those are lost).

    :meth:`write` is thread-safe and does no I/O; past ``limit`` pending lines (the
    logging sink has stalled) new lines are dropped, and a warning counts them.
    """

    def __init__(self, interval: float = FLUSH_INTERVAL, limit: int = PENDING_LIMIT) -> None:
        self.interval = interval
        self.limit = limit
        self._pending: deque[Facts] = deque()
        # Approximate under contention (no lock on the review path); reported, not used.
        self._dropped = 0
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def write(self, facts: Facts) -> None:
        if len(self._pending) >= self.limit:
            self._dropped += 1
            return
        self._pending.append(facts)  # deque.append is atomic

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="decision-log", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread, then write every line still pending."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self.flush()

    def flush(self) -> None:
        """Write every pending line now (one thread at a time: the background thread,
        or the caller of :meth:`stop` once it has ended)."""
        pending = self._pending
        while pending:
            facts = pending.popleft()
            try:
                emit(facts)
            except Exception:
                # One bad line must not stop the log (nor the thread that writes it).
                uid = facts.decision.uid
                log.exception("could not write the decision-log line of review %s", uid)
        dropped, self._dropped = self._dropped, 0
        if dropped:
            log.warning("decision log behind: %d lines dropped", dropped)

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            self.flush()


__all__ = [
    "FLUSH_INTERVAL",
    "PENDING_LIMIT",
    "BatchedDecisionLog",
    "DecisionLog",
    "Facts",
    "ImmediateDecisionLog",
    "decision_logger",
    "emit",
    "record",
]
