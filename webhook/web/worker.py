"""The gunicorn worker: gevent's, with a deadline for every step before a request is whole.

Why not a thread per connection (gunicorn's gthread): a thread blocks reading its
connection, so a few connections that finish the TLS handshake and send nothing (or send
a body a byte a second) take every thread, and each review then waits until the API
server gives up and allows the resize unchecked (``tests/unit/test_web_slow_clients.py``
shows it).

Here every connection is a greenlet, waiting on the socket costs no thread, and the
app is called only once a request is complete - headers and body in memory:

* the TLS handshake must end within ``handshake_timeout`` of the accept;
* the first request's headers within ``header_timeout`` of the handshake (the API server
  sends its request at once); a kept-alive connection may stay idle, and then send the
  next request's headers, for ``keepalive`` seconds (longer than the API server keeps an
  idle connection, so it is the client that closes it);
* the body within ``body_timeout`` of the headers, read here, up to ``max_body_bytes``: a
  body announced larger is not read (the app answers 413) and a chunked one is read one
  byte past the limit; either way the connection closes after the answer instead of
  draining the rest.

**The caller's name.** With client certificates required (``--client-ca``), a
certificate the CA signed for another Common Name than ``client-cn`` closes the
connection once its handshake is done, before any request is read
(:meth:`~webhook.tls.serving.CertificateReloader.accepts`).

**The probe port.** With client certificates required (``--client-ca``), the kubelet's
HTTPS probes, which present none, go to a port of their own (``--probe-port``): its
handshakes ask for no certificate, and a request there for anything but
:data:`PROBE_PATHS` closes the connection unanswered, so no review is ever decided for a
caller that was not authenticated.

A connection that misses a deadline is closed without an answer; it is not the API
server. What remains bounded by count rather than time is gunicorn's
``worker_connections`` per worker (see :mod:`webhook.web.server`).

**Overload.** Deadlines bound what one connection holds, not how many reviews arrive. In
a flood (a VPA rollout over thousands of pods) offered faster than a worker decides,
every review waits its turn on the event loop; answers come after the API server's
``timeoutSeconds``, the API server closes those connections and opens new ones, and the
worker spends its time on TLS handshakes and on reviews nobody waits for
(``python -m bench flood``, ``docs/reliability.md``). So the worker measures how late its
event loop runs a greenlet that is ready (:class:`LoopDelay`) - the time a review that
has arrived waits before it is served - and while that passes ``shed_delay`` with more
connections open than the API server keeps idle (:func:`is_overloaded`):

* the app answers reviews at once, allowed with a warning and without a decision
  (``environ[OVERLOADED]``, :mod:`webhook.web.app`), for a fraction of a decision's CPU;
* a new connection is reset before its TLS handshake (:class:`HandshakeDeadline`): the
  API server fails open at once instead of paying us a handshake. Its review never
  reaches the app, so the worker counts it apart
  (``resize_preemption_connections_refused_total``).

Either way the resize goes ahead unchecked, as the API server would let it a few
seconds later anyway; one the kubelet then defers is taken up by the reconciler.

The whole worker process is cooperative: gevent patches the standard library before the
app is loaded (gunicorn's worker does it), so the Kubernetes client's watches and the
ledger writes wait on sockets the same way. Anything that bound a name from :mod:`ssl`
or :mod:`socket` before that patch would block the process: :func:`check_cooperative`
refuses to serve then, and the app factory runs only in the worker.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

import gevent
from gevent.local import local
from gunicorn.workers.ggevent import GeventWorker

from webhook.tls.serving import peer_common_names
from webhook.web.app import OVERLOADED

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

    from webhook.tls.serving import CertificateReloader

log = logging.getLogger(__name__)

#: gunicorn loads its worker class by this name.
WORKER_CLASS: Final = "webhook.web.worker.ReviewWorker"

#: Seconds a stopping worker keeps idle connections open for a request on its way.
STOP_IDLE_LINGER: Final = 2.0

#: Idle connections the API server keeps to one webhook (client-go's transport cache,
#: ``idleConnsPerHost``): more open at once mean it has more reviews outstanding.
BUSY_CONNECTIONS: Final = 25
#: Seconds between two log lines about connections reset while overloaded.
RESET_LOG_INTERVAL: Final = 10.0
#: How often :class:`LoopDelay` looks; also the least delay it can see.
LOOP_PROBE_INTERVAL: Final = 0.05
#: Seconds a review may wait on the event loop, with more connections open than the API
#: server keeps idle, before the worker answers reviews without a decision and resets new
#: connections (the module docstring, "Overload"). The API server opens a connection, a
#: TLS handshake, for every review beyond the idle ones it keeps, and handshakes cost
#: more than reviews: a delay the API server's pace turns into handshakes is already too
#: long. A few times a worker's p99 at saturation; docs/reliability.md has the flood's
#: figures for it.
SHED_DELAY: Final = 0.1

#: What the probe port serves; any other request there closes the connection.
PROBE_PATHS: Final = frozenset({"/livez", "/readyz"})

#: Modules that keep the ssl/socket classes they imported, and the names they keep.
_BOUND_AT_IMPORT: Final = {
    "urllib3.util.ssl_": ("SSLContext",),
}


class CooperativeError(RuntimeError):
    """A module imported before the worker patched the standard library would block it."""


def check_cooperative() -> None:
    """Raises :class:`CooperativeError` when a module loaded in this process kept the
    standard library's blocking ``ssl.SSLContext`` (imported before gevent patched it):
    its sockets would block the whole worker, every review with it."""
    for name, attributes in _BOUND_AT_IMPORT.items():
        module = sys.modules.get(name)
        for attribute in attributes:
            value = getattr(module, attribute, None)
            if module is not None and value is not None and value is not ssl.SSLContext:
                raise CooperativeError(
                    f"{name}.{attribute} is the blocking {value!r}: {name} was imported "
                    "before the worker started; import it in the app factory"
                )


class HandshakeDeadline:
    """What gevent's server wraps each accepted socket with (its ``ssl_context``): the
    reloader's newest context, and a deadline for the handshake. A handshake that fails
    or takes too long ends the connection's greenlet quietly (``GreenletExit``)."""

    def __init__(
        self, tls: CertificateReloader, timeout: float, probe_port: int | None = None
    ) -> None:
        self.tls = tls
        self.timeout = timeout
        self.probe_port = probe_port

    def wrap_socket(self, sock: socket.socket, **_: Any) -> ssl.SSLSocket:
        if _serving is not None and _serving.overloaded():
            _serving.refuse(sock)
            raise gevent.GreenletExit
        probes = self.probe_port is not None and local_port(sock) == self.probe_port
        context = self.tls.context(probes=probes)
        conn = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        try:
            with gevent.Timeout(self.timeout):
                conn.do_handshake()
        except (OSError, gevent.Timeout) as e:
            # Old protocol versions, plain HTTP, scanners, silent peers: not the API server.
            log.debug("TLS handshake with %s failed: %r", _peer(sock), e)
            conn.close()
            raise gevent.GreenletExit from None
        if not probes and not self.tls.accepts(conn):
            # The CA signed it, for someone else: a caller this port does not serve.
            log.warning(
                "refused a client certificate for %s from %s: client-cn is %r",
                peer_common_names(conn) or "no Common Name",
                _peer(sock),
                self.tls.client_cn,
            )
            conn.close()
            raise gevent.GreenletExit
        return conn


