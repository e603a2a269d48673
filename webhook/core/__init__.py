"""The pure decision core: quantities, accounting, headroom, victims and loans, the Plan.

No I/O, no clock reads, no web or Kubernetes client imports (an import-linter contract
keeps it so). Everything here is a function of its arguments.
"""

from webhook.core.lending import Loan
from webhook.core.model import DisruptionBudget, Floor, Node, Pod, PodRef, PriorityClass
from webhook.core.plan import Plan, ResourceFigures, Verdict, Victim, plan_resize
from webhook.core.policy import DefaultPolicy, PreemptionPolicy
from webhook.core.reservation import Reservation
from webhook.core.resources import Resources

__all__ = [
    "DefaultPolicy",
    "DisruptionBudget",
    "Floor",
    "Loan",
    "Node",
    "Plan",
    "Pod",
    "PodRef",
    "PreemptionPolicy",
    "PriorityClass",
    "Reservation",
    "ResourceFigures",
    "Resources",
    "Verdict",
    "Victim",
    "plan_resize",
]
