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


# A scrape: (series name, sorted labels) -> value.
Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int, *, timeout: float = 5.0) -> Series:
    """``http://127.0.0.1:<port>/metrics`` parsed; raises OSError while nothing answers."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(series: Series, name: str, **labels: str) -> float | None:
    """The value of one series with exactly ``labels``; None when absent."""
    return series.get((name, tuple(sorted(labels.items()))))
