"""Patch to actuation with a checkpointed victim against an evicted one, and the restore,
through the service on the real node.

``python -m bench.checkpoint_actuation [--repeat 3]`` (as root, with ``make node`` built;
``python -m bench checkpoint-actuation`` likewise) starts the control plane and ``node-1``
as the real kubelet on containerd (:class:`harness.realcluster.RealCluster`), installs the
chart with checkpoints on (the service's setting and the node agent's DaemonSet,
:meth:`~harness.realcluster.RealCluster.checkpoint_values`), then runs the scaled
walkthrough (:func:`harness.walkthrough.scaled_walkthrough`) ``--repeat`` times with each
kind of victim, alternating: evicted, then checkpointed.

The victim is a bare pod from the product image (it has Python; `--images` adds busybox's,
its shell holding the buffer in a variable) whose process fills a
buffer of ``--size`` with non-zero bytes, then appends ``<count> <wall time>`` to
``/tmp/count`` twice a second; it runs as root (CRIU here can dump only root's
processes: ``docs/checkpoint.md``, "On the real node of the tests"), its grace period is
5 s and it exits at once on SIGTERM, so neither kind waits for the grace period. The
checkpointed one carries ``resize-preemption.io/on-preempt: checkpoint``. Each run:

* **actuated**: from the ``kubectl patch`` of the preemptor's resize to its status
  showing the new CPU (the kubelet actuated it);
* checkpointed only: **checkpoint**, the time the ``Checkpointed`` event says the
  kubelet's checkpoint took; **imaged**, from the patch to the node agent's record phase
  ``imaged``; then the preemptor shrinks back to its size (room returns) and, from that
  patch, **running**: the victim's new pod ``Running`` with ``restored-from``;
  **counting**: the first count the restored process writes after the shrink (which
  must go on from the one before the checkpoint, not start at 1).

Prints every run, the medians and the difference and ratio of the medians; writes them
under ``actuation`` in ``bench/results/checkpoint.json`` (keeping the other figures).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from harness.binaries import REPO_ROOT, ensure_binaries
from harness.chart import NAMESPACE as SERVICE_NAMESPACE
from harness.kubeapi import ApiError
from harness.manifests import workload_pod
from harness.processes import install_signal_handlers
from harness.provenance import Run
from harness.realcluster import RealCluster, RealClusterOptions, millicores
from harness.realnode import NODE_NAME, check_machine, ensure_images, ensure_node_stack
from harness.walkthrough import Walkthrough, resize_patch, scaled_walkthrough
from webhook.core.checkpoint import (
    GROUP,
    NODES,
    ON_PREEMPT_ANNOTATION,
    RECORDS,
    RESTORED_FROM_ANNOTATION,
    VERSION,
    Phase,
)
from webhook.core.resources import memory_bytes

RESULTS = REPO_ROOT / "bench" / "results" / "checkpoint.json"
NAMESPACE = "bench-pause"
VICTIM = "low-priority-pod"
PREEMPTOR = "high-priority-pod"
GRACE_SECONDS = 5
POLL = 0.05
TIMEOUT = 180.0
#: The target of the issue: what a checkpointed victim may add to actuation, in seconds.
TARGET_S = 1.0
#: Fills ``size`` bytes (non-zero, so that every page is dumped), then appends each count
#: with the wall time; a TERM ends it at once (as PID 1 it would otherwise be ignored).
PROGRAM = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
buffer = bytearray(b"rpw-" * (int(sys.argv[1]) // 4))
n = 0
while True:
    n += 1
    with open("/tmp/count", "a") as f:
        f.write(f"{n} {time.time():.3f}\\n")
    time.sleep(0.5)
"""
#: The same for busybox's shell: the buffer a shell variable of ``size`` bytes; the sleep
#: waited for in the background, so that a TERM's trap runs at once. Its ``date`` has no
#: sub-second field: a count's time is the end of the second it was written in, which
#: never dates a count before it was written.
SHELL_PROGRAM = (
    "trap 'exit 0' TERM; x=$(head -c \"$1\" /dev/zero | tr '\\0' r); n=0; "
    'while true; do n=$((n+1)); echo "$n $(date +%s).999" >> /tmp/count; '
    "sleep 0.5 & wait $!; done"
)
#: The victim's image, by the name ``--images`` gives it: Python's (the product image,
#: 15,816 files) or busybox's (3): containerd's checkpoint reads every file of the image
#: (docs/checkpoint.md, "Where the checkpoint's time goes").
IMAGES = ("product", "workload")
T = TypeVar("T")


