"""The harness's PKI and kubeconfigs: what the API server and clients will check.

Cases: every certificate chains to the CA; the API server's certificate names the addresses clients
use; client certificates carry user (CN) and groups (O); keys are private files; a node identity
can be issued later from the stored CA; a kubeconfig loads in the kubernetes client with the
embedded identity; TLS between a server and a client using these files succeeds.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import stat
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from e2e.cluster import certs, kubeconfigs


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> certs.Pki:
    return certs.create_pki(tmp_path_factory.mktemp("pki"))


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _subject(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> list[str]:
    return [str(a.value) for a in cert.subject.get_attributes_for_oid(oid)]


def test_every_certificate_is_signed_by_the_ca(pki: certs.Pki) -> None:
    ca = _cert(pki.ca.cert)
    for pair in (pki.apiserver, pki.admin, pki.controller_manager, pki.scheduler):
        cert = _cert(pair.cert)
        cert.verify_directly_issued_by(ca)  # raises if the signature or issuer is wrong


def test_apiserver_certificate_names_loopback_and_service_addresses(pki: certs.Pki) -> None:
    sans = _cert(pki.apiserver.cert).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    ips = set(sans.value.get_values_for_type(x509.IPAddress))
    names = set(sans.value.get_values_for_type(x509.DNSName))
    assert ipaddress.ip_address("127.0.0.1") in ips
    assert ipaddress.ip_address(certs.KUBERNETES_SERVICE_IP) in ips
    assert {"localhost", "kubernetes.default", "kubernetes.default.svc.cluster.local"} <= names


@pytest.mark.parametrize(
    ("attr", "cn", "orgs"),
    [
        ("admin", "kubernetes-admin", ["system:masters"]),
        ("controller_manager", "system:kube-controller-manager", []),
        ("scheduler", "system:kube-scheduler", []),
    ],
    ids=["admin", "controller-manager", "scheduler"],
)
def test_client_identities(pki: certs.Pki, attr: str, cn: str, orgs: list[str]) -> None:
    cert = _cert(getattr(pki, attr).cert)
    assert _subject(cert, NameOID.COMMON_NAME) == [cn]
    assert _subject(cert, NameOID.ORGANIZATION_NAME) == orgs
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_private_keys_are_readable_by_owner_only(pki: certs.Pki) -> None:
    for key in (pki.ca.key, pki.admin.key, pki.sa_private):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key


def test_node_identity_issued_from_reloaded_ca(pki: certs.Pki, tmp_path: Path) -> None:
    reloaded = certs.load_pki(pki.dir)
    out = certs.CertPair(tmp_path / "node.crt", tmp_path / "node.key")
    certs.issue_client_cert(reloaded.ca, out, cn="system:node:gpu-0", orgs=["system:nodes"])
    cert = _cert(out.cert)
    cert.verify_directly_issued_by(_cert(pki.ca.cert))
    assert _subject(cert, NameOID.COMMON_NAME) == ["system:node:gpu-0"]
    assert _subject(cert, NameOID.ORGANIZATION_NAME) == ["system:nodes"]


def test_load_pki_names_missing_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="incomplete PKI"):
        certs.load_pki(tmp_path)


def test_service_account_key_pair_matches(pki: certs.Pki) -> None:
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(pki.sa_private.read_bytes(), password=None)
    public = serialization.load_pem_public_key(pki.sa_public.read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert private.public_key().public_numbers() == public.public_numbers()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "stem"),
    [("system:node:gpu-0", "system_node_gpu-0"), ("a/b c", "a_b_c"), (":::", "cert")],
    ids=["node-user", "slashes-spaces", "nothing-left"],
)
def test_safe_stem(name: str, stem: str) -> None:
    assert certs.safe_stem(name) == stem


def test_kubeconfig_loads_with_embedded_identity(pki: certs.Pki, tmp_path: Path) -> None:
    from kubernetes import client, config

    path = kubeconfigs.write_kubeconfig(
        tmp_path / "admin.kubeconfig",
        server="https://127.0.0.1:6443",
        ca=pki.ca.cert,
        cert=pki.admin.cert,
        key=pki.admin.key,
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = client.Configuration()
    config.load_kube_config(config_file=str(path), client_configuration=loaded)
    assert loaded.host == "https://127.0.0.1:6443"
    assert loaded.cert_file is not None and loaded.ssl_ca_cert is not None
    assert Path(loaded.cert_file).read_bytes() == pki.admin.cert.read_bytes()
    assert Path(loaded.ssl_ca_cert).read_bytes() == pki.ca.cert.read_bytes()


def test_mutual_tls_with_generated_files(pki: certs.Pki) -> None:
    """A TLS server with the API server certificate accepts the admin client certificate."""
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki.ca.cert))
    server_ctx.load_cert_chain(str(pki.apiserver.cert), str(pki.apiserver.key))
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
    client_ctx.load_cert_chain(str(pki.admin.cert), str(pki.admin.key))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    seen: list[object] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            seen.append(tls.getpeercert())
            tls.sendall(b"ok")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        client_ctx.wrap_socket(raw, server_hostname="kubernetes.default.svc") as tls,
    ):
        assert tls.recv(2) == b"ok"
    thread.join(timeout=5)
    listener.close()
    peer = seen[0]
    assert isinstance(peer, dict)
    assert (("commonName", "kubernetes-admin"),) in peer["subject"]
