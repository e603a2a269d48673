"""The HTTPS server's TLS context, following certificate rotation without a restart.

cert-manager and Secret volumes replace the certificate and key files in place (a Secret
volume swaps a ``..data`` symlink, so both files change at once; other tools may write
one file, then the other). :class:`CertificateReloader` notices a change by the files'
identity (device, inode, size, mtime of the symlink targets) and loads the new pair into
a fresh :class:`ssl.SSLContext`; connections already open keep the context they started
with, every new handshake gets the newest one.

How a new handshake gets it, whatever the server does with contexts:

* servers that ask for a context per connection (gunicorn calls its ``ssl_context`` hook
  for every accepted socket) call :meth:`CertificateReloader.context`;
* servers that wrap every socket with one context they keep: each context we build has
  an ``sni_callback`` that moves the handshake to the newest context
  (``ssl_sock.context = ...``). OpenSSL calls it for every ClientHello, with
  ``server_name=None`` when the client sends no SNI - which is what the API server does
  when it calls a webhook by IP address.

**Client certificates.** Given a ``client_ca`` file, every connection must present a
certificate that CA signed, or the handshake fails: this is how kube-apiserver
authenticates to webhooks (its AdmissionConfiguration's ``kubeConfigFile``,
docs/deploy.md). The certificate must also bear the Common Name ``client_cn``
(:meth:`CertificateReloader.accepts`, checked once the handshake is done): the CA may be
the cluster's, which signs many more clients than kube-apiserver. The CA file rotates with
the pair. :meth:`CertificateReloader.context` with ``probes=True`` is the context of the
probe port, which asks for no certificate: the kubelet's HTTPS probes present none, and
that port serves the probes only (:mod:`webhook.web.worker`).

File checks are rate-limited (``check_interval``) so a handshake costs at most two
``stat`` calls a second. A pair that does not load (half-written, key and certificate not
matching, unreadable) keeps the previous pair in service and is logged once per change.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from webhook.base.settings import DEFAULT_CLIENT_CN

log = logging.getLogger(__name__)

#: The API server speaks TLS 1.2 and 1.3; nothing older is accepted.
MINIMUM_VERSION: Final = ssl.TLSVersion.TLSv1_2
#: TLS 1.2's suites (OpenSSL's cipher list; TLS 1.3's are all AEAD and set apart): forward
#: secret key exchange and authenticated encryption only. CBC suites are the ones with
#: padding-oracle and timing attacks (Lucky13, POODLE's kin); every TLS 1.2 client of the
#: service - Go's crypto/tls in kube-apiserver, Prometheus, OpenSSL - offers these.
TLS12_CIPHERS: Final = "ECDHE+AESGCM:ECDHE+CHACHA20"
DEFAULT_CHECK_INTERVAL: Final = 1.0

_Stat = tuple[int, int, int, int]
#: (st_dev, st_ino, st_size, st_mtime_ns) of the certificate, the key and the client CA file
#: (None without one).
_Signature = tuple[_Stat, _Stat, _Stat | None]


def peer_common_names(conn: ssl.SSLSocket) -> list[str]:
    """The Common Names of the subject of the certificate ``conn``'s peer presented and
    the handshake verified (none without one)."""
    cert = conn.getpeercert() or {}
    subject: Any = cert.get("subject", ())
    return [value for rdn in subject for key, value in rdn if key == "commonName"]


class TLSConfigError(Exception):
    """The certificate and key cannot be served (raised only for the first pair); the
    message is one line saying which file and why."""


class _PairError(ValueError):
    """A certificate or key file that does not parse, or a key not the certificate's."""


