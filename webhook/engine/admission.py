"""The admission engine: one AdmissionRequest in, one decision out. No HTTP here.

Contract:
* only ``pods/resize`` UPDATE requests are acted on; anything else is allowed untouched;
* reads come from the in-memory :class:`ClusterView`; the only API call is the ledger
  write that records an admitted resize (none for ``dryRun`` or in ``warn`` mode);
* input it cannot read and an unusable cluster view or ledger end in ``allowed`` with a
  warning and an error metric (fail open); anything else it raises is a bug, which the
  web app's one fail-open boundary answers allowed (``webhook.web.app``). Only
  ``deny-infeasible`` mode denies, and only for a resize that cannot fit even after
  preemption.

The AdmissionReview v1 wire format is here too (the section "on the wire"): typed
shapes, validation of what arrives, responses. The API server enforces its own rules on
our answers (uid echo, apiVersion/kind, no patch from a validating webhook, warning and
audit-annotation formats); everything we send is built there so those rules live in one
place. The planner it plans with, and the reconciler too, is :mod:`webhook.engine.planner`.
"""

from __future__ import annotations

import base64
import copy
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, NamedTuple, NotRequired, TypedDict, cast

import jsonpatch
import orjson

from webhook.base.loop import After, run_now
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.checkpoint import Pause
from webhook.core.errors import InputError, WebhookError
from webhook.core.fit import largest_fit
from webhook.core.model import FIT_TO_NODE_ANNOTATION, DisruptionBudget, Node, Pod, PodRef
from webhook.core.objects import parse_pod
from webhook.core.plan import NodeView, Plan
from webhook.core.report import WARNING_LIMIT, clip, warnings_for
from webhook.core.resize import resize_of
from webhook.core.resources import (
    RESOURCE_NAMES,
    format_amount,
    format_cpu,
    format_memory,
)
from webhook.core.versions import comparable
from webhook.engine.decision_log import Decision, Facts, decision_logger, emit, line
from webhook.engine.elsewhere import Elsewhere
from webhook.engine.ledger import ClusterView, Ledger, LedgerEntry
from webhook.engine.lifecycle.changes import admit
from webhook.engine.lifecycle.states import room_holders
from webhook.engine.planner import NodeMemo, ResizePlanner

#: Seconds a review waits for the view to hold the pod it resizes
#: (:meth:`AdmissionEngine._catch_up`): watch events arrive within milliseconds, and the API
#: server's call to the webhook has seconds (``timeoutSeconds``).
CATCH_UP: Final = 1.0

# -- on the wire ---------------------------------------------------------------------------

API_VERSIONS: Final = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
MAX_WARNINGS_CHARS: Final = 4096
MAX_WARNING_CHARS: Final = WARNING_LIMIT
# An audit annotation key: a qualified name's name part (no prefix; the API server adds
# the webhook's name as prefix), at most 63 characters.
_AUDIT_KEY: Final = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class ReviewError(InputError):
    """The body is not an AdmissionReview we can answer (HTTP 400)."""


class GroupVersionResource(TypedDict):
    group: str
    version: str
    resource: str


class AdmissionRequest(TypedDict):
    uid: str
    kind: NotRequired[Mapping[str, str]]
    resource: NotRequired[GroupVersionResource]
    subResource: NotRequired[str]
    name: NotRequired[str]
    namespace: NotRequired[str]
    operation: NotRequired[Operation]
    userInfo: NotRequired[Mapping[str, Any]]
    object: NotRequired[Mapping[str, Any] | None]
    oldObject: NotRequired[Mapping[str, Any] | None]
    dryRun: NotRequired[bool]


class Status(TypedDict):
    code: int
    message: str
    reason: NotRequired[str]


