"""The cluster's side of checkpoints: the kubelet's checkpoint API, the records and node
abilities (objects of the service's own API group), and creating a pod again.

* :class:`KubeletCheckpointer` asks the victim's kubelet, directly on its own port
  (``POST /checkpoint/{namespace}/{pod}/{container}``, authorized as ``create`` on
  ``nodes/checkpoint``: the API server's node proxy would need ``nodes/proxy``, which
  also grants exec), for a checkpoint of each container, within the victim's grace
  period. The kubelet writes each archive under its root and answers its path.
* :class:`PodCheckpoints` reads and writes the records
  (:class:`~webhook.core.checkpoint.CheckpointRecord`, ``PodCheckpoint`` objects) and the
  abilities the node agents publish (:class:`~webhook.core.checkpoint.NodeCheckpointing`,
  the status of ``CheckpointNode`` objects), one list of each per second at most.
  Reviews read abilities only, from what the last list left, and never wait on the API
  server for long. The node agents use it too, on their side of the same records: their
  node's records read fresh (selected by ``spec.node``), each one's status updated only
  as it was read (its resourceVersion), their node's abilities published
  (:mod:`webhook.agent.records`). Who may write what is the chart's admission policy's
  to enforce (docs/checkpoint.md, "Security"); the restorer checks what it reads anyway
  (:func:`~webhook.core.checkpoint.restore_refusal`).
* :class:`PodCreator` creates the restored pod.

The service's calls never raise: failures are answers (a message, ``False``), logged by
the caller. The agent's raise ``ClusterError``, and its pass is tried again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import quote

import orjson
import urllib3

from webhook.core.checkpoint import (
    CHECKPOINT_LABEL,
    GROUP,
    NODE_KIND,
    NODES,
    RECORD_KIND,
    RECORDS,
    VERSION,
    CheckpointRecord,
    NodeCheckpointing,
    node_object,
    record_object,
)
from webhook.core.model import PodRef
from webhook.engine.pauses import Checkpointed
from webhook.kube.errors import ClusterError, Conflict, NotFound
from webhook.kube.evictor import grace_of
from webhook.kube.jsonapi import pod_path, request_json
from webhook.kube.sealing import EnvSealer, SealError

log = logging.getLogger(__name__)

#: The ConfigMaps an older release kept its records and abilities in.
LEGACY_SELECTOR: Final = f"{CHECKPOINT_LABEL}=true"
LEGACY_ABILITY_SELECTOR: Final = "resize-preemption.io/node-capability=true"
MERGE_PATCH: Final = "application/merge-patch+json"
DEFAULT_KUBELET_PORT: Final = 10250


class KubeletCheckpointer:
    """Checkpoints a victim's containers through its node's kubelet."""

    def __init__(
        self,
        api_client: Any,
        *,
        kubelet_ca: str = "",
        grace_period_cap: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        sealer: EnvSealer | None = None,
    ) -> None:
        self._api = api_client
        self._cap = grace_period_cap
        #: Literal env values go into the record sealed (webhook.kube.sealing).
        self._sealer = sealer
        self._clock = clock
        cfg = api_client.configuration
        self._http = urllib3.PoolManager(
            cert_reqs="CERT_REQUIRED" if kubelet_ca else "CERT_NONE",
            ca_certs=kubelet_ca or None,
            cert_file=cfg.cert_file or None,
            key_file=cfg.key_file or None,
            retries=False,
        )
        if not kubelet_ca:
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        self._config = cfg

    def checkpoint(self, victim: PodRef, node: str) -> Checkpointed:
        start = self._clock()
        pod: dict[str, Any] = {}
        grace = 0
        try:
            pod = request_json(self._api, "GET", pod_path(victim))
            if victim.uid and (pod.get("metadata") or {}).get("uid") != victim.uid:
                return Checkpointed({}, {}, 0, 0.0, "the victim was replaced meanwhile")
            grace = grace_of(pod) if self._cap is None else min(grace_of(pod), self._cap)
            kubelet = self._kubelet(node)
            archives = self._each_container(victim, pod, kubelet, grace, start)
            kept = _as_stored(pod) if self._sealer is None else self._sealer.seal(_as_stored(pod))
            return Checkpointed(kept, archives, grace, self._clock() - start)
        except (ClusterError, CheckpointError) as e:
            return Checkpointed(_as_stored(pod), {}, grace, self._clock() - start, str(e))
        except Exception as e:  # never raise into the worker: evict instead
            log.exception("checkpoint of %s failed", victim.key)
            why = f"{type(e).__name__}: {e}"
            return Checkpointed(_as_stored(pod), {}, grace, self._clock() - start, why)

    def _kubelet(self, node: str) -> str:
        """``https://address:port`` of ``node``'s kubelet, from the Node's status."""
        status = request_json(self._api, "GET", f"/api/v1/nodes/{quote(node)}").get("status") or {}
        addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or ()}
        address = addresses.get("InternalIP") or addresses.get("ExternalIP")
        if not address:
            raise CheckpointError(f"node {node} reports no address for its kubelet")
        endpoint = (status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}
        port = endpoint.get("Port") or DEFAULT_KUBELET_PORT
        host = f"[{address}]" if ":" in address else address
        return f"https://{host}:{port}"

    def _each_container(
        self, victim: PodRef, pod: Mapping[str, Any], kubelet: str, grace: int, start: float
    ) -> dict[str, str]:
        names = [c["name"] for c in (pod.get("spec") or {}).get("containers") or ()]
        archives = {}
        for name in names:
            left = grace - (self._clock() - start)
            if left < 1:
                raise CheckpointError(
                    f"its grace period ({grace}s) leaves no time to checkpoint container {name}"
                )
            archives[name] = self._post(kubelet, victim, name, int(left))
        return archives

    def _post(self, kubelet: str, victim: PodRef, container: str, timeout: int) -> str:
        path = "/".join(quote(p, safe="") for p in (victim.namespace, victim.name, container))
        url = f"{kubelet}/checkpoint/{path}?timeout={timeout}"
        headers = {}
        # Where the client keeps the service account's token (and refreshes it), as its
        # own requests read it.
        token = self._config.get_api_key_with_prefix("BearerToken", alias="authorization")
        if token:
            headers["Authorization"] = token
        try:
            response = self._http.request(
                "POST", url, headers=headers, timeout=urllib3.Timeout(connect=5, read=timeout + 2)
            )
        except urllib3.exceptions.HTTPError as e:
            raise CheckpointError(f"the kubelet at {kubelet} did not answer: {e}") from None
        body = response.data.decode("utf-8", "replace")
        if response.status != 200:
            first = (body.strip().splitlines() or [""])[0][:300]
            raise CheckpointError(
                f"the kubelet refused to checkpoint container {container} "
                f"(HTTP {response.status}): {first}"
            )
        try:
            items = orjson.loads(body)["items"]
            return str(items[0])
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            raise CheckpointError(f"the kubelet's answer names no archive: {body[:200]}") from None


