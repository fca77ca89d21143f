"""Certificates and keys for a throw-away local control plane (``cryptography``).

One self-signed CA signs everything: the API server's serving certificate, the client certificates
of the admin, the controller-manager, the scheduler and the API server's kubelet client, and any
certificate a test asks for later (a node's kubelet identity, a webhook's serving certificate).
The same CA is the cluster's signing CA for CSRs. The service-account key pair is separate, and
so is the front-proxy CA (request-header authentication, used by aggregated API servers and the
delegated authentication of the controller-manager and scheduler).

ECDSA P-256 keys throughout: a fraction of a millisecond to generate (RSA-2048 takes tens), and
every component accepts them, including for service-account token signing (ES256).

Files are written with mode 0600 for keys; a cluster's PKI is created once per work directory and
reloaded from disk (``load_pki``) when the API server restarts, so restarts keep the same identity.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from dra_gpu.controller import certs as x509_certs

VALIDITY = datetime.timedelta(days=365)
SERVICE_CIDR = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"  # first address of SERVICE_CIDR: the `kubernetes` Service
APISERVER_DNS = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)


@dataclass(frozen=True)
class CertPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Paths of everything a control plane needs; all files exist once ``create_pki`` returns."""

    dir: Path
    ca: CertPair
    apiserver: CertPair
    admin: CertPair
    controller_manager: CertPair
    scheduler: CertPair
    apiserver_kubelet_client: CertPair
    front_proxy_ca: CertPair
    front_proxy_client: CertPair
    sa_public: Path
    sa_private: Path


def pki_layout(directory: Path) -> Pki:
    def pair(stem: str) -> CertPair:
        return CertPair(directory / f"{stem}.crt", directory / f"{stem}.key")

    return Pki(
        dir=directory,
        ca=pair("ca"),
        apiserver=pair("apiserver"),
        admin=pair("admin"),
        controller_manager=pair("controller-manager"),
        scheduler=pair("scheduler"),
        apiserver_kubelet_client=pair("apiserver-kubelet-client"),
        front_proxy_ca=pair("front-proxy-ca"),
        front_proxy_client=pair("front-proxy-client"),
        sa_public=directory / "sa.pub",
        sa_private=directory / "sa.key",
    )


def create_pki(directory: Path) -> Pki:
    """Create a fresh CA and every certificate of the control plane under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = pki_layout(directory)
    _create_ca(pki.ca, cn="dra-gpu-local-ca")
    _create_ca(pki.front_proxy_ca, cn="dra-gpu-front-proxy-ca")
    issue_client_cert(pki.front_proxy_ca, pki.front_proxy_client, cn="front-proxy-client")
    apiserver_hosts = (*APISERVER_DNS, "127.0.0.1", "::1", KUBERNETES_SERVICE_IP)
    issue_serving_cert(pki.ca, pki.apiserver, cn="kube-apiserver", hosts=apiserver_hosts)
    issue_client_cert(pki.ca, pki.admin, cn="kubernetes-admin", orgs=("system:masters",))
    issue_client_cert(pki.ca, pki.controller_manager, cn="system:kube-controller-manager")
    issue_client_cert(pki.ca, pki.scheduler, cn="system:kube-scheduler")
    issue_client_cert(
        pki.ca, pki.apiserver_kubelet_client, cn="kube-apiserver-kubelet-client",
        orgs=("system:masters",),
    )  # fmt: skip
    sa_key = x509_certs.new_key()
    _write_key(pki.sa_private, sa_key)
    pki.sa_public.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def _create_ca(out: CertPair, *, cn: str) -> None:
    cert, key = x509_certs.new_ca(cn, VALIDITY)
    _write_pair(out, cert, key)


def load_pki(directory: Path) -> Pki:
    pki = pki_layout(directory)
    absent = [p for p in (pki.ca.cert, pki.ca.key, pki.sa_private) if not p.is_file()]
    if absent:
        raise FileNotFoundError(f"incomplete PKI in {directory}: missing {absent}")
    return pki


def issue_client_cert(
    ca: CertPair, out: CertPair, *, cn: str, orgs: Sequence[str] = ()
) -> CertPair:
    """A client certificate signed by ``ca``: Kubernetes reads the user from CN, groups from O."""
    ca_cert, ca_key = _load(ca)
    key = x509_certs.new_key()
    cert = x509_certs.sign(
        subject=x509_certs.name(cn, orgs),
        public=key.public_key(),
        issuer=ca_cert.subject,
        issuer_key=ca_key,
        validity=VALIDITY,
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    _write_pair(out, cert, key)
    return out


def issue_serving_cert(ca: CertPair, out: CertPair, *, cn: str, hosts: Sequence[str]) -> CertPair:
    """A TLS server certificate for ``hosts`` (DNS names or IP addresses), signed by ``ca``.

    Keeps an existing key at ``out.key`` so that re-issuing does not invalidate pinned keys.
    """
    ca_cert, ca_key = _load(ca)
    key = x509_certs.load_key(out.key) if out.key.is_file() else x509_certs.new_key()
    cert = x509_certs.sign(
        subject=x509_certs.name(cn),
        public=key.public_key(),
        issuer=ca_cert.subject,
        issuer_key=ca_key,
        validity=VALIDITY,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        hosts=hosts,
    )
    _write_pair(out, cert, key)
    return out


def safe_stem(text: str) -> str:
    """A file name stem for a certificate named after a (user) name like ``system:node:gpu-0``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "cert"


def _load(pair: CertPair) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    return x509.load_pem_x509_certificate(pair.cert.read_bytes()), x509_certs.load_key(pair.key)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = x509_certs.pem_key(key)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _write_pair(pair: CertPair, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    pair.cert.parent.mkdir(parents=True, exist_ok=True)
    _write_key(pair.key, key)
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