def _wait(what: str, condition: Callable[[], T | None], interval: float = POLL) -> T:
    deadline = time.monotonic() + TIMEOUT
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {TIMEOUT:.0f} s")
        time.sleep(interval)


def _guaranteed(cpu: int, memory: str) -> dict[str, dict[str, str]]:
    both = {"cpu": f"{cpu}m", "memory": memory}
    return {"requests": dict(both), "limits": dict(both)}


def _pods(
    cluster: RealCluster, walk: Walkthrough, size: int, opted_in: bool, image: str
) -> list[Any]:
    victim = workload_pod(
        VICTIM, cluster.image(image), "bench-low", _guaranteed(walk.low, "512Mi"),
        node=NODE_NAME, script="", container="main", grace_seconds=GRACE_SECONDS,
        dns_policy="Default",
    )  # fmt: skip
    container = victim["spec"]["containers"][0]
    if image == "product":
        container["command"] = ["python", "-c", PROGRAM, str(size)]
    else:
        container["command"] = ["sh", "-c", SHELL_PROGRAM, "victim", str(size)]
    container["imagePullPolicy"] = "IfNotPresent"
    container["securityContext"] = {"runAsUser": 0}
    if opted_in:
        victim["metadata"]["annotations"] = {ON_PREEMPT_ANNOTATION: "checkpoint"}
    preemptor = workload_pod(
        PREEMPTOR, cluster.image("workload"), "bench-high", _guaranteed(walk.high, "64Mi"),
        node=NODE_NAME, script="exec sleep 1000000", grace_seconds=0, dns_policy="Default",
    )  # fmt: skip
    return [victim, preemptor]


def _path(name: str) -> str:
    return f"/api/v1/namespaces/{NAMESPACE}/pods/{name}"


def _read(cluster: RealCluster, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = cluster.client.get_or_none(_path(name))
    return found


def _cpu_running(cluster: RealCluster) -> int | None:
    pod = _read(cluster, PREEMPTOR) or {}
    status = (pod.get("status", {}).get("containerStatuses") or [{}])[0]
    cpu = status.get("resources", {}).get("limits", {}).get("cpu")
    return None if cpu is None else millicores(str(cpu))


def _counts(cluster: RealCluster) -> list[tuple[int, float]]:
    """The victim's counts with their wall times ([] while it cannot be read)."""
    try:
        text = cluster.exec(NAMESPACE, VICTIM, ["cat", "/tmp/count"])
    except Exception:
        return []
    pairs = (line.split() for line in text.splitlines())
    return [(int(p[0]), float(p[1])) for p in pairs if len(p) == 2]


def _events(cluster: RealCluster, uid: str, reason: str) -> list[dict[str, Any]]:
    """The victim's events of ``reason``; earlier runs' victims had the same name."""
    return list(
        cluster.client.get(
            f"/api/v1/namespaces/{NAMESPACE}/events",
            fieldSelector=f"involvedObject.uid={uid},reason={reason}",
        )["items"]
    )


def _records(cluster: RealCluster) -> list[dict[str, Any]]:
    return list(
        cluster.client.get(f"/apis/{GROUP}/{VERSION}/namespaces/{SERVICE_NAMESPACE}/{RECORDS}")[
            "items"
        ]
    )


def _resize(cluster: RealCluster, millicores_: int) -> list[str]:
    result = cluster.kubectl(
        "patch", "-n", NAMESPACE, "pod", PREEMPTOR, "--subresource", "resize",
        "--patch", resize_patch(millicores_),
    )  # fmt: skip
    return [line for line in result.stderr.splitlines() if line.startswith("Warning:")]


def _start(cluster: RealCluster, pods: list[Any]) -> None:
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": pods})
    cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=manifest)
    names = [f"pod/{p['metadata']['name']}" for p in pods]
    cluster.kubectl("wait", "-n", NAMESPACE, "--for=condition=Ready", *names, "--timeout=120s")
    # The buffer is filled before the first count.
    _wait("the victim's counts", lambda: len(_counts(cluster)) >= 2, interval=0.5)