class AdmissionResponse(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[Status]
    patch: NotRequired[str]
    patchType: NotRequired[Literal["JSONPatch"]]
    warnings: NotRequired[list[str]]
    auditAnnotations: NotRequired[dict[str, str]]


class AdmissionReview(TypedDict):
    apiVersion: str
    kind: Literal["AdmissionReview"]
    response: AdmissionResponse


def parse_review(body: bytes) -> tuple[str, AdmissionRequest]:
    """(apiVersion, request) of an AdmissionReview body, or :class:`ReviewError`."""
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ReviewError("body is not JSON; expected an AdmissionReview") from None
    if not isinstance(review, dict):
        raise ReviewError("body is not a JSON object; expected an AdmissionReview")
    api_version, kind = review.get("apiVersion"), review.get("kind")
    if kind != "AdmissionReview" or api_version not in API_VERSIONS:
        raise ReviewError(
            f"expected kind AdmissionReview of admission.k8s.io/v1, got kind {kind!r} "
            f"apiVersion {api_version!r}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise ReviewError("AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("AdmissionReview request has no uid")
    for field in ("object", "oldObject"):
        if request.get(field) is not None and not isinstance(request[field], dict):
            raise ReviewError(f"AdmissionReview request.{field} is not an object")
    return str(api_version), cast(AdmissionRequest, request)


def is_pod_resize(request: AdmissionRequest) -> bool:
    """The only requests this webhook acts on: UPDATE of pods/resize in the core group."""
    resource: object = request.get("resource")
    return (
        (type(resource) is dict or isinstance(resource, Mapping))
        and resource.get("group", "") == ""
        and resource.get("resource") == "pods"
        and request.get("subResource") == "resize"
        and request.get("operation") == "UPDATE"
    )


def clean_warnings(warnings: Sequence[str]) -> list[str]:
    """One line each, at most 120 characters, 4096 in all (the API server's limits)."""
    out: list[str] = []
    used = 0
    for w in warnings:
        line = clip(str(w), MAX_WARNING_CHARS)
        if not line or used + len(line) > MAX_WARNINGS_CHARS:
            continue
        out.append(line)
        used += len(line)
    return out


def clean_audit_annotations(annotations: Mapping[str, str]) -> dict[str, str]:
    """Only keys the API server accepts (no '/', a valid name of <= 63 characters)."""
    # Every answer carries the same few keys, with text values: checked in C when so.
    if annotations.keys() <= _VALID_AUDIT_KEYS and set(map(type, annotations.values())) <= {str}:
        return dict(annotations)
    return {k: str(v) for k, v in annotations.items() if _valid_audit_key(k)}


#: Keys :func:`_valid_audit_key` accepted (bounded: past it, no more are added).
_VALID_AUDIT_KEYS: set[str] = set()


def _valid_audit_key(key: str) -> bool:
    if key in _VALID_AUDIT_KEYS:
        return True
    if _AUDIT_KEY.fullmatch(key) is None:
        return False
    if len(_VALID_AUDIT_KEYS) < 256:
        _VALID_AUDIT_KEYS.add(key)
    return True


def response(
    api_version: str,
    uid: str,
    *,
    allowed: bool = True,
    code: int | None = None,
    message: str = "",
    reason: str = "",
    warnings: Sequence[str] = (),
    audit: Mapping[str, str] | None = None,
    patch: list[dict[str, Any]] | None = None,
) -> AdmissionReview:
    """An AdmissionReview answering request ``uid``; ``patch`` only for mutating answers."""
    resp: AdmissionResponse = {"uid": uid, "allowed": allowed}
    if not allowed:
        status: Status = {"code": code or 403, "message": message}
        if reason:
            status["reason"] = reason
        resp["status"] = status
    cleaned = clean_warnings(warnings)
    if cleaned:
        resp["warnings"] = cleaned
    annotations = clean_audit_annotations(audit or {})
    if annotations:
        resp["auditAnnotations"] = annotations
    if patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": resp}


# -- the engine ----------------------------------------------------------------------------

Endpoint = Literal["validate", "mutate"]
PREFIX = "resize-preemption: "

log = logging.getLogger(__name__)


class _Inputs(NamedTuple):
    """Everything a decision reads, taken from the cache once, at one time."""

    old: Pod
    new: Pod
    node: Node
    pods: tuple[Pod, ...]
    budgets: tuple[DisruptionBudget, ...]
    #: The node and its pods as the plan reads them: from the memo.
    view: NodeView


def _repeat(plan: Plan | None) -> bool:
    """Whether ``plan`` answers a resize asked for again: its victims were counted when
    it was admitted."""
    return plan is not None and plan.code == "admitted"


def _audit(plan: Plan) -> dict[str, str]:
    short = plan.unmet if plan.verdict == "infeasible" else plan.shortfall
    return {
        "verdict": plan.verdict,
        "reason": plan.code,
        "node": plan.node,
        "victims": ",".join(plan.victim_keys),
        "shortfall": f"cpu={format_amount('cpu', short.cpu)},"
        f"memory={format_amount('memory', short.memory)}",
    }


class AdmissionEngine:
    """Answers AdmissionRequests for ``pods/resize``; thread-safe, holds no request state."""

    def __init__(
        self,
        config: Config,
        cluster: ClusterView,
        ledger: Ledger,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
        after: After | None = None,
        on_floor_errors: Callable[[Sequence[tuple[PodRef, str]]], object] | None = None,
        pause: Callable[[Pod], Pause | None] | None = None,
    ) -> None:
        self.config = config
        #: Judges which victims are checkpointed, for the plans' messages.
        self.pause = pause
        self.cluster = cluster
        self.ledger = ledger
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.timer = timer
        #: Runs what follows an answer - counting the review, its decision-log line -
        #: at once by default; the service hands it to a :class:`~.backlog.Backlog`.
        self.after: After = after or run_now
        #: Hears of candidates whose floor annotation is malformed (a plan names them),
        #: after the answer, in batches; for a warning event on each (webhook.service).
        self.on_floor_errors = on_floor_errors
        self.policy = config.policy()
        self.preemptors = config.preemptors()
        self._memo = NodeMemo(self.policy)
        self._elsewhere = Elsewhere(cluster, ledger)
        self._counted: dict[tuple[str, str], Any] = {}

    # -- entry points ---------------------------------------------------------------

    def answer(
        self, api_version: str, request: AdmissionRequest, endpoint: Endpoint
    ) -> AdmissionReview:
        """The AdmissionReview to send back for ``request``."""
        d = self.validate(request) if endpoint == "validate" else self.mutate(request)
        return response(
            api_version,
            d.uid,
            allowed=d.allowed,
            code=d.code,
            message=d.message,
            reason="Forbidden" if not d.allowed else "",
            warnings=d.warnings,
            audit=d.audit if endpoint == "validate" else None,
            patch=d.patch if endpoint == "mutate" else None,
        )

    def validate(self, request: AdmissionRequest) -> Decision:
        return self._guarded(request, "validate", self._validate)

    def mutate(self, request: AdmissionRequest) -> Decision:
        return self._guarded(request, "mutate", self._mutate)

    # -- the fail-open frame ----------------------------------------------------------

    def _guarded(
        self,
        request: AdmissionRequest,
        endpoint: Endpoint,
        decide: Callable[[AdmissionRequest], Decision],
    ) -> Decision:
        start = self.timer()
        uid = str(request.get("uid", ""))
        if not is_pod_resize(request):
            decision = Decision(uid)
        else:
            try:
                decision = decide(request)
            except InputError as e:
                decision = self._failed_open(uid, "input", f"could not read this resize: {e}")
            except WebhookError as e:
                decision = self._failed_open(uid, "cluster", f"could not plan this resize: {e}")
        elapsed = self.timer() - start
        self.after(
            self._account,
            Facts(
                endpoint,
                str(request.get("namespace", "")),
                str(request.get("name", "")),
                bool(request.get("dryRun")),
                elapsed,
                decision,
            ),
        )
        plan = decision.plan
        if plan is not None and plan.floor_errors and self.on_floor_errors is not None:
            self.after(self._floor_errors, plan.floor_errors)
        return decision

    def _floor_errors(self, batches: Sequence[tuple[tuple[PodRef, str], ...]]) -> None:
        if self.on_floor_errors is not None:
            self.on_floor_errors([error for batch in batches for error in batch])

    def _failed_open(self, uid: str, where: str, message: str) -> Decision:
        self.metrics.errors.labels(where).inc()
        return Decision(uid, verdict="error", warnings=(PREFIX + message,), error=message)

    def _account(self, batch: Sequence[Facts]) -> None:
        """Count a batch of answered reviews and write their decision-log lines."""
        metrics = self.metrics
        counts: dict[tuple[str, str], int] = {}
        latencies: dict[str, list[float]] = {}
        victims: list[int] = []
        attempts: dict[str, int] = {}
        logging_on = decision_logger.isEnabledFor(logging.INFO)
        lines: list[bytes] = []
        for facts in batch:
            d = facts.decision
            key = (facts.endpoint, d.verdict)
            counts[key] = counts.get(key, 0) + 1
            latencies.setdefault(facts.endpoint, []).append(facts.elapsed)
            if d.plan is not None:
                attempts[d.plan.verdict] = attempts.get(d.plan.verdict, 0) + 1
            entry = d.admitted
            if entry is not None and entry.victims and not _repeat(d.plan):
                victims.append(len(entry.victims))
            if logging_on and d.verdict != "ignored":
                try:
                    lines.append(line(facts, self.config.mode))
                except Exception:
                    # A line that cannot be written must not cost the batch its counts.
                    log.exception("decision-log line of review %s", d.uid)
        # Counters move once per batch: in a worker of several, each move is a write to
        # a shared file.
        for key, n in counts.items():
            self._counter(key).inc(n)
        for endpoint, amounts in latencies.items():
            latency = metrics.review_latency.labels(endpoint)
            for amount in amounts:
                latency.observe(amount)
        for verdict, n in attempts.items():
            metrics.count_attempt(verdict, n)
        if victims:
            metrics.victims_planned.inc(sum(victims))
            for n in victims:
                metrics.victims_per_plan.observe(n)
        if lines:
            emit(lines)

    def _counter(self, key: tuple[str, str]) -> Any:
        """The review counter of (endpoint, verdict)."""
        counter = self._counted.get(key)
        if counter is None:
            # Looked up once: labels() takes a lock and builds a key each time.
            counter = self._counted[key] = self.metrics.reviews.labels(*key)
        return counter

    # -- reading the request ----------------------------------------------------------

    def _scene(self, request: AdmissionRequest, now: float) -> _Inputs | Decision:
        uid = request["uid"]
        new_obj, old_obj = request.get("object"), request.get("oldObject")
        # Decoded JSON is plain dicts: told apart before the (slower) ABC check.
        if not (type(new_obj) is dict or isinstance(new_obj, Mapping)) or not (
            type(old_obj) is dict or isinstance(old_obj, Mapping)
        ):
            raise InputError("the request lacks object or oldObject")
        stale = self.cluster.staleness()
        if not self.config.cache_current(stale):
            # The node may have changed since: a plan on this view could evict for room
            # that is free already. The reconciler plans the resize once the watches are
            # back if the kubelet defers it.
            self.metrics.errors.labels("stale-cache").inc()
            message = (
                f"cluster cache out of date (watches lost {stale:.0f}s ago, bound "
                f"{self.config.max_cache_staleness:g}s); resize allowed without a plan"
            )
            return Decision(uid, verdict="error", warnings=(PREFIX + message,), error=message)
        self._catch_up(old_obj)
        scene = self._claimed(request, old_obj, new_obj)
        if isinstance(scene, Decision):
            return scene
        old, new = scene
        node_name = old.node
        node = self.cluster.node(node_name) if node_name else None
        if node is None:
            if not node_name:
                return Decision(uid, verdict="not-eligible")
            self.metrics.errors.labels("unknown-node").inc()
            return Decision(
                uid,
                verdict="error",
                warnings=(PREFIX + f"node {node_name} is not known yet; resize not planned",),
                error=f"node {node_name} not in cache",
            )
        pods = tuple(self.cluster.pods_on(node.name))
        budgets = tuple(self.cluster.budgets(frozenset({p.namespace for p in pods})))
        return _Inputs(old, new, node, pods, budgets, self._memo.of(node, pods, budgets, now))

    def _catch_up(self, old_obj: Mapping[str, Any]) -> None:
        """Wait, at most :data:`CATCH_UP` seconds, until the view holds the pod as
        ``oldObject`` names its version, and so every pod write before it: a resize sent
        the moment its neighbours were bound would otherwise be planned, or reduced, on
        a node that lacks them. A claimed version never written costs only the wait; the
        review is then planned on the view as it is."""
        meta = old_obj.get("metadata")
        version = meta.get("resourceVersion") if type(meta) is dict else None
        if not isinstance(version, str) or not comparable(version):
            return
        if not self.cluster.caught_up(version, CATCH_UP):
            self.metrics.errors.labels("cache-behind").inc()

    def _claimed(
        self, request: AdmissionRequest, old_obj: Mapping[str, Any], new_obj: Mapping[str, Any]
    ) -> tuple[Pod, Pod] | Decision:
        """The pod as the cache holds it, and its resize as the review asks for it
        (:func:`~webhook.core.resize.resize_of`): everything but the resize's resources is
        read from the cache. ``unverified`` - allowed, naming nobody, writing nothing -
        when the cache holds no pod of the review's namespace, name and uid, or when
        ``oldObject`` or ``object`` says something of it that the cache does not.

        The review port may be open to callers other than the API server (no
        ``client-ca``), so the body is a claim: planned on as it says, a review could
        reserve room for a pod on a node it is not on, or under a namespace or priority
        it does not have. A real review the cache has not caught up with yet is allowed
        the same way; if the kubelet defers it, the reconciler plans it from the cache
        (docs/reconciler.md)."""
        namespace, name = request.get("namespace"), request.get("name")
        cached = self.cluster.pod(str(namespace), str(name)) if namespace and name else None
        if cached is None:
            return self._unverified(request, "the service's cache holds no such pod")
        resolver = self.cluster.priority_resolver()
        stored = self._stored_pod(old_obj)
        if stored is None or stored.uid != cached.uid:
            old = parse_pod(old_obj, resolver)
            if (old.uid, old.node, old.priority, _declared(old)) != (
                cached.uid,
                cached.node,
                cached.priority,
                _declared(cached),
            ):
                return self._unverified(request, "oldObject is not the pod as the cache holds it")
        new = resize_of(cached, parse_pod(new_obj, resolver))
        if isinstance(new, str):
            return self._unverified(request, new)
        return cached, new

    def _unverified(self, request: AdmissionRequest, why: str) -> Decision:
        self.metrics.unverified_reviews.inc()
        message = "the pod is not as the service's cache holds it; resize not planned"
        return Decision(
            request["uid"], verdict="unverified", warnings=(PREFIX + message,), error=why
        )

    def _stored_pod(self, obj: Mapping[str, Any]) -> Pod | None:
        """The view's pod when it is this very version of the stored object ``obj`` (same
        uid and resourceVersion): the cache parsed it when the watch delivered it, so the
        review need not parse it again. None otherwise (the cache lags, or ``obj`` is
        not what the API server stores), and ``obj`` is parsed.

        The view's copy may carry fewer annotations (the cache keeps only its own
        prefix); the old pod is read for its accounting alone - what it holds, its resize
        state, its declared resources - which the version fixes."""
        meta = obj.get("metadata")
        if type(meta) is not dict:
            return None
        version, name, namespace = (
            meta.get("resourceVersion"),
            meta.get("name"),
            meta.get("namespace"),
        )
        if not version or not isinstance(name, str) or not isinstance(namespace, str):
            return None
        pod = self.cluster.pod(namespace, name)
        if pod is None or pod.resource_version != version or pod.uid != meta.get("uid"):
            return None
        return pod

    def _planner(self, s: _Inputs, uid: str, now: float) -> ResizePlanner:
        config = self.config
        labels = self.cluster.namespace_labels(s.new.namespace)
        return ResizePlanner(
            s.old,
            s.new,
            s.node,
            s.view,
            s.budgets,
            now,
            uid,
            True,
            config,
            self.policy,
            self._elsewhere,
            self.preemptors.refusal(s.new, labels),
            self.pause,
        )

    # -- validating -------------------------------------------------------------------

    def _validate(self, request: AdmissionRequest) -> Decision:
        uid, now = request["uid"], self.clock()
        scene = self._scene(request, now)
        if isinstance(scene, Decision):
            return scene
        acting = self.config.mode != "warn" and not request.get("dryRun")
        planner = self._planner(scene, uid, now)
        if not acting:
            holders = room_holders(self.ledger.entries(scene.node.name), scene.pods, now)
            return self._verdict(uid, planner.plan(holders), admitted=None, acting=False)
        change = admit(planner, scene.pods, now)
        planned, admitted = self.ledger.update(scene.node.name, change)
        assert planned is not None  # a review is always planned
        return self._verdict(uid, planned, admitted=admitted, acting=True)

    def _verdict(
        self, uid: str, plan: Plan, *, admitted: LedgerEntry | None, acting: bool
    ) -> Decision:
        warnings = warnings_for(plan, enforcing=acting)
        # A dry run only skips the side effects: it gets the answer the real request would
        # get, denial included (``kubectl patch --dry-run=server`` is how people ask).
        denied = self.config.mode == "deny-infeasible" and plan.verdict == "infeasible"
        return Decision(
            uid,
            allowed=not denied,
            verdict=plan.verdict,
            plan=plan,
            warnings=tuple(warnings),
            audit=_audit(plan),
            code=403 if denied else None,
            message=f"{PREFIX}{plan.reason}" if denied else "",
            admitted=admitted,
        )

    # -- mutating ---------------------------------------------------------------------

    def _mutate(self, request: AdmissionRequest) -> Decision:
        uid = request["uid"]
        new_obj = request.get("object")
        # Hostile input reaches here unparsed: read the opt-in without assuming shapes.
        meta = new_obj.get("metadata") if isinstance(new_obj, Mapping) else None
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        if not isinstance(annotations, Mapping) or not _opted_in(annotations):
            return Decision(uid)
        now = self.clock()
        scene = self._scene(request, now)
        if isinstance(scene, Decision):
            return scene
        if not _fits_to_node(scene.old):
            return Decision(uid)  # the review claims an opt-in that the stored pod lacks
        entries = room_holders(self.ledger.entries(scene.node.name), scene.pods, now)
        fitted = largest_fit(
            scene.old,
            scene.new,
            scene.view,
            now=now,
            budgets=scene.budgets,
            reservations=[e.reservation() for e in entries],
            policy=self.policy,
        )
        if fitted is None:
            return Decision(uid, verdict="unchanged")
        reduced, plan = fitted
        assert new_obj is not None
        patch, changes = _resources_patch(new_obj, scene.new, reduced)
        if self.config.mode == "warn":
            # Trial rollouts tell and never change anything, not even the request.
            message = f"resize would be reduced to fit {scene.node.name}: " + ", ".join(changes)
            return Decision(uid, verdict="unchanged", plan=plan, warnings=(PREFIX + message,))
        message = f"resize reduced to fit {scene.node.name}: " + ", ".join(changes)
        return Decision(
            uid, verdict="reduced", plan=plan, warnings=(PREFIX + message,), patch=patch
        )


def _opted_in(annotations: Mapping[str, Any]) -> bool:
    return str(annotations.get(FIT_TO_NODE_ANNOTATION, "")).lower() == "true"


def _fits_to_node(pod: Pod) -> bool:
    """Whether ``pod`` opted in to the mutating endpoint (:data:`FIT_TO_NODE_ANNOTATION`)."""
    return _opted_in(pod.annotations)


def _declared(pod: Pod) -> tuple[object, ...]:
    """What a pod declares that a plan counts: its containers' and the pod's resources."""
    return (pod.containers, pod.init_containers, pod.overhead, pod.pod_requests, pod.pod_limits)


def _resources_patch(
    obj: Mapping[str, Any], before: Pod, after: Pod
) -> tuple[list[dict[str, Any]], list[str]]:
    """A JSONPatch turning ``obj``'s container resources into ``after``'s, and a summary."""
    target = copy.deepcopy(dict(obj))
    changes: list[str] = []
    containers = target.get("spec", {}).get("containers", [])
    by_name = {c.get("name"): c for c in containers if isinstance(c, dict)}
    for old_c, new_c in zip(before.containers, after.containers, strict=True):
        if old_c == new_c:
            continue
        raw = by_name[new_c.name].get("resources")
        for kind, amounts in (("requests", new_c.requests), ("limits", new_c.limits)):
            # Only amounts the container declares are rewritten; an absent or null
            # section declares none.
            section = raw.get(kind) if isinstance(raw, dict) else None
            if not isinstance(section, dict):
                continue
            for name in RESOURCE_NAMES:
                if name not in section:
                    continue
                value = amounts.get(name)
                section[name] = format_cpu(value) if name == "cpu" else format_memory(value)
        for name in RESOURCE_NAMES:
            if old_c.requests.get(name) != new_c.requests.get(name):
                changes.append(
                    f"{new_c.name} {name} {format_amount(name, old_c.requests.get(name))} -> "
                    f"{format_amount(name, new_c.requests.get(name))}"
                )
    return jsonpatch.make_patch(dict(obj), target).patch, changes
