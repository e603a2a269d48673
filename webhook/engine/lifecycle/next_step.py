"""What the worker does next with an admitted resize (:func:`next_action`), decided from
the entry's phase and its loans' states, and the re-plan on fresh state it makes the room
with (:func:`replan`, the node's pods as the ledger's loans leave them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from webhook.base.settings import Config
from webhook.core.lending import (
    Loan,
    loan_key,
    loan_state,
    loans_by_lender,
    lowered,
    owed_back,
    refused,
    unlendable,
)
from webhook.core.model import DisruptionBudget, Node, PdbMode, Pod, PodRef
from webhook.core.plan import NodePods, Plan, plan_resize
from webhook.core.policy import ImportanceKey, PreemptionPolicy
from webhook.core.resources import ZERO
from webhook.engine.ledger import LedgerEntry
from webhook.engine.lifecycle.states import (
    EntryPhase,
    entry_phase,
    owes_lender,
    room_holders,
    to_lend,
)

ReleaseReason = Literal[
    "expired",
    "pod-gone",
    "not-persisted",
    "superseded",
    "actuated",
    "infeasible-resize",
    "not-eligible",
    "replan",
    "disallowed",
]
WaitReason = Literal["not-persisted-yet", "node-unknown", "cannot-fit", "actuating"]


#: Which rule an entry broke (:func:`disallowed`): the label of
#: ``resize_preemption_entries_disallowed_total``.
Rule = Literal["node", "preemptor-policy", "victim-policy", "lending"]


@dataclass(frozen=True, slots=True)
class Release:
    """The entry holds nothing any more; evict nobody (more). ``write``: readers still
    count it (the pod is gone from the cache, or the plan was given up on), so the worker
    removes it from the ledger; otherwise it is left for the next write to drop."""

    reason: ReleaseReason
    detail: str
    write: bool = False
    #: For ``disallowed``: the rule the entry broke.
    rule: Rule | None = None


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to evict now. ``settle``: pending victims found leaving (nothing to do for
    them)."""

    reason: WaitReason
    detail: str
    settle: tuple[PodRef, ...] = ()


@dataclass(frozen=True, slots=True)
class Act:
    """Make the room.

    ``settle``: pending victims already terminating, terminal or gone - nothing to do,
    no API call. ``drop``: pending victims the fresh plan no longer needs - take them off
    the entry (a ledger write) so its reservation stops claiming them. ``evict``: victims
    to act on, in the entry's order. ``evict`` may be empty (the resize fits now; the
    entry holds room until the kubelet actuates it or it expires). ``lend``: the entry's
    loans still pending, in the order taken; made before any eviction (a loan is actuated
    at once, an eviction waits out a grace period).
    """

    plan: Plan
    evict: tuple[PodRef, ...] = ()
    settle: tuple[PodRef, ...] = ()
    drop: tuple[PodRef, ...] = ()
    lend: tuple[Loan, ...] = ()


@dataclass(frozen=True, slots=True)
class Refuse:
    """The kubelet refused ``loans`` (it will not actuate them): record them in the entry
    as refused and replace the rest of its plan with ``plan``, made again without their
    lenders, within the same reservation (:func:`refuse`). ``plan`` is ``None`` when no
    plan makes room without them: the refusal is recorded and the usual rules decide on
    the next pass (wait, or release for a fresh plan). ``why`` is the kubelet's message.
    Each refused loan is put back (:func:`to_put_back`)."""

    loans: tuple[Loan, ...]
    plan: Plan | None
    why: str


Action = Release | Wait | Act | Refuse


@dataclass(frozen=True, slots=True)
class ListedOnly:
    """A :class:`PreemptionPolicy` that only lets the given pod uids be victims and takes
    nothing more from lenders: a re-plan never evicts or borrows beyond what was admitted.

    Wraps the configured policy, so protected namespaces and ranking still apply.
    """

    base: PreemptionPolicy
    allowed: frozenset[str]

    @property
    def pdb_mode(self) -> PdbMode:
        return self.base.pdb_mode

    @property
    def max_victims(self) -> int | None:
        return self.base.max_victims

    @property
    def lending(self) -> bool:
        return False

    @property
    def lend_memory_limits(self) -> bool:
        return False

    def may_preempt(self, victim: Pod, preemptor: Pod) -> bool:
        return victim.uid in self.allowed and self.base.may_preempt(victim, preemptor)

    def importance(self, pod: Pod, now: float) -> ImportanceKey:
        return self.base.importance(pod, now)


