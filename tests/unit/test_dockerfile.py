"""The Dockerfile, checked without a Docker engine: its instructions are parsed, the
commands it runs at build time are run here, and the entrypoint it sets is started with
``--help`` to prove it resolves to the same command the Deployment runs."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from webhook.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DEPLOYMENT = REPO / "deploy" / "base" / "deployment.yaml"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int

    def exec_form(self) -> list[str]:
        """The JSON array of ENTRYPOINT/CMD; fails the test for the shell form."""
        value = json.loads(self.arguments)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value), (
            f"line {self.line}: {self.keyword} must use the exec (JSON array) form"
        )
        return value


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped (Dockerfile rules:
    a comment line inside a continued instruction is removed, not a terminator)."""
    instructions: list[Instruction] = []
    buffer: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buffer and (not line or line.startswith("#")):
            continue
        if buffer and line.startswith("#"):
            continue
        if not buffer:
            start = number
        if line.endswith("\\"):
            buffer.append(line[:-1].strip())
            continue
        buffer.append(line)
        joined = " ".join(part for part in buffer if part)
        keyword, _, arguments = joined.partition(" ")
        instructions.append(Instruction(keyword.upper(), arguments.strip(), start))
        buffer = []
    assert not buffer, "the Dockerfile ends inside a continued instruction"
    return instructions


@pytest.fixture(scope="module")
def instructions() -> list[Instruction]:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    last_from = max(i for i, ins in enumerate(instructions) if ins.keyword == "FROM")
    return instructions[last_from:]


def single(stage: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in stage if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword} in the final stage, found {len(found)}"
    return found[0]


