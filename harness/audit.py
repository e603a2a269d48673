"""Reading the API server's audit log (JSON lines) that the launcher writes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def audit_events(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete event in the log; a line still being written is skipped."""
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


def eviction_codes(path: Path, namespace: str) -> dict[str, list[int]]:
    """Eviction requests answered in ``namespace``: pod name -> response codes, in order."""
    codes: dict[str, list[int]] = {}
    for event in audit_events(path):
        ref = event.get("objectRef") or {}
        if (
            ref.get("subresource") == "eviction"
            and ref.get("namespace") == namespace
            and event.get("stage") == "ResponseComplete"
        ):
            code = (event.get("responseStatus") or {}).get("code", 0)
            codes.setdefault(str(ref.get("name", "")), []).append(int(code))
    return codes