@dataclass(frozen=True, slots=True)
class Scene:
    """What one decision on an entry reads: its pod as cached by name (``None``: not
    cached), its node, the node's pods and budgets, the node's other entries holding room,
    the time and the settings."""

    entry: LedgerEntry
    pod: Pod | None
    node: Node | None
    pods: Sequence[Pod]
    budgets: Sequence[DisruptionBudget]
    others: tuple[LedgerEntry, ...]
    now: float
    config: Config
    #: The labels of the resizing pod's namespace (``None``: not known).
    labels: Mapping[str, str] | None = None

    def victims(self) -> tuple[tuple[PodRef, ...], tuple[PodRef, ...]]:
        """The entry's pending victims, (live, leaving): leaving when handled by any
        entry, terminating, terminal or gone."""
        handled = self.handled()
        by_uid = {p.uid: p for p in self.pods if p.node == self.entry.node}
        live: list[PodRef] = []
        leaving: list[PodRef] = []
        for v in self.entry.pending_victims:
            pod = by_uid.get(v.uid)
            gone = v.uid in handled or pod is None or pod.leaving
            (leaving if gone else live).append(v)
        return tuple(live), tuple(leaving)

    def handled(self) -> frozenset[str]:
        """Victims any entry already handled: on their way out even if the cache has not
        seen their deletion yet."""
        return frozenset(self.entry.handled).union(*(o.handled for o in self.others))


def next_action(
    entry: LedgerEntry,
    pod: Pod | None,
    node: Node | None,
    pods: Sequence[Pod],
    *,
    now: float,
    config: Config,
    budgets: Sequence[DisruptionBudget] = (),
    others: Iterable[LedgerEntry] = (),
    labels: Mapping[str, str] | None = None,
) -> Action:
    """What the worker does next with ``entry``, by its :func:`entry_phase`; pure.

    ``pod`` is the resizing pod as cached (looked up by namespace/name; ``None`` when not
    cached); ``node`` its node; ``pods`` the pods bound to ``entry.node``; ``others`` the
    node's other ledger entries (those holding room count, this entry's own does not);
    ``labels`` those of the pod's namespace (``None``: not known).

    1. released: expired, pod gone or leaving (:func:`_gone`); disallowed: the cache and
       the settings do not bear the entry out (:func:`_disallowed`);
    2. admitted: wait for the resize to persist, at most ``persist_timeout``
       (:func:`_until_persisted`);
    3. a loan the kubelet refused is recorded with a plan made again without its lender
       (:func:`_refusal`);
    4. actuated, or marked Infeasible: released (:func:`_done`);
    5. persisted: make the room (:func:`_making_room`).
    """
    held = room_holders((o for o in others if o.review_uid != entry.review_uid), pods, now)
    scene = Scene(entry, pod, node, pods, budgets, held, now, config, labels)
    now_in = entry_phase(entry, pod, now)
    return (
        _gone(scene, now_in)
        or _disallowed(scene)
        or _until_persisted(scene, now_in)
        or _refusal(scene)
        or _done(scene, now_in)
        or _making_room(scene)
    )


def _gone(s: Scene, now_in: EntryPhase) -> Release | None:
    """1. An expired reservation protects nothing any more; nor does one whose pod is gone,
    replaced or leaving. Only a pod the cache no longer has needs the entry removed: a
    reservation of a pod not seen is kept by every reader (the cache may lag)."""
    entry = s.entry
    if now_in.why == "expired":
        return Release("expired", f"reservation expired {s.now - entry.deadline:.1f}s ago")
    if now_in.why == "unseen":
        return Release("pod-gone", f"pod {entry.pod.key} no longer exists", write=True)
    if now_in.why == "replaced":
        assert s.pod is not None
        detail = f"pod {entry.pod.key} was replaced (uid {s.pod.uid})"
        return Release("pod-gone", detail, write=True)
    if now_in.why == "pod-leaving":
        return Release("pod-gone", f"pod {entry.pod.key} is terminating or finished")
    return None


def _disallowed(s: Scene) -> Release | None:
    """1b. Whoever wrote an entry - this service, a replica with other settings, anyone
    with rights on the node's Lease - it is acted on only as the cache and this service's
    own settings allow (:func:`disallowed`); one they do not bear out is removed."""
    assert s.pod is not None  # released by _gone otherwise
    found = disallowed(s.entry, s.pod, s.pods, s.config, s.labels)
    if found is None:
        return None
    return Release("disallowed", found.detail, write=True, rule=found.rule)


class Disallowed(NamedTuple):
    rule: Rule
    detail: str


