"""Cluster cache memory and sync time: 150,000 pods on 5,000 nodes.

Generates a PodList of realistic pods (two or three containers, labels of a Deployment,
annotations, ``managedFields``, full status with ``containerStatuses``,
``allocatedResources`` and ``resources``), written as the pages (``POD_PAGE_SIZE`` items)
the API server would return to the reflector's paginated LIST. Then, in a fresh process
(so the figures hold nothing of the generator), it runs the reflector's LIST path on those
pages -
``parse_list_page`` -> ``parse_pod`` -> compaction -> the indexed store - and reports:

* sync time (first LIST) and relist time (same pages again: what a resync costs),
* RSS growth (``VmRSS`` from ``/proc/self/status``) and the peak (``VmHWM``),
* the cost of ``pods_on(node)``, the read the admission path makes on every review.

``python -m bench cache`` (or ``python -m bench.cache_bench``); ``--quick`` for a smaller
smoke run. Target: RSS growth <= 500 MB at full size.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from harness.provenance import Run

RESULTS = Path(__file__).resolve().parent / "results" / "cache.json"
TARGET_MB = 500
T0 = 1_760_000_000.0


def _ts(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _hex(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def _uid(rng: random.Random) -> str:
    h = _hex(rng, 32)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class Workloads:
    """Deployments spread over namespaces: pods of one share labels, images and sizes."""

    def __init__(self, rng: random.Random, count: int) -> None:
        self.items = []
        for d in range(count):
            ns = f"team-{d % 150:03d}"
            name = f"svc-{d:04d}"
            cpu = rng.choice(("50m", "100m", "250m", "500m", "1", "2"))
            mem = rng.choice(("64Mi", "128Mi", "256Mi", "512Mi", "1Gi", "2Gi"))
            self.items.append(
                {
                    "namespace": ns,
                    "name": name,
                    "hash": _hex(rng, 10),
                    "priority": rng.choice((0, 0, 0, 1000, 100000, 1000000)),
                    "cpu": cpu,
                    "mem": mem,
                    "sidecar": rng.random() < 0.4,
                    "init": rng.random() < 0.25,
                    "rs_uid": _uid(rng),
                }
            )


def _container(name: str, image: str, cpu: str, mem: str) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [{"containerPort": 8080, "name": "http", "protocol": "TCP"}],
        "env": [
            {"name": "LOG_LEVEL", "value": "info"},
            {
                "name": "POD_NAME",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
            },
        ],
        "resources": {"requests": {"cpu": cpu, "memory": mem}, "limits": {"memory": mem}},
        "readinessProbe": {
            "httpGet": {"path": "/ready", "port": 8080, "scheme": "HTTP"},
            "periodSeconds": 10,
            "timeoutSeconds": 1,
            "successThreshold": 1,
            "failureThreshold": 3,
        },
        "volumeMounts": [
            {
                "name": "kube-api-access",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True,
            }
        ],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


def _status(rng: random.Random, c: dict[str, Any], started: str) -> dict[str, Any]:
    req = c["resources"]["requests"]
    return {
        "name": c["name"],
        "image": c["image"],
        "imageID": f"registry.example/{c['name']}@sha256:{_hex(rng, 64)}",
        "containerID": f"containerd://{_hex(rng, 64)}",
        "ready": True,
        "started": True,
        "restartCount": 0,
        "state": {"running": {"startedAt": started}},
        "allocatedResources": dict(req),
        "resources": {"requests": dict(req), "limits": dict(c["resources"]["limits"])},
    }


def pod_object(rng: random.Random, i: int, w: dict[str, Any], node: str) -> dict[str, Any]:
    """One pod as the API server serves it in a list (no ``kind``/``apiVersion``)."""
    suffix = f"{i:05x}"[-5:]
    name = f"{w['name']}-{w['hash']}-{suffix}"
    created = T0 + rng.randrange(0, 86_400)
    started = _ts(created + 3)
    containers = [_container("app", f"registry.example/{w['name']}:1.4.2", w["cpu"], w["mem"])]
    if w["sidecar"]:
        containers.append(_container("metrics", "registry.example/exporter:0.9", "20m", "32Mi"))
    init = (
        [_container("migrate", f"registry.example/{w['name']}-migrate:1.4.2", "100m", "64Mi")]
        if w["init"]
        else []
    )
    statuses = [_status(rng, c, started) for c in containers]
    init_statuses = [
        {
            **_status(rng, c, started),
            "ready": False,
            "started": False,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
        }
        for c in init
    ]
    cond = [
        {"type": t, "status": "True", "lastTransitionTime": started}
        for t in (
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
        )
    ]
    return {
        "metadata": {
            "name": name,
            "generateName": f"{w['name']}-{w['hash']}-",
            "namespace": w["namespace"],
            "uid": _uid(rng),
            "resourceVersion": str(1000 + i),
            "creationTimestamp": _ts(created),
            "labels": {
                "app": w["name"],
                "app.kubernetes.io/name": w["name"],
                "app.kubernetes.io/part-of": w["namespace"],
                "pod-template-hash": w["hash"],
            },
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "8080",
                "kubectl.kubernetes.io/restartedAt": _ts(T0 - 86_400),
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{w['name']}-{w['hash']}",
                    "uid": w["rs_uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": _ts(created),
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:generateName": {}, "f:labels": {".": {}}},
                        "f:spec": {"f:containers": {'k:{"name":"app"}': {".": {}}}},
                    },
                },
                {
                    "manager": "kubelet",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": started,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}}},
                    "subresource": "status",
                },
            ],
        },
        "spec": {
            "containers": containers,
            "initContainers": init,
            "volumes": [
                {
                    "name": "kube-api-access",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}
                        ],
                    },
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "nodeName": node,
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
            "priority": w["priority"],
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": cond,
            "hostIP": f"10.0.{i % 250}.{i % 200}",
            "podIP": f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}",
            "podIPs": [{"ip": f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}"}],
            "startTime": _ts(created + 1),
            "containerStatuses": statuses,
            "initContainerStatuses": init_statuses,
            "qosClass": "Burstable",
        },
    }


def generate(path: Path, pods: int, nodes: int, seed: int = 5836) -> int:
    """Writes the PodList pages to ``path``, one page body per line; returns bytes written."""
    from webhook.kube.cache import POD_PAGE_SIZE as PAGE

    rng = random.Random(seed)
    workloads = Workloads(rng, max(1, pods // 30)).items
    written = 0
    with path.open("wb") as out:
        for start in range(0, pods, PAGE):
            items = [
                pod_object(rng, i, rng.choice(workloads), f"node-{rng.randrange(nodes):05d}")
                for i in range(start, min(pods, start + PAGE))
            ]
            last = start + PAGE >= pods
            page = {
                "kind": "PodList",
                "apiVersion": "v1",
                "metadata": {
                    "resourceVersion": str(1000 + pods),
                    **({} if last else {"continue": f"token-{start + PAGE}"}),
                },
                "items": items,
            }
            line = orjson.dumps(page) + b"\n"
            out.write(line)
            written += len(line)
    return written


# -- measuring (in a fresh process) --------------------------------------------------------


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _pages(path: Path) -> Iterator[Any]:
    from webhook.kube.reflector import parse_list_page

    with path.open("rb") as f:
        for line in f:
            yield parse_list_page(line)


def measure(path: Path, nodes: int, freeze: bool = True) -> dict[str, Any]:
    from webhook.kube.cache import PODS, ClusterCache

    cache = ClusterCache(None, freeze_gc=freeze)
    reflector = cache.reflector(PODS)
    gc.collect()
    rss0 = _status_kb("VmRSS")

    started = time.perf_counter()
    reflector.load_pages(_pages(path))
    sync_s = time.perf_counter() - started
    gc.collect()
    rss1 = _status_kb("VmRSS")
    hwm = _status_kb("VmHWM")

    started = time.perf_counter()
    changes = reflector.load_pages(_pages(path))
    relist_s = time.perf_counter() - started
    gc.collect()
    rss2 = _status_kb("VmRSS")

    started = time.perf_counter()
    gc.collect()
    full_gc_ms = (time.perf_counter() - started) * 1000

    names = [f"node-{k:05d}" for k in range(nodes)]
    reads = 200_000
    started = time.perf_counter()
    total = 0
    for k in range(reads):
        total += len(cache.pods_on(names[k % nodes]))
    read_ns = (time.perf_counter() - started) / reads * 1e9
    per_node = [len(cache.pods_on(n)) for n in names]
    return {
        "pods": len(cache.pods),
        "nodes_with_pods": sum(1 for n in per_node if n),
        "max_pods_per_node": max(per_node),
        "sync_seconds": round(sync_s, 2),
        "pods_per_second": round(len(cache.pods) / sync_s),
        "relist_seconds": round(relist_s, 2),
        "relist_changes": len(changes),
        "rss_before_mb": round(rss0 / 1024, 1),
        "rss_after_mb": round(rss1 / 1024, 1),
        "rss_growth_mb": round((rss1 - rss0) / 1024, 1),
        "rss_after_relist_mb": round(rss2 / 1024, 1),
        "peak_rss_mb": round(hwm / 1024, 1),
        "bytes_per_pod": round((rss1 - rss0) * 1024 / max(1, len(cache.pods))),
        "pods_on_ns": round(read_ns),
        "full_gc_ms": round(full_gc_ms, 1),
        "gc_frozen": freeze,
    }


def run(pods: int, nodes: int, freeze: bool = True) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="rpw-cache-bench-") as tmp:
        path = Path(tmp) / "pods.jsonl"
        started = time.perf_counter()
        size = generate(path, pods, nodes)
        gen_s = time.perf_counter() - started
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.cache_bench",
                "--measure",
                str(path),
                "--nodes",
                str(nodes),
                *([] if freeze else ["--no-freeze-gc"]),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "benchmark": "cluster_cache",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "target_rss_growth_mb": TARGET_MB,
        "list_bytes_mb": round(size / 2**20, 1),
        "list_bytes_per_pod": round(size / pods),
        "generate_seconds": round(gen_s, 1),
        **figures,
    }


def table(r: dict[str, Any]) -> str:
    verdict = "met" if r["rss_growth_mb"] <= r["target_rss_growth_mb"] else "MISSED"
    return "\n".join(
        [
            f"cluster cache (python {r['python']}, {r['machine']})",
            f"pods {r['pods']:,} on {r['nodes_with_pods']:,} nodes (max {r['max_pods_per_node']}"
            f" per node); list {r['list_bytes_mb']} MB ({r['list_bytes_per_pod']} B/pod)",
            f"sync (first LIST):  {r['sync_seconds']:>7.2f} s  ({r['pods_per_second']:,} pods/s)",
            f"relist (unchanged): {r['relist_seconds']:>7.2f} s  ({r['relist_changes']} changes)",
            f"RSS growth:         {r['rss_growth_mb']:>7.1f} MB ({r['bytes_per_pod']} B/pod)"
            f"  peak RSS {r['peak_rss_mb']} MB, after relist {r['rss_after_relist_mb']} MB",
            f"pods_on(node):      {r['pods_on_ns']:>7} ns",
            f"full gc.collect():  {r['full_gc_ms']:>7.1f} ms"
            f" (cache views {'frozen' if r['gc_frozen'] else 'NOT frozen'})",
            f"target RSS growth <= {r['target_rss_growth_mb']} MB: {verdict}",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cache")
    parser.add_argument("--quick", action="store_true", help="15,000 pods, no results file")
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument(
        "--no-freeze-gc",
        action="store_true",
        help="without the cache's gc.freeze(), to see the full-collection pause it avoids",
    )
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure is not None:
        print(json.dumps(measure(args.measure, args.nodes, freeze=not args.no_freeze_gc)))
        return 0
    started = Run()
    pods, nodes = (15_000, 500) if args.quick else (args.pods, args.nodes)
    result = run(pods, nodes, freeze=not args.no_freeze_gc)
    print(table(result))
    if not args.quick and not args.no_freeze_gc:
        started.write(RESULTS, result)
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
