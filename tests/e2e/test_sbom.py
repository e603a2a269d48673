"""`make sbom` as an operator runs it: the image `make image` builds, read by syft (the tool
the release workflow's anchore/sbom-action runs) into SPDX JSON, lists every package
requirements-runtime.lock pins, at the pinned version, and the webhook itself, in the image's
virtualenv; and no Python package there that the lock does not pin.

syft is built from the Go module proxy (scripts/build-syft.sh); the image on this machine is
built on its stand-in base (tests/e2e/test_make_image.py); no cluster."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from typing import Any

import pytest

from harness.binaries import REPO_ROOT

pytestmark = [pytest.mark.e2e, pytest.mark.image_store]

LOCK = REPO_ROOT / "requirements-runtime.lock"
PROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    """{name: version} of every ``name==version`` line of requirements-runtime.lock."""
    found = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", LOCK.read_text(), re.M)
    return {canonical(name): version for name, version in found}


@pytest.fixture(scope="module")
def sbom(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("sbom") / "rpw.spdx.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    done = subprocess.run(
        ["make", "--no-print-directory", "sbom", f"SBOM={path}"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert 0 == done.returncode, done.stderr[-3000:]
    assert str(path) == done.stdout.strip().splitlines()[-1]
    document: dict[str, Any] = json.loads(path.read_text())
    return document


#: The image's virtualenv (Dockerfile): the product's Python packages, and no others.
VENV = "/opt/venv/"


def python_packages(document: dict[str, Any]) -> dict[str, str]:
    """{name: version} of the SBOM's packages found in :data:`VENV` whose package URL is a
    PyPI one."""
    found: dict[str, str] = {}
    for package in document["packages"]:
        if VENV not in package.get("sourceInfo", ""):
            continue
        for ref in package.get("externalRefs", []):
            if m := re.fullmatch(r"pkg:pypi/([^@]+)@([^?#]+)", ref["referenceLocator"]):
                found[canonical(m[1])] = m[2]
    return found


def test_the_sbom_is_spdx_of_the_image(sbom: dict[str, Any]) -> None:
    assert sbom["spdxVersion"].startswith("SPDX-2.")
    assert any(
        ref["referenceLocator"].startswith("pkg:deb/")
        for package in sbom["packages"]
        for ref in package.get("externalRefs", [])
    ), "no Debian package of the base listed"


@pytest.mark.parametrize(("name", "version"), sorted(pins().items()), ids=sorted(pins()))
def test_every_pinned_package_is_listed_at_its_version(
    sbom: dict[str, Any], name: str, version: str
) -> None:
    assert version == python_packages(sbom).get(name), f"{name}=={version} not in the SBOM"


def test_the_webhook_itself_is_listed_at_its_version(sbom: dict[str, Any]) -> None:
    assert PROJECT["version"] == python_packages(sbom).get(canonical(PROJECT["name"]))


def test_no_python_package_is_listed_that_the_lock_does_not_pin(sbom: dict[str, Any]) -> None:
    unpinned = set(python_packages(sbom)) - set(pins()) - {canonical(PROJECT["name"])}
    assert set() == unpinned
