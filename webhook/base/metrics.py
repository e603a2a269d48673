"""The service's Prometheus metrics, in one injectable object (no global registry).

Every metric is named once, in :data:`METRICS`: :class:`Metrics` builds its attributes
from it and ``python -m webhook metrics --markdown`` prints the table docs/operations.md
shows (a test keeps the two equal). A new metric is a new row there and an attribute
annotation on :class:`Metrics`.

A renamed metric keeps its former name for one release (``MetricDef.deprecated``): the
same samples exported under it too, their help beginning ``DEPRECATED: use <new>``
(:class:`DeprecatedAliases`), in one process and across worker processes alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric

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

#: Resizes wait on evictions (grace periods of seconds to minutes) and on the kubelet.
ACTUATION_BUCKETS_SECONDS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)

MetricType = Literal["counter", "gauge", "histogram"]
#: prometheus-client's ways of combining a gauge of several processes (the live ones).
Combine = Literal["livemax", "livesum", "livemostrecent"]


@dataclass(frozen=True, slots=True)
class MetricDef:
    """One exported metric. ``name`` is the name a query uses (counters end in
    ``_total``); ``attribute`` the :class:`Metrics` attribute code updates it through.
    ``multiprocess_mode`` (gauges): how the values of several worker processes combine
    (webhook.web.shared_metrics)."""

    attribute: str
    name: str
    kind: MetricType
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    multiprocess_mode: Combine = "livemax"
    #: The name it had before (exported as well for one release); empty: none.
    deprecated: str = ""


#: ``unit`` label and divisor of a quantity exported in Prometheus's base units, as
#: kube-state-metrics exports requests (``kube_pod_container_resource_requests``).
RESOURCE_UNITS: dict[str, tuple[str, int]] = {"cpu": ("core", 1000), "memory": ("byte", 1)}


def in_base_unit(resource: str, amount: int) -> tuple[str, float]:
    """``(unit, value)`` of an exact amount (millicores, bytes) for a gauge."""
    unit, divisor = RESOURCE_UNITS[resource]
    return unit, amount / divisor


#: Every metric the service exports, in the order the docs list them.
METRICS: tuple[MetricDef, ...] = (
    MetricDef(
        "reviews",
        "resize_preemption_reviews_total",
        "counter",
        "AdmissionReviews answered, by endpoint and verdict",
        ("endpoint", "verdict"),
        deprecated="resize_preemption_webhook_requests_total",
    ),
    MetricDef(
        "review_latency",
        "resize_preemption_review_duration_seconds",
        "histogram",
        "Time to answer one AdmissionReview (buckets from 0.5 ms)",
        ("endpoint",),
        buckets=LATENCY_BUCKETS_SECONDS,
        deprecated="resize_preemption_webhook_latency_seconds",
    ),
    # kube-scheduler's scheduler_preemption_attempts_total, for resizes.
    MetricDef(
        "attempts",
        "resize_preemption_attempts_total",
        "counter",
        "Resizes that did not fit their node as it was, so that preemption was tried, by "
        "review or by the reconciler, by result: preempt (victims found), infeasible "
        "(none would make room)",
        ("result",),
    ),
    MetricDef(
        "errors",
        "resize_preemption_errors_total",
        "counter",
        "Internal errors by where they happened; reviews failed open",
        ("where",),
    ),
    MetricDef(
        "connections_refused",
        "resize_preemption_connections_refused_total",
        "counter",
        "New connections reset before their TLS handshake because the serving worker was "
        "overloaded; the API server fails those reviews open",
        deprecated="resize_preemption_webhook_connections_refused_total",
    ),
    MetricDef(
        "unauthenticated",
        "resize_preemption_unauthenticated",
        "gauge",
        "1 while the review port accepts callers without a client certificate (no "
        "client-ca): anyone who reaches it can post a review",
        deprecated="resize_preemption_webhook_unauthenticated",
    ),
    MetricDef(
        "unverified_reviews",
        "resize_preemption_unverified_reviews_total",
        "counter",
        "Reviews allowed without a plan because the cache holds no pod of their "
        "namespace, name and uid, or their object says of it anything but the resize's "
        "resources that the cache does not: forged, or ahead of the cache",
    ),
    MetricDef(
        "disallowed_entries",
        "resize_preemption_entries_disallowed_total",
        "counter",
        "Ledger entries the worker removed before acting on them because the cache and the "
        "service's settings do not allow them, by the rule broken (node, preemptor-policy, "
        "victim-policy, lending): written by another writer, or by settings since changed",
        ("rule",),
    ),
    MetricDef(
        "preemptions",
        "resize_preemption_victims_total",
        "counter",
        "Victims acted on, by result (evicted, deleted, gone, skipped, blocked, failed)",
        ("result",),
    ),
    # Not a label of resize_preemption_victims_total: an outcome is known seconds to
    # minutes after the eviction's result, so on that metric every evicted victim would
    # be counted twice by any sum without a result matcher.
    MetricDef(
        "victim_outcomes",
        "resize_preemption_victim_outcomes_total",
        "counter",
        "Evicted victims by where their work went, as the leader followed it: moved (its "
        "controller's replacement bound to another node), lost (not recreated elsewhere, "
        "or the replacement not bound elsewhere), unknown (no replacement seen)",
        ("outcome",),
    ),
    MetricDef(
        "loans",
        "resize_preemption_loans_total",
        "counter",
        "Loans acted on, by result (made, refused, returned)",
        ("result",),
    ),
    MetricDef(
        "lent",
        "resize_preemption_lent_resources",
        "gauge",
        "Room the loans in the ledger free now, per node, in kube-state-metrics' form: cpu "
        "in cores (unit core), memory in bytes (unit byte)",
        ("node", "resource", "unit"),
    ),
    MetricDef(
        "oldest_loan_age",
        "resize_preemption_oldest_loan_age_seconds",
        "gauge",
        "Seconds since the resize that borrowed the oldest loan still out was admitted "
        "(0: none out); set by the leader",
    ),
    MetricDef(
        "victims_planned",
        "resize_preemption_planned_victims_total",
        "counter",
        "Victims named by admitted plans",
    ),
    MetricDef(
        "victims_per_plan",
        "resize_preemption_victims_per_plan",
        "histogram",
        "Victims per preempting plan",
        buckets=(1, 2, 3, 5, 8, 13, 21),
    ),
    MetricDef(
        "ledger_conflicts",
        "resize_preemption_ledger_conflicts_total",
        "counter",
        "Ledger writes retried after a resourceVersion conflict",
    ),
    # Gauges with several worker processes: the largest value among the live ones - the
    # worst cache age, the leading process's ledger.
    MetricDef(
        "ledger_full",
        "resize_preemption_ledger_full_total",
        "counter",
        "Ledger writes refused because a node's Lease would hold more entries or bytes "
        "than it may; reviews are allowed unplanned, saying why",
    ),
    MetricDef(
        "ledger_entries",
        "resize_preemption_ledger_entries",
        "gauge",
        "Admitted resizes holding a reservation (expired and spent entries left out)",
    ),
    MetricDef(
        "cache_age",
        "resize_preemption_cache_age_seconds",
        "gauge",
        "Seconds since the cache last heard from the API server",
    ),
    MetricDef(
        "reconciler_actions",
        "resize_preemption_reconciler_actions_total",
        "counter",
        "Deferred resizes the reconciler acted on, by verdict",
        ("verdict",),
    ),
    MetricDef(
        "time_to_actuation",
        "resize_preemption_actuation_duration_seconds",
        "histogram",
        "Time from a preempting resize's admission until the kubelet actuated it, observed "
        "by the leader's worker when the reservation is spent",
        buckets=ACTUATION_BUCKETS_SECONDS,
        deprecated="resize_preemption_time_to_actuation_seconds",
    ),
    # KEP-5836's scheduler_pending_resize_pods, split by where the resize waits.
    MetricDef(
        "pending_resizes",
        "resize_preemption_pending_resizes",
        "gauge",
        "Resizes not yet actuated, set by the leader's reconciler on every pass, by state: "
        "deferred, infeasible (the kubelet's PodResizePending reason, as cached), admitted "
        "(a ledger entry holds room, the pod's spec does not carry the resize yet), "
        "persisted (the spec carries it, the kubelet has not actuated it); a persisted "
        "resize is usually deferred too, so states overlap",
        ("state",),
    ),
    # No node label: a pod per node would make a series per node of the cluster; the
    # reason is a short fixed list (webhook.engine.reconciler.DEFERRED_REASONS), and
    # ``python -m webhook status`` names the pods and nodes.
    MetricDef(
        "deferred_resizes",
        "resize_preemption_deferred_resizes",
        "gauge",
        "Pods whose resize the kubelet Deferred, as the reconciler sees them, by why they "
        "wait (preempt: preemption is making room)",
        ("reason",),
    ),
    MetricDef(
        "deferred_longest_wait",
        "resize_preemption_deferred_resizes_longest_wait_seconds",
        "gauge",
        "Seconds the longest-waiting Deferred resize has waited, by why it waits",
        ("reason",),
    ),
    MetricDef(
        "checkpoints",
        "resize_preemption_checkpoints_total",
        "counter",
        "Victims that asked to be checkpointed, by outcome (checkpointed, failed, "
        "refused) and restores (restored, abandoned); set by the leader",
        ("result",),
    ),
    MetricDef(
        "checkpoint_seconds",
        "resize_preemption_checkpoint_duration_seconds",
        "histogram",
        "Time the kubelet took to checkpoint a victim's containers",
        buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        deprecated="resize_preemption_checkpoint_seconds",
    ),
    MetricDef(
        "checkpoint_bytes",
        "resize_preemption_checkpoint_bytes",
        "histogram",
        "Size of a victim's checkpoint archives, as its node agent measured them",
        buckets=(2**20, 2**23, 2**25, 2**27, 2**29, 2**31, 2**33),
    ),
    MetricDef(
        "restore_seconds",
        "resize_preemption_restore_duration_seconds",
        "histogram",
        "Time from creating a pod again from its checkpoint until it runs",
        buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
        deprecated="resize_preemption_restore_seconds",
    ),
    MetricDef(
        "leader",
        "resize_preemption_leader_election_master_status",
        "gauge",
        "1 while this replica runs the preemption worker and the reconciler",
    ),
)


class Metrics:
    """Every metric of :data:`METRICS`, registered in its own registry, as attributes."""

    reviews: Counter
    review_latency: Histogram
    attempts: Counter
    errors: Counter
    connections_refused: Counter
    unauthenticated: Gauge
    unverified_reviews: Counter
    disallowed_entries: Counter
    preemptions: Counter
    victim_outcomes: Counter
    loans: Counter
    lent: Gauge
    oldest_loan_age: Gauge
    victims_planned: Counter
    victims_per_plan: Histogram
    ledger_conflicts: Counter
    ledger_full: Counter
    ledger_entries: Gauge
    cache_age: Gauge
    reconciler_actions: Counter
    time_to_actuation: Histogram
    pending_resizes: Gauge
    deferred_resizes: Gauge
    checkpoints: Counter
    checkpoint_seconds: Histogram
    checkpoint_bytes: Histogram
    restore_seconds: Histogram
    deferred_longest_wait: Gauge
    leader: Gauge

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        built = [_build(d, self.registry) for d in METRICS]
        for d, metric in zip(METRICS, built, strict=True):
            setattr(self, d.attribute, metric)
        self.registry.register(DeprecatedAliases(_Together(built)))

    def count_attempt(self, verdict: str, n: int = 1) -> None:
        """``n`` more preemption attempts when ``verdict`` (a plan's) is one."""
        if verdict in ATTEMPT_RESULTS:
            self.attempts.labels(verdict).inc(n)

    def set_pending(self, counts: Mapping[str, int]) -> None:
        """Every state of :data:`PENDING_STATES` (0 when not in ``counts``), so a state
        whose resizes went is not left at its last count."""
        for state in PENDING_STATES:
            self.pending_resizes.labels(state).set(counts.get(state, 0))


#: The plan verdicts of a resize that did not fit as the node was: preemption was tried.
ATTEMPT_RESULTS: Final = ("preempt", "infeasible")
#: The states of ``resize_preemption_pending_resizes``.
PENDING_STATES: Final = ("deferred", "infeasible", "admitted", "persisted")


class _Collector(Protocol):
    def collect(self) -> Iterable[Metric]: ...


@dataclass(frozen=True, slots=True)
class _Together:
    """Several collectors as one."""

    parts: Sequence[_Collector]

    def collect(self) -> Iterator[Metric]:
        for part in self.parts:
            yield from part.collect()


def _family(name: str) -> str:
    """The family name prometheus-client gives a metric (a counter's without _total)."""
    return name.removesuffix("_total")


#: Family of a current name -> (family of its deprecated name, help of that one).
ALIASES: Final[dict[str, tuple[str, str]]] = {
    _family(d.name): (_family(d.deprecated), f"DEPRECATED: use {d.name}. {d.help}")
    for d in METRICS
    if d.deprecated
}


class DeprecatedAliases:
    """Exports each renamed metric of ``source`` again under its former name."""

    def __init__(self, source: _Collector) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        for family in self.source.collect():
            alias = ALIASES.get(family.name)
            if alias is None:
                continue
            name, documentation = alias
            renamed = Metric(name, documentation, family.type, family.unit)
            renamed.samples = [
                s._replace(name=name + s.name[len(family.name) :]) for s in family.samples
            ]
            yield renamed


def _build(d: MetricDef, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
    if d.kind == "counter":
        return Counter(d.name, d.help, d.labels, registry=registry)
    if d.kind == "histogram":
        return Histogram(d.name, d.help, d.labels, buckets=d.buckets, registry=registry)
    return Gauge(d.name, d.help, d.labels, registry=registry, multiprocess_mode=d.multiprocess_mode)


def markdown_table(metrics: Sequence[MetricDef] = METRICS) -> str:
    """The metrics table of docs/operations.md (``python -m webhook metrics --markdown``)."""
    lines = ["| Metric | Type | Labels | Meaning |", "|---|---|---|---|"]
    for d in metrics:
        labels = ", ".join(f"`{label}`" for label in d.labels)
        lines.append(f"| `{d.name}` | {d.kind} | {labels} | {d.help} |")
    return "\n".join(lines) + "\n"
