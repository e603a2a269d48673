"""The flood server's worker: the service's own, its overload delay set by the flood's
``--shed-delay`` (0 never sheds: the flood without the protection, for the before/after
comparison). Imported only in the server process, where gunicorn loads it by name."""

from __future__ import annotations

from typing import Any

from webhook.web.server import WebhookServer
from webhook.web.worker import ReviewWorker


class ShedWorker(ReviewWorker):  # type: ignore[misc]
    """:class:`ReviewWorker` with the flood's ``shed_delay`` (set on the class in the
    master before it forks)."""


class FloodServer(WebhookServer):  # type: ignore[misc]
    """The service's server serving with :class:`ShedWorker`."""

    def settings(self) -> dict[str, Any]:
        return {**super().settings(), "worker_class": "harness.shed_worker.ShedWorker"}
