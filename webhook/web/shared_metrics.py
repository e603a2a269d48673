"""Metrics of several worker processes, served as one from the gunicorn master.

With ``workers > 1`` every worker counts into its own registry, but a scrape must see the
replica as a whole. prometheus-client's multiprocess mode does that: each process writes
its values to memory-mapped files in one directory, and a collector in the serving
process sums them up (gauges by their ``multiprocess_mode``, see
:mod:`webhook.engine.metrics`). The master owns the directory and the ``/metrics``
endpoint; workers only write.

prometheus-client picks the mode once, when it is imported, from ``PROMETHEUS_MULTIPROC_DIR``,
so its documentation asks for the variable to be in the environment when the process
starts. :func:`enable` runs in the master, before the fork: when the variable is not set,
it starts the master again (the same program and arguments, the same process id) with the
variable naming a new empty directory, which the workers then inherit.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from prometheus_client import CollectorRegistry, multiprocess

#: prometheus-client reads the directory from this variable (in every process).
DIRECTORY_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Names the directory when :func:`enable` made it (and :func:`disable` removes it); a
#: directory given by the operator is left alone.
OWNED_ENV = "RPW_METRICS_DIR_OWNED"


def enable(parent: str | None = None) -> Path:
    """The directory every process of this server writes its metrics to: the one in
    ``PROMETHEUS_MULTIPROC_DIR``. Without it, this process starts again with the variable
    naming a new empty directory under ``parent`` (default: the system's temporary
    directory), and never returns."""
    given = os.environ.get(DIRECTORY_ENV)
    if given:
        return Path(given)
    directory = tempfile.mkdtemp(prefix="rpw-metrics-", dir=parent)
    env = {**os.environ, DIRECTORY_ENV: directory, OWNED_ENV: directory}
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def registry(directory: Path) -> CollectorRegistry:
    """A registry that reads the sum of every process's values in ``directory``."""
    collected = CollectorRegistry()
    multiprocess.MultiProcessCollector(collected, path=str(directory))  # type: ignore[no-untyped-call]
    return collected


def process_exited(pid: int, directory: Path) -> None:
    """Forget the ``live*`` gauges of an exited worker (its counters still count)."""
    multiprocess.mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]


def disable(directory: Path) -> None:
    """Remove ``directory`` when :func:`enable` made it (the server is exiting)."""
    if os.environ.get(OWNED_ENV) == str(directory):
        shutil.rmtree(directory, ignore_errors=True)


__all__ = ["DIRECTORY_ENV", "OWNED_ENV", "disable", "enable", "process_exited", "registry"]
