"""The service's settings: :class:`Config`, with their defaults, and loading it:
defaults < file < environment < flags.

Every setting has one name, spelled ``kebab-case`` in the file and on the command line
(``--reservation-ttl``, the same for ``serve``, ``plan`` and ``status``) and
``RPW_UPPER_SNAKE`` in the environment (``RPW_RESERVATION_TTL``), and one :class:`Rule`:
how a value is read and what it must be, wherever it comes from, and the chart's values
schema (scripts/chart_schema.py). Bad values raise :class:`InputError`, one line naming
the setting as it was given, where it came from and the rule.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Final, Literal, get_args

import yaml

from webhook.core.errors import InputError
from webhook.core.model import LabelSelector, PdbMode
from webhook.core.objects import parse_selector
from webhook.core.policy import SYSTEM_NAMESPACES, DefaultPolicy, Preemptors, VictimOrder

log = logging.getLogger(__name__)

Mode = Literal["enforce", "warn", "deny-infeasible"]
#: The name kube-apiserver's webhook client certificate bears by default: Gatekeeper's
#: ``--client-cn-name`` default, and what every certificate the project issues for it says.
DEFAULT_CLIENT_CN: Final = "kube-apiserver"
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
    #: Namespaces whose pods are never victims, besides kube-system and the service's
    #: own (:attr:`unprotected_namespaces`).
    protected_namespaces: frozenset[str] = frozenset()
    #: Of kube-system and the service's own namespace, never victims by default, those
    #: whose pods may be victims after all.
    unprotected_namespaces: frozenset[str] = frozenset()
    #: Only pods of namespaces whose labels this selects take room from others (the
    #: admission path and the reconciler alike); ``None``: every namespace.
    preemptor_namespace_selector: LabelSelector | None = None
    #: Only pods at this priority or above take room from others; ``None``: any.
    min_preemptor_priority: int | None = None
    max_victims: int | None = None
    #: Pods annotated with a floor lend CPU and memory in place before anyone is evicted
    #: (docs/lending.md).
    lending: bool = True
    #: A Guaranteed lender's memory lends too, its limit lowered with its request: off by
    #: default, a process that grows past a lowered limit is OOM-killed (docs/lending.md).
    lend_memory_limits: bool = False
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
    #: says so at start and in ``resize_preemption_unauthenticated``.
    client_ca: str = ""
    #: With :attr:`client_ca`: the Common Name the client certificate must bear. A CA may
    #: sign certificates for more than kube-apiserver (a cluster's CA signs every
    #: kubelet's and user's); the name keeps those from posting reviews.
    client_cn: str = DEFAULT_CLIENT_CN
    #: Bytes the replica may use (its container's memory limit; the chart passes it). The
    #: review port then holds no more connections than their bodies fit in it
    #: (:func:`webhook.web.server.connections_within`); None: not checked.
    memory_limit: int | None = None
    #: Victims annotated ``resize-preemption.io/on-preempt: checkpoint`` are checkpointed
    #: before they are evicted and restored when room returns, on nodes whose agent says
    #: they can (docs/checkpoint.md). Off: such victims are evicted, and plans say why.
    checkpoints: bool = False
    #: CA certificates file that verifies the kubelets' serving certificates for the
    #: checkpoint API. Empty: not verified, as kube-apiserver does by default.
    kubelet_ca: str = ""

    def cache_current(self, staleness: float) -> bool:
        """Whether a view that may have missed changes for ``staleness`` seconds (see
        :meth:`~webhook.engine.ledger.ClusterView.staleness`) may still be decided on:
        the one bound reviews, the worker, the reconciler and readiness all apply."""
        return staleness <= self.max_cache_staleness

    def policy(self) -> DefaultPolicy:
        return DefaultPolicy(
            pdb_mode=self.pdb_mode,
            max_victims=self.max_victims,
            protected_namespaces=self.protected(),
            lending=self.lending,
            lend_memory_limits=self.lend_memory_limits,
        )

    def protected(self) -> frozenset[str]:
        """Namespaces whose pods are never victims: kube-system and the service's own
        unless opted in (:attr:`unprotected_namespaces`), and every one of
        :attr:`protected_namespaces` (which wins over an opt-in)."""
        system = SYSTEM_NAMESPACES | {self.namespace}
        return self.protected_namespaces | (system - self.unprotected_namespaces)

    def preemptors(self) -> Preemptors:
        """Who may take room from other pods."""
        return Preemptors(self.preemptor_namespace_selector, self.min_preemptor_priority)


#: Kubernetes names of namespaces (DNS-1123 labels).
DNS_LABEL: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_LABEL = re.compile(DNS_LABEL)
#: The smallest body limit allowed: an AdmissionReview of a resize carries the pod twice
#: (object and oldObject), some kB for a small pod and tens of kB for one with many
#: containers or variables; a limit below that would make every review fail open.
MIN_BODY_BYTES: Final = 64 * 1024
#: Leader election renews at 2/3 of the lease and retries every 1/7.5 of it, at least every
#: 0.5 s (webhook.service._elector); client-go requires renew deadline > 1.2 x retry
#: period, which holds from a lease of 0.9 s, and a Lease stores whole seconds.
MIN_LEASE_DURATION: Final = 1.0


class Rule:
    """How a value of one setting is read and what it must be: ``__call__`` parses text
    (or a YAML value) and raises ``ValueError`` saying the rule; :meth:`schema` is the
    same rule in JSON Schema (the chart's values.schema.json is generated from it)."""

    def __call__(self, value: object) -> Any:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Choice(Rule):
    allowed: tuple[str, ...]

    def __call__(self, value: object) -> str:
        if value not in self.allowed:
            raise ValueError(f"must be one of {', '.join(self.allowed)}")
        return str(value)

    def schema(self) -> dict[str, Any]:
        return {"enum": list(self.allowed)}


@dataclass(frozen=True, slots=True)
class Seconds(Rule):
    """A duration in seconds: finite, and above zero (or at least ``minimum``)."""

    minimum: float = 0.0

    def __call__(self, value: object) -> float:
        if isinstance(value, bool):
            raise ValueError(self.rule)
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            raise ValueError(self.rule) from None
        if not math.isfinite(number) or number <= 0 or number < self.minimum:
            raise ValueError(self.rule)
        return number

    @property
    def rule(self) -> str:
        if self.minimum > 0:
            return f"must be a number of seconds of at least {self.minimum:g}"
        return "must be a number of seconds above 0 (finite)"

    def schema(self) -> dict[str, Any]:
        if self.minimum > 0:
            return {"type": "number", "minimum": self.minimum}
        return {"type": "number", "exclusiveMinimum": 0}


@dataclass(frozen=True, slots=True)
class Count(Rule):
    """A whole number of at least ``minimum``; with ``unlimited``, also none (``None``):
    empty, ``none`` or ``unlimited`` in text, null in YAML."""

    minimum: int = 0
    unlimited: bool = False

    def __call__(self, value: object) -> int | None:
        if self.unlimited and (
            value is None or (isinstance(value, str) and value.lower() in _NO_LIMIT)
        ):
            return None
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(self.rule)
        try:
            number = int(value) if isinstance(value, float) else int(str(value).strip())
        except ValueError:
            raise ValueError(self.rule) from None
        if number < self.minimum:
            raise ValueError(self.rule)
        return number

    @property
    def rule(self) -> str:
        text = f"must be a whole number of at least {self.minimum}"
        return text + " (or unlimited)" if self.unlimited else text

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.minimum}


