"""The two resizable resources, as exact integers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal, NamedTuple

from webhook.core.quantity import format_cpu, format_memory

ResourceName = Literal["cpu", "memory"]
RESOURCE_NAMES: Final[tuple[ResourceName, ...]] = ("cpu", "memory")

#: ``_new(Resources, (cpu, memory))``: an amount built in one C call, where calling the
#: NamedTuple first runs its generated Python ``__new__`` (twice the cost); the planner
#: builds a few dozen amounts per decision.
_new: Final = tuple.__new__


class Resources(NamedTuple):
    """CPU in millicores and memory in bytes.

    Only cpu and memory can be resized in place, so they are the only resources the
    webhook accounts for. A missing request counts as zero, as in the scheduler.

    An immutable value like the frozen dataclasses elsewhere, but a tuple: a decision
    builds about fifteen of them, and a tuple is built in one call where a frozen
    dataclass sets each field through ``object.__setattr__`` (three times the cost).
    Only the arithmetic below is defined: ``+`` adds amounts, it does not concatenate.
    """

    cpu: int = 0
    memory: int = 0

    def __add__(self, other: Resources) -> Resources:  # type: ignore[override]
        return _new(Resources, (self.cpu + other.cpu, self.memory + other.memory))

    def __sub__(self, other: Resources) -> Resources:
        return _new(Resources, (self.cpu - other.cpu, self.memory - other.memory))

    def max(self, other: Resources) -> Resources:
        """Per-resource maximum."""
        return _new(Resources, (max(self.cpu, other.cpu), max(self.memory, other.memory)))

    def clamp(self) -> Resources:
        """Negative components raised to zero."""
        return _new(Resources, (max(self.cpu, 0), max(self.memory, 0)))

    def get(self, name: ResourceName) -> int:
        return self.cpu if name == "cpu" else self.memory

    def replace(self, name: ResourceName, value: int) -> Resources:
        return Resources(value, self.memory) if name == "cpu" else Resources(self.cpu, value)

    def fits_in(self, capacity: Resources) -> bool:
        """True when every component is at most the capacity's."""
        return self.cpu <= capacity.cpu and self.memory <= capacity.memory

    def exceeds_in(self, capacity: Resources) -> tuple[ResourceName, ...]:
        """The resources in which this amount is larger than ``capacity``."""
        if self.cpu > capacity.cpu:
            return _BOTH if self.memory > capacity.memory else _CPU
        return _MEMORY if self.memory > capacity.memory else ()

    def is_zero(self) -> bool:
        return self.cpu == 0 and self.memory == 0

    def describe(self) -> str:
        """Human form, e.g. ``cpu 6, memory 1Gi``."""
        return f"cpu {format_cpu(self.cpu)}, memory {format_memory(self.memory)}"


ZERO: Final = Resources()
_BOTH: Final[tuple[ResourceName, ...]] = RESOURCE_NAMES
_CPU: Final[tuple[ResourceName, ...]] = ("cpu",)
_MEMORY: Final[tuple[ResourceName, ...]] = ("memory",)


def format_amount(name: ResourceName, value: int) -> str:
    """One resource amount in Kubernetes notation (``6``, ``1500m``, ``512Mi``)."""
    if value < 0:
        return "-" + format_amount(name, -value)
    return format_cpu(value) if name == "cpu" else format_memory(value)


def total(amounts: Iterable[Resources]) -> Resources:
    """Sum of an iterable of :class:`Resources`."""
    cpu = memory = 0
    for amount in amounts:
        cpu += amount.cpu
        memory += amount.memory
    return _new(Resources, (cpu, memory))
