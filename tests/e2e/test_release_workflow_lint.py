"""The release workflow (.github/workflows/release.yml) through actionlint, as GitHub would
read it: its syntax and expressions, each action's inputs and outputs, each step's `run:`
script through shellcheck. No workflow runner runs here; tests/unit/test_release_workflow.py
checks what the workflow does.

actionlint is built from the Go module proxy (scripts/build-actionlint.sh) and shellcheck
installed from Debian (scripts/install-test-tools.sh) when missing; no cluster."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from harness.binaries import REPO_ROOT

pytestmark = pytest.mark.e2e

WORKFLOW = REPO_ROOT / ".github" / "workflows" / "release.yml"
BUILD = REPO_ROOT / "scripts" / "build-actionlint.sh"
INSTALL = REPO_ROOT / "scripts" / "install-test-tools.sh"


@pytest.fixture(scope="module")
def lint() -> list[str]:
    """The actionlint command line, shellcheck named."""
    built = subprocess.run(
        ["bash", str(BUILD)], capture_output=True, text=True, timeout=1800, check=False
    )
    assert 0 == built.returncode, built.stderr
    if shutil.which("shellcheck") is None:
        subprocess.run(["bash", str(INSTALL)], check=True, timeout=900)
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, f"{INSTALL.name} did not install shellcheck"
    actionlint = Path(built.stdout.strip().splitlines()[-1]) / "actionlint"
    return [str(actionlint), "-no-color", "-shellcheck", shellcheck]


def run_on(lint: list[str], text: str, root: Path) -> subprocess.CompletedProcess[str]:
    """actionlint on ``text`` as ``root``'s .github/workflows/release.yml."""
    path = root / ".github" / "workflows" / "release.yml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return subprocess.run(
        [*lint, str(path.relative_to(root))],
        cwd=root, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_release_workflow_passes_actionlint(lint: list[str], tmp_path: Path) -> None:
    result = run_on(lint, WORKFLOW.read_text(), tmp_path)
    assert (0, "") == (result.returncode, result.stdout + result.stderr)


#: Mistakes actionlint must find in the workflow: (what the workflow's text becomes, what
#: actionlint says of it). Each shows that the check above can fail.
MISTAKES = [
    pytest.param(
        ("steps.build.outputs.digest }}", "steps.biuld.outputs.digest }}"),
        'property "biuld" is not defined', id="an-unknown-step",
    ),
    pytest.param(
        ("platforms: linux/amd64,linux/arm64", "platform: linux/amd64,linux/arm64"),
        'input "platform" is not defined in action "docker/build-push-action@v6"',
        id="an-input-the-action-lacks",
    ),
    pytest.param(
        ('grep -qx "version = \\"$version\\"" pyproject.toml', "grep -qx $version pyproject.toml"),
        "SC2086", id="an-unquoted-variable-in-a-script",
    ),
    pytest.param(
        ("runs-on: ubuntu-latest", "runs_on: ubuntu-latest"),
        'unexpected key "runs_on" for "job" section', id="a-misspelt-key",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("change", "said"), MISTAKES)
def test_actionlint_finds_each_mistake(
    lint: list[str], tmp_path: Path, change: tuple[str, str], said: str
) -> None:
    before, after = change
    text = WORKFLOW.read_text()
    assert before in text, f"the workflow no longer has {before!r}: update this case"
    result = run_on(lint, text.replace(before, after, 1), tmp_path)
    assert 1 == result.returncode, result.stdout + result.stderr
    assert said in result.stdout, result.stdout
