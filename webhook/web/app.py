"""The Flask app: AdmissionReviews in, AdmissionReviews out, plus health probes.

Contract of the review endpoints (``POST /validate-resize``, ``POST /mutate-resize``):

* an AdmissionReview (``admission.k8s.io/v1`` or ``v1beta1``) -> HTTP 200 with the
  engine's AdmissionReview as JSON, the request's uid echoed;
* a body that is not an AdmissionReview -> 400 ``{"error": "..."}``; a body larger than
  ``Config.max_body_bytes`` -> 413; a declared non-JSON content type -> 415; a wrong
  method -> 405; an unknown path -> 404. Every error body is JSON;
* never a 500: one boundary (:class:`_ReviewBoundary`, in front of Flask) answers any
  unexpected exception. Once the review was read it is answered allowed with a warning
  (fail open) and counted as a review with verdict ``error``; before that, with a 400.
  Either way ``resize_preemption_errors{where="web"}`` counts it;
* while the serving worker is overloaded (``environ[OVERLOADED]``, set by
  :mod:`webhook.web.worker`), the same boundary answers a review at once without a
  decision: allowed, :data:`OVERLOADED_WARNING`, audit annotation ``verdict:
  overloaded``, counted in ``resize_preemption_webhook_requests{verdict="overloaded"}``,
  no decision-log line. What cannot be read so is answered as ever.

The app holds no global state: everything it uses is injected into :func:`create_app`,
so several apps (tests, benchmarks) live side by side in one process. Every request goes
through Flask, reviews included: one path, whatever the request.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge

from webhook.base.metrics import Metrics
from webhook.base.settings import Config
from webhook.core.errors import InputError
from webhook.engine.admission import (
    PREFIX,
    AdmissionEngine,
    AdmissionRequest,
    AdmissionReview,
    Endpoint,
    parse_review,
    response,
)
from webhook.engine.ledger import ClusterView, Ledger

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger(__name__)

#: Readiness checks by name (e.g. ``tls``, ``cache``, ``ledger``) -> passing.
Readiness = Callable[[], dict[str, bool]]
#: An endpoint's answer to a parsed review: (apiVersion, request) -> AdmissionReview.
Answer = Callable[[str, AdmissionRequest], AdmissionReview]

REVIEW_PATHS: Final[dict[str, Endpoint]] = {
    "/validate-resize": "validate",
    "/mutate-resize": "mutate",
}
_JSON: Final = "application/json"
#: The WSGI environ key by which the serving worker says it is overloaded (a bool).
OVERLOADED: Final = "rpw.overloaded"
#: The WSGI environ key under which a review that was read keeps (apiVersion, uid,
#: endpoint): what the fail-open boundary answers with.
_READ: Final = "rpw.review"
_FAILED_OPEN_WARNING: Final = PREFIX + "internal error answering this review; resize allowed"
OVERLOADED_WARNING: Final = (
    PREFIX
    + "overloaded; resize allowed unplanned (if the kubelet defers it, the reconciler plans it)"
)
#: Seconds between two log lines about answering without a decision.
OVERLOAD_LOG_INTERVAL: Final = 10.0
_UNREADABLE: Final = orjson.dumps({"error": "the request could not be read as an AdmissionReview"})


def _json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    # orjson, not flask.jsonify: several times faster and no app-context JSON provider.
    return Response(orjson.dumps(payload), status=status, headers=headers, mimetype=_JSON)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return _json({"error": message}, status, headers)


def _is_json(mimetype: str) -> bool:
    return mimetype == _JSON or mimetype.endswith("+json")


def create_app(
    config: Config | None = None,
    *,
    cluster: ClusterView | None = None,
    ledger: Ledger | None = None,
    clock: Callable[[], float] | None = None,
    engine: AdmissionEngine | None = None,
    metrics: Metrics | None = None,
    readiness: Readiness | None = None,
) -> Flask:
    """Build the webhook's WSGI app from its dependencies.

    ``engine`` answers the reviews; without it one is built over ``cluster``, ``ledger``
    and ``clock`` (which must then be given). ``metrics`` defaults to the engine's, so
    web-level errors land in the same registry as the engine's counters. ``readiness``
    supplies ``/readyz``'s checks (the service passes TLS loaded, cache synced, ledger
    reachable); by default the engine's cluster view and ledger are asked.
    """
    config = config or Config()
    if engine is None:
        if cluster is None or ledger is None:
            raise TypeError("create_app needs an engine, or a cluster view and a ledger")
        engine = AdmissionEngine(config, cluster, ledger, metrics=metrics, clock=clock or time.time)
    metrics = metrics or engine.metrics
    app = Flask(__name__)
    # Also bounds what any other route could read (the review routes check themselves).
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    # Unexpected exceptions reach the one boundary, _ReviewBoundary, not Flask's 500 page.
    app.config["PROPAGATE_EXCEPTIONS"] = True
    for path, endpoint in REVIEW_PATHS.items():
        route_review(app, path, _engine_answer(engine.answer, endpoint), endpoint)
    _route_probes(app, readiness or _default_readiness(engine))
    _handle_errors(app)
    app.wsgi_app = _ReviewBoundary(  # type: ignore[method-assign]
        app.wsgi_app, metrics, config.max_body_bytes
    )
    return app


def _default_readiness(engine: AdmissionEngine) -> Readiness:
    view, store = engine.cluster, engine.ledger
    return lambda: {"cache": view.synced(), "ledger": store.reachable()}


def _engine_answer(answer: Callable[..., AdmissionReview], endpoint: Endpoint) -> Answer:
    return lambda api_version, req: answer(api_version, req, endpoint)


def _route_probes(app: Flask, checks: Readiness) -> None:
    @app.get("/livez")
    def livez() -> Response:
        # Alive means able to answer HTTP; dependencies belong to readiness, so a slow
        # API server never gets the webhook restarted.
        return _json({"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        try:
            results = {name: bool(ok) for name, ok in checks().items()}
        except Exception:
            log.exception("readiness check failed")
            results = {"readiness": False}
        ready = bool(results) and all(results.values())
        return _json({"ready": ready, "checks": results}, 200 if ready else 503)


class _ReviewBoundary:
    """The review path's one fail-open boundary, in front of Flask, and where the
    overload answer is given.

    * Overloaded (``environ[OVERLOADED]``): a review to a review path is read and
      answered at once without a decision (the module docstring), for a fraction of what
      Flask's request cycle costs, or shedding would not shorten the queue; a body that
      cannot be read so goes on to Flask, which answers it as ever.
    * Any exception Flask's handlers leave (the app propagates them): a review that was
      read (``environ[_READ]``) is allowed with a warning and counted as verdict
      ``error``; anything else is a 400. Never a 500 or a traceback, and the webhook's own
      failure never blocks a resize (the API server's failurePolicy is Ignore too). The
      overload answer is built here as well, so a failure in it fails open the same way.
    """

    def __init__(self, app: WSGIApplication, metrics: Metrics, max_body: int) -> None:
        self._app = app
        self._metrics = metrics
        self._max_body = max_body
        self._shed = {e: metrics.reviews.labels(e, "overloaded") for e in REVIEW_PATHS.values()}
        self._told_at = -OVERLOAD_LOG_INTERVAL
        self._since = 0

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        try:
            if environ.get(OVERLOADED) and environ["REQUEST_METHOD"] == "POST":
                endpoint = REVIEW_PATHS.get(environ.get("PATH_INFO", ""))
                if endpoint is not None:
                    answer = self._overloaded(environ, endpoint)
                    if answer is not None:
                        return _send(start_response, "200 OK", answer)
            return self._app(environ, start_response)
        except Exception as e:
            return self._fail_open(environ, start_response, e)

    def _overloaded(self, environ: WSGIEnvironment, endpoint: Endpoint) -> bytes | None:
        body = _body(environ, self._max_body)
        try:
            api_version, req = parse_review(body or b"")
        except InputError:
            environ["wsgi.input"] = io.BytesIO(body or b"")  # Flask answers it 400 (or 413)
            return None
        environ[_READ] = (api_version, req["uid"], endpoint)
        self._shed[endpoint].inc()
        self._since += 1
        now = time.monotonic()
        if now - self._told_at >= OVERLOAD_LOG_INTERVAL:
            # One line per interval: a line per review would add to the overload.
            log.warning(
                "overloaded: %d reviews allowed without a decision in the last %.0f s",
                self._since,
                min(now - self._told_at, OVERLOAD_LOG_INTERVAL),
            )
            self._told_at, self._since = now, 0
        warnings, audit = (OVERLOADED_WARNING,), {"verdict": "overloaded"}
        return orjson.dumps(response(api_version, req["uid"], warnings=warnings, audit=audit))

    def _fail_open(
        self, environ: WSGIEnvironment, start_response: StartResponse, e: Exception
    ) -> Iterable[bytes]:
        self._metrics.errors.labels("web").inc()
        read = environ.get(_READ)
        if read is None:
            log.error("error before the review was read: %r", e, exc_info=e)
            return _send(start_response, "400 BAD REQUEST", _UNREADABLE)
        api_version, uid, endpoint = read
        log.error("internal error answering review %s; failing open", uid, exc_info=e)
        if endpoint is not None:
            self._metrics.reviews.labels(endpoint, "error").inc()
        answer = orjson.dumps(response(api_version, uid, warnings=(_FAILED_OPEN_WARNING,)))
        return _send(start_response, "200 OK", answer)


def _send(start_response: StartResponse, status: str, body: bytes) -> list[bytes]:
    # Nothing was sent yet: Flask raises before it starts a response.
    start_response(status, [("Content-Type", _JSON), ("Content-Length", str(len(body)))])
    return [body]


def route_review(app: Flask, path: str, answer: Answer, endpoint: Endpoint | None = None) -> None:
    """Answer ``POST path`` with ``answer`` on the review path of the module docstring:
    content type checked (415), body read within ``MAX_CONTENT_LENGTH`` (413), parsed
    (400), answered; ``endpoint`` names it in the metrics of a review that fails open.
    Other methods get 405."""
    max_body: int = app.config["MAX_CONTENT_LENGTH"]

    def review() -> Response:
        mimetype = request.mimetype
        # The API server always sends application/json. No content type at all is
        # tolerated (curl without -H); anything else is almost surely not a review.
        if mimetype and not _is_json(mimetype):
            return _error(
                415,
                f"Content-Type {mimetype} is not supported; send an AdmissionReview as {_JSON}",
            )
        environ = request.environ
        body = _body(environ, max_body)
        if body is None:
            return _too_large(request.content_length, max_body)
        api_version, req = parse_review(body)
        environ[_READ] = (api_version, req["uid"], endpoint)
        return Response(orjson.dumps(answer(api_version, req)), mimetype=_JSON)

    app.add_url_rule(
        path,
        endpoint=path,
        view_func=review,
        methods=["POST"],
        # OPTIONS is no more valid here than GET: answer it 405 like any other.
        provide_automatic_options=False,
    )


def _body(environ: WSGIEnvironment, max_body: int) -> bytes | None:
    """The request body, or None when it is larger than ``max_body``."""
    # The server's input stream is read directly, in one call: Werkzeug's guarded
    # stream reads it in pieces through two more layers. Safe because the length is
    # bounded first, and the server never reads past a body (Content-Length or the
    # chunked end; webhook.web.worker has it in memory already).
    stream = environ["wsgi.input"]
    length = environ.get("CONTENT_LENGTH")
    if length:
        size = int(length) if length.isdigit() else max_body + 1
        return None if size > max_body else stream.read(size)
    if not environ.get("wsgi.input_terminated"):
        return b""  # no length and not chunked: no body (RFC 9112 6.3)
    # Chunked: read one byte past the limit to tell a body at the limit from one
    # over it (Werkzeug's own limit would silently cut the body at the limit).
    data = stream.read(max_body + 1)
    return None if len(data) > max_body else data


def _too_large(length: int | None, max_body: int) -> Response:
    size = f"{length} bytes" if length is not None else "the body"
    return _error(413, f"{size} exceeds the limit of {max_body} bytes for an AdmissionReview")


def _handle_errors(app: Flask) -> None:
    """Every expected error answered as JSON; the rest reach :class:`_ReviewBoundary`."""

    @app.errorhandler(InputError)
    def bad_review(e: InputError) -> Response:
        # Only a body that is not a review is bad input; once one was read, whatever
        # fails is the webhook's own failure.
        if request.environ.get(_READ) is not None:
            raise e
        return _error(400, str(e))

    @app.errorhandler(RequestEntityTooLarge)
    def too_large(e: RequestEntityTooLarge) -> Response:
        return _too_large(request.content_length, app.config["MAX_CONTENT_LENGTH"])

    @app.errorhandler(NotFound)
    def not_found(e: NotFound) -> Response:
        return _error(
            404,
            f"no endpoint at {request.path}; reviews go to POST "
            + " or ".join(REVIEW_PATHS)
            + ", probes to GET /livez and /readyz",
        )

    @app.errorhandler(MethodNotAllowed)
    def wrong_method(e: MethodNotAllowed) -> Response:
        allowed = sorted(e.valid_methods or ())
        return _error(
            405,
            f"method {request.method} is not allowed on {request.path}; use "
            + (" or ".join(allowed) or "another path"),
            {"Allow": ", ".join(allowed)},
        )

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        code = e.code or 400
        # Werkzeug raises 5xx only for server faults; those are answered like any bug.
        if code >= 500:
            raise e
        return _error(code, e.description or e.name)
