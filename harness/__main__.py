"""Command line of the local cluster: ``python -m harness up|down|status|demo``.

``up`` starts a supervisor process in the background that owns the control plane, the
nodes' kubelets (hollow: the v1.37.2 kubelet without containers, see :mod:`harness.nodes`;
with ``--node real``, node-1 is the kubelet on containerd and the webhook is installed by its
Helm chart from the locally built image, see :mod:`harness.realcluster`)
and the webhook (with ``--vpa`` also the deployment and replicaset controllers and the
Vertical Pod Autoscaler's updater, :mod:`harness.vpa`), waits until everything is ready,
and prints shell ``export`` lines (``eval "$(python -m harness up)"``). ``down`` stops the
supervisor, which stops the rest. State (kubeconfig, logs, pids) lives in ``.cluster/`` at
the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness import processes, realnode
from harness.binaries import REPO_ROOT, Binaries, BinariesUnavailable, ensure_binaries
from harness.chart import ChartError, helm_binary
from harness.kubeapi import ApiError, KubeClient
from harness.launcher import ControlPlane, ControlPlaneConfig, ControlPlaneError
from harness.nodes import HollowNodes, NodeError, NodeOptions, default_nodes
from harness.realcluster import RealCluster, RealClusterOptions
from harness.realnode import Images, NodeStack, NodeStackUnavailable, PreflightError
from harness.vpa import VpaBinaries, VpaError, VpaUpdater, ensure_vpa
from harness.webhook_process import (
    CONFIGURATION_PATH,
    WebhookProcess,
    WebhookUnavailable,
    start_webhook,
)

STATE_DIR = Path(os.environ.get("RPW_CLUSTER_DIR", REPO_ROOT / ".cluster"))
PID_FILE = "supervisor.pid"
READY_FILE = "ready.json"
NODES_FILE = "nodes.json"
UP_TIMEOUT = 180.0
#: A real node imports its images and the chart's pods start: more than hollow nodes need.
REAL_UP_TIMEOUT = 600.0


def _say(message: str) -> None:
    """Human-readable progress: stderr, so stdout stays eval-able."""
    print(message, file=sys.stderr, flush=True)


def parse_feature_gates(text: str) -> dict[str, bool]:
    """``A=true,B=false`` -> {"A": True, "B": False}."""
    gates: dict[str, bool] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or value.lower() not in ("true", "false"):
            raise argparse.ArgumentTypeError(f"bad feature gate {item!r}: expected Name=true|false")
        gates[name] = value.lower() == "true"
    return gates


def _grace_cap(text: str) -> float | None:
    if text.lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad grace cap {text!r}: seconds or 'none'") from None


def _add_cluster_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1, help="nodes node-1..N (1)")
    parser.add_argument(
        "--node",
        choices=("hollow", "real"),
        default="hollow",
        help="what node-1 is: 'hollow' (default; the kubelet without containers) or 'real' "
        "(the kubelet on containerd; node-2..N stay hollow; the webhook is installed by its "
        "chart)",
    )
    parser.add_argument("--cpu", default="8", help="CPU cores per node, whole cores (8)")
    parser.add_argument("--memory", default="16Gi", help="memory per node (16Gi)")
    parser.add_argument("--pods", type=int, default=110, help="pods per node (110)")
    parser.add_argument("--no-webhook", action="store_true", help="do not start the webhook")
    parser.add_argument(
        "--feature-gates",
        type=parse_feature_gates,
        default={},
        metavar="A=true,B=false",
        help="for kube-apiserver, kube-controller-manager, kube-scheduler and the kubelets",
    )
    parser.add_argument(
        "--grace-cap",
        type=_grace_cap,
        default=None,
        metavar="SECONDS|none",
        help="a container takes at most this long to stop; 'none' (the default) gives each "
        "pod its whole terminationGracePeriodSeconds",
    )
    parser.add_argument(
        "--vpa",
        action="store_true",
        help="also the deployment and replicaset controllers and the VPA updater (docs/vpa.md)",
    )


def _exports(ready: dict[str, Any]) -> str:
    return f"export KUBECONFIG={ready['kubeconfig']}\nexport PATH={ready['bin']}:$PATH"


def _read_ready() -> dict[str, Any] | None:
    try:
        ready: dict[str, Any] = json.loads((STATE_DIR / READY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return ready


def _supervisor_pid() -> int | None:
    """The pid of a live supervisor, or None."""
    try:
        pid = int((STATE_DIR / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return pid


# --- up / serve --------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    if _supervisor_pid() is not None and (ready := _read_ready()) is not None:
        _say(f"cluster already running (state in {STATE_DIR}); `make cluster-down` stops it")
        print(_exports(ready))
        return 0
    real = args.node == "real"
    if real and args.vpa:
        _say("error: VPA=1 runs with NODE=hollow only")
        return 1
    try:
        real_args = _prepare_real(args.no_webhook) if real else []
        binaries = ensure_binaries()
        vpa = ensure_vpa() if args.vpa else None
    except (BinariesUnavailable, VpaError, PreflightError, NodeStackUnavailable, ChartError) as e:
        _say(f"error: {e}")
        return 1
    _kill_leftovers()
    _clean_real_node()
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    (STATE_DIR / "logs").mkdir(parents=True)
    began = time.monotonic()
    argv = [
        sys.executable,
        "-m",
        "harness",
        "_serve",
        "--bin",
        str(binaries.directory),
        "--nodes",
        str(args.nodes),
        "--cpu",
        args.cpu,
        "--memory",
        args.memory,
        "--pods",
        str(args.pods),
        "--grace-cap",
        "none" if args.grace_cap is None else str(args.grace_cap),
        "--node",
        args.node,
        *real_args,
    ]
    if args.feature_gates:
        argv += [
            "--feature-gates",
            ",".join(f"{k}={str(v).lower()}" for k, v in args.feature_gates.items()),
        ]
    if args.no_webhook:
        argv.append("--no-webhook")
    if vpa is not None:
        argv += ["--vpa", "--vpa-bin", str(vpa.directory)]
    log = STATE_DIR / "logs" / "supervisor.log"
    with log.open("ab") as out:
        # Its own session and no parent-death signal: it must outlive this command.
        supervisor = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO_ROOT,
        )
    processes.install_signal_handlers()
    try:
        ready = _wait_ready(supervisor, log, REAL_UP_TIMEOUT if real else UP_TIMEOUT)
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM): nothing half-started may stay behind.
        _say("interrupted: stopping what was started")
        _stop_supervisor(supervisor.pid)
        _clean_real_node()
        raise
    if ready is None:
        return 1
    _say(_started_line(args, ready, time.monotonic() - began))
    if ready.get("chart"):
        chart = ready["chart"]
        _say(
            f"webhook: installed by its Helm chart from {chart['image']}, "
            f"{chart['replicas']} pods in {chart['namespace']} behind Service "
            f"{chart['service']} (kubectl -n {chart['namespace']} get pods -o wide)"
        )
    elif ready.get("webhook"):
        _say(f"webhook: {ready['webhook']['url']} registered (logs: {STATE_DIR}/logs/webhook.log)")
    elif ready.get("webhook_error"):
        _say(f"webhook NOT running, continuing without it: {ready['webhook_error']}")
    else:
        _say("webhook: not started (--no-webhook)")
    if ready.get("vpa"):
        _say(_vpa_usage(ready["vpa"]))
    _say(f"state and logs: {STATE_DIR}; stop with `make cluster-down`")
    print(_exports(ready))
    return 0


def _prepare_real(no_webhook: bool) -> list[str]:
    """Check the machine, build (or find) the node stack, the images and helm; the
    supervisor's arguments naming them."""
    realnode.check_machine()
    stack = realnode.ensure_node_stack()
    images = realnode.ensure_images()
    if not no_webhook:
        helm_binary()
    criu = ["--criu", str(stack.criu_dir)] if stack.criu_dir else []
    return ["--stack", str(stack.directory), *criu, "--images", str(images.directory)]


