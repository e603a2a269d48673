"""Review flood against the service itself: its Lease ledger, its cluster cache, a kubelet.

:class:`ClusterFlood` runs the scenario against a control plane and the service process
(``python -m webhook serve``, its defaults: one gevent worker, leader election, the
preemption worker and the reconciler in that process): ``python -m bench flood-cluster``
(:mod:`bench.flood_cluster`) for 60 s on a control plane of its own,
``tests/e2e/test_flood.py`` for 12 s against the test session's cluster.

1. ``node-1`` (8 CPU) full: ``preemptor`` (high priority, 1 CPU), three ``grower-*`` pods
   (high priority, 1 CPU each) and four ``low-*`` victims (low priority, 1 CPU each).
2. The saturation: 4 kept-alive connections post reviews back to back for a few seconds -
   AdmissionReviews built from the live grower pods (``oldObject`` the pod as stored,
   ``object`` the same at 2 CPU, the generation one up, a fresh uid each), so every one
   that is decided plans one victim and writes its entry to ``node-1``'s ledger Lease.
3. ``--factor`` (4) times that rate for ``--seconds``, posted to the service's HTTPS port
   by :func:`harness.flood.drive_main`, the client that behaves as the API server's webhook
   client (open loop, 25 idle connections, each call given up after 5 s). The API server
   never sees these resizes: none is persisted, so none may cost a pod.
4. A third of the way in, one real resize, ``kubectl patch --subresource resize`` of
   ``preemptor`` to 2 CPU: it needs one victim.

Afterwards (:class:`FloodRun` holds the figures): the answers by outcome (decided, failed
open, overload answer, timed out, 5xx, wrong), the worker's RSS before and after and
whether it lived, how long after the flood no grower entry held room in the Lease any more
and how many stayed stored, whether the real resize was actuated and its entry released,
the victims its plan named (the decision lines with ``reserved``), and every pod that was
evicted (eviction calls in the audit log, ``Preempted`` events, pods gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.audit import eviction_codes
from harness.fault_rig import NODE, pod_manifest
from harness.flood import API_SERVER_TIMEOUT, REPO, centiles, drive, drive_command
from harness.hostile_clients import CLIENT_CERT, CLIENT_KEY
from harness.kubeapi import KubeClient
from harness.local_server import rss_kb, worker_pids
from harness.review_cluster import resize_review
from harness.webhook_process import WebhookProcess
from webhook.base.settings import Config
from webhook.core.objects import parse_pod
from webhook.engine.ledger import LedgerEntry, decode_entries
from webhook.engine.lifecycle.states import room_holders
from webhook.kube.ledger import LEDGER_ANNOTATION, lease_name

#: Who sends the flood's reviews.
FLOOD_USER = {"username": "flood", "groups": ["system:authenticated"]}
PREEMPTOR = "preemptor"
GROWERS = ("grower-a", "grower-b", "grower-c")
LOWS = ("low-a", "low-b", "low-c", "low-d")
#: The answers a grower's review may get when it is decided: a victim of its own (three
#: growers, four victims: one is always left), or room already on its way out.
VERDICTS = "preempt,fits"
#: Seconds after the flood by which no grower entry may hold room: the service's
#: ``persist_timeout`` (an admitted resize not in the pod's spec by then is taken as
#: refused), and a margin for a review answered a moment after the flood's last one, the
#: watch and the poll.
SETTLE_MARGIN = 5.0
CLEAR_WITHIN = Config().persist_timeout + SETTLE_MARGIN


@dataclass
class FloodRun:
    """The figures of one run (see the module docstring)."""

    seconds: float
    factor: float
    saturation_per_s: float = 0.0
    saturation_counts: dict[str, int] = field(default_factory=dict)
    offered: int = 0
    offered_per_s: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)
    verdicts: dict[str, int] = field(default_factory=dict)
    latency_all: dict[str, float] = field(default_factory=dict)
    latency_full: dict[str, float] = field(default_factory=dict)
    latency_failed_open: dict[str, float] = field(default_factory=dict)
    connections_opened: int = 0
    client_behind_s: float = 0.0
    client_loop_lag: dict[str, float] = field(default_factory=dict)
    worker_alive: bool = False
    service_ready_after: bool = False
    rss_mb_before: float = 0.0
    rss_mb_after: float = 0.0
    #: The real resize: kubectl's exit code and warnings, seconds into the flood.
    resize_returncode: int | None = None
    resize_warnings: list[str] = field(default_factory=list)
    resize_at_s: float = 0.0
    #: How the real resize got its plan: ``review`` (admitted with it) or ``reconciler``
    #: (the review failed open, was overloaded or timed out; the kubelet deferred it).
    planned_by: str = ""
    plan_victims: list[str] = field(default_factory=list)
    actuated: bool = False
    actuated_after_flood_s: float | None = None
    real_entry_released: bool = False
    #: Grower entries still holding room in the Lease at the flood's end, and seconds
    #: after it until none did (None: not within CLEAR_WITHIN).
    grower_entries_counting_at_end: int = 0
    grower_entries_cleared_after_s: float | None = None
    #: Grower entries stored in the Lease at the end (spent ones stay until the next
    #: write to the node drops them), and the most seen stored at once.
    grower_entries_stored_after: int = 0
    grower_entries_stored_max: int = 0
    eviction_calls: dict[str, int] = field(default_factory=dict)
    preempted_events: dict[str, int] = field(default_factory=dict)
    pods_gone: list[str] = field(default_factory=list)
    load_average_1m: dict[str, float] = field(default_factory=dict)

    @property
    def server_errors_5xx(self) -> int:
        return sum(n for k, n in self.counts.items() if k.startswith("http 5"))

    @property
    def evicted(self) -> list[str]:
        """Every pod an eviction was asked for, or that left, or was told preempted."""
        return sorted(set(self.eviction_calls) | set(self.pods_gone) | set(self.preempted_events))

    def summary(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "server_errors_5xx": self.server_errors_5xx,
            "evicted": self.evicted,
        }


class ClusterFlood:
    """The scenario on a running cluster, against one running, registered service.

    ``client``: the harness's admin client; ``kubectl``: the binary; ``audit_log``: the
    API server's; ``service_log``: the service's output (its decision lines);
    ``classes``: PriorityClass names ``high`` and ``low``; ``namespace``: an empty one
    for the pods; ``ledger_namespace``: the service's (its Leases)."""

    def __init__(
        self,
        client: KubeClient,
        kubectl: Path,
        kubeconfig: Path,
        audit_log: Path,
        service: WebhookProcess,
        service_log: Path,
        *,
        namespace: str,
        classes: dict[str, str],
        ledger_namespace: str,
        workdir: Path,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.client = client
        self.kubectl_binary = kubectl
        self.kubeconfig = kubeconfig
        self.audit_log = audit_log
        self.service = service
        self.service_log = service_log
        self.namespace = namespace
        self.classes = classes
        self.ledger_namespace = ledger_namespace
        self.workdir = workdir
        self.log = log

    # -- cluster reads and writes ---------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.kubectl_binary), "--namespace", self.namespace, *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            check=False,
        )

    def _pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    def pod(self, name: str) -> dict[str, Any] | None:
        obj: dict[str, Any] | None = self.client.get_or_none(f"{self._pods_path()}/{name}")
        return obj

    def stored_entries(self) -> tuple[LedgerEntry, ...]:
        """``node-1``'s ledger entries as the API server stores them."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self.ledger_namespace}/leases"
        lease = self.client.get_or_none(f"{path}/{lease_name(NODE)}")
        if lease is None:
            return ()
        return decode_entries((lease["metadata"].get("annotations") or {}).get(LEDGER_ANNOTATION))

    def holding(self, entries: Sequence[LedgerEntry]) -> tuple[LedgerEntry, ...]:
        """The entries that still hold room, by the service's own rule, on the pods as the
        API server has them now."""
        pods = [parse_pod(p) for p in self.client.get(self._pods_path())["items"]]
        return room_holders(entries, pods, time.time())

    def _manifest(self, name: str, cls: str) -> dict[str, Any]:
        return pod_manifest(name, "1", self.classes[cls])

    def create_pods(self) -> None:
        items = [self._manifest(n, "high") for n in (PREEMPTOR, *GROWERS)]
        items += [self._manifest(n, "low") for n in LOWS]
        listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        names = [f"pod/{p['metadata']['name']}" for p in items]
        for args, text in (
            (("apply", "-f", "-"), listed),
            (("wait", "--for=condition=Ready", *names, "--timeout=60s"), None),
        ):
            done = self.kubectl(*args, input=text)
            if done.returncode != 0:
                raise RuntimeError(f"kubectl {args[0]}: {done.stderr}")

    def review_bodies(self) -> list[Path]:
        """Two AdmissionReviews per grower, as kube-apiserver would send its resize to 2
        CPU and to 1900m: built from the pod as stored; the uid is replaced by the client
        each time. The client sends them in turn, so that each review of a pod asks for
        another resize than the one before and is planned and written in full: the same
        resize asked again is answered with its entry, and writes nothing."""
        paths = []
        for name in GROWERS:
            old = self.pod(name)
            assert old is not None, name
            for cpu in ("2", "1900m"):
                path = self.workdir / f"review-{name}-{cpu}.json"
                path.write_bytes(resize_review(old, cpu, FLOOD_USER))
                paths.append(path)
        return paths

    # -- the run ------------------------------------------------------------------------------

    def run(self, seconds: float, factor: float = 4.0, saturation_seconds: float = 5.0) -> FloodRun:
        result = FloodRun(seconds=seconds, factor=factor)
        result.load_average_1m["before"] = os.getloadavg()[0]
        self.create_pods()
        ca = self.workdir / "ca.crt"
        ca.write_bytes(self.service.ca_pem)
        client = self.service.client_files
        if client is not None:
            # The flood's clients present kube-apiserver's certificate, found beside ca.crt.
            (self.workdir / CLIENT_CERT).write_bytes(client.cert.read_bytes())
            (self.workdir / CLIENT_KEY).write_bytes(client.key.read_bytes())
        bodies = self.review_bodies()
        (worker,) = worker_pids(self.service.process.pid)
        port = self.service.port

        saturation = drive(port, ca, bodies, saturation_seconds, closed=4, verdicts=VERDICTS)
        result.saturation_counts = saturation["counts"]
        decided = saturation["counts"].get("full", 0) + saturation["counts"].get("failed open", 0)
        result.saturation_per_s = round(decided / saturation["seconds"], 1)
        rate = max(1.0, round(result.saturation_per_s * factor, 1))
        self.log(f"saturation {result.saturation_per_s}/s: offering {rate}/s for {seconds} s")

        result.rss_mb_before = round(rss_kb(worker) / 1024, 1)
        out = self.workdir / "flood.json"
        stored_max = [0]
        with out.open("w") as sink:
            flood = subprocess.Popen(
                drive_command(port, ca, bodies, seconds, rate=rate, verdicts=VERDICTS),
                cwd=REPO,
                stdout=sink,
                stderr=subprocess.PIPE,
            )
            started = time.monotonic()
            try:
                self._watch_until(started + seconds / 3, stored_max)
                result.resize_at_s = round(time.monotonic() - started, 2)
                patch = self._resize()
                result.resize_returncode = patch.returncode
                result.resize_warnings = [
                    line.removeprefix("Warning: ")
                    for line in patch.stderr.splitlines()
                    if line.startswith("Warning: ")
                ]
                self._watch_until(started + seconds, stored_max)
                _, err = flood.communicate(timeout=API_SERVER_TIMEOUT + 60)
            finally:
                if flood.poll() is None:
                    flood.kill()
                    flood.wait()
        ended = time.monotonic()
        if flood.returncode != 0:
            raise RuntimeError(f"the flood client failed: {err.decode(errors='replace')}")
        figures = json.loads(out.read_text())
        result.worker_alive = os.path.exists(f"/proc/{worker}") and self.service.process.running()
        result.rss_mb_after = round(rss_kb(worker) / 1024, 1) if result.worker_alive else 0.0
        self._figures(result, figures)

        # Every grower entry holds no room within CLEAR_WITHIN of the flood's end; the
        # real resize is actuated meanwhile or after (timed from the flood's end too).
        growers = self._growers_entries()
        result.grower_entries_counting_at_end = len(self.holding(growers))
        deadline = ended + 90
        while time.monotonic() < deadline:
            now = time.monotonic() - ended
            if result.grower_entries_cleared_after_s is None and now < CLEAR_WITHIN + 5:
                entries = self._growers_entries()
                stored_max[0] = max(stored_max[0], len(entries))
                if not self.holding(entries):
                    result.grower_entries_cleared_after_s = round(now, 2)
            if not result.actuated and _actuated_cpu(self.pod(PREEMPTOR)) == "2":
                result.actuated = True
                result.actuated_after_flood_s = round(now, 2)
            if result.actuated and (
                result.grower_entries_cleared_after_s is not None or now >= CLEAR_WITHIN + 5
            ):
                break
            time.sleep(0.2)
        real_uid = (self.pod(PREEMPTOR) or {}).get("metadata", {}).get("uid", "")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            mine = [e for e in self.stored_entries() if e.pod.uid == real_uid]
            if not self.holding(mine):
                result.real_entry_released = True
                break
            time.sleep(0.2)
        # Wrong evictions, late ones included, would show by now.
        time.sleep(2.0)
        entries = self._growers_entries()
        result.grower_entries_stored_after = len(entries)
        result.grower_entries_stored_max = max(stored_max[0], len(entries))
        result.planned_by, result.plan_victims = self._plan()
        codes = eviction_codes(self.audit_log, self.namespace)
        result.eviction_calls = {name: len(answers) for name, answers in codes.items()}
        events = self.client.get(f"/api/v1/namespaces/{self.namespace}/events")["items"]
        result.preempted_events = dict(
            Counter(e["involvedObject"]["name"] for e in events if e.get("reason") == "Preempted")
        )
        present = {p["metadata"]["name"] for p in self.client.get(self._pods_path())["items"]}
        result.pods_gone = sorted(n for n in (PREEMPTOR, *GROWERS, *LOWS) if n not in present)
        result.service_ready_after = self._ready()
        result.load_average_1m["after"] = os.getloadavg()[0]
        return result

    def _resize(self) -> subprocess.CompletedProcess[str]:
        resources = {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}
        patch = {"spec": {"containers": [{"name": "app", "resources": resources}]}}
        return self.kubectl(
            "patch", "pod", PREEMPTOR, "--subresource", "resize", "--patch", json.dumps(patch)
        )

    def _growers_entries(self) -> tuple[LedgerEntry, ...]:
        return tuple(e for e in self.stored_entries() if e.pod.name in GROWERS)

    def _watch_until(self, until: float, stored_max: list[int]) -> None:
        """Samples how many grower entries the Lease stores meanwhile, until ``until``."""
        while (left := until - time.monotonic()) > 0:
            with contextlib.suppress(Exception):
                stored_max[0] = max(stored_max[0], len(self._growers_entries()))
            time.sleep(min(0.5, left))

    def _figures(self, result: FloodRun, figures: dict[str, Any]) -> None:
        result.offered = figures["offered"]
        result.offered_per_s = round(figures["offered"] / result.seconds, 1)
        result.counts = figures["counts"]
        result.verdicts = figures["verdicts"]
        latencies = figures["latencies_ms"]
        result.latency_all = centiles([x for v in latencies.values() for x in v])
        result.latency_full = centiles(latencies["full"])
        result.latency_failed_open = centiles(latencies["failed open"])
        result.connections_opened = figures["connections_opened"]
        result.client_behind_s = figures["client_behind_s"]
        result.client_loop_lag = centiles(figures["client_loop_lag_ms"])

    def _plan(self) -> tuple[str, list[str]]:
        """Who planned the real resize (``review``, ``reconciler``, or ``""``: nobody
        reserved for it) and the victims (names) of the plans reserved for it."""
        planned_by = ""
        victims: list[str] = []
        for line in self.service_log.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if not isinstance(record, dict) or record.get("pod") != f"{self.namespace}/{PREEMPTOR}":
                continue
            if record.get("reserved"):
                endpoint = record.get("endpoint")
                by = "review" if endpoint == "validate" else "reconciler"
                planned_by = by if not planned_by or planned_by == by else f"{planned_by},{by}"
                victims += [str(v).rpartition("/")[2] for v in record.get("victims", ())]
        return planned_by, victims

    def _ready(self) -> bool:
        import urllib.request

        context = self.service.context()
        try:
            with urllib.request.urlopen(
                f"{self.service.url}/readyz", context=context, timeout=5
            ) as response:
                return bool(response.status == 200)
        except OSError:
            return False


def _actuated_cpu(pod: dict[str, Any] | None) -> str | None:
    statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
    return statuses[0].get("resources", {}).get("requests", {}).get("cpu") if statuses else None


# -- checks ---------------------------------------------------------------------------------

#: The worker's RSS may grow by this much over a flood. What a flood holds is bounded by
#: counts, not by its length: at most ``harness.flood.MAX_CONNECTIONS`` open connections (a
#: greenlet and TLS buffers each, some tens of kB: under 60 MB together), at most one
#: ledger entry per resizing pod, and the cache of a handful of pods; the rest is the
#: interpreter's arenas, which keep what they took. The in-memory flood grows by about
#: 20 MB (docs/reliability.md).
RSS_GROWTH_MB = 100.0
#: Share of the offered reviews that may time out at the client: a machine shared by
#: several people can starve the worker (and the client) of the CPU for seconds.
TIMED_OUT_SHARE = 0.3


def failures(run: FloodRun) -> list[str]:
    """What did not hold (empty: the run passed)."""
    wrong = {
        k: n
        for k, n in run.counts.items()
        if k not in ("full", "failed open", "overloaded", "timed out", "connection error")
    }
    found = []
    checks = [
        (run.worker_alive, "the service's worker died"),
        (run.service_ready_after, "the service was not ready afterwards"),
        (run.server_errors_5xx == 0, f"{run.server_errors_5xx} answers were 5xx"),
        (not wrong, f"wrong answers: {wrong}"),
        (
            run.counts.get("timed out", 0) <= TIMED_OUT_SHARE * run.offered,
            f"{run.counts.get('timed out', 0)} of {run.offered} reviews timed out",
        ),
        (
            run.rss_mb_after - run.rss_mb_before < RSS_GROWTH_MB,
            f"RSS grew from {run.rss_mb_before} to {run.rss_mb_after} MB",
        ),
        (
            run.grower_entries_cleared_after_s is not None
            and run.grower_entries_cleared_after_s <= CLEAR_WITHIN,
            f"grower entries still held room {CLEAR_WITHIN:g} s after the flood",
        ),
        (
            run.grower_entries_stored_max <= len(GROWERS),
            f"{run.grower_entries_stored_max} grower entries stored at once",
        ),
        (run.resize_returncode == 0, "the real resize was not admitted"),
        (
            bool(run.resize_warnings),
            "the real resize had no answer from the webhook: the API server timed out",
        ),
        (
            run.planned_by in ("review", "reconciler"),
            f"the real resize planned by {run.planned_by or 'nobody'}",
        ),
        (
            run.planned_by != "review"
            or any(v in w for v in run.plan_victims for w in run.resize_warnings),
            f"admitted with its plan, kubectl was not told it: {run.resize_warnings}",
        ),
        (run.actuated, "the real resize was not actuated"),
        (run.real_entry_released, "the real resize's entry still holds room"),
        (len(run.plan_victims) == 1, f"the real plan's victims: {run.plan_victims}"),
        (
            run.evicted == sorted(run.plan_victims),
            f"evicted {run.evicted}, the plan named {run.plan_victims}",
        ),
        (
            all(n == 1 for n in run.eviction_calls.values()),
            f"eviction calls {run.eviction_calls}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            found.append(message)
    return found
