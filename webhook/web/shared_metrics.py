"""Metrics of several worker processes, served as one from the gunicorn master.

With ``workers > 1`` every worker counts into its own registry, but a scrape must see the
replica as a whole. prometheus-client's multiprocess mode does that: each process writes
its values to memory-mapped files in one directory, and a collector in the serving
process sums them up (gauges by their ``multiprocess_mode``, see
:mod:`webhook.engine.metrics`). The master owns the directory and the ``/metrics``
endpoint; workers only write.

The mode is chosen per process before the first metric is built, which is why
:func:`enable` runs in the master, before the fork: the workers inherit it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry, multiprocess, values

#: prometheus-client reads the directory from this variable (in every process).
DIRECTORY_ENV = "PROMETHEUS_MULTIPROC_DIR"


def enable(parent: str | None = None) -> Path:
    """Switch this process (and the workers it will fork) to multiprocess metrics, in a
    new empty directory under ``parent`` (default: the system's temporary directory).
    Returns the directory; :func:`disable` removes it."""
    directory = Path(tempfile.mkdtemp(prefix="rpw-metrics-", dir=parent))
    os.environ[DIRECTORY_ENV] = str(directory)
    # The value class is picked when prometheus_client is imported, which has happened;
    # pick it again now that the variable is set.
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    return directory


def registry(directory: Path) -> CollectorRegistry:
    """A registry that reads the sum of every process's values in ``directory``."""
    collected = CollectorRegistry()
    multiprocess.MultiProcessCollector(collected, path=str(directory))  # type: ignore[no-untyped-call]
    return collected


def process_exited(pid: int, directory: Path) -> None:
    """Forget the ``live*`` gauges of an exited worker (its counters still count)."""
    multiprocess.mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]


def disable(directory: Path) -> None:
    """Remove ``directory`` and return this process to single-process metrics."""
    shutil.rmtree(directory, ignore_errors=True)
    if os.environ.get(DIRECTORY_ENV) == str(directory):
        del os.environ[DIRECTORY_ENV]
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


__all__ = ["DIRECTORY_ENV", "disable", "enable", "process_exited", "registry"]
