"""The two resizable resources, as exact integers."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Literal

from webhook.core.quantity import format_cpu, format_memory

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
