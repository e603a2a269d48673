"""The ``plan`` command's contract: snapshot files as kubectl prints them, the resize
patch kubectl sends, JSON and text output, exit codes and one-line errors."""

# House style puts the expected value on the left of ==.

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.builders import (
    HIGH,
    LOW,
    NOW,
    make_node,
    make_pdb,
    make_pod,
    make_priority_class,
    rfc3339,
)
from webhook.cli import main

REPO = Path(__file__).resolve().parents[2]
WALKTHROUGH_PATCH = '{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"6"}}}]}}'


def walkthrough_objects() -> list[dict[str, Any]]:
    return [
        make_node("node-1").allocatable(cpu="8", memory="16Gi").obj(),
        make_pod("low-priority-pod")
        .priority(LOW)
        .requests(cpu="3", memory="500Mi")
        .started(100)
        .admitted()
        .obj(),
        make_pod("high-priority-pod")
        .priority(HIGH)
        .requests(cpu="4", memory="1Gi")
        .started(50)
        .admitted()
        .obj(),
    ]


def as_list(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": objects}


def write_yaml_list(tmp_path: Path, objects: list[dict[str, Any]]) -> Path:
    path = tmp_path / "snapshot.yaml"
    path.write_text(yaml.safe_dump(as_list(objects)), encoding="utf-8")
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "webhook", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def plan_in_process(
    capsys: pytest.CaptureFixture[str], snapshot: Path, *args: str
) -> tuple[int, str, str]:
    code = main(["plan", "--snapshot", str(snapshot), "--now", rfc3339(NOW), *args])
    out, err = capsys.readouterr()
    return code, out, err


# -- in a real process -------------------------------------------------------------------


def test_walkthrough_json_in_a_subprocess(tmp_path: Path) -> None:
    snapshot = write_yaml_list(tmp_path, walkthrough_objects())

    result = run_cli(
        "plan",
        "--snapshot",
        str(snapshot),
        "--pod",
        "default/high-priority-pod",
        "--resize",
        WALKTHROUGH_PATCH,
        "-o",
        "json",
    )

    assert (0, "") == (result.returncode, result.stderr)
    assert 1 == len(result.stdout.splitlines())
    data = json.loads(result.stdout)
    assert {
        "pod": "default/high-priority-pod",
        "node": "node-1",
        "verdict": "preempt",
        "victims": ["default/low-priority-pod"],
        "reason": "preempting 1 lower-priority pod on node-1 to free cpu 1",
    } == {k: data[k] for k in ("pod", "node", "verdict", "victims", "reason")}
    assert {"requested": "6", "inUse": "3", "allocatable": "8", "shortfall": "1"} == {
        k: data["resources"]["cpu"][k] for k in ("requested", "inUse", "allocatable", "shortfall")
    }


def test_walkthrough_text_in_a_subprocess(tmp_path: Path) -> None:
    snapshot = write_yaml_list(tmp_path, walkthrough_objects())

    result = run_cli(
        "plan",
        "--snapshot",
        str(snapshot),
        "--pod",
        "default/high-priority-pod",
        "--resize",
        WALKTHROUGH_PATCH,
    )

    assert 0 == result.returncode
    lines = result.stdout.splitlines()
    assert "preempt: preempting 1 lower-priority pod on node-1 to free cpu 1" == lines[0]
    assert "resource  requested  in use  freeing  allocatable  shortfall" in lines
    assert "cpu       6          3       0        8            1" in lines
    assert "  default/low-priority-pod  priority 1000  frees cpu 3, memory 500Mi" == lines[-1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ["--pod", "default/nobody"],
            "error: no pod default/nobody in the snapshot",
            id="unknown-pod",
        ),
        pytest.param(
            ["--snapshot-missing"],
            "error: cannot read snapshot",
            id="missing-file",
        ),
    ],
)
def test_bad_input_in_a_subprocess_exits_2_with_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    snapshot = write_yaml_list(tmp_path, walkthrough_objects())
    argv = ["plan", "--snapshot", str(snapshot), "--pod", "default/high-priority-pod"]
    argv += ["--resize", WALKTHROUGH_PATCH]
    if args == ["--snapshot-missing"]:
        argv[2] = str(tmp_path / "missing.yaml")
    else:
        argv[3:5] = args

    result = run_cli(*argv)

    assert (2, "") == (result.returncode, result.stdout)
    assert 1 == len(result.stderr.splitlines())
    assert result.stderr.startswith(message)
    assert "Traceback" not in result.stderr


