"""The chart's default certificates mode (``service``) against the local kube-apiserver: the
service makes, stores and renews its own certificates with only the rights the chart gives
it, and nothing of them is made at render time.

* every ``helm template`` renders the same objects: a Secret without data, webhook
  configurations without a caBundle;
* the start-up run (``python -m webhook.kube.certs``, what ``serve --tls-secret`` runs
  first), with the container's own arguments and the ServiceAccount's token: the Secret
  filled, the caBundle of both webhook configurations set to its CA, the files written;
  the account can read no other Secret and patch no other webhook configuration;
* ``helm upgrade`` leaves the Secret's data and the caBundle as the service wrote them;
* :func:`webhook.kube.certs.ensure` at a later time: the serving certificate renewed by
  the same CA (the caBundle unchanged); the CA near its end: a new CA, the caBundle
  trusting both the new and the old one, set before the Secret changed.

The real node runs the same with the image and its pods (tests/e2e/test_realnode_install.py)."""

from __future__ import annotations

import base64
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from tests.e2e.conftest import Cluster
from tests.e2e.helm_tools import CHART, LOCAL_BUILD, set_args
from tests.e2e.test_helm import FULLNAME, MUTATING, RELEASE, VALIDATING, Helm, deployment
from tests.e2e.test_helm import helm as helm  # a fixture
from tests.e2e.test_helm import release_namespace as release_namespace  # a fixture
from webhook.cli import _managed_tls, build_parser
from webhook.kube.certs import ensure
from webhook.kube.client import make_api_client
from webhook.kube.errors import Forbidden
from webhook.kube.jsonapi import request_json
from webhook.tls.rotation import ManagedTLS

pytestmark = pytest.mark.e2e

VALUES = {
    **LOCAL_BUILD,
    "mutating.enabled": True,
    # No namespace: no review of other tests' resizes reaches this release.
    "webhook.namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "nowhere"}},
}


def managed_tls(container: dict[str, Any], namespace: str, out: Path) -> ManagedTLS:
    """What the container's own arguments ask of the service, files under ``out`` (the
    client CA's, with clientAuth, ``out/client-ca.crt``)."""
    args = container["args"]
    args = [*args[: args.index("--tls-cert")], *args[args.index("--tls-key") + 2 :]]
    parsed = build_parser().parse_args(
        [*args, "--tls-cert", str(out / "tls.crt"), "--tls-key", str(out / "tls.key")]
    )
    managed: ManagedTLS = _managed_tls(parsed, namespace, str(out / "client-ca.crt"))
    return managed


