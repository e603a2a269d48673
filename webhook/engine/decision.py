"""What the admission engine answers for one review, and why.

Its own module so that the engine (which makes decisions) and the decision log (which
writes them down) both depend on it instead of on each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from webhook.core.plan import Plan
from webhook.engine.ledger import LedgerEntry


class Decision(NamedTuple):
    """What to answer, and why. ``verdict`` is the plan's, or ``ignored``/``error``.

    A tuple, as the small values of the core: built for every review, and a frozen
    dataclass sets each field through ``object.__setattr__``."""

    uid: str
    allowed: bool = True
    verdict: str = "ignored"
    plan: Plan | None = None
    warnings: tuple[str, ...] = ()
    audit: Mapping[str, str] = MappingProxyType({})
    code: int | None = None
    message: str = ""
    patch: list[dict[str, Any]] | None = None
    #: The ledger entry this review holds (new, or the one a retried review wrote).
    admitted: LedgerEntry | None = None
    error: str = ""

    @property
    def reserved(self) -> bool:
        return self.admitted is not None


__all__ = ["Decision"]
