"""List+watch one kind of object into a store: client-go's reflector, for this client.

The official Python client has no informer, and its model classes are slow and large
(kubernetes-client/python #1867, #1921, #2284). A :class:`Reflector` therefore reads raw
bytes (``_preload_content=False``), parses them with orjson, and hands only slim views to a
:class:`Sink`:

1. **LIST** in pages of ``page_size`` (a 150,000-pod list is never held as one document);
   every item goes through ``Resource.convert``; the sink's contents are replaced at once.
2. **WATCH** from the list's ``resourceVersion`` with ``allowWatchBookmarks``, reading the
   chunked stream line by line: one line is one JSON watch event. ADDED/MODIFIED upsert,
   DELETED removes, BOOKMARK only advances the resourceVersion.
3. **410 Gone** (on connect, or as an ERROR event with code 410) means the resourceVersion
   was compacted away: relist. Other failures reconnect with jittered exponential backoff
   from the last resourceVersion seen (no relist needed).
4. **Resync**: a full relist every ``resync_period`` seconds repairs anything missed; an
   object whose resourceVersion did not change is not parsed again.
5. **Dead connections** are noticed by a socket read timeout (and TCP keep-alive); the
   server also ends each watch after a randomized 5-10 minutes, as client-go asks it to.
6. **Staleness** (:meth:`Reflector.staleness`): 0 while a watch stream is open, else the
   seconds since the last one ended or the last list was applied - how long changes may
   have been missed. The service decides nothing on a cache staler than its bound.

An object that ``convert`` rejects is logged once and skipped; if an earlier version of it
was stored, that version stays (for capacity accounting a stale pod is safer than none).

The byte-level steps (:class:`LineSplitter`, :func:`decode_event`, :func:`parse_list_page`)
and the application of events to a sink (:meth:`Reflector.load_pages`,
:meth:`Reflector.consume`) are separate from the I/O, so they are tested on byte fixtures.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, Protocol, TypeVar

import orjson
import urllib3.exceptions

from webhook.base.loop import Backoff
from webhook.core.errors import InputError
from webhook.core.versions import at_least, comparable
from webhook.kube.errors import TRANSLATABLE, ClusterError, Expired, translate

log = logging.getLogger(__name__)

V = TypeVar("V")
Raw = Mapping[str, Any]
DeltaType = Literal["ADDED", "MODIFIED", "DELETED"]

DEFAULT_PAGE_SIZE: Final = 500
#: client-go's minWatchTimeout: each watch asks the server to end it after 5-10 minutes.
WATCH_TIMEOUT_RANGE: Final = (300, 600)
#: A watch silent this long is presumed dead (the API server sends bookmarks about once a
#: minute to watchers that allow them); reconnecting from the last resourceVersion is cheap.
DEFAULT_READ_TIMEOUT: Final = 130.0
DEFAULT_CONNECT_TIMEOUT: Final = 10.0
#: A LIST page of 500 pods is ~1-2 MB; allow a slow API server.
LIST_READ_TIMEOUT: Final = 60.0


class StreamError(ClusterError):
    """A watch stream carried something that is not a watch event (truncated, garbage)."""


# -- pure parsing ------------------------------------------------------------------------


class LineSplitter:
    """Cuts a byte stream into lines; a line may span any number of chunks.

    The API server writes one JSON document per watch event, each ended by ``\\n``; the
    transport may split or merge them arbitrarily.
    """

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        """Complete lines in ``chunk`` (plus what was pending), without their newline.

        Blank lines are dropped.
        """
        if b"\n" not in chunk:
            self._pending += chunk
            return []
        self._pending += chunk
        *lines, rest = bytes(self._pending).split(b"\n")
        self._pending = bytearray(rest)
        return [line for line in lines if line.strip()]

    @property
    def pending(self) -> bytes:
        """Bytes of an unfinished line."""
        return bytes(self._pending)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One watch event: ``type`` is ADDED, MODIFIED, DELETED, BOOKMARK or ERROR."""

    type: str
    object: Raw


def decode_event(line: bytes) -> WatchEvent:
    """One line of a watch stream -> :class:`WatchEvent`; :class:`StreamError` if it is not
    ``{"type": str, "object": {...}}``."""
    try:
        raw = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise StreamError(f"watch line is not JSON ({e}): {line[:120]!r}") from None
    if not isinstance(raw, dict):
        raise StreamError(f"watch line is not an object: {line[:120]!r}")
    kind, obj = raw.get("type"), raw.get("object")
    if not isinstance(kind, str) or not isinstance(obj, dict):
        raise StreamError(f"watch line lacks type or object: {line[:120]!r}")
    return WatchEvent(kind, obj)