def token_kubeconfig(cluster: Cluster, namespace: str, account: str, out: Path) -> Path:
    """A kubeconfig authenticating as the ServiceAccount ``namespace/account``."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
               "spec": {"expirationSeconds": 600}}  # fmt: skip
    token = cluster.client.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", request
    )["status"]["token"]
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    context = admin["contexts"][0]["context"]
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [c for c in admin["clusters"] if c["name"] == context["cluster"]],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [
            {"name": account, "context": {"cluster": context["cluster"], "user": account}}
        ],
        "current-context": account,
    }  # fmt: skip
    out.write_text(yaml.safe_dump(config))
    return out


def secret_data(
    cluster: Cluster, namespace: str, name: str = f"{FULLNAME}-tls"
) -> dict[str, bytes]:
    secret = cluster.client.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def ca_bundles(cluster: Cluster) -> list[str]:
    found = []
    for path in (VALIDATING, MUTATING):
        config = cluster.client.get(f"{path}/{FULLNAME}")
        found += [w["clientConfig"].get("caBundle", "") for w in config["webhooks"]]
    return found


def test_every_render_is_the_same_and_holds_no_certificate(helm: Helm) -> None:
    renders = [helm("template", RELEASE, str(CHART), *set_args(VALUES)).stdout for _ in range(2)]
    assert renders[0] == renders[1]
    objects = [o for o in yaml.safe_load_all(renders[0]) if o]
    secret = next(o for o in objects if o["kind"] == "Secret")
    assert ("Opaque", None) == (secret["type"], secret.get("data"))
    hooks = [
        w for o in objects if o["kind"].endswith("WebhookConfiguration") for w in o["webhooks"]
    ]
    assert 2 == len(hooks)
    assert [None, None] == [w["clientConfig"].get("caBundle") for w in hooks]


def test_the_service_keeps_its_certificates_with_only_the_charts_rights(
    cluster: Cluster,
    helm: Helm,
    release_namespace: str,
    tmp_path: Path,
) -> None:
    helm("install", RELEASE, str(CHART), *set_args(VALUES))
    assert {} == secret_data(cluster, release_namespace)
    assert ["", ""] == ca_bundles(cluster)
    container = deployment(cluster, release_namespace)["spec"]["template"]["spec"]["containers"][0]
    tls = managed_tls(container, release_namespace, tmp_path / "tls")
    account = token_kubeconfig(cluster, release_namespace, FULLNAME, tmp_path / "sa.kubeconfig")

    # -- the start-up run, as the ServiceAccount ------------------------------------------
    payload = json.dumps({"tls": tls.to_json(), "kubeconfig": str(account), "timeout": 10})
    done = subprocess.run(
        [sys.executable, "-m", "webhook.kube.certs"],
        input=payload, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert 0 == done.returncode, done.stderr
    data = secret_data(cluster, release_namespace)
    assert ["ca.crt", "ca.key", "tls.crt", "tls.key"] == sorted(data)
    encoded_ca = base64.b64encode(data["ca.crt"]).decode()
    assert [encoded_ca, encoded_ca] == ca_bundles(cluster)
    assert (data["tls.crt"], data["tls.key"]) == (
        (tmp_path / "tls" / "tls.crt").read_bytes(),
        (tmp_path / "tls" / "tls.key").read_bytes(),
    )
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{FULLNAME}.{release_namespace}.svc" in names.get_values_for_type(x509.DNSName)
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(data["ca.crt"]))
    # A second run changes nothing.
    api = make_api_client(str(account))
    try:
        assert (False, data) == ensure(api, tls)
    finally:
        api.close()

    # -- least privilege ----------------------------------------------------------------
    other = {"metadata": {"name": "other"}, "stringData": {"a": "b"}}
    cluster.client.create(f"/api/v1/namespaces/{release_namespace}/secrets", other)
    api = make_api_client(str(account))
    try:
        for path in (
            f"/api/v1/namespaces/{release_namespace}/secrets/other",
            f"{VALIDATING}/some-other-webhook",
        ):
            with pytest.raises(Forbidden):
                request_json(api, "GET", path)
    finally:
        api.close()

    # -- helm upgrade leaves what the service wrote ------------------------------------
    helm("upgrade", RELEASE, str(CHART), "--reuse-values", *set_args({"settings.mode": "warn"}))
    assert data == secret_data(cluster, release_namespace)
    assert [encoded_ca, encoded_ca] == ca_bundles(cluster)


def test_renewals_keep_the_ca_bundle_trusting_what_is_served(
    cluster: Cluster,
    helm: Helm,
    release_namespace: str,
    tmp_path: Path,
) -> None:
    helm("install", RELEASE, str(CHART), *set_args(VALUES))
    container = deployment(cluster, release_namespace)["spec"]["template"]["spec"]["containers"][0]
    tls = managed_tls(container, release_namespace, tmp_path / "tls")
    api = make_api_client(str(cluster.kubeconfig))
    try:
        assert True is ensure(api, tls)[0]
        first = secret_data(cluster, release_namespace)
        first_cert = x509.load_pem_x509_certificate(first["tls.crt"])

        # Inside the renewal margin of the serving certificate: a new one, the same CA.
        margin = first_cert.not_valid_after_utc - tls.policy.renew_before
        renewed, second = ensure(api, tls, now=lambda: margin + dt.timedelta(seconds=1))
        assert True is renewed
        assert (first["ca.crt"], first["ca.key"]) == (second["ca.crt"], second["ca.key"])
        assert first["tls.crt"] != second["tls.crt"]
        assert second == secret_data(cluster, release_namespace)
        assert [base64.b64encode(first["ca.crt"]).decode()] * 2 == ca_bundles(cluster)

        # The CA would not outlive a new certificate: a new CA first in the bundle, the
        # old one still trusted (it signed what the replicas serve until they follow).
        ca = x509.load_pem_x509_certificate(first["ca.crt"])
        late = ca.not_valid_after_utc - tls.policy.validity + dt.timedelta(seconds=1)
        renewed, third = ensure(api, tls, now=lambda: late)
        assert True is renewed
        bundle = x509.load_pem_x509_certificates(third["ca.crt"])
        assert [False, ca] == [bundle[0] == ca, bundle[1]]
        assert [base64.b64encode(third["ca.crt"]).decode()] * 2 == ca_bundles(cluster)
        x509.load_pem_x509_certificate(third["tls.crt"]).verify_directly_issued_by(bundle[0])
    finally:
        api.close()


def test_with_client_auth_the_service_keeps_kube_apiservers_certificate_with_the_charts_rights(
    cluster: Cluster,
    helm: Helm,
    release_namespace: str,
    tmp_path: Path,
) -> None:
    """clientAuth on: the start-up run, as the ServiceAccount, fills the chart's empty
    client Secret too and writes its CA where ``--client-ca`` points; an upgrade leaves
    it as the service wrote it."""
    values = {**VALUES, "clientAuth.enabled": True}
    helm("install", RELEASE, str(CHART), *set_args(values))
    client_secret = f"{FULLNAME}-apiserver-client"
    container = deployment(cluster, release_namespace)["spec"]["template"]["spec"]["containers"][0]
    tls = managed_tls(container, release_namespace, tmp_path / "tls")
    client, client_ca = tls.client, tmp_path / "tls" / "client-ca.crt"
    assert client is not None
    assert (client_secret, {}) == (
        client.secret,
        secret_data(cluster, release_namespace, client_secret),
    )
    account = token_kubeconfig(cluster, release_namespace, FULLNAME, tmp_path / "sa.kubeconfig")

    payload = json.dumps({"tls": tls.to_json(), "kubeconfig": str(account), "timeout": 10})
    done = subprocess.run(
        [sys.executable, "-m", "webhook.kube.certs"],
        input=payload, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert 0 == done.returncode, done.stderr
    data = secret_data(cluster, release_namespace, client_secret)
    assert ["ca.crt", "ca.key", "tls.crt", "tls.key"] == sorted(data)
    assert data["ca.crt"] == client_ca.read_bytes()
    cert = x509.load_pem_x509_certificate(data["tls.crt"])
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(data["ca.crt"]))
    assert ["ca.crt", "ca.key", "tls.crt", "tls.key"] == sorted(
        secret_data(cluster, release_namespace)
    )

    helm("upgrade", RELEASE, str(CHART), "--reuse-values", *set_args({"settings.mode": "warn"}))
    assert data == secret_data(cluster, release_namespace, client_secret)