def _wait_ready(
    supervisor: subprocess.Popen[bytes], log: Path, timeout: float
) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while (ready := _read_ready()) is None:
        if supervisor.poll() is not None:
            _say(f"error: the cluster did not start; {log}:")
            _say(_tail(log, 25))
            return None
        if time.monotonic() > deadline:
            _say(f"error: the cluster was not ready after {timeout:.0f} s; see {log}")
            _stop_supervisor(supervisor.pid)
            _clean_real_node()
            return None
        time.sleep(0.1)
    return ready


def _started_line(args: argparse.Namespace, ready: dict[str, Any], took: float) -> str:
    grace = "whole grace period" if args.grace_cap is None else f"stops within {args.grace_cap} s"
    controllers = "disruption, deployment, replicaset" if args.vpa else "disruption"
    hollow = [f"node-{i}" for i in range(1, args.nodes + 1)]
    nodes = ""
    if args.node == "real":
        controllers = (
            "disruption, deployment, replicaset, garbage collector, serviceaccount, "
            "root-ca-publisher, endpointslice"
        )
        nodes = f"node-1 (kubelet {ready['version']} on containerd; {ready['node_cpu']} CPU)"
        hollow = hollow[1:]
    if hollow:
        nodes += "; " if nodes else ""
        nodes += (
            f"{', '.join(hollow)} ({args.cpu} CPU, {args.memory}, {args.pods} pods; "
            f"kubelet {ready['version']}, hollow; {grace})"
        )
    return (
        f"control plane {ready['version']} up in {took:.1f} s: etcd, kube-apiserver, "
        f"kube-controller-manager ({controllers}), kube-scheduler; nodes: {nodes}"
    )


