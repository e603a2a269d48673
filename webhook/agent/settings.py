"""The node agent's settings: :class:`AgentSettings` and :data:`AGENT_SETTINGS`, read as the
service reads its own (:mod:`webhook.base.settings`): one :class:`~webhook.base.settings.Rule`
per setting, ``--kebab-case`` on the command line and ``RPW_UPPER_SNAKE`` in the
environment, flags over environment over defaults; a bad value is one line naming the
setting, where it came from and the rule."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final

from webhook.agent.records import REPOSITORY_PATTERN, valid_repository
from webhook.base.settings import Count, Namespace, Rule, Seconds, Text, env_name
from webhook.core.errors import InputError, QuantityError
from webhook.core.resources import memory_bytes

#: Where the kubelet writes checkpoint archives under its default root directory.
KUBELET_CHECKPOINTS: Final = "/var/lib/kubelet/checkpoints"
#: DNS-1123 subdomain: how Kubernetes names nodes.
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True, slots=True)
class NodeName(Rule):
    def __call__(self, value: object) -> str:
        if not isinstance(value, str) or len(value) > 253 or not _SUBDOMAIN.match(value):
            raise ValueError(self.rule)
        return value

    rule: ClassVar[str] = "must be a node name (DNS-1123 subdomain, at most 253 characters)"

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "maxLength": 253}


@dataclass(frozen=True, slots=True)
class Bytes(Rule):
    """A size in bytes, as a Kubernetes quantity (``20Gi``) or a whole number; above 0."""

    def __call__(self, value: object) -> int:
        if isinstance(value, bool):
            raise ValueError(self.rule)
        try:
            number = memory_bytes(value if isinstance(value, int) else str(value).strip())
        except QuantityError:
            raise ValueError(self.rule) from None
        if number <= 0:
            raise ValueError(self.rule)
        return number

    rule: ClassVar[str] = "must be a size above 0: bytes or a quantity such as 20Gi"

    def schema(self) -> dict[str, Any]:
        quantity = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
        return {
            "anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": quantity}]
        }


@dataclass(frozen=True, slots=True)
class Absolute(Rule):
    """An absolute path."""

    def __call__(self, value: object) -> Path:
        if not isinstance(value, str) or not value.startswith("/"):
            raise ValueError("must be an absolute path")
        return Path(value)

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": "^/"}


@dataclass(frozen=True, slots=True)
class OptionalAbsolute(Rule):
    """An absolute path, or empty: none."""

    def __call__(self, value: object) -> str:
        if not isinstance(value, str) or (value and not value.startswith("/")):
            raise ValueError("must be an absolute path, or empty for none")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": "^(/.*)?$"}


@dataclass(frozen=True, slots=True)
class Repository(Rule):
    """A registry repository prefix, ``host[:port]/path`` as image references spell it, or
    empty: images stay in the node's runtime."""

    def __call__(self, value: object) -> str:
        if not isinstance(value, str) or (value and not valid_repository(value)):
            raise ValueError(self.rule)
        return value

    rule: ClassVar[str] = (
        "must be a registry and a lower-case path, e.g. registry.example:5000/rpw-checkpoints,"
        " or empty for none"
    )

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": f"^$|{REPOSITORY_PATTERN}"}


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Everything the node agent is told (docs/checkpoint.md, "The node agent")."""

    node: str = ""
    namespace: str = "resize-preemption-system"
    checkpoint_dir: Path = Path(KUBELET_CHECKPOINTS)
    ctr: str = "ctr"
    criu: str = "criu"
    containerd_address: Path = Path("/run/containerd/containerd.sock")
    containerd_namespace: str = "k8s.io"
    containerd_config: str = "/etc/containerd/config.toml"
    snapshotter: str = "overlayfs"
    max_checkpoints: int = 10
    max_checkpoint_bytes: int = 20 * 1024**3
    poll_interval: float = 2.0
    probe_interval: float = 300.0
    failed_retention: float = 300.0
    stray_age: float = 300.0
    registry: str = ""
    registry_ca: str = ""
    registry_auth: str = ""


@dataclass(frozen=True, slots=True)
class AgentSetting:
    field: str
    parse: Rule
    help: str
    metavar: str = "VALUE"


#: Every setting of ``node-agent`` by name.
AGENT_SETTINGS: Final[dict[str, AgentSetting]] = {
    "node": AgentSetting(
        "node", NodeName(), "this node's name (the chart passes spec.nodeName)", "NAME"
    ),
    "namespace": AgentSetting(
        "namespace", Namespace(), "the service's namespace, where the records are", "NAME"
    ),
    "checkpoint-dir": AgentSetting(
        "checkpoint_dir", Absolute(), "the kubelet's checkpoint directory", "DIR"
    ),
    "ctr": AgentSetting(
        "ctr",
        Text(required=True),
        "containerd's ctr client (a command: path and arguments)",
        "COMMAND",
    ),
    "criu": AgentSetting(
        "criu",
        Text(required=True),
        "the CRIU containerd runs (a command: path and arguments)",
        "COMMAND",
    ),
    "containerd-address": AgentSetting(
        "containerd_address", Absolute(), "containerd's socket", "SOCKET"
    ),
    "containerd-namespace": AgentSetting(
        "containerd_namespace", Text(required=True), "containerd's namespace of the CRI", "NAME"
    ),
    "containerd-config": AgentSetting(
        "containerd_config",
        Text(),
        "containerd's configuration, read for enable_experimental_restore_via_create",
        "FILE",
    ),
    "snapshotter": AgentSetting(
        "snapshotter", Text(required=True), "the CRI's snapshotter images unpack into", "NAME"
    ),
    "max-checkpoints": AgentSetting(
        "max_checkpoints", Count(minimum=1), "records kept on this node at most", "N"
    ),
    "max-checkpoint-bytes": AgentSetting(
        "max_checkpoint_bytes", Bytes(), "bytes of archives and images kept at most", "BYTES"
    ),
    "poll-interval": AgentSetting(
        "poll_interval", Seconds(), "seconds between passes over the records", "SECONDS"
    ),
    "probe-interval": AgentSetting(
        "probe_interval", Seconds(), "seconds between capability probes", "SECONDS"
    ),
    "failed-retention": AgentSetting(
        "failed_retention", Seconds(), "seconds a failed record stays to be read", "SECONDS"
    ),
    "stray-age": AgentSetting(
        "stray_age", Seconds(), "seconds before an archive no record names is deleted", "SECONDS"
    ),
    "registry": AgentSetting(
        "registry",
        Repository(),
        "push checkpoint images under this registry repository instead of importing them",
        "HOST/PATH",
    ),
    "registry-ca": AgentSetting(
        "registry_ca",
        OptionalAbsolute(),
        "CA bundle (PEM) the registry's certificate is verified with; empty: the system's",
        "FILE",
    ),
    "registry-auth": AgentSetting(
        "registry_auth",
        OptionalAbsolute(),
        "docker config.json holding the registry's credentials; empty: none",
        "FILE",
    ),
}


def _apply(values: dict[str, Any], source: Mapping[str, Any], origin: str) -> None:
    for name, raw in source.items():
        setting = AGENT_SETTINGS[name]
        spelled = env_name(name) if origin == "environment" else f"--{name}"
        try:
            values[setting.field] = setting.parse(raw)
        except (ValueError, TypeError) as e:
            raise InputError(f"{origin}: {spelled}={raw!r} {e}") from None


def load_agent_settings(
    *, env: Mapping[str, str] | None = None, flags: Mapping[str, Any] | None = None
) -> AgentSettings:
    """Defaults < ``RPW_*`` of ``env`` < ``flags`` (setting name -> value; None: not given).
    The node must be given."""
    values: dict[str, Any] = {}
    if env:
        _apply(
            values,
            {n: env[env_name(n)] for n in AGENT_SETTINGS if env_name(n) in env},
            "environment",
        )
    if flags:
        _apply(values, {k: v for k, v in flags.items() if v is not None}, "command line")
    settings = dataclasses.replace(AgentSettings(), **values)
    if not settings.node:
        raise InputError(f"command line: --node is required (or {env_name('node')})")
    if not settings.registry and (settings.registry_ca or settings.registry_auth):
        raise InputError("command line: --registry-ca and --registry-auth need --registry")
    return settings
