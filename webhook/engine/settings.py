"""The service's settings: :class:`Config`, with their defaults, and loading it:
defaults < file < environment < flags.

Every setting has one name, spelled ``kebab-case`` in the file and on the command line
(``--reservation-ttl``) and ``RPW_UPPER_SNAKE`` in the environment
(``RPW_RESERVATION_TTL``). Bad values raise :class:`InputError` naming the setting and
where it came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, get_args

import yaml

from webhook.core.errors import InputError
from webhook.core.model import PdbMode
from webhook.core.policy import DefaultPolicy, VictimOrder

Mode = Literal["enforce", "warn", "deny-infeasible"]
EvictionMethod = Literal["evict", "delete"]


@dataclass(frozen=True, slots=True)
class Config:
    """Everything an operator can set (flags, ``RPW_*`` environment variables, a file).

    ``mode``: ``enforce`` plans, reserves and preempts; ``warn`` plans and tells but never
    reserves or evicts (trial rollouts); ``deny-infeasible`` is ``enforce`` that also
    denies (403) a resize that cannot fit even with preemption.
    """

    mode: Mode = "enforce"
    eviction_method: EvictionMethod = "evict"
    pdb_mode: PdbMode = "respect"
    protected_namespaces: frozenset[str] = frozenset()
    max_victims: int | None = None
    #: Pods annotated with a floor lend CPU and memory in place before anyone is evicted
    #: (docs/lending.md).
    lending: bool = True
    #: ``upstream``: victims by priority, then start time. ``movable-first``: on equal
    #: priority, pods whose controller can recreate them on another node with room go
    #: before pods whose work would be lost (docs/decision-core.md).
    victim_order: VictimOrder = "upstream"
    #: Seconds an admitted resize holds its room if nobody releases it earlier.
    reservation_ttl: float = 120.0
    #: Upper bound on a victim's termination grace period (seconds); None keeps the pod's.
    grace_period_cap: int | None = None
    #: Seconds the worker waits for an admitted resize to show in the pod's spec.
    persist_timeout: float = 10.0
    #: Namespace of the ledger and leader-election Leases (the webhook's own).
    namespace: str = "resize-preemption-system"
    #: Identity in leader election and in the ledger's audit fields.
    identity: str = ""
    lease_duration: float = 15.0
    #: Full resync of the cache, seconds.
    resync_period: float = 300.0
    #: Seconds a watch of the cache may be lost before nothing is decided on it: reviews
    #: fail open, the worker and the reconciler wait, readiness goes false. Above a
    #: relist of a large cluster (docs/service.md, Performance) and the reflector's
    #: longest backoff, so that neither alone makes the service fail open.
    max_cache_staleness: float = 60.0
    #: Largest AdmissionReview body accepted, bytes.
    max_body_bytes: int = 3 * 1024 * 1024
    scheduler_name: str = "resize-preemption-webhook"
    #: A file of CA certificates; review connections must present a client certificate one
    #: of them signed (kube-apiserver's). Empty: any caller is accepted, and the service
    #: says so at start and in ``resize_preemption_webhook_unauthenticated``.
    client_ca: str = ""
    #: Bytes the replica may use (its container's memory limit; the chart passes it). The
    #: review port then holds no more connections than their bodies fit in it
    #: (:func:`webhook.web.server.connections_within`); None: not checked.
    memory_limit: int | None = None

    def cache_current(self, staleness: float) -> bool:
        """Whether a view that may have missed changes for ``staleness`` seconds (see
        :meth:`~webhook.engine.ledger.ClusterView.staleness`) may still be decided on:
        the one bound reviews, the worker, the reconciler and readiness all apply."""
        return staleness <= self.max_cache_staleness

    def policy(self) -> DefaultPolicy:
        return DefaultPolicy(
            pdb_mode=self.pdb_mode,
            max_victims=self.max_victims,
            protected_namespaces=self.protected_namespaces,
            lending=self.lending,
        )


def _choice(*allowed: str) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return str(value)

    return parse


def _number(value: object) -> float:
    if isinstance(value, bool):
        raise ValueError("must be a number")
    number = float(value)  # type: ignore[arg-type]
    if number < 0:
        raise ValueError("must be >= 0")
    return number


def _count(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError("must be an integer")
    number = int(str(value))
    if number < 0:
        raise ValueError("must be >= 0")
    return number


def _optional_count(value: object) -> int | None:
    if value is None or (isinstance(value, str) and value.lower() in ("", "none", "unlimited")):
        return None
    return _count(value)


def _names(value: object) -> frozenset[str]:
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, list | tuple | set | frozenset):
        items = [str(v).strip() for v in value]
    else:
        raise ValueError("must be a list or a comma-separated string")
    return frozenset(v for v in items if v)


def _switch(value: object) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "on", "yes", "1"):
        return True
    if text in ("false", "off", "no", "0"):
        return False
    raise ValueError("must be true or false (on/off)")


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("must be a string")
    return value


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: the :class:`Config` field it sets, how a value given as text (or YAML)
    is read, and what ``serve --help`` and the table in docs/service.md say of it."""

    field: str
    parse: Callable[[Any], Any]
    #: One line for ``--help``; the docs' table says more.
    help: str
    #: What a value looks like on the command line, when not one of ``choices``.
    metavar: str = "VALUE"
    choices: tuple[str, ...] = ()
    #: The default as a person reads it, where the field's default is no value
    #: (``None``, ``""``, nothing): what that means.
    default_text: str = ""

    @property
    def default(self) -> str:
        """The default as ``--help`` and docs/service.md show it."""
        value = getattr(Config(), self.field)
        if self.default_text:
            return self.default_text
        if isinstance(value, bool):
            return str(value).lower()
        return str(value)