def env_of(stage: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in stage:
        if ins.keyword == "ENV":
            for item in shlex.split(ins.arguments):
                key, sep, value = item.partition("=")
                assert sep, f"line {ins.line}: use ENV KEY=VALUE"
                env[key] = value
    return env


@pytest.fixture(scope="module")
def container() -> dict[str, Any]:
    deployment = yaml.safe_load(DEPLOYMENT.read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


# --- the instructions -------------------------------------------------------------------

KNOWN = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip


def test_every_instruction_is_a_dockerfile_instruction(instructions: list[Instruction]) -> None:
    assert instructions[0].keyword == "FROM"
    for ins in instructions:
        assert ins.keyword in KNOWN, f"line {ins.line}: unknown instruction {ins.keyword}"
        assert ins.arguments, f"line {ins.line}: {ins.keyword} without arguments"


def test_base_images_are_slim_python_311_pinned_by_tag(instructions: list[Instruction]) -> None:
    images = [ins.arguments.split()[0] for ins in instructions if ins.keyword == "FROM"]
    assert images, "no FROM"
    for image in images:
        name, _, tag = image.partition("@")[0].partition(":")
        assert name == "python", image
        assert re.fullmatch(r"3\.11(\.\d+)?-slim(-[a-z]+)?", tag), f"{image}: not pinned"
    assert len(set(images)) == 1, "build and runtime stages must share one base"


def test_final_stage_runs_as_a_numeric_non_root_user(final_stage: list[Instruction]) -> None:
    user = single(final_stage, "USER").arguments
    uid, _, gid = user.partition(":")

    assert uid == "65532", "runAsNonRoot can only verify a numeric user"
    assert gid in ("", "65532")
    after_user = final_stage[final_stage.index(single(final_stage, "USER")) :]
    assert not [i for i in after_user if i.keyword in ("RUN", "COPY", "ADD")]


def test_python_environment(final_stage: list[Instruction]) -> None:
    env = env_of(final_stage)
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"


def test_exposes_the_serving_and_metrics_ports(final_stage: list[Instruction]) -> None:
    ports = {p.split("/")[0] for p in single(final_stage, "EXPOSE").arguments.split()}
    assert ports == {"8443", "9090"}


def test_pip_installs_pinned_runtime_dependencies_without_a_cache(
    instructions: list[Instruction],
) -> None:
    installs = [
        command
        for ins in instructions
        if ins.keyword == "RUN"
        for command in re.split(r"&&|;", ins.arguments)
        if re.search(r"\bpip install\b", command)
    ]
    assert installs
    for command in installs:
        assert "--no-cache-dir" in command.split(), command
        assert "[dev]" not in command and "requirements-dev" not in command
    assert any(
        "--require-hashes" in c.split() and "-r requirements-runtime.lock" in c for c in installs
    )


def test_copied_sources_exist(instructions: list[Instruction]) -> None:
    dockerignore = (REPO / ".dockerignore").read_text().split()
    for ins in instructions:
        if ins.keyword != "COPY" or "--from=" in ins.arguments:
            continue
        *sources, _destination = ins.arguments.split()
        for source in sources:
            assert (REPO / source).exists(), f"line {ins.line}: COPY {source}: no such file"
            assert f"!{source}" in dockerignore or f"!{source}/" in dockerignore, (
                f"{source} is excluded from the build context by .dockerignore"
            )


# --- what the build runs ----------------------------------------------------------------


#: ``name==version \`` at the start of a line of a lock; its ``--hash=`` lines follow.
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


def locked(lock: str) -> dict[str, tuple[str, list[str]]]:
    """The pins of a lock: name -> (version, its hashes)."""
    pins: dict[str, tuple[str, list[str]]] = {}
    current = ""
    for line in (REPO / lock).read_text().splitlines():
        if match := _PIN.match(line):
            current = canonicalize_name(match.group(1))
            pins[current] = (match.group(2), [])
        elif line.strip().startswith("--hash="):
            pins[current][1].append(line.strip().removesuffix("\\").strip())
        else:
            text = line.split("#", 1)[0].strip()
            assert not text or text.startswith("--"), f"{lock}: {line!r} is not a pin"
    return pins


def locked_versions(lock: str = "requirements.lock") -> dict[str, str]:
    return {name: version for name, (version, _) in locked(lock).items()}


@pytest.mark.parametrize("lock", ["requirements.lock", "requirements-runtime.lock"])
def test_every_pin_of_a_lock_carries_hashes(lock: str) -> None:
    pins = locked(lock)
    assert pins
    for name, (_, hashes) in pins.items():
        assert hashes and all(h.startswith("--hash=sha256:") for h in hashes), name


def test_the_runtime_lock_is_the_full_locks_runtime_closure() -> None:
    """The image installs exactly the runtime closure, at the versions the tests ran with."""
    full, runtime = locked_versions(), locked_versions("requirements-runtime.lock")
    assert {name: full[name] for name in runtime} == runtime
    assert runtime_closure() == set(runtime)


def runtime_closure() -> set[str]:
    """The runtime requirements of pyproject.toml and theirs, as installed here (each
    within what its requirer asks, at the version requirements-runtime.lock pins)."""
    pins = locked_versions("requirements-runtime.lock")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    todo = [Requirement(r) for r in pyproject["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if name in seen:
            continue
        seen.add(name)
        assert name in pins, f"{name} (runtime dependency) is not pinned"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements-runtime.lock pins {name}=={pins[name]}, outside {requirement}"
        )
        # What the requirement's extras add is part of the closure too (gunicorn[gevent]).
        extras = {"", *requirement.extras}
        for text in metadata.requires(requirement.name) or []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                todo.append(sub)
    return seen


# --- the entrypoint ---------------------------------------------------------------------


def test_entrypoint_and_cmd_are_exec_form_python_m_webhook_serve(
    final_stage: list[Instruction],
) -> None:
    entrypoint = single(final_stage, "ENTRYPOINT").exec_form()
    cmd = single(final_stage, "CMD").exec_form()

    assert entrypoint == ["python", "-m", "webhook"]
    assert cmd[0] == "serve"


def test_cmd_flags_are_accepted_by_the_command_line(final_stage: list[Instruction]) -> None:
    cmd = single(final_stage, "CMD").exec_form()
    args = build_parser().parse_args(cmd)
    assert args.command == "serve"


def test_entrypoint_resolves_and_answers_help(final_stage: list[Instruction]) -> None:
    entrypoint = single(final_stage, "ENTRYPOINT").exec_form()
    cmd = single(final_stage, "CMD").exec_form()
    argv = [sys.executable if entrypoint[0] == "python" else entrypoint[0], *entrypoint[1:]]
    result = subprocess.run(
        [*argv, *cmd, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    for flag in cmd[1::2]:
        assert flag in result.stdout


def test_deployment_runs_the_image_command(
    final_stage: list[Instruction], container: dict[str, Any]
) -> None:
    entrypoint = single(final_stage, "ENTRYPOINT").exec_form()
    cmd = single(final_stage, "CMD").exec_form()

    assert container.get("command", entrypoint) == entrypoint
    # Then what only a pod can give: its IP (downward API) for the metrics port.
    assert container["args"] == [*cmd, "--metrics-host", "$(POD_IP)"]


def test_deployment_ports_are_the_exposed_ones(
    final_stage: list[Instruction], container: dict[str, Any]
) -> None:
    exposed = {int(p.split("/")[0]) for p in single(final_stage, "EXPOSE").arguments.split()}
    assert {p["containerPort"] for p in container["ports"]} == exposed


def test_deployment_user_is_the_image_user(
    final_stage: list[Instruction], container: dict[str, Any]
) -> None:
    uid = int(single(final_stage, "USER").arguments.partition(":")[0])
    assert container["securityContext"]["runAsUser"] == uid


def test_parser_handles_continuations_and_comments() -> None:
    parsed = parse_dockerfile(
        "# comment\nFROM python:3.11-slim AS build\nRUN a \\\n  # inner comment\n  && b\n"
        'CMD ["x", "y"]\n'
    )

    assert [(i.keyword, i.arguments, i.line) for i in parsed] == [
        ("FROM", "python:3.11-slim AS build", 2),
        ("RUN", "a && b", 3),
        ("CMD", '["x", "y"]', 6),
    ]
    assert parsed[2].exec_form() == ["x", "y"]
