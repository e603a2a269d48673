"""Counting the evictions that took effect from the audit log (harness/audit.py)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from harness.audit import deletion_time, evictions_made

T0 = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def call(name: str, code: int, seconds: float, namespace: str = "ns") -> dict[str, Any]:
    received = T0 + dt.timedelta(seconds=seconds)
    return {
        "stage": "ResponseComplete",
        "objectRef": {"namespace": namespace, "name": name, "subresource": "eviction"},
        "responseStatus": {"code": code},
        "requestReceivedTimestamp": received.isoformat().replace("+00:00", "Z"),
    }


@pytest.mark.parametrize(
    ("expected", "calls", "deleted_at"),
    [
        pytest.param({"a": 1}, [call("a", 201, 1.2)], 1, id="one-accepted"),
        pytest.param(
            {"a": 1}, [call("a", 429, 1.0), call("a", 201, 2.5)], 2, id="refused-then-accepted"
        ),
        pytest.param({"a": 1}, [call("a", 504, 1.0)], 1, id="cut-off-but-deleted"),
        pytest.param({}, [call("a", 504, 1.0)], None, id="cut-off-never-deleted"),
        pytest.param(
            {"a": 2},
            [call("a", 504, 1.0), call("a", 201, 3.4)],
            1,
            id="cut-off-deleted-then-accepted-again",
        ),
        pytest.param(
            {"a": 1},
            [call("a", 504, 1.0), call("a", 201, 3.4)],
            3,
            id="cut-off-then-the-accepted-one-deleted",
        ),
        pytest.param({"a": 2}, [call("a", 201, 1.0), call("a", 201, 1.5)], 1, id="accepted-twice"),
        pytest.param({}, [call("a", 201, 1.0, namespace="other")], 1, id="other-namespace"),
    ],
)
def test_evictions_made(
    tmp_path: Path, expected: dict[str, int], calls: list[dict[str, Any]], deleted_at: int | None
) -> None:
    log = tmp_path / "audit.log"
    log.write_text("".join(json.dumps(c) + "\n" for c in calls) + '{"partial": ')
    deleted = {} if deleted_at is None else {"a": T0 + dt.timedelta(seconds=deleted_at)}
    assert expected == dict(evictions_made(log, "ns", deleted))


@pytest.mark.parametrize(
    ("expected", "metadata"),
    [
        pytest.param(None, {"name": "a"}, id="running"),
        pytest.param(
            T0 + dt.timedelta(seconds=10),
            {
                "name": "a",
                "deletionTimestamp": "2026-01-01T12:00:40Z",
                "deletionGracePeriodSeconds": 30,
            },
            id="terminating-with-grace",
        ),
        pytest.param(
            T0, {"name": "a", "deletionTimestamp": "2026-01-01T12:00:00Z"}, id="no-grace-recorded"
        ),
    ],
)
def test_deletion_time(expected: dt.datetime | None, metadata: dict[str, Any]) -> None:
    assert expected == deletion_time({"metadata": metadata})