def _one_of(field: str, allowed: tuple[str, ...], help: str) -> Setting:
    return Setting(field, _choice(*allowed), help, choices=allowed)


#: Every setting by name: the one list the command line, the environment, the file, the
#: docs' table (tests/unit/test_docs.py) and ``serve --help`` (tests/unit/test_cli_help.py)
#: are checked against.
SETTINGS: Final[dict[str, Setting]] = {
    "mode": _one_of(
        "mode",
        get_args(Mode),
        "enforce: plan, reserve and preempt; warn: only tell what enforce would do; "
        "deny-infeasible: enforce, and deny a resize that cannot fit",
    ),
    "eviction-method": _one_of(
        "eviction_method",
        get_args(EvictionMethod),
        "evict: the Eviction API (PDBs enforced by the API server); delete: upstream's "
        "DisruptionTarget condition, then DELETE",
    ),
    "pdb-mode": _one_of(
        "pdb_mode",
        get_args(PdbMode),
        "respect: a plan that would violate a PodDisruptionBudget is infeasible; "
        "best-effort: prefer victims that violate none, go ahead if needed",
    ),
    "protected-namespaces": Setting(
        "protected_namespaces",
        _names,
        "namespaces whose pods are never victims",
        metavar="NS[,NS...]",
        default_text="none",
    ),
    "max-victims": Setting(
        "max_victims",
        _optional_count,
        "a plan needing more victims is infeasible",
        metavar="N",
        default_text="unlimited",
    ),
    "lending": Setting(
        "lending",
        _switch,
        "pods annotated with a floor lend CPU and memory in place before anyone is "
        "evicted; false: evictions only",
        metavar="{true,false}",
    ),
    "victim-order": _one_of(
        "victim_order",
        get_args(VictimOrder),
        "upstream: victims by priority, then start time; movable-first: on equal "
        "priority, pods a controller can recreate on another node with room go first",
    ),
    "reservation-ttl": Setting(
        "reservation_ttl",
        _number,
        "seconds an admitted resize holds its room unless released earlier",
        metavar="SECONDS",
    ),
    "grace-period-cap": Setting(
        "grace_period_cap",
        _optional_count,
        "upper bound, seconds, on a victim's termination grace period",
        metavar="SECONDS",
        default_text="the pod's own",
    ),
    "persist-timeout": Setting(
        "persist_timeout",
        _number,
        "seconds the worker waits for an admitted resize to appear in the pod's spec",
        metavar="SECONDS",
    ),
    "namespace": Setting(
        "namespace",
        _text,
        "namespace of the ledger and leader Leases, the service's own",
        metavar="NAMESPACE",
    ),
    "identity": Setting(
        "identity",
        _text,
        "holder identity in leader election and ledger entries",
        metavar="NAME",
        default_text="process-unique",
    ),
    "lease-duration": Setting(
        "lease_duration",
        _number,
        "leader Lease duration, seconds; a new leader takes over within it",
        metavar="SECONDS",
    ),
    "resync-period": Setting(
        "resync_period",
        _number,
        "seconds between full relists of the cache",
        metavar="SECONDS",
    ),
    "max-cache-staleness": Setting(
        "max_cache_staleness",
        _number,
        "seconds a lost watch of the cache is tolerated before reviews fail open",
        metavar="SECONDS",
    ),
    "max-body-bytes": Setting(
        "max_body_bytes", _count, "largest AdmissionReview accepted", metavar="BYTES"
    ),
    "scheduler-name": Setting(
        "scheduler_name", _text, "reporting controller of the events", metavar="NAME"
    ),
    "memory-limit": Setting(
        "memory_limit",
        _optional_count,
        "bytes the replica may use: review connections are limited so that their bodies fit",
        metavar="BYTES",
        default_text="not checked",
    ),
    "client-ca": Setting(
        "client_ca",
        _text,
        "CA certificates file: reviews only from callers with a client certificate it "
        "signed (kube-apiserver's)",
        metavar="FILE",
        default_text="none: any caller",
    ),
}


def env_name(setting: str) -> str:
    return "RPW_" + setting.upper().replace("-", "_")


def _apply(values: dict[str, Any], source: Mapping[str, Any], origin: str) -> None:
    for key, raw in source.items():
        if key not in SETTINGS:
            known = ", ".join(sorted(SETTINGS))
            raise InputError(f"{origin}: unknown setting {key!r} (known: {known})")
        setting = SETTINGS[key]
        try:
            values[setting.field] = setting.parse(raw)
        except (ValueError, TypeError) as e:
            raise InputError(f"{origin}: {key}={raw!r} {e}") from None


def read_file(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"cannot read config file {path}: {e.strerror or e}") from None
    except yaml.YAMLError:
        raise InputError(f"config file {path} is not valid YAML") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"config file {path} must hold a mapping of settings")
    return data


def load_config(
    *,
    file: str | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """Merge defaults, the YAML ``file``, ``RPW_*`` variables of ``env`` and ``flags``
    (setting name -> value; ``None`` values are "not given")."""
    values: dict[str, Any] = {}
    if file:
        _apply(values, read_file(file), f"config file {file}")
    if env:
        from_env = {s: env[env_name(s)] for s in SETTINGS if env_name(s) in env}
        _apply(values, from_env, "environment")
    if flags:
        _apply(values, {k: v for k, v in flags.items() if v is not None}, "command line")
    return dataclasses.replace(Config(), **values)