def _clean(cluster: RealCluster) -> None:
    for name in (VICTIM, PREEMPTOR):
        try:
            cluster.client.delete(_path(name), {"gracePeriodSeconds": 0})
        except ApiError as e:
            if e.status != 404:  # gone already (e.g. a restored victim that ended)
                raise
    _wait("pods gone", lambda: all(_read(cluster, n) is None for n in (VICTIM, PREEMPTOR)), 0.2)
    _wait("no checkpoint records", lambda: _records(cluster) == [] or None, 0.5)


def _run(
    cluster: RealCluster, walk: Walkthrough, size: int, checkpointed: bool, image: str
) -> dict[str, Any]:
    _start(cluster, _pods(cluster, walk, size, checkpointed, image))
    old_uid = (_read(cluster, VICTIM) or {})["metadata"]["uid"]
    patched = time.monotonic()
    told = _resize(cluster, walk.target)
    _wait(f"{walk.target}m actuated", lambda: _cpu_running(cluster) == walk.target)
    row: dict[str, Any] = {
        "image": image,
        "victim": "checkpointed" if checkpointed else "evicted",
        "actuated_s": round(time.monotonic() - patched, 3),
    }
    said = any("checkpointing 1 of them" in w for w in told)
    _wait("Preempted", lambda: _events(cluster, old_uid, "Preempted"), 0.2)
    if said != checkpointed:
        raise RuntimeError(f"the {row['victim']} run went otherwise: kubectl said {told}")
    if checkpointed:
        row |= _checkpoint_and_restore(cluster, walk, old_uid, patched)
    _clean(cluster)
    return row


def _checkpoint_and_restore(
    cluster: RealCluster, walk: Walkthrough, old_uid: str, patched: float
) -> dict[str, Any]:
    said = _wait("Checkpointed", lambda: _events(cluster, old_uid, "Checkpointed"), 0.2)
    for event in said:
        print(
            f"# Checkpointed x{event.get('count', 1)} on {event['involvedObject'].get('uid')}: "
            f"{event['message']}",
            file=sys.stderr,
        )
    event = said[0]
    found = re.search(r" in (\d+(?:\.\d+)?)s ", event["message"])
    if found is None:
        raise RuntimeError(f"no time in the Checkpointed event: {event['message']}")

    def imaged() -> bool:
        phases = [(r.get("status") or {}).get("phase") for r in _records(cluster)]
        return phases == [Phase.IMAGED.value]

    _wait("the checkpoint imaged", imaged, 0.1)
    imaged_s = time.monotonic() - patched
    _wait("the victim gone", lambda: _read(cluster, VICTIM) is None, 0.1)
    shrunk, shrunk_wall = time.monotonic(), time.time()
    _resize(cluster, walk.high)

    def restored() -> bool:
        pod = _read(cluster, VICTIM) or {"metadata": {"uid": old_uid}, "status": {}}
        annotations = pod["metadata"].get("annotations", {})
        return (
            pod["metadata"]["uid"] != old_uid
            and RESTORED_FROM_ANNOTATION in annotations
            and pod["status"].get("phase") == "Running"
        )

    _wait("the victim restored", restored)
    running_s = time.monotonic() - shrunk
    counts = _wait("a count after the restore", lambda: counts_after(_counts(cluster), shrunk_wall))
    counting_s = time.monotonic() - shrunk
    before = [n for n, at in _counts(cluster) if at < shrunk_wall]
    return {
        "checkpoint_s": float(found.group(1)), "imaged_s": round(imaged_s, 3),
        "restore_running_s": round(running_s, 3), "restore_counting_s": round(counting_s, 3),
        "count_before": max(before, default=0), "count_after": counts[0],
    }  # fmt: skip


def counts_after(counts: list[tuple[int, float]], since: float) -> list[int] | None:
    """The counts written after ``since`` (wall time), or None."""
    return [n for n, at in counts if at >= since] or None


def _median(rows: list[dict[str, Any]], kind: str, key: str) -> float | None:
    """The median of ``key`` over the runs of one image with victims of ``kind``."""
    values = [r[key] for r in rows if r["victim"] == kind and key in r]
    return round(statistics.median(values), 3) if values else None


