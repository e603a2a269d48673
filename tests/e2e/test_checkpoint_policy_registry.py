"""The chart's admission policy for checkpoint images with ``checkpoint.registry``, on the
real API server: images under the registry repository are checkpoint images exactly as the
local ones are (only the service creates a pod from one, only the pod it was taken of),
the local ones stay so, and the registry's other images are any image."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import Cluster
from tests.e2e.test_checkpoint_policy import (
    PREFIX,
    create_as,
    pod,
    policy_in_force,
    switch_refused,
)

pytestmark = pytest.mark.e2e

REPOSITORY = "registry.example:5000/rpw-checkpoints"


@pytest.fixture(scope="module")
def callers(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    values = {"checkpoint.registry.repository": REPOSITORY}
    with policy_in_force(cluster, tmp_path_factory, values) as in_force:
        yield in_force


ONLY_THE_SERVICE = "only the resize-preemption-webhook service creates pods from checkpoint images"


@pytest.mark.parametrize(
    ("caller", "manifest", "refused_with"),
    [
        pytest.param("admin", pod("a", f"{REPOSITORY}/{{ns}}/a/main:1"), ONLY_THE_SERVICE,
                     id="admin-from-a-pushed-checkpoint"),
        pytest.param("admin", pod("b", f"{PREFIX}/{{ns}}/b/main:1"), ONLY_THE_SERVICE,
                     id="admin-from-a-local-checkpoint"),
        pytest.param("admin", pod("c", "registry.example:5000/tools/c:1"), "",
                     id="admin-another-image-of-the-registry"),
        pytest.param("service",
                     pod("d", f"{REPOSITORY}/{{ns}}/d/main:0123456789ab", restored=True), "",
                     id="service-restores-from-the-registry"),
        pytest.param("service",
                     pod("e", f"{REPOSITORY}/{{ns}}/other/main:1", restored=True),
                     "a checkpoint image restores only the pod it was taken of",
                     id="service-another-pods-pushed-checkpoint"),
    ],
)  # fmt: skip
def test_who_may_create_a_pod_from_a_pushed_checkpoint_image(
    callers: dict[str, Any], caller: str, manifest: dict[str, Any], refused_with: str
) -> None:
    create_as(callers, caller, manifest, refused_with)


def test_a_pod_already_there_cannot_be_switched_to_a_pushed_checkpoint_image(
    callers: dict[str, Any],
) -> None:
    switch_refused(callers, REPOSITORY)
