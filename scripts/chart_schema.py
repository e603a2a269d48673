"""The chart's values schema, where it speaks of the service's settings, from the settings
table (webhook/base/settings.py): one rule per setting, the same for the service and
for Helm.

    python scripts/chart_schema.py           # rewrite those parts of values.schema.json
    python scripts/chart_schema.py --check   # exit 1, naming the parts, if they drifted

Generated: ``properties.settings`` (every setting but those the pod itself gives),
``properties.server.properties.port`` and ``.metricsPort``, the certificate lifetimes the
Deployment passes to ``serve --tls-*`` (``certificates.duration``, ``.renewBefore``,
``.caDuration``, ``clientAuth.duration``, ``.renewBefore``), ``clientAuth.commonName`` (the
``client-cn`` setting), and the node agent's settings
under ``properties.checkpoint`` (webhook/agent/settings.py); everything else in the file is
written by hand. tests/unit/test_chart_schema.py fails when the file and the table differ.
Two rules JSON Schema (draft-07) cannot say are the chart template's ``fail``: the
metrics port differs from the port (templates/deployment.yaml).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from webhook.agent.settings import AGENT_SETTINGS  # noqa: E402
from webhook.base.settings import DURATION, METRICS_PORT, PORT, SETTINGS  # noqa: E402

SCHEMA = ROOT / "deploy" / "helm" / "resize-preemption-webhook" / "values.schema.json"
#: The chart's key under ``settings`` -> the service's setting.
CHART_KEYS = {
    "mode": "mode",
    "evictionMethod": "eviction-method",
    "pdbMode": "pdb-mode",
    "protectedNamespaces": "protected-namespaces",
    "unprotectedNamespaces": "unprotected-namespaces",
    "preemptorNamespaceSelector": "preemptor-namespace-selector",
    "minPreemptorPriority": "min-preemptor-priority",
    "maxVictims": "max-victims",
    "lending": "lending",
    "lendMemoryLimits": "lend-memory-limits",
    "victimOrder": "victim-order",
    "reservationTTL": "reservation-ttl",
    "gracePeriodCap": "grace-period-cap",
    "persistTimeout": "persist-timeout",
    "leaseDuration": "lease-duration",
    "resyncPeriod": "resync-period",
    "maxCacheStaleness": "max-cache-staleness",
    "maxBodyBytes": "max-body-bytes",
    "schedulerName": "scheduler-name",
}
#: The chart's key under ``checkpoint`` -> the node agent's setting (the DaemonSet passes
#: each as that flag).
CHECKPOINT_KEYS = {
    "checkpointDir": "checkpoint-dir",
    "containerdAddress": "containerd-address",
    "ctr": "ctr",
    "criu": "criu",
    "maxCheckpoints": "max-checkpoints",
    "maxCheckpointBytes": "max-checkpoint-bytes",
    "pollInterval": "poll-interval",
}
#: The chart's key under ``checkpoint.registry`` -> the node agent's setting.
REGISTRY_KEYS = {"repository": "registry"}
#: Settings the Deployment takes from the pod (downward API), not from values.
FROM_THE_POD = frozenset({"service-namespace", "identity"})
#: Settings the Deployment sets from its own objects, not from values: the container's
#: memory limit (downward API), the client CA its clientAuth mounts and the name it asks
#: of its certificate (``clientAuth.commonName``, which the chart's certificates bear
#: too), checkpoints from ``checkpoint.enabled`` (with the node agent) and the kubelets'
#: CA it mounts.
FROM_THE_DEPLOYMENT = frozenset(
    {"memory-limit", "client-ca", "client-cn", "checkpoints", "kubelet-ca"}
)
#: The chart's key under ``clientAuth`` -> the service's setting it gives.
CLIENT_AUTH_KEYS = {"commonName": "client-cn"}


def _or_null(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema``, or null: a value left null is the service's default."""
    if "enum" in schema:
        return {**schema, "enum": [*schema["enum"], None]}
    return {**schema, "type": [schema["type"], "null"]}


def setting_schema(name: str) -> dict[str, Any]:
    setting = SETTINGS[name]
    description = f"{setting.help}; null: the service's default ({setting.default})"
    return {**_or_null(setting.parse.schema()), "description": description}


def settings_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {key: setting_schema(name) for key, name in CHART_KEYS.items()},
    }


def port_schemas() -> dict[str, dict[str, Any]]:
    return {
        "port": {**PORT.schema(), "description": "the HTTPS port"},
        "metricsPort": {
            **METRICS_PORT.schema(),
            "description": "the plain HTTP /metrics port; not the HTTPS port",
        },
    }


def client_auth_schemas() -> dict[str, dict[str, Any]]:
    """``clientAuth``'s keys that are settings: never null, the chart's certificates
    bear the name."""
    return {
        key: {**SETTINGS[name].parse.schema(), "description": SETTINGS[name].help}
        for key, name in CLIENT_AUTH_KEYS.items()
    }


#: The chart's certificate lifetimes -> the ``serve`` flag each becomes (mode service).
DURATIONS = {
    "certificates": {
        "duration": "--tls-validity",
        "renewBefore": "--tls-renew-before",
        "caDuration": "--tls-ca-validity",
    },
    "clientAuth": {
        "duration": "--tls-client-validity",
        "renewBefore": "--tls-client-renew-before",
    },
}


def duration_schema(flag: str) -> dict[str, Any]:
    return {**DURATION.schema(), "description": f"a duration such as 2160h (serve {flag})"}


def _with(properties: dict[str, Any], key: str, generated: dict[str, Any]) -> None:
    """``properties[key]`` with the ``generated`` properties."""
    section = dict(properties[key])
    section["properties"] = {**section["properties"], **generated}
    properties[key] = section


def checkpoint_schemas() -> dict[str, dict[str, Any]]:
    return {
        key: {**AGENT_SETTINGS[name].parse.schema(), "description": AGENT_SETTINGS[name].help}
        for key, name in CHECKPOINT_KEYS.items()
    }


def registry_schemas() -> dict[str, dict[str, Any]]:
    """``checkpoint.registry``'s keys the DaemonSet passes as flags as they are."""
    return {
        key: {**AGENT_SETTINGS[name].parse.schema(), "description": AGENT_SETTINGS[name].help}
        for key, name in REGISTRY_KEYS.items()
    }


def generated(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its generated parts as the table makes them."""
    properties = dict(schema["properties"])
    _with(properties, "checkpoint", checkpoint_schemas())
    checkpoint = properties["checkpoint"]["properties"]
    _with(checkpoint, "registry", registry_schemas())
    properties["settings"] = settings_schema()
    _with(properties, "server", port_schemas())
    _with(properties, "clientAuth", client_auth_schemas())
    for key, flags in DURATIONS.items():
        _with(properties, key, {v: duration_schema(f) for v, f in flags.items()})
    return {**schema, "properties": properties}


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    current = SCHEMA.read_text(encoding="utf-8")
    wanted = render(generated(json.loads(current)))
    if "--check" in argv:
        if wanted != current:
            print(f"{SCHEMA.relative_to(ROOT)} differs from the settings table: run "
                  "python scripts/chart_schema.py", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    SCHEMA.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
