"""Unit tests never build or install a binary: a test that needs helm, promtool or the
Kubernetes binaries lives in tests/e2e and says in its docstring what it builds. This
reads every unit test module for the harness's builders and the build scripts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent
#: What builds, downloads or installs: the harness's functions and the scripts.
BUILDERS = re.compile(
    r"\b(ensure_binaries|helm_binary|ensure_node_stack|ensure_images|ensure_vpa|ensure_archive"
    r"|ensure_base)\b|(build-[a-z-]+|install-test-tools)\.sh"
)
#: Tests of the build scripts' own overrides, which prove nothing is built (the cache
#: directory stays absent), and of the image's cache key, which names the image's build
#: script as one of its inputs and reads it as text.
OVERRIDE_TESTS = {"test_node_scripts.py", "test_images.py"}


@pytest.mark.parametrize(
    "module",
    sorted(
        p.name for p in UNIT.glob("*.py") if p.name not in OVERRIDE_TESTS | {Path(__file__).name}
    ),
)
def test_a_unit_test_module_names_no_builder(module: str) -> None:
    found = [m.group(0) for m in BUILDERS.finditer((UNIT / module).read_text(encoding="utf-8"))]

    assert [] == found


def test_the_pattern_finds_a_builder() -> None:
    text = (
        "from harness.binaries import ensure_binaries\nsubprocess.run(['scripts/build-tools.sh'])"
    )

    assert ["ensure_binaries", "build-tools.sh"] == [m.group(0) for m in BUILDERS.finditer(text)]
