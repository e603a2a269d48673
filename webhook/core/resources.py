"""The two resizable resources, as exact integers, and the Kubernetes quantities they are
read from and written as.

Quantities follow apimachinery's ``resource.ParseQuantity`` grammar::

    <quantity>  ::= <sign><number><suffix>
    <number>    ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>    ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>  ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI> ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>

Values are held as :class:`~decimal.Decimal` built from the digits (never a float), then
rounded *up* to integer millicores or bytes, as ``Quantity.MilliValue()`` and
``Quantity.Value()`` do.

Why not the client's ``kubernetes.utils.parse_quantity``: the core may not import the
Kubernetes client (the layering contract keeps it pure and light to load); the client
computes in Decimal's default context, 28 significant digits, so a long quantity comes
back rounded, not exact; it hands the number to ``Decimal()`` unchecked, so it accepts
what the API server rejects (``NaN``, ``Infinity``, ``1_000``) and has no bound on
exponent or length for hostile input; and it stops at a Decimal, where a decision needs
integer millicores and bytes rounded up. On what both accept, the two agree
(tests/unit/test_quantity.py checks it on generated quantities).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_CEILING, Context, Decimal
from functools import lru_cache
from typing import Final, Literal

from webhook.core.errors import QuantityError

_NUMBER: Final = re.compile(r"([+-]?)(\d*)(?:\.(\d*))?(.*)", re.DOTALL)
_EXPONENT: Final = re.compile(r"[eE]([+-]?\d+)")

_BINARY: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
# apimachinery caps exponents far below this; the cap keeps a hostile "1e999999999" from
# building a number with a billion digits.
_MAX_EXPONENT: Final = 64
_MAX_LENGTH: Final = 100
# Arithmetic context wide enough to keep every admitted quantity exact (<= 100 digits,
# exponent <= 64, times 1000 for millis).
_EXACT: Final = Context(prec=256, rounding=ROUND_CEILING)


def parse_quantity(text: object, *, where: str = "quantity") -> Decimal:
    """Parse ``text`` into an exact Decimal, or raise :class:`QuantityError`.

    ``where`` names the field for the error message, e.g. ``"node-1 allocatable.cpu"``.
    Integers are accepted too, since JSON and YAML often carry ``cpu: 2``.
    """
    if isinstance(text, bool):
        raise QuantityError(f"{where}: {text!r} is not a quantity")
    if isinstance(text, int):
        return Decimal(text)
    if isinstance(text, float) and math.isfinite(text):
        # ``cpu: 0.5`` in YAML (a JSON number), which the API server accepts too. The
        # shortest repr is the literal as written, so the value stays exact.
        text = repr(text)
    if not isinstance(text, str):
        raise QuantityError(f"{where}: {text!r} is not a quantity (expected a string)")
    s = text.strip()
    if len(s) > _MAX_LENGTH:
        raise QuantityError(f"{where}: {s[:20]!r}... is too long to be a quantity")
    match = _NUMBER.fullmatch(s)
    if not s or match is None:
        raise QuantityError(f"{where}: {text!r} is not a valid quantity")
    sign, whole, fraction, suffix = match.groups()
    if not whole and not fraction:
        raise QuantityError(f"{where}: {text!r} is not a valid quantity (no digits)")
    number = Decimal(f"{sign}{whole or '0'}.{fraction or '0'}")
    if suffix in _BINARY:
        return _EXACT.multiply(number, Decimal(_BINARY[suffix]))
    if suffix in _DECIMAL:
        return _EXACT.scaleb(number, Decimal(_DECIMAL[suffix]))
    exponent = _EXPONENT.fullmatch(suffix)
    if exponent is None:
        raise QuantityError(f"{where}: {text!r} has an unknown suffix {suffix!r}")
    power = int(exponent.group(1))
    if abs(power) > _MAX_EXPONENT:
        raise QuantityError(f"{where}: {text!r} is out of range")
    return _EXACT.scaleb(number, Decimal(power))


def _ceil(value: Decimal) -> int:
    return int(value.to_integral_value(rounding=ROUND_CEILING, context=_EXACT))


def _non_negative(value: Decimal, text: object, where: str) -> Decimal:
    if value < 0:
        raise QuantityError(f"{where}: {text!r} is negative")
    return value


#: Distinct quantity strings remembered. A cluster uses few ("100m", "256Mi", ...) and
#: every pod list and review repeats them; the bound keeps hostile input from growing it.
MEMO_SIZE: Final = 4096


def _cpu_millis(text: object, where: str) -> int:
    value = _non_negative(parse_quantity(text, where=where), text, where)
    return _ceil(_EXACT.multiply(value, Decimal(1000)))


def _memory_bytes(text: object, where: str) -> int:
    return _ceil(_non_negative(parse_quantity(text, where=where), text, where))


# Parsing through Decimal costs microseconds per value and the cache parses every pod's
# quantities, the admission path two pods' per review: remember results by text.
# lru_cache keeps no exception, so an invalid text is parsed again below and its error
# names the field.
@lru_cache(maxsize=MEMO_SIZE)
def _cpu_millis_memo(text: str) -> int:
    return _cpu_millis(text, "cpu")


@lru_cache(maxsize=MEMO_SIZE)
def _memory_bytes_memo(text: str) -> int:
    return _memory_bytes(text, "memory")


def cpu_millis(text: object, *, where: str = "cpu", field: str = "", name: str = "") -> int:
    """CPU quantity in millicores, rounded up (``"100m"`` -> 100, ``"0.0001"`` -> 1).

    An error names ``where + field + name``; the parts are joined only then, so callers
    parsing many objects pass the object, the field and the resource name apart."""
    if type(text) is str:
        try:
            return _cpu_millis_memo(text)
        except QuantityError:
            pass  # parsed again for an error message naming the field
    return _cpu_millis(text, where + field + name)


def memory_bytes(text: object, *, where: str = "memory", field: str = "", name: str = "") -> int:
    """Memory quantity in bytes, rounded up (``"1Ki"`` -> 1024, ``"100m"`` -> 1); errors
    as :func:`cpu_millis`."""
    if type(text) is str:
        try:
            return _memory_bytes_memo(text)
        except QuantityError:
            pass
    return _memory_bytes(text, where + field + name)


# Formatting is memoized too: every decision writes a handful of amounts into its
# warnings, audit annotations and log line, and a cluster's amounts repeat.
@lru_cache(maxsize=MEMO_SIZE)
def format_cpu(millis: int) -> str:
    """Shortest exact form of a CPU amount: ``6000`` -> ``"6"``, ``1500`` -> ``"1500m"``."""
    if millis % 1000 == 0:
        return str(millis // 1000)
    return f"{millis}m"


@lru_cache(maxsize=MEMO_SIZE)
def format_memory(amount: int) -> str:
    """Shortest exact binary form of a byte count: ``1073741824`` -> ``"1Gi"``."""
    if amount == 0:
        return "0"
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = _BINARY[suffix]
        if amount % unit == 0:
            return f"{amount // unit}{suffix}"
    return str(amount)


ResourceName = Literal["cpu", "memory"]
RESOURCE_NAMES: Final[tuple[ResourceName, ...]] = ("cpu", "memory")


@dataclass(frozen=True, slots=True)
class Resources:
    """CPU in millicores and memory in bytes.

    Only cpu and memory can be resized in place, so they are the only resources the
    webhook accounts for. A missing request counts as zero, as in the scheduler. A value:
    ``+``, ``-`` and :meth:`max` make new amounts; there is no ordering, because "less"
    between two resources is a question of :meth:`fits_in`.
    """

    cpu: int = 0
    memory: int = 0

    def __add__(self, other: Resources) -> Resources:
        return Resources(self.cpu + other.cpu, self.memory + other.memory)

    def __sub__(self, other: Resources) -> Resources:
        return Resources(self.cpu - other.cpu, self.memory - other.memory)

    def max(self, other: Resources) -> Resources:
        """Per-resource maximum."""
        return Resources(max(self.cpu, other.cpu), max(self.memory, other.memory))

    def clamp(self) -> Resources:
        """Negative components raised to zero."""
        return Resources(max(self.cpu, 0), max(self.memory, 0))

    def get(self, name: ResourceName) -> int:
        return self.cpu if name == "cpu" else self.memory

    def replace(self, name: ResourceName, value: int) -> Resources:
        return Resources(value, self.memory) if name == "cpu" else Resources(self.cpu, value)

    def fits_in(self, capacity: Resources) -> bool:
        """True when every component is at most the capacity's."""
        return self.cpu <= capacity.cpu and self.memory <= capacity.memory

    def exceeds_in(self, capacity: Resources) -> tuple[ResourceName, ...]:
        """The resources in which this amount is larger than ``capacity``."""
        return tuple(n for n in RESOURCE_NAMES if self.get(n) > capacity.get(n))

    def is_zero(self) -> bool:
        return self.cpu == 0 and self.memory == 0

    def describe(self) -> str:
        """Human form, e.g. ``cpu 6, memory 1Gi``."""
        return f"cpu {format_cpu(self.cpu)}, memory {format_memory(self.memory)}"


ZERO: Final = Resources()


def format_amount(name: ResourceName, value: int) -> str:
    """One resource amount in Kubernetes notation (``6``, ``1500m``, ``512Mi``)."""
    if value < 0:
        return "-" + format_amount(name, -value)
    return format_cpu(value) if name == "cpu" else format_memory(value)


def amounts_text(r: Resources, between: str = " ", of: Resources | None = None) -> str:
    """The amounts of ``r`` for a message, e.g. ``cpu 500m, memory 1Gi``: of each resource
    non-zero in ``of`` (default: in ``r``), ``between`` going between name and amount."""
    which = r if of is None else of
    parts = [f"{n}{between}{format_amount(n, r.get(n))}" for n in RESOURCE_NAMES if which.get(n)]
    return ", ".join(parts)


def total(amounts: Iterable[Resources]) -> Resources:
    """Sum of an iterable of :class:`Resources`."""
    cpu = memory = 0
    for amount in amounts:
        cpu += amount.cpu
        memory += amount.memory
    return Resources(cpu, memory)
