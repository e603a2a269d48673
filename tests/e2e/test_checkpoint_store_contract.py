"""The checkpoint store's and the pod creator's contracts, one suite for each port's double
and its implementation against the API server.

Every test runs on :class:`harness.doubles.MemoryCheckpoints` ("memory") and on
:class:`webhook.kube.checkpoints.PodCheckpoints` against the real API server ("api", the
chart's ``PodCheckpoint`` and ``CheckpointNode`` kinds, a fresh namespace each). Both:

* read back a record exactly as it was written, through ``record`` and ``records``, and
  again after a write that moves it to another phase and drops what it no longer holds;
* know no record and no node they were not told of;
* read a node's abilities as its agent published them (the ``CheckpointNode`` named after
  the node, docs/checkpoint.md; the double's ``publish``), within a few seconds (a review
  reads the last list and never waits for the next), and tell records from abilities.

The node agent's side of the same store (:class:`harness.doubles.PodCheckpointsInMemory`,
"agent-memory", and ``PodCheckpoints``, "agent-api") lists its node's records only, each
as written with a version; updates a record's status only, only as it was read (a second
update from the same read finds it changed, an update of a deleted record finds it gone;
what it says of the spec is not written); deletes (twice is fine); and publishes abilities
the service reads back.

The pod creator (:class:`harness.doubles.FakeCreator` over a cluster view, and
:class:`webhook.kube.checkpoints.PodCreator`) creates a pod once, says a second pod of
that name exists, and that a namespace that does not exist is gone.

``-k memory`` runs the in-memory halves without a control plane.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest

from harness.doubles import FakeCreator, MemoryCheckpoints, PodCheckpointsInMemory
from webhook.agent.records import CheckpointStore as AgentStore
from webhook.core.checkpoint import CheckpointRecord, NodeCheckpointing, Phase
from webhook.core.model import Namespace
from webhook.engine.memory import FixedClusterView
from webhook.engine.pauses import CheckpointStore, PodCreator

NODE = "node-1"


@dataclass
class Store:
    store: CheckpointStore
    publish: Callable[[NodeCheckpointing], None]


def _api_store(cluster: Any, namespace: str) -> Iterator[Store]:
    from webhook.kube.checkpoints import PodCheckpoints
    from webhook.kube.client import make_api_client

    api = make_api_client(str(cluster.kubeconfig))
    # max_age 0: each read is a list, as a reader a second later sees it.
    store = PodCheckpoints(api, namespace, max_age=0.0)
    # What a node agent writes (docs/checkpoint.md, "Node abilities"), by its own store.
    agent = PodCheckpoints(api, namespace)

    def publish(ability: NodeCheckpointing) -> None:
        agent.publish(ability, time.time())
        store.refresh()  # what every replica's loop does each second

    yield Store(store, publish)
    api.close()  # type: ignore[no-untyped-call]


@pytest.fixture(
    params=[pytest.param("memory"), pytest.param("api", marks=pytest.mark.e2e)],
)
def store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "memory":
        memory = MemoryCheckpoints()
        yield Store(memory, memory.publish)
        return
    yield from _api_store(request.getfixturevalue("cluster"), request.getfixturevalue("namespace"))


def _record(uid: str = "u-1", **kw: Any) -> CheckpointRecord:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "low", "namespace": "team-b", "uid": uid, "labels": {"a": "b"}},
        "spec": {"nodeName": NODE, "containers": [{"name": "count", "image": "busybox"}]},
    }
    defaults: dict[str, Any] = {
        "uid": uid,
        "node": NODE,
        "phase": Phase.ARCHIVED,
        "pod": pod,
        "archives": {"count": "/var/lib/kubelet/checkpoints/checkpoint-low.tar"},
        "checkpointed_at": "2026-12-06T07:01:00Z",
    }
    return CheckpointRecord(**{**defaults, **kw})


IMAGED = {
    "phase": Phase.IMAGED,
    "images": {"count": "localhost/resize-preemption-checkpoint/team-b/low/count:u-1"},
    "commands": {"count": ["sh", "-c", "while true; do sleep 1; done"]},
    "sizes": {"count": 270336},
}


def test_a_record_reads_back_as_written(store: Store) -> None:
    record = _record()

    assert store.store.write(record)

    assert record == store.store.record("u-1")
    assert [record] == list(store.store.records())


@pytest.mark.parametrize(
    "later",
    [
        pytest.param({**IMAGED}, id="archived-to-imaged"),
        pytest.param({"phase": Phase.ABANDONED, "message": "another pod exists"}, id="abandoned"),
    ],
)
def test_a_record_written_again_reads_as_the_last_write(
    store: Store, later: dict[str, Any]
) -> None:
    first = _record(**IMAGED, message="a note of the first write")
    assert store.store.write(first)

    assert store.store.write(replace(_record(), **later))

    assert replace(_record(), **later) == store.store.record("u-1")


def test_unknown_records_and_nodes_read_as_none(store: Store) -> None:
    assert store.store.write(_record("u-1"))
    store.publish(NodeCheckpointing(NODE, True, True, "4.1.1", "containerd v2.3.7"))

    assert None is store.store.record("u-2")
    assert None is store.store.capability("node-9")


@pytest.mark.parametrize(
    "ability",
    [
        pytest.param(NodeCheckpointing(NODE, True, True, "4.1.1", "containerd v2.3.7"), id="able"),
        pytest.param(
            NodeCheckpointing(NODE, False, True, "", "containerd v2.3.7", "criu not found"),
            id="no-criu",
        ),
    ],
)
def test_a_nodes_abilities_read_as_its_agent_published_them(
    store: Store, ability: NodeCheckpointing
) -> None:
    assert store.store.write(_record())

    store.publish(ability)

    assert ability == store.store.capability(NODE)
    assert [ability] == list(store.store.capabilities())
    assert ["u-1"] == [r.uid for r in store.store.records()]  # an ability is no record


# -- the pod creator --------------------------------------------------------------------------


# -- the node agent's side ---------------------------------------------------------------------


@dataclass
class AgentSide:
    store: AgentStore
    #: What the service does: writes a record, as the agent will read it.
    seed: Callable[[CheckpointRecord], None]
    #: What the service reads of a node's published abilities (``None``: nothing yet).
    ability: Callable[[str], NodeCheckpointing | None]


def _agent_api(cluster: Any, namespace: str) -> Iterator[AgentSide]:
    from webhook.kube.checkpoints import PodCheckpoints
    from webhook.kube.client import make_api_client

    api = make_api_client(str(cluster.kubeconfig))
    service = PodCheckpoints(api, namespace, max_age=0.0)

    def seed(record: CheckpointRecord) -> None:
        assert service.write(record)

    def ability(node: str) -> NodeCheckpointing | None:
        service.refresh()  # what every replica's loop does each second
        return service.capability(node)

    yield AgentSide(PodCheckpoints(api, namespace), seed, ability)
    api.close()  # type: ignore[no-untyped-call]


@pytest.fixture(
    params=[
        pytest.param("agent-memory"),
        pytest.param("agent-api", marks=pytest.mark.e2e),
    ],
)
def agent(request: pytest.FixtureRequest) -> Iterator[AgentSide]:
    if request.param == "agent-memory":
        memory = PodCheckpointsInMemory()

        def ability(node: str) -> NodeCheckpointing | None:
            status = memory.capabilities.get(node)
            if status is None:
                return None
            return NodeCheckpointing.from_object({"spec": {"node": node}, "status": status})

        yield AgentSide(memory, memory.put, ability)
        return
    cluster, namespace = request.getfixturevalue("cluster"), request.getfixturevalue("namespace")
    yield from _agent_api(cluster, namespace)


def test_the_agent_lists_its_nodes_records_as_written(agent: AgentSide) -> None:
    mine, other = _record("u-1"), _record("u-2", node="node-2")
    agent.seed(mine)
    agent.seed(other)
    listed = agent.store.records_on(NODE)
    assert [mine] == listed
    assert "" != listed[0].version
    assert [] == agent.store.records_on("node-3")


def test_the_agent_updates_a_record_only_as_it_was_read(agent: AgentSide) -> None:
    agent.seed(_record())
    (read,) = agent.store.records_on(NODE)
    imaged = replace(read, **IMAGED, imaged_at="2026-12-06T07:01:04Z")
    assert True is agent.store.update(imaged)
    assert [imaged] == agent.store.records_on(NODE)
    failed = replace(read, phase=Phase.FAILED, message="x", failed_at="2026-12-06T07:01:05Z")
    assert False is agent.store.update(failed)  # changed since it was read
    assert [imaged] == agent.store.records_on(NODE)
    (again,) = agent.store.records_on(NODE)
    abandoned = replace(again, phase=Phase.ABANDONED, images={}, commands={}, sizes={})
    assert True is agent.store.update(abandoned)
    assert [abandoned] == agent.store.records_on(NODE)


def test_the_agent_writes_a_records_status_only(agent: AgentSide) -> None:
    written = _record()
    agent.seed(written)
    (read,) = agent.store.records_on(NODE)
    other = {"count": "/var/lib/kubelet/checkpoints/checkpoint-other_team-c-app-1.tar"}
    pod = {**written.pod, "metadata": {**written.pod["metadata"], "namespace": "kube-system"}}
    swapped = replace(read, **IMAGED, archives=other, pod=pod, checkpointed_at="")
    assert True is agent.store.update(swapped)
    (after,) = agent.store.records_on(NODE)
    assert (written.pod, written.archives, written.checkpointed_at) == (
        after.pod,
        after.archives,
        after.checkpointed_at,
    )
    assert (Phase.IMAGED, IMAGED["images"]) == (after.phase, after.images)


def test_the_agent_deletes_a_record_and_then_cannot_update_it(agent: AgentSide) -> None:
    agent.seed(_record())
    (read,) = agent.store.records_on(NODE)
    agent.store.delete(read.name)
    agent.store.delete(read.name)  # gone already is fine
    assert [] == agent.store.records_on(NODE)
    assert False is agent.store.update(replace(read, phase=Phase.RESTORED))
    assert [] == agent.store.records_on(NODE)


def test_the_service_reads_what_the_agent_published(agent: AgentSide) -> None:
    ability = NodeCheckpointing(NODE, True, False, "4.1.1", "containerd v2.3.7", "no restore")
    agent.store.publish(ability, 1_800_000_000.0)
    assert ability == agent.ability(NODE)
    agent.store.publish(replace(ability, restore=True, message=""), 1_800_000_300.0)
    able = replace(ability, restore=True, message="")
    assert able == agent.ability(NODE)


# -- the pod creator --------------------------------------------------------------------------


@dataclass
class Creator:
    creator: PodCreator
    namespace: str
    #: Whether pod ``name`` of ``namespace`` is there now.
    exists: Callable[[str], bool]


@pytest.fixture(
    params=[pytest.param("memory"), pytest.param("api", marks=pytest.mark.e2e)],
)
def creator(request: pytest.FixtureRequest) -> Iterator[Creator]:
    if request.param == "memory":
        namespace = "team-b"
        fake = FakeCreator(FixedClusterView(namespaces=[Namespace(namespace)]))

        def made(name: str) -> bool:
            return any(m["metadata"]["name"] == name for m in fake.created)

        yield Creator(fake, namespace, made)
        return
    from webhook.kube.checkpoints import PodCreator as ApiPodCreator
    from webhook.kube.client import make_api_client

    cluster, namespace = request.getfixturevalue("cluster"), request.getfixturevalue("namespace")
    api = make_api_client(str(cluster.kubeconfig))

    def there(name: str) -> bool:
        return cluster.client.get_or_none(f"/api/v1/namespaces/{namespace}/pods/{name}") is not None

    yield Creator(ApiPodCreator(api), namespace, there)
    api.close()  # type: ignore[no-untyped-call]


def _pod(namespace: str, name: str = "low") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": "nowhere", "containers": [{"name": "main", "image": "busybox"}]},
    }


def test_a_pod_is_created_once(creator: Creator) -> None:
    assert "" == creator.creator.create(_pod(creator.namespace))
    assert creator.exists("low")

    assert "a pod of that name exists" == creator.creator.create(_pod(creator.namespace))


def test_a_pod_of_a_namespace_gone_is_not_created(creator: Creator) -> None:
    assert "namespace no-such-ns is gone" == creator.creator.create(_pod("no-such-ns"))
