"""Readiness probes the harness, tests and benchmarks share (no Kubernetes client needed)."""

from __future__ import annotations

import ssl
import urllib.request
from pathlib import Path


def https_healthy(port: int, ca: Path, *, timeout: float = 2.0) -> bool:
    """Whether ``https://127.0.0.1:<port>/healthz`` answers 200 with a certificate ``ca`` signed.

    False while the CA file does not exist yet (the server writes it at start).
    """
    if not ca.is_file():
        return False
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/healthz", context=context, timeout=timeout
        ) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
