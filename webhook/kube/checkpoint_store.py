"""The node agent's :class:`~webhook.agent.records.CheckpointStore` over the API server:
ConfigMaps in the service's namespace (docs/checkpoint.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from webhook.agent.records import (
    Record,
    StaleRecord,
    capability_labels,
    capability_name,
)
from webhook.core.checkpoint import CHECKPOINT_LABEL, NODE_LABEL, PHASE_LABEL
from webhook.kube.errors import translate


class ConfigMapCheckpointStore:
    """Records and capabilities as ConfigMaps of ``namespace``."""

    def __init__(self, api: Any, namespace: str) -> None:
        # The generated client's signatures want model objects; it takes plain dicts too.
        self.core: Any = k8s.CoreV1Api(api)
        self.namespace = namespace

    def records(self, node: str) -> list[Record]:
        selector = f"{CHECKPOINT_LABEL}=true,{NODE_LABEL}={node}"
        try:
            listed = self.core.list_namespaced_config_map(self.namespace, label_selector=selector)
        except Exception as e:
            raise translate(e) from e
        return [
            Record(item.metadata.name, dict(item.data or {}), item.metadata.resource_version or "")
            for item in listed.items
        ]

    def update(self, record: Record, data: Mapping[str, str], node: str) -> None:
        metadata: dict[str, Any] = {"resourceVersion": record.version} if record.version else {}
        if "phase" in data:
            metadata["labels"] = {PHASE_LABEL: data["phase"], NODE_LABEL: node}
        body = {"metadata": metadata, "data": dict(data)}
        try:
            self.core.patch_namespaced_config_map(record.name, self.namespace, body)
        except ApiException as e:
            if e.status in (404, 409):
                raise StaleRecord(record.name) from None
            raise translate(e) from e
        except Exception as e:
            raise translate(e) from e

    def delete(self, name: str) -> None:
        try:
            self.core.delete_namespaced_config_map(name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise translate(e) from e
        except Exception as e:
            raise translate(e) from e

    def publish(self, node: str, data: Mapping[str, str]) -> None:
        name = capability_name(node)
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "labels": capability_labels(node)},
            "data": dict(data),
        }
        try:
            try:
                self.core.replace_namespaced_config_map(name, self.namespace, body)
            except ApiException as e:
                if e.status != 404:
                    raise
                self.core.create_namespaced_config_map(self.namespace, body)
        except Exception as e:
            raise translate(e) from e
