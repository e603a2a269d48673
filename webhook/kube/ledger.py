"""The reservation ledger in the Kubernetes API: one ``coordination.k8s.io/v1`` Lease per node.

Every replica and process of the webhook shares it, so a resize admitted by one sees the
room reserved by another. Layout of one node's Lease::

    metadata:
      name: rpw-ledger-<node>          (hash-suffixed when longer than a name may be)
      namespace: <config.namespace>
      labels:
        app.kubernetes.io/managed-by: resize-preemption-webhook
        resize-preemption.io/role: ledger
      annotations:
        resize-preemption.io/node: <node>
        resize-preemption.io/ledger: <encode_entries(...)>   (a JSON list, "[]" when empty)
    spec:
      holderIdentity: <identity of the last writer>         (for people reading it)
      renewTime: <time of the last write>

Reads (:meth:`LeaseLedger.entries`) come from a watch-fed cache of these Leases: no API
call. Writes (:meth:`LeaseLedger.update`) are optimistic: compute from the cached entries,
PUT with the cached resourceVersion (or POST when there is no Lease yet); on 409 re-GET,
recompute, retry. The writer's cache takes the write's response at once, so a process
always reads its own writes. Leases are kept when they empty, for reuse.

Writes to one node's Lease from one process go one at a time (:class:`_WriteTurns`): two
at once could only conflict at the API server, and each conflict costs a GET and another
PUT - under a flood of reviews of one node's pods, a storm of them, with almost every
review waiting past the API server's timeout (docs/reliability.md, "Ledger writes under
a flood").
The others wait their turn, at most :data:`MAX_QUEUED` of them and each at most
:data:`QUEUE_WAIT` seconds; past either bound the write fails at once (:class:`Busy`, a
``ClusterError``: the review fails open, the worker and the reconciler try again later).
A change that writes nothing never waits.

A write can land after its writer gave up on it: etcd stalls with the request in its
socket buffer, the API server and then the webhook time out, the review is answered as
failed open (no reservation) - and when etcd runs again it applies the write (seen in
``tests/e2e/test_control_plane_faults.py``). Such an admission entry would have the
worker evict for a review that told its user nobody was preempted. So an admission entry
that a live watch delivers more than :data:`LATE_AFTER` seconds after its admission is
void: left out of every read and of what the next write keeps, and dropped from the Lease
by the leader's next worker pass (:meth:`LeaseLedger.untidy`). The reconciler plans the
resize afresh if the kubelet defers it. An entry first seen in a LIST (a process that
starts, or relists, after the late write landed and before it was dropped) cannot be told
apart and counts.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

from kubernetes.client import CoordinationV1Api

from webhook.base.loop import Backoff
from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.errors import ObjectError
from webhook.engine.ledger import (
    LedgerChange,
    LedgerEntry,
    LedgerFull,
    R,
    check_size,
    decode_entries,
    encode_entries,
    on_local_clock,
)
from webhook.kube import reflector as rf
from webhook.kube.errors import ClusterError, Conflict, NotFound
from webhook.kube.jsonapi import request_json

log = logging.getLogger(__name__)

LEDGER_ANNOTATION: Final = "resize-preemption.io/ledger"
NODE_ANNOTATION: Final = "resize-preemption.io/node"
LABELS: Final[Mapping[str, str]] = {
    "app.kubernetes.io/managed-by": "resize-preemption-webhook",
    "resize-preemption.io/role": "ledger",
}
LABEL_SELECTOR: Final = ",".join(f"{k}={v}" for k, v in LABELS.items())
NAME_PREFIX: Final = "rpw-ledger-"
#: Lease names are DNS subdomains.
MAX_NAME: Final = 253
MAX_ATTEMPTS: Final = 8
#: (connect, read) seconds for one ledger request: the admission path waits for it, and
#: the API server gives the webhook a few seconds in all.
WRITE_TIMEOUT: Final = (2.0, 3.0)

#: Writes of one node that may wait for their turn in one process, beyond the one going:
#: at a few milliseconds a write, a fraction of a second of them.
MAX_QUEUED: Final = 50
#: Seconds a write may wait for its turn. The API server gives a review 5 s in all
#: (``timeoutSeconds``), and the write itself may take up to WRITE_TIMEOUT after it.
QUEUE_WAIT: Final = 1.0

#: Seconds after its admission an entry may still first arrive. Past the webhook's
#: ``timeoutSeconds`` (5 s in deploy/) the API server has stopped waiting for the review
#: and let the resize through as failed open, whatever the webhook answers later; the
#: rest is room for watch delay and clock offsets between replicas. A writer's clock that
#: is further behind makes its entries void: its resizes are planned by the reconciler.
LATE_AFTER: Final = 8.0
#: Seconds after a watch opens during which it may be replaying the past, not now.
REPLAY_WINDOW: Final = 2.0

#: ``callback(node, entries)`` after a node's entries changed (watch or own write).
LedgerSubscriber = Callable[[str, tuple[LedgerEntry, ...]], None]


def lease_name(node: str) -> str:
    """``rpw-ledger-<node>``; a name too long keeps a prefix and gains a hash of the node."""
    name = NAME_PREFIX + node
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:12]
    # The cut may end on '.' or '-', which may not precede '-' in a DNS subdomain.
    head = name[: MAX_NAME - len(digest) - 1].rstrip(".-")
    return f"{head}-{digest}"


def _micro_time(epoch: float) -> str:
    # metav1.MicroTime: RFC 3339 with exactly six fractional digits.
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _rv_newer(candidate: str, current: str) -> bool:
    """Whether ``candidate`` is a later resourceVersion than ``current``.

    resourceVersions are opaque by contract but etcd revisions in practice; comparing them
    as integers keeps a late watch event from overwriting the response of our own newer
    write. Non-numeric versions are taken as newer (the watch is authoritative then).
    """
    if not current:
        return True
    try:
        return int(candidate) > int(current)
    except ValueError:
        return candidate != current


@dataclass(frozen=True, slots=True)
class LeaseState:
    """One node's ledger Lease as last seen."""

    name: str
    node: str
    resource_version: str
    entries: tuple[LedgerEntry, ...]


