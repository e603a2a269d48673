"""Command line: ``python -m webhook plan|status|serve|certs|metrics ...``, also installed
as the console script ``resize-preemption-webhook`` and as the kubectl plugin
``kubectl resize-preemption`` (:func:`kubectl_plugin`).

Every subcommand turns expected failures into one line on stderr and an exit code: 2 for
bad input or unreadable files, 3 when the cluster cannot be reached (or no client
configuration is found), 4 when the cluster refuses the request (RBAC); a traceback means
a bug.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, get_args

import orjson
import yaml

from webhook.core.errors import InputError, LookupFailed, WebhookError
from webhook.core.objects import parse_time
from webhook.core.policy import DefaultPolicy, VictimOrder
from webhook.core.report import human_report, plan_to_dict
from webhook.core.resources import format_amount
from webhook.core.snapshot import load_snapshot, plan_snapshot_resize

if TYPE_CHECKING:
    from webhook.engine.hooks import Hooks

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_UNREACHABLE = 3
EXIT_FORBIDDEN = 4
#: Some of what was asked could not be done (a loan not given back): each is listed.
EXIT_FAILED = 1
#: The ClusterRole that grants what ``status`` and ``plan --kubeconfig`` read.
VIEWER_ROLE = "resize-preemption-webhook-viewer"
PROG = "python -m webhook"
#: How kubectl names the plugin (the console script ``kubectl-resize_preemption``).
KUBECTL_PLUGIN = "kubectl resize-preemption"

_V = TypeVar("_V")


class UsageError(InputError):
    """A command-line argument that cannot be used."""


class ClusterUnusable(WebhookError):
    """The cluster could not be asked: ``code`` is the exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _read_documents(path: str) -> list[object]:
    try:
        if path == "-":
            path = "standard input"
            text = sys.stdin.read()
        else:
            text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot read snapshot {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise UsageError(f"snapshot {path} is not UTF-8 text") from None
    stripped = text.lstrip()
    if stripped.startswith(("{", "[")):
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError as e:
            raise UsageError(f"snapshot {path} is not valid JSON: {e}") from None
        return list(data) if isinstance(data, list) else [data]
    try:
        return list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"snapshot {path} is not valid YAML{where}") from None


def _read_patch(text: str) -> dict[str, Any]:
    if text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as e:
            raise UsageError(f"cannot read resize patch {text[1:]}: {e.strerror or e}") from None
    try:
        patch = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise UsageError(f"--resize is not valid JSON: {e}") from None
    if not isinstance(patch, dict):
        raise UsageError('--resize must be a JSON object like {"spec": {"containers": [...]}}')
    return patch


def _pod_key(text: str) -> str:
    namespace, sep, name = text.partition("/")
    if not sep:
        namespace, name = "default", text
    if not namespace or not name or "/" in name:
        raise UsageError(f"--pod must be NAMESPACE/NAME, not {text!r}")
    return f"{namespace}/{name}"


def _policy(args: argparse.Namespace) -> DefaultPolicy:
    return DefaultPolicy(
        pdb_mode=args.pdb_mode,
        max_victims=args.max_victims,
        protected_namespaces=frozenset(args.protected_namespace or ()),
        lending=args.lending,
    )


def _now(args: argparse.Namespace) -> float:
    now = time.time() if args.now is None else parse_time(args.now, "--now")
    assert now is not None
    return now


def _errno_text(message: str) -> str:
    """The last ``[Errno N] text`` of a transport error (urllib3 nests it deep), else the
    message."""
    found = re.findall(r"\[Errno -?\d+\] ([^'\")]+)", message)
    return found[-1].strip() if found else message


