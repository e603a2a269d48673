"""Every form of ``make demo`` the README shows, run as the README shows it. Each checks
its own outcome: it exits non-zero, saying why, when it could not show what it is for (a
resize actuated without anyone preempted, a victim that was not checkpointed).

The demos start clusters of their own, so they run first in a session (the e2e conftest
orders them so): a real node is started by one owner at a time."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from harness.binaries import REPO_ROOT
from harness.realnode import machine_facts, preflight, preflight_message

pytestmark = [pytest.mark.e2e, pytest.mark.demo]

#: Each form, with the line that says it showed what it is for.
FORMS = {
    "make demo": "# high-priority-pod runs with 6 CPU; low-priority-pod was preempted",
    "make demo NODE=real": "its container's cgroup followed",
    "make demo NODE=real CHECKPOINT=1": "# its process came back with its memory",
}
TIMEOUT = 900


def test_every_form_the_readme_shows_is_one_run_here() -> None:
    readme = (Path(REPO_ROOT) / "README.md").read_text()
    shown = {re.sub(r"\s+", " ", m) for m in re.findall(r"`?(make demo(?: [A-Z]+=\w+)*)", readme)}
    assert shown == set(FORMS)


#: The real node's forms run the v1.37 kubelet on containerd whatever the control plane:
#: marked ``realnode``, so that ``make matrix`` leaves them out as it does the real node's tests.
DEMOS = [
    pytest.param(command, id=name, marks=[pytest.mark.realnode] if "NODE=real" in command else [])
    for command, name in zip(FORMS, ["hollow", "real", "real-checkpoint"], strict=True)
]


@pytest.mark.parametrize("command", DEMOS)
def test_make_demo(command: str) -> None:
    if "NODE=real" in command and (problems := preflight(machine_facts())):
        pytest.skip(preflight_message(problems))
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    result = subprocess.run(
        command.split(),
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    tail = "\n".join((result.stdout + result.stderr).splitlines()[-25:])
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{tail}"
    assert FORMS[command] in result.stdout, tail
