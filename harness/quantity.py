"""Kubernetes resource quantities ("500m", "1Gi", "1e3") as exact numbers.

Only what the harness needs: parsing to an exact :class:`~fractions.Fraction` and the
two integer views the kubelet uses, ``MilliValue()`` for CPU and ``Value()`` for memory,
both rounded up like ``resource.Quantity`` does.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

_SUFFIXES: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}
_PATTERN = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)


def parse(text: str | int | float) -> Fraction:
    """Parse a quantity string; raises ValueError when it is not one."""
    if isinstance(text, int | float):
        return Fraction(text)
    match = _PATTERN.match(text.strip())
    if match is None:
        raise ValueError(f"not a resource quantity: {text!r}")
    number, exponent, suffix = match.groups()
    value = Fraction(number)
    if exponent:
        return value * Fraction(10) ** int(exponent[1:])
    return value * _SUFFIXES[suffix or ""]


def milli_value(text: str | int | float) -> int:
    """CPU in millicores, rounded up (``Quantity.MilliValue``)."""
    return math.ceil(parse(text) * 1000)


def value(text: str | int | float) -> int:
    """The integer value, rounded up (``Quantity.Value``): bytes for memory."""
    return math.ceil(parse(text))


def format_cpu(millis: int) -> str:
    """Millicores in the API's canonical form: "2" for 2000, "500m" for 500."""
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def format_bytes(amount: int) -> str:
    """Bytes in the API's canonical binary form when exact ("1Gi"), else plain."""
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        unit = int(_SUFFIXES[suffix])
        if amount and amount % unit == 0:
            return f"{amount // unit}{suffix}"
    return str(amount)