def _meta(obj: Raw) -> Raw:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def object_key(obj: Raw) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    meta = _meta(obj)
    name, namespace = meta.get("name"), meta.get("namespace")
    if not isinstance(name, str) or not name:
        raise StreamError("object without metadata.name")
    return f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name


def resource_version(obj: Raw) -> str:
    rv = _meta(obj).get("resourceVersion")
    return rv if isinstance(rv, str) else ""


def expired_status(obj: Raw) -> bool:
    """True for the ``Status`` of an ERROR event saying the resourceVersion is too old."""
    return obj.get("code") == 410 or obj.get("reason") in ("Expired", "Gone")


def error_from_status(obj: Raw) -> ClusterError:
    """The error an ERROR watch event (a ``metav1.Status``) stands for."""
    code = obj.get("code")
    reason = str(obj.get("reason") or "")
    message = f"watch error: {obj.get('message') or reason or 'unknown'}"
    status = code if isinstance(code, int) else None
    if expired_status(obj):
        return Expired(message, status=410, reason=reason or "Expired", body=obj)
    return ClusterError(message, status=status, reason=reason, body=obj)


@dataclass(frozen=True, slots=True)
class ListPage:
    """One page of a LIST: its items (raw), the list's resourceVersion, the continue token."""

    items: Sequence[Raw]
    resource_version: str
    continue_token: str


def parse_list_page(data: bytes) -> ListPage:
    """A ``...List`` response body -> :class:`ListPage`; :class:`StreamError` if malformed."""
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise StreamError(f"list response is not JSON: {e}") from None
    if not isinstance(raw, dict):
        raise StreamError("list response is not an object")
    items = raw.get("items")
    if items is None:
        items = []
    elif not isinstance(items, list):
        raise StreamError("list response: items is not a list")
    meta = _meta(raw)
    rv, token = meta.get("resourceVersion"), meta.get("continue")
    return ListPage(
        items=[i for i in items if isinstance(i, dict)],
        resource_version=rv if isinstance(rv, str) else "",
        continue_token=token if isinstance(token, str) else "",
    )


# -- stores ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Delta(Generic[V]):
    """What one event (or a relist) did to a store: ``old`` is ``None`` for ADDED, ``new``
    is ``None`` for DELETED."""

    type: DeltaType
    key: str
    old: V | None
    new: V | None


class Sink(Protocol[V]):
    """Where a reflector puts views. Called from the reflector's thread only, except where
    an implementation documents otherwise; each call returns what changed."""

    def get(self, key: str) -> V | None: ...

    def replace(self, items: Mapping[str, V]) -> list[Delta[V]]:
        """The complete contents after a LIST."""
        ...

    def upsert(self, key: str, view: V) -> Delta[V] | None: ...

    def remove(self, key: str) -> Delta[V] | None: ...


def diff(old: Mapping[str, V], new: Mapping[str, V]) -> list[Delta[V]]:
    """Changes turning ``old`` into ``new``; views are compared by identity (an unchanged
    object keeps its view object across relists)."""
    changes: list[Delta[V]] = []
    for key, view in new.items():
        before = old.get(key)
        if before is None:
            changes.append(Delta("ADDED", key, None, view))
        elif before is not view:
            changes.append(Delta("MODIFIED", key, before, view))
    changes.extend(Delta("DELETED", k, v, None) for k, v in old.items() if k not in new)
    return changes


# -- the reflector -----------------------------------------------------------------------


@dataclass(frozen=True)
class Resource(Generic[V]):
    """One kind to list and watch.

    ``list_func`` is a generated client method that lists and watches the kind, bound to
    its API object (e.g. ``CoreV1Api(api).list_pod_for_all_namespaces``, or
    ``functools.partial(CoordinationV1Api(api).list_namespaced_lease, namespace)``);
    ``list_kwargs`` are passed to every call (``label_selector``, ``field_selector``).
    ``convert`` turns a raw object into its view and raises :class:`InputError` for an
    object it cannot use.
    """

    name: str
    list_func: Callable[..., Any]
    convert: Callable[[Raw], V]
    list_kwargs: Mapping[str, Any] = field(default_factory=dict)


