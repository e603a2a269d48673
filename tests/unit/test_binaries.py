"""Reading a binary's feature gates from its help, and leaving out those it does not know."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.binaries import Binaries, listed_feature_gates

# Excerpts of kube-apiserver --help (the description column shortened).
HELP_1_37 = """\
      --feature-gates colonSeparatedMultimapStringString   Comma-separated list of ...
              kube:APIResponseCompression=true|false (BETA - default=true)
              kube:InPlacePodVerticalScalingSchedulerPreemption=true|false (ALPHA - default=false)
      --goaway-chance float                                To prevent HTTP/2 clients ...
"""
HELP_1_30 = """\
      --feature-gates mapStringBool   A set of key=value pairs ... Options are:
              APIResponseCompression=true|false (BETA - default=true)
              InPlacePodVerticalScaling=true|false (ALPHA - default=false)
"""


@pytest.mark.parametrize(
    ("help_text", "expected"),
    [
        pytest.param(
            HELP_1_37,
            {"APIResponseCompression", "InPlacePodVerticalScalingSchedulerPreemption"},
            id="kube-prefixed",
        ),
        pytest.param(
            HELP_1_30, {"APIResponseCompression", "InPlacePodVerticalScaling"}, id="unprefixed"
        ),
        pytest.param("no gates here\n", set(), id="none"),
    ],
)
def test_listed_feature_gates(help_text: str, expected: set[str]) -> None:
    assert expected == set(listed_feature_gates(help_text))


def test_a_gate_the_version_does_not_know_is_left_out(tmp_path: Path) -> None:
    apiserver = tmp_path / "kube-apiserver"
    apiserver.write_text("#!/bin/sh\ncat <<'HELP'\n" + HELP_1_37 + "HELP\n")
    apiserver.chmod(0o755)
    binaries = Binaries(tmp_path)

    settable = binaries.settable(
        {"InPlacePodVerticalScalingSchedulerPreemption": True, "NoSuchGateYet": True}
    )

    assert {"InPlacePodVerticalScalingSchedulerPreemption": True} == settable


@pytest.mark.parametrize(
    ("held_off", "expected"),
    [
        ("", {"InPlacePodVerticalScalingSchedulerPreemption": True}),
        ("InPlacePodVerticalScalingSchedulerPreemption", {}),
        (" InPlacePodVerticalScalingSchedulerPreemption , Other", {}),
        ("Other", {"InPlacePodVerticalScalingSchedulerPreemption": True}),
    ],
    ids=["none", "the-gate", "spaces-and-another", "another-gate"],
)
def test_a_gate_held_off_is_left_out_like_an_unknown_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held_off: str, expected: dict[str, bool]
) -> None:
    apiserver = tmp_path / "kube-apiserver"
    apiserver.write_text("#!/bin/sh\ncat <<'HELP'\n" + HELP_1_37 + "HELP\n")
    apiserver.chmod(0o755)
    monkeypatch.setenv("RPW_FEATURE_GATES_OFF", held_off)

    settable = Binaries(tmp_path).settable({"InPlacePodVerticalScalingSchedulerPreemption": True})

    assert expected == settable