# -- in process: file formats ------------------------------------------------------------


def _formats(tmp_path: Path, form: str) -> Path:
    objects = walkthrough_objects()
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ignored"}}
    if form == "yaml-list":
        return write_yaml_list(tmp_path, [*objects, config])
    path = tmp_path / "snapshot.txt"
    if form == "multi-document-yaml":
        path.write_text(yaml.safe_dump_all([*objects, config, None]), encoding="utf-8")
    elif form == "json-list":
        path.write_text(json.dumps(as_list(objects)), encoding="utf-8")
    elif form == "json-array":
        path.write_text(json.dumps(objects), encoding="utf-8")
    elif form == "typed-lists":
        pods = [{k: v for k, v in o.items() if k != "kind"} for o in objects[1:]]
        documents = [
            {"apiVersion": "v1", "kind": "NodeList", "items": [objects[0]]},
            {"apiVersion": "v1", "kind": "PodList", "items": pods},
        ]
        path.write_text(yaml.safe_dump_all(documents), encoding="utf-8")
    elif form == "nested-list":
        path.write_text(json.dumps(as_list([as_list(objects), config])), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "form",
    ["yaml-list", "multi-document-yaml", "json-list", "json-array", "typed-lists", "nested-list"],
)
def test_snapshot_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str], form: str) -> None:
    snapshot = _formats(tmp_path, form)

    code, out, err = plan_in_process(
        capsys,
        snapshot,
        "--pod",
        "default/high-priority-pod",
        "--resize",
        WALKTHROUGH_PATCH,
        "-o",
        "json",
    )

    assert (0, "") == (code, err)
    assert ("preempt", ["default/low-priority-pod"]) == (
        json.loads(out)["verdict"],
        json.loads(out)["victims"],
    )


# -- in process: verdicts and options ------------------------------------------------------


def _json(capsys: pytest.CaptureFixture[str], snapshot: Path, *args: str) -> dict[str, Any]:
    code, out, err = plan_in_process(capsys, snapshot, *args, "-o", "json")
    assert (0, "") == (code, err)
    data: dict[str, Any] = json.loads(out)
    return data


@pytest.mark.parametrize(
    ("cpu", "verdict"),
    [
        pytest.param("5", "fits", id="fits"),
        pytest.param("6", "preempt", id="preempt"),
        pytest.param("9", "infeasible", id="infeasible"),
        pytest.param("2", "fits", id="no-growth"),
    ],
)
def test_every_verdict_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cpu: str, verdict: str
) -> None:
    snapshot = write_yaml_list(tmp_path, walkthrough_objects())
    patch = WALKTHROUGH_PATCH.replace('"6"', f'"{cpu}"')

    data = _json(capsys, snapshot, "--pod", "default/high-priority-pod", "--resize", patch)

    assert verdict == data["verdict"]


def test_pod_without_namespace_means_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = write_yaml_list(tmp_path, walkthrough_objects())

    data = _json(capsys, snapshot, "--pod", "high-priority-pod", "--resize", WALKTHROUGH_PATCH)

    assert "default/high-priority-pod" == data["pod"]


def test_patch_from_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = write_yaml_list(tmp_path, walkthrough_objects())
    patch = tmp_path / "patch.json"
    patch.write_text(WALKTHROUGH_PATCH, encoding="utf-8")

    data = _json(capsys, snapshot, "--pod", "default/high-priority-pod", "--resize", f"@{patch}")

    assert "preempt" == data["verdict"]


def test_priority_classes_in_the_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = walkthrough_objects()
    for obj, cls in ((objects[1], "batch"), (objects[2], "critical")):
        del obj["spec"]["priority"]
        obj["spec"]["priorityClassName"] = cls
    objects += [
        make_priority_class("batch", LOW).obj(),
        make_priority_class("critical", HIGH).never_preempts().obj(),
    ]
    snapshot = write_yaml_list(tmp_path, objects)

    data = _json(
        capsys, snapshot, "--pod", "default/high-priority-pod", "--resize", WALKTHROUGH_PATCH
    )

    assert ("not-eligible", "preemption-policy-never") == (data["verdict"], data["code"])