def _vpa_usage(vpa: dict[str, Any]) -> str:
    """How to drive the updater by hand: one Deployment, its VPA, a recommendation."""
    resources = {"cpu": "2", "memory": "256Mi"}
    recommendation = {
        "containerName": "pause",
        **{bound: resources for bound in ("target", "lowerBound", "upperBound")},
    }
    status = {"status": {"recommendation": {"containerRecommendations": [recommendation]}}}
    autoscaler = {
        "apiVersion": "autoscaling.k8s.io/v1",
        "kind": "VerticalPodAutoscaler",
        "metadata": {"name": "web"},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "updatePolicy": {"updateMode": "InPlace"},
        },
    }

    def compact(obj: Any) -> str:
        return json.dumps(obj, separators=(",", ":"))

    lines = [
        f"vpa: updater {vpa['version']}, a loop every {vpa['interval']}, update modes InPlace "
        f"and InPlaceOrRecreate; no recommender runs: write status.recommendation yourself "
        f"(log: {vpa['log']}). Try (docs/vpa.md has more):",
        "  kubectl create deployment web --image=registry.k8s.io/pause:3.10",
        "  kubectl set resources deployment web --requests=cpu=1,memory=256Mi "
        "--limits=cpu=1,memory=256Mi",
        f"  echo '{compact(autoscaler)}' | kubectl apply -f -",
        f"  kubectl patch vpa web --subresource status --type merge -p '{compact(status)}'",
        "  kubectl get pods -l app=web -o jsonpath="
        "'{.items[0].status.containerStatuses[0].resources}'   # cpu 2, same pod",
    ]
    return "\n".join(lines)


