"""The reflector's byte-level parsing and event application, on byte fixtures.

No API server and no mocked client: LIST pages and watch streams are given as the bytes
the API server would send, and go through the same code the reflector thread runs.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import pytest

from webhook.core.model import Pod
from webhook.core.objects import parse_pod
from webhook.kube.cache import (
    BUDGETS,
    NAMESPACES,
    NODES,
    PODS,
    PRIORITY_CLASSES,
    ClusterCache,
    IndexedStore,
)
from webhook.kube.errors import ClusterError, Expired
from webhook.kube.reflector import (
    Delta,
    LineSplitter,
    ListPage,
    Reflector,
    Resource,
    StreamError,
    decode_event,
    object_key,
    parse_list_page,
    resource_version,
)

# -- fixtures ----------------------------------------------------------------------------


def pod_obj(
    name: str,
    rv: str,
    *,
    node: str = "node-1",
    cpu: str = "1",
    uid: str | None = None,
    namespace: str = "default",
    labels: Mapping[str, str] | None = None,
    priority: int = 0,
    resize: str | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": "Running",
        "startTime": "2026-01-01T00:00:00Z",
        "containerStatuses": [
            {
                "name": "app",
                "allocatedResources": {"cpu": cpu, "memory": "1Gi"},
                "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}},
            }
        ],
    }
    if resize:
        status["conditions"] = [
            {
                "type": "PodResizePending",
                "status": "True",
                "reason": resize,
                "lastTransitionTime": "2026-01-01T00:01:00Z",
            }
        ]
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{name}",
            "resourceVersion": rv,
            "labels": dict(labels or {"app": "web"}),
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "nodeName": node,
            "priority": priority,
            "containers": [
                {"name": "app", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}
            ],
        },
        "status": status,
    }


def list_page(items: list[dict[str, Any]], rv: str, token: str = "") -> bytes:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if token:
        meta["continue"] = token
    return orjson.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items})


def event(kind: str, obj: Mapping[str, Any]) -> bytes:
    return orjson.dumps({"type": kind, "object": obj}) + b"\n"


def bookmark(rv: str) -> bytes:
    return event(
        "BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": rv}}
    )


GONE = event(
    "ERROR",
    {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": "too old resource version: 5 (100)",
        "reason": "Expired",
        "code": 410,
    },
)


def no_api(**_: Any) -> Any:
    raise AssertionError("no API calls in these tests")


class Recorder:
    def __init__(self) -> None:
        self.changes: list[tuple[str, str, str]] = []

    def __call__(self, kind: str, changes: Any) -> None:
        self.changes.extend((kind, c.type, c.key) for c in changes)


def pod_reflector() -> tuple[Reflector[Pod], IndexedStore[Pod], Recorder]:
    store: IndexedStore[Pod] = IndexedStore(groups={"node": lambda p: p.node or None})
    recorder = Recorder()
    reflector = Reflector(Resource("pods", no_api, parse_pod), store, notify=recorder)
    return reflector, store, recorder


def pages(*bodies: bytes) -> Iterator[ListPage]:
    return (parse_list_page(b) for b in bodies)


# -- LineSplitter ------------------------------------------------------------------------


def test_lines_split_across_chunks() -> None:
    stream = event("ADDED", pod_obj("a", "1")) + event("ADDED", pod_obj("b", "2"))
    for size in (1, 2, 7, 64, len(stream)):
        splitter = LineSplitter()
        lines: list[bytes] = []
        for i in range(0, len(stream), size):
            lines.extend(splitter.feed(stream[i : i + size]))
        assert [decode_event(line).object["metadata"]["name"] for line in lines] == ["a", "b"]
        assert splitter.pending == b""


def test_blank_lines_dropped_and_partial_line_kept() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b'\n\n{"a":') == []
    assert splitter.pending == b'{"a":'
    assert splitter.feed(b"1}\r\n  \n") == [b'{"a":1}\r']


# -- decode_event / parse_list_page ------------------------------------------------------


def test_decode_event() -> None:
    ev = decode_event(event("MODIFIED", pod_obj("a", "7")).rstrip(b"\n"))
    assert ev.type == "MODIFIED"
    assert object_key(ev.object) == "default/a"
    assert resource_version(ev.object) == "7"


@pytest.mark.parametrize(
    "line",
    [b"not json", b"[1, 2]", b'{"type": "ADDED"}', b'{"type": 1, "object": {}}', b'{"object": {}}'],
)
def test_decode_event_rejects_what_is_not_an_event(line: bytes) -> None:
    with pytest.raises(StreamError):
        decode_event(line)


def test_parse_list_page() -> None:
    page = parse_list_page(list_page([pod_obj("a", "3")], "10", token="next"))
    assert page.resource_version == "10"
    assert page.continue_token == "next"
    assert [object_key(i) for i in page.items] == ["default/a"]
    empty = parse_list_page(b'{"kind":"PodList","metadata":{"resourceVersion":"4"},"items":null}')
    assert empty.items == [] and empty.continue_token == ""


@pytest.mark.parametrize("body", [b"", b"<html>", b"[]", b'{"items": {}}'])
def test_parse_list_page_rejects_garbage(body: bytes) -> None:
    with pytest.raises(StreamError):
        parse_list_page(body)


def test_object_key_cluster_scoped_and_missing_name() -> None:
    assert object_key({"metadata": {"name": "node-1"}}) == "node-1"
    with pytest.raises(StreamError):
        object_key({"metadata": {}})


# -- applying LIST pages and watch streams ---------------------------------------------


def test_list_then_watch_keeps_the_store_current() -> None:
    reflector, store, recorder = pod_reflector()
    changes = reflector.load_pages(
        pages(
            list_page([pod_obj("a", "1"), pod_obj("b", "2")], "5", token="t"),
            list_page([pod_obj("c", "3", node="node-2")], "5"),
        )
    )
    assert sorted(c.key for c in changes) == ["default/a", "default/b", "default/c"]
    assert reflector.synced() and reflector.resource_version == "5"
    assert [p.name for p in store.group("node", "node-1")] == ["a", "b"]

    stream = (
        event("ADDED", pod_obj("d", "6"))
        + event("MODIFIED", pod_obj("a", "7", cpu="2"))
        + event("DELETED", pod_obj("b", "8"))
        + bookmark("9")
        + event("MODIFIED", pod_obj("c", "10", node="node-1"))
    )
    lines = reflector.consume([stream[:50], stream[50:333], stream[333:]])
    assert lines == 5
    assert reflector.resource_version == "10"
    assert sorted(p.name for p in store.group("node", "node-1")) == ["a", "c", "d"]
    assert store.group("node", "node-2") == ()
    a = store.get("default/a")
    assert a is not None and a.containers[0].requests.cpu == 2000
    assert store.get("default/b") is None
    assert recorder.changes[3:] == [
        ("pods", "ADDED", "default/d"),
        ("pods", "MODIFIED", "default/a"),
        ("pods", "DELETED", "default/b"),
        ("pods", "MODIFIED", "default/c"),
    ]


def test_bookmark_only_moves_the_resource_version() -> None:
    reflector, store, recorder = pod_reflector()
    reflector.load_pages(pages(list_page([pod_obj("a", "1")], "5")))
    before = store.get("default/a")
    reflector.consume([bookmark("42")])
    assert reflector.resource_version == "42"
    assert store.get("default/a") is before
    assert len(recorder.changes) == 1


@pytest.mark.parametrize(
    ("wanted", "delivered", "expected"),
    [
        pytest.param("5", [], True, id="already-held"),
        pytest.param("7", ["6", "7"], True, id="delivered-while-waiting"),
        pytest.param("9", ["6", "9"], True, id="a-bookmark-past-it"),
        pytest.param("8", ["6"], False, id="never-delivered"),
        pytest.param("not-a-version", [], False, id="not-comparable"),
    ],
)
def test_wait_for_returns_once_the_store_holds_every_write_up_to_a_version(
    wanted: str, delivered: list[str], expected: bool
) -> None:
    reflector, _, _ = pod_reflector()
    reflector.load_pages(pages(list_page([pod_obj("a", "1")], "5")))
    stream = b"".join(
        bookmark(v) if v == "9" else event("MODIFIED", pod_obj("a", v, cpu=v)) for v in delivered
    )
    feeder = threading.Timer(0.05, reflector.consume, [[stream]])
    feeder.start()

    held = reflector.wait_for(wanted, timeout=0.5)
    feeder.join()

    assert expected is held
    assert (delivered or ["5"])[-1] == reflector.resource_version


def test_error_410_means_relist() -> None:
    reflector, _, _ = pod_reflector()
    reflector.load_pages(pages(list_page([], "5")))
    with pytest.raises(Expired) as info:
        reflector.consume([event("ADDED", pod_obj("a", "6")) + GONE])
    assert info.value.status == 410
    assert reflector.resource_version == "6"


def test_other_error_events() -> None:
    reflector, _, _ = pod_reflector()
    line = event("ERROR", {"kind": "Status", "code": 500, "message": "etcd down"})
    with pytest.raises(ClusterError) as info:
        reflector.consume([line])
    assert not isinstance(info.value, Expired)
    assert info.value.status == 500 and "etcd down" in str(info.value)


def test_garbage_line_is_a_stream_error_and_a_cut_line_is_ignored() -> None:
    reflector, store, _ = pod_reflector()
    cut = event("ADDED", pod_obj("a", "6"))[:-20]
    assert reflector.consume([cut]) == 0
    assert store.get("default/a") is None
    with pytest.raises(StreamError):
        reflector.consume([b"<html>502</html>\n"])


def test_unknown_event_types_are_ignored() -> None:
    reflector, store, _ = pod_reflector()
    reflector.consume([event("SOMETHING", pod_obj("a", "6"))])
    assert len(store) == 0


def test_a_pod_that_does_not_parse_is_logged_once_and_skipped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reflector, store, recorder = pod_reflector()
    bad = pod_obj("bad", "2")
    bad["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    caplog.set_level(logging.WARNING, logger="webhook.kube.reflector")
    reflector.load_pages(pages(list_page([pod_obj("a", "1"), bad], "5")))
    assert store.get("default/bad") is None and store.get("default/a") is not None
    bad["metadata"]["resourceVersion"] = "6"
    reflector.consume([event("MODIFIED", bad)])
    bad["metadata"]["resourceVersion"] = "7"
    reflector.load_pages(pages(list_page([pod_obj("a", "1"), bad], "8")))
    warnings = [r for r in caplog.records if "default/bad" in r.getMessage()]
    assert len(warnings) == 1
    assert "lots" in warnings[0].getMessage()
    # Fixed: stored again, and a later failure would be logged again.
    reflector.consume([event("MODIFIED", pod_obj("bad", "9"))])
    assert store.get("default/bad") is not None
    assert ("pods", "ADDED", "default/bad") in recorder.changes


def test_a_known_pod_that_stops_parsing_keeps_its_last_good_view() -> None:
    reflector, store, _ = pod_reflector()
    reflector.load_pages(pages(list_page([pod_obj("a", "1", cpu="2")], "5")))
    good = store.get("default/a")
    bad = pod_obj("a", "6")
    bad["status"]["containerStatuses"] = "nope"
    reflector.consume([event("MODIFIED", bad)])
    assert store.get("default/a") is good
    bad["metadata"]["resourceVersion"] = "7"
    reflector.load_pages(pages(list_page([bad], "8")))
    assert store.get("default/a") is good
    reflector.consume([event("DELETED", bad)])
    assert store.get("default/a") is None


def test_relist_reuses_unchanged_views_and_reports_differences() -> None:
    reflector, store, recorder = pod_reflector()
    reflector.load_pages(pages(list_page([pod_obj("a", "1"), pod_obj("b", "2")], "5")))
    a, b = store.get("default/a"), store.get("default/b")
    changes = reflector.load_pages(
        pages(list_page([pod_obj("a", "1"), pod_obj("b", "9", cpu="3"), pod_obj("c", "8")], "9"))
    )
    assert store.get("default/a") is a
    assert store.get("default/b") is not b
    assert {(c.type, c.key) for c in changes} == {
        ("MODIFIED", "default/b"),
        ("ADDED", "default/c"),
    }
    changes = reflector.load_pages(pages(list_page([pod_obj("c", "8")], "12")))
    assert {(c.type, c.key) for c in changes} == {
        ("DELETED", "default/a"),
        ("DELETED", "default/b"),
    }
    assert [p.name for p in store.group("node", "node-1")] == ["c"]
    assert 6 == len(recorder.changes)


def test_a_pod_recreated_under_the_same_name() -> None:
    reflector, store, _ = pod_reflector()
    reflector.load_pages(pages(list_page([pod_obj("a", "1", uid="one")], "5")))
    # Missed the DELETED (watch was down): the relist shows a new incarnation.
    reflector.load_pages(pages(list_page([pod_obj("a", "7", uid="two")], "8")))
    two = store.get("default/a")
    assert two is not None and "two" == two.uid
    assert (two,) == store.group("node", "node-1")
    # And through the watch.
    reflector.consume([event("MODIFIED", pod_obj("a", "9", uid="three", node="node-2"))])
    three = store.get("default/a")
    assert three is not None and "three" == three.uid
    assert (three,) == store.group("node", "node-2")
    assert store.group("node", "node-1") == ()


def test_a_failing_subscriber_does_not_stop_the_reflector() -> None:
    store: IndexedStore[Pod] = IndexedStore()

    def explode(kind: str, changes: Any) -> None:
        raise RuntimeError("subscriber bug")

    reflector = Reflector(Resource("pods", no_api, parse_pod), store, notify=explode)
    reflector.load_pages(pages(list_page([pod_obj("a", "1")], "5")))
    reflector.consume([event("ADDED", pod_obj("b", "6"))])
    assert len(store) == 2


# -- the ClusterCache's indexes, fed offline ------------------------------------------


def node_obj(name: str, rv: str, cpu: str = "8") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": rv},
        "status": {"allocatable": {"cpu": cpu, "memory": "16Gi", "pods": "110"}},
    }


def pdb_obj(name: str, namespace: str, rv: str, allowed: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": rv},
        "spec": {"selector": {"matchLabels": {"app": "web"}}},
        "status": {"disruptionsAllowed": allowed},
    }


def test_cluster_cache_indexes_and_subscribers() -> None:
    cache = ClusterCache(None, freeze_gc=False)
    seen: list[tuple[str, str, Any, Any]] = []
    unsubscribe = cache.subscribe(lambda *args: seen.append(args))
    assert not cache.synced() and cache.age() == float("inf")

    cache.reflector(PRIORITY_CLASSES).load_pages(
        pages(
            orjson.dumps(
                {
                    "metadata": {"resourceVersion": "1"},
                    "items": [
                        {"metadata": {"name": "high", "resourceVersion": "1"}, "value": 1000}
                    ],
                }
            )
        )
    )
    cache.reflector(NODES).load_pages(pages(list_page([node_obj("node-1", "2")], "2")))
    cache.reflector(BUDGETS).load_pages(
        pages(list_page([pdb_obj("web", "default", "3"), pdb_obj("x", "other", "3")], "3"))
    )
    cache.reflector(NAMESPACES).load_pages(
        pages(
            orjson.dumps(
                {
                    "metadata": {"resourceVersion": "5"},
                    "items": [
                        {
                            "metadata": {
                                "name": "other",
                                "resourceVersion": "5",
                                "labels": {"team": "b"},
                            }
                        }
                    ],
                }
            )
        )
    )
    assert not cache.synced()  # pods not listed yet
    cache.reflector(PODS).load_pages(
        pages(
            list_page(
                [
                    pod_obj("a", "4"),
                    pod_obj("b", "4", resize="Deferred", annotations={"huge": "x" * 1000}),
                    pod_obj("c", "4", node="", namespace="other"),
                ],
                "4",
            )
        )
    )
    assert cache.synced() and cache.age() < 60
    assert {"team": "b"} == cache.namespace_labels("other")
    assert None is cache.namespace_labels("default")
    resolver = cache.priority_resolver()
    assert resolver.resolve({"priorityClassName": "high"}, "spec")[0] == 1000

    node = cache.node("node-1")
    assert node is not None and node.allocatable.cpu == 8000
    assert sorted(p.name for p in cache.pods_on("node-1")) == ["a", "b"]
    assert cache.pods_on("node-9") == ()
    assert [b.name for b in cache.budgets(["default"])] == ["web"]
    assert sorted(b.key for b in cache.budgets(["default", "other", "none"])) == [
        "default/web",
        "other/x",
    ]
    b = cache.pod("default", "b")
    assert b is not None and b.annotations == {}
    c = cache.pod("other", "c")  # not bound yet: in no node's pods
    assert c is not None and "uid-c" == c.uid
    assert [p.name for p in cache.pending_resizes()] == ["b"]
    assert 3 == len(cache.pods)

    # Priority classes changing rebuild the resolver.
    cache.reflector(PRIORITY_CLASSES).consume(
        [event("MODIFIED", {"metadata": {"name": "high", "resourceVersion": "9"}, "value": 7})]
    )
    assert cache.priority_resolver().resolve({"priorityClassName": "high"}, "spec")[0] == 7

    # The resize was actuated: no longer pending.
    cache.reflector(PODS).consume([event("MODIFIED", pod_obj("b", "10", cpu="2"))])
    assert cache.pending_resizes() == ()
    kinds = [(k, t) for k, t, _, _ in seen]
    assert kinds.count(("pods", "ADDED")) == 3
    assert kinds[-1] == ("pods", "MODIFIED")
    old, new = seen[-1][2], seen[-1][3]
    assert old.resize == "deferred" and new.resize == "none"

    unsubscribe()
    cache.reflector(PODS).consume([event("DELETED", pod_obj("b", "11"))])
    assert kinds == [(k, t) for k, t, _, _ in seen]
    assert cache.pod("default", "b") is None
    assert 2 == len(cache.pods) and cache.reflector(PODS).synced()


def test_budgets_remembered_for_a_set_of_namespaces_follow_every_change() -> None:
    cache = ClusterCache(None, freeze_gc=False)
    budgets = cache.reflector(BUDGETS)
    budgets.load_pages(pages(list_page([pdb_obj("web", "default", "1")], "1")))
    namespaces = frozenset({"default", "other"})

    def seen() -> list[tuple[str, int]]:
        return sorted((b.key, b.disruptions_allowed) for b in cache.budgets(namespaces))

    assert [("default/web", 1)] == seen()
    assert cache.budgets(namespaces) is cache.budgets(namespaces)  # remembered

    budgets.consume([event("ADDED", pdb_obj("x", "other", "2"))])
    assert [("default/web", 1), ("other/x", 1)] == seen()
    budgets.consume([event("MODIFIED", pdb_obj("web", "default", "3", allowed=0))])
    assert [("default/web", 0), ("other/x", 1)] == seen()
    budgets.consume([event("DELETED", pdb_obj("x", "other", "4"))])
    assert [("default/web", 0)] == seen()
    budgets.load_pages(pages(list_page([pdb_obj("y", "other", "5")], "5")))  # a relist
    assert [("other/y", 1)] == seen()
    # Any iterable of namespaces gets the same answer as the set.
    assert seen() == sorted((b.key, b.disruptions_allowed) for b in cache.budgets(["other"]))


def test_compaction_shares_but_does_not_change_pods() -> None:
    cache = ClusterCache(None, freeze_gc=False)
    objs = [
        pod_obj(f"web-{i}", str(i), labels={"app": "web", "tier": "front"}, cpu="500m")
        for i in range(3)
    ]
    objs[0]["metadata"]["annotations"] = {
        "kubectl.kubernetes.io/last-applied-configuration": "{...}",
        "resize-preemption.io/fit-to-node": "true",
    }
    cache.reflector(PODS).load_pages(pages(list_page(objs, "9")))
    pods = [cache.pod("default", f"web-{i}") for i in range(3)]
    assert all(p is not None for p in pods)
    p0, p1, p2 = pods
    assert p0 is not None and p1 is not None and p2 is not None
    plain = parse_pod(objs[1])
    assert p1 == plain
    assert p1.labels is p2.labels and p1.containers is p2.containers
    assert p1.statuses is p2.statuses
    assert p0.annotations == {"resize-preemption.io/fit-to-node": "true"}


def test_compaction_shares_owner_and_placement_but_does_not_change_pods() -> None:
    tolerations = [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    ]

    def owned(name: str, node: str, *, daemon: bool) -> dict[str, Any]:
        obj = pod_obj(name, "1", node=node, priority=1_000_000)
        obj["metadata"]["ownerReferences"] = [
            {
                "kind": "DaemonSet" if daemon else "ReplicaSet",
                "name": "owner",
                "uid": "uid-" + "-".join(["owner"] * 4),
                "controller": True,
            }
        ]
        obj["spec"]["preemptionPolicy"] = "Never"
        obj["spec"]["tolerations"] = [dict(t) for t in tolerations]
        if daemon:
            field = {"key": "metadata.name", "operator": "In", "values": [node]}
            term = {"matchFields": [field]}
            required = {"nodeSelectorTerms": [term]}
            obj["spec"]["affinity"] = {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
            }
        return obj

    objs = [
        owned("rs-a", "node-1", daemon=False),
        owned("rs-b", "node-2", daemon=False),
        owned("ds-a", "node-1", daemon=True),
        owned("ds-b", "node-2", daemon=True),
    ]
    cache = ClusterCache(None, freeze_gc=False)
    cache.reflector(PODS).load_pages(pages(list_page(objs, "9")))
    rs_a, rs_b, ds_a, ds_b = (cache.pod("default", o["metadata"]["name"]) for o in objs)
    assert rs_a is not None and rs_b is not None and ds_a is not None and ds_b is not None
    assert [rs_a, rs_b, ds_a, ds_b] == [parse_pod(o) for o in objs]
    assert rs_a.placement is rs_b.placement
    assert rs_a.controller_uid is rs_b.controller_uid is ds_b.controller_uid
    assert rs_a.controller is rs_b.controller and rs_a.priority is rs_b.priority
    assert rs_a.preemption_policy is ds_b.preemption_policy
    # The terms name each its own node; the tolerations are the same.
    assert ds_a.placement != ds_b.placement
    assert ds_a.placement.tolerations is ds_b.placement.tolerations is rs_a.placement.tolerations


def test_offline_cache_cannot_start() -> None:
    with pytest.raises(ClusterError):
        ClusterCache(None, freeze_gc=False).start()


def test_change_is_typed_per_event() -> None:
    change: Delta[int] = Delta("ADDED", "k", None, 1)
    assert change.old is None and change.new == 1


def test_listing_pods_freezes_the_views_out_of_the_cyclic_collector() -> None:
    try:
        cache = ClusterCache(None)
        cache.reflector(PODS).load_pages(pages(list_page([pod_obj("a", "1")], "5")))
        assert gc.get_freeze_count() > 0
        nodes_only = ClusterCache(None)
        gc.unfreeze()
        nodes_only.reflector(NODES).load_pages(pages(list_page([node_obj("n", "1")], "1")))
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()
