"""``serve --help`` against the settings table: every flag explained, with its choices and
its default; the settings as ``webhook/base/settings.py`` defines them and as
docs/service.md tables them. And the kubectl plugin's command line."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from tests.unit.builders import HIGH, make_node, make_pod
from webhook.base.settings import SETTINGS, env_name
from webhook.cli import KUBECTL_PLUGIN, PLAN_SETTINGS, kubectl_plugin, main

SERVICE_DOC = Path(__file__).resolve().parents[2] / "docs" / "service.md"


def _help(
    capsys: pytest.CaptureFixture[str], *argv: str, run: Callable[[list[str]], int] = main
) -> str:
    with pytest.raises(SystemExit) as exited:
        run([*argv, "--help"])
    assert 0 == exited.value.code
    return capsys.readouterr().out


@pytest.fixture
def serve_help(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    # Wide enough that argparse never wraps (it breaks long words at hyphens).
    monkeypatch.setenv("COLUMNS", "1000")
    return _help(capsys, "serve")


def _options(help_text: str) -> dict[str, str]:
    """``--flag`` -> the rest of its entry (metavar and help) on one line: an entry is its
    line and the more indented lines under it."""
    entries = re.findall(r"^  (--[a-z-]+)(.*(?:\n {4,}.*)*)$", help_text, re.MULTILINE)
    return {flag: " ".join(rest.split()) for flag, rest in entries}


def _settings_table() -> dict[str, list[str]]:
    section = SERVICE_DOC.read_text(encoding="utf-8").split("\n## Settings\n", 1)[1]
    rows = [line for line in section.split("\n## ", 1)[0].splitlines() if line.startswith("| `")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return {c[0].strip("`"): c for c in cells}


def _server_flags() -> set[str]:
    """The flags docs/service.md lists as "Server flags (not settings)"."""
    text = SERVICE_DOC.read_text(encoding="utf-8")
    line = text.split("Server flags (not settings):", 1)[1].split("\n\n", 1)[0]
    return set(re.findall(r"`(--[a-z-]+)`", line))


def test_every_serve_flag_is_a_documented_setting_or_server_flag(serve_help: str) -> None:
    flags = set(_options(serve_help))

    assert {f"--{name}" for name in _settings_table()} | _server_flags() == flags


def test_every_serve_flag_has_help_text(serve_help: str) -> None:
    without = [flag for flag, entry in _options(serve_help).items() if len(entry.split()) < 2]

    assert [] == without


@pytest.mark.parametrize("name", list(SETTINGS), ids=list(SETTINGS))
def test_a_setting_flag_shows_its_choices_default_and_variable_as_documented(
    serve_help: str, name: str
) -> None:
    row = _settings_table()[name]
    entry = _options(serve_help)[f"--{name}"]
    documented_default = row[2].strip("`")

    assert f"`{env_name(name)}`" == row[1]
    assert f"(default: {documented_default}; {env_name(name)})" in entry
    assert documented_default == SETTINGS[name].default
    choices = SETTINGS[name].choices
    if choices:
        assert entry.startswith("{" + ",".join(choices) + "} ")
        assert [] == [c for c in choices if f"`{c}`" not in row[3]]


@pytest.mark.parametrize(
    ("flag", "default"),
    [
        pytest.param("--host", "0.0.0.0", id="host"),
        pytest.param("--port", "8443", id="port"),
        pytest.param("--metrics-port", "9090", id="metrics-port"),
        pytest.param("--workers", "1", id="workers"),
        pytest.param("--log-level", "info", id="log-level"),
    ],
)
def test_a_server_flag_shows_its_default(serve_help: str, flag: str, default: str) -> None:
    assert f"(default: {default})" in _options(serve_help)[flag]


def test_the_kubectl_plugin_names_itself_as_kubectl_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    text = _help(capsys, "status", run=kubectl_plugin)

    assert text.startswith(f"usage: {KUBECTL_PLUGIN} status ")


def test_plan_asks_the_current_cluster_without_a_snapshot_as_kubectl_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "no-kubeconfig"
    monkeypatch.setenv("KUBECONFIG", str(missing))
    argv = ["plan", "--pod", "default/web", "--resize", '{"spec": {}}']

    plugin = kubectl_plugin(argv)
    plugin_error = capsys.readouterr().err
    plain = main(argv)
    plain_error = capsys.readouterr().err

    assert (3, 3) == (plugin, plain)
    assert str(missing) in plugin_error and str(missing) in plain_error


def _kube_system_snapshot(tmp_path: Path) -> Path:
    objects = [
        make_node("node-1").allocatable(cpu="8", memory="16Gi").obj(),
        make_pod("web", "kube-system")
        .priority(HIGH)
        .requests(cpu="4")
        .started(50)
        .admitted()
        .obj(),
    ]
    path = tmp_path / "snapshot.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}))
    return path


@pytest.mark.parametrize(
    "pod_arguments",
    [
        pytest.param(["-n", "kube-system", "--pod", "web"], id="short"),
        pytest.param(["--namespace", "kube-system", "--pod", "web"], id="long"),
        pytest.param(["--pod", "kube-system/web"], id="in-pod"),
    ],
)
@pytest.mark.parametrize("run", [main, kubectl_plugin], ids=["python-m-webhook", "plugin"])
def test_namespace_is_the_pods_as_in_kubectl(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    run: Callable[[list[str]], int],
    pod_arguments: list[str],
) -> None:
    snapshot = _kube_system_snapshot(tmp_path)
    patch = '{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"5"}}}]}}'

    code = run(["plan", "--snapshot", str(snapshot), *pod_arguments, "--resize", patch,
                "-o", "json"])  # fmt: skip
    out, err = capsys.readouterr()

    assert (0, "") == (code, err)
    assert "kube-system/web" == json.loads(out)["pod"]


@pytest.mark.parametrize("command", ["plan", "status"])
def test_plan_and_status_spell_the_services_settings_as_serve_does(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    options = _options(_help(capsys, command))
    serve = _options(_help(capsys, "serve"))

    for name in PLAN_SETTINGS:
        assert serve[f"--{name}"] == options[f"--{name}"]
    assert not {"--protected-namespace", "--no-lending"} & set(options)


@pytest.mark.parametrize("command", ["plan", "status", "return-loans"])
def test_output_has_help_text(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")
    text = _help(capsys, command)

    assert re.search(r"^  -o \{text,json\}, --output \{text,json\}\s+output format: ", text, re.M)


@pytest.mark.parametrize("flag", ["--service-namespace", "--namespace"], ids=["new", "deprecated"])
def test_certs_names_the_services_namespace_as_serve_does(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str
) -> None:
    code = main(["certs", "--out", str(tmp_path), "--service", "rpw", flag, "ops"])
    capsys.readouterr()
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value

    assert 0 == code
    assert "rpw.ops.svc" in names.get_values_for_type(x509.DNSName)
