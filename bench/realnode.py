"""The product image on the real node: its size, and its cold start to ready.

``python -m bench.realnode [--runs 3]`` (as root, with ``make node`` built) starts the
control plane, ``node-1`` as the real kubelet on containerd and the webhook with its chart
(:class:`harness.realcluster.RealCluster`), then measures:

* size: the image's OCI archive (what ``images.tsv`` names), its content in containerd
  (the compressed layers, ``ctr images list``) and what it unpacks onto the overlayfs
  snapshotter (``ctr images usage``);
* cold start, ``--runs`` times: a pod made from the chart Deployment's own pod template
  (image, command, Secret, service account, probes, resources), labelled so that neither
  its ReplicaSet nor its Service counts it, created with one POST. From the POST to:
  scheduled (``spec.nodeName`` set), the container running, the process answering
  ``/readyz`` 200 (polled from the host at the pod's address, every 50 ms: the process's
  own start), and the pod ``Ready`` (the kubelet's condition, which waits for the
  startup probe, every 2 s, then the readiness probe, every 5 s). The pod is then deleted
  at once and gone before the next run. The image is already imported (nothing is
  pulled here); every run is a new container and a new process.

Prints the figures, their medians, and writes ``bench/results/realnode.json``.
"""

from __future__ import annotations

import argparse
import copy
import re
import ssl
import statistics
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.binaries import REPO_ROOT, ensure_binaries
from harness.chart import FULLNAME, NAMESPACE
from harness.processes import install_signal_handlers
from harness.provenance import Run
from harness.realcluster import RealCluster, RealClusterOptions
from harness.realnode import check_machine, ensure_images, ensure_node_stack

RESULTS = REPO_ROOT / "bench" / "results" / "realnode.json"
POLL = 0.05
TIMEOUT = 180.0
LABEL = "rpw-cold-start"
#: The times measured from the POST, in the order they happen.
STAGES = ("scheduled", "running", "serving", "ready")


def _measure_sizes(cluster: RealCluster) -> dict[str, Any]:
    reference = cluster.image("product")
    [archive] = [path for ref, path, role in cluster.images.entries() if role == "product"]
    assert cluster.node is not None
    listed = cluster.node.ctr("images", "list", f"name=={reference}").stdout
    usage = cluster.node.ctr("images", "usage", "--snapshotter", "overlayfs", reference).stdout
    return {
        "reference": reference,
        "archive_bytes": archive.stat().st_size,
        "containerd_content": _size_column(listed),
        "unpacked_bytes": _usage_total(usage),
        "ctr_images_list": listed.strip(),
        "ctr_images_usage": usage.strip(),
    }


def _size_column(listed: str) -> str:
    """The SIZE of the one image ``ctr images list`` printed (e.g. ``99.9 MiB``)."""
    lines = listed.strip().splitlines()
    match = re.search(r"\s(\d+(?:\.\d+)?\s+[KMG]?i?B)\s", lines[-1]) if len(lines) > 1 else None
    return match.group(1) if match else ""


_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def _usage_total(usage: str) -> int:
    """What the image's snapshots hold together, in bytes: ``ctr images usage`` prints one
    line per snapshot of its chain (``KEY  184.8 MiB  8551``), no total."""
    total = 0.0
    for line in usage.strip().splitlines()[1:]:
        match = re.search(r"\s(\d+(?:\.\d+)?)\s+(B|KiB|MiB|GiB)\s", line)
        if match:
            total += float(match.group(1)) * _UNITS[match.group(2)]
    return round(total)


def _cold_pod(cluster: RealCluster, name: str) -> dict[str, Any]:
    deployment = cluster.client.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{FULLNAME}")
    template = copy.deepcopy(deployment["spec"]["template"])
    metadata = template.get("metadata", {})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": LABEL},
            "annotations": metadata.get("annotations", {}),
        },
        "spec": template["spec"],
    }


def _readyz(address: str, port: int) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(
            f"https://{address}:{port}/readyz", context=context, timeout=1
        ) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def _stages(pod: dict[str, Any]) -> set[str]:
    status = pod.get("status", {})
    reached = set()
    if pod.get("spec", {}).get("nodeName"):
        reached.add("scheduled")
    containers = status.get("containerStatuses") or [{}]
    if "running" in (containers[0].get("state") or {}):
        reached.add("running")
    if any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    ):
        reached.add("ready")
    return reached


def _cold_start(cluster: RealCluster, index: int) -> dict[str, float]:
    name = f"cold-start-{index}"
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    manifest = _cold_pod(cluster, name)
    # With clientAuth, /readyz answers without a client certificate on the probe port only.
    ports = {p.get("name"): p["containerPort"] for p in manifest["spec"]["containers"][0]["ports"]}
    port = ports.get("probes", ports["https"])
    began = time.monotonic()
    cluster.client.create(path, manifest)
    seen: dict[str, float] = {}
    while len(seen) < len(STAGES):
        if time.monotonic() - began > TIMEOUT:
            raise TimeoutError(f"{name} reached only {sorted(seen)} in {TIMEOUT:.0f} s")
        pod = cluster.client.get(f"{path}/{name}")
        now = time.monotonic() - began
        for stage in _stages(pod):
            seen.setdefault(stage, now)
        address = pod.get("status", {}).get("podIP")
        if "serving" not in seen and "running" in seen and address and _readyz(address, port):
            seen["serving"] = time.monotonic() - began
        time.sleep(POLL)
    cluster.client.request("DELETE", f"{path}/{name}", body={"gracePeriodSeconds": 0})
    deadline = time.monotonic() + 60
    while cluster.client.get_or_none(f"{path}/{name}") is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} was not removed")
        time.sleep(0.2)
    return {stage: round(seen[stage], 2) for stage in STAGES}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.realnode", description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="cold starts to measure")
    parser.add_argument("--quick", action="store_true", help="one cold start")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    started = Run()
    runs = 1 if args.quick else args.runs
    install_signal_handlers()
    check_machine()
    binaries, stack, images = ensure_binaries(), ensure_node_stack(), ensure_images()
    with RealCluster(binaries, stack, images, RealClusterOptions()) as cluster:
        sizes = _measure_sizes(cluster)
        starts = [_cold_start(cluster, i) for i in range(1, runs + 1)]
    medians = {s: round(statistics.median(r[s] for r in starts), 2) for s in STAGES}
    print(f"image {sizes['reference']}")
    unpacked = sizes["unpacked_bytes"] / 2**20
    print(f"  archive {sizes['archive_bytes'] / 1e6:.1f} MB, in containerd "
          f"{sizes['containerd_content']}, unpacked {unpacked:.1f} MiB")  # fmt: skip
    print("cold start, seconds from the POST:  " + "  ".join(f"{s:>9}" for s in STAGES))
    for i, run in enumerate(starts, 1):
        print(f"  run {i}{'':29}" + "  ".join(f"{run[s]:9.2f}" for s in STAGES))
    print(f"  median{'':28}" + "  ".join(f"{medians[s]:9.2f}" for s in STAGES))
    figures = {"sizes": sizes, "cold_starts": starts, "medians": medians}
    out = started.write(args.out, figures).resolve()
    print(f"wrote {out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
