"""Checkpoint and restore of a process holding 100 MiB and 1 GiB, on the real node.

``python -m bench.checkpoint [--sizes 100Mi,1Gi]`` (as root, with ``make node`` built)
starts the control plane and ``node-1`` as the real kubelet on containerd, without the
chart (:class:`harness.realcluster.RealCluster`), then for each size:

* a pod from the product image (it has Python) whose process fills a buffer of that size
  with non-zero bytes, then counts in a variable and writes the count to ``/tmp/count``
  twice a second;
* checkpoint: the kubelet's ``POST /checkpoint/...`` answered (the dump, the archive
  written), and the archive's size;
* image: the node agent's own steps, in this process: the OCI image layout written from
  the archive (:func:`webhook.agent.oci.write_image_layout`), then ``ctr images import``
  into containerd, unpacked onto overlayfs (:class:`webhook.agent.runtime.Containerd`);
* restore: the pod deleted, then created again under its name from that image and command;
  from the POST to the container running, and to the restored process's next count
  (which must go on from the checkpoint's).

Prints the figures and writes ``bench/results/checkpoint.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.binaries import REPO_ROOT, ensure_binaries
from harness.processes import install_signal_handlers
from harness.provenance import Run
from harness.realcluster import RealCluster, RealClusterOptions
from harness.realnode import NODE_IP, NODE_NAME, check_machine, ensure_images, ensure_node_stack
from webhook.agent.oci import process_args, write_image_layout
from webhook.agent.runtime import Containerd
from webhook.core.checkpoint import image_reference
from webhook.core.resources import memory_bytes

RESULTS = REPO_ROOT / "bench" / "results" / "checkpoint.json"
NAMESPACE = "bench-checkpoint"
CONTAINER = "main"
TIMEOUT = 300.0
#: Fills ``size`` bytes (non-zero, so that every page is dumped), then counts.
PROGRAM = """
import sys, time
buffer = bytearray(b"rpw-" * (int(sys.argv[1]) // 4))
n = 0
while True:
    n += 1
    with open("/tmp/count", "w") as f:
        f.write(f"{n} {len(buffer)}")
    time.sleep(0.5)
"""


def _pod(name: str, image: str, command: list[str], pull: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE_NAME,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {"name": CONTAINER, "image": image, "imagePullPolicy": pull, "command": command,
                 "args": [],
                 # This machine gives root no CAP_SYS_RESOURCE: CRIU cannot read the rlimits
                 # of another user's process (docs/checkpoint.md, "On this machine").
                 "securityContext": {"runAsUser": 0}}
            ],
        },
    }  # fmt: skip


def _wait(what: str, condition: Any, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + TIMEOUT
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {TIMEOUT:.0f} s")
        time.sleep(interval)


def _running(cluster: RealCluster, name: str) -> bool:
    pod = cluster.client.get_or_none(f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
    statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
    return bool(statuses) and "running" in statuses[0].get("state", {})


def _count(cluster: RealCluster, name: str) -> int:
    try:
        text = cluster.exec(NAMESPACE, name, ["cat", "/tmp/count"])
    except Exception:
        return 0
    return int(text.split()[0]) if text.strip() else 0


def _checkpoint(cluster: RealCluster, name: str) -> str:
    node = cluster.client.get(f"/api/v1/nodes/{NODE_NAME}")
    port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
    context = cluster.kubelet_context()
    url = f"https://{NODE_IP}:{port}/checkpoint/{NAMESPACE}/{name}/{CONTAINER}?timeout=600"
    request = urllib.request.Request(url, method="POST")
    try:
        with urllib.request.urlopen(request, context=context, timeout=900) as response:
            path: str = json.load(response)["items"][0]
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"checkpoint of {name}: HTTP {e.code}: {e.read().decode()}") from None
    return path


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[at]
        at, value, shift = at + 1, value | (byte & 0x7F) << shift, shift + 7
        if not byte & 0x80:
            return value, at


def dump_stats(data: bytes) -> dict[int, int]:
    """CRIU's ``stats-dump`` image (magics, size, a ``stats_entry``): the numbered fields of
    its ``dump`` message (``criu/images/stats.proto``), e.g. 2 = frozen time in µs."""
    size = int.from_bytes(data[8:12], "little")
    entry, fields, at = data[12 : 12 + size], {}, 0
    key, at = _varint(entry, at)
    length, at = _varint(entry, at)
    if key != (1 << 3 | 2):
        return {}
    dump, at = entry[at : at + length], 0
    while at < len(dump):
        key, at = _varint(dump, at)
        fields[key >> 3], at = _varint(dump, at)  # every field of the message is a varint
    return fields


def _criu_times(archive: Path) -> dict[str, float]:
    """CRIU's own share of the checkpoint, read from the archive: its run from start to
    "Dumping finished" (``dump.log``'s last time stamp) and how long the process was
    frozen (``stats-dump``)."""
    with tarfile.open(archive) as tar:
        log = tar.extractfile("dump.log")
        stats = tar.extractfile("stats-dump")
        assert log is not None and stats is not None
        last = log.read().decode(errors="replace").strip().splitlines()[-1]
        fields = dump_stats(stats.read())
    stamp = re.match(r"\((\d+\.\d+)\)", last)
    return {
        "criu_dump_s": round(float(stamp.group(1)), 3) if stamp else -1.0,
        "criu_frozen_s": round(fields.get(2, -1_000_000) / 1_000_000, 3),
    }


def _measure(cluster: RealCluster, runtime: Containerd, label: str, size: int) -> dict[str, Any]:
    name = f"hold-{label.lower()}"
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    command = ["python", "-c", PROGRAM, str(size)]
    cluster.client.create(pods, _pod(name, cluster.image("product"), command, "IfNotPresent"))
    _wait("count", lambda: _count(cluster, name) >= 3, interval=0.5)
    pod = cluster.client.get(f"{pods}/{name}")
    before = _count(cluster, name)
    began = time.monotonic()
    archive = Path(_checkpoint(cluster, name))
    checkpoint_s = time.monotonic() - began
    criu = _criu_times(archive)
    cluster.client.delete(f"{pods}/{name}", {"gracePeriodSeconds": 0})
    reference = image_reference(NAMESPACE, name, CONTAINER, pod["metadata"]["uid"])
    layout = archive.with_name(f".bench-{name}.tar")
    began = time.monotonic()
    write_image_layout(archive, layout, reference=reference, container=CONTAINER)
    layout_s = time.monotonic() - began
    began = time.monotonic()
    runtime.import_image(layout, reference)
    import_s = time.monotonic() - began
    layout.unlink()
    args = process_args(archive)
    archive_bytes = archive.stat().st_size
    archive.unlink()
    _wait("pod gone", lambda: cluster.client.get_or_none(f"{pods}/{name}") is None, 0.1)
    began = time.monotonic()
    cluster.client.create(pods, _pod(name, reference, args, "Never"))
    _wait("restored container", lambda: _running(cluster, name))
    running_s = time.monotonic() - began

    def counted_on() -> int:
        count = _count(cluster, name)
        return count if count > before else 0

    after = _wait("count after the restore", counted_on, 0.05)
    counting_s = time.monotonic() - began
    cluster.client.delete(f"{pods}/{name}", {"gracePeriodSeconds": 0})
    _wait("pod gone", lambda: cluster.client.get_or_none(f"{pods}/{name}") is None, 0.1)
    runtime.remove_image(reference)
    return {
        "size": label, "bytes": size, "archive_bytes": archive_bytes,
        "checkpoint_s": round(checkpoint_s, 2), **criu, "layout_s": round(layout_s, 2),
        "import_s": round(import_s, 2), "restore_running_s": round(running_s, 2),
        "restore_counting_s": round(counting_s, 2), "count_before": before, "count_after": after,
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.checkpoint", description=__doc__)
    parser.add_argument("--sizes", default="100Mi,1Gi", help="process memory to hold, each")
    parser.add_argument("--quick", action="store_true", help="16Mi only")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    started = Run()
    labels = ["16Mi"] if args.quick else [s.strip() for s in args.sizes.split(",") if s.strip()]
    install_signal_handlers()
    check_machine()
    binaries, stack, images = ensure_binaries(), ensure_node_stack(), ensure_images()
    with RealCluster(binaries, stack, images, RealClusterOptions(with_chart=False)) as cluster:
        node = cluster.node
        assert node is not None
        runtime = Containerd(str(stack.path("ctr")), str(node.paths.containerd_socket))
        cluster.create_namespace(NAMESPACE)
        rows = [_measure(cluster, runtime, label, memory_bytes(label)) for label in labels]
    head = ("size", "archive MiB", "checkpoint s", "criu s", "frozen s", "layout s",
            "import s", "running s", "counting s")  # fmt: skip
    print("  ".join(f"{h:>12}" for h in head))
    for r in rows:
        cells = (r["size"], f"{r['archive_bytes'] / 2**20:.1f}", r["checkpoint_s"],
                 r["criu_dump_s"], r["criu_frozen_s"], r["layout_s"],
                 r["import_s"], r["restore_running_s"], r["restore_counting_s"])  # fmt: skip
        print("  ".join(f"{c!s:>12}" for c in cells))
    # The file also keeps bench.checkpoint_actuation's figures.
    started.update(args.out, "runs", rows)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
