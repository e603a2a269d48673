"""A lender's memory on the real node: what the kubelet and the kernel do to a pod whose
memory was lowered in place, when its usage grows afterwards.

``python -m bench.experiments.lender_memory`` (as root, after ``make node``; it starts its
own cluster, without the chart, so not beside ``make cluster``; ``--kubeconfig .cluster/kubeconfig``
runs on a cluster ``make cluster NODE=real`` left running instead) lowers a pod's memory
through ``pods/resize`` (``kubectl patch --subresource resize``), as a loan does, with no
webhook in the way, then makes its process use more, and records what follows:

* ``guaranteed-limit-lowered``: Guaranteed, 512Mi, its one process (Python from the product
  image, the container's PID 1) holding 100Mi of its own heap; request and limit lowered
  together to 256Mi, above the usage, so the kubelet's check passes; then the process grows
  to 384Mi, above the new limit and below the old one;
* ``guaranteed-limit-lowered-tmpfs``: the shape of ``tests/e2e/test_realnode.py``'s lender:
  busybox, Guaranteed 512Mi, ``dd`` holding 100Mi in a memory-backed emptyDir (charged to
  the container's memory cgroup); lowered to 256Mi, then another ``dd`` (``kubectl exec``)
  writes 200Mi more there;
* ``burstable-request-lowered``: Burstable (requests 512Mi, limit 1Gi), holding 100Mi; its
  request only lowered to 128Mi, the limit untouched; then it grows to 384Mi, three times
  the new request;
* ``guaranteed-usage-above``: Guaranteed 512Mi holding 300Mi; lowered to 256Mi, below what
  it uses: the kubelet should refuse. Its condition's message is recorded, then it is put
  back to 512Mi as the webhook does.

For each: whether the kubelet actuated the resize (``status.containerStatuses[].resources``)
and how long it took, the container's memory cgroup (limit and usage, read inside the
container with ``kubectl exec``; the container's and the pod's limit read on the host too),
PID 1's ``oom_score_adj``, and after the growth, for ``--watch`` seconds: restarts, the
container's state and last state (``OOMKilled``), the pod's events, its resize conditions,
the kernel's OOM lines (``dmesg``) and the kubelet's log lines about the pod.

Prints a summary per scenario and writes ``bench/results/lender_memory.json``. Every wait is
bounded; the pods and their namespace are deleted at the end, also on failure.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import quantity
from harness.binaries import REPO_ROOT, ensure_binaries
from harness.images import PRODUCT_REFERENCE, WORKLOAD_REPOSITORY
from harness.kubeapi import ApiError, KubeClient
from harness.kubectl import Kubectl
from harness.processes import install_signal_handlers
from harness.provenance import Run
from harness.realcluster import MEMORY_COMMAND, RealCluster, RealClusterOptions, parse_memory
from harness.realnode import NODE_NAME, check_machine, ensure_images, ensure_node_stack

RESULTS = REPO_ROOT / "bench" / "results" / "lender_memory.json"
MI = 1024**2
#: How long the pod is watched after its usage grew, by default (``--quick``: 20 s).
WATCH = 60.0
#: The longest wait for the kubelet to report a refusal (it does at a later sync).
REFUSAL_TIMEOUT = 120.0
POLL = 0.5
#: PID 1 of the heap scenarios: holds ``argv[1]`` MiB of its own heap at start, then grows
#: to the number of MiB written into /ctl/target, one touched MiB at a time.
GROWER = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
MI = 1 << 20
held = []
def grow(to):
    while len(held) < to:
        held.append(b"\x01" * MI)
        if len(held) % 32 == 0:
            print("holding", len(held), "MiB", flush=True)
    print("holding", len(held), "MiB", flush=True)
grow(int(sys.argv[1]))
while True:
    try:
        with open("/ctl/target") as f:
            want = int(f.read())
    except (OSError, ValueError):
        want = 0
    if want > len(held):
        grow(want)
    time.sleep(0.2)
"""
#: PID 1 of the tmpfs scenario: the lender of tests/e2e/test_realnode.py, filling less.
SLEEPER = "trap 'exit 0' TERM; while true; do sleep 1; done"
KERNEL_OOM = re.compile(r"invoked oom-killer|Memory cgroup out of memory|oom-kill:|Killed process")


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str
    #: "heap": the grower (product image); "tmpfs": busybox and dd into a memory emptyDir.
    growth: str
    requests: dict[str, str]
    limits: dict[str, str]
    #: What the pod holds from its start, and what it grows to after the resize (MiB).
    start_mi: int
    grow_to_mi: int | None
    #: The resize asked: the container's new requests and limits.
    resize: dict[str, dict[str, str]]
    #: The kubelet is expected to refuse the resize (usage above the new limit).
    refused: bool = False


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "guaranteed-limit-lowered",
        "Guaranteed 512Mi holding 100Mi (heap of PID 1); request and limit to 256Mi; "
        "then it grows to 384Mi",
        "heap",
        {"cpu": "250m", "memory": "512Mi"},
        {"cpu": "250m", "memory": "512Mi"},
        100,
        384,
        {"requests": {"memory": "256Mi"}, "limits": {"memory": "256Mi"}},
    ),
    Scenario(
        "guaranteed-limit-lowered-tmpfs",
        "Guaranteed 512Mi holding 100Mi (dd into a memory emptyDir); request and limit to "
        "256Mi; then another dd writes 200Mi more there",
        "tmpfs",
        {"cpu": "250m", "memory": "512Mi"},
        {"cpu": "250m", "memory": "512Mi"},
        100,
        300,
        {"requests": {"memory": "256Mi"}, "limits": {"memory": "256Mi"}},
    ),
    Scenario(
        "burstable-request-lowered",
        "Burstable (requests 512Mi, limit 1Gi) holding 100Mi (heap of PID 1); request only "
        "to 128Mi; then it grows to 384Mi",
        "heap",
        {"cpu": "250m", "memory": "512Mi"},
        {"memory": "1Gi"},
        100,
        384,
        {"requests": {"memory": "128Mi"}},
    ),
    Scenario(
        "guaranteed-usage-above",
        "Guaranteed 512Mi holding 300Mi (heap of PID 1); request and limit to 256Mi, below "
        "the usage; then put back to 512Mi",
        "heap",
        {"cpu": "250m", "memory": "512Mi"},
        {"cpu": "250m", "memory": "512Mi"},
        300,
        None,
        {"requests": {"memory": "256Mi"}, "limits": {"memory": "256Mi"}},
        refused=True,
    ),
)


