"""Command line: ``python -m webhook plan|status|serve|certs|metrics|node-agent ...``, also
installed as the console script ``resize-preemption-webhook`` and as the kubectl plugin
``kubectl resize-preemption`` (:func:`kubectl_plugin`).

Every subcommand turns expected failures into one line on stderr and an exit code: 2 for
bad input or unreadable files (argparse's own mistakes included; a kubeconfig named that
does not read; ``serve`` finding no client configuration at all), 3 when the cluster
cannot be reached (or the commands that ask it find no client configuration), 4 when the
cluster refuses the request (RBAC); a traceback means a bug.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import orjson
import yaml

from webhook import __version__
from webhook.core.errors import InputError, LookupFailed, WebhookError
from webhook.core.objects import parse_time
from webhook.core.report import human_report, plan_to_dict
from webhook.core.resources import format_amount
from webhook.core.snapshot import load_snapshot, plan_snapshot_resize

if TYPE_CHECKING:
    from webhook.base.settings import Config
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
CONSOLE_SCRIPT = "resize-preemption-webhook"

_V = TypeVar("_V")


class UsageError(InputError):
    """A command-line argument that cannot be used."""


class _Parser(argparse.ArgumentParser):
    """argparse, whose mistakes are one line, like every other bad input: the usage it
    prints above them is what ``--help`` shows."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"error: {message} (see {self.prog} --help)\n")