_NO_LIMIT = ("", "none", "unlimited")


@dataclass(frozen=True, slots=True)
class Port(Rule):
    """A TCP port, 1-65535; with ``off``, also 0 for "not served"."""

    off: bool = False

    def __call__(self, value: object) -> int:
        try:
            number = int(str(value).strip())
        except ValueError:
            raise ValueError(self.rule) from None
        if not (0 if self.off else 1) <= number <= 65535:
            raise ValueError(self.rule)
        return number

    @property
    def rule(self) -> str:
        return "must be a port, 1-65535" + (" (0: off)" if self.off else "")

    def schema(self) -> dict[str, Any]:
        # The chart always serves metrics: 0 is the command line's alone.
        return {"type": "integer", "minimum": 1, "maximum": 65535}


@dataclass(frozen=True, slots=True)
class Priority(Rule):
    """A pod priority (any whole number), or none: empty, ``none`` or ``any`` in text,
    null in YAML."""

    def __call__(self, value: object) -> int | None:
        if value is None or (isinstance(value, str) and value.lower() in ("", "none", "any")):
            return None
        if isinstance(value, bool | float):
            raise ValueError("must be an integer")
        try:
            return int(str(value).strip())
        except ValueError:
            raise ValueError("must be an integer") from None

    def schema(self) -> dict[str, Any]:
        return {"type": "integer"}


