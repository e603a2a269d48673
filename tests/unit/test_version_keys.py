"""The e2e suite's version keys: a test marked ``needs_kube``/``needs_gate`` is skipped, with
a reason naming the version, exactly where the binaries under test cannot run it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.binaries import Binaries
from tests.e2e.conftest import (
    SCHEDULER_GATE,
    SYNC_RETRY_1_33,
    UPSTREAM_WHY,
    missing_requirement,
    resize_retry_delay,
)

HELP = {
    "v1.37.2": f"              kube:{SCHEDULER_GATE}=true|false (ALPHA - default=false)\n",
    "v1.33.13": "              kube:InPlacePodVerticalScaling=true|false (BETA - default=true)\n",
}


def binaries_of(tmp_path: Path, version: str) -> Binaries:
    """A kube-apiserver that says it is ``version`` and lists that version's gates."""
    apiserver = tmp_path / "kube-apiserver"
    apiserver.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = --version ] && {{ echo "Kubernetes {version}"; exit 0; }}\n'
        f"cat <<'HELP'\n{HELP[version]}HELP\n"
    )
    apiserver.chmod(0o755)
    return Binaries(tmp_path)


@dataclass
class Mark:
    name: str
    args: tuple[object, ...]


@dataclass
class Item:
    """What :func:`missing_requirement` reads of a pytest item: its marks."""

    marks: list[Mark] = field(default_factory=list)

    def iter_markers(self, name: str) -> list[Mark]:
        return [m for m in self.marks if m.name == name]


UPSTREAM = [
    Mark("needs_kube", (37, UPSTREAM_WHY)),
    Mark("needs_gate", (SCHEDULER_GATE, UPSTREAM_WHY)),
]


@pytest.mark.parametrize(
    ("version", "held_off", "marks", "expected"),
    [
        ("v1.37.2", "", UPSTREAM, None),
        ("v1.37.2", "", [], None),
        ("v1.33.13", "", [], None),
        (
            "v1.33.13",
            "",
            UPSTREAM,
            f"needs v1.37+: {UPSTREAM_WHY} (this cluster: v1.33.13)",
        ),
        (
            "v1.37.2",
            SCHEDULER_GATE,
            UPSTREAM,
            f"{SCHEDULER_GATE} held off by RPW_FEATURE_GATES_OFF: {UPSTREAM_WHY}"
            " (this cluster: v1.37.2)",
        ),
        (
            "v1.33.13",
            "",
            [Mark("needs_gate", (SCHEDULER_GATE, "why"))],
            f"needs a version with {SCHEDULER_GATE}: why (this cluster: v1.33.13)",
        ),
    ],
    ids=[
        "v1.37-runs-upstream",
        "v1.37-unmarked",
        "v1.33-unmarked",
        "v1.33-skips-upstream",
        "v1.37-gate-off-skips-upstream",
        "gate-absent",
    ],
)
def test_a_marked_test_is_skipped_with_the_versions_reason_only_where_it_cannot_run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    version: str,
    held_off: str,
    marks: list[Mark],
    expected: str | None,
) -> None:
    monkeypatch.setenv("RPW_FEATURE_GATES_OFF", held_off)
    binaries = binaries_of(tmp_path, version)

    assert expected == missing_requirement(Item(marks), binaries)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("version", "delay"), [("v1.33.13", SYNC_RETRY_1_33), ("v1.37.2", 0.0)], ids=["1.33", "1.37"]
)
def test_a_1_33_kubelet_is_given_its_sync_for_a_deferred_resize(
    tmp_path: Path, version: str, delay: float
) -> None:
    assert delay == resize_retry_delay(binaries_of(tmp_path, version))