def _rule_type(rule: Callable[[str], _V]) -> Callable[[str], _V]:
    """A :class:`~webhook.base.settings.Rule` as an argparse type: its message, and
    the value, instead of argparse's "invalid <function name> value"."""

    def parse(text: str) -> _V:
        try:
            return rule(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{text!r} {e}") from None

    return parse


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
    given = "--resize"
    if text.startswith("@"):
        given = f"--resize file {text[1:]}"
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as e:
            raise UsageError(f"cannot read resize patch {text[1:]}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise UsageError(f"{given} is not UTF-8 text") from None
    try:
        patch = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise UsageError(
            f"{given} is not JSON (line {e.lineno} column {e.colno}): give the patch of "
            f"kubectl patch --subresource resize, {_PATCH_EXAMPLE}, or @FILE"
        ) from None
    if not isinstance(patch, dict):
        raise UsageError(f"{given} must be a JSON object like {_PATCH_EXAMPLE}")
    return patch


_PATCH_EXAMPLE = '{"spec": {"containers": [{"name": "app", "resources": {...}}]}}'


def _pod_key(text: str, namespace: str | None) -> str:
    """``--pod NAME`` in ``-n/--namespace`` (default ``default``), or ``--pod NS/NAME``."""
    given, sep, name = text.partition("/")
    if not sep:
        given, name = namespace or "default", text
    if not given or not name or "/" in name:
        raise UsageError(f"--pod must be NAME or NAMESPACE/NAME, not {text!r}")
    if namespace is not None and given != namespace:
        raise UsageError(f"--pod {text} is not in --namespace {namespace}")
    return f"{given}/{name}"


#: The settings ``plan`` and ``status`` take, to plan as a service set so would.
PLAN_SETTINGS = (
    "pdb-mode",
    "max-victims",
    "protected-namespaces",
    "unprotected-namespaces",
    "preemptor-namespace-selector",
    "min-preemptor-priority",
    "lending",
    "lend-memory-limits",
    "victim-order",
    "checkpoints",
    "service-namespace",
)


def _settings(args: argparse.Namespace, names: Sequence[str] = PLAN_SETTINGS) -> Config:
    """The service's settings as ``serve`` reads them, through the one settings table:
    flags over ``RPW_*`` variables over the ``--config`` file."""
    import os

    from webhook.base.settings import load_config

    flags = {name: getattr(args, _dest(name)) for name in names}
    return load_config(file=args.config, env=os.environ, flags=flags)


def _dest(setting: str) -> str:
    return setting.replace("-", "_")


def _now(args: argparse.Namespace) -> float:
    now = time.time() if args.now is None else parse_time(args.now, "--now")
    assert now is not None
    return now


def _errno_text(message: str) -> str:
    """The last ``[Errno N] text`` of a transport error (urllib3 nests it deep), else the
    message."""
    found = re.findall(r"\[Errno -?\d+\] ([^'\")]+)", message)
    return found[-1].strip() if found else message


def _ask_cluster(args: argparse.Namespace, config: Config, read: Any) -> Any:
    """``read(api_client)`` against the cluster of ``--kubeconfig``/``--context``, its
    failures turned into :class:`ClusterUnusable` with a one-line message."""
    from webhook.kube.client import make_api_client
    from webhook.kube.errors import ClusterError, Forbidden, Unavailable
    from webhook.kube.kubeconfig import NoClientConfiguration, client_source

    try:
        # A kubeconfig named but unreadable is bad input (exit 2); none found, exit 3.
        client_source(args.kubeconfig, context=args.context)
    except NoClientConfiguration as e:
        raise ClusterUnusable(str(e), EXIT_UNREACHABLE) from None
    try:
        api = make_api_client(args.kubeconfig, context=args.context, connect_timeout=5.0)
    except ClusterError as e:
        raise ClusterUnusable(str(e), EXIT_UNREACHABLE) from None
    try:
        return read(api)
    except Forbidden as e:
        raise ClusterUnusable(
            f"the cluster refused: {e} (a viewer needs the {VIEWER_ROLE} ClusterRole and "
            f"its Role in namespace {config.namespace}, docs/operations.md)",
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


def _live_plan(args: argparse.Namespace, config: Config, key: str, patch: dict[str, Any]) -> Any:
    from webhook.engine.lifecycle.states import room_holders
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
        everywhere = config.victim_order == "movable-first"
        return read_live(api, namespace=config.namespace, node=None if everywhere else node)

    live = _ask_cluster(args, config, read)
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
        policy=config.policy(),
        reservations=reservations,
        victim_order=config.victim_order,
        pause=_pause(config, live.abilities),
    )


def _pause(config: Config, abilities: Mapping[str, Any]) -> Any:
    """Which victims the service would checkpoint, from what the node agents published."""
    from webhook.core.checkpoint import pause_of

    def judge(pod: Any) -> Any:
        return pause_of(pod, abilities.get(pod.node), enabled=config.checkpoints)

    return judge


def cmd_plan(args: argparse.Namespace) -> int:
    key, patch = _pod_key(args.pod, args.namespace), _read_patch(args.resize)
    config = _settings(args)
    live = args.snapshot is None
    if not live and args.kubeconfig is not None:
        raise UsageError("plan takes one of --snapshot FILE and --kubeconfig FILE")
    if live:
        plan = _live_plan(args, config, key, patch)
    else:
        snapshot = load_snapshot(_read_documents(args.snapshot))
        plan = plan_snapshot_resize(
            snapshot,
            key,
            patch,
            now=_now(args),
            policy=config.policy(),
            victim_order=config.victim_order,
            pause=_pause(config, {}),
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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number of at least 1")
    return value


def cmd_certs(args: argparse.Namespace) -> int:
    from webhook.tls import certs

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

    from webhook.base.settings import SETTINGS, check_ports, load_config
    from webhook.kube.kubeconfig import client_source
    from webhook.tls.serving import TLSConfigError
    from webhook.web.server import (
        DEFAULT_WORKER_CONNECTIONS,
        ServerOptions,
        check_address,
        connections_within,
        serve,
    )

    # Everything is checked before a port is bound or a process forked: each mistake is
    # one line and exit 2, not a worker's traceback in a crash loop.
    logging.basicConfig(level=args.log_level.upper(), format="%(message)s")
    flags = {name: getattr(args, _dest(name), None) for name in SETTINGS}
    config = load_config(file=args.config, env=os.environ, flags=flags)
    check_ports(args.port, args.metrics_port, args.probe_port)
    client_source(args.kubeconfig)
    try:
        check_address(args.host)
    except ValueError as e:
        raise UsageError(str(e)) from None

    def factory(tls: Any) -> Any:
        # Imported in the worker, after it made the standard library cooperative: the
        # Kubernetes client keeps the ssl classes it finds at import (webhook.web.worker).
        from webhook.service import build

        return build(
            config, args.kubeconfig, workers=args.workers, hooks=args.hooks, managed_tls=managed
        )(tls)

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
        client_cn=config.client_cn,
        probe_port=args.probe_port or None,
    )
    try:
        options.validate()
    except ValueError as e:
        raise UsageError(f"cannot serve: {e}") from None
    managed = _managed_tls(args, config.namespace, config.client_ca, config.client_cn)
    if managed is not None:
        _bootstrap_certificates(managed, args.kubeconfig)
    try:
        serve(factory, options)
    except TLSConfigError as e:
        raise UsageError(str(e)) from None


def _duration(text: str) -> Any:
    from webhook.tls.rotation import parse_duration

    try:
        return parse_duration(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _managed_tls(
    args: argparse.Namespace, namespace: str, client_ca: str = "", client_cn: str = ""
) -> Any:
    """``--tls-secret``'s options (a :class:`webhook.tls.rotation.ManagedTLS`), or None."""
    from webhook.tls import rotation

    if not args.tls_secret:
        if args.tls_client_secret:
            raise UsageError("--tls-client-secret needs --tls-secret")
        return None
    policy = rotation.RotationPolicy(
        dns_names=tuple(args.tls_dns or ()),
        validity=args.tls_validity or rotation.DEFAULT_VALIDITY,
        renew_before=args.tls_renew_before or rotation.DEFAULT_RENEW_BEFORE,
        ca_validity=args.tls_ca_validity or rotation.DEFAULT_CA_VALIDITY,
    )
    problem = policy.problem()
    if problem:
        raise UsageError(f"--tls-secret: {problem} (--tls-dns, --tls-validity, ...)")
    return rotation.ManagedTLS(
        secret=args.tls_secret,
        namespace=namespace,
        webhook_configs=tuple(args.tls_webhook_config or ("resize-preemption-webhook",)),
        policy=policy,
        cert_file=args.tls_cert,
        key_file=args.tls_key,
        client=_managed_client(args, policy, client_ca, client_cn),
    )


def _managed_client(args: argparse.Namespace, serving: Any, client_ca: str, client_cn: str) -> Any:
    """``--tls-client-secret``'s options (a :class:`webhook.tls.rotation.ManagedClient`), or
    None."""
    from webhook.tls import rotation

    if not args.tls_client_secret:
        return None
    if not client_ca:
        raise UsageError("--tls-client-secret needs client-ca: the file its CA is written to")
    policy = rotation.client_policy(
        validity=args.tls_client_validity or rotation.DEFAULT_CLIENT_VALIDITY,
        renew_before=args.tls_client_renew_before or rotation.DEFAULT_RENEW_BEFORE,
        ca_validity=serving.ca_validity,
        name=client_cn or rotation.CLIENT_NAME,
    )
    problem = policy.problem()
    if problem:
        raise UsageError(
            f"--tls-client-secret: {problem} (--tls-client-validity, "
            "--tls-client-renew-before, --tls-ca-validity)"
        )
    return rotation.ManagedClient(args.tls_client_secret, client_ca, policy)


def _bootstrap_certificates(managed: Any, kubeconfig: str | None) -> None:
    """The Secret made current and its pair written, in a process of its own: this one
    must not import the Kubernetes client before its workers are forked and patched."""
    import json
    import subprocess

    payload = json.dumps({"tls": managed.to_json(), "kubeconfig": kubeconfig})
    done = subprocess.run(
        [sys.executable, "-m", "webhook.kube.certs"], input=payload, text=True, check=False
    )
    if done.returncode != 0:
        raise WebhookError(f"no serving certificate from Secret {managed.secret}: see above")


def cmd_status(args: argparse.Namespace) -> int:
    from webhook.engine.status import service_status, status_text, status_to_dict
    from webhook.kube.status import read_live

    config = _settings(args)
    live = _ask_cluster(
        args, config, lambda api: read_live(api, namespace=config.namespace, node=args.node)
    )
    status = service_status(
        load_snapshot(live.objects),
        live.entries,
        live.leader,
        config,
        now=_now(args),
        node=args.node,
        checkpoints=live.checkpoints,
    )
    return _output(args, status, status_to_dict, status_text)


def cmd_return_loans(args: argparse.Namespace) -> int:
    from webhook.kube.resizer import Returned, return_loans

    config = _settings(args, ["service-namespace"])
    returned = _ask_cluster(args, config, lambda api: return_loans(api, node=args.node))

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
    from webhook.base.metrics import METRICS, markdown_table

    if args.markdown:
        sys.stdout.write(markdown_table())
    else:
        for d in METRICS:
            sys.stdout.write(f"{d.name}\t{d.kind}\t{','.join(d.labels)}\t{d.help}\n")
    return EXIT_OK


def _setting_arguments(parser: Any, names: Sequence[str]) -> None:
    """``--NAME`` for each setting of ``names``, spelled, explained and read as ``serve``
    takes it (the value is checked by the setting's rule once parsed)."""
    from webhook.base.settings import SETTINGS, env_name

    for name in names:
        setting = SETTINGS[name]
        parser.add_argument(
            f"--{name}",
            dest=_dest(name),
            default=None,
            metavar="{" + ",".join(setting.choices) + "}" if setting.choices else setting.metavar,
            help=f"{setting.help} (default: {setting.default}; {env_name(name)})".replace(
                "%", "%%"
            ),
        )


def _cluster_arguments(parser: argparse.ArgumentParser, *, kubeconfig_help: str) -> None:
    parser.add_argument("--kubeconfig", metavar="FILE", help=kubeconfig_help)
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context")


def _config_argument(parser: Any) -> None:
    parser.add_argument("--config", metavar="FILE", help="YAML file of settings, as serve reads it")


def _policy_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "the service's settings, to plan as it would (spelled as serve takes them; "
        "flags > RPW_* environment > --config file)"
    )
    _setting_arguments(group, PLAN_SETTINGS)
    _config_argument(group)
    parser.add_argument("--now", metavar="RFC3339", help="evaluate as of this time")


def _output_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=("text", "json"),
        default="text",
        help="output format: text for people, json (one line) for programs (default: %(default)s)",
    )


def _plan_parser(sub: Any) -> None:
    plan = sub.add_parser(
        "plan",
        help="plan a resize against a snapshot of cluster objects or the live cluster",
        description=(
            "Plan a resize: which lower-priority pods would have to go. Against a snapshot "
            "(--snapshot) or, read-only, the live cluster and the webhook's ledger (the "
            "default, as kubectl asks the cluster of $KUBECONFIG, else ~/.kube/config)."
        ),
    )
    plan.add_argument(
        "--snapshot",
        metavar="FILE",
        help="Nodes, Pods, PodDisruptionBudgets, PriorityClasses (YAML or JSON; - reads "
        "standard input, e.g. kubectl get nodes,pods,pdb,priorityclasses -A -o yaml)",
    )
    plan.add_argument("--pod", required=True, metavar="[NAMESPACE/]NAME", help="the resizing pod")
    plan.add_argument(
        "-n",
        "--namespace",
        metavar="NAMESPACE",
        help="the pod's namespace, as kubectl's -n (default: default, or the one in --pod)",
    )
    plan.add_argument(
        "--resize",
        required=True,
        metavar="PATCH",
        help="the JSON given to kubectl patch --subresource resize (or @file)",
    )
    _output_argument(plan)
    _cluster_arguments(plan, kubeconfig_help="default: $KUBECONFIG, ~/.kube/config")
    _policy_arguments(plan)
    plan.set_defaults(func=cmd_plan)


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
        help="give every loan back to its lender, after uninstalling",
        description=(
            "Every loan recorded on a lender (annotation resize-preemption.io/loans) is given "
            "back: the lender's spec back to its size before, then the record removed. Run it "
            "after the service is uninstalled, with rights to patch pods and pods/resize; "
            "docs/lending.md."
        ),
    )
    _cluster_arguments(cmd, kubeconfig_help="default: $KUBECONFIG, ~/.kube/config")
    _setting_arguments(cmd, ["service-namespace"])
    _config_argument(cmd)
    cmd.add_argument("--node", metavar="NAME", help="one node only")
    _output_argument(cmd)
    cmd.set_defaults(func=cmd_return_loans)


