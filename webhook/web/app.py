"""The Flask app: AdmissionReviews in, AdmissionReviews out, plus health probes.

Contract of the review endpoints (``POST /validate-resize``, ``POST /mutate-resize``):

* an AdmissionReview (``admission.k8s.io/v1`` or ``v1beta1``) -> HTTP 200 with the
  engine's AdmissionReview as JSON, the request's uid echoed;
* a body that is not an AdmissionReview -> 400 ``{"error": "..."}``; a body larger than
  ``Config.max_body_bytes`` -> 413; a declared non-JSON content type -> 415; a wrong
  method -> 405; an unknown path -> 404. Every error body is JSON;
* never a 500: an unexpected exception after the review was read is answered with an
  allowed AdmissionReview carrying a warning (fail open, as the engine itself does),
  before that with a 400; either way ``resize_preemption_errors{where="web"}`` counts it;
* while the serving worker is overloaded (``environ[OVERLOADED]``, set by
  :mod:`webhook.web.worker`), a review is answered at once without a decision: allowed,
  :data:`OVERLOADED_WARNING`, audit annotation ``verdict: overloaded``, counted in
  ``resize_preemption_webhook_requests{verdict="overloaded"}``, no decision-log line.
  Anything that cannot be answered so (no uid, too large, not JSON) takes the ordinary
  path.

The app holds no global state: everything it uses is injected into :func:`create_app`,
so several apps (tests, benchmarks) live side by side in one process.

Every request goes through Flask, reviews included: one path, whatever the request.
The raw-WSGI shortcut that answered the API server's reviews before Flask saw them went
on the review benchmark's figures (``python -m bench review``, ``docs/service.md``):
it and the earlier thread worker together cost about 0.15 ms of CPU per review less than
this path under the gevent worker, but with ``serve --workers 2`` the Flask path
answers 1,820 reviews/s at saturation on 2 shared cores (one worker 1,316), 1.8 times the
1,000 a 2-core replica must reach, so a second copy of the review step buys no figure a
user sees.
"""

from __future__ import annotations

import io
import logging
import sys
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import orjson
from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge

from webhook.core.errors import InputError
from webhook.engine.admission import PREFIX, AdmissionEngine, Endpoint
from webhook.engine.config import Config
from webhook.engine.ledger import Ledger
from webhook.engine.metrics import Metrics
from webhook.engine.ports import ClusterView
from webhook.engine.wire import AdmissionRequest, AdmissionReview, parse_review, response

if TYPE_CHECKING:
    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

log = logging.getLogger(__name__)

#: Readiness checks by name (e.g. ``tls``, ``cache``, ``ledger``) -> passing.
Readiness = Callable[[], dict[str, bool]]