def _ask_cluster(args: argparse.Namespace, read: Any) -> Any:
    """``read(api_client)`` against the cluster of ``--kubeconfig``/``--context``, its
    failures turned into :class:`ClusterUnusable` with a one-line message."""
    from webhook.kube.client import make_api_client
    from webhook.kube.errors import ClusterError, Forbidden, Unavailable

    try:
        api = make_api_client(args.kubeconfig, context=args.context, connect_timeout=5.0)
    except ClusterError as e:
        raise ClusterUnusable(str(e), EXIT_UNREACHABLE) from None
    try:
        return read(api)
    except Forbidden as e:
        raise ClusterUnusable(
            f"the cluster refused: {e} (a viewer needs the {VIEWER_ROLE} ClusterRole and "
            f"its Role in namespace {args.namespace}, docs/operations.md)",
            EXIT_FORBIDDEN,
        ) from None
    except Unavailable as e:
        host = api.configuration.host
        raise ClusterUnusable(
            f"cannot reach the API server at {host}: {_errno_text(str(e))}", EXIT_UNREACHABLE
        ) from None
    except ClusterError as e:
        host = api.configuration.host
        raise ClusterUnusable(f"the API server at {host} answered {e}", EXIT_UNREACHABLE) from None
    finally:
        api.close()  # type: ignore[no-untyped-call]


def _live_plan(args: argparse.Namespace, key: str, patch: dict[str, Any]) -> Any:
    from webhook.engine.lifecycle import room_holders
    from webhook.kube.errors import NotFound
    from webhook.kube.status import read_live, read_pod

    namespace, name = key.split("/", 1)

    def read(api: Any) -> Any:
        try:
            pod = read_pod(api, namespace, name)
        except NotFound:
            raise LookupFailed(f"no pod {key} in the cluster") from None
        # An unbound pod: node "" reads the pods bound nowhere (it among them), no node.
        # Movable-first reads every node: the others are the room elsewhere.
        node = (pod.get("spec") or {}).get("nodeName") or ""
        everywhere = args.victim_order == "movable-first"
        return read_live(api, namespace=args.namespace, node=None if everywhere else node)

    live = _ask_cluster(args, read)
    snapshot = load_snapshot(live.objects)
    now = _now(args)
    pod = next((p for p in snapshot.pods if p.key == key), None)
    # As the admission path plans: against every other reservation holding room.
    others = [e for e in live.entries if pod is None or e.pod.uid != pod.uid]
    reservations = [e.reservation() for e in room_holders(others, snapshot.pods, now)]
    return plan_snapshot_resize(
        snapshot,
        key,
        patch,
        now=now,
        policy=_policy(args),
        reservations=reservations,
        victim_order=args.victim_order,
    )


def cmd_plan(args: argparse.Namespace) -> int:
    key, patch = _pod_key(args.pod), _read_patch(args.resize)
    live = args.kubeconfig is not None or (args.live_by_default and args.snapshot is None)
    if (args.snapshot is not None) == live:
        raise UsageError("plan needs one of --snapshot FILE and --kubeconfig FILE")
    if live:
        plan = _live_plan(args, key, patch)
    else:
        snapshot = load_snapshot(_read_documents(args.snapshot))
        plan = plan_snapshot_resize(
            snapshot,
            key,
            patch,
            now=_now(args),
            policy=_policy(args),
            victim_order=args.victim_order,
        )
    return _output(args, plan, plan_to_dict, human_report)