def _serve_parser(sub: Any) -> None:
    from webhook.base.settings import METRICS_PORT, PORT, SETTINGS

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
    server.add_argument(
        "--port",
        type=_rule_type(PORT),
        metavar="PORT",
        default=8443,
        help="HTTPS, 1-65535 (default: %(default)s)",
    )
    server.add_argument(
        "--metrics-port",
        type=_rule_type(METRICS_PORT),
        metavar="PORT",
        default=9090,
        help="plain HTTP /metrics, 1-65535 and not --port; 0 disables it (default: %(default)s)",
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
        type=_rule_type(METRICS_PORT),
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
    _managed_tls_arguments(srv)
    server.add_argument(
        "--log-level",
        default="info",
        choices=("debug", "info", "warning", "error"),
        help="(default: %(default)s)",
    )
    settings = srv.add_argument_group("settings (also RPW_* variables and --config keys)")
    _setting_arguments(settings, list(SETTINGS))
    srv.set_defaults(func=cmd_serve)


def _managed_tls_arguments(srv: Any) -> None:
    group = srv.add_argument_group(
        "the service's own certificates (chart certificates.mode service; docs/deploy.md)"
    )
    group.add_argument(
        "--tls-secret",
        metavar="NAME",
        help="keep a CA and the serving certificate in this Secret of the service's "
        "namespace, renew them before they expire, set the webhook configurations' "
        "caBundle, and write the current pair to --tls-cert and --tls-key",
    )
    group.add_argument(
        "--tls-dns",
        action="append",
        metavar="NAME",
        help="a DNS name of the serving certificate (repeat; the Service's names)",
    )
    group.add_argument(
        "--tls-webhook-config",
        action="append",
        metavar="NAME",
        help="a webhook configuration whose caBundle to set (repeat; "
        "default: resize-preemption-webhook)",
    )
    group.add_argument(
        "--tls-client-secret",
        metavar="NAME",
        help="with client-ca: also keep a CA and kube-apiserver's client certificate in "
        "this Secret, renew the certificate before it expires, and write the CA to the "
        "client-ca file (copy tls.crt and tls.key to the control plane)",
    )
    for flag, default, what in (
        ("--tls-validity", "2160h", "lifetime of a serving certificate"),
        ("--tls-renew-before", "720h", "renew a serving certificate this long before it expires"),
        ("--tls-ca-validity", "87600h", "lifetime of the CAs"),
        ("--tls-client-validity", "8760h", "lifetime of kube-apiserver's client certificate"),
        ("--tls-client-renew-before", "720h", "renew it this long before it expires"),
    ):
        group.add_argument(
            flag,
            type=_duration,
            default=None,
            metavar="DURATION",
            help=f"{what}, such as 2160h or 45m (default: {default})",
        )


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
        "--service-namespace",
        "--namespace",
        dest="namespace",
        default="resize-preemption-system",
        metavar="NAMESPACE",
        help="the Service's namespace, as serve's service-namespace setting; --namespace is "
        "the deprecated spelling (default: %(default)s)",
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


def cmd_node_agent(args: argparse.Namespace) -> int:
    import logging
    import os

    from webhook.agent.command import build_agent, run_agent
    from webhook.agent.settings import AGENT_SETTINGS, load_agent_settings
    from webhook.kube.checkpoints import PodCheckpoints
    from webhook.kube.client import make_api_client
    from webhook.kube.kubeconfig import client_source

    logging.basicConfig(level=args.log_level.upper(), format="%(message)s")
    flags = {name: getattr(args, _dest(name), None) for name in AGENT_SETTINGS}
    settings = load_agent_settings(env=os.environ, flags=flags)
    client_source(args.kubeconfig)
    api = make_api_client(args.kubeconfig, context=args.context)
    store = PodCheckpoints(api, settings.namespace)
    return run_agent(build_agent(settings, store), settings.poll_interval, once=args.once)


def _node_agent_parser(sub: Any) -> None:
    from webhook.agent.settings import AGENT_SETTINGS, AgentSettings
    from webhook.base.settings import env_name

    agent = sub.add_parser(
        "node-agent",
        help="the node side of checkpoint and restore (one per node, as root)",
        description="Publish this node's checkpoint capability, turn the kubelet's "
        "checkpoint archives into images in containerd, and clean them up (docs/checkpoint.md).",
    )
    defaults = AgentSettings()
    for name, setting in AGENT_SETTINGS.items():
        default = getattr(defaults, setting.field)
        agent.add_argument(
            f"--{name}",
            dest=_dest(name),
            default=None,
            metavar=setting.metavar,
            help=f"{setting.help} (default: {default or 'none'}; {env_name(name)})",
        )
    _cluster_arguments(
        agent, kubeconfig_help="kubeconfig (default: in-cluster, then ~/.kube/config)"
    )
    agent.add_argument("--once", action="store_true", help="one pass, then exit")
    agent.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    agent.set_defaults(func=cmd_node_agent)


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command line, named ``prog`` in its usage and ``--version``."""
    parser = _Parser(
        prog=prog,
        description="Make room for in-place pod resizes by preempting lower-priority pods.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _plan_parser(sub)
    _status_parser(sub)
    _return_loans_parser(sub)
    _serve_parser(sub)
    _certs_parser(sub)
    _metrics_parser(sub)
    _node_agent_parser(sub)
    return parser


def console_script(argv: Sequence[str] | None = None) -> int:
    """The console script ``resize-preemption-webhook``: ``main`` under its own name."""
    return main(argv, prog=CONSOLE_SCRIPT)


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
