"""TLS for the webhook: certificates from files (mounted by the chart), or made for local use.

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


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(hosts: Sequence[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _issue(
    *,
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    hosts: Sequence[str],
    days: int,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    issuer_name, issuer_key = issuer if issuer is not None else (_name(subject), key)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
    )
    if issuer is None:  # the CA
        builder = builder.add_extension(
            x509.BasicConstraints(ca=True, path_length=0), critical=True
        )
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        builder = builder.add_extension(
            x509.BasicConstraints(ca=False, path_length=None), critical=True
        )
        builder = builder.add_extension(_san(hosts), critical=False)
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, data: bytes, *, private: bool) -> None:
    atomicfile.write_atomic(path, data, durable=False, mode=0o600 if private else 0o644)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


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
    return fresh and san == _san(hosts)


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
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _issue(subject="dra-gpu webhook CA", key=ca_key, issuer=None, hosts=(), days=days)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _issue(
        subject="dra-gpu webhook", key=key, issuer=(ca_cert.subject, ca_key), hosts=hosts, days=days
    )
    _write(files.key, _pem_key(key), private=True)
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
