"""``python -m bench faults-control-plane``: :mod:`bench.faults` with the control plane
broken instead of a replica - kube-apiserver killed and started again at 10 points of a
3-victim plan, then etcd stalled and etcd killed during an admission, 3 runs each
(``--quick``: 3 and 1). Writes ``bench/results/faults-control-plane.json``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from bench import faults


def main(argv: Sequence[str] | None = None) -> int:
    args = list(argv or [])
    runs = [] if "--runs" in args or "--quick" in args else ["--runs", "10"]
    return faults.main(["--fault", "control-plane", *runs, *args])


if __name__ == "__main__":
    sys.exit(main())