def parse_lease(obj: Mapping[str, Any]) -> LeaseState:
    """A ledger Lease -> :class:`LeaseState`. Entries that do not decode are dropped (see
    :func:`decode_entries`); a Lease without name or node raises :class:`ObjectError`."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        raise ObjectError("lease: metadata missing")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError("lease: metadata.name missing")
    annotations = meta.get("annotations")
    if not isinstance(annotations, Mapping):
        annotations = {}
    raw = annotations.get(LEDGER_ANNOTATION)
    entries = decode_entries(raw if isinstance(raw, str) else None)
    node = annotations.get(NODE_ANNOTATION)
    if not isinstance(node, str) or not node:
        if entries:
            node = entries[0].node
        elif name.startswith(NAME_PREFIX):
            node = name[len(NAME_PREFIX) :]
        else:
            raise ObjectError(f"lease {name}: cannot tell which node it is for")
    rv = meta.get("resourceVersion")
    return LeaseState(name, node, rv if isinstance(rv, str) else "", entries)


class Busy(ClusterError):
    """A node's ledger has more writes waiting in this process than it takes (see the
    module docstring); nothing was written."""


class _WriteTurns:
    """Writers of one node, one at a time; at most ``max_queued`` wait, each at most
    ``max_wait`` seconds, or :class:`Busy` is raised. Thread-safe (and greenlet-safe
    under gevent, whose patched locks these are)."""

    def __init__(self, max_queued: int, max_wait: float) -> None:
        self.max_queued = max_queued
        self.max_wait = max_wait
        self._lock = threading.Lock()
        #: node -> (its lock, writers holding or waiting for it)
        self._nodes: dict[str, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def turn(self, node: str) -> Iterator[None]:
        with self._lock:
            lock, count = self._nodes.get(node) or (threading.Lock(), 0)
            if count > self.max_queued:
                raise Busy(
                    f"ledger of node {node} busy: {count - 1} writes already waiting",
                    reason="Busy",
                )
            self._nodes[node] = (lock, count + 1)
        try:
            if not lock.acquire(timeout=self.max_wait):
                raise Busy(
                    f"ledger of node {node} busy: no turn to write within {self.max_wait:g}s",
                    reason="Busy",
                )
            try:
                yield
            finally:
                lock.release()
        finally:
            with self._lock:
                lock, count = self._nodes[node]
                if count == 1:
                    del self._nodes[node]
                else:
                    self._nodes[node] = (lock, count - 1)


class _LeaseStore:
    """Leases by object key and by node; thread-safe (the watch thread and writers both
    update it); an update older than what is stored is ignored.

    Entries are kept on this process's clock (:func:`~webhook.engine.ledger.on_local_clock`):
    each is read as of when this process first saw it - written, in an update (its own
    write or a watch event), or already there, in a list."""

    def __init__(self, clock: Callable[[], float] = time.time, ttl: float = math.inf) -> None:
        self._lock = threading.Lock()
        self._by_key: dict[str, LeaseState] = {}
        self._by_node: dict[str, LeaseState] = {}
        self._clock = clock
        self._ttl = ttl
        #: (pod uid, review uid) -> (local time first seen, seen written)
        self._seen: dict[tuple[str, str], tuple[float, bool]] = {}

    def _local(self, state: LeaseState, live: bool) -> LeaseState:
        """``state`` with its entries on this process's clock (called under the lock)."""
        if not state.entries:
            return state
        now = self._clock()
        entries = []
        for entry in state.entries:
            key = (entry.pod.uid, entry.review_uid)
            first = key not in self._seen
            seen, written = self._seen.setdefault(key, (now, live))
            local, why = on_local_clock(entry, seen=seen, live=written, ttl=self._ttl)
            if why and first:
                log.warning(
                    "ledger %s: entry of review %s (pod %s) %s", state.node,
                    entry.review_uid, entry.pod.key, why,
                )  # fmt: skip
            entries.append(local)
        return replace(state, entries=tuple(entries))

    def _forget_unseen(self) -> None:
        present = {(e.pod.uid, e.review_uid) for s in self._by_key.values() for e in s.entries}
        if len(present) < len(self._seen):
            self._seen = {k: v for k, v in self._seen.items() if k in present}

    def get(self, key: str) -> LeaseState | None:
        return self._by_key.get(key)

    def node(self, node: str) -> LeaseState | None:
        return self._by_node.get(node)

    def states(self) -> tuple[LeaseState, ...]:
        return tuple(self._by_node.values())

    def replace(self, items: Mapping[str, LeaseState]) -> list[rf.Delta[LeaseState]]:
        with self._lock:
            merged: dict[str, LeaseState] = {}
            for key, state in items.items():
                old = self._by_key.get(key)
                keep_old = old is not None and not _rv_newer(
                    state.resource_version, old.resource_version
                )
                merged[key] = old if keep_old and old is not None else self._local(state, False)
            changes = rf.diff(self._by_key, merged)
            self._by_key = merged
            self._by_node = {s.node: s for s in merged.values()}
            self._forget_unseen()
        return changes

    def upsert(self, key: str, view: LeaseState) -> rf.Delta[LeaseState] | None:
        with self._lock:
            old = self._by_key.get(key)
            if old is not None and not _rv_newer(view.resource_version, old.resource_version):
                return None
            view = self._local(view, True)
            self._by_key[key] = view
            self._by_node[view.node] = view
            self._forget_unseen()
        return rf.Delta("ADDED" if old is None else "MODIFIED", key, old, view)

    def remove(self, key: str) -> rf.Delta[LeaseState] | None:
        with self._lock:
            old = self._by_key.pop(key, None)
            if old is None:
                return None
            if self._by_node.get(old.node) is old:
                del self._by_node[old.node]
        return rf.Delta("DELETED", key, old, None)


