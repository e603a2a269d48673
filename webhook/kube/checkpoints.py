"""The cluster's side of checkpoints: the kubelet's checkpoint API, the records and node
abilities (ConfigMaps in the service's namespace), and creating a pod again.

* :class:`KubeletCheckpointer` asks the victim's kubelet, directly on its own port
  (``POST /checkpoint/{namespace}/{pod}/{container}``, authorized as ``create`` on
  ``nodes/checkpoint``: the API server's node proxy would need ``nodes/proxy``, which
  also grants exec), for a checkpoint of each container, within the victim's grace
  period. The kubelet writes each archive under its root and answers its path.
* :class:`ConfigMapCheckpoints` reads and writes the records
  (:class:`~webhook.core.checkpoint.CheckpointRecord`) and the abilities the node
  agents publish (:class:`~webhook.core.checkpoint.NodeCheckpointing`), one list of the
  namespace's labelled ConfigMaps per second at most. Reviews read abilities only, from
  what the last list left, and never wait on the API server for long.
  The node agents use it too, on their side of the same records: their node's records
  read fresh, each updated only as it was read (its resourceVersion), their abilities
  published (:mod:`webhook.agent.records`).
* :class:`PodCreator` creates the restored pod.

The service's calls never raise: failures are answers (a message, ``False``), logged by
the caller. The agent's raise ``ClusterError``, and its pass is tried again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final
from urllib.parse import quote

import orjson
import urllib3

from webhook.core.checkpoint import (
    CAPABILITY_PREFIX,
    CHECKPOINT_LABEL,
    MANAGED_BY,
    NODE_LABEL,
    RECORD_OPTIONAL_KEYS,
    CheckpointRecord,
    NodeCheckpointing,
    capability_labels,
    capability_name,
    record_labels,
    record_name,
)
from webhook.core.model import PodRef
from webhook.engine.pauses import Checkpointed
from webhook.kube.errors import ClusterError, Conflict, NotFound
from webhook.kube.evictor import grace_of
from webhook.kube.jsonapi import pod_path, request_json

log = logging.getLogger(__name__)

SELECTOR: Final = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
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
    ) -> None:
        self._api = api_client
        self._cap = grace_period_cap
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
            return Checkpointed(_as_stored(pod), archives, grace, self._clock() - start)
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


class ConfigMapCheckpoints:
    """The :class:`~webhook.engine.pauses.CheckpointStore` of ConfigMaps in ``namespace``.

    Two kinds of read, on one list of the namespace's labelled ConfigMaps:

    * records (:meth:`records`, :meth:`record`): the leader's worker only. Older than
      ``max_age``, they are listed again before the answer, so that a record the worker
      just wrote is read back (a write forgets the list);
    * abilities (:meth:`capability`, :meth:`capabilities`): read by every review that
      plans an opted-in candidate. They answer from the last list and never wait on the
      API server: every replica's loop calls :meth:`refresh` each second, and the replica
      is ready only once one list came (:meth:`synced`).

    A list that fails is logged and keeps the last one."""

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
        """The ConfigMaps, listed again first when older than ``max_age`` or than the
        last write."""
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
        with self._lock:
            writes = self._start_list()
        if writes is not None:
            self._run_list(writes)

    def synced(self) -> bool:
        """Whether the abilities were listed once: the service's readiness, so that no
        review reaches a replica that would find no node able to checkpoint (and evict a
        victim that asked to be checkpointed)."""
        with self._lock:
            return self._listed_at != float("-inf")

    def _cached(self) -> list[dict[str, Any]]:
        """The ConfigMaps of the last list, as :meth:`refresh` left them."""
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
        labels, data = record_labels(record.node, record.phase), record.data()
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": record.name, "namespace": self.namespace, "labels": labels},
            "data": data,
        }
        path = f"/api/v1/namespaces/{self.namespace}/configmaps"
        try:
            try:
                request_json(self._api, "POST", path, body=body, timeout=10)
            except Conflict:
                request_json(
                    self._api,
                    "PATCH",
                    f"{path}/{record.name}",
                    body={"metadata": {"labels": labels}, "data": {**_CLEARED, **data}},
                    content_type="application/merge-patch+json",
                    timeout=10,
                )
        except ClusterError as e:
            log.warning("could not write %s: %s", record.name, e)
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
        """Every record of ``node``, listed now, each with its resourceVersion; raises
        ``ClusterError``."""
        selector = f"{CHECKPOINT_LABEL}=true,{NODE_LABEL}={node}"
        return records_in(list_items(self._api, self.namespace, selector))

    def update(self, record: CheckpointRecord) -> bool:
        """Write ``record`` over its ConfigMap as it was read (``record.version``): False
        when the ConfigMap changed or went since; raises ``ClusterError`` otherwise."""
        labels = record_labels(record.node, record.phase)
        metadata: dict[str, Any] = {"labels": labels}
        if record.version:
            metadata["resourceVersion"] = record.version
        path = f"/api/v1/namespaces/{self.namespace}/configmaps/{record.name}"
        try:
            request_json(
                self._api,
                "PATCH",
                path,
                body={"metadata": metadata, "data": {**_CLEARED, **record.data()}},
                content_type="application/merge-patch+json",
                timeout=10,
            )
        except (Conflict, NotFound):
            return False
        finally:
            self._forget()
        return True

    def delete(self, name: str) -> None:
        """Delete record ``name``; gone already is fine. Raises ``ClusterError``."""
        path = f"/api/v1/namespaces/{self.namespace}/configmaps/{name}"
        try:
            request_json(self._api, "DELETE", path, timeout=10)
        except NotFound:
            pass
        finally:
            self._forget()

    def publish(self, ability: NodeCheckpointing, now: float) -> None:
        """Create or replace ``rpw-node-<node>`` with what the node can do; raises
        ``ClusterError``."""
        name = capability_name(ability.node)
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "labels": capability_labels(ability.node)},
            "data": ability.data(now),
        }
        path = f"/api/v1/namespaces/{self.namespace}/configmaps"
        try:
            request_json(self._api, "PUT", f"{path}/{name}", body=body, timeout=10)
        except NotFound:
            request_json(self._api, "POST", path, body=body, timeout=10)


#: The record's optional keys, removed by a write that does not carry them (JSON merge
#: patch: null deletes), so that a record reads back exactly as it was written.
_CLEARED: Final[dict[str, None]] = dict.fromkeys(RECORD_OPTIONAL_KEYS)


def list_items(api: Any, namespace: str, selector: str = SELECTOR) -> list[dict[str, Any]]:
    """The service's labelled ConfigMaps in ``namespace`` (those ``selector`` selects);
    raises ``ClusterError``."""
    path = f"/api/v1/namespaces/{quote(namespace)}/configmaps"
    listed = request_json(api, "GET", path, query={"labelSelector": selector}, timeout=5)
    return [i for i in listed.get("items") or () if isinstance(i, dict)]


def abilities_in(items: Sequence[Mapping[str, Any]]) -> list[NodeCheckpointing]:
    """The node abilities among the ConfigMaps ``items``."""
    found = []
    for item in items:
        if _name(item).startswith(CAPABILITY_PREFIX):
            node = _labels(item).get(NODE_LABEL) or _name(item)[len(CAPABILITY_PREFIX) :]
            found.append(NodeCheckpointing.from_data(node, item.get("data") or {}))
    return found


def records_in(items: Sequence[Mapping[str, Any]]) -> list[CheckpointRecord]:
    """The checkpoint records among the ConfigMaps ``items``; one that does not parse is
    logged and left out."""
    found = []
    for item in items:
        if _labels(item).get(CHECKPOINT_LABEL) != "true":
            continue
        uid = _name(item).removeprefix(record_name(""))
        node = _labels(item).get(NODE_LABEL, "")
        version = str((item.get("metadata") or {}).get("resourceVersion") or "")
        try:
            found.append(CheckpointRecord.from_data(uid, node, item.get("data") or {}, version))
        except ValueError as e:
            log.warning("%s", e)
    return found


def _name(item: Mapping[str, Any]) -> str:
    return str((item.get("metadata") or {}).get("name") or "")


def _labels(item: Mapping[str, Any]) -> Mapping[str, str]:
    return (item.get("metadata") or {}).get("labels") or {}


class PodCreator:
    """Creates a restored pod (:class:`~webhook.engine.pauses.PodCreator`)."""

    def __init__(self, api_client: Any) -> None:
        self._api = api_client

    def create(self, manifest: Mapping[str, Any]) -> str:
        namespace = str((manifest.get("metadata") or {}).get("namespace") or "default")
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
    "ConfigMapCheckpoints",
    "KubeletCheckpointer",
    "PodCreator",
]
