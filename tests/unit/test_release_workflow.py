"""The release workflow (.github/workflows/release.yml), checked for its structure: no
workflow runner runs here, so what it does is read, not run. A tag builds the image for
both architectures with an SBOM, pushes the chart as an OCI artifact, and signs both by
digest; no registry is written into it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def workflow() -> dict[str, Any]:
    loaded: dict[Any, Any] = yaml.safe_load(WORKFLOW.read_text())
    # YAML 1.1 reads the key `on` as true.
    loaded["on"] = loaded.pop(True, loaded.get("on"))
    return loaded


def steps(job: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = workflow()["jobs"][job]["steps"]
    return found


def step_using(job: str, action: str) -> dict[str, Any]:
    (found,) = [s for s in steps(job) if str(s.get("uses", "")).startswith(f"{action}@")]
    return found


def scripts(job: str) -> str:
    return "\n".join(str(s.get("run", "")) for s in steps(job))


def test_a_version_tag_starts_it_with_the_rights_to_push_and_sign() -> None:
    flow = workflow()
    assert {"push": {"tags": ["v*.*.*"]}} == flow["on"]
    assert {"contents": "write", "packages": "write", "id-token": "write"} == flow["permissions"]
    assert ["image"] == [workflow()["jobs"]["chart"]["needs"]]


def test_the_image_is_built_for_both_architectures_with_an_sbom_and_pushed() -> None:
    build = step_using("image", "docker/build-push-action")["with"]
    assert ["linux/amd64", "linux/arm64"] == build["platforms"].split(",")
    assert (True, True) == (build["push"], build["sbom"])
    labels = build["labels"]
    for key in ("version", "revision", "source"):
        assert f"org.opencontainers.image.{key}=" in labels
    step_using("image", "docker/setup-qemu-action")
    sbom = step_using("image", "anchore/sbom-action")["with"]
    assert sbom["image"].endswith("@${{ steps.build.outputs.digest }}")
    assert "gh release upload" in scripts("image")


def test_the_tag_must_be_the_packages_version() -> None:
    assert 'grep -qx "version = \\"$version\\"" pyproject.toml' in scripts("image")


@pytest.mark.parametrize("job", ["image", "chart"])
def test_what_is_pushed_is_signed_by_digest(job: str) -> None:
    step_using(job, "sigstore/cosign-installer")
    assert re.search(r'cosign sign --yes "\$\w+(/resize-preemption-webhook)?@', scripts(job))


def test_the_chart_is_pushed_as_an_oci_artifact_running_the_pushed_image() -> None:
    run = scripts("chart")
    assert 'helm package "$chart" --version "$VERSION" --app-version "$VERSION"' in run
    assert (
        'helm push "dist/resize-preemption-webhook-$VERSION.tgz" "oci://$CHART_REPOSITORY"' in run
    )
    # The packaged chart names the pushed image: it installs without image.localBuild.
    assert "repository: $IMAGE_REPOSITORY" in run
    assert 'digest: \\"$DIGEST\\"' in run


def test_no_registry_is_written_in_it_and_every_action_is_pinned() -> None:
    flow = workflow()
    assert {
        "IMAGE_REPOSITORY": "${{ vars.IMAGE_REPOSITORY }}",
        "CHART_REPOSITORY": "${{ vars.CHART_REPOSITORY }}",
    } == flow["env"]
    text = WORKFLOW.read_text()
    assert not re.search(r"\b[a-z0-9-]+\.(io|com|dev)/", text)
    uses = [s["uses"] for job in flow["jobs"] for s in steps(job) if "uses" in s]
    assert uses
    for action in uses:
        assert re.fullmatch(r"[\w-]+/[\w-]+@(v\d+|[0-9a-f]{40})", action), action