REVIEW_PATHS: Final[dict[str, Endpoint]] = {
    "/validate-resize": "validate",
    "/mutate-resize": "mutate",
}
_JSON: Final = "application/json"
#: The WSGI environ key by which the serving worker says it is overloaded (a bool).
OVERLOADED: Final = "rpw.overloaded"
_FAILED_OPEN_WARNING: Final = PREFIX + "internal error answering this review; resize allowed"
OVERLOADED_WARNING: Final = (
    PREFIX
    + "overloaded; resize allowed unplanned (if the kubelet defers it, the reconciler plans it)"
)
#: Seconds between two log lines about answering without a decision.
OVERLOAD_LOG_INTERVAL: Final = 10.0


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

    ``engine`` wins over ``cluster``/``ledger``/``clock``; without it an engine is built
    over ``cluster`` and ``ledger``; without them (tests), over the test doubles of
    :mod:`webhook.testing`: an empty :class:`~webhook.testing.StaticClusterView` and an
    :class:`~webhook.testing.InMemoryLedger`. ``metrics`` defaults to the engine's, so
    web-level errors land in the same registry as the engine's counters.

    ``readiness`` supplies ``/readyz``'s checks (the service passes TLS loaded, cache
    synced, ledger reachable); by default the engine's cluster view and ledger are asked.
    """
    config = config or Config()
    if engine is None:
        # Test doubles only when the caller brings nothing: the service passes both.
        from webhook.testing import InMemoryLedger, StaticClusterView

        engine = AdmissionEngine(
            config,
            cluster if cluster is not None else StaticClusterView(),
            ledger if ledger is not None else InMemoryLedger(),
            metrics=metrics,
            clock=clock or time.time,
        )
    metrics = metrics or engine.metrics
    if readiness is None:
        view, store = engine.cluster, engine.ledger

        def readiness() -> dict[str, bool]:
            return {"cache": view.synced(), "ledger": store.reachable()}

    checks = readiness
    web_errors = metrics.errors.labels("web")

    app = Flask(__name__)
    # Also bounds what any other route could read (the review routes check themselves).
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.config["RPW_ENGINE"] = engine
    app.config["RPW_METRICS"] = metrics

    for path, endpoint in REVIEW_PATHS.items():
        route_review(app, path, _engine_answer(engine.answer, endpoint))

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

    # -- errors: always JSON, never a 500 -------------------------------------------

    @app.errorhandler(InputError)
    def bad_review(e: InputError) -> Response:
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
            return unexpected(e)
        return _error(code, e.description or e.name)

    @app.errorhandler(Exception)
    def unexpected(e: BaseException) -> Response:
        # A review that was read never gets here: _review_answer fails it open.
        web_errors.inc()
        log.error("error before the review was read: %r", e, exc_info=e)
        return _error(400, "the request could not be read as an AdmissionReview")

    app.wsgi_app = _last_resort(  # type: ignore[method-assign,assignment]
        _answer_when_overloaded(app.wsgi_app, metrics, config.max_body_bytes),
        web_errors.inc,
    )
    return app


def _answer_when_overloaded(
    wsgi_app: WSGIApplication, metrics: Metrics, max_body: int
) -> WSGIApplication:
    """The overload answer of the module docstring, before Flask sees the request: it
    must cost a fraction of a decision, or shedding would not shorten the queue."""
    counters = {path: metrics.reviews.labels(e, "overloaded") for path, e in REVIEW_PATHS.items()}
    told = {"at": -OVERLOAD_LOG_INTERVAL, "since": 0}

    def guarded(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        counter = counters.get(environ.get("PATH_INFO", ""))
        if not environ.get(OVERLOADED) or counter is None or environ["REQUEST_METHOD"] != "POST":
            return wsgi_app(environ, start_response)
        length = environ.get("CONTENT_LENGTH")
        if not length or not length.isdigit() or int(length) > max_body:
            return wsgi_app(environ, start_response)
        body = environ["wsgi.input"].read(int(length))
        try:
            api_version, req = parse_review(body)
        except InputError:
            environ["wsgi.input"] = io.BytesIO(body)  # the ordinary path answers it 400
            return wsgi_app(environ, start_response)
        answer = orjson.dumps(
            response(
                api_version,
                req["uid"],
                warnings=(OVERLOADED_WARNING,),
                audit={"verdict": "overloaded"},
            )
        )
        counter.inc()
        told["since"] += 1
        now = time.monotonic()
        if now - told["at"] >= OVERLOAD_LOG_INTERVAL:
            # One line per interval: a line per review would add to the overload.
            log.warning(
                "overloaded: %d reviews allowed without a decision in the last %.0f s",
                told["since"],
                min(now - told["at"], OVERLOAD_LOG_INTERVAL),
            )
            told["at"], told["since"] = now, 0
        start_response("200 OK", [("Content-Type", _JSON), ("Content-Length", str(len(answer)))])
        return [answer]

    return guarded


def route_review(app: Flask, path: str, answer: Answer) -> None:
    """Answer ``POST path`` with ``answer`` on the review path of the module docstring:
    content type checked (415), body read within ``MAX_CONTENT_LENGTH`` (413), parsed
    (400), answered - failing open once the review was read. Other methods get 405."""
    max_body: int = app.config["MAX_CONTENT_LENGTH"]
    count_error = metrics_of(app).errors.labels("web").inc

    def review() -> Response:
        mimetype = request.mimetype
        # The API server always sends application/json. No content type at all is
        # tolerated (curl without -H); anything else is almost surely not a review.
        if mimetype and not _is_json(mimetype):
            return _error(
                415,
                f"Content-Type {mimetype} is not supported; send an AdmissionReview as {_JSON}",
            )
        body = _read_body(max_body)
        if body is None:
            return _too_large(request.content_length, max_body)
        status, payload = _review_answer(answer, body, count_error)
        return Response(payload, status=status, mimetype=_JSON)

    app.add_url_rule(
        path,
        endpoint=path,
        view_func=review,
        methods=["POST"],
        # OPTIONS is no more valid here than GET: answer it 405 like any other.
        provide_automatic_options=False,
    )


def _read_body(max_body: int) -> bytes | None:
    """The request body, or None when it is larger than ``max_body``."""
    # The server's input stream is read directly, in one call: Werkzeug's guarded
    # stream reads it in pieces through two more layers. Safe because the length is
    # bounded first, and the server never reads past a body (Content-Length or the
    # chunked end; webhook.web.worker has it in memory already).
    length = request.content_length
    if length is not None:
        return None if length > max_body else request.input_stream.read(length)
    if not request.environ.get("wsgi.input_terminated"):
        return b""  # no length and not chunked: no body (RFC 9112 6.3)
    # Chunked: read one byte past the limit to tell a body at the limit from one
    # over it (Werkzeug's own limit would silently cut the body at the limit).
    data = request.input_stream.read(max_body + 1)
    return None if len(data) > max_body else data


def _too_large(length: int | None, max_body: int) -> Response:
    size = f"{length} bytes" if length is not None else "the body"
    return _error(413, f"{size} exceeds the limit of {max_body} bytes for an AdmissionReview")


#: An endpoint's answer to a parsed review: (apiVersion, request) -> AdmissionReview.
Answer = Callable[[str, AdmissionRequest], AdmissionReview]


def _engine_answer(answer: Callable[..., AdmissionReview], endpoint: Endpoint) -> Answer:
    return lambda api_version, req: answer(api_version, req, endpoint)


def _review_answer(
    answer: Answer, body: bytes, count_error: Callable[[], None]
) -> tuple[int, bytes]:
    """(HTTP status, JSON body) for a review body: 200 with the answer, 400 for a body
    that is not an AdmissionReview; an unexpected failure once the review is read is
    answered allowed with a warning (fail open), before that with a 400."""
    try:
        api_version, req = parse_review(body)
    except InputError as e:
        return 400, orjson.dumps({"error": str(e)})
    except Exception as e:
        count_error()
        log.error("error before the review was read: %r", e, exc_info=e)
        return 400, _UNREADABLE_BODY
    try:
        return 200, orjson.dumps(answer(api_version, req))
    except Exception as e:
        count_error()
        uid = req["uid"]
        log.error("internal error answering review %s; failing open", uid, exc_info=e)
        return 200, orjson.dumps(response(api_version, uid, warnings=(_FAILED_OPEN_WARNING,)))


_LAST_RESORT_BODY: Final = orjson.dumps({"error": "the request could not be answered"})
_UNREADABLE_BODY: Final = orjson.dumps(
    {"error": "the request could not be read as an AdmissionReview"}
)


def _last_resort(wsgi_app: WSGIApplication, count: Callable[[], None]) -> WSGIApplication:
    """Flask turns every exception into our handlers' answers; should a handler itself
    fail, this answers 400 JSON instead of Flask's HTML 500 (the API server then applies
    the webhook's failurePolicy, Ignore: the resize goes ahead)."""

    def guarded(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        try:
            return wsgi_app(environ, start_response)
        except Exception:
            count()
            log.exception("error handler failed")
            start_response(
                "400 BAD REQUEST",
                [("Content-Type", _JSON), ("Content-Length", str(len(_LAST_RESORT_BODY)))],
                sys.exc_info(),
            )
            return [_LAST_RESORT_BODY]

    return guarded


def engine_of(app: Flask) -> AdmissionEngine:
    """The engine an app built by :func:`create_app` answers with."""
    engine: AdmissionEngine = app.config["RPW_ENGINE"]
    return engine


def metrics_of(app: Flask) -> Metrics:
    """The metrics an app built by :func:`create_app` counts into."""
    metrics: Metrics = app.config["RPW_METRICS"]
    return metrics