@dataclass(frozen=True, slots=True)
class Selector(Rule):
    """A label selector as webhook configurations write ``namespaceSelector``: a mapping
    (in the file) or its JSON or YAML text (flag, environment)."""

    def __call__(self, value: object) -> LabelSelector | None:
        if isinstance(value, str):
            if value.strip().lower() in ("", "none"):
                return None
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                raise ValueError("must be a label selector in JSON or YAML") from None
        if not isinstance(value, dict):
            raise ValueError('must be a label selector, e.g. {"matchLabels": {"team": "a"}}')
        unknown = set(value) - {"matchLabels", "matchExpressions"}
        if unknown:
            raise ValueError(
                f"unknown field {sorted(unknown)[0]!r} (matchLabels, matchExpressions)"
            )
        try:
            return parse_selector(value, "selector")
        except InputError as e:
            raise ValueError(str(e)) from None

    def schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {
                "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
                "matchExpressions": {"type": "array", "items": {"type": "object"}},
            },
            "additionalProperties": False,
        }


@dataclass(frozen=True, slots=True)
class Namespace(Rule):
    """A namespace name: a DNS-1123 label."""

    def __call__(self, value: object) -> str:
        if not isinstance(value, str) or len(value) > 63 or not _DNS_LABEL.match(value):
            raise ValueError(self.rule)
        return value

    rule: ClassVar[str] = (
        "must be a namespace name (DNS-1123 label: lower-case letters, digits and '-', at most 63)"
    )

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": DNS_LABEL, "maxLength": 63}


@dataclass(frozen=True, slots=True)
class Namespaces(Rule):
    """Namespace names: a list, or one comma-separated string."""

    def __call__(self, value: object) -> frozenset[str]:
        if isinstance(value, str):
            items = [v.strip() for v in value.split(",")]
        elif isinstance(value, list | tuple | set | frozenset):
            items = [str(v).strip() for v in value]
        else:
            raise ValueError("must be a list or a comma-separated string of namespaces")
        names = frozenset(v for v in items if v)
        bad = sorted(n for n in names if len(n) > 63 or not _DNS_LABEL.match(n))
        if bad:
            raise ValueError(f"holds {bad[0]!r}, which {Namespace.rule}")
        return names

    def schema(self) -> dict[str, Any]:
        return {"type": "array", "items": Namespace().schema(), "uniqueItems": True}


@dataclass(frozen=True, slots=True)
class Switch(Rule):
    def __call__(self, value: object) -> bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "on", "yes", "1"):
            return True
        if text in ("false", "off", "no", "0"):
            return False
        raise ValueError("must be true or false (on/off)")

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


@dataclass(frozen=True, slots=True)
class Text(Rule):
    """A string; with ``required``, not empty."""

    required: bool = False

    def __call__(self, value: object) -> str:
        if not isinstance(value, str):
            raise ValueError("must be a string")
        if self.required and not value.strip():
            raise ValueError("must not be empty")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "minLength": 1} if self.required else {"type": "string"}


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(d|h|m|s)")
_DURATION_UNITS: Final = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


