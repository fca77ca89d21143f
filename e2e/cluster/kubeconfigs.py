"""Kubeconfig files with the certificates embedded (base64 ``*-data`` fields).

Embedding rather than referencing the PEM files keeps a kubeconfig usable after it is copied
elsewhere (into a container, a CI artifact), and keeps one file per identity.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import yaml


def kubeconfig_dict(
    *, server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, name: str = "local"
) -> dict[str, Any]:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": name, "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}
        ],
        "users": [
            {
                "name": name,
                "user": {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)},
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(path: Path, *, server: str, ca: Path, cert: Path, key: Path) -> Path:
    """Write a kubeconfig for the identity in ``cert``/``key`` (mode 0600, atomically)."""
    config = kubeconfig_dict(
        server=server, ca_pem=ca.read_bytes(), cert_pem=cert.read_bytes(), key_pem=key.read_bytes()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(config, fh, sort_keys=False)
    os.replace(tmp, path)
    return path