def disallowed(
    entry: LedgerEntry,
    pod: Pod,
    pods: Sequence[Pod],
    config: Config,
    labels: Mapping[str, str] | None,
) -> Disallowed | None:
    """Which rule of the settings and the cache ``entry`` breaks for ``pod`` (its
    resizing pod as cached) on its node, whose cached pods are ``pods``; ``None`` when
    none. Judged before every step, so a setting changed since the admission, or an
    entry this service never wrote, takes nothing:

    - ``node``: the pod runs on the entry's node;
    - ``preemptor-policy``: an entry taking from others (victims, loans to make) is the
      preemptor policy's to allow (namespace selector, minimum priority);
    - ``victim-policy``: no pending victim or lender is one the victim policy keeps out
      (a protected namespace);
    - ``lending``: lending is on, and every loan still to make is one the lender's
      floors allow (:func:`~webhook.core.lending.unlendable`).

    That the resize is the pod's persisted one is :func:`entry_phase`'s to say."""
    if pod.node != entry.node:
        return Disallowed(
            "node", f"pod {pod.key} runs on {pod.node or 'no node'}, not {entry.node}"
        )
    by_uid = {p.uid: p for p in pods}
    lends = to_lend(entry, pods)
    refs = (*entry.pending_victims, *(loan.pod for loan in lends))
    taken = [p for p in (by_uid.get(r.uid) for r in refs) if p is not None and not p.leaving]
    if taken and (refusal := config.preemptors().refusal(pod, labels)):
        return Disallowed("preemptor-policy", refusal)
    policy = config.policy()
    for p in taken:
        if not policy.may_preempt(p, pod):
            return Disallowed("victim-policy", f"{p.key} may not give up room for {pod.key}")
    if lends and not policy.lending:
        return Disallowed("lending", "lending is off")
    for loan in lends:
        why = unlendable(loan, by_uid.get(loan.pod.uid), pod, limits=policy.lend_memory_limits)
        if why:
            return Disallowed("lending", why)
    return None


def _until_persisted(s: Scene, now_in: EntryPhase) -> Release | Wait | None:
    """2. Wait until the resize is in the pod's spec; another spec at a later generation
    (or, for an entry written persisted, any other spec) superseded it."""
    if now_in.why not in ("not-persisted-yet", "superseded", "not-persisted"):
        return None
    entry, config = s.entry, s.config
    later = now_in.why == "superseded"
    if entry.persisted or later:
        # Readers see a later generation themselves; without one, the worker removes it.
        detail = "the pod's spec changed again after the resize"
        return Release("superseded", detail, write=not later)
    deadline = entry.admitted_at + config.persist_timeout
    if s.now >= deadline:
        # Written unless the entry carries its own deadline, which every reader applies.
        detail = f"resize not in the pod's spec {config.persist_timeout:g}s after admission"
        return Release("not-persisted", detail, write=not entry.persist_by)
    return Wait("not-persisted-yet", "waiting for the resize to persist")


def _refusal(s: Scene) -> Refuse | None:
    """3. Loans of the entry the kubelet refused (:func:`webhook.core.lending.refused`: a
    memory limit below what the container uses), with the plan made again without their
    lenders - every candidate may go and any other lender lend, the refused lender
    counted at what it is owed and the borrower at nothing. Checked before anything else
    once the resize is persisted: once recorded, each is put back whatever happens next."""
    entry = s.entry
    if not entry.loans:
        return None
    cached = {p.uid: p for p in s.pods}
    refusing = tuple(loan for loan in entry.loans if refused(loan, cached.get(loan.pod.uid)))
    if not refusing:
        return None
    why = cached[refusing[0].pod.uid].resize_error
    if s.node is None:
        return Refuse(refusing, None, why)
    gone = {loan_key(loan) for loan in refusing}
    rest = replace(entry, loans=tuple(lo for lo in entry.loans if loan_key(lo) not in gone))
    plan = replan(replace(s, entry=rest), refusing, listed=False)
    keep = plan if plan.verdict in ("fits", "preempt") and plan.code != "no-growth" else None
    return Refuse(refusing, keep, why)


def _done(s: Scene, now_in: EntryPhase) -> Release | Wait | None:
    """4. Done (actuated), or the kubelet will never do it (Infeasible). A resize the
    kubelet actuated on a loan it then refused is not done while that lender waits for its
    room back: the entry makes that room, as it made the borrower's."""
    if now_in.state == "actuated" and not (
        s.entry.refused and owes_lender(s.entry, {p.uid: p for p in s.pods})
    ):
        return Release("actuated", "the kubelet allocated the new requests")
    if now_in.why == "infeasible-resize":
        return Release("infeasible-resize", "the kubelet marked the resize Infeasible")
    if s.node is None:
        return Wait("node-unknown", f"node {s.entry.node} not in the cache")
    return None