# --- the cluster ------------------------------------------------------------------------------


@dataclass
class Node:
    """What the scenarios use of a cluster: one started here, or one already running."""

    client: KubeClient
    kubectl: Kubectl
    #: Image reference by role (``workload``, ``product``), as imported on node-1.
    images: dict[str, str]
    log_dir: Path | None
    namespace: str = ""
    notes: list[str] = field(default_factory=list)

    def exec(
        self, pod: str, command: str, *, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.kubectl(
            "exec", "-n", self.namespace, pod, "--", "sh", "-c", command, check=check, timeout=60
        )

    def pod(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.client.get(f"/api/v1/namespaces/{self.namespace}/pods/{name}")
        return found


def _create_namespace(node: Node, name: str, timeout: float = 30.0) -> None:
    node.client.create("/api/v1/namespaces", {"metadata": {"name": name}})
    deadline = time.monotonic() + timeout
    while node.client.get_or_none(f"/api/v1/namespaces/{name}/serviceaccounts/default") is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"namespace {name} got no default service account")
        time.sleep(0.2)
    node.namespace = name


def _delete_namespace(node: Node) -> None:
    """Its pods at once, then the namespace, finalized here: no namespace controller runs
    on this cluster (as ``tests/e2e/conftest.py`` removes its namespaces)."""
    if not node.namespace:
        return
    path = f"/api/v1/namespaces/{node.namespace}"
    node.client.request("DELETE", f"{path}/pods", body={"gracePeriodSeconds": 0})
    deadline = time.monotonic() + 30
    while node.client.get(f"{path}/pods")["items"]:
        if time.monotonic() > deadline:
            node.notes.append(f"pods of {node.namespace} still there after 30 s")
            break
        time.sleep(0.2)
    try:
        node.client.delete(path)
        namespace = node.client.get(path)
        namespace["spec"]["finalizers"] = []
        node.client.replace(f"{path}/finalize", namespace)
    except ApiError as e:
        if e.status != 404:
            raise


def _delete_pod(node: Node, name: str, *, wait: bool = True, timeout: float = 60.0) -> None:
    path = f"/api/v1/namespaces/{node.namespace}/pods/{name}"
    if node.client.get_or_none(path) is None:
        return
    node.client.request("DELETE", path, body={"gracePeriodSeconds": 0})
    deadline = time.monotonic() + timeout
    while wait and node.client.get_or_none(path) is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pod {name} was not removed in {timeout:.0f} s")
        time.sleep(0.2)


# --- the pods ---------------------------------------------------------------------------------


def manifest(node: Node, s: Scenario) -> dict[str, Any]:
    resources: dict[str, dict[str, str]] = {"requests": dict(s.requests)}
    if s.limits:
        resources["limits"] = dict(s.limits)
    volume: dict[str, Any]
    if s.growth == "heap":
        image = node.images["product"]
        command = ["python3", "-u", "-c", GROWER, str(s.start_mi)]
        mount, volume = "/ctl", {"emptyDir": {}}
    else:
        image = node.images["workload"]
        fill = f"dd if=/dev/zero of=/fill/data bs={MI} count={s.start_mi} 2>/dev/null; "
        command = ["sh", "-c", fill + SLEEPER]
        mount, volume = "/fill", {"emptyDir": {"medium": "Memory"}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": s.name, "labels": {"app": "lender-memory"}},
        "spec": {
            "nodeName": NODE_NAME,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "app",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": command,
                    "resources": resources,
                    "volumeMounts": [{"name": "room", "mountPath": mount}],
                }
            ],
            "volumes": [{"name": "room", **volume}],
        },
    }