def cmd_serve(args: argparse.Namespace) -> int:
    """The supervisor: runs until SIGTERM/SIGINT, then stops everything it started."""
    processes.install_signal_handlers()
    (STATE_DIR / PID_FILE).write_text(str(os.getpid()))
    binaries = Binaries(Path(args.bin))
    if args.node == "real":
        return _serve_real(args, binaries)
    config = ControlPlaneConfig(
        state_dir=STATE_DIR, feature_gates=args.feature_gates, workload_controllers=args.vpa
    )
    options = NodeOptions(stop_grace_cap=args.grace_cap, feature_gates=args.feature_gates)
    try:
        with (
            ControlPlane(binaries, config) as cp,
            HollowNodes(
                cp, default_nodes(args.nodes, args.cpu, args.memory, args.pods), options
            ) as nodes,
        ):
            pids = {name: nodes.pid(name) for name in nodes.names}
            updater: VpaUpdater | None = None
            if args.vpa:
                updater = VpaUpdater(cp, VpaBinaries(Path(args.vpa_bin))).start()
                pids["vpa-updater"] = updater.process.pid if updater.process else 0
            (STATE_DIR / NODES_FILE).write_text(json.dumps({"pids": pids}, indent=2))
            webhook: WebhookProcess | None = None
            webhook_error = None
            if not args.no_webhook:
                try:
                    webhook = start_webhook(cp.client, cp.kubeconfig, STATE_DIR)
                except WebhookUnavailable as e:
                    webhook_error = str(e).splitlines()[0]
                    print(f"webhook unavailable: {e}", flush=True)
            try:
                ready = {
                    "pid": os.getpid(),
                    "kubeconfig": str(cp.kubeconfig),
                    "bin": str(binaries.directory),
                    "server": cp.server,
                    "version": binaries.version,
                    "webhook": {"url": webhook.url, "pid": webhook.process.pid}
                    if webhook
                    else None,
                    "webhook_error": webhook_error,
                    "vpa": {
                        "version": updater.binaries.version,
                        "interval": f"{updater.options.interval:g} s",
                        "log": str(updater.log_path),
                    }
                    if updater
                    else None,
                }
                (STATE_DIR / READY_FILE).write_text(json.dumps(ready, indent=2))
                print("ready", flush=True)
                while True:
                    time.sleep(1)
                    cp.check_alive()
                    nodes.check_alive()
                    if updater is not None:
                        updater.check_alive()
            finally:
                if webhook is not None:
                    webhook.stop()
                if updater is not None:
                    updater.stop()
    except (ControlPlaneError, NodeError, VpaError) as e:
        print(f"cluster failed: {e}", flush=True)
        return 1
    finally:
        for name in (READY_FILE, PID_FILE):
            (STATE_DIR / name).unlink(missing_ok=True)
        print("stopped", flush=True)


def _serve_real(args: argparse.Namespace, binaries: Binaries) -> int:
    """The supervisor of a cluster whose node-1 is real (:class:`RealCluster`)."""
    options = RealClusterOptions(
        nodes=args.nodes,
        hollow_cpu=args.cpu,
        hollow_memory=args.memory,
        hollow_pods=args.pods,
        feature_gates=args.feature_gates,
        grace_cap=args.grace_cap,
        with_chart=not args.no_webhook,
        state_dir=STATE_DIR,
    )
    criu = Path(args.criu) if args.criu else None
    stack, images = NodeStack(Path(args.stack), criu), Images(Path(args.images))
    try:
        with RealCluster(binaries, stack, images, options) as cluster:
            (STATE_DIR / NODES_FILE).write_text(json.dumps({"pids": cluster.pids()}, indent=2))
            release = cluster.release
            ready = {
                "pid": os.getpid(),
                "kubeconfig": str(cluster.kubeconfig),
                "bin": str(binaries.directory),
                "server": cluster.control_plane.server,
                "version": binaries.version,
                "node": "real",
                "node_cpu": f"{cluster.allocatable_millicores() / 1000:g}",
                "webhook": None,
                "webhook_error": None if release or args.no_webhook else "chart not installed",
                "chart": {
                    "namespace": release.namespace,
                    "service": release.service,
                    "image": cluster.image("product"),
                    "replicas": release.replicas,
                }
                if release
                else None,
                "vpa": None,
            }
            (STATE_DIR / READY_FILE).write_text(json.dumps(ready, indent=2))
            print("ready", flush=True)
            while True:
                time.sleep(1)
                cluster.check_alive()
    except (ControlPlaneError, NodeError, ChartError, PreflightError) as e:
        print(f"cluster failed: {e}", flush=True)
        return 1
    finally:
        for name in (READY_FILE, PID_FILE):
            (STATE_DIR / name).unlink(missing_ok=True)
        print("stopped", flush=True)


# --- down / status -----------------------------------------------------------------------


