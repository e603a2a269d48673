"""The cluster cache: pods, nodes, PodDisruptionBudgets, PriorityClasses and Namespaces,
list+watched.

:class:`ClusterCache` implements :class:`webhook.engine.ledger.ClusterView`. The admission
path reads it on every review, so reads take no lock and copy nothing: each index maps a
key to an immutable value (a view, or a tuple of views) that writers replace, never
mutate (copy-on-write per bucket). A reader may see one index a moment ahead of another;
it never sees a half-built bucket.

One :class:`~webhook.kube.reflector.Reflector` thread per kind keeps it current. Pods are
stored compacted (:class:`PodCompactor`): identical label sets, container specs, statuses
and quantities are shared between pods, and annotations are trimmed to this project's own
prefix, which is what keeps 150,000 pods within a few hundred megabytes.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final, Generic, TypeVar, cast

from kubernetes.client import CoreV1Api, PolicyV1Api, SchedulingV1Api

from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.model import (
    ANYWHERE,
    KEPT_ANNOTATION_PREFIXES,
    LOANS_ANNOTATION,
    Container,
    ContainerStatus,
    DisruptionBudget,
    Namespace,
    Node,
    Placement,
    Pod,
    PreemptionPolicyName,
    PriorityClass,
)
from webhook.core.objects import (
    PriorityResolver,
    parse_namespace,
    parse_node,
    parse_pdb,
    parse_pod,
    parse_priority_class,
)
from webhook.engine.rooms import NodeRooms
from webhook.kube.errors import ClusterError
from webhook.kube.reflector import (
    DEFAULT_PAGE_SIZE,
    DEFAULT_READ_TIMEOUT,
    Delta,
    Raw,
    Reflector,
    Resource,
    diff,
)

log = logging.getLogger(__name__)

V = TypeVar("V")
H = TypeVar("H", bound=Hashable)

PODS: Final = "pods"
NODES: Final = "nodes"
BUDGETS: Final = "poddisruptionbudgets"
PRIORITY_CLASSES: Final = "priorityclasses"
#: Their labels are what the preemptor policy's namespace selector reads.
NAMESPACES: Final = "namespaces"
KINDS: Final = (PODS, NODES, BUDGETS, PRIORITY_CLASSES, NAMESPACES)

#: Pods per LIST page. A decoded page of pods is ~20x its JSON size in Python objects and
#: the allocator keeps the high-water mark: pages of 100 instead of client-go's 500 cut the
#: cache's resident memory by about 40% at the same sync time (bench/cache_bench.py).
POD_PAGE_SIZE: Final = 100

#: ``callback(kind, event_type, old_view, new_view)``; ``event_type`` is ADDED, MODIFIED or
#: DELETED; ``old_view`` is None for ADDED, ``new_view`` None for DELETED.
Subscriber = Callable[[str, str, Any, Any], None]

#: Sets of namespaces whose budgets :meth:`ClusterCache.budgets` remembers at most (one
#: per node, as long as its pods' namespaces stay the same); past it, it starts afresh.
BUDGET_SETS_KEPT: Final = 8192

_EMPTY_MAP: Final[Mapping[str, Any]] = {}


# -- an indexed, copy-on-write store -----------------------------------------------------


class IndexedStore(Generic[V]):
    """A :class:`~webhook.kube.reflector.Sink` with secondary indexes.

    ``groups``: name -> function giving an item's group key (``None``: in no group); each
    group is a tuple, rebuilt when a member changes (so keep groups small: pods per node).

    Writers serialize on a lock; readers take none (see the module docstring).
    """

    def __init__(
        self,
        *,
        groups: Mapping[str, Callable[[V], str | None]] | None = None,
    ) -> None:
        self._group_fns = dict(groups or {})
        self._lock = threading.Lock()
        self._items: dict[str, V] = {}
        self._groups: dict[str, dict[str, tuple[V, ...]]] = {n: {} for n in self._group_fns}
        #: Counts the writes that changed something, each after its change is readable:
        #: a reader that remembers what it derived from the store checks it first.
        self.generation = 0

    # reads ------------------------------------------------------------------------------

    def get(self, key: str) -> V | None:
        return self._items.get(key)

    def group(self, index: str, key: str) -> tuple[V, ...]:
        return self._groups[index].get(key, ())

    def values(self) -> tuple[V, ...]:
        return tuple(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    # writes (the Sink protocol) ----------------------------------------------------------

    def replace(self, items: Mapping[str, V]) -> list[Delta[V]]:
        new_items = dict(items)
        groups: dict[str, dict[str, list[V]]] = {n: {} for n in self._group_fns}
        for view in new_items.values():
            for name, fn in self._group_fns.items():
                g = fn(view)
                if g is not None:
                    groups[name].setdefault(g, []).append(view)
        with self._lock:
            changes = diff(self._items, new_items)
            # Whole-dict swaps: a reader holds either the old dict or the new one.
            self._items = new_items
            self._groups = {n: {k: tuple(v) for k, v in g.items()} for n, g in groups.items()}
            self.generation += 1
        return changes

    def upsert(self, key: str, view: V) -> Delta[V] | None:
        with self._lock:
            old = self._items.get(key)
            if old is view:
                return None
            self._items[key] = view
            self._reindex(old, view)
            self.generation += 1
        return Delta("ADDED" if old is None else "MODIFIED", key, old, view)

    def remove(self, key: str) -> Delta[V] | None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is None:
                return None
            self._reindex(old, None)
            self.generation += 1
        return Delta("DELETED", key, old, None)

    def _reindex(self, old: V | None, new: V | None) -> None:
        for name, fn in self._group_fns.items():
            index = self._groups[name]
            g_old = fn(old) if old is not None else None
            g_new = fn(new) if new is not None else None
            if g_old is not None:
                bucket = index.get(g_old, ())
                if g_old == g_new and new is not None:
                    # Same group: swap in place, keeping the bucket's order.
                    index[g_old] = tuple(new if v is old else v for v in bucket)
                    continue
                kept = tuple(v for v in bucket if v is not old)
                if kept:
                    index[g_old] = kept
                else:
                    index.pop(g_old, None)
            if g_new is not None and new is not None:
                index[g_new] = (*index.get(g_new, ()), new)


# -- compact pods ------------------------------------------------------------------------


class _Interner(Generic[H]):
    """Shares equal hashable values. Bounded: the table is dropped when it gets large
    (values already shared stay shared; only future sharing restarts)."""

    __slots__ = ("_limit", "_table")

    def __init__(self, limit: int) -> None:
        self._table: dict[H, H] = {}
        self._limit = limit

    def __call__(self, value: H) -> H:
        got = self._table.get(value)
        if got is not None:
            return got
        if len(self._table) >= self._limit:
            self._table.clear()
        self._table[value] = value
        return value

    def seen(self, value: H) -> H | None:
        """The shared value equal to ``value``, or ``None``; shares nothing new."""
        return self._table.get(value)


class _MappingInterner(Generic[V]):
    """Shares equal mappings, keyed by their content's hash only (a colliding mapping is
    simply not shared), so a unique label set costs one int, not a copy of itself."""

    __slots__ = ("_limit", "_table")

    def __init__(self, limit: int) -> None:
        self._table: dict[int, Mapping[str, V]] = {}
        self._limit = limit

    def __call__(self, value: Mapping[str, V]) -> Mapping[str, V]:
        if not value:
            return _EMPTY_MAP
        h = hash(frozenset(value.items()))
        got = self._table.get(h)
        if got is not None and got == value:
            return got
        if len(self._table) >= self._limit:
            self._table.clear()
        self._table[h] = value
        return value

    def seen(self, value: Mapping[str, V]) -> Mapping[str, V] | None:
        """The shared mapping equal to ``value``, or ``None``; shares nothing new."""
        if not value:
            return _EMPTY_MAP
        got = self._table.get(hash(frozenset(value.items())))
        return got if got is not None and got == value else None


class PodCompactor:
    """Rebuilds a freshly parsed :class:`Pod` so that it shares what it has in common with others.

    Pods of one ReplicaSet have the same labels, containers, (mostly) statuses, owner and
    placement (the tolerations the API server adds to every pod, at least); the same few
    quantities and priorities recur across a whole cluster. Strings that repeat
    (namespace, node, label keys and values, container names, the controller's kind and
    uid, the preemption policy) are interned, and annotations are trimmed to
    :data:`KEPT_ANNOTATION_PREFIXES`. Not thread-safe: one per reflector.
    """

    def __init__(self, *, limit: int = 1 << 17) -> None:
        self._values: _Interner[Any] = _Interner(limit)
        # Numbers apart: equal numbers of another type (1.0, True) would share the int.
        self._priorities: _Interner[int] = _Interner(limit)
        self._labels: _MappingInterner[str] = _MappingInterner(limit)
        self._statuses: _MappingInterner[ContainerStatus] = _MappingInterner(limit)

    def compact(self, pod: Pod) -> Pod:
        """``pod`` with its parts shared with the pods compacted before it."""
        # Each part is looked up as parsed first: most are already shared, and then the
        # interned copy need not be built.
        share = self._values
        intern = sys.intern
        return replace(
            pod,
            namespace=intern(pod.namespace),
            node=intern(pod.node),
            priority=self._priorities(pod.priority),
            preemption_policy=cast(PreemptionPolicyName, intern(pod.preemption_policy)),
            phase=intern(pod.phase),
            qos_class=intern(pod.qos_class),
            labels=self._labels_of(pod.labels),
            annotations=_kept(pod.annotations),
            containers=self._containers(pod.containers),
            init_containers=self._containers(pod.init_containers),
            overhead=share(pod.overhead),
            pod_requests=share(pod.pod_requests),
            pod_limits=share(pod.pod_limits),
            pod_allocated=share(pod.pod_allocated) if pod.pod_allocated is not None else None,
            pod_actual=share(pod.pod_actual) if pod.pod_actual is not None else None,
            statuses=self._statuses_of(pod.statuses),
            controller=intern(pod.controller),
            controller_uid=intern(pod.controller_uid),
            placement=self._placement(pod.placement),
        )

    def _labels_of(self, labels: Mapping[str, str]) -> Mapping[str, str]:
        got = self._labels.seen(labels)
        if got is not None:
            return got
        intern = sys.intern
        return self._labels({intern(k): intern(v) for k, v in labels.items()})

    def _statuses_of(
        self, statuses: Mapping[str, ContainerStatus]
    ) -> Mapping[str, ContainerStatus]:
        got = self._statuses.seen(statuses)
        if got is not None:
            return got
        return self._statuses({s.name: self._status(s) for s in statuses.values()})

    def _placement(self, placement: Placement) -> Placement:
        if placement is ANYWHERE:
            return placement
        share = self._values
        got: Placement | None = share.seen(placement)
        if got is not None:
            return got
        # Its parts are shared on their own too: the pods of a DaemonSet have the same
        # tolerations, and terms that each name its own node.
        shared: Placement = share(
            Placement(
                share(placement.node_selector),
                share(placement.terms),
                share(placement.tolerations),
                sys.intern(placement.unknown),
            )
        )
        return shared

    def _status(self, status: ContainerStatus) -> ContainerStatus:
        share = self._values
        shared: ContainerStatus = share(
            ContainerStatus(
                sys.intern(status.name),
                share(status.allocated) if status.allocated is not None else None,
                share(status.actual) if status.actual is not None else None,
            )
        )
        return shared

    def _containers(self, containers: tuple[Container, ...]) -> tuple[Container, ...]:
        if not containers:
            return ()
        share = self._values
        got: tuple[Container, ...] | None = share.seen(containers)
        if got is not None:
            return got
        shared: tuple[Container, ...] = share(
            tuple(
                share(Container(sys.intern(c.name), share(c.requests), share(c.limits), c.sidecar))
                for c in containers
            )
        )
        return shared


def _kept(annotations: Mapping[str, str]) -> Mapping[str, str]:
    """The annotations a cached pod keeps (:data:`KEPT_ANNOTATION_PREFIXES`)."""
    if not annotations:
        return _EMPTY_MAP
    intern = sys.intern
    kept = {intern(k): v for k, v in annotations.items() if k.startswith(KEPT_ANNOTATION_PREFIXES)}
    return kept or _EMPTY_MAP


def _no_api(**_: Any) -> Any:
    raise ClusterError("this cache has no API client (offline use)")


# -- the cache ---------------------------------------------------------------------------


class ClusterCache:
    """An in-memory, watch-fed :class:`~webhook.engine.ledger.ClusterView`.

    ``start()`` launches one daemon reflector thread per kind; ``wait_synced(timeout)``
    blocks until every kind has been listed once; ``stop()`` ends the threads and closes
    the client's connection pools (``close_client=False`` keeps them, for a client shared
    with the ledger). ``api=None`` builds an offline cache, fed through
    :meth:`reflector` (``load_pages``) - for benchmarks and tests.

    ``freeze_gc`` (default on) calls ``gc.freeze()`` while pods are listed: the cached
    views are acyclic and long-lived, and without it every full cyclic collection walks
    all of them, a pause of seconds at 150,000 pods. The price: cyclic garbage that exists
    at that moment elsewhere in the process is never collected (views are freed by
    reference counting as usual).

    Subscribers (:meth:`subscribe`) are called after each change, in the reflector's
    thread, outside every lock; keep them quick (hand work to a queue). A full relist
    reports the differences it found as ADDED/MODIFIED/DELETED.
    """

    def __init__(
        self,
        api: Any | None,
        config: Config | None = None,
        *,
        metrics: Metrics | None = None,
        close_client: bool = True,
        page_size: int = DEFAULT_PAGE_SIZE,
        pod_page_size: int = POD_PAGE_SIZE,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        compact: bool = True,
        freeze_gc: bool = True,
    ) -> None:
        self.config = config or Config()
        self._api = api
        self._close_client = close_client
        self._subscribers: list[Subscriber] = []
        self._sub_lock = threading.Lock()
        self._resolver = PriorityResolver()
        self._compactor = PodCompactor() if compact else None

        self.pods: IndexedStore[Pod] = IndexedStore(
            groups={
                "node": lambda p: p.node or None,
                # Pods whose resize the kubelet deferred or found infeasible: the
                # reconciler's work list, kept small by construction.
                "pending": lambda p: "" if p.resize != "none" else None,
                # Lenders carrying a loan record: few, and the worker reads them each pass.
                "lenders": lambda p: "" if LOANS_ANNOTATION in p.annotations else None,
            },
        )
        self.nodes: IndexedStore[Node] = IndexedStore()
        self.budgets_store: IndexedStore[DisruptionBudget] = IndexedStore(
            groups={"namespace": lambda b: b.namespace}
        )
        self.classes: IndexedStore[PriorityClass] = IndexedStore()
        self.namespaces: IndexedStore[Namespace] = IndexedStore()
        self._rooms = NodeRooms()
        #: (budgets store generation, budgets by set of namespaces), as read at it.
        self._budgets_memo: tuple[int, dict[frozenset[str], tuple[DisruptionBudget, ...]]] = (
            -1,
            {},
        )

        self._reflectors: dict[str, Reflector[Any]] = {
            res.name: Reflector(
                res,
                store,
                notify=self._on_changes,
                resync_period=self.config.resync_period,
                page_size=pod_page_size if res.name == PODS else page_size,
                read_timeout=read_timeout,
                freeze_gc=freeze_gc and res.name == PODS,
            )
            for res, store in self._resources(api)
        }
        if metrics is not None:
            metrics.cache_age.set_function(self.age)

    def _resources(self, api: Any | None) -> list[tuple[Resource[Any], IndexedStore[Any]]]:
        """Each kind with its store, PriorityClasses first (pods list after them when
        possible, so that their priorities resolve); offline, listing raises."""
        lists: dict[str, Callable[..., Any]] = dict.fromkeys(KINDS, _no_api)
        if api is not None:
            core = CoreV1Api(api)
            lists = {
                PRIORITY_CLASSES: SchedulingV1Api(api).list_priority_class,
                NODES: core.list_node,
                BUDGETS: PolicyV1Api(api).list_pod_disruption_budget_for_all_namespaces,
                PODS: core.list_pod_for_all_namespaces,
                NAMESPACES: core.list_namespace,
            }
        return [
            (
                Resource(PRIORITY_CLASSES, lists[PRIORITY_CLASSES], parse_priority_class),
                self.classes,
            ),
            (Resource(NODES, lists[NODES], parse_node), self.nodes),
            (Resource(BUDGETS, lists[BUDGETS], parse_pdb), self.budgets_store),
            (Resource(PODS, lists[PODS], self._convert_pod), self.pods),
            (Resource(NAMESPACES, lists[NAMESPACES], parse_namespace), self.namespaces),
        ]

    # -- conversion ----------------------------------------------------------------------

    def _convert_pod(self, obj: Raw) -> Pod:
        pod = parse_pod(obj, self._resolver)
        return self._compactor.compact(pod) if self._compactor is not None else pod

    def _on_changes(self, kind: str, changes: Sequence[Delta[Any]]) -> None:
        if kind == PRIORITY_CLASSES:
            self._resolver = PriorityResolver(self.classes.values())
        elif kind in (NODES, PODS):
            self._mark_rooms(kind, changes)
        with self._sub_lock:
            subscribers = tuple(self._subscribers)
        for callback in subscribers:
            for change in changes:
                try:
                    callback(kind, change.type, change.old, change.new)
                except Exception:
                    log.exception("cache subscriber %r failed on %s", callback, kind)

    def _mark_rooms(self, kind: str, changes: Sequence[Delta[Any]]) -> None:
        """Tells the node rooms which nodes changed: a node itself, or the nodes a pod
        was and is bound to."""
        rooms = self._rooms
        for change in changes:
            if kind == NODES:
                rooms.changed(change.key)
                continue
            for pod in (change.old, change.new):
                if pod is not None and pod.node:
                    rooms.changed(pod.node)

    # -- ClusterView ---------------------------------------------------------------------

    def node(self, name: str) -> Node | None:
        return self.nodes.get(name)

    def all_nodes(self) -> Sequence[Node]:
        return self.nodes.values()

    def pods_on(self, node: str) -> Sequence[Pod]:
        """Pods bound to ``node`` (terminal ones included): an immutable tuple, no copy."""
        return self.pods.group("node", node)

    def node_rooms(self) -> NodeRooms:
        return self._rooms

    def pod(self, namespace: str, name: str) -> Pod | None:
        return self.pods.get(f"{namespace}/{name}")

    def budgets(self, namespaces: Iterable[str]) -> Sequence[DisruptionBudget]:
        # Every review asks for the budgets of its node's namespaces (the same frozenset
        # while the node's pods stay the same): remembered until a budget changes.
        key = namespaces if type(namespaces) is frozenset else frozenset(namespaces)
        store = self.budgets_store
        generation = store.generation
        seen, memo = self._budgets_memo
        if seen != generation or len(memo) >= BUDGET_SETS_KEPT:
            memo = {}
            self._budgets_memo = (generation, memo)
        found = memo.get(key)
        if found is None:
            found = memo[key] = tuple(b for ns in key for b in store.group("namespace", ns))
        return found

    def priority_resolver(self) -> PriorityResolver:
        return self._resolver

    def namespace_labels(self, name: str) -> Mapping[str, str] | None:
        found = self.namespaces.get(name)
        return None if found is None else found.labels

    def synced(self) -> bool:
        return all(r.synced() for r in self._reflectors.values())

    def age(self) -> float:
        """Seconds since the stalest kind last heard from the API server (inf before the
        first list): the cache is only as fresh as its oldest part. The API server sends
        an idle watch a bookmark about once a minute, so a healthy cache stays under ~60 s;
        past the watch read timeout (130 s) the connection is being replaced."""
        return max(r.age() for r in self._reflectors.values())

    def staleness(self) -> float:
        """Seconds the stalest kind may have missed changes for (see
        :meth:`~webhook.kube.reflector.Reflector.staleness`): 0 while every watch is open."""
        return max(r.staleness() for r in self._reflectors.values())

    def caught_up(self, version: str, timeout: float) -> bool:
        return self._reflectors["pods"].wait_for(version, timeout)

    # -- more reads for the worker and reconciler ----------------------------------------

    def lenders(self) -> tuple[Pod, ...]:
        return self.pods.group("lenders", "")

    def pending_resizes(self) -> tuple[Pod, ...]:
        """Pods whose ``PodResizePending`` is Deferred or Infeasible."""
        return self.pods.group("pending", "")

    def reflector(self, kind: str) -> Reflector[Any]:
        """The reflector of ``kind`` (one of :data:`KINDS`)."""
        return self._reflectors[kind]

    # -- lifecycle -----------------------------------------------------------------------

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Calls ``callback(kind, event_type, old, new)`` after every change; returns a
        function that unsubscribes it."""
        with self._sub_lock:
            self._subscribers.append(callback)
        return functools.partial(self._unsubscribe, callback)

    def _unsubscribe(self, callback: Subscriber) -> None:
        with self._sub_lock:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

    def start(self) -> None:
        """Starts the reflector threads (PriorityClasses first, so pods list after them
        when possible). Returns at once; see :meth:`wait_synced`."""
        if self._api is None:
            raise ClusterError("an offline ClusterCache cannot start")
        for reflector in self._reflectors.values():
            reflector.start()

    def wait_synced(self, timeout: float | None = None) -> bool:
        """True once every kind is listed; False if ``timeout`` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for reflector in self._reflectors.values():
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not reflector.wait_synced(remaining):
                return False
        return True

    def stop(self, timeout: float = 5.0) -> None:
        """Stops every reflector (all signalled first, then joined) and closes the pools."""
        for reflector in self._reflectors.values():
            reflector.request_stop()
        for reflector in self._reflectors.values():
            reflector.stop(timeout)
        if self._close_client and self._api is not None:
            self._api.close()


__all__ = [
    "BUDGETS",
    "KINDS",
    "NAMESPACES",
    "NODES",
    "PODS",
    "POD_PAGE_SIZE",
    "PRIORITY_CLASSES",
    "ClusterCache",
    "IndexedStore",
    "PodCompactor",
    "Subscriber",
]