class CheckpointError(Exception):
    """One line saying why a victim was not checkpointed."""


def _as_stored(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod as a record keeps it: no status, no managed fields."""
    if not pod:
        return {}
    meta = {k: v for k, v in (pod.get("metadata") or {}).items() if k != "managedFields"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod.get("spec") or {}}


class PodCheckpoints:
    """The :class:`~webhook.engine.pauses.CheckpointStore` of ``PodCheckpoint`` and
    ``CheckpointNode`` objects in ``namespace``.

    Two kinds of read, on one list of each kind:

    * records (:meth:`records`, :meth:`record`): the leader's worker only. Older than
      ``max_age``, they are listed again before the answer, so that a record the worker
      just wrote is read back (a write forgets the list);
    * abilities (:meth:`capability`, :meth:`capabilities`): read by every review that
      plans an opted-in candidate. They answer from the last list and never wait on the
      API server: every replica's loop calls :meth:`refresh` each second, and the replica
      is ready only once one list came (:meth:`synced`).

    A list that fails is logged and keeps the last one. The first :meth:`refresh` also
    takes the ConfigMaps an older release kept its records in (:meth:`migrate`)."""

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        *,
        max_age: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        lister: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self._api, self.namespace = api_client, namespace
        self._max_age, self._clock = max_age, clock
        self._lister = lister or (lambda: list_items(self._api, self.namespace))
        self._lock = threading.Lock()
        #: When the list held now was taken; forgotten by a write (records are read again).
        self._read_at = float("-inf")
        #: When the list held now was taken, whatever was written since (abilities).
        self._listed_at = float("-inf")
        self._items: list[dict[str, Any]] = []
        #: Writes so far: a list started before a write does not count as fresh after it.
        self._writes = 0
        #: Set while no list is in flight; a waiting read waits on it.
        self._idle = threading.Event()
        self._idle.set()
        #: Whether the older release's ConfigMaps were taken (a test's lister has none).
        self._migrated = lister is not None

    def _start_list(self) -> int | None:
        """Claims the one list in flight: the writes it will have seen; ``None`` when
        another list holds the claim. Under the lock."""
        if not self._idle.is_set():
            return None
        self._idle.clear()
        return self._writes

    def _run_list(self, writes: int) -> None:
        """Lists, keeps the answer, and releases the claim."""
        started = self._clock()
        try:
            items: list[dict[str, Any]] | None = self._lister()
        except ClusterError as e:
            log.warning("could not read checkpoint records: %s", e)
            items = None
        except Exception:  # the thread's last word: never leave the claim held
            log.exception("reading checkpoint records failed")
            items = None
        with self._lock:
            if items is not None:
                self._items, self._listed_at = items, started
                self._read_at = started if writes == self._writes else float("-inf")
            self._idle.set()

    def _fresh(self) -> list[dict[str, Any]]:
        """The objects, listed again first when older than ``max_age`` or than the last
        write."""
        for _ in range(2):
            with self._lock:
                if self._clock() - self._read_at <= self._max_age:
                    return self._items
                writes = self._start_list()
            if writes is not None:
                self._run_list(writes)
                break
            self._idle.wait(10.0)  # a review's list is in flight: its answer may do
        with self._lock:
            return self._items

    def refresh(self) -> None:
        """Lists now unless a list is in flight: every replica's loop calls it each
        ``max_age`` seconds, so that the abilities a review reads are about that old."""
        if not self._migrated:
            self.migrate()
        with self._lock:
            writes = self._start_list()
        if writes is not None:
            self._run_list(writes)

    def migrate(self) -> None:
        """Reads, reports and deletes the ConfigMaps an older release kept its records and
        abilities in; none is acted on. Their writer cannot be told: any account with
        ConfigMap rights in this namespace (every node agent had them) could have written
        one, that release signed nothing, and a ConfigMap's managed fields name the
        manager its writer chose. A record taken here is not restored; its node agent's
        sweep deletes its archives (docs/checkpoint.md, "Upgrading")."""
        try:
            for selector in (LEGACY_SELECTOR, LEGACY_ABILITY_SELECTOR):
                for item in list_items_of(self._api, self.namespace, selector):
                    self._retire(item)
        except ClusterError as e:
            log.warning("older checkpoint ConfigMaps not read yet: %s", e)
            return
        self._migrated = True

    def _retire(self, item: Mapping[str, Any]) -> None:
        meta = item.get("metadata") or {}
        name = str(meta.get("name") or "")
        node = ((meta.get("labels") or {}).get("resize-preemption.io/node")) or "?"
        log.warning(
            "ConfigMap %s/%s (node %s) was left by an older release: not restored, deleted; "
            "its writer cannot be told from its content",
            *(self.namespace, name, node),
        )
        with contextlib.suppress(NotFound):
            request_json(
                self._api,
                "DELETE",
                f"/api/v1/namespaces/{quote(self.namespace)}/configmaps/{quote(name)}",
                timeout=10,
            )

    def synced(self) -> bool:
        """Whether the abilities were listed once: the service's readiness, so that no
        review reaches a replica that would find no node able to checkpoint (and evict a
        victim that asked to be checkpointed)."""
        with self._lock:
            return self._listed_at != float("-inf")

    def _cached(self) -> list[dict[str, Any]]:
        """The objects of the last list, as :meth:`refresh` left them."""
        with self._lock:
            return self._items

    def capability(self, node: str) -> NodeCheckpointing | None:
        return next((a for a in abilities_in(self._cached()) if a.node == node), None)

    def capabilities(self) -> list[NodeCheckpointing]:
        return abilities_in(self._cached())

    def records(self) -> Sequence[CheckpointRecord]:
        return records_in(self._fresh())

    def record(self, uid: str) -> CheckpointRecord | None:
        return next((r for r in self.records() if r.uid == uid), None)

    def write(self, record: CheckpointRecord) -> bool:
        """Create ``record`` (its spec, once: the API server refuses a change of it), then
        write its status. A record this call created whose status was not written is
        deleted again: the caller takes the write as failed and evicts the victim as if
        never checkpointed, so no record of it may stay to be imaged and restored."""
        path = records_path(self.namespace)
        created = False
        try:
            try:
                request_json(self._api, "POST", path, body=record_object(record), timeout=10)
                created = True
            except Conflict:
                pass  # written before: only its status changes
            request_json(
                self._api,
                "PATCH",
                f"{path}/{quote(record.name)}/status",
                body={"status": record.status()},
                content_type=MERGE_PATCH,
                timeout=10,
            )
        except ClusterError as e:
            log.warning("could not write %s: %s", record.name, e)
            if created:
                with contextlib.suppress(ClusterError):
                    request_json(self._api, "DELETE", f"{path}/{quote(record.name)}", timeout=10)
            return False
        finally:
            self._forget()
        return True

    def _forget(self) -> None:
        """After a write: records are listed again before the next answer."""
        with self._lock:
            self._read_at = float("-inf")
            self._writes += 1

    # -- the node agent's side (webhook.agent.records.CheckpointStore) --------------------

    def records_on(self, node: str) -> list[CheckpointRecord]:
        """Every record of ``node`` (its ``spec.node``), listed now, each with its
        resourceVersion; raises ``ClusterError``."""
        listed = request_json(
            self._api,
            "GET",
            records_path(self.namespace),
            query={"fieldSelector": f"spec.node={node}"},
            timeout=5,
        )
        items = [i for i in listed.get("items") or () if isinstance(i, dict)]
        return [r for r in records_in(items) if r.node == node]

    def update(self, record: CheckpointRecord) -> bool:
        """Write ``record``'s status over the record as it was read (``record.version``):
        False when it changed or went since; raises ``ClusterError`` otherwise."""
        body: dict[str, Any] = {"status": record.status()}
        if record.version:
            body["metadata"] = {"resourceVersion": record.version}
        path = f"{records_path(self.namespace)}/{quote(record.name)}/status"
        try:
            request_json(self._api, "PATCH", path, body=body, content_type=MERGE_PATCH, timeout=10)
        except (Conflict, NotFound):
            return False
        finally:
            self._forget()
        return True

    def delete(self, name: str) -> None:
        """Delete record ``name``; gone already is fine. Raises ``ClusterError``."""
        try:
            request_json(
                self._api, "DELETE", f"{records_path(self.namespace)}/{quote(name)}", timeout=10
            )
        except NotFound:
            pass
        finally:
            self._forget()

    def publish(self, ability: NodeCheckpointing, now: float) -> None:
        """Write what the node can do into the status of its ``CheckpointNode``, created
        first when there is none; raises ``ClusterError``."""
        path = nodes_path(self.namespace)
        status = {"status": ability.status(now)}
        target = f"{path}/{quote(ability.node)}/status"
        try:
            request_json(
                self._api, "PATCH", target, body=status, content_type=MERGE_PATCH, timeout=10
            )
        except NotFound:
            with contextlib.suppress(Conflict):
                request_json(self._api, "POST", path, body=node_object(ability.node), timeout=10)
            request_json(
                self._api, "PATCH", target, body=status, content_type=MERGE_PATCH, timeout=10
            )


def records_path(namespace: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{RECORDS}"


def nodes_path(namespace: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{NODES}"


def list_items(api: Any, namespace: str) -> list[dict[str, Any]]:
    """The records and the nodes' abilities in ``namespace``, each with its ``kind``;
    raises ``ClusterError``."""
    found = []
    for path, kind in ((records_path(namespace), RECORD_KIND), (nodes_path(namespace), NODE_KIND)):
        listed = request_json(api, "GET", path, timeout=5)
        found += [{**i, "kind": kind} for i in listed.get("items") or () if isinstance(i, dict)]
    return found


def list_items_of(api: Any, namespace: str, selector: str) -> list[dict[str, Any]]:
    """The ConfigMaps of ``namespace`` that ``selector`` selects; raises ``ClusterError``."""
    path = f"/api/v1/namespaces/{quote(namespace)}/configmaps"
    listed = request_json(api, "GET", path, query={"labelSelector": selector}, timeout=5)
    return [i for i in listed.get("items") or () if isinstance(i, dict)]


def abilities_in(items: Sequence[Mapping[str, Any]]) -> list[NodeCheckpointing]:
    """The node abilities among ``items``: each ``CheckpointNode`` whose name is the node
    its spec names."""
    found = []
    for item in items:
        if item.get("kind") == NODE_KIND:
            ability = NodeCheckpointing.from_object(item)
            if ability.node and ability.node == _name(item):
                found.append(ability)
    return found


def records_in(items: Sequence[Mapping[str, Any]]) -> list[CheckpointRecord]:
    """The checkpoint records among ``items``; one that does not parse is logged and left
    out."""
    found = []
    for item in items:
        if item.get("kind", RECORD_KIND) != RECORD_KIND:
            continue
        try:
            found.append(CheckpointRecord.from_object(item))
        except ValueError as e:
            log.warning("%s", e)
    return found


def _name(item: Mapping[str, Any]) -> str:
    return str((item.get("metadata") or {}).get("name") or "")


class PodCreator:
    """Creates a restored pod (:class:`~webhook.engine.pauses.PodCreator`), its sealed
    env values opened first (:mod:`webhook.kube.sealing`)."""

    def __init__(self, api_client: Any, sealer: EnvSealer | None = None) -> None:
        self._api = api_client
        self._sealer = sealer

    def create(self, manifest: Mapping[str, Any]) -> str:
        namespace = str((manifest.get("metadata") or {}).get("namespace") or "default")
        if self._sealer is not None:
            try:
                manifest = self._sealer.open(manifest)
            except SealError as e:
                return str(e)
        try:
            request_json(
                self._api, "POST", f"/api/v1/namespaces/{namespace}/pods", body=manifest, timeout=10
            )
        except Conflict:
            return "a pod of that name exists"
        except NotFound:
            return f"namespace {namespace} is gone"
        except ClusterError as e:
            return str(e)
        return ""


__all__ = [
    "KubeletCheckpointer",
    "PodCheckpoints",
    "PodCreator",
]
