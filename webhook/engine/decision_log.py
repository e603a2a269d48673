"""The decision log: one JSON line per review on the ``webhook.decisions`` logger.

A review's line is built from a few facts the engine keeps (:class:`Facts`), after the
answer: the service writes lines from a background thread, a batch at a time
(:class:`~webhook.base.loop.Backlog`), so the review path only queues the facts.
A batch is one log record whose message holds its lines, one review each: the service
logs messages alone (``%(message)s``), so the output is the same lines, written at once.

What the engine answers (:class:`Decision`) is defined here: the engine that makes
decisions and the log that writes them down both depend on it, never the log on the
engine.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson

from webhook.core.plan import Plan
from webhook.core.report import victim_moves
from webhook.core.resources import format_amount
from webhook.engine.ledger import LedgerEntry

decision_logger = logging.getLogger("webhook.decisions")


class Decision(NamedTuple):
    """What to answer, and why. ``verdict`` is the plan's, or ``ignored``/``error``.

    A tuple, as the small values of the core: built for every review, and a frozen
    dataclass sets each field through ``object.__setattr__``."""

    uid: str
    allowed: bool = True
    verdict: str = "ignored"
    plan: Plan | None = None
    warnings: tuple[str, ...] = ()
    audit: Mapping[str, str] = MappingProxyType({})
    code: int | None = None
    message: str = ""
    patch: list[dict[str, Any]] | None = None
    #: The ledger entry this review holds (new, or the one a retried review wrote).
    admitted: LedgerEntry | None = None
    error: str = ""

    @property
    def reserved(self) -> bool:
        return self.admitted is not None


class Facts(NamedTuple):
    """One answered review, as its metrics and its line need it (before formatting)."""

    endpoint: str
    namespace: str
    name: str
    dry_run: bool
    #: The engine's own time for the review, in seconds.
    elapsed: float
    decision: Decision


def record(facts: Facts, mode: str) -> dict[str, Any]:
    """The JSON object of one line (the fields are documented in docs/service.md)."""
    d = facts.decision
    out: dict[str, Any] = {
        "uid": d.uid,
        "endpoint": facts.endpoint,
        "pod": f"{facts.namespace}/{facts.name}",
        "verdict": d.verdict,
        "allowed": d.allowed,
        "dryRun": facts.dry_run,
        "mode": mode,
        "latencyMs": round(facts.elapsed * 1000, 3),
    }
    if d.plan is not None:
        out |= plan_fields(d.plan, d.reserved)
    if d.error:
        out["error"] = d.error
    return out


def plan_fields(plan: Plan, reserved: bool) -> dict[str, Any]:
    """A line's fields about the plan, for reviews and reconciler passes alike."""
    figures = plan.figures or {}
    fields: dict[str, Any] = {
        "node": plan.node,
        "reason": plan.code,
        "requested": {n: format_amount(n, f.requested) for n, f in figures.items()},
        "headroom": {
            n: format_amount(n, f.allocatable - f.in_use + f.freeing) for n, f in figures.items()
        },
        "victims": list(plan.victim_keys),
        "reserved": reserved,
    }
    moves = victim_moves(plan)
    if moves:
        # Victim order movable-first only: where each victim's work would go.
        fields["moves"] = moves
    return fields


def line(facts: Facts, mode: str) -> bytes:
    """One review's line, answered in ``mode`` (JSON, no newline)."""
    return orjson.dumps(record(facts, mode))


def emit(lines: list[bytes]) -> None:
    """Log the lines of a batch of reviews as one record."""
    # The record is built by hand, as Logger.info would but without looking up the
    # caller's file and line in the stack: that lookup was two thirds of the cost of a
    # record, and the record is its message alone (the JSON lines).
    decision_logger.handle(
        decision_logger.makeRecord(
            decision_logger.name,
            logging.INFO,
            "",
            0,
            b"\n".join(lines).decode(),
            (),
            None,
        )
    )


__all__ = ["Decision", "Facts", "decision_logger", "emit", "line", "plan_fields", "record"]
