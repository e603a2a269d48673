"""API requests while nothing happens: the webhook service beside kube-scheduler.

``python -m bench.experiments.idle [--window 60]`` starts one local control plane
(v1.37.2, every request in the audit log) with kube-scheduler run as in a cluster -
leader election on, with its defaults (15 s lease, renewed every 2 s) - and one webhook
replica with its defaults, lets both settle, and counts each one's requests over
``--window`` seconds in which nothing is created, resized or deleted.

A full resync (the cache and the ledger watch list everything again, every
``resync-period``, 300 s by default) does not fit such a window, so its cost is measured
apart: the webhook is started again with ``--resync-period`` set to a fraction of the
window, and what it sends beyond the first count is divided by the resyncs the window
held. kube-scheduler's informers resync from their own cache, without a request.

It prints both counts by verb and resource, and the rates per minute.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from harness.binaries import ensure_binaries
from harness.compare.measure import AUDIT_EVERYTHING, AuditCursor, count_requests
from harness.launcher import ControlPlane, ControlPlaneConfig, free_port
from harness.processes import spawn
from harness.webhook_process import start_webhook
from webhook.kube.client import USER_AGENT

SETTLE = 20.0
SCHEDULER_AGENT = "kube-scheduler/"


def _count(audit: Path, start: float, end: float) -> dict[str, tuple[int, dict[str, int]]]:
    return {
        # Everything counts at rest, leader election included: it is what is measured.
        name: count_requests(AuditCursor(audit), prefix, start, end, leader_apart=False)
        for name, prefix in (("webhook", USER_AGENT), ("kube-scheduler", SCHEDULER_AGENT))
    }


def _window(audit: Path, seconds: float) -> dict[str, tuple[int, dict[str, int]]]:
    start = time.time()
    time.sleep(seconds)
    return _count(audit, start, time.time())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.idle", description=__doc__)
    parser.add_argument("--window", type=float, default=60.0, help="seconds counted")
    args = parser.parse_args(argv)
    window = args.window
    resync = window / 4
    binaries = ensure_binaries()
    with tempfile.TemporaryDirectory(prefix="rpw-idle-") as tmp:
        state = Path(tmp)
        config = ControlPlaneConfig(state_dir=state, scheduler=False, audit_policy=AUDIT_EVERYTHING)
        with ControlPlane(binaries, config) as cp:
            cp.wait_components_healthy(timeout=60)
            port = free_port()
            scheduler = spawn(
                "kube-scheduler",
                [
                    str(binaries.kube_scheduler),
                    f"--kubeconfig={cp.kubeconfig}",
                    f"--authentication-kubeconfig={cp.kubeconfig}",
                    f"--authorization-kubeconfig={cp.kubeconfig}",
                    "--leader-elect=true",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={port}",
                ],
                cp.log_dir / "kube-scheduler-leader-elect.log",
            )
            audit = cp.log_dir / "audit.log"
            try:
                webhook = start_webhook(cp.client, cp.kubeconfig, state)
                time.sleep(SETTLE)
                idle = _window(audit, window)
                webhook.stop()
                webhook = start_webhook(
                    cp.client,
                    cp.kubeconfig,
                    state,
                    extra_args=["--resync-period", f"{resync:g}"],
                )
                time.sleep(SETTLE)
                resyncing = _window(audit, window)
                webhook.stop()
            finally:
                scheduler.stop()
    ours, ours_by = idle["webhook"]
    theirs, theirs_by = idle["kube-scheduler"]
    with_resyncs, with_resyncs_by = resyncing["webhook"]
    per_resync = (with_resyncs - ours) / (window / resync)
    default_resync = 300.0
    result = {
        "command": f"python -m bench.experiments.idle --window {window:g}",
        "window_s": window,
        "webhook": {"requests": ours, "by": ours_by, "per_minute": 60 * ours / window},
        "kube_scheduler": {
            "requests": theirs,
            "by": theirs_by,
            "per_minute": 60 * theirs / window,
        },
        "webhook_resync": {
            "resync_period_s": resync,
            "requests": with_resyncs,
            "by": with_resyncs_by,
            "per_resync": per_resync,
            "per_minute_at_default": 60 * per_resync / default_resync,
        },
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