def _output(
    args: argparse.Namespace,
    value: _V,
    as_dict: Callable[[_V], Any],
    as_text: Callable[[_V], str],
) -> int:
    """Write ``value`` to stdout as ``--output`` asks, one JSON line or text; EXIT_OK."""
    text = orjson.dumps(as_dict(value)).decode() if args.output == "json" else as_text(value)
    sys.stdout.write(text + "\n")
    return EXIT_OK


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def cmd_certs(args: argparse.Namespace) -> int:
    from webhook import certs

    made = certs.make_webhook_certs(
        service=args.service,
        namespace=args.namespace,
        dns_names=args.dns or (),
        ip_addresses=args.ip or (),
        days=args.days,
        cluster_domain=args.cluster_domain,
    )
    # Rendered before anything is written, so a bad --secret-name leaves no files behind.
    secret = (
        certs.secret_manifest(made, name=args.secret_name, namespace=args.namespace)
        if args.secret_yaml
        else None
    )
    written = list(certs.write_certs(made, args.out).values())
    if args.kustomize_patch:
        written.append(certs.write_ca_bundle_patch(made, args.out))
    print(f"wrote {', '.join(str(p) for p in written)}", file=sys.stderr)
    if args.patch_webhooks:
        from webhook.kube.webhookconfig import DEFAULT_NAME, patch_webhook_ca_bundles

        outcomes = patch_webhook_ca_bundles(
            made.ca_bundle,
            kubeconfig=args.kubeconfig,
            context=args.context,
            names=args.webhook_config or [DEFAULT_NAME],
        )
        for outcome in outcomes:
            print(outcome.describe(), file=sys.stderr)
    sys.stdout.write(secret if secret is not None else made.ca_bundle + "\n")
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    import logging
    import os

    from webhook.engine.settings import SETTINGS, load_config
    from webhook.web.server import (
        DEFAULT_WORKER_CONNECTIONS,
        ServerOptions,
        connections_within,
        serve,
    )

    logging.basicConfig(level=args.log_level.upper(), format="%(message)s")
    flags = {name: getattr(args, name.replace("-", "_"), None) for name in SETTINGS}
    config = load_config(file=args.config, env=os.environ, flags=flags)

    def factory(tls: Any) -> Any:
        # Imported in the worker, after it made the standard library cooperative: the
        # Kubernetes client keeps the ssl classes it finds at import (webhook.web.worker).
        from webhook.service import build

        return build(config, args.kubeconfig, workers=args.workers, hooks=args.hooks)(tls)

    connections = args.worker_connections
    if connections is None:
        # As many as fit the memory limit, up to the default.
        connections = DEFAULT_WORKER_CONNECTIONS
        if config.memory_limit is not None:
            fit = connections_within(config.memory_limit, args.workers, config.max_body_bytes)
            connections = max(1, min(connections, fit))
    options = ServerOptions(
        cert_file=args.tls_cert,
        key_file=args.tls_key,
        host=args.host,
        port=args.port,
        workers=args.workers,
        worker_connections=connections,
        memory_limit=config.memory_limit,
        metrics_port=args.metrics_port or None,
        metrics_host=args.metrics_host,
        metrics_tls=args.metrics_tls,
        log_level=args.log_level,
        max_body_bytes=config.max_body_bytes,
        client_ca=config.client_ca or None,
        probe_port=args.probe_port or None,
    )
    try:
        options.validate()
    except ValueError as e:
        raise InputError(f"cannot serve: {e}") from None
    serve(factory, options)


def cmd_status(args: argparse.Namespace) -> int:
    from webhook.engine.settings import Config
    from webhook.engine.status import service_status, status_text, status_to_dict
    from webhook.kube.status import read_live

    live = _ask_cluster(args, lambda api: read_live(api, namespace=args.namespace, node=args.node))
    policy = _policy(args)
    config = Config(
        namespace=args.namespace,
        pdb_mode=policy.pdb_mode,
        max_victims=policy.max_victims,
        protected_namespaces=policy.protected_namespaces,
        lending=policy.lending,
        victim_order=args.victim_order,
    )
    status = service_status(
        load_snapshot(live.objects),
        live.entries,
        live.leader,
        config,
        now=_now(args),
        node=args.node,
    )
    return _output(args, status, status_to_dict, status_text)