def victim_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    evicted = _median(rows, "evicted", "actuated_s")
    checkpointed = _median(rows, "checkpointed", "actuated_s")
    assert evicted is not None and checkpointed is not None
    added = round(checkpointed - evicted, 3)
    return {
        "actuated_evicted_s": evicted, "actuated_checkpointed_s": checkpointed,
        "added_s": added, "ratio": round(checkpointed / evicted, 3),
        "target_added_s": TARGET_S, "target_met": added <= TARGET_S,
        **{f"{key}_median": _median(rows, "checkpointed", key)
           for key in ("checkpoint_s", "imaged_s", "restore_running_s", "restore_counting_s")},
        "counts_went_on": all(r["count_after"] > r["count_before"] > 0
                              for r in rows if r["victim"] == "checkpointed"),
    }  # fmt: skip


def _prepare(cluster: RealCluster) -> Walkthrough:
    """The chart with checkpoints on, the node agent's abilities published, the namespace
    and the PriorityClasses; the walkthrough scaled to what node-1 has left."""
    cluster.install_chart(cluster.checkpoint_values())
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{SERVICE_NAMESPACE}/{NODES}/{NODE_NAME}"

    def able() -> bool:
        data = (cluster.client.get_or_none(path) or {}).get("status", {})
        return (data.get("checkpoint"), data.get("restore")) == ("true", "true")

    _wait("the node agent's abilities", able, 0.5)
    cluster.create_namespace(NAMESPACE)
    for name, value in (("bench-high", 1_000_000), ("bench-low", 1_000)):
        body = {"metadata": {"name": name}, "value": value}
        cluster.client.create("/apis/scheduling.k8s.io/v1/priorityclasses", body)
    return scaled_walkthrough(cluster.allocatable_millicores(), cluster.requested_millicores())


def measure(
    size: int, kinds: Sequence[str], repeat: int
) -> tuple[Walkthrough, list[dict[str, Any]], list[tuple[float, float, float]]]:
    """On a node started for them, ``repeat`` runs of each image of ``kinds`` with each kind
    of victim, evicted first: the walkthrough, the runs, and the load average before and
    after them. The node stack is ``RPW_NODE_ASSETS``'s when it is set."""
    binaries, stack, images = ensure_binaries(), ensure_node_stack(), ensure_images()
    options = RealClusterOptions(with_chart=False)
    with RealCluster(binaries, stack, images, options) as cluster:
        walk = _prepare(cluster)
        load = [os.getloadavg()]
        rows = [
            _run(cluster, walk, size, kind, image)
            for _ in range(repeat)
            for image in kinds
            for kind in (False, True)
        ]
        load.append(os.getloadavg())
    return walk, rows, load


def summarize(rows: list[dict[str, Any]], kinds: Sequence[str]) -> dict[str, Any]:
    """Each image's summary of ``rows``."""
    return {i: victim_summary([r for r in rows if r["image"] == i]) for i in kinds}


def _print(rows: list[dict[str, Any]], summary: dict[str, Any]) -> None:
    keys = ("image", "actuated_s", "checkpoint_s", "imaged_s", "restore_running_s",
            "restore_counting_s", "count_before", "count_after")  # fmt: skip
    print("  ".join(f"{h:>18}" for h in ("victim", *keys)))
    for row in rows:
        print("  ".join(f"{row.get(k, '-')!s:>18}" for k in ("victim", *keys)))
    print(json.dumps(summary, indent=2))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.checkpoint_actuation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each kind of victim")
    parser.add_argument("--size", default="100Mi", help="the victim's memory to hold")
    parser.add_argument(
        "--images",
        default="product",
        help="the victims' images, comma-separated: product (Python), workload (busybox)",
    )
    parser.add_argument("--quick", action="store_true", help="one run of each (a smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    started = Run()
    repeat = 1 if args.quick else args.repeat
    if repeat < 1:
        parser.error("--repeat must be at least 1")
    kinds = [i.strip() for i in args.images.split(",") if i.strip()]
    if not kinds or not set(kinds) <= set(IMAGES):
        parser.error(f"--images takes {' and '.join(IMAGES)}, not {args.images!r}")
    size = memory_bytes(args.size)
    install_signal_handlers()
    check_machine()
    walk, rows, load = measure(size, kinds, repeat)
    summary = summarize(rows, kinds)
    _print(rows, summary)
    figures = {
        "size": args.size, "bytes": size, "repeat": repeat, "walkthrough": asdict(walk),
        "load_average_before": load[0], "load_average_after": load[1],
        "runs": rows, "summary": summary,
    }  # fmt: skip
    started.update(args.out, "actuation", figures)
    print(f"load average (1, 5, 15 min): before {load[0]}, after {load[1]}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