class LeaseLedger:
    """A :class:`webhook.engine.ledger.Ledger` kept in Leases (see the module docstring).

    ``start()`` begins watching the Leases; ``wait_synced(timeout)`` waits for the first
    list. ``stop()`` ends the watch; it closes ``api`` only with ``close_client=True``
    (the client is usually shared with the cluster cache).

    Thread-safe: admission threads, the worker and the watch thread use it concurrently.
    """

    def __init__(
        self,
        api: Any,
        config: Config | None = None,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        close_client: bool = False,
        max_attempts: int = MAX_ATTEMPTS,
        timeout: tuple[float, float] = WRITE_TIMEOUT,
        max_queued: int = MAX_QUEUED,
        queue_wait: float = QUEUE_WAIT,
    ) -> None:
        self.config = config or Config()
        self._turns = _WriteTurns(max_queued, queue_wait)
        self.namespace = self.config.namespace
        self._api = api
        self._metrics = metrics
        self._clock = clock
        self._close_client = close_client
        #: Between two conflicting writes: a jittered, growing pause, so that writers that
        #: collided do not collide again.
        self._conflicts = Backoff(
            initial=0.005, factor=2.0, cap=0.2, jitter=(0.0, 1.0), attempts=max_attempts
        )
        self._timeout = timeout
        self._store = _LeaseStore(clock, self.config.reservation_ttl)
        self._last_ok: bool | None = None
        self._subscribers: list[LedgerSubscriber] = []
        self._sub_lock = threading.Lock()
        coordination = CoordinationV1Api(api)
        self.reflector: rf.Reflector[LeaseState] = rf.Reflector(
            rf.Resource(
                "leases",
                functools.partial(coordination.list_namespaced_lease, self.namespace),
                parse_lease,
                {"label_selector": LABEL_SELECTOR},
            ),
            self._store,
            notify=self._on_watch,
            resync_period=self.config.resync_period,
        )
        #: Review uids of admission entries whose write landed late (module docstring).
        self._void: frozenset[str] = frozenset()
        self._void_lock = threading.Lock()

    # -- reads (the Ledger protocol) -----------------------------------------------------

    def entries(self, node: str) -> tuple[LedgerEntry, ...]:
        """``node``'s entries as last seen, expired ones included (callers filter), void
        ones left out."""
        state = self._store.node(node)
        return self._valid(state.entries) if state is not None else ()

    def all_entries(self) -> tuple[LedgerEntry, ...]:
        return tuple(e for s in self._store.states() for e in self._valid(s.entries))

    def _valid(self, entries: tuple[LedgerEntry, ...]) -> tuple[LedgerEntry, ...]:
        void = self._void
        if not void:
            return entries
        return tuple(e for e in entries if e.review_uid not in void)

    def reachable(self) -> bool:
        """The last request to the API server succeeded, or the Lease watch is healthy."""
        return bool(self._last_ok) or self.reflector.healthy()

    # -- writes --------------------------------------------------------------------------

    def update(self, node: str, change: LedgerChange[R]) -> R:
        """Apply ``change`` to ``node``'s entries with optimistic concurrency.

        ``change`` sees the cached entries first; after a conflict it sees the Lease as
        just read from the API server. What it returns is written as it is: which entries
        live is the lifecycle's rule, not the store's. A Lease deleted behind the cache's
        back is created again.
        A change that writes waits for the node's turn in this process, then sees the
        entries as the writes before it left them. Raises :class:`Busy` when it cannot
        have its turn (module docstring), :class:`Conflict` after ``max_attempts``
        conflicts and another :class:`ClusterError` when the API server fails.
        """
        state = self._store.node(node)
        new, result = change(self._valid(state.entries) if state is not None else ())
        if new is None:
            return result
        with self._turns.turn(node):
            return self._write_turn(node, change, state, (new, result))

    def _write_turn(
        self,
        node: str,
        change: LedgerChange[R],
        seen: LeaseState | None,
        computed: tuple[tuple[LedgerEntry, ...] | None, R],
    ) -> R:
        state = self._store.node(node)
        tries = 0
        while not self._conflicts.spent(tries):
            tries += 1
            if tries == 1 and state is seen:
                # Nobody wrote while this waited: what ``change`` made of it still holds.
                new, result = computed
            else:
                new, result = change(self._valid(state.entries) if state is not None else ())
            if new is None:
                return result
            try:
                written = self._write(node, state, new, self._clock())
            except LedgerFull as e:
                # Room this node's resizes need goes unreserved until entries leave.
                log.warning("%s; the change is not written", e)
                if self._metrics is not None:
                    self._metrics.ledger_full.inc()
                raise
            except NotFound:
                if state is None:
                    raise  # the create itself failed: the namespace is missing
                # The cached Lease was deleted behind our back: stale, like a conflict.
                self._count_conflict()
                state = self._read(node)
                continue
            except Conflict as e:
                self._count_conflict()
                log.debug("ledger %s: %s (attempt %d)", node, e.message, tries)
                time.sleep(self._conflicts.delay(tries))
                state = self._read(node)
                continue
            self._apply_own(written)
            return result
        raise Conflict(
            f"ledger for node {node}: gave up after {tries} conflicting writes",
            status=409,
            reason="Conflict",
        )

    def _count_conflict(self) -> None:
        if self._metrics is not None:
            self._metrics.ledger_conflicts.inc()

    def _request(
        self, method: Any, path: str, body: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        try:
            out = request_json(self._api, method, path, body=body, timeout=self._timeout)
        except (Conflict, NotFound):
            # The API server answered: it is reachable.
            self._last_ok = True
            raise
        except ClusterError:
            self._last_ok = False
            raise
        self._last_ok = True
        return out

    def _collection(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"

    def _read(self, node: str) -> LeaseState | None:
        try:
            obj = self._request("GET", f"{self._collection()}/{lease_name(node)}")
        except NotFound:
            return None
        state = parse_lease(obj)
        self._apply_own(state)
        # The store's copy: its entries on this process's clock, as every change reads them.
        return self._store.node(node) or state

    def _write(
        self,
        node: str,
        state: LeaseState | None,
        entries: tuple[LedgerEntry, ...],
        now: float,
    ) -> LeaseState:
        name = state.name if state is not None else lease_name(node)
        metadata: dict[str, Any] = {
            "name": name,
            "namespace": self.namespace,
            "labels": dict(LABELS),
            "annotations": {
                NODE_ANNOTATION: node,
                LEDGER_ANNOTATION: check_size(node, encode_entries(entries), len(entries)),
            },
        }
        spec: dict[str, Any] = {"renewTime": _micro_time(now)}
        if self.config.identity:
            spec["holderIdentity"] = self.config.identity
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }
        if state is None:
            # AlreadyExists (409) is a Conflict: someone created it first; re-read.
            obj = self._request("POST", self._collection(), body)
        else:
            # resourceVersion makes the PUT conditional: 409 if anyone wrote since.
            metadata["resourceVersion"] = state.resource_version
            obj = self._request("PUT", f"{self._collection()}/{name}", body)
        return parse_lease(obj)

    def _apply_own(self, state: LeaseState) -> None:
        change = self._store.upsert(f"{self.namespace}/{state.name}", state)
        if change is not None:
            self._on_changes("leases", (change,))

    # -- change notifications ------------------------------------------------------------

    def subscribe(self, callback: LedgerSubscriber) -> Callable[[], None]:
        """Calls ``callback(node, entries)`` after a node's entries change (from the watch
        or this process's own writes), outside every lock; returns an unsubscribe
        function. Keep callbacks quick."""
        with self._sub_lock:
            self._subscribers.append(callback)
        return functools.partial(self._unsubscribe, callback)

    def _unsubscribe(self, callback: LedgerSubscriber) -> None:
        with self._sub_lock:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

    def _on_watch(self, kind: str, changes: Any) -> None:
        """Changes the Lease watch (or a relist) brought: late admission entries are made
        void before anyone hears of them."""
        opened = self.reflector.stream_age()
        if opened is not None and opened > REPLAY_WINDOW:
            now = self._clock()
            late: dict[str, str] = {}
            for change in changes:
                if change.new is None:
                    continue
                # New admissions only: an entry the worker changed keeps its review uid.
                known = {e.review_uid for e in change.old.entries} if change.old else set()
                late.update(
                    (e.review_uid, change.new.node)
                    for e in change.new.entries
                    if e.review_uid not in known
                    and not e.persisted
                    and now - e.admitted_at > LATE_AFTER
                )
            if late:
                self._make_void(late)
        self._on_changes(kind, changes)

    def _make_void(self, late: Mapping[str, str]) -> None:
        with self._void_lock:
            # Only uids still in some Lease are kept: the set stays as small as that.
            present = {e.review_uid for s in self._store.states() for e in s.entries}
            self._void = frozenset((self._void | late.keys()) & present)
        for uid, node in late.items():
            log.warning(
                "ledger %s: entry of review %s landed after its writer gave up (the review "
                "was answered as failed open); void, dropping it",
                node,
                uid,
            )
            if self._metrics is not None:
                self._metrics.errors.labels("ledger-late-write").inc()

    def untidy(self) -> frozenset[str]:
        """Nodes whose Lease still holds a void entry (the reads leave it out); the
        leader's worker writes them through the keep rule on its next pass."""
        void = self._void
        if not void:
            return frozenset()
        return frozenset(
            s.node for s in self._store.states() if any(e.review_uid in void for e in s.entries)
        )

    def _on_changes(self, _kind: str, changes: Any) -> None:
        with self._sub_lock:
            subscribers = tuple(self._subscribers)
        if not subscribers:
            return
        for change in changes:
            state = change.new if change.new is not None else change.old
            entries = self._valid(change.new.entries) if change.new is not None else ()
            if (
                change.old is not None
                and change.new is not None
                and change.old.entries == change.new.entries
            ):
                continue
            for callback in subscribers:
                try:
                    callback(state.node, entries)
                except Exception:
                    log.exception("ledger subscriber %r failed", callback)

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self.reflector.start()

    def synced(self) -> bool:
        return self.reflector.synced()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self.reflector.wait_synced(timeout)

    def stop(self, timeout: float = 5.0) -> None:
        self.reflector.stop(timeout)
        if self._close_client:
            self._api.close()


__all__ = [
    "LABELS",
    "LABEL_SELECTOR",
    "LEDGER_ANNOTATION",
    "MAX_QUEUED",
    "NODE_ANNOTATION",
    "QUEUE_WAIT",
    "Busy",
    "LeaseLedger",
    "LeaseState",
    "LedgerSubscriber",
    "lease_name",
    "parse_lease",
]