def cmd_return_loans(args: argparse.Namespace) -> int:
    from webhook.kube.resizer import Returned, return_loans

    returned = _ask_cluster(args, lambda api: return_loans(api, node=args.node))

    def as_dict(items: tuple[Returned, ...]) -> list[dict[str, Any]]:
        return [
            {
                "lender": r.record.loan.pod.key,
                "container": r.record.loan.container,
                "resource": r.record.loan.resource,
                "from": format_amount(r.record.loan.resource, r.record.loan.after),
                "to": format_amount(r.record.loan.resource, r.record.loan.before),
                "borrower": r.record.borrower.key,
                "result": r.result.value,
            }
            for r in items
        ]

    def as_text(items: tuple[Returned, ...]) -> str:
        if not items:
            return "no loans recorded on any lender"
        return "\n".join(
            f"{d['lender']} {d['container']} {d['resource']} {d['from']} -> {d['to']} "
            f"(lent to {d['borrower']}): {d['result']}"
            for d in as_dict(items)
        )

    _output(args, returned, as_dict, as_text)
    return EXIT_OK if all(r.result.value != "failed" for r in returned) else EXIT_FAILED


def cmd_metrics(args: argparse.Namespace) -> int:
    from webhook.engine.metrics import METRICS, markdown_table

    if args.markdown:
        sys.stdout.write(markdown_table())
    else:
        for d in METRICS:
            sys.stdout.write(f"{d.name}\t{d.kind}\t{','.join(d.labels)}\t{d.help}\n")
    return EXIT_OK


def _cluster_arguments(parser: argparse.ArgumentParser, *, kubeconfig_help: str) -> None:
    parser.add_argument("--kubeconfig", metavar="FILE", help=kubeconfig_help)
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context")
    parser.add_argument(
        "--namespace",
        default="resize-preemption-system",
        metavar="NAMESPACE",
        help="the webhook's namespace, where its ledger and leader Leases are "
        "(default: %(default)s)",
    )


def _policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pdb-mode",
        choices=("respect", "best-effort"),
        default="respect",
        help="the service's pdb-mode setting (default: %(default)s)",
    )
    parser.add_argument(
        "--max-victims",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="the service's max-victims setting (default: unlimited)",
    )
    parser.add_argument(
        "--protected-namespace",
        action="append",
        metavar="NAMESPACE",
        help="a namespace whose pods are never victims (repeatable)",
    )
    parser.add_argument(
        "--no-lending",
        dest="lending",
        action="store_false",
        help="plan evictions only: pods with a floor annotation do not lend",
    )
    parser.add_argument(
        "--victim-order",
        choices=get_args(VictimOrder),
        default="upstream",
        help="the service's victim-order setting (default: %(default)s)",
    )
    parser.add_argument("--now", metavar="RFC3339", help="evaluate as of this time")


def _output_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o", "--output", choices=("text", "json"), default="text", help="(default: %(default)s)"
    )


def _plan_parser(sub: Any, live_by_default: bool) -> None:
    plan = sub.add_parser(
        "plan",
        help="plan a resize against a snapshot of cluster objects or the live cluster",
        description=(
            "Plan a resize: which lower-priority pods would have to go. Against a snapshot "
            "(--snapshot) or, read-only, the live cluster and the webhook's ledger "
            + ("(the default)." if live_by_default else "(--kubeconfig).")
        ),
    )
    plan.add_argument(
        "--snapshot",
        metavar="FILE",
        help="Nodes, Pods, PodDisruptionBudgets, PriorityClasses (YAML or JSON; - reads "
        "standard input, e.g. kubectl get nodes,pods,pdb,priorityclasses -A -o yaml)",
    )
    plan.add_argument("--pod", required=True, metavar="NAMESPACE/NAME", help="the resizing pod")
    plan.add_argument(
        "--resize",
        required=True,
        metavar="PATCH",
        help="the JSON given to kubectl patch --subresource resize (or @file)",
    )
    _output_argument(plan)
    kubeconfig_help = "plan against the cluster of this kubeconfig"
    if live_by_default:
        kubeconfig_help += " (default: $KUBECONFIG, ~/.kube/config)"
    _cluster_arguments(plan, kubeconfig_help=kubeconfig_help)
    _policy_arguments(plan)
    plan.set_defaults(func=cmd_plan, live_by_default=live_by_default)


