"""The modules of ``webhook/`` one review passes through, for docs/comparison.md.

    python scripts/review_path.py

The walkthrough review (``high-priority-pod`` 4 -> 6 CPU on an 8-CPU node) is posted to
the web app, then one pass of the worker evicts ``low-priority-pod``; every call into a
``webhook`` module is recorded (``sys.setprofile``). The cluster and the ledger are the
test doubles of ``harness/doubles.py``, and ``engine/memory.py`` under them is left out:
the running service reads the cache and the Lease ledger of ``webhook/kube/`` instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from harness.doubles import FakeEvictor, InMemoryLedger, StaticClusterView  # noqa: E402
from tests.unit.web_fixtures import resized, walkthrough_objects, walkthrough_review  # noqa: E402
from webhook.base.metrics import Metrics  # noqa: E402
from webhook.base.settings import Config  # noqa: E402
from webhook.engine.worker import PreemptionWorker  # noqa: E402
from webhook.web.app import create_app  # noqa: E402

LEFT_OUT = {"engine/memory.py"}


def main() -> int:
    node, low, high = walkthrough_objects()
    ledger = InMemoryLedger()
    view = StaticClusterView.from_objects((node, low, high))
    client = create_app(Config(), cluster=view, ledger=ledger).test_client()
    persisted = StaticClusterView.from_objects((node, low, resized(high, "6")))
    evictor = FakeEvictor(persisted)
    worker = PreemptionWorker(persisted, ledger, evictor, Config(), Metrics())
    seen: set[str] = set()
    package = str(ROOT / "webhook") + "/"

    def record(frame: FrameType, event: str, arg: Any) -> None:
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(package):
            seen.add(name[len(package) :])

    sys.setprofile(record)
    client.post("/validate-resize", data=orjson.dumps(walkthrough_review()))
    worker.run_once()
    sys.setprofile(None)
    evicted = [name for name, _, _ in evictor.calls]
    if evicted != ["low-priority-pod"]:
        print(f"the walkthrough evicted {evicted}, not low-priority-pod")
        return 1
    modules = sorted(seen - LEFT_OUT)
    print(f"{len(modules)} modules: {', '.join(modules)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
