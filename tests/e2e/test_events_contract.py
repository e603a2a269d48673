"""The resizing pod's event ports' contract (:class:`~webhook.engine.ledger.PreemptionEvents`
and :class:`~webhook.engine.follow.MoveEvents`), one suite for the double and the recorder.

Every test here runs twice, through the ``subject`` fixture: on
:class:`harness.doubles.FakeEvents` over a :class:`~webhook.engine.memory.FixedClusterView`
of objects kept in memory ("fixed"), and on :class:`webhook.kube.events.EventRecorder`
against the real API server ("cache"), whose events are read back from it. Together they
prove that a recorder:

* tells the resizing pod, and returns ``True``, that its plan was abandoned (naming the
  node and the victims left alone, none included), that a victim's work moved (victim,
  replacement, node), or that it did not (victim, why); tells a victim it was
  checkpointed, or why not, and a restored pod that it was
  (:class:`~webhook.engine.pauses.PauseEvents`);
* returns ``False``, and raises nothing, for a pod in a namespace that does not exist
  and when its API server cannot be reached.

``-k fixed`` runs the double's half without a control plane.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.doubles import FakeEvents
from tests.e2e.contract_world import MemoryWorld, World, make_world, unreachable_kubeconfig
from webhook.core.model import PodRef

NODE = "node-of-the-victims"

#: What a recorder told, as the double keeps it: ("Abandoned", preemptor, victims...,
#: node), ("Moved", victim, replacement, node), ("NotMoved", victim, why).
Told = tuple[str, ...]


class Recorder:
    """Both event ports at once."""

    def abandoned(self, preemptor: Any, victims: Any, node: str, detail: str) -> bool: ...
    def moved(self, preemptor: Any, victim: Any, replacement: Any, node: str) -> bool: ...
    def lost(self, preemptor: Any, victim: Any, why: str) -> bool: ...
    def checkpointed(self, victim: Any, preemptor: Any, note: str) -> bool: ...
    def checkpoint_failed(self, victim: Any, preemptor: Any, why: str) -> bool: ...
    def restored(self, pod: Any, note: str) -> bool: ...


@dataclass
class Subject:
    world: World
    recorder: Recorder
    #: Everything told about ``preemptor`` (a name in the world's namespace), in order.
    told: Callable[[str], list[Told]]
    #: The same recorder kind, on an API server it cannot reach.
    unreachable: Callable[[], Recorder]


def _fake(world: World) -> Subject:
    recorder = FakeEvents(world.view())

    def told(preemptor: str) -> list[Told]:
        abandoned = [
            ("Abandoned", p, *victims, node)
            for p, victims, node in recorder.events
            if p == preemptor
        ]
        return abandoned + list(recorder.told)

    return Subject(world, recorder, told, lambda: FakeEvents(world.view(), reachable=False))


ABANDONED = re.compile(r"Stopped preempting on (\S+) for this resize \(.*\); not evicted: (.*)")
MOVED = re.compile(r"Preempted (\S+) moved: its replacement (\S+) runs on (\S+)")
LOST = re.compile(r"Preempted (\S+) did not move: (.*)")
NOT_CHECKPOINTED = re.compile(r"Not checkpointed, evicted: (.*)")


def _read(event: dict[str, Any]) -> Told:
    """An ``events.k8s.io/v1`` Event as the double keeps what it was told."""
    note, reason = event["note"], event["reason"]
    if reason == "ResizePreemptionAbandoned":
        node, victims = ABANDONED.fullmatch(note).groups()  # type: ignore[union-attr]
        names = () if victims == "none" else tuple(v.split("/")[1] for v in victims.split(", "))
        return ("Abandoned", event["regarding"]["name"], *names, node)
    if reason == "Moved":
        return ("Moved", *MOVED.fullmatch(note).groups())  # type: ignore[union-attr]
    if reason in ("Checkpointed", "Restored"):
        return (reason, note)
    if reason == "CheckpointFailed":
        return (reason, *NOT_CHECKPOINTED.fullmatch(note).groups())  # type: ignore[union-attr]
    return ("NotMoved", *LOST.fullmatch(note).groups())  # type: ignore[union-attr]


def _real(world: World, cluster: Any, tmp: Path, clients: list[Any]) -> Subject:
    from webhook.kube.client import make_api_client
    from webhook.kube.events import EventRecorder

    def recorder(kubeconfig: str) -> Recorder:
        client = make_api_client(kubeconfig)
        clients.append(client)
        return EventRecorder(client, controller="resize-preemption-webhook", instance="contract")

    def told(preemptor: str) -> list[Told]:
        listed = cluster.client.get(f"/apis/events.k8s.io/v1/namespaces/{world.namespace}/events")
        items = sorted(listed["items"], key=lambda e: e["eventTime"])
        return [_read(e) for e in items if e["regarding"]["name"] == preemptor]

    def unreachable() -> Recorder:
        return recorder(unreachable_kubeconfig(cluster, tmp))

    return Subject(world, recorder(str(cluster.kubeconfig)), told, unreachable)


@pytest.fixture(
    params=[
        pytest.param("fixed", id="fixed"),
        pytest.param("cache", id="cache", marks=pytest.mark.e2e),
    ]
)
def subject(request: pytest.FixtureRequest) -> Iterator[Subject]:
    for world in make_world(request):
        if isinstance(world, MemoryWorld):
            yield _fake(world)
            continue
        clients: list[Any] = []
        cluster, tmp = request.getfixturevalue("cluster"), request.getfixturevalue("tmp_path")
        yield _real(world, cluster, tmp, clients)
        for client in clients:
            client.close()


def ref(namespace: str, name: str) -> PodRef:
    return PodRef(namespace, name, f"uid-of-{name}")


@dataclass(frozen=True)
class Telling:
    """``tell(recorder, namespace)`` about pods in ``namespace``; what is told then
    (``{ns}``: the namespace)."""

    tell: Callable[[Recorder, str], bool]
    expected: Told


TELLINGS = [
    pytest.param(
        Telling(
            lambda r, ns: r.abandoned(
                ref(ns, "high"), [ref(ns, "low-a"), ref(ns, "low-b")], NODE, "reservation expired"
            ),
            ("Abandoned", "high", "low-a", "low-b", NODE),
        ),
        id="abandoned",
    ),
    pytest.param(
        Telling(
            lambda r, ns: r.abandoned(ref(ns, "high"), [], NODE, "the victims no longer suffice"),
            ("Abandoned", "high", NODE),
        ),
        id="abandoned-with-no-victim-left",
    ),
    pytest.param(
        Telling(
            lambda r, ns: r.moved(ref(ns, "high"), ref(ns, "low"), ref(ns, "low-2"), "node-2"),
            ("Moved", "{ns}/low", "{ns}/low-2", "node-2"),
        ),
        id="moved",
    ),
    pytest.param(
        Telling(
            lambda r, ns: r.lost(ref(ns, "high"), ref(ns, "low"), "no replacement within 60s"),
            ("NotMoved", "{ns}/low", "no replacement within 60s"),
        ),
        id="not-moved",
    ),
    # The pause events regard the victim, or the restored pod: "high" here too.
    pytest.param(
        Telling(
            lambda r, ns: r.checkpointed(ref(ns, "high"), ref(ns, "top"), "Checkpointed on n"),
            ("Checkpointed", "Checkpointed on n"),
        ),
        id="checkpointed",
    ),
    pytest.param(
        Telling(
            lambda r, ns: r.checkpoint_failed(ref(ns, "high"), ref(ns, "top"), "criu not found"),
            ("CheckpointFailed", "criu not found"),
        ),
        id="checkpoint-failed",
    ),
    pytest.param(
        Telling(
            lambda r, ns: r.restored(ref(ns, "high"), "Restored on node n"),
            ("Restored", "Restored on node n"),
        ),
        id="restored",
    ),
]


@pytest.mark.parametrize("case", TELLINGS)
def test_the_resizing_pod_is_told(subject: Subject, case: Telling) -> None:
    assert case.tell(subject.recorder, subject.world.namespace)

    expected = tuple(part.format(ns=subject.world.namespace) for part in case.expected)
    assert [expected] == subject.told("high")


@pytest.mark.parametrize("case", TELLINGS)
def test_a_pod_in_a_namespace_that_does_not_exist_is_not_told(
    subject: Subject, case: Telling
) -> None:
    assert not case.tell(subject.recorder, f"no-such-{secrets.token_hex(3)}")


@pytest.mark.parametrize("case", TELLINGS)
def test_an_api_server_out_of_reach_is_false_not_raised(subject: Subject, case: Telling) -> None:
    assert not case.tell(subject.unreachable(), subject.world.namespace)
    assert [] == subject.told("high")