def reset(sock: socket.socket) -> None:
    """Close ``sock`` with a reset (no linger): the peer - the API server - sees the
    failure at once and fails open, instead of waiting for an answer."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def local_port(sock: socket.socket) -> int | None:
    """The port ``sock`` was accepted on (None once closed)."""
    try:
        return int(sock.getsockname()[1])
    except (OSError, IndexError, TypeError):
        return None


def _peer(sock: socket.socket) -> str:
    try:
        return str(sock.getpeername())
    except OSError:
        return "a closed peer"


class LoopDelay:
    """How late this process's event loop runs a greenlet that is ready to run.

    A probe greenlet sleeps :data:`LOOP_PROBE_INTERVAL` and notes how late it woke. The
    delay is the lesser of its last two wake-ups - one late wake is a busy moment of the
    node (the process was not scheduled), not a queue; at 4 times saturation every wake
    is late - or, while the probe is overdue, the time it is overdue: that rises as a
    queue builds instead of waiting for the probe's turn. ``clock``: monotonic seconds."""

    def __init__(
        self, interval: float = LOOP_PROBE_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.interval = interval
        self.clock = clock
        self._due = clock() + interval
        self._lags = (0.0, 0.0)

    def start(self) -> gevent.Greenlet:
        return gevent.spawn(self._run)

    def _run(self) -> None:
        self._due = self.clock() + self.interval
        while True:
            gevent.sleep(self.interval)
            self.woke()

    def woke(self) -> None:
        """The probe's wake-up; it sleeps again at once (tests call it with their clock)."""
        now = self.clock()
        self._lags = (self._lags[1], max(0.0, now - self._due))
        self._due = now + self.interval

    def current(self) -> float:
        """Seconds a greenlet that became ready now would wait, as far as is known."""
        return max(min(self._lags), self.clock() - self._due)


def is_overloaded(delay: float, shed_delay: float, connections: int) -> bool:
    """Overloaded: the loop ``delay`` past ``shed_delay`` (0: never) with more
    ``connections`` open than the API server keeps idle (:data:`BUSY_CONNECTIONS`).

    The delay alone also rises when the worker is merely slow for a while - a relist of a
    large cluster in the same process holds reviews that are still decided within the API
    server's timeout (docs/reliability.md) - or when the node is busy; only a queue of
    reviews makes the API server open more connections than it keeps."""
    return 0 < shed_delay < delay and connections > BUSY_CONNECTIONS


def mark_overload(app: WSGIApplication, overloaded: Callable[[], bool]) -> WSGIApplication:
    """``app`` with ``environ[OVERLOADED]`` set on every request to ``overloaded()``."""

    def marked(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        environ[OVERLOADED] = overloaded()
        return app(environ, start_response)

    return marked


#: The worker serving in this process (one per process), for :class:`HandshakeDeadline`.
_serving: ReviewWorker | None = None


class ReviewWorker(GeventWorker):  # type: ignore[misc]  # gunicorn is untyped
    """gunicorn's gevent worker with the deadlines of the module docstring; they come
    from the :class:`~webhook.web.server.ServerOptions` of the application it serves."""

    #: See :data:`SHED_DELAY`; 0 never sheds.
    shed_delay: float = SHED_DELAY

    def init_process(self) -> None:
        options = self.app.options
        self.handshake_timeout: float = options.handshake_timeout
        self.header_timeout: float = options.header_timeout
        self.body_timeout: float = options.body_timeout
        self.max_body: int = options.max_body_bytes
        self.probe_port: int | None = options.probe_port
        #: Connections past their handshake, open now.
        self._open = 0
        self.loop_delay = LoopDelay()
        #: Per connection (greenlet): requests read so far.
        self._connection = local()
        #: Connections waiting for their next request's headers.
        self._idle: set[gevent.Greenlet] = set()
        super().init_process()

    def load_wsgi(self) -> None:
        # Patched by now (GeventWorker.init_process): a context built before the fork
        # would hand out blocking sockets, so the serving pair is loaded again here.
        check_cooperative()
        self.app.tls.renew()
        super().load_wsgi()
        self.loop_delay.start()
        #: Connections reset since the last log line about them, and when that was.
        self._reset = {"count": 0, "told": -RESET_LOG_INTERVAL}
        global _serving
        _serving = self
        served: WSGIApplication = self.wsgi  # type: ignore[has-type]  # set by gunicorn
        self.wsgi = mark_overload(served, self.overloaded)

    def overloaded(self) -> bool:
        return is_overloaded(self.loop_delay.current(), self.shed_delay, self._open)

    def refuse(self, sock: socket.socket) -> None:
        """Close a new connection at once, before its handshake."""
        reset(sock)
        self.app.connection_refused()
        self._reset["count"] += 1
        now = time.monotonic()
        if now - self._reset["told"] >= RESET_LOG_INTERVAL:
            # One line per interval: a line per connection would add to the overload.
            log.warning(
                "overloaded: %d new connections reset before their handshake",
                self._reset["count"],
            )
            self._reset = {"count": 0, "told": now}

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        self._connection.requests = 0
        self._connection.probes_only = (
            self.probe_port is not None and local_port(client) == self.probe_port
        )
        self._open += 1
        try:
            super().handle(listener, client, addr)
        finally:
            self._open -= 1

    @contextlib.contextmanager
    def timeout_ctx(self) -> Iterator[None]:
        """The deadline for the next request's headers (silent: the connection closes).
        Meanwhile the connection counts as idle: a stopping worker closes it."""
        first = self._connection.requests == 0
        self._connection.requests += 1
        if not first:
            # Take turns: a kept-alive client that sends its next review while this one is
            # still being finished would otherwise be served again at once, for as long as
            # it keeps up, while the other connections' reviews wait (docs/service.md,
            # Performance, has the tail it costs).
            gevent.sleep(0)
        current = gevent.getcurrent()
        self._idle.add(current)
        try:
            with gevent.Timeout(self.header_timeout if first else self.cfg.keepalive, False):
                yield
        except gevent.GreenletExit:
            # A stopping worker closing an idle connection (_close_idle): as quiet as a
            # deadline; gunicorn would log it as a failed request, with a traceback.
            pass
        finally:
            self._idle.discard(current)

    def handle_exit(self, sig: int, frame: Any) -> None:
        super().handle_exit(sig, frame)
        gevent.spawn(self._close_idle)

    def _close_idle(self) -> None:
        # gunicorn's run() waits for every connection's greenlet up to graceful_timeout,
        # and an idle kept-alive connection has up to ``keepalive`` seconds left: close
        # those after a short linger (a request already on its way still gets in), so
        # a stop waits only for reviews in flight.
        gevent.sleep(STOP_IDLE_LINGER)
        gevent.killall(list(self._idle), block=False)

    def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> Any:
        if self._connection.probes_only and (req.method != "GET" or req.path not in PROBE_PATHS):
            # An unauthenticated caller on the probe port: nothing but the probes.
            log.debug("closing a connection from %s: %s on the probe port", addr, req.path)
            raise StopIteration
        if not self._read_body(req):
            log.debug("closing a connection from %s: body not sent in time", addr)
            raise StopIteration  # the base worker closes the connection
        return super().handle_request(listener_name, req, sock, addr)

    def _read_body(self, req: Any) -> bool:
        """Read the request's body into memory within the body deadline; False when it
        did not arrive in time. A body over the limit is left unread (Content-Length) or
        cut one byte past it (chunked) for the app to refuse, and the connection is
        closed after the answer."""
        length = _content_length(req)
        if length is not None and length > self.max_body:
            req.must_close = True
            return True
        with gevent.Timeout(self.body_timeout, False):
            data = req.body.read(self.max_body + 1 if length is None else length)
            if len(data) > self.max_body:
                req.must_close = True
            req.body = io.BytesIO(data)
            return True
        return False


def _content_length(req: Any) -> int | None:
    # gunicorn has checked the header (one value, digits only) when it parsed it.
    for name, value in req.headers:
        if name == "CONTENT-LENGTH":
            return int(value)
    return None
