"""Certificates: the project's one x509 module, and TLS for the webhook.

The primitives (:func:`new_key`, :func:`name`, :func:`sign`, :func:`pem_key`, :func:`load_key`)
make the webhook's certificates here and the local test cluster's PKI (``e2e/certs.py``).

The webhook's certificates come from files (mounted by the chart), or are made for local use.

For local use (no ``--tls-cert-file``) :func:`ensure_self_signed` writes a private CA and a
serving certificate signed by it into a directory: ``ca.crt`` is what goes into the webhook
configuration's ``caBundle``. Files already there and still valid for a day are reused, so
several local replicas pointed at one directory share one CA (one caBundle serves them all).
Keys are written with mode 0600.

:func:`server_context` builds the server's SSL context; :meth:`ReloadingContext.maybe_reload`
picks up rotated certificate files without a restart (new connections use the new pair).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from dra_gpu.kubeletplugin import atomicfile

log = logging.getLogger(__name__)

DEFAULT_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path
    ca: Path | None  # None when the certificate came from the operator's files


# --- x509 primitives: the webhook's certificates and the local test cluster's PKI (e2e/certs.py)


def new_key() -> ec.EllipticCurvePrivateKey:
    """ECDSA P-256: a fraction of a millisecond to make, and accepted by every component."""
    return ec.generate_private_key(ec.SECP256R1())


def name(common_name: str, orgs: Sequence[str] = ()) -> x509.Name:
    """CN, and O per entry of ``orgs`` (Kubernetes reads a client's groups from O)."""
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    return x509.Name([*attrs, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def subject_alt_names(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    """IP addresses as IP SANs, everything else as DNS names."""
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def sign(
    *,
    subject: x509.Name,
    public: ec.EllipticCurvePublicKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    validity: dt.timedelta,
    is_ca: bool = False,
    usage: x509.ObjectIdentifier | None = None,
    hosts: Sequence[str] = (),
) -> x509.Certificate:
    """A certificate for ``public`` signed by ``issuer_key`` (self-signed: the subject's own).

    ``usage``: the extended key usage (server or client auth); ``hosts``: its SANs.
    """
    # Backdated a little: a freshly minted certificate must never be "not yet valid" because
    # of sub-second rounding or a slightly slower clock elsewhere.
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(_key_usage(cert_sign=is_ca), critical=True)
    )
    if not is_ca:
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
            critical=False,
        )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if hosts:
        builder = builder.add_extension(subject_alt_names(hosts), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def new_ca(
    common_name: str, validity: dt.timedelta
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed CA certificate and its key."""
    key = new_key()
    subject = name(common_name)
    cert = sign(
        subject=subject,
        public=key.public_key(),
        issuer=subject,
        issuer_key=key,
        validity=validity,
        is_ca=True,
    )
    return cert, key


def _key_usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=not cert_sign,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{path}: expected an EC private key, got {type(key).__name__}")
    return key


# --- the webhook's files ------------------------------------------------------------------


def _write(path: Path, data: bytes, *, private: bool) -> None:
    atomicfile.write_atomic(path, data, durable=False, mode=0o600 if private else 0o644)


def _reusable(files: CertFiles, hosts: Sequence[str]) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        files.key.read_bytes()
        assert files.ca is not None
        files.ca.read_bytes()
    except (OSError, ValueError):
        return False
    fresh = cert.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=1)
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return fresh and san == subject_alt_names(hosts)


def ensure_self_signed(
    directory: Path, *, hosts: Sequence[str] = DEFAULT_HOSTS, days: int = 365
) -> CertFiles:
    """A CA and a serving certificate for ``hosts`` in ``directory`` (reused when still good)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = CertFiles(
        cert=directory / "tls.crt", key=directory / "tls.key", ca=directory / "ca.crt"
    )
    if _reusable(files, hosts):
        return files
    validity = dt.timedelta(days=days)
    ca_cert, ca_key = new_ca("dra-gpu webhook CA", validity)
    key = new_key()
    cert = sign(
        subject=name("dra-gpu webhook"),
        public=key.public_key(),
        issuer=ca_cert.subject,
        issuer_key=ca_key,
        validity=validity,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        hosts=hosts,
    )
    _write(files.key, pem_key(key), private=True)
    _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    assert files.ca is not None
    _write(files.ca, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
    return files


def server_context(files: CertFiles) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(certfile=str(files.cert), keyfile=str(files.key))
    return ctx


class ReloadingContext:
    """An SSL context that reloads its certificate pair when the files change on disk."""

    def __init__(self, files: CertFiles) -> None:
        self.files = files
        self.context = server_context(files)
        self._stamp = self._current_stamp()

    def _current_stamp(self) -> tuple[int, int]:
        return (os.stat(self.files.cert).st_mtime_ns, os.stat(self.files.key).st_mtime_ns)

    def maybe_reload(self) -> bool:
        try:
            stamp = self._current_stamp()
            if stamp == self._stamp:
                return False
            self.context.load_cert_chain(certfile=str(self.files.cert), keyfile=str(self.files.key))
        except (OSError, ssl.SSLError) as exc:
            # Mid-rotation (cert written, key not yet): keep serving the old pair, retry later.
            log.warning("webhook certificate reload failed, keeping the old one: %s", exc)
            return False
        self._stamp = stamp
        log.info("webhook certificate reloaded from %s", self.files.cert)
        return True