def _stop_supervisor(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not processes.wait_for_exit(pid, 30):
        # Its children die with it (parent-death signal).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        processes.wait_for_exit(pid, 5)


def _kill_leftovers() -> None:
    """Components recorded in the state dir that still run (supervisor killed -9 early)."""
    try:
        state = json.loads((STATE_DIR / "control-plane.json").read_text())
    except (OSError, ValueError):
        return
    pids = list(state.get("pids", {}).values())
    with contextlib.suppress(OSError, ValueError):
        pids += json.loads((STATE_DIR / NODES_FILE).read_text())["pids"].values()
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if state["binaries"].encode() in cmdline:  # never a recycled pid of something else
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def cmd_down(_args: argparse.Namespace) -> int:
    pid = _supervisor_pid()
    if pid is None:
        _say("no cluster running")
    else:
        _stop_supervisor(pid)
        _say("cluster stopped")
    _kill_leftovers()
    _clean_real_node()
    for name in (READY_FILE, PID_FILE):
        (STATE_DIR / name).unlink(missing_ok=True)
    return 0


def _clean_real_node() -> None:
    """Whatever a real node of a stopped or killed supervisor left (shims, containers,
    mounts, bridges, cgroups), node-1's and a second one's (a killed test's); nothing when
    none ran or another live process owns it."""
    removed: list[str] = []
    for slot in (realnode.NODE_1, realnode.NodeSlot(2)):
        try:
            removed += realnode.clean_leftovers(slot.state_dir)
        except PreflightError as e:
            _say(f"real node left alone: {e}")
    if removed:
        kinds = Counter(line.rsplit(" ", 1)[0] if line[-1].isdigit() else line.split(" /")[0]
                        for line in removed)  # fmt: skip
        _say(f"removed what a real node left: {', '.join(f'{n} x {k}' for k, n in kinds.items())}")


def cmd_status(_args: argparse.Namespace) -> int:
    pid = _supervisor_pid()
    ready = _read_ready()
    if pid is None or ready is None:
        _say("no cluster running")
        return 1
    print(f"supervisor pid {pid}; {ready['version']} at {ready['server']}")
    print(_exports(ready))
    client = KubeClient.from_kubeconfig(ready["kubeconfig"])
    try:
        for node in client.get("/api/v1/nodes")["items"]:
            alloc = node["status"]["allocatable"]
            pods = client.get(
                "/api/v1/pods", fieldSelector=f"spec.nodeName={node['metadata']['name']}"
            )
            print(
                f"node {node['metadata']['name']}: {alloc['cpu']} CPU, {alloc['memory']}, "
                f"{alloc['pods']} pods allocatable; {len(pods['items'])} pods bound"
            )
        try:
            config = client.get(f"{CONFIGURATION_PATH}/resize-preemption-webhook")
            target = config["webhooks"][0]["clientConfig"]
            service = target.get("service", {})
            shown = target.get("url") or f"Service {service.get('namespace')}/{service.get('name')}"
            print(f"webhook registered: {shown}")
        except ApiError:
            print(
                "webhook not registered"
                + (f" ({ready['webhook_error']})" if ready.get("webhook_error") else "")
            )
        if vpa := ready.get("vpa"):
            autoscalers = client.get("/apis/autoscaling.k8s.io/v1/verticalpodautoscalers")
            print(
                f"vpa updater {vpa['version']}, a loop every {vpa['interval']}: "
                f"{len(autoscalers['items'])} VerticalPodAutoscalers (log: {vpa['log']})"
            )
    finally:
        client.close()
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    if args.node == "real":
        from harness import realdemo

        return realdemo.run(checkpoint=args.checkpoint)
    from harness import demo

    return demo.run(with_webhook=not args.no_webhook)


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="{up,down,status,demo}")
    up = sub.add_parser("up", help="start the local cluster in the background")
    _add_cluster_options(up)
    up.set_defaults(func=cmd_up)
    serve = sub.add_parser("_serve")  # internal: the supervisor started by `up`
    _add_cluster_options(serve)
    serve.add_argument("--bin", required=True)
    serve.add_argument("--vpa-bin")
    serve.add_argument("--stack")
    serve.add_argument("--criu")
    serve.add_argument("--images")
    serve.set_defaults(func=cmd_serve)
    sub.add_parser("down", help="stop it").set_defaults(func=cmd_down)
    sub.add_parser("status", help="show what runs").set_defaults(func=cmd_status)
    demo = sub.add_parser("demo", help="replay the resize walkthrough on a fresh cluster")
    demo.add_argument("--no-webhook", action="store_true")
    demo.add_argument("--node", choices=("hollow", "real"), default="hollow")
    demo.add_argument(
        "--checkpoint",
        action="store_true",
        help="with --node real: the victim opts in to checkpoints and comes back",
    )
    demo.set_defaults(func=cmd_demo)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
