"""Seams for running the service with some of its parts wrapped.

Apart from :mod:`webhook.service` so a program can build its hooks before anything imports
the Kubernetes client: the serving worker patches the standard library for cooperative I/O
first, and a client imported earlier would keep the blocking classes
(:mod:`webhook.web.worker`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from webhook.engine.ledger import Ledger, VictimEvictor

T = TypeVar("T")


def _keep(built: T, identity: str) -> T:
    return built


@dataclass(frozen=True, slots=True)
class Hooks:
    """Seams for a program that runs the service with some of its parts wrapped (the test
    harness's fault injection, ``harness.fault_hooks``). Each hook is called once per
    worker process with what the service built and the process's identity, and returns
    what the service uses in its place; a wrapper must keep the contract of what it
    wraps. The defaults keep what was built; the product sets none.

    ``ledger``: the store every ledger read and write goes through (admission, worker,
    reconciler); readiness and the watch stay on the store itself. ``evictor``: what the
    preemption worker evicts with.
    """

    ledger: Callable[[Ledger, str], Ledger] = _keep
    evictor: Callable[[VictimEvictor, str], VictimEvictor] = _keep
