"""The webhook service with fault injection, for the restart-safety tests and benchmark.

    python -m harness.fault_hooks serve <the flags of python -m webhook serve>

runs the service exactly as ``python -m webhook serve`` does, through the service's
:class:`webhook.engine.hooks.Hooks`: its ledger and its evictor are wrapped so that reaching an
armed point SIGKILLs the process group (gunicorn's master included: a dead pod, not a
worker the master would fork again). Nothing is armed unless the environment says so:

* ``RPW_FAULT=<point>:<n>`` kills the process the n-th time it reaches ``point``;
* ``RPW_FAULT_FILE=<path>`` (``{identity}`` is replaced by the process's identity) reads
  the same ``<point>:<n>`` from a file whenever a point is reached, so a test can arm a
  running process; the file is removed before the kill;
* ``RPW_EVICT_DELAY=<seconds>`` holds each eviction's thread that long after its call
  returned, so that a batch larger than the worker's parallelism goes in waves a test
  can act between;
* ``<point>:<n>:pause`` in that file holds the thread that reaches the point instead of
  killing anything: it writes ``<path>.paused`` and goes on once a test removed it (after
  at most :data:`PAUSE_LIMIT` seconds), so the test can break the control plane at
  exactly that point.

Points: ``admitted`` (a ledger write just recorded a new entry - an admission or the
reconciler's - before the answer or the worker's turn), ``evicted`` (an eviction call
returned, before the worker goes on), ``ledger-before`` (a ledger write is about
to be sent) and ``ledger-write`` (a ledger write returned, before its caller goes on).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from webhook.core.model import PodRef
from webhook.engine.hooks import Hooks
from webhook.engine.ledger import (
    EvictionResult,
    Ledger,
    LedgerChange,
    LedgerEntry,
    R,
    VictimEvictor,
)

log = logging.getLogger(__name__)

FAULT_ENV: Final = "RPW_FAULT"
FAULT_FILE_ENV: Final = "RPW_FAULT_FILE"
DELAY_ENV: Final = "RPW_EVICT_DELAY"
#: What runs the service with these hooks (``harness.webhook_process.launch``'s command).
COMMAND: Final = (sys.executable, "-m", "harness.fault_hooks", "serve")
#: Seconds a paused point waits for the test at most.
PAUSE_LIMIT: Final = 60.0


class Fault:
    """Counts arrivals at named points; kills the process group at the armed one."""

    def __init__(self, spec: str = "", path: str = "") -> None:
        self.spec = spec
        self.path = path
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def _armed(self) -> str:
        if self.spec:
            return self.spec
        try:
            with open(self.path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError:
            return ""

    def reached(self, point: str) -> None:
        armed = self._armed()
        target, _, rest = armed.partition(":")
        count, _, action = rest.partition(":")
        if target.strip() != point:
            return
        with self._lock:
            # Counted per arming: a new file content starts again from zero.
            self._counts[armed] = seen = self._counts.get(armed, 0) + 1
            if seen < int(count or "1"):
                return
            if self.path:
                with contextlib.suppress(OSError):
                    os.unlink(self.path)
        if action.strip() == "pause" and self.path:
            self._pause(point)
            return
        log.warning("fault injection: killing the process group at %s", point)
        os.killpg(os.getpgrp(), signal.SIGKILL)

    def _pause(self, point: str) -> None:
        marker = self.path + ".paused"
        with open(marker, "w", encoding="utf-8") as f:
            f.write(point)
        log.warning("fault injection: paused at %s until %s is removed", point, marker)
        deadline = time.monotonic() + PAUSE_LIMIT
        while os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.01)
        with contextlib.suppress(OSError):
            os.unlink(marker)


class FaultLedger:
    """A ledger whose writes are fault points (``ledger-before``, ``ledger-write`` and,
    for a write that adds an entry, ``admitted``)."""

    def __init__(self, ledger: Ledger, fault: Fault) -> None:
        self._ledger = ledger
        self._fault = fault

    def entries(self, node: str) -> tuple[LedgerEntry, ...]:
        return self._ledger.entries(node)

    def all_entries(self) -> tuple[LedgerEntry, ...]:
        return self._ledger.all_entries()

    def reachable(self) -> bool:
        return self._ledger.reachable()

    def untidy(self) -> frozenset[str]:
        return self._ledger.untidy()

    def update(self, node: str, change: LedgerChange[R]) -> R:
        wrote = added = False

        def before(entries: tuple[LedgerEntry, ...]) -> Any:
            nonlocal wrote, added
            new, result = change(entries)
            wrote = new is not None
            if new is not None:
                known = {e.review_uid for e in entries}
                added = any(e.review_uid not in known for e in new)
                self._fault.reached("ledger-before")
            return new, result

        result: R = self._ledger.update(node, before)
        if wrote:
            self._fault.reached("ledger-write")
        if added:
            self._fault.reached("admitted")
        return result


class FaultEvictor:
    """An evictor whose calls are fault points (``evicted``)."""

    def __init__(self, evictor: VictimEvictor, fault: Fault, delay: float = 0.0) -> None:
        self._evictor = evictor
        self._fault = fault
        self._delay = delay

    def evict(
        self,
        victim: PodRef,
        preemptor: PodRef,
        node: str,
        *,
        seen_live: bool = False,
        grace_seconds: int | None = None,
    ) -> EvictionResult:
        result = self._evictor.evict(
            victim, preemptor, node, seen_live=seen_live, grace_seconds=grace_seconds
        )
        self._fault.reached("evicted")
        time.sleep(self._delay)
        return result


def fault_hooks(env: Mapping[str, str]) -> Hooks:
    """The service's hooks for the faults ``env`` arms (one :class:`Fault` per process
    identity); hooks that keep everything when it arms none."""
    spec = env.get(FAULT_ENV, "")
    path = env.get(FAULT_FILE_ENV, "")
    delay = float(env.get(DELAY_ENV) or 0.0)
    if not spec and not path and not delay:
        return Hooks()
    faults: dict[str, Fault] = {}

    def fault(identity: str) -> Fault:
        if identity not in faults:
            faults[identity] = Fault(spec, path.replace("{identity}", identity))
            log.warning("fault injection on: %s", spec or faults[identity].path)
        return faults[identity]

    return Hooks(
        ledger=lambda ledger, identity: FaultLedger(ledger, fault(identity)),
        evictor=lambda evictor, identity: FaultEvictor(evictor, fault(identity), delay),
    )


def main(argv: Sequence[str] | None = None) -> int:
    from webhook.cli import main as webhook_main

    return webhook_main(argv, hooks=fault_hooks(os.environ))


if __name__ == "__main__":
    sys.exit(main())
