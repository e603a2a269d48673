"""The service's Prometheus metrics, in one injectable object (no global registry)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: Milliseconds matter here: the API server waits for us on every resize.
LATENCY_BUCKETS_SECONDS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)


class Metrics:
    """Every metric the service exports, registered in its own registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.reviews = Counter(
            "rpw_admission_reviews",
            "AdmissionReviews answered, by endpoint and verdict",
            ["endpoint", "verdict"],
            registry=r,
        )
        self.review_latency = Histogram(
            "rpw_admission_review_duration_seconds",
            "Time to answer one AdmissionReview",
            ["endpoint"],
            buckets=LATENCY_BUCKETS_SECONDS,
            registry=r,
        )
        self.errors = Counter(
            "rpw_errors",
            "Internal errors by where they happened; reviews failed open",
            ["where"],
            registry=r,
        )
        self.preemptions = Counter(
            "rpw_preemptions",
            "Victims acted on, by result (evicted, deleted, gone, skipped, blocked, failed)",
            ["result"],
            registry=r,
        )
        self.loans = Counter(
            "rpw_loans",
            "Loans acted on, by result (made, refused, returned)",
            ["result"],
            registry=r,
        )
        self.victims_planned = Counter(
            "rpw_victims_planned", "Victims named by admitted plans", registry=r
        )
        self.victims_per_plan = Histogram(
            "rpw_victims_per_plan",
            "Victims per preempting plan",
            buckets=(1, 2, 3, 5, 8, 13, 21),
            registry=r,
        )
        self.ledger_conflicts = Counter(
            "rpw_ledger_conflicts",
            "Ledger writes retried after a resourceVersion conflict",
            registry=r,
        )
        # Gauges with several worker processes (webhook.web.shared_metrics): the largest
        # value among the live ones - the worst cache age, the leading process's ledger.
        self.ledger_entries = Gauge(
            "rpw_ledger_entries",
            "Admitted resizes holding a reservation",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.lent = Gauge(
            "rpw_lent",
            "Room currently lent by lower-priority pods, per node (cpu in millicores, "
            "memory in bytes)",
            ["node", "resource"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.cache_age = Gauge(
            "rpw_cache_age_seconds",
            "Seconds since the cache last heard from the API server",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.reconciler_actions = Counter(
            "rpw_reconciler_actions",
            "Deferred resizes the reconciler acted on, by verdict",
            ["verdict"],
            registry=r,
        )
        self.leader = Gauge(
            "rpw_leader",
            "1 while this replica runs the preemption worker",
            registry=r,
            multiprocess_mode="livemax",
        )


def observe_all(histogram: Any, amounts: Sequence[float]) -> None:
    """``histogram.observe(a)`` for each of ``amounts`` (a histogram, or one labelled
    child), in one update per bucket: the same counts, and the sum added once (so it may
    differ in its last digits from values added one by one).

    A batch of reviews is counted after the answers (``webhook/engine/backlog.py``):
    observing one value takes a lock and, in a worker of several, a write to a shared
    file, for the sum and again for its bucket. This reads prometheus-client's
    histogram internals (``_upper_bounds``, ``_buckets``, ``_sum``, as ``observe`` uses
    them, at the pinned version); a test compares both ways on every run, and a
    histogram without them is observed value by value.
    """
    if not amounts:
        return
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for amount in amounts:
            histogram.observe(amount)
        return
    histogram._raise_if_not_observable()
    counts = [0] * len(bounds)
    for amount in amounts:
        # The first bucket whose bound is >= amount, as observe() finds it.
        counts[bisect_left(bounds, amount)] += 1
    total.inc(sum(amounts))
    for bucket, n in zip(buckets, counts, strict=True):
        if n:
            bucket.inc(n)
