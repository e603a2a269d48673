"""``POST /noop``: an allow-all webhook, the review benchmark's baseline.

It takes the webhook's own review path (:func:`webhook.web.app.route_review`): the body
is read, checked and parsed as for ``/validate-resize`` and the review allowed with its
uid. Only the engine's decision is left out, so validate over noop is what deciding
costs on top of serving. A benchmark tool: the product never routes it.
"""

from __future__ import annotations

from typing import Final

from flask import Flask

from webhook.engine.admission import AdmissionRequest, AdmissionReview, response
from webhook.web.app import route_review

NOOP_PATH: Final = "/noop"


def noop_answer(api_version: str, req: AdmissionRequest) -> AdmissionReview:
    return response(api_version, req["uid"])


def add_noop_endpoint(app: Flask) -> Flask:
    """Route ``POST /noop`` on an app built by :func:`webhook.web.app.create_app`."""
    route_review(app, NOOP_PATH, noop_answer)
    return app