def _status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    found: dict[str, Any] = statuses[0]
    return found


def _memory(resources: dict[str, Any] | None, kind: str) -> int | None:
    value = (resources or {}).get(kind, {}).get("memory")
    return None if value is None else quantity.value(value)


def _resize_conditions(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {k: c.get(k) for k in ("type", "status", "reason", "message", "observedGeneration")}
        for c in pod.get("status", {}).get("conditions") or []
        if c.get("type") in ("PodResizePending", "PodResizeInProgress")
    ]


def _cgroup_in_container(node: Node, name: str) -> dict[str, Any]:
    """The container's memory limit and usage as it sees them, and PID 1's oom_score_adj."""
    result = node.exec(name, MEMORY_COMMAND + "; cat /proc/1/oom_score_adj", check=False)
    if result.returncode != 0:
        return {"error": (result.stderr or result.stdout).strip()[-300:], "rc": result.returncode}
    words = result.stdout.split()
    use = parse_memory(" ".join(words[:2]))
    return {"limit": use.limit, "usage": use.usage, "oom_score_adj": int(words[2])}


def _host_cgroups(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod's and its container's memory cgroups as the host sees them (cgroup v1 or v2,
    cgroupfs driver): limit, usage, peak, and the OOM kills counted there."""
    uid = pod["metadata"]["uid"]
    container_id = str(_status(pod).get("containerID") or "").split("://", 1)[-1]
    v1 = Path("/sys/fs/cgroup/memory/kubepods")
    root = v1 if v1.is_dir() else Path("/sys/fs/cgroup/kubepods")
    found = [
        p for qos in ("", "burstable/", "besteffort/") if (p := root / f"{qos}pod{uid}").is_dir()
    ]
    if not found:
        return {"error": f"no cgroup pod{uid} under {root}"}
    out: dict[str, Any] = {"pod_cgroup": str(found[0])}
    places = {"pod": found[0]}
    if container_id and (found[0] / container_id).is_dir():
        places["container"] = found[0] / container_id
    for where, path in places.items():
        out[where] = _read_memory_cgroup(path, v1=root == v1)
    return out


def _read_memory_cgroup(path: Path, *, v1: bool) -> dict[str, Any]:
    def read(name: str) -> str | None:
        try:
            return (path / name).read_text().strip()
        except OSError:
            return None

    def number(text: str | None) -> int | None:
        if text is None or text == "max":
            return None
        value = int(text)
        return None if value >= 9223372036854771712 else value

    if v1:
        oom = dict(line.split() for line in (read("memory.oom_control") or "").splitlines())
        return {
            "limit": number(read("memory.limit_in_bytes")),
            "usage": number(read("memory.usage_in_bytes")),
            "peak": number(read("memory.max_usage_in_bytes")),
            "failcnt": number(read("memory.failcnt")),
            "oom_kill": int(oom["oom_kill"]) if "oom_kill" in oom else None,
        }
    events = dict(line.split() for line in (read("memory.events") or "").splitlines())
    return {
        "limit": number(read("memory.max")),
        "usage": number(read("memory.current")),
        "peak": number(read("memory.peak")),
        "oom_kill": int(events["oom_kill"]) if "oom_kill" in events else None,
    }


def _events(node: Node, name: str) -> list[dict[str, Any]]:
    items = node.client.get(
        f"/api/v1/namespaces/{node.namespace}/events", fieldSelector=f"involvedObject.name={name}"
    )["items"]
    items.sort(key=lambda e: e.get("firstTimestamp") or e.get("eventTime") or "")
    return [
        {
            "reason": e.get("reason"),
            "type": e.get("type"),
            "message": e.get("message"),
            "count": e.get("count"),
            "first": e.get("firstTimestamp") or e.get("eventTime"),
            "last": e.get("lastTimestamp") or e.get("eventTime"),
            "from": (e.get("source") or {}).get("component") or e.get("reportingComponent"),
        }
        for e in items
    ]


def _dmesg() -> list[str]:
    result = subprocess.run(["dmesg"], capture_output=True, text=True, check=False, timeout=30)
    return result.stdout.splitlines() if result.returncode == 0 else []


class Logs:
    """New lines of the kernel's log and the kubelet's, from a mark on."""

    def __init__(self, node: Node) -> None:
        self.kubelet = node.log_dir / f"kubelet-{NODE_NAME}.log" if node.log_dir else None
        self.mark()

    def mark(self) -> None:
        self.dmesg_seen = len(_dmesg())
        self.kubelet_at = (
            self.kubelet.stat().st_size if self.kubelet and self.kubelet.exists() else 0
        )

    def kernel_oom(self) -> list[str]:
        return [line for line in _dmesg()[self.dmesg_seen :] if KERNEL_OOM.search(line)]

    def kubelet_lines(self, pod: str, limit: int = 40) -> list[str]:
        if self.kubelet is None or not self.kubelet.exists():
            return []
        with self.kubelet.open("rb") as f:
            f.seek(self.kubelet_at)
            text = f.read().decode(errors="replace")
        pattern = re.compile(r"(?i)resize|oom|memory|restart|back-off|backoff")
        lines = [
            line[:600] for line in text.splitlines() if f"/{pod}" in line and pattern.search(line)
        ]
        return lines[:limit] + ([f"... {len(lines) - limit} more"] if len(lines) > limit else [])


def _wait(what: str, check: Callable[[], Any], timeout: float, interval: float = POLL) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {timeout:.0f} s")
        time.sleep(interval)


def _resize(node: Node, name: str, resources: dict[str, dict[str, str]]) -> dict[str, Any]:
    patch = {"spec": {"containers": [{"name": "app", "resources": resources}]}}
    result = node.kubectl(
        "patch", "-n", node.namespace, "pod", name, "--subresource", "resize",
        "--patch", json.dumps(patch), check=False,
    )  # fmt: skip
    return {
        "patch": patch,
        "rc": result.returncode,
        "stdout": result.stdout.strip(),
        "stderr": result.stderr.strip(),
    }


def _running(pod: dict[str, Any], resources: dict[str, dict[str, str]]) -> bool:
    """Whether the kubelet reports the container running with ``resources``' memory."""
    actual = _status(pod).get("resources")
    return all(
        _memory(actual, kind) == quantity.value(values["memory"])
        for kind, values in resources.items()
        if "memory" in values
    )


def _snapshot(node: Node, name: str) -> dict[str, Any]:
    pod = node.pod(name)
    status = _status(pod)
    return {
        "spec": pod["spec"]["containers"][0]["resources"],
        "allocated": status.get("allocatedResources"),
        "running": status.get("resources"),
        "restarts": status.get("restartCount", 0),
        "state": status.get("state"),
        "last_state": status.get("lastState"),
        "conditions": _resize_conditions(pod),
        "host": _host_cgroups(pod),
    }


# --- a scenario -------------------------------------------------------------------------------


def run(node: Node, s: Scenario, watch: float, say: Callable[[str], None]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": s.name,
        "what": s.what,
        "requests": s.requests,
        "limits": s.limits,
        "start_mi": s.start_mi,
        "grow_to_mi": s.grow_to_mi,
    }
    logs = Logs(node)
    node.kubectl("apply", "-n", node.namespace, "-f", "-", input=json.dumps(manifest(node, s)))
    node.kubectl(
        "wait", "-n", node.namespace, "--for=condition=Ready", f"pod/{s.name}", "--timeout=90s",
        timeout=120,
    )  # fmt: skip
    _wait(
        f"{s.name} holding {s.start_mi}Mi",
        lambda: (_cgroup_in_container(node, s.name).get("usage") or 0) >= s.start_mi * MI,
        timeout=90,
    )
    out["before"] = {"cgroup": _cgroup_in_container(node, s.name), **_snapshot(node, s.name)}
    say(f"  {s.name}: holding {out['before']['cgroup']['usage'] / MI:.0f}Mi, "
        f"limit {_mib(out['before']['cgroup']['limit'])}")  # fmt: skip

    patched = time.monotonic()
    out["resize"] = {"at": _now(), **_resize(node, s.name, s.resize)}
    if out["resize"]["rc"] != 0:
        out["resize"]["actuated"] = False
        out["outcome"] = {"error": "the API server refused the resize"}
        return out
    if s.refused:
        _refusal(node, s, out, patched, say)
    else:
        running = _wait_until_running(node, s.name, s.resize, timeout=60)
        out["resize"]["actuated"] = running is not None
        out["resize"]["actuated_in_s"] = None if running is None else round(running - patched, 2)
        out["after_resize"] = {
            "cgroup": _cgroup_in_container(node, s.name),
            **_snapshot(node, s.name),
        }
        out["events_after_resize"] = _events(node, s.name)
        say(f"  {s.name}: resize actuated {out['resize']['actuated']} "
            f"in {out['resize'].get('actuated_in_s')} s; limit in the container "
            f"{_mib(out['before']['cgroup']['limit'])} -> "
            f"{_mib(out['after_resize']['cgroup'].get('limit'))}")  # fmt: skip
        if s.grow_to_mi is not None:
            _grow_and_watch(node, s, out, watch, say)
    out["kernel_oom"] = logs.kernel_oom()
    out["kubelet_log"] = logs.kubelet_lines(s.name)
    out["events"] = _events(node, s.name)
    return out


def _wait_until_running(
    node: Node, name: str, resources: dict[str, dict[str, str]], timeout: float
) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _running(node.pod(name), resources):
            return time.monotonic()
        time.sleep(0.05)
    return None


def _refusal(
    node: Node, s: Scenario, out: dict[str, Any], patched: float, say: Callable[[str], None]
) -> None:
    """The kubelet refuses: wait for its condition, then put the pod back."""

    def error() -> list[dict[str, Any]]:
        return [
            c
            for c in _resize_conditions(node.pod(s.name))
            if c["type"] == "PodResizeInProgress" and c.get("reason") == "Error"
        ]

    try:
        [condition] = _wait(f"{s.name}'s resize refused", error, REFUSAL_TIMEOUT)
    except TimeoutError as e:
        condition = None
        out["resize"]["refusal_error"] = str(e)
    out["resize"]["refused_in_s"] = round(time.monotonic() - patched, 2) if condition else None
    out["resize"]["refusal"] = condition
    out["resize"]["actuated"] = _running(node.pod(s.name), s.resize)
    out["after_resize"] = {"cgroup": _cgroup_in_container(node, s.name), **_snapshot(node, s.name)}
    out["events_after_resize"] = _events(node, s.name)
    say(f"  {s.name}: refused after {out['resize']['refused_in_s']} s: "
        f"{(condition or {}).get('message')}")  # fmt: skip

    back = {kind: {"memory": values["memory"]} for kind, values in
            (("requests", s.requests), ("limits", s.limits)) if "memory" in values}  # fmt: skip
    put = time.monotonic()
    out["put_back"] = {"at": _now(), **_resize(node, s.name, back)}

    def cleared() -> bool:
        pod = node.pod(s.name)
        allocated = _status(pod).get("allocatedResources") or {}
        return (
            not _resize_conditions(pod)
            and quantity.value(allocated.get("memory", "0")) == quantity.value(s.requests["memory"])
            and _running(pod, back)
        )

    try:
        _wait(f"{s.name} put back", cleared, 60)
        out["put_back"]["settled_in_s"] = round(time.monotonic() - put, 2)
    except TimeoutError as e:
        out["put_back"]["error"] = str(e)
    out["after_put_back"] = {
        "cgroup": _cgroup_in_container(node, s.name),
        **_snapshot(node, s.name),
    }


def _grow_and_watch(
    node: Node, s: Scenario, out: dict[str, Any], watch: float, say: Callable[[str], None]
) -> None:
    assert s.grow_to_mi is not None
    grew = time.monotonic()
    started = _now()
    if s.growth == "heap":
        result = node.exec(s.name, f"echo {s.grow_to_mi} > /ctl/target", check=False)
    else:
        more = s.grow_to_mi - s.start_mi
        result = node.exec(
            s.name,
            f"dd if=/dev/zero of=/fill/more bs={MI} count={more}; echo dd exited $?; ls -ln /fill",
            check=False,
        )  # fmt: skip
    out["growth"] = {
        "at": started,
        "to_mi": s.grow_to_mi,
        "exec_rc": result.returncode,
        "exec_output": (result.stdout + result.stderr).strip()[-500:],
    }
    samples: list[dict[str, Any]] = []
    first_oom: float | None = None
    restarts_at: dict[int, float] = {}
    while time.monotonic() - grew < watch:
        pod = node.pod(s.name)
        status = _status(pod)
        now = round(time.monotonic() - grew, 2)
        restarts = int(status.get("restartCount", 0))
        if restarts and restarts not in restarts_at:
            restarts_at[restarts] = now
        terminated = (status.get("lastState") or {}).get("terminated") or {}
        if first_oom is None and terminated.get("reason") == "OOMKilled":
            first_oom = now
        state = status.get("state") or {}
        kind = next(iter(state), None)
        samples.append({
            "t": now, "restarts": restarts, "state": kind,
            "reason": (state.get(kind) or {}).get("reason") if kind else None,
        })  # fmt: skip
        time.sleep(1.0)
    after = _snapshot(node, s.name)
    cgroup = _cgroup_in_container(node, s.name)
    last = (after.get("last_state") or {}).get("terminated") or {}
    out["after_growth"] = {"cgroup": cgroup, **after}
    out["outcome"] = {
        "watched_s": watch,
        "oom_killed": last.get("reason") == "OOMKilled",
        "first_oom_killed_seen_s": first_oom,
        "restarts": after["restarts"],
        "restarts_seen_at_s": restarts_at,
        "last_terminated": {
            k: last.get(k) for k in ("reason", "exitCode", "startedAt", "finishedAt")
        }
        if last
        else None,
        "state": after["state"],
        "samples": _changes(samples),
    }
    kind = next(iter(after["state"] or {}), None)
    reason = (after["state"] or {}).get(kind, {}).get("reason") if kind else None
    usage = "?" if cgroup.get("usage") is None else f"{cgroup['usage'] / MI:.0f}Mi"
    say(f"  {s.name}: grown to {s.grow_to_mi}Mi: OOMKilled {out['outcome']['oom_killed']}, "
        f"restarts {after['restarts']} in {watch:.0f} s, now {kind} {reason or ''}; usage "
        f"{usage}, exec rc {result.returncode}")  # fmt: skip


def _changes(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The samples where something other than the time changed."""
    kept: list[dict[str, Any]] = []
    for sample in samples:
        key = {k: v for k, v in sample.items() if k != "t"}
        if not kept or key != {k: v for k, v in kept[-1].items() if k != "t"}:
            kept.append(sample)
    return kept


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _mib(value: int | None) -> str:
    return "unlimited" if value is None else f"{value / MI:g}Mi"


# --- the run ----------------------------------------------------------------------------------


def _run_all(node: Node, chosen: Sequence[Scenario], watch: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    _create_namespace(node, f"lender-memory-{secrets.token_hex(3)}")
    try:
        for s in chosen:
            print(f"{s.name}: {s.what}", flush=True)
            try:
                results[s.name] = run(node, s, watch, lambda line: print(line, flush=True))
            except (
                TimeoutError, ApiError, subprocess.CalledProcessError, subprocess.TimeoutExpired
            ) as e:  # fmt: skip
                detail = getattr(e, "stderr", None) or ""
                results[s.name] = {"name": s.name, "error": f"{e} {detail}".strip()[-800:]}
                print(f"  {s.name}: failed: {results[s.name]['error']}", flush=True)
            finally:
                try:
                    _delete_pod(node, s.name)
                except (TimeoutError, ApiError) as e:
                    node.notes.append(f"{s.name}: {e}")
    finally:
        _delete_namespace(node)
    return results


def _imported(client: KubeClient) -> dict[str, str]:
    """The workload and product images node-1 reports (a running cluster's own, never
    rebuilt here)."""
    names = [
        n for image in client.get(f"/api/v1/nodes/{NODE_NAME}")["status"].get("images", [])
        for n in image.get("names", [])
    ]  # fmt: skip
    workload = [n for n in names if n.startswith(WORKLOAD_REPOSITORY + ":")]
    if PRODUCT_REFERENCE not in names or not workload:
        raise SystemExit(f"{NODE_NAME} lacks the workload or product image: {names}")
    return {"workload": workload[0], "product": PRODUCT_REFERENCE}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.experiments.lender_memory",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--only", nargs="*", default=None, metavar="NAME",
                        help=", ".join(s.name for s in SCENARIOS))  # fmt: skip
    parser.add_argument("--watch", type=float, default=WATCH,
                        help="seconds to watch a pod after its usage grew")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help=f"watch 20 s instead of {WATCH:.0f}")
    parser.add_argument("--kubeconfig", type=Path, default=None,
                        help="`make cluster NODE=real`'s kubeconfig: run there")  # fmt: skip
    parser.add_argument("--logs", type=Path, default=REPO_ROOT / ".cluster" / "logs",
                        help="that cluster's log directory (the kubelet's log)")  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    started = Run()
    chosen = [s for s in SCENARIOS if args.only is None or s.name in args.only]
    if args.only and len(chosen) != len(args.only):
        parser.error(f"unknown scenario among {args.only}")
    watch = 20.0 if args.quick else args.watch
    install_signal_handlers()
    binaries = ensure_binaries()
    began = time.monotonic()
    if args.kubeconfig is not None:
        client = KubeClient.from_kubeconfig(args.kubeconfig)
        node = Node(
            client,
            Kubectl(binaries.kubectl, args.kubeconfig.resolve()),
            _imported(client),
            args.logs if args.logs.is_dir() else None,
        )
        results = _run_all(node, chosen, watch)
        where = f"the running cluster of {args.kubeconfig}"
    else:
        check_machine()
        stack, images = ensure_node_stack(), ensure_images()
        options = RealClusterOptions(with_chart=False)
        with RealCluster(binaries, stack, images, options) as cluster:
            references = {role: images.reference(role) for role in ("workload", "product")}
            node = Node(cluster.client, cluster.kubectl, references, cluster.control_plane.log_dir)
            results = _run_all(node, chosen, watch)
        where = "a cluster of its own (no webhook)"
    document = {
        "kubelet": binaries.version,
        "cluster": where,
        "cgroup": "v1" if Path("/sys/fs/cgroup/memory").is_dir() else "v2",
        "watch_s": watch,
        "took_s": round(time.monotonic() - began, 1),
        "notes": node.notes,
        "scenarios": results,
    }
    out = started.write(args.out, document).resolve()
    print(f"wrote {out.relative_to(REPO_ROOT) if out.is_relative_to(REPO_ROOT) else out}")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