Notify = Callable[[str, "Sequence[Delta[Any]]"], None]


class Reflector(Generic[V]):
    """Keeps ``sink`` equal to the API server's set of ``resource`` objects.

    ``start()`` runs it in a daemon thread; ``stop()`` ends it (it interrupts a blocked
    watch read). ``notify(resource_name, changes)`` is called after each change is in the
    sink, from the reflector's thread and outside any store lock.
    """

    def __init__(
        self,
        resource: Resource[V],
        sink: Sink[V],
        *,
        notify: Notify | None = None,
        resync_period: float = 300.0,
        page_size: int = DEFAULT_PAGE_SIZE,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        watch_timeout: tuple[int, int] = WATCH_TIMEOUT_RANGE,
        freeze_gc: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.resource = resource
        #: Monotonic seconds, for freshness (a test's clock may stand still).
        self._clock = clock
        self._freeze_gc = freeze_gc
        self.sink = sink
        self._notify = notify
        self.resync_period = resync_period
        self.page_size = page_size
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._watch_timeout = watch_timeout
        #: resourceVersion to watch from: the last list's, advanced by every event once
        #: the sink holds it (:meth:`wait_for` waits on it).
        self.resource_version = ""
        self._advanced = threading.Condition()
        #: Each stored object's resourceVersion, so a relist skips unchanged objects.
        self._versions: dict[str, str] = {}
        #: Keys whose current version failed to convert (logged once per key).
        self._failed: set[str] = set()
        self._synced = threading.Event()
        self._stop = threading.Event()
        #: Set by reconnect(): the current watch is being cut on purpose.
        self._cut = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None
        self._response_lock = threading.Lock()
        self._last_heard = 0.0
        self._last_list = 0.0
        #: The last moment the sink was known to hold every change: a list applied, or
        #: the end of a watch stream (up to which it delivered every event).
        self._current_at = 0.0
        self._stream_opened = 0.0
        self._watching = False

    # -- state --------------------------------------------------------------------------

    def synced(self) -> bool:
        """True once a LIST has completed."""
        return self._synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def age(self) -> float:
        """Seconds since the API server last sent us anything (inf before the first)."""
        return self._clock() - self._last_heard if self._last_heard else float("inf")

    def staleness(self) -> float:
        """Seconds during which changes may have been missed: 0 while a watch stream is
        open, else since the last list was applied or the last watch ended (inf before the
        first list). A watch cut by the server, a restart or a refused reconnect shows
        here at once; a connection that dies silently (no FIN, no RST) only when the read
        timeout ends it."""
        if not self.synced():
            return float("inf")
        if self._watching:
            return 0.0
        return self._clock() - self._current_at

    def stream_age(self) -> float | None:
        """Seconds the current watch stream has been open; None while none is (a relist
        or a reconnect). A stream first replays what happened since the resourceVersion
        it started from; what it delivers later happened just now."""
        if not self._watching:
            return None
        return self._clock() - self._stream_opened

    def healthy(self) -> bool:
        """Synced, and a watch is open or the server was heard within the read timeout."""
        return self.synced() and (self._watching or self.age() < self._read_timeout)

    def _heard(self) -> None:
        self._last_heard = self._clock()

    def _advance(self, version: str) -> None:
        with self._advanced:
            self.resource_version = version
            self._advanced.notify_all()

    def wait_for(self, version: str, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds until the sink holds every write of the
        resource up to resource version ``version`` (the watch delivers them in order, so
        having applied a later one means having applied all before it). False on timeout,
        and at once when ``version`` is not comparable (:mod:`webhook.core.versions`)."""
        if not comparable(version):
            return False
        with self._advanced:
            return self._advanced.wait_for(
                lambda: at_least(self.resource_version, version) is True, timeout
            )

    # -- applying data (no I/O) ---------------------------------------------------------

    def _convert(self, key: str, obj: Raw) -> V | None:
        try:
            view = self.resource.convert(obj)
        except (InputError, ClusterError) as e:
            if key not in self._failed:
                self._failed.add(key)
                log.warning("%s %s skipped: %s", self.resource.name, key, e)
            return None
        except Exception:
            # A bug in a converter must not stop the cache; log it loudly, once.
            if key not in self._failed:
                self._failed.add(key)
                log.exception("%s %s skipped: converter failed", self.resource.name, key)
            return None
        self._failed.discard(key)
        return view

    def load_pages(self, pages: Iterable[ListPage]) -> list[Delta[V]]:
        """Replace the sink's contents with the items of ``pages`` (one complete LIST).

        Objects whose resourceVersion is unchanged keep their view; objects that fail to
        convert keep their previous view if they had one. Returns the changes, already
        passed to ``notify``.
        """
        items: dict[str, V] = {}
        versions: dict[str, str] = {}
        rv = ""
        for page in pages:
            if self._freeze_gc:
                # Views are acyclic and long-lived: move everything so far out of the
                # cyclic collector's reach, or each full collection walks millions of
                # objects (seconds with 150,000 pods) while admissions wait.
                gc.freeze()
            rv = page.resource_version or rv
            for obj in page.items:
                try:
                    key = object_key(obj)
                except StreamError:
                    continue
                version = resource_version(obj)
                # Recorded for failed objects too: the same bytes would fail again.
                versions[key] = version
                view = self.sink.get(key) if self._versions.get(key) == version else None
                if view is None:
                    view = self._convert(key, obj)
                    if view is None:
                        view = self.sink.get(key)
                if view is not None:
                    items[key] = view
        changes = self.sink.replace(items)
        if self._freeze_gc:
            gc.freeze()
        self._versions = versions
        self._failed &= versions.keys()
        self._advance(rv)
        self._last_list = self._current_at = self._clock()
        self._heard()
        self._synced.set()
        self._emit(changes)
        return changes

    def apply(self, event: WatchEvent) -> Delta[V] | None:
        """Apply one watch event. Raises :class:`Expired` for a 410 ERROR event and
        :class:`ClusterError` for any other ERROR event."""
        obj = event.object
        if event.type == "ERROR":
            raise error_from_status(obj)
        version = resource_version(obj)
        if event.type == "BOOKMARK":
            if version:
                self._advance(version)
            return None
        if event.type not in ("ADDED", "MODIFIED", "DELETED"):
            log.debug("%s: ignoring watch event type %s", self.resource.name, event.type)
            return None
        key = object_key(obj)
        change: Delta[V] | None
        if event.type == "DELETED":
            self._versions.pop(key, None)
            self._failed.discard(key)
            change = self.sink.remove(key)
        else:
            self._versions[key] = version
            view = self._convert(key, obj)
            change = None if view is None else self.sink.upsert(key, view)
        if version:
            self._advance(version)
        if change is not None:
            self._emit((change,))
        return change

    def consume(self, chunks: Iterable[bytes]) -> int:
        """Apply every event in a watch stream's byte chunks; returns how many lines were
        read. Raises :class:`Expired` on a 410 ERROR event, :class:`StreamError` on a line
        that is not a watch event; a partial last line (connection cut) is ignored."""
        splitter = LineSplitter()
        lines = 0
        for chunk in chunks:
            if self._stop.is_set() or self._cut.is_set():
                # Bytes read after the socket was shut down may be a torn chunk.
                break
            self._heard()
            for line in splitter.feed(chunk):
                lines += 1
                self.apply(decode_event(line))
        return lines

    def _emit(self, changes: Sequence[Delta[V]]) -> None:
        if self._notify is not None and changes:
            try:
                self._notify(self.resource.name, changes)
            except Exception:
                log.exception("%s: change subscriber failed", self.resource.name)

    # -- I/O ----------------------------------------------------------------------------

    def _pages(self) -> Iterator[ListPage]:
        token = ""
        while True:
            kwargs: dict[str, Any] = {"limit": self.page_size}
            if token:
                kwargs["_continue"] = token
            resp = self.resource.list_func(
                **self.resource.list_kwargs,
                **kwargs,
                _preload_content=False,
                _request_timeout=(self._connect_timeout, LIST_READ_TIMEOUT),
            )
            try:
                data = resp.read()
            finally:
                resp.release_conn()
            page = parse_list_page(data)
            del data
            yield page
            token = page.continue_token
            if not token or self._stop.is_set():
                return

    def relist(self) -> list[Delta[V]]:
        """One complete paginated LIST into the sink."""
        started = time.monotonic()
        changes = self.load_pages(self._pages())
        log.info(
            "%s: listed %d objects at resourceVersion %s in %.2fs (%d changes)",
            self.resource.name,
            len(self._versions),
            self.resource_version,
            time.monotonic() - started,
            len(changes),
        )
        return changes

    def _watch_seconds(self) -> int:
        seconds = random.randint(*self._watch_timeout)
        if self.resync_period > 0:
            due = self._last_list + self.resync_period - self._clock()
            seconds = min(seconds, max(1, int(due) + 1))
        return seconds

    def watch_once(self) -> None:
        """One watch request from :attr:`resource_version` until the server ends it, the
        socket read times out, or :meth:`stop` / :meth:`reconnect` is called."""
        self._cut.clear()
        resp = self.resource.list_func(
            **self.resource.list_kwargs,
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self._watch_seconds(),
            _preload_content=False,
            _request_timeout=(self._connect_timeout, self._read_timeout),
        )
        with self._response_lock:
            self._response = resp
        self._heard()
        self._stream_opened = self._clock()
        self._watching = True
        try:
            if self._stop.is_set():
                return
            chunks: Iterable[bytes]
            chunks = resp.stream(None) if resp.chunked else iter(lambda: resp.read1(65536), b"")
            self.consume(chunks)
        finally:
            self._current_at = self._clock()
            self._watching = False
            with self._response_lock:
                self._response = None
            # A watch rarely ends at a clean chunk boundary: never pool a half-read
            # connection. close() drops the socket; release_conn() frees the pool slot.
            resp.close()
            resp.release_conn()

    def _resync_due(self) -> bool:
        return self.resync_period > 0 and self._clock() - self._last_list >= self.resync_period

    def run(self) -> None:
        """The reflector loop; returns when :meth:`stop` is called."""
        # Waits between failed lists or watches, counted from the last success.
        reconnect = Backoff(initial=0.5, factor=2.0, cap=30.0, jitter=(0.8, 1.2))
        failures = 0
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list or self._resync_due():
                    self.relist()
                    need_list = False
                    failures = 0
                self.watch_once()
                # The server ended the watch (its timeout): continue from where we are.
                failures = 0
            except Expired as e:
                log.info("%s: %s; relisting", self.resource.name, e.message)
                need_list = True
            except (*TRANSLATABLE, ClusterError) as e:
                if self._stop.is_set():
                    break
                if self._cut.is_set():
                    # reconnect() cut the stream: not a failure, no backoff.
                    self._cut.clear()
                    continue
                err = translate(e)
                if isinstance(err, Expired):
                    need_list = True
                    log.info("%s: %s; relisting", self.resource.name, err.message)
                    continue
                if _is_read_timeout(e) and not need_list:
                    # A silent watch: reconnect from the last resourceVersion at once.
                    log.debug("%s: watch idle past the read timeout", self.resource.name)
                    continue
                failures += 1
                delay = reconnect.delay(failures)
                log.warning("%s: %s; retrying in %.1fs", self.resource.name, err.message, delay)
                self._stop.wait(delay)
            except Exception:
                if self._stop.is_set():
                    break
                failures += 1
                delay = reconnect.delay(failures)
                log.exception("%s: reflector failed; retrying in %.1fs", self.resource.name, delay)
                self._stop.wait(delay)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self.run, name=f"reflector-{self.resource.name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stops the loop and interrupts a blocked watch read; joins the thread."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def request_stop(self) -> None:
        """Asks the loop to end and interrupts a blocked watch read; does not wait."""
        self._stop.set()
        self._interrupt()

    def reconnect(self) -> None:
        """Drops the current watch connection; the loop reconnects at once from the last
        resourceVersion (and relists if the server says that is too old)."""
        self._cut.set()
        self._interrupt()

    def _interrupt(self) -> None:
        with self._response_lock:
            resp = self._response
        if resp is not None:
            # Unblocks the reader thread's recv() at once (urllib3 >= 2.3).
            with contextlib.suppress(OSError, RuntimeError, ValueError, AttributeError):
                resp.shutdown()


def _is_read_timeout(exc: BaseException) -> bool:
    # urllib3 turns a socket read timeout into ReadTimeoutError: the connection was alive
    # and merely quiet, unlike a refused or reset one.
    return isinstance(exc, urllib3.exceptions.ReadTimeoutError | TimeoutError)


__all__ = [
    "Delta",
    "LineSplitter",
    "ListPage",
    "Reflector",
    "Resource",
    "Sink",
    "StreamError",
    "WatchEvent",
    "decode_event",
    "diff",
    "error_from_status",
    "expired_status",
    "object_key",
    "parse_list_page",
    "resource_version",
]
