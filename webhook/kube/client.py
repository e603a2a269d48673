"""Building an ``ApiClient`` for this process without touching the client's global state.

``kubernetes.config.load_kube_config()`` and ``load_incluster_config()`` without arguments
write into the process-wide default ``Configuration``; two clients in one process (tests,
the harness) would then share credentials by accident. :func:`make_api_client` builds a
fresh ``Configuration`` per call and hands it to the loaders explicitly.

The returned client also

* applies a default ``(connect, read)`` timeout to every request that does not set one
  (the generated client waits forever otherwise, and a hung API call on the admission path
  would outlast the webhook's own timeout);
* sizes the urllib3 pool for every thread that talks to the API at once: each watch holds
  one connection for minutes, admission threads write the ledger, the worker evicts;
* optionally limits request rate client-side (token bucket, like client-go's QPS/burst);
* turns on TCP keep-alive, so a watch through a dead proxy or NAT is noticed;
* never sends a request again after it timed out waiting for the answer (urllib3 would,
  three times, for a PUT): the first may still land - etcd applies a write it held while
  stalled - and the admission path has the API server's few seconds in all, not four
  read timeouts. A request that never got through (refused connection) is retried.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Final

import kubernetes.client
import urllib3
import yaml
from kubernetes.client import rest
from kubernetes.config import incluster_config, kube_config
from kubernetes.config.config_exception import ConfigException

from webhook import __version__
from webhook.kube.errors import ClusterError
from webhook.kube.kubeconfig import default_kubeconfig, in_cluster

USER_AGENT: Final = f"resize-preemption-webhook/{__version__}"
DEFAULT_CONNECT_TIMEOUT: Final = 5.0
#: Ordinary (non-watch) requests: the largest object we GET is one Lease or Pod.
DEFAULT_READ_TIMEOUT: Final = 30.0
#: Enough for 5 watches, a gthread worker's threads writing the ledger, and the worker.
DEFAULT_POOL_SIZE: Final = 32


class RateLimiter:
    """A thread-safe token bucket: ``qps`` tokens per second, at most ``burst`` saved."""

    def __init__(self, qps: float, burst: int, *, clock: Any = time.monotonic) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError("qps must be > 0 and burst >= 1")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Takes one token; returns how long the caller must sleep before using it."""
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def acquire(self) -> None:
        delay = self.reserve()
        if delay > 0:
            time.sleep(delay)


class _TunedRESTClient(rest.RESTClientObject):
    """The generated REST client with a default timeout and an optional rate limit."""

    def __init__(
        self,
        configuration: kubernetes.client.Configuration,
        *,
        timeout: tuple[float, float],
        limiter: RateLimiter | None,
    ) -> None:
        super().__init__(configuration)
        self._default_timeout = timeout
        self._limiter = limiter

    def request(
        self,
        method: str,
        url: str,
        headers: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        if self._limiter is not None:
            self._limiter.acquire()
        return super().request(  # type: ignore[no-untyped-call]
            method,
            url,
            headers=headers,
            body=body,
            post_params=post_params,
            _request_timeout=_request_timeout or self._default_timeout,
        )


class ApiClient(kubernetes.client.ApiClient):
    """``kubernetes.client.ApiClient`` with the tuned REST layer; use :func:`make_api_client`."""

    def __init__(
        self,
        configuration: kubernetes.client.Configuration,
        *,
        timeout: tuple[float, float] = (DEFAULT_CONNECT_TIMEOUT, DEFAULT_READ_TIMEOUT),
        limiter: RateLimiter | None = None,
    ) -> None:
        super().__init__(configuration)
        self.rest_client.close()
        self.rest_client = _TunedRESTClient(configuration, timeout=timeout, limiter=limiter)
        self.user_agent = USER_AGENT
        self.timeout = timeout


def _default_kubeconfig() -> str:
    # KUBE_CONFIG_DEFAULT_LOCATION is read once at import; honour a later KUBECONFIG too.
    return default_kubeconfig()


def make_configuration(
    kubeconfig: str | None = None, *, context: str | None = None
) -> kubernetes.client.Configuration:
    """A new ``Configuration``: from ``kubeconfig`` if given, else in-cluster when running in
    a pod, else ``$KUBECONFIG`` / ``~/.kube/config``. Never changes the global default.

    Raises :class:`ClusterError` when no usable configuration is found.
    """
    cfg = kubernetes.client.Configuration()  # ours alone: never passed to set_default
    try:
        if kubeconfig is None and in_cluster():
            loader = incluster_config.InClusterConfigLoader(  # type: ignore[no-untyped-call]
                token_filename=incluster_config.SERVICE_TOKEN_FILENAME,
                cert_filename=incluster_config.SERVICE_CERT_FILENAME,
                # Bound service-account tokens rotate; the loader re-reads the file.
                try_refresh_token=True,
            )
            loader.load_and_set(cfg)  # type: ignore[no-untyped-call]
        else:
            kube_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig or _default_kubeconfig(),
                context=context,
                client_configuration=cfg,
                persist_config=False,
            )
    except (ConfigException, OSError, ValueError, yaml.YAMLError) as e:
        where = kubeconfig or ("in-cluster" if in_cluster() else _default_kubeconfig())
        # The loaders' messages may quote the file over many lines: the first says why.
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ClusterError(f"cannot load Kubernetes client configuration ({where}): {why}") from e
    return cfg


def make_api_client(
    kubeconfig: str | None = None,
    *,
    context: str | None = None,
    qps: float | None = None,
    burst: int = 20,
    pool_size: int = DEFAULT_POOL_SIZE,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
) -> ApiClient:
    """A thread-safe ``ApiClient`` with its own ``Configuration`` (see the module docstring).

    ``qps``/``burst``: client-side rate limit for every request (``None``: off; the API
    server's priority and fairness protects it, and the admission path must not queue
    behind the worker). ``pool_size``: connections kept per host; size it for the threads
    that call the API at once plus one per watch. Timeouts apply to requests that pass no
    ``_request_timeout`` of their own (watches pass theirs). Close it with ``close()``.
    """
    cfg = make_configuration(kubeconfig, context=context)
    cfg.connection_pool_maxsize = pool_size
    # TCP keep-alive with client-go's timings: a half-open watch connection is detected.
    cfg.keep_alive = True
    cfg.retries = urllib3.Retry(total=3, read=False)
    limiter = RateLimiter(qps, burst) if qps else None
    return ApiClient(cfg, timeout=(connect_timeout, read_timeout), limiter=limiter)


__all__ = [
    "DEFAULT_POOL_SIZE",
    "USER_AGENT",
    "ApiClient",
    "RateLimiter",
    "in_cluster",
    "make_api_client",
    "make_configuration",
]