def test_moving_cpu_between_containers_preempts_nobody(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The resizing pod counts at the max of its aggregates (upstream ``PodRequests``)."""
    objects = [
        make_node("node-1").allocatable(cpu="4", memory="16Gi").obj(),
        make_pod("p")
        .priority(1000)
        .requests(cpu="2", container="c1")
        .requests(cpu="1", container="c2")
        .started(50)
        .admitted()
        .obj(),
        make_pod("low").priority(0).requests(cpu="1").started(100).admitted().obj(),
    ]
    patch = json.dumps(
        {
            "spec": {
                "containers": [
                    {"name": "c1", "resources": {"requests": {"cpu": "1"}}},
                    {"name": "c2", "resources": {"requests": {"cpu": "2"}}},
                ]
            }
        }
    )

    data = _json(
        capsys, write_yaml_list(tmp_path, objects), "--pod", "default/p", "--resize", patch
    )

    assert ([], "3") == (data["victims"], data["resources"]["cpu"]["requested"])


def _guarded(tmp_path: Path) -> Path:
    objects = walkthrough_objects()
    objects[1]["metadata"]["labels"] = {"app": "low"}
    objects.append(make_pdb("low").selecting(app="low").allowing(0).obj())
    return write_yaml_list(tmp_path, objects)


@pytest.mark.parametrize(
    ("options", "verdict", "code"),
    [
        pytest.param([], "infeasible", "pdb-violation", id="respect-by-default"),
        pytest.param(["--pdb-mode", "best-effort"], "preempt", "preempt", id="best-effort"),
        pytest.param(
            ["--pdb-mode", "best-effort", "--max-victims", "0"],
            "infeasible",
            "too-many-victims",
            id="max-victims",
        ),
        pytest.param(
            ["--pdb-mode", "best-effort", "--protected-namespaces", "kube-system,default"],
            "infeasible",
            "insufficient-after-preemption",
            id="protected-namespaces",
        ),
    ],
)
def test_policy_options(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    options: list[str],
    verdict: str,
    code: str,
) -> None:
    data = _json(
        capsys,
        _guarded(tmp_path),
        "--pod",
        "default/high-priority-pod",
        "--resize",
        WALKTHROUGH_PATCH,
        *options,
    )

    assert (verdict, code) == (data["verdict"], data["code"])


@pytest.mark.parametrize(
    ("namespace", "options", "verdict"),
    [
        ("kube-system", [], "infeasible"),
        ("resize-preemption-system", [], "infeasible"),
        ("tools", ["--service-namespace", "tools"], "infeasible"),
        ("kube-system", ["--unprotected-namespaces", "kube-system"], "preempt"),
        ("resize-preemption-system", ["--unprotected-namespaces", "resize-preemption-system"],
         "preempt"),
        ("kube-system", ["--unprotected-namespaces", "kube-system",
                         "--protected-namespaces", "kube-system"], "infeasible"),
    ],
    ids=["kube-system", "the-webhooks-namespace", "another-webhook-namespace",
         "kube-system-opted-in", "the-webhooks-namespace-opted-in", "protected-wins"],
)  # fmt: skip
def test_system_namespaces_give_no_victim_unless_opted_in_as_in_the_service(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    namespace: str,
    options: list[str],
    verdict: str,
) -> None:
    objects = walkthrough_objects()
    objects[1]["metadata"]["namespace"] = namespace
    data = _json(
        capsys,
        write_yaml_list(tmp_path, objects),
        "--pod",
        "default/high-priority-pod",
        "--resize",
        WALKTHROUGH_PATCH,
        *options,
    )

    assert verdict == data["verdict"]


def test_now_decides_who_counts_as_newer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    objects = walkthrough_objects()
    late = make_pod("late").priority(LOW).requests(cpu="3").started(20_000).obj()
    objects[1]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "1"
    del objects[1]["status"]["startTime"]
    objects.append(late)
    snapshot = write_yaml_list(tmp_path, objects)
    patch = WALKTHROUGH_PATCH.replace('"6"', '"5"')
    args = ("--pod", "default/high-priority-pod", "--resize", patch, "-o", "json")

    # Not started counts as "now": before the late pod's start it is the older one ...
    code = main(["plan", "--snapshot", str(snapshot), "--now", rfc3339(NOW), *args])
    early = json.loads(capsys.readouterr().out)
    # ... and after it, the newer one.
    main(["plan", "--snapshot", str(snapshot), "--now", rfc3339(NOW + 20_000), *args])
    later = json.loads(capsys.readouterr().out)

    assert 0 == code
    assert ["default/late"] == early["victims"]
    assert ["default/low-priority-pod"] == later["victims"]


# -- in process: bad input -----------------------------------------------------------------


def _bad_snapshot(tmp_path: Path, kind: str) -> Path:
    path = tmp_path / "snapshot.yaml"
    objects = walkthrough_objects()
    if kind == "bad-yaml":
        path.write_text("items: [unclosed\n", encoding="utf-8")
    elif kind == "bad-json":
        path.write_text('{"kind": "List", "items": [}', encoding="utf-8")
    elif kind == "bad-quantity":
        objects[1]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "three"
        path = write_yaml_list(tmp_path, objects)
    elif kind == "no-node":
        path = write_yaml_list(tmp_path, objects[1:])
    elif kind == "not-an-object":
        path.write_text("- 1\n- 2\n", encoding="utf-8")
    elif kind == "unknown-class":
        objects[2]["spec"]["priorityClassName"] = "gone"
        del objects[2]["spec"]["priority"]
        path = write_yaml_list(tmp_path, objects)
    elif kind == "not-utf8":
        path.write_bytes(b"\xff\xfe\x00bad")
    elif kind == "directory":
        path = tmp_path
    else:
        path = write_yaml_list(tmp_path, objects)
    return path


@pytest.mark.parametrize(
    ("snapshot", "args", "message"),
    [
        pytest.param(
            "ok",
            ["--pod", "default/nobody", "--resize", WALKTHROUGH_PATCH],
            "error: no pod default/nobody in the snapshot",
            id="unknown-pod",
        ),
        pytest.param(
            "ok",
            [
                "--pod",
                "default/high-priority-pod",
                "--resize",
                WALKTHROUGH_PATCH.replace('"app"', '"web"'),
            ],
            "error: spec.containers[0]: the pod has no container named 'web' (has: app)",
            id="unknown-container",
        ),
        pytest.param(
            "ok",
            [
                "--pod",
                "default/high-priority-pod",
                "--resize",
                WALKTHROUGH_PATCH.replace('"6"', '"six"'),
            ],
            "error: pod default/high-priority-pod.spec.containers[0].resources.requests.cpu: "
            "'six' is not a valid quantity",
            id="bad-quantity-in-the-patch",
        ),
        pytest.param(
            "bad-quantity",
            ["--pod", "default/high-priority-pod", "--resize", WALKTHROUGH_PATCH],
            "error: pod default/low-priority-pod.spec.containers[0].resources.requests.cpu: "
            "'three' is not a valid quantity",
            id="bad-quantity-in-the-snapshot",
        ),
        pytest.param(
            "ok",
            ["--pod", "default/high-priority-pod", "--resize", "{not json"],
            "error: --resize is not JSON (line 1 column 2): give the patch of kubectl patch",
            id="patch-not-json",
        ),
        pytest.param(
            "ok",
            ["--pod", "default/high-priority-pod", "--resize", "[1]"],
            "error: --resize must be a JSON object",
            id="patch-not-an-object",
        ),
        pytest.param(
            "ok",
            ["--pod", "default/high-priority-pod", "--resize", "@/nonexistent/patch.json"],
            "error: cannot read resize patch /nonexistent/patch.json",
            id="patch-file-missing",
        ),
        pytest.param(
            "ok",
            ["--pod", "a/b/c", "--resize", WALKTHROUGH_PATCH],
            "error: --pod must be NAME or NAMESPACE/NAME, not 'a/b/c'",
            id="bad-pod-argument",
        ),
        pytest.param(
            "bad-yaml",
            ["--pod", "default/high-priority-pod", "--resize", WALKTHROUGH_PATCH],
            "error: snapshot",
            id="unparsable-yaml",
        ),
        pytest.param(
            "bad-json",
            ["--pod", "default/high-priority-pod", "--resize", WALKTHROUGH_PATCH],
            "error: snapshot",
            id="unparsable-json",
        ),
        pytest.param(
            "not-utf8",
            ["--pod", "default/high-priority-pod", "--resize", WALKTHROUGH_PATCH],
            "error: snapshot",
            id="not-text",
        ),
        pytest.param(
            "directory",
            ["--pod", "default/high-priority-pod", "--resize", WALKTHROUGH_PATCH],
            "error: cannot read snapshot",
            id="directory",
        ),
        pytest.param(
            "no-node",
            ["--pod", "default/high-priority-pod", "--resize", WALKTHROUGH_PATCH],
            "error: pod default/high-priority-pod is on node node-1, which is not in the snapshot",
            id="node-missing",
        ),
        pytest.param(
            "not-an-object",
            ["--pod", "default/high-priority-pod", "--resize", WALKTHROUGH_PATCH],
            "error: document 1 is not a Kubernetes object",
            id="not-kubernetes-objects",
        ),
        pytest.param(
            "unknown-class",
            ["--pod", "default/high-priority-pod", "--resize", WALKTHROUGH_PATCH],
            "error: pod default/high-priority-pod.spec.priorityClassName: no PriorityClass 'gone'",
            id="unknown-priority-class",
        ),
        pytest.param(
            "ok",
            ["--pod", "default/high-priority-pod", "--resize", WALKTHROUGH_PATCH, "--now", "soon"],
            "error: --now: 'soon' is not an RFC 3339 time",
            id="bad-now",
        ),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    snapshot: str,
    args: list[str],
    message: str,
) -> None:
    code = main(["plan", "--snapshot", str(_bad_snapshot(tmp_path, snapshot)), *args])
    out, err = capsys.readouterr()

    assert (2, "") == (code, out)
    assert 1 == len(err.splitlines())
    assert err.startswith(message)


# -- lending -------------------------------------------------------------------------------


def lending_objects() -> list[dict[str, Any]]:
    """The walkthrough with low-priority-pod opting in to lend down to 1 CPU."""
    objects = walkthrough_objects()
    objects[1]["metadata"]["annotations"] = {"resize-preemption.io/floor": '{"app": {"cpu": "1"}}'}
    return objects


def test_loans_in_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = write_yaml_list(tmp_path, lending_objects())

    data = _json(capsys, snapshot, "--pod", "high-priority-pod", "--resize", WALKTHROUGH_PATCH)

    assert ("preempt", "lend", []) == (data["verdict"], data["code"], data["victims"])
    assert [
        {"pod": "default/low-priority-pod", "container": "app", "resource": "cpu", "from": "3",
         "to": "2"}
    ] == data["loans"]  # fmt: skip
    assert "borrowing cpu 1 from 1 lower-priority pod on node-1" == data["reason"]


def test_lending_false_evicts_instead(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = write_yaml_list(tmp_path, lending_objects())

    data = _json(
        capsys, snapshot, "--pod", "high-priority-pod", "--resize", WALKTHROUGH_PATCH,
        "--lending", "false",
    )  # fmt: skip

    assert ("preempt", ["default/low-priority-pod"], []) == (
        data["code"],
        data["victims"],
        data["loans"],
    )


def test_loans_in_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = write_yaml_list(tmp_path, lending_objects())

    code, out, err = plan_in_process(
        capsys, snapshot, "--pod", "high-priority-pod", "--resize", WALKTHROUGH_PATCH
    )

    assert (0, "") == (code, err)
    assert [
        "loans, in the order taken:",
        "  default/low-priority-pod  priority 1000  container app  cpu 3->2  frees cpu 1",
    ] == out.splitlines()[-2:]


# -- standard input and the live cluster ---------------------------------------------------


def test_snapshot_from_standard_input_as_kubectl_prints_it(tmp_path: Path) -> None:
    listed = yaml.safe_dump(as_list(walkthrough_objects()))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = ["plan", "--snapshot", "-", "--pod", "default/high-priority-pod"]
    result = subprocess.run(
        [sys.executable, "-m", "webhook", *args, "--resize", WALKTHROUGH_PATCH, "-o", "json"],
        cwd=REPO,
        env=env,
        input=listed,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert (0, "") == (result.returncode, result.stderr)
    assert ("preempt", ["default/low-priority-pod"]) == (
        json.loads(result.stdout)["verdict"],
        json.loads(result.stdout)["victims"],
    )


def unreachable_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig whose server refuses connections (port 1 on loopback)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("code", "message", "args"),
    [
        pytest.param(
            3, "cannot reach the API server at https://127.0.0.1:1", ["status"], id="status"
        ),
        pytest.param(
            3,
            "cannot reach the API server at https://127.0.0.1:1",
            ["plan", "--pod", "default/p", "--resize", WALKTHROUGH_PATCH],
            id="plan",
        ),
        pytest.param(
            2,
            "plan takes one of --snapshot FILE and --kubeconfig FILE",
            ["plan", "--pod", "default/p", "--resize", WALKTHROUGH_PATCH, "--snapshot", "-"],
            id="plan-with-both",
        ),
    ],
)
def test_a_cluster_that_cannot_be_reached_is_one_line_and_its_exit_code(
    tmp_path: Path, code: int, message: str, args: list[str]
) -> None:
    result = run_cli(*args, "--kubeconfig", str(unreachable_kubeconfig(tmp_path)))

    assert (code, 1, "") == (result.returncode, len(result.stderr.splitlines()), result.stdout)
    assert result.stderr.startswith(f"error: {message}"), result.stderr


def test_a_kubeconfig_named_but_missing_is_bad_input(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    result = run_cli("status", "--kubeconfig", str(missing))

    assert (2, 1) == (result.returncode, len(result.stderr.splitlines()))
    assert f"error: cannot read kubeconfig {missing}: No such file or directory\n" == (
        result.stderr
    )


def test_no_kubeconfig_at_all_is_exit_3(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    result = subprocess.run(
        [sys.executable, "-m", "webhook", "status"],
        cwd=REPO, env={**env, "KUBECONFIG": str(missing)}, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip

    assert (3, 1) == (result.returncode, len(result.stderr.splitlines()))
    assert "error: no Kubernetes client configuration: not in a pod, and no kubeconfig at" in (
        result.stderr
    )


def movable_objects() -> list[dict[str, Any]]:
    """Two equally unimportant pods on node-1: ``bare`` newer, ``web-1`` a ReplicaSet's;
    node-2 has room for ``web-1``'s replacement."""
    return [
        make_node("node-1").allocatable(cpu="4", memory="16Gi").obj(),
        make_node("node-2").allocatable(cpu="2", memory="16Gi").obj(),
        make_pod("bare").priority(LOW).requests(cpu="1").started(200).admitted().obj(),
        make_pod("web-1")
        .owned_by("ReplicaSet", "web")
        .priority(LOW)
        .requests(cpu="1")
        .started(100)
        .admitted()
        .obj(),
        make_pod("high-priority-pod").priority(HIGH).requests(cpu="2").started(50).admitted().obj(),
    ]


@pytest.mark.parametrize(
    ("expected_victims", "expected_moves", "order"),
    [
        pytest.param(["default/bare"], None, "upstream", id="upstream"),
        pytest.param(
            ["default/web-1"],
            [
                {
                    "pod": "default/web-1",
                    "movable": True,
                    "node": "node-2",
                    "why": "its ReplicaSet can recreate it on node-2",
                }
            ],
            "movable-first",
            id="movable-first",
        ),
    ],
)
def test_victim_order_in_json(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    expected_victims: list[str],
    expected_moves: list[dict[str, Any]] | None,
    order: str,
) -> None:
    snapshot = write_yaml_list(tmp_path, movable_objects())
    patch = '{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"3"}}}]}}'

    data = _json(
        capsys, snapshot, "--pod", "high-priority-pod", "--resize", patch, "--victim-order", order
    )

    assert (expected_victims, expected_moves) == (data["victims"], data.get("moves"))


def test_an_unknown_victim_order_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = write_yaml_list(tmp_path, movable_objects())
    code = main(["plan", "--snapshot", str(snapshot), "--pod", "bare", "--resize", "{}",
                 "--victim-order", "random"])  # fmt: skip
    assert 2 == code
    assert (
        "error: command line: --victim-order='random' must be one of upstream, movable-first\n"
        == capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("expected_victims", "expected_moves", "order"),
    [
        pytest.param(["default/bare"], None, "upstream", id="upstream-evicts-the-newer"),
        pytest.param(
            ["default/replicated-7d9f-abcde"],
            [
                {
                    "pod": "default/replicated-7d9f-abcde",
                    "movable": True,
                    "why": "its ReplicaSet can recreate it on node-2",
                    "node": "node-2",
                }
            ],
            "movable-first",
            id="movable-first-evicts-the-one-that-moves",
        ),
    ],
)
def test_the_documented_equal_priority_example(
    capsys: pytest.CaptureFixture[str],
    expected_victims: list[str],
    expected_moves: list[dict[str, Any]] | None,
    order: str,
) -> None:
    """docs/decision-core.md shows this plan's output for docs/examples/equal-priority.yaml."""
    code, out, err = plan_in_process(
        capsys,
        REPO / "docs" / "examples" / "equal-priority.yaml",
        "--pod", "default/web",
        "--resize", '{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"6"}}}]}}',
        "--victim-order", order,
        "-o", "json",
    )  # fmt: skip
    assert (0, "") == (code, err)
    plan = json.loads(out)
    assert expected_victims == plan["victims"]
    assert expected_moves == plan.get("moves")