def _status_parser(sub: Any) -> None:
    status = sub.add_parser(
        "status",
        help="what the service is doing now: reservations, loans, Deferred resizes, leader",
        description=(
            "Read-only: the reservations and loans the ledger holds per node, the pods whose "
            "resize the kubelet Deferred and why each waits (planned as the reconciler "
            "would, nothing written), and the leader. Needs a viewer's rights (the "
            f"{VIEWER_ROLE} ClusterRole)."
        ),
    )
    _cluster_arguments(status, kubeconfig_help="default: $KUBECONFIG, ~/.kube/config")
    status.add_argument("--node", metavar="NAME", help="one node only")
    _output_argument(status)
    _policy_arguments(status)
    status.set_defaults(func=cmd_status)


def _return_loans_parser(sub: Any) -> None:
    cmd = sub.add_parser(
        "return-loans",
        help="give every loan back to its lender, before uninstalling",
        description=(
            "Every loan recorded on a lender (annotation resize-preemption.io/loans) is given "
            "back: the lender's spec back to its size before, then the record removed. Run it "
            "after the service is uninstalled, with rights to patch pods and pods/resize; "
            "docs/lending.md."
        ),
    )
    _cluster_arguments(cmd, kubeconfig_help="default: $KUBECONFIG, ~/.kube/config")
    cmd.add_argument("--node", metavar="NAME", help="one node only")
    _output_argument(cmd)
    cmd.set_defaults(func=cmd_return_loans)


def _serve_parser(sub: Any) -> None:
    from webhook.engine.settings import SETTINGS, env_name

    srv = sub.add_parser(
        "serve",
        help="run the admission webhook (HTTPS) and, when leading, the preemption worker",
        description="Run the webhook. Settings: flags > RPW_* environment > --config file; "
        "docs/service.md explains each.",
    )
    server = srv.add_argument_group("server (not settings)")
    server.add_argument("--tls-cert", required=True, metavar="FILE", help="serving certificate")
    server.add_argument("--tls-key", required=True, metavar="FILE", help="its private key")
    server.add_argument("--host", default="0.0.0.0", help="address (default: %(default)s)")
    server.add_argument("--port", type=int, default=8443, help="HTTPS (default: %(default)s)")
    server.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        default=9090,
        help="plain HTTP /metrics; 0 disables it (default: %(default)s)",
    )
    server.add_argument(
        "--metrics-host",
        default="0.0.0.0",
        metavar="ADDRESS",
        help="address of the metrics port, e.g. the pod's IP (default: %(default)s)",
    )
    server.add_argument(
        "--metrics-tls",
        action="store_true",
        help="serve /metrics over HTTPS with the serving certificate",
    )
    server.add_argument(
        "--probe-port",
        type=_non_negative_int,
        metavar="PORT",
        default=0,
        help="HTTPS /livez and /readyz only, no client certificate asked (the kubelet's "
        "probes, with client-ca); 0: none (default: %(default)s)",
    )
    server.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        default=1,
        help="worker processes, each with its own cluster cache; 2 for a 2-core replica "
        "(default: %(default)s)",
    )
    server.add_argument(
        "--worker-connections",
        type=_positive_int,
        metavar="N",
        default=None,
        help="connections each worker holds at once (default: 1000, or as many as fit "
        "memory-limit)",
    )
    server.add_argument(
        "--kubeconfig", metavar="FILE", help="default: in-cluster, else $KUBECONFIG"
    )
    server.add_argument("--config", metavar="FILE", help="YAML file of settings")
    server.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="(default: %(default)s)",
    )
    settings = srv.add_argument_group("settings (also RPW_* variables and --config keys)")
    for name, setting in SETTINGS.items():
        settings.add_argument(
            f"--{name}",
            dest=name.replace("-", "_"),
            default=None,
            metavar="{" + ",".join(setting.choices) + "}" if setting.choices else setting.metavar,
            help=f"{setting.help} (default: {setting.default}; {env_name(name)})".replace(
                "%", "%%"
            ),
        )
    srv.set_defaults(func=cmd_serve)


