"""Loading :class:`~webhook.engine.config.Config`: defaults < file < environment < flags.

Every setting has one name, spelled ``kebab-case`` in the file and on the command line
(``--reservation-ttl``) and ``RPW_UPPER_SNAKE`` in the environment
(``RPW_RESERVATION_TTL``). Bad values raise :class:`InputError` naming the setting and
where it came from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

import yaml

from webhook.core.errors import InputError
from webhook.engine.config import Config


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


#: setting name -> (Config field, parser)
SETTINGS: Final[dict[str, tuple[str, Callable[[Any], Any]]]] = {
    "mode": ("mode", _choice("enforce", "warn", "deny-infeasible")),
    "eviction-method": ("eviction_method", _choice("evict", "delete")),
    "pdb-mode": ("pdb_mode", _choice("respect", "best-effort")),
    "protected-namespaces": ("protected_namespaces", _names),
    "max-victims": ("max_victims", _optional_count),
    "lending": ("lending", _switch),
    "reservation-ttl": ("reservation_ttl", _number),
    "grace-period-cap": ("grace_period_cap", _optional_count),
    "persist-timeout": ("persist_timeout", _number),
    "namespace": ("namespace", _text),
    "identity": ("identity", _text),
    "lease-duration": ("lease_duration", _number),
    "resync-period": ("resync_period", _number),
    "max-cache-staleness": ("max_cache_staleness", _number),
    "max-body-bytes": ("max_body_bytes", _count),
    "scheduler-name": ("scheduler_name", _text),
}


def env_name(setting: str) -> str:
    return "RPW_" + setting.upper().replace("-", "_")


def _apply(values: dict[str, Any], source: Mapping[str, Any], origin: str) -> None:
    for key, raw in source.items():
        if key not in SETTINGS:
            known = ", ".join(sorted(SETTINGS))
            raise InputError(f"{origin}: unknown setting {key!r} (known: {known})")
        field, parse = SETTINGS[key]
        try:
            values[field] = parse(raw)
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


def describe_defaults() -> list[tuple[str, str, str]]:
    """(setting, environment variable, default) rows for the docs and ``--help``."""
    defaults = Config()
    return [
        (name, env_name(name), repr(getattr(defaults, field)))
        for name, (field, _) in SETTINGS.items()
    ]