@dataclass(frozen=True, slots=True)
class Duration(Rule):
    """A positive duration as Go and cert-manager write it (``2160h``, ``1h30m``,
    ``90s``), days (``d``) too; a :class:`datetime.timedelta`. The schema takes hours,
    minutes and seconds only: the chart gives the same values to cert-manager, which
    knows no days."""

    def __call__(self, value: object) -> dt.timedelta:
        text = value if isinstance(value, str) else ""
        spelled = text.strip()
        parts = _DURATION_PART.findall(spelled)
        if not parts or "".join(n + u for n, u in parts) != spelled:
            raise ValueError(f"{value!r} is not a duration such as 2160h, 45m or 90s")
        seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
        if seconds <= 0:
            raise ValueError(f"{value!r}: a duration must be positive")
        return dt.timedelta(seconds=seconds)

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": "^([0-9]+(\\.[0-9]+)?(h|m|s))+$"}


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: the :class:`Config` field it sets, its :class:`Rule` (how a value given
    as text or YAML is read, what it must be) and what ``serve --help`` and the table in
    docs/service.md say of it."""

    field: str
    parse: Rule
    #: One line for ``--help``; the docs' table says more.
    help: str
    #: What a value looks like on the command line, when not one of ``choices``.
    metavar: str = "VALUE"
    #: The default as a person reads it, where the field's default is no value
    #: (``None``, ``""``, nothing): what that means.
    default_text: str = ""

    @property
    def choices(self) -> tuple[str, ...]:
        return self.parse.allowed if isinstance(self.parse, Choice) else ()

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
    return Setting(field, Choice(allowed), help)


#: Every setting by name: the one list the command line, the environment, the file, the
#: docs' table (tests/unit/test_docs.py), ``serve --help`` (tests/unit/test_cli_help.py)
#: and the chart's values.schema.json (scripts/chart_schema.py) are checked against.
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
        Namespaces(),
        "namespaces whose pods are never victims, besides kube-system and the service's own",
        metavar="NS[,NS...]",
        default_text="none",
    ),
    "unprotected-namespaces": Setting(
        "unprotected_namespaces",
        Namespaces(),
        "of kube-system and the service's own namespace (never victims by default), "
        "those whose pods may be victims",
        metavar="NS[,NS...]",
        default_text="none",
    ),
    "preemptor-namespace-selector": Setting(
        "preemptor_namespace_selector",
        Selector(),
        "label selector (JSON) of the namespaces whose pods may preempt or borrow",
        metavar="SELECTOR",
        default_text="every namespace",
    ),
    "min-preemptor-priority": Setting(
        "min_preemptor_priority",
        Priority(),
        "priority a pod needs to preempt or borrow",
        metavar="PRIORITY",
        default_text="any",
    ),
    "max-victims": Setting(
        "max_victims",
        Count(unlimited=True),
        "a plan needing more victims is infeasible",
        metavar="N",
        default_text="unlimited",
    ),
    "lending": Setting(
        "lending",
        Switch(),
        "pods annotated with a floor lend CPU and memory in place before anyone is "
        "evicted; false: evictions only",
        metavar="{true,false}",
    ),
    "lend-memory-limits": Setting(
        "lend_memory_limits",
        Switch(),
        "a Guaranteed lender's memory floor lends too, its limit lowered with its request "
        "(a process growing past it later is OOM-killed); false: such pods lend CPU only",
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
        Seconds(),
        "seconds an admitted resize holds its room unless released earlier",
        metavar="SECONDS",
    ),
    "grace-period-cap": Setting(
        "grace_period_cap",
        Count(unlimited=True),
        "upper bound, seconds, on a victim's termination grace period",
        metavar="SECONDS",
        default_text="the pod's own",
    ),
    "persist-timeout": Setting(
        "persist_timeout",
        Seconds(),
        "seconds the worker waits for an admitted resize to appear in the pod's spec",
        metavar="SECONDS",
    ),
    "service-namespace": Setting(
        "namespace",
        Namespace(),
        "namespace of the ledger and leader Leases, the service's own",
        metavar="NAMESPACE",
    ),
    "identity": Setting(
        "identity",
        Text(),
        "holder identity in leader election and ledger entries",
        metavar="NAME",
        default_text="process-unique",
    ),
    "lease-duration": Setting(
        "lease_duration",
        Seconds(minimum=MIN_LEASE_DURATION),
        "leader Lease duration, seconds; a new leader takes over within it",
        metavar="SECONDS",
    ),
    "resync-period": Setting(
        "resync_period",
        Seconds(),
        "seconds between full relists of the cache",
        metavar="SECONDS",
    ),
    "max-cache-staleness": Setting(
        "max_cache_staleness",
        Seconds(),
        "seconds a lost watch of the cache is tolerated before reviews fail open",
        metavar="SECONDS",
    ),
    "max-body-bytes": Setting(
        "max_body_bytes",
        Count(minimum=MIN_BODY_BYTES),
        "largest AdmissionReview accepted",
        metavar="BYTES",
    ),
    "scheduler-name": Setting(
        "scheduler_name",
        Text(required=True),
        "the name the service's events and a deleted victim's DisruptionTarget report; "
        "it selects no pods",
        metavar="NAME",
    ),
    "memory-limit": Setting(
        "memory_limit",
        Count(minimum=1, unlimited=True),
        "bytes the replica may use: review connections are limited so that their bodies fit",
        metavar="BYTES",
        default_text="not checked",
    ),
    "client-ca": Setting(
        "client_ca",
        Text(),
        "CA certificates file: reviews only from callers with a client certificate it "
        "signed (kube-apiserver's)",
        metavar="FILE",
        default_text="none: any caller",
    ),
    "client-cn": Setting(
        "client_cn",
        Text(required=True),
        "with client-ca: the Common Name a caller's client certificate must bear; "
        "another name signed by the CA is refused",
        metavar="NAME",
    ),
    "checkpoints": Setting(
        "checkpoints",
        Switch(),
        "victims annotated resize-preemption.io/on-preempt=checkpoint are checkpointed "
        "before eviction and restored when room returns, where the node agent says the "
        "node can; false: they are evicted",
        metavar="{true,false}",
    ),
    "kubelet-ca": Setting(
        "kubelet_ca",
        Text(),
        "CA certificates file verifying the kubelets' serving certificates (checkpoint API)",
        metavar="FILE",
        default_text="none: not verified",
    ),
}

#: Names a setting had before. Manifests written for them (``RPW_NAMESPACE``, a file's
#: ``namespace:``) keep working, with a warning naming the new one; the new name wins
#: where both are given. On the command line, where ``-n/--namespace`` is a pod's
#: namespace as in kubectl, the old name is refused with the new one.
RENAMED: Final[dict[str, str]] = {"namespace": "service-namespace"}
#: The command line's server options (not settings): ports, and the lifetimes of the
#: certificates the service keeps (``--tls-validity`` and the others).
PORT: Final = Port()
METRICS_PORT: Final = Port(off=True)
DURATION: Final = Duration()


def check_ports(port: int, metrics_port: int, probe_port: int = 0) -> None:
    """The HTTPS port, the metrics port and the probe port are listening sockets: those
    served must differ."""
    if metrics_port and port == metrics_port:
        raise InputError(
            f"command line: --metrics-port={metrics_port} must differ from --port={port}"
        )
    if probe_port and probe_port in (port, metrics_port):
        raise InputError(
            f"command line: --probe-port={probe_port} must differ from --port={port} and "
            f"--metrics-port={metrics_port}"
        )


def env_name(setting: str) -> str:
    return "RPW_" + setting.upper().replace("-", "_")


#: How each source spells a setting's name in a message.
_SPELLING: Final[dict[str, Callable[[str], str]]] = {
    "environment": env_name,
    "command line": lambda name: f"--{name}",
}


def _as_is(name: str) -> str:
    return name


def _apply(
    values: dict[str, Any], source: Mapping[str, Any], origin: str, notes: list[str]
) -> None:
    """Parse each value of ``source`` into ``values`` (by field); a former name adds a
    line to ``notes``, said only once everything loaded, so a mistake stays one line."""
    spell: Callable[[str], str] = _SPELLING.get(origin, _as_is)
    for given, raw in source.items():
        key = RENAMED.get(given, given)
        if key != given:
            if origin == "command line":
                raise InputError(f"{origin}: {spell(given)} is now {spell(key)}")
            if key in source:
                continue
            notes.append(f"{origin}: {spell(given)} is deprecated, read as {spell(key)}")
        if key not in SETTINGS:
            known = ", ".join(sorted(SETTINGS))
            raise InputError(f"{origin}: unknown setting {key!r} (known: {known})")
        setting = SETTINGS[key]
        try:
            values[setting.field] = setting.parse(raw)
        except (ValueError, TypeError) as e:
            raise InputError(f"{origin}: {spell(given)}={raw!r} {e}") from None


def read_file(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise InputError(f"cannot read config file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InputError(f"config file {path} is not UTF-8 text") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InputError(f"config file {path} is not valid YAML{where}") from None
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
    (setting name -> value; ``None`` values are "not given"). Every value is checked by
    its setting's :class:`Rule`; the first bad one raises :class:`InputError`, one line
    naming the setting, where it came from and the rule."""
    values: dict[str, Any] = {}
    notes: list[str] = []
    if file:
        _apply(values, read_file(file), f"config file {file}", notes)
    if env:
        names = [*SETTINGS, *RENAMED]
        from_env = {s: env[env_name(s)] for s in names if env_name(s) in env}
        _apply(values, from_env, "environment", notes)
    if flags:
        given = {k: v for k, v in flags.items() if v is not None}
        _apply(values, given, "command line", notes)
    for note in notes:
        log.warning("%s", note)
    return dataclasses.replace(Config(), **values)