def _certs_parser(sub: Any) -> None:
    certs = sub.add_parser(
        "certs",
        help="make a CA and the webhook's serving certificate (without cert-manager)",
        description=(
            "Make a private CA and a serving certificate for the webhook's Service, write "
            "ca.crt, tls.crt and tls.key (0600) into --out and print the base64 caBundle "
            "(or, with --secret-yaml, a kubernetes.io/tls Secret manifest)."
        ),
    )
    add = certs.add_argument
    add(
        "--out",
        default="certs",
        metavar="DIR",
        help="directory for the files (default: certs, the repository's git-ignored folder)",
    )
    add(
        "--service",
        default="resize-preemption-webhook",
        metavar="NAME",
        help="(default: %(default)s)",
    )
    add(
        "--namespace",
        default="resize-preemption-system",
        metavar="NAMESPACE",
        help="(default: %(default)s)",
    )
    add(
        "--cluster-domain", default="cluster.local", metavar="DOMAIN", help="(default: %(default)s)"
    )
    add("--dns", action="append", metavar="NAME", help="extra DNS subjectAltName (repeatable)")
    add("--ip", action="append", metavar="ADDRESS", help="IP subjectAltName (repeatable)")
    add(
        "--days", type=int, default=365, help="validity of both certificates (default: %(default)s)"
    )
    add(
        "--secret-yaml",
        action="store_true",
        help="print a kubernetes.io/tls Secret manifest instead of the caBundle",
    )
    add(
        "--secret-name",
        default="resize-preemption-webhook-tls",
        metavar="NAME",
        help="(default: %(default)s)",
    )
    add(
        "--kustomize-patch",
        action="store_true",
        help="also write ca-bundle.yaml, the caBundle patch deploy/overlays/self-signed reads",
    )
    add(
        "--patch-webhooks",
        action="store_true",
        help="set the caBundle on the live webhook configurations",
    )
    add(
        "--webhook-config",
        action="append",
        metavar="NAME",
        help="webhook configuration(s) to patch (default: resize-preemption-webhook)",
    )
    add("--kubeconfig", metavar="FILE", help="default: $KUBECONFIG, in-cluster")
    add("--context", metavar="NAME", help="kubeconfig context")
    certs.set_defaults(func=cmd_certs)


def _metrics_parser(sub: Any) -> None:
    metrics = sub.add_parser(
        "metrics",
        help="list the metrics the service exports",
        description="List every metric the service exports: name, type, labels, meaning.",
    )
    metrics.add_argument(
        "--markdown", action="store_true", help="as the table in docs/operations.md"
    )
    metrics.set_defaults(func=cmd_metrics)


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command line; as the kubectl plugin (``prog`` ``kubectl resize-preemption``),
    ``plan`` asks the live cluster unless given a snapshot, as kubectl's own commands do."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Make room for in-place pod resizes by preempting lower-priority pods.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _plan_parser(sub, live_by_default=prog == KUBECTL_PLUGIN)
    _status_parser(sub)
    _return_loans_parser(sub)
    _serve_parser(sub)
    _certs_parser(sub)
    _metrics_parser(sub)
    return parser


def kubectl_plugin(argv: Sequence[str] | None = None) -> int:
    """``kubectl resize-preemption COMMAND ...``: kubectl runs the console script
    ``kubectl-resize_preemption`` it finds on PATH with the arguments after the plugin's
    name (and none of kubectl's own flags)."""
    return main(argv, prog=KUBECTL_PLUGIN)


def main(argv: Sequence[str] | None = None, *, hooks: Hooks | None = None, prog: str = PROG) -> int:
    """Run one subcommand. ``hooks`` wrap parts of what ``serve`` builds (a test harness
    passes them; see :class:`webhook.engine.hooks.Hooks`)."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    args.hooks = hooks
    try:
        code: int = args.func(args)
    except (InputError, LookupFailed) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ClusterUnusable as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    except WebhookError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
