"""Clients that hold a server's port without completing a request: idle connections
(TLS handshake done, or not even started), and requests sent one byte at a time.

Used by the slow-client tests and by the review benchmark's measurement under fire
(``python -m bench review``). Loopback only, and bounded: a fixed set of connections,
each sending at most one request.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Beside the CA file: kube-apiserver's client certificate and key, for a server started
#: with ``--client-ca`` (a benchmark's clients present it, as the API server does).
CLIENT_CERT = "client.crt"
CLIENT_KEY = "client.key"


def client_context(ca_file: Path | str) -> ssl.SSLContext:
    """What the API server does: verify against the caBundle, connect by IP (no SNI),
    and present its client certificate when one lies beside ``ca_file``."""
    context = ssl.create_default_context(cafile=str(ca_file))
    cert, key = Path(ca_file).with_name(CLIENT_CERT), Path(ca_file).with_name(CLIENT_KEY)
    if cert.is_file() and key.is_file():
        context.load_cert_chain(str(cert), str(key))
    return context


@dataclass(slots=True)
class HostileClients:
    """Connections that hold the server's port without completing a request.

    ``idle``: connected (TLS handshake done unless ``tls=False``) and silent.
    ``trickling``: sending a request one byte per ``interval`` seconds; ``step()`` sends
    the next byte on each. ``handshakes_failed`` counts connections whose handshake the
    server did not complete in time (a server with every thread taken cannot).
    """

    idle: list[socket.socket]
    trickling: list[tuple[socket.socket, bytes]]
    handshakes_failed: int = 0
    sent: int = 0

    def step(self) -> int:
        """One more byte on every trickling connection still open; returns how many
        connections are still open (a server that gave up on one closes it)."""
        open_ = 0
        for sock, data in self.trickling:
            if self.sent >= len(data):
                continue
            try:
                sock.sendall(data[self.sent : self.sent + 1])
                open_ += 1
            except OSError:
                pass
        self.sent += 1
        return open_

    def close(self) -> None:
        for sock in [*self.idle, *(s for s, _ in self.trickling)]:
            with contextlib.suppress(OSError):
                sock.close()


def _connect(port: int, ca_file: Path, *, tls: bool) -> tuple[socket.socket, bool]:
    raw = socket.create_connection(("127.0.0.1", port), timeout=2)
    if not tls:
        return raw, True
    try:
        # A server resetting new connections (overloaded) does so before the wrap sees them.
        wrapped = client_context(ca_file).wrap_socket(
            raw, server_hostname="127.0.0.1", do_handshake_on_connect=False
        )
    except OSError:
        return raw, False
    try:
        wrapped.do_handshake()
        return wrapped, True
    except OSError:
        return wrapped, False


def slow_request(body_bytes: int, *, headers_only: bool = False) -> bytes:
    """A review request as a slow client sends it: its headers announce ``body_bytes``;
    ``headers_only`` stops before the blank line ending the headers."""
    head = (
        "POST /validate-resize HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {body_bytes}\r\n"
    )
    if headers_only:
        return (head + "X-Padding: " + "a" * 4000).encode()
    return (head + "\r\n").encode() + b"{" + b" " * (body_bytes - 1)


def open_hostile_clients(
    port: int,
    ca_file: Path,
    *,
    idle: int = 0,
    slow_headers: int = 0,
    slow_bodies: int = 0,
    tls: bool = True,
) -> HostileClients:
    """Open the connections at once; slow bodies send their headers whole, then the body
    a byte per :meth:`HostileClients.step`."""
    clients = HostileClients([], [])
    for _ in range(idle):
        sock, ok = _connect(port, ca_file, tls=tls)
        clients.idle.append(sock)
        clients.handshakes_failed += not ok
    for count, data in (
        (slow_headers, slow_request(10_000, headers_only=True)),
        (slow_bodies, slow_request(10_000)),
    ):
        for _ in range(count):
            sock, ok = _connect(port, ca_file, tls=tls)
            clients.handshakes_failed += not ok
            clients.trickling.append((sock, data))
    if slow_bodies:
        # The bodies' headers go out whole: the server has a request it cannot finish.
        head = len(slow_request(10_000)) - 10_000
        for sock, data in clients.trickling[slow_headers:]:
            with contextlib.suppress(OSError):
                sock.sendall(data[:head])
        for i, (sock, data) in enumerate(clients.trickling[slow_headers:], slow_headers):
            clients.trickling[i] = (sock, data[head:])
    return clients


@contextlib.contextmanager
def held_open(
    port: int,
    ca_file: Path,
    *,
    idle: int = 0,
    slow_headers: int = 0,
    slow_bodies: int = 0,
    interval: float = 1.0,
    renew_every: float | None = None,
) -> Iterator[HostileClients]:
    """Open the clients, trickle a byte every ``interval`` seconds meanwhile, close them
    all at the end. ``renew_every``: open a fresh set that often (closing the old one),
    so a server's deadlines never clear the port for long."""
    stop = threading.Event()

    def open_all() -> HostileClients:
        return open_hostile_clients(
            port, ca_file, idle=idle, slow_headers=slow_headers, slow_bodies=slow_bodies
        )

    current = [open_all()]

    def run() -> None:
        waited = 0.0
        while not stop.wait(interval):
            current[0].step()
            waited += interval
            if renew_every is not None and waited >= renew_every:
                waited = 0.0
                old, current[0] = current[0], open_all()
                old.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield current[0]
    finally:
        stop.set()
        thread.join(30)
        current[0].close()
