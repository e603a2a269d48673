"""The two resizable resources, as exact integers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal, NamedTuple

from webhook.core.quantity import format_cpu, format_memory

ResourceName = Literal["cpu", "memory"]
RESOURCE_NAMES: Final[tuple[ResourceName, ...]] = ("cpu", "memory")

#: ``tupletuple_new(Resources, (cpu, memory))`` builds a NamedTuple of the core in one C call,
#: where calling the class first runs its generated Python ``__new__``; the hot paths of
#: a decision, which builds about thirty of them, use it. Every field must be given.
tuple_new: Final = tuple.__new__


class Resources(NamedTuple):
    """CPU in millicores and memory in bytes.

    Only cpu and memory can be resized in place, so they are the only resources the
    webhook accounts for. A missing request counts as zero, as in the scheduler.

    An immutable value like the frozen dataclasses elsewhere, but a tuple: a decision
    builds dozens of amounts, and a frozen dataclass sets each field through
    ``object.__setattr__`` (see :data:`tuple_new`; figures in docs/service.md). Only the
    arithmetic below is defined: ``+`` adds amounts, it does not concatenate.
    """

    cpu: int = 0
    memory: int = 0

    def __add__(self, other: Resources) -> Resources:  # type: ignore[override]
        return tuple_new(Resources, (self.cpu + other.cpu, self.memory + other.memory))

    def __sub__(self, other: Resources) -> Resources:
        return tuple_new(Resources, (self.cpu - other.cpu, self.memory - other.memory))

    def max(self, other: Resources) -> Resources:
        """Per-resource maximum."""
        return tuple_new(Resources, (max(self.cpu, other.cpu), max(self.memory, other.memory)))

    def clamp(self) -> Resources:
        """Negative components raised to zero."""
        return tuple_new(Resources, (max(self.cpu, 0), max(self.memory, 0)))

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


def amounts_text(r: Resources, between: str = " ", of: Resources | None = None) -> str:
    """The amounts of ``r`` for a message, e.g. ``cpu 500m, memory 1Gi``: of each resource
    non-zero in ``of`` (default: in ``r``), ``between`` going between name and amount."""
    which = r if of is None else of
    cpu = f"cpu{between}{format_amount('cpu', r.cpu)}" if which.cpu else ""
    memory = f"memory{between}{format_amount('memory', r.memory)}" if which.memory else ""
    return f"{cpu}, {memory}" if cpu and memory else cpu or memory


def total(amounts: Iterable[Resources]) -> Resources:
    """Sum of an iterable of :class:`Resources`."""
    cpu = memory = 0
    for amount in amounts:
        cpu += amount.cpu
        memory += amount.memory
    return tuple_new(Resources, (cpu, memory))