def _check_pair(cert_file: str, cert_pem: bytes, key_file: str, key_pem: bytes) -> None:
    """Raises :class:`_PairError` naming the file at fault, which OpenSSL's own errors
    (``[SSL] PEM lib``) do not."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        raise _PairError(f"certificate {cert_file} is not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise _PairError(f"key {key_file} is not an unencrypted PEM private key") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    encoding = serialization.Encoding.DER
    if key.public_key().public_bytes(encoding, public) != cert.public_key().public_bytes(
        encoding, public
    ):
        raise _PairError(f"key {key_file} is not the key of certificate {cert_file}")


def _why(cert_file: str, key_file: str, error: Exception) -> str:
    """One line for a pair that does not load."""
    if isinstance(error, _PairError):
        return f"cannot serve TLS: {error}"
    if isinstance(error, OSError) and error.filename:
        return f"cannot serve TLS: cannot read {error.filename}: {error.strerror or error}"
    text = " ".join(str(error).split())
    return f"cannot serve TLS with certificate {cert_file} and key {key_file}: {text}"


@dataclass(frozen=True, slots=True)
class LoadedPair:
    """One certificate/key pair in service."""

    context: ssl.SSLContext
    #: The probe port's: no client certificate asked for.
    probe_context: ssl.SSLContext
    serial: int
    not_after: dt.datetime
    signature: _Signature


def _stat(path: str) -> _Stat:
    # os.stat follows symlinks: a Secret volume's ..data swap changes the target's inode.
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class CertificateReloader:
    """A server-side TLS context for ``cert_file``/``key_file`` that follows rotation.

    TLS 1.2 with AEAD suites (:data:`TLS12_CIPHERS`) or 1.3, a client certificate signed
    by ``client_ca`` required when given, ALPN ``http/1.1``. Thread-safe: handshakes on
    many threads may call :meth:`context` at once; one of them reloads.

    Raises :class:`TLSConfigError` when the first pair cannot be loaded: a server must
    not start without a certificate. Later failures keep the pair in service.
    """

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        *,
        check_interval: float = DEFAULT_CHECK_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        client_ca: str | None = None,
        client_cn: str = DEFAULT_CLIENT_CN,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca = client_ca or None
        self.client_cn = client_cn
        self.check_interval = check_interval
        self._clock = clock
        self._lock = threading.Lock()
        self._next_check = 0.0
        #: The signature of the last pair that failed to load, not to retry it per check.
        self._failed: _Signature | None = None
        try:
            self._pair = self._load(self._signature())
        except (OSError, ValueError) as e:
            raise TLSConfigError(self._cannot(e)) from None
        self._next_check = clock() + check_interval
        log.info("TLS certificate loaded (serial %x)", self._pair.serial)

    # -- public -------------------------------------------------------------------------

    def context(self, *, probes: bool = False) -> ssl.SSLContext:
        """The context for a new connection, reloading first if the files changed
        (checked at most every ``check_interval`` seconds); ``probes``: the probe port's."""
        if self._clock() >= self._next_check:
            self._check()
        return self._pair.probe_context if probes else self._pair.context

    @property
    def authenticates(self) -> bool:
        """Whether review connections must present a client certificate."""
        return self.client_ca is not None

    def accepts(self, conn: ssl.SSLSocket) -> bool:
        """Whether a review connection, its handshake done, is from the caller the
        service serves: anyone without ``client_ca``; else a certificate whose subject's
        Common Name is ``client_cn`` and nothing else."""
        if self.client_ca is None:
            return True
        return [self.client_cn] == peer_common_names(conn)

    def loaded(self) -> bool:
        """For readiness: a pair is in service and its certificate has not expired."""
        return dt.datetime.now(dt.UTC) < self._pair.not_after

    @property
    def serial(self) -> int:
        """Serial number of the certificate in service."""
        return self._pair.serial

    def reload(self) -> bool:
        """Check the files now (ignoring the rate limit); True if a new pair is in use."""
        with self._lock:
            return self._reload_locked()

    def renew(self) -> None:
        """Load the files into a new context now, in this process.

        A context is bound to the socket classes of the moment it was built: one built
        before a worker made the standard library cooperative (gevent) would hand out
        blocking sockets, so there is no falling back to it: raises
        :class:`TLSConfigError` when the files do not load."""
        with self._lock:
            try:
                self._pair = self._load(self._signature())
            except (OSError, ValueError) as e:
                raise TLSConfigError(self._cannot(e)) from None
            self._failed = None
            self._next_check = self._clock() + self.check_interval

    # -- internals ----------------------------------------------------------------------

    def _check(self) -> None:
        # Non-blocking: a handshake never waits for another thread's reload; it serves
        # the current pair and the reloading thread swaps it for the next ones.
        if not self._lock.acquire(blocking=False):
            return
        try:
            if self._clock() >= self._next_check:
                self._reload_locked()
        finally:
            self._lock.release()

    def _reload_locked(self) -> bool:
        self._next_check = self._clock() + self.check_interval
        try:
            signature = self._signature()
        except OSError as e:
            # Mid-rotation a file may briefly be missing: keep serving, look again later.
            log.debug("TLS files not readable now (%s); keeping the current pair", e)
            return False
        if signature == self._pair.signature or signature == self._failed:
            return False
        try:
            pair = self._load(signature)
        except (OSError, ValueError) as e:
            self._failed = signature
            log.warning(
                "TLS certificate %s / key %s changed but do not load (%s); "
                "keeping the pair in service (serial %x)",
                self.cert_file,
                self.key_file,
                e,
                self._pair.serial,
            )
            return False
        # Nothing depends on the swap being atomic with the check: a handshake reading
        # the old pair a moment longer is served correctly with it.
        self._pair = pair
        self._failed = None
        log.info("TLS certificate reloaded (serial %x)", pair.serial)
        return True

    def _cannot(self, e: Exception) -> str:
        """One line naming the file at fault (:func:`_why`), and the client CA if any."""
        text = _why(self.cert_file, self.key_file, e)
        named = isinstance(e, _PairError) or (isinstance(e, OSError) and e.filename)
        if self.client_ca and not named:
            text += f" (client CA {self.client_ca})"
        return text

    def _signature(self) -> _Signature:
        ca = _stat(self.client_ca) if self.client_ca else None
        return (_stat(self.cert_file), _stat(self.key_file), ca)

    def _new_context(self, client_ca: str | None) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = MINIMUM_VERSION
        context.set_ciphers(TLS12_CIPHERS)
        if client_ca is None:
            context.verify_mode = ssl.CERT_NONE
        else:
            # An empty or unreadable CA file raises here: a server told to authenticate
            # its callers never serves without being able to.
            context.load_verify_locations(cafile=client_ca)
            if not context.get_ca_certs():
                raise ValueError(f"no CA certificate in {client_ca}")
            context.verify_mode = ssl.CERT_REQUIRED
        context.set_alpn_protocols(["http/1.1"])
        # load_cert_chain checks that the key matches the certificate.
        context.load_cert_chain(self.cert_file, self.key_file)
        context.sni_callback = self._on_client_hello
        return context

    def _load(self, signature: _Signature) -> LoadedPair:
        """A new context for the files; ``ssl.SSLError`` (an ``OSError``) when the key
        does not match the certificate or either does not parse."""
        with open(self.cert_file, "rb") as f:
            cert_pem = f.read()
        with open(self.key_file, "rb") as f:
            key_pem = f.read()
        _check_pair(self.cert_file, cert_pem, self.key_file, key_pem)
        context = self._new_context(self.client_ca)
        probe_context = context if self.client_ca is None else self._new_context(None)
        # The leaf is the first certificate of the chain file.
        cert = x509.load_pem_x509_certificate(cert_pem)
        # If a file changed between the stat and the reads, the next check loads again.
        return LoadedPair(
            context, probe_context, cert.serial_number, cert.not_valid_after_utc, signature
        )

    def _on_client_hello(
        self, sock: ssl.SSLObject | ssl.SSLSocket, server_name: str | None, _: ssl.SSLContext
    ) -> None:
        # Called by OpenSSL for every handshake, SNI or not; None means "continue". The
        # probe port's handshakes keep a context that asks for no client certificate.
        current = self.context(probes=sock.context.verify_mode == ssl.CERT_NONE)
        if sock.context is not current:
            sock.context = current
