"""Command line: ``python -m webhook plan|status|serve|certs|metrics ...``.

Every subcommand turns expected failures (bad input, unreachable files) into one line on
stderr and exit code 2; a traceback means a bug.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import yaml

from webhook.core.errors import InputError, LookupFailed, WebhookError
from webhook.core.objects import parse_time
from webhook.core.policy import DefaultPolicy
from webhook.core.report import human_report, plan_to_dict
from webhook.core.snapshot import load_snapshot, plan_snapshot_resize

if TYPE_CHECKING:
    from webhook.engine.hooks import Hooks

EXIT_OK = 0
EXIT_BAD_INPUT = 2


class UsageError(InputError):
    """A command-line argument that cannot be used."""


def _read_documents(path: str) -> list[object]:
    try:
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


def cmd_plan(args: argparse.Namespace) -> int:
    snapshot = load_snapshot(_read_documents(args.snapshot))
    now = time.time() if args.now is None else parse_time(args.now, "--now")
    assert now is not None
    policy = DefaultPolicy(
        pdb_mode=args.pdb_mode,
        max_victims=args.max_victims,
        protected_namespaces=frozenset(args.protected_namespace or ()),
        lending=args.lending,
    )
    plan = plan_snapshot_resize(
        snapshot, _pod_key(args.pod), _read_patch(args.resize), now=now, policy=policy
    )
    if args.output == "json":
        sys.stdout.write(orjson.dumps(plan_to_dict(plan)).decode() + "\n")
    else:
        sys.stdout.write(human_report(plan) + "\n")
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
    from webhook.web.server import serve

    logging.basicConfig(level=args.log_level.upper(), format="%(message)s")
    flags = {name: getattr(args, name.replace("-", "_"), None) for name in SETTINGS}
    config = load_config(file=args.config, env=os.environ, flags=flags)

    def factory(tls: Any) -> Any:
        # Imported in the worker, after it made the standard library cooperative: the
        # Kubernetes client keeps the ssl classes it finds at import (webhook.web.worker).
        from webhook.service import build

        return build(config, args.kubeconfig, workers=args.workers, hooks=args.hooks)(tls)

    serve(
        factory,
        cert_file=args.tls_cert,
        key_file=args.tls_key,
        host=args.host,
        port=args.port,
        workers=args.workers,
        metrics_port=args.metrics_port or None,
        log_level=args.log_level,
        max_body_bytes=config.max_body_bytes,
    )


def cmd_metrics(args: argparse.Namespace) -> int:
    from webhook.engine.metrics import METRICS, markdown_table

    if args.markdown:
        sys.stdout.write(markdown_table())
    else:
        for d in METRICS:
            sys.stdout.write(f"{d.name}\t{d.kind}\t{','.join(d.labels)}\t{d.help}\n")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m webhook",
        description="Make room for in-place pod resizes by preempting lower-priority pods.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    plan = sub.add_parser(
        "plan",
        help="plan a resize against a snapshot of cluster objects",
        description="Plan a resize offline: which lower-priority pods would have to go.",
    )
    plan.add_argument(
        "--snapshot",
        required=True,
        metavar="FILE",
        help="Nodes, Pods, PodDisruptionBudgets, PriorityClasses (YAML or JSON)",
    )
    plan.add_argument("--pod", required=True, metavar="NAMESPACE/NAME")
    plan.add_argument(
        "--resize",
        required=True,
        metavar="PATCH",
        help="the JSON given to kubectl patch --subresource resize (or @file)",
    )
    plan.add_argument("-o", "--output", choices=("text", "json"), default="text")
    plan.add_argument("--pdb-mode", choices=("respect", "best-effort"), default="respect")
    plan.add_argument("--max-victims", type=_non_negative_int, default=None)
    plan.add_argument("--protected-namespace", action="append", metavar="NAMESPACE")
    plan.add_argument(
        "--no-lending",
        dest="lending",
        action="store_false",
        help="plan evictions only: pods with a floor annotation do not lend",
    )
    plan.add_argument("--now", metavar="RFC3339", help="evaluate as of this time")
    plan.set_defaults(func=cmd_plan)

    srv = sub.add_parser(
        "serve",
        help="run the admission webhook (HTTPS) and, when leading, the preemption worker",
        description="Run the webhook. Settings: flags > RPW_* environment > --config file.",
    )
    srv.add_argument("--tls-cert", required=True, metavar="FILE")
    srv.add_argument("--tls-key", required=True, metavar="FILE")
    srv.add_argument("--host", default="0.0.0.0")
    srv.add_argument("--port", type=int, default=8443)
    srv.add_argument("--metrics-port", type=int, default=9090, help="0 disables /metrics")
    srv.add_argument(
        "--workers",
        type=_positive_int,
        default=1,
        help="worker processes (default 1; 2 for a 2-core replica: each keeps its own "
        "cluster cache, see webhook/web/server.py)",
    )
    srv.add_argument("--kubeconfig", help="default: in-cluster, else $KUBECONFIG")
    srv.add_argument("--config", metavar="FILE", help="YAML file of settings")
    srv.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    from webhook.engine.settings import SETTINGS

    for name in SETTINGS:
        srv.add_argument(f"--{name}", dest=name.replace("-", "_"), default=None)
    srv.set_defaults(func=cmd_serve)

    certs = sub.add_parser(
        "certs",
        help="make a CA and the webhook's serving certificate (without cert-manager)",
        description=(
            "Make a private CA and a serving certificate for the webhook's Service, write "
            "ca.crt, tls.crt and tls.key (0600) into --out and print the base64 caBundle "
            "(or, with --secret-yaml, a kubernetes.io/tls Secret manifest)."
        ),
    )
    certs.add_argument(
        "--out",
        default="certs",
        metavar="DIR",
        help="directory for the files (default certs, the repository's git-ignored folder)",
    )
    certs.add_argument("--service", default="resize-preemption-webhook", metavar="NAME")
    certs.add_argument("--namespace", default="resize-preemption-system", metavar="NAMESPACE")
    certs.add_argument("--cluster-domain", default="cluster.local", metavar="DOMAIN")
    certs.add_argument(
        "--dns", action="append", metavar="NAME", help="extra DNS subjectAltName (repeatable)"
    )
    certs.add_argument(
        "--ip", action="append", metavar="ADDRESS", help="IP subjectAltName (repeatable)"
    )
    certs.add_argument("--days", type=int, default=365, help="validity of both certificates")
    certs.add_argument(
        "--secret-yaml",
        action="store_true",
        help="print a kubernetes.io/tls Secret manifest instead of the caBundle",
    )
    certs.add_argument("--secret-name", default="resize-preemption-webhook-tls", metavar="NAME")
    certs.add_argument(
        "--kustomize-patch",
        action="store_true",
        help="also write ca-bundle.yaml, the caBundle patch deploy/overlays/self-signed reads",
    )
    certs.add_argument(
        "--patch-webhooks",
        action="store_true",
        help="set the caBundle on the live webhook configurations",
    )
    certs.add_argument(
        "--webhook-config",
        action="append",
        metavar="NAME",
        help="webhook configuration(s) to patch (default resize-preemption-webhook)",
    )
    certs.add_argument("--kubeconfig", metavar="FILE", help="default $KUBECONFIG, in-cluster")
    certs.add_argument("--context", metavar="NAME", help="kubeconfig context")
    certs.set_defaults(func=cmd_certs)

    metrics = sub.add_parser(
        "metrics",
        help="list the metrics the service exports",
        description="List every metric the service exports: name, type, labels, meaning.",
    )
    metrics.add_argument(
        "--markdown", action="store_true", help="as the table in docs/operations.md"
    )
    metrics.set_defaults(func=cmd_metrics)
    return parser


def main(argv: Sequence[str] | None = None, *, hooks: Hooks | None = None) -> int:
    """Run one subcommand. ``hooks`` wrap parts of what ``serve`` builds (a test harness
    passes them; see :class:`webhook.engine.hooks.Hooks`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.hooks = hooks
    try:
        code: int = args.func(args)
    except (InputError, LookupFailed) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except WebhookError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code
