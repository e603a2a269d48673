"""The gunicorn worker: gevent's, with a deadline for every step before a request is whole.

Why not gthread: it hands each accepted connection to one of its N threads, and that
thread then blocks reading the connection. Eight connections that finish the TLS
handshake and send nothing (or twenty sending a body a byte a second) took every thread
of the default 4: each review waited until the API server gave up and allowed the resize
unchecked (issue 15, item 4; ``tests/unit/test_web_slow_clients.py`` reproduces it).

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

A connection that misses a deadline is closed without an answer; it is not the API
server. What remains bounded by count rather than time is gunicorn's
``worker_connections`` per worker (see :mod:`webhook.web.server`).

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
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

import gevent
from gevent.local import local
from gunicorn.workers.ggevent import GeventWorker

if TYPE_CHECKING:
    from webhook.web.tls import CertificateReloader

log = logging.getLogger(__name__)

#: gunicorn loads its worker class by this name.
WORKER_CLASS: Final = "webhook.web.worker.ReviewWorker"

#: Seconds a stopping worker keeps idle connections open for a request on its way.
STOP_IDLE_LINGER: Final = 2.0

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

    def __init__(self, tls: CertificateReloader, timeout: float) -> None:
        self.tls = tls
        self.timeout = timeout

    def wrap_socket(self, sock: socket.socket, **_: Any) -> ssl.SSLSocket:
        conn = self.tls.context().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        try:
            with gevent.Timeout(self.timeout):
                conn.do_handshake()
            return conn
        except (OSError, gevent.Timeout) as e:
            # Old protocol versions, plain HTTP, scanners, silent peers: not the API server.
            log.debug("TLS handshake with %s failed: %r", _peer(sock), e)
            conn.close()
            raise gevent.GreenletExit from None


def _peer(sock: socket.socket) -> str:
    try:
        return str(sock.getpeername())
    except OSError:
        return "a closed peer"


class ReviewWorker(GeventWorker):  # type: ignore[misc]  # gunicorn is untyped
    """gunicorn's gevent worker with the deadlines of the module docstring; they come
    from the :class:`~webhook.web.server.ServerOptions` of the application it serves."""

    def init_process(self) -> None:
        options = self.app.options
        self.handshake_timeout: float = options.handshake_timeout
        self.header_timeout: float = options.header_timeout
        self.body_timeout: float = options.body_timeout
        self.max_body: int = options.max_body_bytes
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

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        self._connection.requests = 0
        super().handle(listener, client, addr)

    @contextlib.contextmanager
    def timeout_ctx(self) -> Iterator[None]:
        """The deadline for the next request's headers (silent: the connection closes).
        Meanwhile the connection counts as idle: a stopping worker closes it."""
        first = self._connection.requests == 0
        self._connection.requests += 1
        if not first:
            # Take turns: a kept-alive client that sends its next review while this one is
            # still being finished would otherwise be served again at once, for as long as
            # it keeps up, while the other connections' reviews wait. Measured at
            # saturation, 4 connections, one worker: p99 13 to 26 ms without the turn,
            # 2 to 7 ms with it, the same reviews/s (p50 goes from 0.4 to 1.5 ms: the
            # other three reviews in between).
            gevent.sleep(0)
        current = gevent.getcurrent()
        self._idle.add(current)
        try:
            with gevent.Timeout(self.header_timeout if first else self.cfg.keepalive, False):
                yield
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