def _making_room(s: Scene) -> Action:
    """5. Plan again on fresh state, restricted to the entry's own pending victims: the
    worker never evicts a pod the entry does not name, and evicts fewer when room
    appeared."""
    live, settle = s.victims()
    plan = replan(s, (), listed=True)
    lend = to_lend(s.entry, s.pods)
    if plan.code == "no-growth":
        # Judged by its code, whatever verdict the core gives it: the kubelet is catching
        # up, and the entry's victims stay claimed until it has.
        return Wait("actuating", plan.reason, settle=settle)
    if plan.verdict == "fits":
        # The loans are part of the room the resize fits in; only victims can go unneeded.
        return Act(plan, settle=settle, drop=live, lend=lend)
    if plan.verdict == "preempt":
        needed = {v.pod.uid for v in plan.victims}
        evict = tuple(v for v in live if v.uid in needed)
        drop = tuple(v for v in live if v.uid not in needed)
        return Act(plan, evict=evict, settle=settle, drop=drop, lend=lend)
    if plan.verdict == "infeasible":
        assert s.pod is not None
        if s.pod.resize == "deferred":
            # The listed victims are not enough any more and the kubelet has given up for
            # now; holding the room until expiry would only delay the resize. The
            # reconciler re-plans it from scratch (same core, same ledger).
            detail = f"the admitted victims no longer suffice: {plan.reason}"
            return Release("replan", detail, write=True)
        return Wait("cannot-fit", plan.reason, settle=settle)
    return Release("not-eligible", plan.reason, write=True)


def replan(s: Scene, refusing: tuple[Loan, ...], *, listed: bool) -> Plan:
    """The entry's resize planned on fresh state: handled victims as leaving, and the
    node's pods as the ledger's loans leave them (:func:`as_lent`).
    ``listed``: only the entry's own live pending victims may go and nothing more is
    borrowed; otherwise any candidate may, and any lender lend (a plan made again after a
    refusal, ``refusing`` the loans refused)."""
    assert s.pod is not None and s.node is not None
    handled = s.handled()
    pods = tuple(
        replace(p, terminating=True) if p.uid in handled and not p.terminating else p
        for p in s.pods
    )
    pods = as_lent(pods, s.entry, s.others, refusing)
    old = borrower(s.pod, s.entry, s.pods, refusing)
    policy: PreemptionPolicy = s.config.policy()
    if listed:
        policy = ListedOnly(policy, frozenset(v.uid for v in s.victims()[0]))
    return plan_resize(
        old,
        s.pod,
        NodePods(s.node, pods),
        now=s.now,
        budgets=s.budgets,
        reservations=[o.reservation() for o in s.others],
        policy=policy,
    )


# -- the pods as the loans leave them (a re-plan's view) -------------------------------------


def with_loans(pods: Sequence[Pod], loans: Iterable[Loan]) -> tuple[Pod, ...]:
    """``pods`` with every loan not void counted as actuated: the room it frees is
    spoken for by the resize that borrowed it, as a claimed victim's is."""
    by_lender = loans_by_lender(loans)
    out = []
    for p in pods:
        for loan in by_lender.get(p.uid, ()):
            state = loan_state(loan, p)
            if state != "void":
                request = p.container(loan.container)
                amount = loan.after
                if state == "lent" and request is not None:
                    amount = request.requests.get(loan.resource)
                p = lowered(p, loan.container, loan.resource, amount)
        out.append(p)
    return tuple(out)


def as_lent(
    pods: Sequence[Pod],
    entry: LedgerEntry,
    others: Sequence[LedgerEntry],
    refusing: tuple[Loan, ...] = (),
) -> tuple[Pod, ...]:
    """The node's ``pods`` as a re-plan of ``entry`` sees them: every loan of the node's
    entries not void counted as made (so none is planned twice), and the lenders of
    refused loans (the entry's and ``refusing``) counted at what they are owed, lending
    nothing. Without any loan, ``pods`` as they are."""
    refusals = entry.refused + refusing
    if not refusals and not entry.loans and not any(o.loans for o in others):
        return tuple(pods)
    view = with_loans(pods, (loan for e in (entry, *others) for loan in e.loans))
    view = owed_back(view, refusals)
    lenders = frozenset(loan.pod.uid for loan in refusals)
    return tuple(replace(p, floors=()) if p.uid in lenders and p.floors else p for p in view)


def borrower(
    pod: Pod, entry: LedgerEntry, pods: Sequence[Pod], refusing: tuple[Loan, ...] = ()
) -> Pod:
    """The resizing ``pod`` as a re-plan counts it: as if it held nothing yet while a
    refused lender is owed room (the kubelet may have admitted it on that loan: it holds
    room that is not there), else as cached."""
    if not refusing and not (entry.refused and owes_lender(entry, {p.uid: p for p in pods})):
        return pod
    return replace(
        pod.with_containers(
            tuple(replace(c, requests=ZERO) for c in pod.containers),
            tuple(replace(c, requests=ZERO) for c in pod.init_containers),
        ),
        statuses={},
        pod_allocated=None,
        pod_actual=None,
        pod_requests=ZERO,
        overhead=ZERO,
    )
