"""Plans as people and programs read them: JSON, a short report, kubectl warnings."""

from __future__ import annotations

from typing import Any, Final

from webhook.core.lending import Loan
from webhook.core.plan import Plan
from webhook.core.resources import RESOURCE_NAMES, amounts_text, format_amount

#: The API server cuts warnings at 256 characters; kubectl users read ~120 at a glance.
WARNING_LIMIT: Final = 120


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The ``plan -o json`` contract: one object, quantities in Kubernetes notation."""
    resources: dict[str, dict[str, str]] = {}
    for name, f in (plan.figures or {}).items():
        resources[name] = {
            "requested": format_amount(name, f.requested),
            "inUse": format_amount(name, f.in_use),
            "freeing": format_amount(name, f.freeing),
            "allocatable": format_amount(name, f.allocatable),
            "shortfall": format_amount(name, f.shortfall),
            "unmet": format_amount(name, f.unmet),
        }
    data: dict[str, Any] = {
        "pod": plan.pod.key,
        "node": plan.node,
        "verdict": plan.verdict,
        "code": plan.code,
        "victims": list(plan.victim_keys),
        "reason": plan.reason,
        "resources": resources,
        "waitingFor": [ref.key for ref in plan.waiting_for],
        "loans": [
            {
                "pod": loan.pod.key,
                "container": loan.container,
                "resource": loan.resource,
                "from": format_amount(loan.resource, loan.before),
                "to": format_amount(loan.resource, loan.after),
            }
            for loan in plan.loans
        ],
        "floorErrors": [{"pod": ref.key, "error": error} for ref, error in plan.floor_errors],
    }
    pauses = victim_pauses(plan)
    if pauses:
        # Only when a victim asked to be checkpointed: other plans keep the form they had.
        data["checkpoints"] = pauses
    moves = victim_moves(plan)
    if moves:
        # Only with victim order movable-first: upstream's plans keep the form they had.
        data["moves"] = moves
    return data


def victim_moves(plan: Plan) -> list[dict[str, Any]]:
    """Where each victim's work would go, for the victims whose move was judged (victim
    order movable-first only): the ``moves`` field of ``plan -o json`` and of the
    decision log alike."""
    return [
        {"pod": v.pod.key, "movable": v.move.movable, "why": v.move.why, "node": v.move.node}
        for v in plan.victims
        if v.move is not None
    ]


def victim_pauses(plan: Plan) -> list[dict[str, Any]]:
    """Whether each victim that asked to be checkpointed will be, and why."""
    return [
        {"pod": v.pod.key, "checkpoint": v.pause.checkpoint, "why": v.pause.why}
        for v in plan.victims
        if v.pause is not None
    ]


def _pausing(plan: Plan, enforcing: bool) -> str:
    """``checkpointing 1 of them, restored when room returns: team-b/low``"""
    paused = [v.pod.key for v in plan.victims if v.pause is not None and v.pause.checkpoint]
    verb = "checkpointing" if enforcing else "would checkpoint"
    return f"{verb} {len(paused)} of them, restored when room returns: {', '.join(paused)}"


def _change(loan: Loan) -> str:
    """``cpu 3->1``: a loan as a warning names it."""
    r = loan.resource
    return f"{r} {format_amount(r, loan.before)}->{format_amount(r, loan.after)}"


def human_report(plan: Plan) -> str:
    """A few lines a person reads at a glance."""
    lines = [f"{plan.verdict}: {plan.reason}", f"pod {plan.pod.key} on {plan.node or '-'}", ""]
    header = ("resource", "requested", "in use", "freeing", "allocatable", "shortfall")
    rows: list[tuple[str, ...]] = [header]
    for name in RESOURCE_NAMES:
        f = (plan.figures or {}).get(name)
        if f is None:
            continue
        rows.append(
            (
                name,
                *(
                    format_amount(name, v)
                    for v in (f.requested, f.in_use, f.freeing, f.allocatable, f.shortfall)
                ),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if plan.victims:
        lines += ["", "victims, in eviction order:"]
        for v in plan.victims:
            line = f"  {v.pod.key}  priority {v.priority}  frees {v.frees.describe()}"
            if v.move is not None:
                line += f"  {'moves' if v.move.movable else 'lost'}: {v.move.why}"
            if v.pause is not None:
                line += (
                    f"  {'checkpoint' if v.pause.checkpoint else 'no checkpoint'}: {v.pause.why}"
                )
            lines.append(line)
    if plan.loans:
        lines += ["", "loans, in the order taken:"]
        for loan in plan.loans:
            limits = ", limit too" if loan.limits else ""
            lines.append(
                f"  {loan.pod.key}  priority {loan.priority}  container {loan.container}  "
                f"{_change(loan)}{limits}  frees {loan.resource} "
                f"{format_amount(loan.resource, loan.frees)}"
            )
    if plan.floor_errors:
        lines += ["", "floor annotations not used (these pods lend nothing):"]
        lines += [f"  {ref.key}: {error}" for ref, error in plan.floor_errors]
    if plan.waiting_for:
        lines += ["", "already leaving: " + ", ".join(r.key for r in plan.waiting_for)]
    return "\n".join(lines)


def _borrowing(plan: Plan, enforcing: bool) -> str:
    """``borrowing cpu 2 from 1 lower-priority pod on node-1: default/batch-1 (cpu 3->1)``"""
    changes: dict[str, list[str]] = {}
    for loan in plan.loans:
        changes.setdefault(loan.pod.key, []).append(_change(loan))
    count = len(changes)
    verb = "borrowing" if enforcing else "would borrow"
    lenders = ", ".join(f"{key} ({', '.join(c)})" for key, c in changes.items())
    return (
        f"{verb} {amounts_text(plan.lent)} from {count} lower-priority "
        f"pod{'s' if count != 1 else ''} on {plan.node}: {lenders}"
    )


def deferred_note(plan: Plan) -> str:
    """The note of the event on a pod whose deferred resize was planned with victims: its
    victims, and its lenders as the kubectl warning names them (cpu 3->1)."""
    told = [f"{plan.reason}: {', '.join(plan.victim_keys)}"] if plan.victims else []
    if plan.loans:
        told.append(warnings_for(plan)[-1])
    return "Deferred resize: " + "; ".join(told or [plan.reason])


def clip(text: str, limit: int = WARNING_LIMIT) -> str:
    """One line of at most ``limit`` characters (the API server rejects newlines)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def warnings_for(plan: Plan, *, enforcing: bool = True) -> list[str]:
    """kubectl warnings for a plan; each one line of at most :data:`WARNING_LIMIT`."""
    if plan.verdict == "preempt":
        out = []
        if plan.victims:
            names = ", ".join(plan.victim_keys)
            verb = "preempting" if enforcing else "would preempt"
            count = len(plan.victims)
            # What the resize asks for, of each resource it is short of.
            wanted = amounts_text(plan.requested, of=plan.shortfall)
            out.append(
                clip(
                    f"{verb} {count} lower-priority pod{'s' if count != 1 else ''} on "
                    f"{plan.node} for {wanted}: {names}"
                )
            )
            if any(v.pause is not None and v.pause.checkpoint for v in plan.victims):
                out.append(clip(_pausing(plan, enforcing)))
        if plan.loans:
            out.append(clip(_borrowing(plan, enforcing)))
        return out
    if plan.verdict == "infeasible":
        return [clip(plan.reason)]
    if plan.verdict == "not-eligible" and plan.code in (
        "preemption-policy-never",
        "preemptor-not-allowed",
        "node-opted-out",
    ):
        return [clip(f"resize will wait on {plan.node}: {plan.reason}")]
    if plan.code == "fits-once-terminated":
        return [clip(plan.reason)]
    # ``admitted`` says nothing: the API server sends a review again, under a new uid, when
    # its update of the pod meets a conflict, and the answer of one request must read as
    # the first review's alone (the decision log keeps the reason).
    return []
