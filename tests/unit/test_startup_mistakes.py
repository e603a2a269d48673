"""Start-up mistakes, each run through the real command line in a subprocess: exit 2, one
line on stderr naming what is wrong, no traceback, and nothing listening.

"Nothing listening" is proven, not assumed: while ``serve`` runs, the test itself holds
the HTTPS and metrics ports it was given. A ``serve`` that got as far as binding would
find them taken, and gunicorn would retry, log and exit 1 with many lines - which
:func:`test_the_held_ports_catch_a_serve_that_binds` shows with a correct command line.
Everything is checked before that: the settings, the ports, the kubeconfig, the
certificate and key."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from webhook.tls import certs

REPO = Path(__file__).resolve().parents[2]
#: Stands for the test's own files, filled in per run.
TLS = ("--tls-cert", "{tls.crt}", "--tls-key", "{tls.key}")
KUBECONFIG = ("--kubeconfig", "{kubeconfig}")
#: A kubeconfig the client's loader can read; nothing ever connects to it.
GOOD_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


@dataclass(frozen=True)
class Mistake:
    id: str
    #: Arguments after ``python -m webhook``; ``{name}`` is a file of the test's.
    argv: tuple[str, ...]
    #: What the one line must say.
    says: str
    env: dict[str, str] = field(default_factory=dict)
    #: ``serve``: the ports the test holds are given as --port and --metrics-port.
    ports: bool = True


SERVE_MISTAKES = [
    # -- the certificate and key
    Mistake("tls-cert-missing", ("serve", "--tls-cert", "{missing}", "--tls-key",
            "{tls.key}", *KUBECONFIG), "cannot read {missing}"),
    Mistake("tls-cert-and-key-swapped", ("serve", "--tls-cert", "{tls.key}", "--tls-key",
            "{tls.crt}", *KUBECONFIG), "certificate {tls.key} is not a PEM certificate"),
    Mistake("tls-key-not-the-certificates", ("serve", "--tls-cert", "{ca.crt}", "--tls-key",
            "{tls.key}", *KUBECONFIG), "key {tls.key} is not the key of certificate {ca.crt}"),
    Mistake("tls-key-not-a-key", ("serve", "--tls-cert", "{tls.crt}", "--tls-key",
            "{tls.crt}", *KUBECONFIG), "key {tls.crt} is not an unencrypted PEM private key"),
    # -- ports
    Mistake("port-negative", ("serve", *TLS, *KUBECONFIG, "--port", "-1"),
            "--port: '-1' must be a port, 1-65535", ports=False),
    Mistake("port-too-high", ("serve", *TLS, *KUBECONFIG, "--port", "70000"),
            "--port: '70000' must be a port, 1-65535", ports=False),
    Mistake("port-zero", ("serve", *TLS, *KUBECONFIG, "--port", "0"),
            "--port: '0' must be a port, 1-65535", ports=False),
    Mistake("port-not-a-number", ("serve", *TLS, *KUBECONFIG, "--port", "https"),
            "--port: 'https' must be a port", ports=False),
    Mistake("metrics-port-too-high", ("serve", *TLS, *KUBECONFIG, "--metrics-port", "70000"),
            "--metrics-port: '70000' must be a port, 1-65535 (0: off)", ports=False),
    Mistake("metrics-port-is-the-port", ("serve", *TLS, *KUBECONFIG, "--port", "{port}",
            "--metrics-port", "{port}"), "--metrics-port={port} must differ from --port={port}",
            ports=False),
    # -- the kubeconfig
    Mistake("no-kubeconfig", ("serve", *TLS), "no Kubernetes client configuration",
            env={"KUBECONFIG": "{missing}"}),
    Mistake("kubeconfig-missing", ("serve", *TLS, "--kubeconfig", "{missing}"),
            "cannot read kubeconfig {missing}"),
    Mistake("kubeconfig-not-yaml", ("serve", *TLS, "--kubeconfig", "{broken.yaml}"),
            "kubeconfig {broken.yaml} is not valid YAML at line 3"),
    Mistake("kubeconfig-binary", ("serve", *TLS, "--kubeconfig", "{binary}"),
            "kubeconfig {binary} is not UTF-8 text"),
    Mistake("kubeconfig-without-a-context", ("serve", *TLS, "--kubeconfig", "{no-context}"),
            "kubeconfig {no-context} names no current-context"),
    Mistake("kubeconfig-not-a-mapping", ("serve", *TLS, "--kubeconfig", "{unknown.yaml}"),
            "kubeconfig {unknown.yaml} names no current-context"),
    # -- the address
    Mistake("host-does-not-resolve", ("serve", *TLS, *KUBECONFIG, "--host", "nowhere.invalid"),
            "--host 'nowhere.invalid' does not resolve"),
    Mistake("host-not-this-machines", ("serve", *TLS, *KUBECONFIG, "--host", "192.0.2.1"),
            "--host '192.0.2.1' is not an address of this machine"),
    # -- the config file
    Mistake("config-binary", ("serve", *TLS, *KUBECONFIG, "--config", "{binary}"),
            "config file {binary} is not UTF-8 text"),
    Mistake("config-missing", ("serve", *TLS, *KUBECONFIG, "--config", "{missing}"),
            "cannot read config file {missing}"),
    Mistake("config-unknown-setting", ("serve", *TLS, *KUBECONFIG, "--config",
            "{unknown.yaml}"), "unknown setting 'colour'"),
    # -- settings, from the environment and the command line
    Mistake("max-body-bytes-zero", ("serve", *TLS, *KUBECONFIG),
            "RPW_MAX_BODY_BYTES='0' must be a whole number of at least 65536",
            env={"RPW_MAX_BODY_BYTES": "0"}),
    Mistake("lease-duration-zero", ("serve", *TLS, *KUBECONFIG),
            "RPW_LEASE_DURATION='0' must be a number of seconds of at least 1",
            env={"RPW_LEASE_DURATION": "0"}),
    Mistake("lease-duration-half-a-second", ("serve", *TLS, *KUBECONFIG),
            "RPW_LEASE_DURATION='0.5' must be a number of seconds of at least 1",
            env={"RPW_LEASE_DURATION": "0.5"}),
    Mistake("reservation-ttl-nan", ("serve", *TLS, *KUBECONFIG),
            "RPW_RESERVATION_TTL='nan' must be a number of seconds above 0 (finite)",
            env={"RPW_RESERVATION_TTL": "nan"}),
    Mistake("reservation-ttl-overflows", ("serve", *TLS, *KUBECONFIG),
            "RPW_RESERVATION_TTL='1e400' must be a number of seconds above 0 (finite)",
            env={"RPW_RESERVATION_TTL": "1e400"}),
    Mistake("max-cache-staleness-inf", ("serve", *TLS, *KUBECONFIG),
            "RPW_MAX_CACHE_STALENESS='inf' must be a number of seconds above 0",
            env={"RPW_MAX_CACHE_STALENESS": "inf"}),
    Mistake("persist-timeout-negative", ("serve", *TLS, *KUBECONFIG),
            "RPW_PERSIST_TIMEOUT='-1' must be a number of seconds above 0",
            env={"RPW_PERSIST_TIMEOUT": "-1"}),
    Mistake("resync-period-zero", ("serve", *TLS, *KUBECONFIG, "--resync-period", "0"),
            "--resync-period='0' must be a number of seconds above 0"),
    Mistake("service-namespace-not-a-name", ("serve", *TLS, *KUBECONFIG),
            "RPW_SERVICE_NAMESPACE='Bad_NS!' must be a namespace name (DNS-1123 label",
            env={"RPW_SERVICE_NAMESPACE": "Bad_NS!"}),
    Mistake("old-namespace-variable-and-a-mistake", ("serve", *TLS, *KUBECONFIG),
            "RPW_LEASE_DURATION='0' must be", env={"RPW_NAMESPACE": "rpw",
                                                    "RPW_LEASE_DURATION": "0"}),
    Mistake("old-namespace-variable-not-a-name", ("serve", *TLS, *KUBECONFIG),
            "RPW_NAMESPACE='Bad_NS!' must be a namespace name", env={"RPW_NAMESPACE": "Bad_NS!"}),
    Mistake("protected-namespace-not-a-name", ("serve", *TLS, *KUBECONFIG,
            "--protected-namespaces", "ok,Kube_System"), "holds 'Kube_System', which must be"),
    Mistake("scheduler-name-empty", ("serve", *TLS, *KUBECONFIG),
            "RPW_SCHEDULER_NAME='' must not be empty", env={"RPW_SCHEDULER_NAME": ""}),
    Mistake("max-victims-not-a-number", ("serve", *TLS, *KUBECONFIG, "--max-victims", "few"),
            "--max-victims='few' must be a whole number of at least 0 (or unlimited)"),
    Mistake("unknown-mode", ("serve", *TLS, *KUBECONFIG, "--mode", "audit"),
            "--mode='audit' must be one of enforce, warn, deny-infeasible"),
    Mistake("lending-not-a-switch", ("serve", *TLS, *KUBECONFIG),
            "RPW_LENDING='maybe' must be true or false", env={"RPW_LENDING": "maybe"}),
    # -- server options
    Mistake("workers-zero", ("serve", *TLS, *KUBECONFIG, "--workers", "0"),
            "--workers: '0' must be a whole number of at least 1"),
    Mistake("unknown-log-level", ("serve", *TLS, *KUBECONFIG, "--log-level", "verbose"),
            "argument --log-level: invalid choice: 'verbose'"),
    Mistake("unknown-flag", ("serve", *TLS, *KUBECONFIG, "--namespace", "rpw"),
            "unrecognized arguments: --namespace rpw"),
]  # fmt: skip

#: Mistakes of the other commands, which bind nothing.
COMMAND_MISTAKES = [
    Mistake("status-kubeconfig-not-yaml", ("status", "--kubeconfig", "{broken.yaml}"),
            "kubeconfig {broken.yaml} is not valid YAML at line 3", ports=False),
    Mistake("status-kubeconfig-missing", ("status", "--kubeconfig", "{missing}"),
            "cannot read kubeconfig {missing}", ports=False),
    Mistake("status-unknown-context", ("status", "--kubeconfig", "{kubeconfig}", "--context",
            "elsewhere"), "kubeconfig {kubeconfig} has no context 'elsewhere'", ports=False),
    Mistake("plan-resize-file-binary", ("plan", "--snapshot", "{snapshot.yaml}", "--pod",
            "web", "--resize", "@{binary}"), "--resize file {binary} is not UTF-8 text",
            ports=False),
    Mistake("plan-resize-not-json", ("plan", "--snapshot", "{snapshot.yaml}", "--pod", "web",
            "--resize", "nope"), "--resize is not JSON (line 1 column 1): give the patch of "
            "kubectl patch --subresource resize", ports=False),
    Mistake("plan-max-victims-not-a-number", ("plan", "--snapshot", "{snapshot.yaml}",
            "--pod", "web", "--resize", "{}", "--max-victims", "few"),
            "--max-victims='few' must be a whole number of at least 0 (or unlimited)",
            ports=False),
    Mistake("plan-pod-in-another-namespace", ("plan", "--snapshot", "{snapshot.yaml}",
            "--pod", "a/web", "-n", "b", "--resize", "{}"),
            "--pod a/web is not in --namespace b", ports=False),
    Mistake("plan-old-lending-flag", ("plan", "--snapshot", "{snapshot.yaml}", "--pod", "web",
            "--resize", "{}", "--no-lending"), "unrecognized arguments: --no-lending",
            ports=False),
]  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("mistakes")
    made = certs.make_webhook_certs(service="rpw", namespace="rpw")
    paths = {name: str(path) for name, path in certs.write_certs(made, root).items()}
    contents: dict[str, bytes] = {
        "kubeconfig": GOOD_KUBECONFIG.encode(),
        "broken.yaml": b"apiVersion: v1\nclusters: [\n  - a: {\n",
        "binary": bytes(range(256)) * 4,
        "unknown.yaml": b"colour: blue\n",
        "no-context": b"apiVersion: v1\nkind: Config\nclusters: []\n",
        "snapshot.yaml": b"apiVersion: v1\nkind: List\nitems: []\n",
    }
    for name, content in contents.items():
        (root / name).write_bytes(content)
        paths[name] = str(root / name)
    paths["missing"] = str(root / "missing")
    return paths


def fill(text: str, names: dict[str, str]) -> str:
    """``text`` with each ``{name}`` of ``names`` replaced by its value."""
    for name, value in names.items():
        text = text.replace("{" + name + "}", value)
    return text


@contextmanager
def held_ports() -> Iterator[tuple[int, int]]:
    """Two ports bound (and listening) by this process for the duration."""
    with ExitStack() as stack:
        ports = []
        for _ in range(2):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("0.0.0.0", 0))
            sock.listen()
            ports.append(sock.getsockname()[1])
        yield ports[0], ports[1]


def run(
    mistake: Mistake, files: dict[str, str], port: int, metrics_port: int
) -> subprocess.CompletedProcess[str]:
    names = {**files, "port": str(port)}
    argv = [fill(a, names) for a in mistake.argv]
    if mistake.ports:
        argv += ["--port", str(port), "--metrics-port", str(metrics_port)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RPW_", "KUBE"))}
    env |= {"HOME": str(Path(files["missing"]).parent), "PYTHONPATH": str(REPO)}
    env |= {k: fill(v, names) for k, v in mistake.env.items()}
    return subprocess.run(
        [sys.executable, "-m", "webhook", *argv],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def assert_one_clear_line(
    result: subprocess.CompletedProcess[str], says: str, files: dict[str, str], port: int
) -> None:
    lines = result.stderr.splitlines()
    assert (2, 1) == (result.returncode, len(lines)), result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("error: ")
    assert fill(says, {**files, "port": str(port)}) in lines[0]
    assert "" == result.stdout


@pytest.mark.parametrize("mistake", SERVE_MISTAKES, ids=[m.id for m in SERVE_MISTAKES])
def test_a_serve_mistake_is_one_line_and_exit_2_before_any_port_is_bound(
    mistake: Mistake, files: dict[str, str]
) -> None:
    with held_ports() as (port, metrics_port):
        result = run(mistake, files, port, metrics_port)
    assert_one_clear_line(result, mistake.says, files, port)


@pytest.mark.parametrize("mistake", COMMAND_MISTAKES, ids=[m.id for m in COMMAND_MISTAKES])
def test_a_command_mistake_is_one_line_and_exit_2(mistake: Mistake, files: dict[str, str]) -> None:
    result = run(mistake, files, 0, 0)
    assert_one_clear_line(result, mistake.says, files, 0)


def test_the_held_ports_catch_a_serve_that_binds(files: dict[str, str]) -> None:
    correct = Mistake("none", ("serve", *TLS, *KUBECONFIG), "")
    with held_ports() as (port, metrics_port):
        result = run(correct, files, port, metrics_port)
    assert 2 != result.returncode
    assert f"Connection in use: ('0.0.0.0', {port})" in result.stderr
